"""GDN references (SPEC 1.10.0, 0.8): the chunked reference agrees with the token-by-token oracle to
1e-10 relative RMS in float64, forward and (through autograd) backward."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops.ops.gdn import reference as ref
from mindspeed_ops.testing import rel_rms

TOL = 1e-10


def _inputs(B, T, H, HV, K, V, *, s=1.0, h0=True, N=None, seed=0, beta_one=False):
    """The shared recipe of SPEC 1.10.0 in float64."""
    gen = torch.Generator().manual_seed(seed)
    f = dict(dtype=torch.float64, generator=gen)
    q = torch.randn(B, T, H, K, **f)
    k = F.normalize(torch.randn(B, T, H, K, **f), dim=-1)
    v = torch.randn(B, T, HV, V, **f)
    g = F.logsigmoid(torch.rand(B, T, HV, **f)) / s
    g = g * (torch.rand(B, T, HV, **f) > 0.2)
    beta = torch.ones(B, T, HV, dtype=torch.float64) if beta_one else torch.sigmoid(torch.randn(B, T, HV, **f))
    init = torch.randn(N or B, HV, K, V, **f) if h0 else None
    return q, k, v, g, beta, init


def _run(fn, q, k, v, g, beta, init, grads=None, **kw):
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in (q, k, v, g, beta, init)]
    o, fs = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True, **kw)
    if grads is None:
        gen = torch.Generator().manual_seed(99)
        grads = (torch.randn(o.shape, dtype=o.dtype, generator=gen),
                 torch.randn(fs.shape, dtype=fs.dtype, generator=gen))
    ((o * grads[0]).sum() + (fs * grads[1]).sum()).backward()
    return o, fs, [None if t is None else t.grad for t in leaves], grads


def _agree(inputs, chunk_size=64, check_grads=True, **kw):
    o1, f1, g1, grads = _run(ref.recurrent_gated_delta_rule_ref, *inputs, **kw)
    o2, f2, g2, _ = _run(ref.chunk_gated_delta_rule_ref, *inputs, grads=grads, chunk_size=chunk_size, **kw)
    assert o1.dtype == o2.dtype == torch.float64 and f1.dtype == f2.dtype == torch.float64
    assert torch.isfinite(o2).all() and torch.isfinite(f2).all()
    assert rel_rms(o2, o1) <= TOL, rel_rms(o2, o1)
    assert rel_rms(f2, f1) <= TOL, rel_rms(f2, f1)
    if check_grads:
        for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), g1, g2):
            if a is None:
                assert b is None
                continue
            assert torch.isfinite(b).all(), name
            assert rel_rms(b, a) <= TOL, (name, rel_rms(b, a))
    return (o1, f1, g1), (o2, f2, g2)


CONFIGS = [
    # (B, T, H, HV, K, V, chunk_size, gate scale s, extra kwargs)
    (2, 50, 2, 2, 16, 16, 16, 1.0, {}),
    (1, 40, 2, 4, 16, 24, 16, 0.1, {"use_qk_l2norm_in_kernel": True}),          # GVA HV = 2H
    (2, 37, 1, 2, 60, 100, 16, 1.0, {"scale": 0.3}),                            # K=60, V=100, partial chunk
    (2, 75, 2, 2, 16, 16, 32, 0.01, {}),                                        # strong decay, T % BT != 0
    (1, 70, 1, 1, 8, 8, 64, 10.0, {}),
]


@pytest.mark.parametrize("B,T,H,HV,K,V,BT,s,kw", CONFIGS)
def test_chunked_equals_recurrent(B, T, H, HV, K, V, BT, s, kw):
    _agree(_inputs(B, T, H, HV, K, V, s=s), chunk_size=BT, **kw)


def test_strong_decay_finite():
    """g = logsigmoid(x)/0.01 (about -31 to -69 per token): every exp is of a masked difference."""
    inputs = _inputs(1, 70, 2, 2, 16, 16, s=0.01, seed=3)
    assert inputs[3].min() < -60
    (_, _, _), (o, fs, grads) = _agree(inputs, chunk_size=64)
    assert all(t is None or torch.isfinite(t).all() for t in grads)


def test_varlen_with_empty_sequence_and_tail():
    """Packed sequences, one of length 0 (final state = its initial state), tail tokens ignored."""
    cu = torch.tensor([0, 10, 10, 45, 60], dtype=torch.int32)
    q, k, v, g, beta, init = _inputs(1, 70, 2, 4, 16, 24, N=4, seed=4)
    for t in (q, k, v):
        t[:, 60:] = 1e4
    g[:, 60:] = 50.0
    beta[:, 60:] = 3.0
    (o1, f1, g1), (o2, f2, g2) = _agree((q, k, v, g, beta, init), chunk_size=16, cu_seqlens=cu,
                                        use_qk_l2norm_in_kernel=True)
    assert torch.equal(f2[1], init[1]) and torch.equal(f1[1], init[1])
    assert (o2[:, 60:] == 0).all()
    for t in g2[:5]:
        assert (t[:, 60:] == 0).all()
    for t in (q, k, v, g, beta):  # NaN in the tail reaches nothing (values or gradients)
        t[:, 60:] = float("nan")
    (o1, _, g1), (o2, _, g2) = _agree((q, k, v, g, beta, init), chunk_size=16, cu_seqlens=cu,
                                      use_qk_l2norm_in_kernel=True)
    assert (o2[:, 60:] == 0).all() and all((t[:, 60:] == 0).all() for t in g2[:5])


def test_varlen_equals_separate_calls():
    cu = torch.tensor([0, 21, 50])
    q, k, v, g, beta, init = _inputs(1, 50, 1, 2, 16, 16, N=2, seed=5)
    o, fs = ref.chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=init, output_final_state=True,
                                           cu_seqlens=cu, chunk_size=16)
    for n, (a, b) in enumerate([(0, 21), (21, 50)]):
        on, fn = ref.chunk_gated_delta_rule_ref(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b],
                                                initial_state=init[n:n + 1], output_final_state=True, chunk_size=16)
        assert rel_rms(o[:, a:b], on) <= TOL and rel_rms(fs[n:n + 1], fn) <= TOL


def test_g_none_equals_zeros_and_ungated_beta_one():
    q, k, v, g, beta, init = _inputs(1, 33, 1, 1, 16, 16, seed=6, beta_one=True)
    for fn in (ref.recurrent_gated_delta_rule_ref, ref.chunk_gated_delta_rule_ref):
        a = fn(q, k, v, None, beta, initial_state=init, output_final_state=True)
        b = fn(q, k, v, torch.zeros_like(g), beta, initial_state=init, output_final_state=True)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    _agree((q, k, v, None, beta, init), chunk_size=16)


def test_no_initial_state_and_default_scale():
    q, k, v, g, beta, _ = _inputs(2, 20, 2, 2, 16, 16, h0=False, seed=7)
    o, fs = ref.chunk_gated_delta_rule_ref(q, k, v, g, beta, chunk_size=16)
    assert fs is None
    o2, _ = ref.chunk_gated_delta_rule_ref(q, k, v, g, beta, scale=16 ** -0.5, chunk_size=16)
    assert torch.equal(o, o2)
    _agree((q, k, v, g, beta, None), chunk_size=16)


def test_single_token_recurrence_by_hand():
    """T = 1 from zero state: S = β k vᵀ, o = scale β (q·k) v."""
    q, k, v, g, beta, _ = _inputs(1, 1, 1, 1, 8, 4, h0=False, seed=8)
    o, fs = ref.recurrent_gated_delta_rule_ref(q, k, v, g, beta, scale=0.5, output_final_state=True)
    want = 0.5 * beta[0, 0, 0] * (q[0, 0, 0] @ k[0, 0, 0]) * v[0, 0, 0]
    assert torch.allclose(o[0, 0, 0], want, rtol=1e-12, atol=0)
    assert torch.allclose(fs[0, 0], beta[0, 0, 0] * torch.outer(k[0, 0, 0], v[0, 0, 0]), rtol=1e-12, atol=0)


def test_dtypes_and_no_mutation():
    q, k, v, g, beta, init = _inputs(1, 20, 1, 1, 16, 16, seed=9)
    q32, k32, v32 = (t.float() for t in (q, k, v))
    before = [t.clone() for t in (q32, k32, v32, g, beta, init)]
    for fn in (ref.recurrent_gated_delta_rule_ref, ref.chunk_gated_delta_rule_ref):
        o, fs = fn(q32, k32, v32, g.float(), beta.float(), initial_state=init.float(), output_final_state=True,
                   use_qk_l2norm_in_kernel=True)
        assert o.dtype == torch.float32 and fs.dtype == torch.float32
        o16, fs16 = fn(q32.half(), k32.half(), v32.half(), g.float(), beta.half(), initial_state=init.float(),
                       output_final_state=True)
        assert o16.dtype == torch.float16 and fs16.dtype == torch.float32
    for a, b in zip(before, (q32, k32, v32, g, beta, init)):
        assert torch.equal(a, b)


def test_stage_references_consistent():
    """chunk_local_cumsum_ref / chunk_scaled_dot_kkt_ref / solve_tril_ref compose to the chunked form:
    (I + A)^{-1} (I + A) = I on valid blocks."""
    cu = torch.tensor([0, 5, 40])
    _, k, _, g, beta, _ = _inputs(1, 45, 2, 4, 16, 16, h0=False, seed=10)
    G = ref.chunk_local_cumsum_ref(g, 16, cu_seqlens=cu)
    A = ref.chunk_scaled_dot_kkt_ref(k, G, beta, cu_seqlens=cu, chunk_size=16)
    Ai = ref.solve_tril_ref(A, cu_seqlens=cu)
    assert (Ai[:, 40:] == 0).all() and (A[:, 40:] == 0).all()
    for a, b in [(0, 5), (5, 21), (21, 37), (37, 40)]:
        L = b - a
        M = torch.eye(L, dtype=torch.float64) + A[0, a:b, :, :L].transpose(0, 1)
        I = Ai[0, a:b, :, :L].transpose(0, 1) @ M
        assert torch.allclose(I, torch.eye(L, dtype=torch.float64).expand_as(I), atol=1e-12)
        assert (Ai[0, a:b, :, L:] == 0).all()
