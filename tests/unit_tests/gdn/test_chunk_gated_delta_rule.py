"""chunk_gated_delta_rule (SPEC 1.10.10): the full operator against the token-by-token oracle (float64),
forward and backward; options, varlen, GVA, strong decay, causality, keyword policy, errors,
registration. CPU: small shapes under the interpreter; [gpu]: the real shapes in bf16."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops import api
from mindspeed_ops.ops.gdn import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, dirty_tail, snapshot, threshold
from tests.conftest import DEVICE, DTYPES

OP = "chunk_gated_delta_rule"


def _inputs(B, T, H, HV, K, V, dtype, *, s=0.1, h0=True, N=None, seed=0, beta_one=False, g_none=False):
    """Shared recipe of SPEC 1.10.0."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V)
    g = F.logsigmoid(torch.rand(B, T, HV, generator=gen)) / s
    g = g * (torch.rand(B, T, HV, generator=gen) > 0.2)
    beta = torch.ones(B, T, HV) if beta_one else torch.sigmoid(r(B, T, HV))
    init = r(N or B, HV, K, V) if h0 else None
    dev = DEVICE
    return (q.to(dev, dtype), k.to(dev, dtype), v.to(dev, dtype), None if g_none else g.to(dev),
            beta.to(dev, dtype), None if init is None else init.to(dev))


def _leaves(ts):
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in ts]


def _compare(inputs, dtype, *, chunk_size=64, cu_seqlens=None, l2=True, final=True, grads=True):
    """Ours vs the float64 recurrent oracle: o, final state and every gradient."""
    ours = _leaves(inputs)
    before = snapshot(*inputs)
    o, fs = api.chunk_gated_delta_rule(*ours[:5], initial_state=ours[5], output_final_state=final,
                                       use_qk_l2norm_in_kernel=l2, cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    assert o.dtype == inputs[0].dtype and (fs is None) == (not final)
    refs = _leaves([None if t is None else t.double() for t in inputs])
    ro, rf = ref.recurrent_gated_delta_rule_ref(*refs[:5], initial_state=refs[5], output_final_state=True,
                                                use_qk_l2norm_in_kernel=l2, cu_seqlens=cu_seqlens)
    tol = {c: threshold(c, inputs[0].dtype) for c in ("LA-o", "LA-d", "LA-g")}  # keyed by q.dtype (SPEC)
    assert_close("o", ro, o, tol["LA-o"])
    if final:
        assert fs.dtype == torch.float32
        assert_close("final_state", rf, fs, tol["LA-o"])
    if not grads:
        return
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen).to(DEVICE, o.dtype)
    loss = (o.float() * do.float()).sum()
    rloss = (ro * do.double()).sum()
    if final:
        dht = torch.randn(fs.shape, generator=gen).to(DEVICE)
        loss = loss + (fs * dht).sum()
        rloss = rloss + (rf * dht.double()).sum()
    loss.backward()
    rloss.backward()
    for name, a, b, cls in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), refs, ours,
                               ("LA-d", "LA-d", "LA-d", "LA-g", "LA-g", "LA-d")):
        if a is None:
            assert b is None
            continue
        assert b.grad is not None and b.grad.dtype == b.dtype, name
        assert_close(name, a.grad, b.grad, tol[cls])
    assert_unchanged(before, *inputs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,BT", [(70, 32), (40, 16), (64, 64)])
def test_matches_oracle(dtype, T, BT):
    _compare(_inputs(1, T, 2, 2, 32, 24, dtype), dtype, chunk_size=BT)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gva_varlen_h0(dtype):
    cu = torch.tensor([0, 20, 21, 70], dtype=torch.int32, device=DEVICE)
    _compare(_inputs(1, 70, 1, 4, 16, 20, dtype, N=3), dtype, chunk_size=16, cu_seqlens=cu)


def test_head_dims_60_100_no_l2_no_final():
    _compare(_inputs(1, 37, 1, 1, 60, 100, torch.float32, h0=False), torch.float32, chunk_size=32, l2=False,
             final=False)


def test_g_none_equals_zero_gates_and_beta_one():
    q, k, v, _, beta, h0 = _inputs(1, 45, 1, 2, 16, 16, torch.float32, g_none=True, beta_one=True)
    a = api.chunk_gated_delta_rule(q, k, v, None, beta, initial_state=h0, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True, chunk_size=16)
    b = api.chunk_gated_delta_rule(q, k, v, torch.zeros(beta.shape, device=DEVICE), beta, initial_state=h0,
                                   output_final_state=True, use_qk_l2norm_in_kernel=True, chunk_size=16)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    _compare((q, k, v, None, beta, h0), torch.float32, chunk_size=16)


def test_strong_decay_partial_chunk_finite():
    inputs = _inputs(1, 75, 1, 1, 16, 16, torch.float32, s=0.01)
    assert inputs[3].min() < -30
    _compare(inputs, torch.float32, chunk_size=64)


def test_tail_tokens_and_causality():
    q, k, v, g, beta, h0 = _inputs(1, 50, 1, 2, 16, 16, torch.float32, N=2)
    cu = torch.tensor([0, 17, 40], device=DEVICE)
    o, _ = api.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, chunk_size=16)
    assert torch.equal(o[:, 40:], torch.zeros_like(o[:, 40:]))
    # causality: changing tokens >= P leaves outputs < P bitwise equal
    P = 29
    q2, k2, v2, g2, b2 = (t.clone() for t in (q, k, v, g, beta))
    for t in (q2, k2, v2, g2, b2):
        t[:, P:] = torch.randn_like(t[:, P:])
    o2, _ = api.chunk_gated_delta_rule(q2, k2, v2, g2, b2, initial_state=h0, cu_seqlens=cu, chunk_size=16)
    assert torch.equal(o[:, :P], o2[:, :P])


@pytest.mark.parametrize("l2", [True, False])
def test_nan_tail_tokens_give_finite_gradients(l2):
    """SPEC 0.3: tail tokens (past cu_seqlens[-1]) holding NaN/huge values change nothing; found by the ATK
    coverage audit: with the in-kernel l2norm, dq/dk of the tail rows were NaN (its backward ran over them)."""
    q, k, v, g, beta, h0 = _inputs(1, 50, 1, 2, 16, 16, torch.float32, N=2)
    cu = torch.tensor([0, 17, 41], device=DEVICE)
    leaves = [dirty_tail(t, 41).requires_grad_(True) for t in (q, k, v, g, beta)]
    o, _ = api.chunk_gated_delta_rule(*leaves, initial_state=h0, cu_seqlens=cu, chunk_size=16,
                                      use_qk_l2norm_in_kernel=l2)
    assert torch.isfinite(o).all() and torch.equal(o[:, 41:], torch.zeros_like(o[:, 41:]))
    o.backward(torch.randn_like(o))
    for t in leaves:
        assert torch.isfinite(t.grad).all() and not t.grad[:, 41:].any()


def test_non_contiguous_inputs_and_gradient():
    q, k, v, g, beta, h0 = _inputs(1, 33, 2, 2, 16, 16, torch.float32)
    qkv = torch.cat([q, k, v], dim=-1)  # q, k, v as strided slices of one projection
    q2, k2, v2 = qkv[..., :16], qkv[..., 16:32], qkv[..., 32:]
    assert not q2.is_contiguous()
    _compare((q2, k2, v2, g, beta, h0), torch.float32, chunk_size=16)


def test_keyword_policy():
    q, k, v, g, beta, _ = _inputs(1, 8, 1, 1, 8, 8, torch.float32, h0=False)
    with pytest.raises(ValueError, match="head_first"):
        api.chunk_gated_delta_rule(q, k, v, g, beta, head_first=True)
    with pytest.raises(NotImplementedError, match="use_gate_in_kernel"):
        api.chunk_gated_delta_rule(q, k, v, g, beta, use_gate_in_kernel=True)
    api.chunk_gated_delta_rule(q, k, v, g, beta, head_first=False, use_gate_in_kernel=False, cu_seqlens_cpu=None)
    with pytest.warns(UserWarning, match="some_new_flag"):
        api.chunk_gated_delta_rule(q, k, v, g, beta, some_new_flag=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        api.chunk_gated_delta_rule(q, k, v, g, beta, some_new_flag=1)  # once per process


def test_bad_input():
    q, k, v, g, beta, h0 = _inputs(2, 8, 2, 4, 8, 8, torch.float32)
    f = api.chunk_gated_delta_rule
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, HV\] = \[2, 8, 4\], got \[2, 8, 4, 1\]"):
        f(q, k, v, g, beta[..., None])
    with pytest.raises(ValueError, match="multiple"):
        f(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(ValueError, match="HV = 0 .* positive multiple"):  # no value heads: rejected, not a crash
        f(q, k, v[:, :, :0], g[:, :, :0], beta[:, :, :0], use_qk_l2norm_in_kernel=True)
    with pytest.raises(ValueError, match="chunk_size"):
        f(q, k, v, g, beta, chunk_size=128)
    with pytest.raises(ValueError, match="batch size must be 1"):
        f(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 8], device=DEVICE))
    with pytest.raises(ValueError, match="initial_state"):
        f(q, k, v, g, beta, initial_state=h0[:1])
    with pytest.raises(TypeError):
        f(q, k, v.half(), g, beta)
    with pytest.raises(ValueError, match="K must be <= 256"):
        f(torch.randn(1, 2, 1, 300, device=DEVICE), torch.randn(1, 2, 1, 300, device=DEVICE), v[:1, :2, :1],
          None, beta[:1, :2, :1])


def test_registration_and_compile():
    q, k, v, g, beta, h0 = _inputs(1, 20, 1, 1, 16, 16, torch.float32)
    ls = _leaves((q, k, v, g, beta, h0))
    torch.library.opcheck(torch.ops.mindspeed_ops.chunk_gated_delta_rule,
                          (*ls[:5], 0.25, ls[5], True, True, None, 16),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    f = torch.compile(lambda *a: api.chunk_gated_delta_rule(*a, initial_state=ls[5], output_final_state=True,
                                                            use_qk_l2norm_in_kernel=True, chunk_size=16),
                      fullgraph=True)
    o, fs = f(*ls[:5])
    o2, fs2 = api.chunk_gated_delta_rule(*ls[:5], initial_state=ls[5], output_final_state=True,
                                         use_qk_l2norm_in_kernel=True, chunk_size=16)
    assert torch.allclose(o, o2, atol=1e-6) and torch.allclose(fs, fs2, atol=1e-6)
    (o.sum() + fs.sum()).backward()
    assert all(t.grad is not None for t in ls)


@pytest.mark.bigmem
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8192, 16, 16, 128, 128), (2, 1024, 4, 16, 128, 128)])
def test_real_size_bf16(shape):
    _compare(_inputs(*shape, torch.bfloat16), torch.bfloat16)


@pytest.mark.gpu
def test_real_varlen_bf16():
    lens = [1000, 1, 3000, 512, 2000, 1, 1, 1676]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEVICE)
    _compare(_inputs(1, sum(lens), 16, 16, 128, 128, torch.bfloat16, N=len(lens)), torch.bfloat16, cu_seqlens=cu)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_no_token_processed(backend):
    """Only empty sequences (fresh-user review): o = 0, final_state = h0, zero gradients, dh0 = dht, on
    both backends; zero sequences (cu_seqlens = [0]) is a ValueError."""
    import mindspeed_ops

    q, k, v, g, beta, h0 = _inputs(1, 10, 1, 2, 16, 16, torch.float32, N=2)
    ls = _leaves((q, k, v, g, beta, h0))
    with mindspeed_ops.use_backend(backend, ops=[OP]):
        o, fs = api.chunk_gated_delta_rule(*ls[:5], initial_state=ls[5], output_final_state=True,
                                           cu_seqlens=torch.tensor([0, 0, 0], device=DEVICE), chunk_size=16)
        dht = torch.randn_like(fs)
        (o.sum() + (fs * dht).sum()).backward()
    assert torch.equal(o, torch.zeros_like(o)) and torch.equal(fs, h0)
    assert all(torch.equal(t.grad, torch.zeros_like(t)) for t in ls[:5])
    assert torch.allclose(ls[5].grad, dht)
    with pytest.raises(ValueError, match="at least 2 entries"):
        api.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0], device=DEVICE))
