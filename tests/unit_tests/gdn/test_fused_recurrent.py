"""fused_recurrent_gated_delta_rule (SPEC 1.10.11): kernel vs the token-by-token oracle in float64 and the
chunked reference, decode shapes, GVA, in-kernel l2norm, varlen with many length-1 sequences and tails,
forward-only backward error, keyword policy, errors, custom op (opcheck, torch.compile)."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import mindspeed_ops
from mindspeed_ops.api.triton.fused_recurrent_gated_delta_rule import fused_recurrent_gated_delta_rule
from mindspeed_ops.ops.gdn import fused_recurrent as fr_mod
from mindspeed_ops.ops.gdn import reference as ref
from mindspeed_ops.testing import (assert_close, assert_unchanged, dirty_tail, non_contiguous, snapshot, threshold,
                                   to_ref)
from tests.conftest import DEVICE, DTYPES

fr = fused_recurrent_gated_delta_rule


def make(B, T, H, HV, K, V, dtype, *, N=None, gate_scale=1.0, h0=True, l2=False, seed=0, beta_one=False):
    """The SPEC 1.10.0 recipe: q, k (L2-normalised unless the kernel does it), v in ``dtype``; fp32 g,
    beta (sigmoid) and h0."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    if not l2:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.rand(B, T, HV, generator=gen)) / gate_scale
    g = g * (torch.rand(B, T, HV, generator=gen) > 0.2)
    beta = torch.ones(B, T, HV) if beta_one else torch.sigmoid(torch.randn(B, T, HV, generator=gen))
    s0 = torch.randn(N or B, HV, K, V, generator=gen) if h0 else None
    d = lambda t, dt=torch.float32: None if t is None else t.to(dt).to(DEVICE)  # noqa: E731
    return d(q, dtype), d(k, dtype), d(v, dtype), d(g), d(beta), d(s0)


def check(q, k, v, g, beta, h0=None, *, cu=None, l2=False, scale=None, final=True, **kw):
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    before = snapshot(q, k, v, g, beta, h0)
    o, fs = fr(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=final,
               use_qk_l2norm_in_kernel=l2, cu_seqlens=cu_t, **kw)
    assert_unchanged(before, q, k, v, g, beta, h0, names=["q", "k", "v", "g", "beta", "h0"])
    wo, wf = ref.recurrent_gated_delta_rule_ref(*to_ref(q, k, v, g, beta), scale, to_ref(h0)[0], True, l2,
                                                None if cu is None else torch.tensor(cu))
    tol = threshold("LA-o", q.dtype)
    assert o.dtype == q.dtype and o.shape == v.shape
    assert_close("o", wo, o, tol)
    if final:
        assert fs.dtype == torch.float32
        assert_close("final_state", wf, fs, tol)
    else:
        assert fs is None
    if cu is not None:
        assert (o[:, cu[-1]:] == 0).all(), "tail outputs must be 0"
    return o, fs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 2, 16, 64])
def test_decode_shapes(T, dtype, poisoned):
    """(B, H, HV, K, V) = (8, 16, 32, 128, 128) reduced for CPU; fp32 initial state; GVA; l2norm in kernel."""
    q, k, v, g, beta, h0 = make(2, T, 1, 2, 32, 48, dtype, l2=True, seed=T)
    check(q, k, v, g, beta, h0, l2=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_dims_gates_and_states(dtype, poisoned):
    check(*make(1, 9, 1, 1, 100, 100, dtype, seed=1))                   # K = V = 100 (masked)
    check(*make(1, 5, 1, 2, 256, 16, dtype, seed=2), scale=0.5)         # K = 256, V = 16
    check(*make(2, 7, 1, 1, 8, 8, dtype, seed=3, h0=False), final=False)
    q, k, v, g, beta, h0 = make(1, 12, 2, 2, 16, 16, dtype, gate_scale=0.01, seed=4)   # strong decay
    o, fs = check(q, k, v, g, beta, h0)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    check(q, k, v, g, beta, h0.half())                                  # any float state dtype
    q, k, v, g, beta, h0 = make(1, 6, 1, 2, 16, 16, dtype, beta_one=True, seed=5)
    a = check(q, k, v, None, beta, h0)
    b = fr(q, k, v, torch.zeros_like(g), beta, initial_state=h0, output_final_state=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])          # g=None equals g = zeros


def test_varlen_length_one_sequences_with_tail(poisoned):
    """Many length-1 sequences (the [gpu] case has 2100 with HV = 32) and zero-length ones; tail tokens
    are never read."""
    cu = list(range(0, 25)) + [25, 25, 31]
    T = cu[-1] + 4
    q, k, v, g, beta, h0 = make(1, T, 1, 2, 16, 16, torch.float32, N=len(cu) - 1, seed=6)
    clean = check(q, k, v, g, beta, h0, cu=cu)
    dirty = fr(*(dirty_tail(t, cu[-1]) for t in (q, k, v, g, beta)), initial_state=h0, output_final_state=True,
               cu_seqlens=torch.tensor(cu, device=DEVICE))
    assert torch.equal(clean[0], dirty[0]) and torch.equal(clean[1], dirty[1])
    assert torch.equal(clean[1][25], h0[25])                            # zero-length: state passes through
    # cu_seqlens_cpu (host copy, a performance hint) gives the same result
    out = fr(q, k, v, g, beta, initial_state=h0, output_final_state=True,
             cu_seqlens=torch.tensor(cu, device=DEVICE), cu_seqlens_cpu=torch.tensor(cu))
    assert torch.equal(out[0], clean[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_chunked(dtype):
    """Equal to the chunked algorithm within LA-o (the chunked reference; the chunked operator too when
    it is present)."""
    q, k, v, g, beta, h0 = make(1, 40, 1, 2, 32, 32, dtype, l2=True, seed=7)
    o, fs = fr(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    co, cf = ref.chunk_gated_delta_rule_ref(*to_ref(q, k, v, g, beta, h0)[:5], None, to_ref(h0)[0], True, True,
                                            chunk_size=16)
    assert_close("o vs chunked", co, o, threshold("LA-o", dtype))
    assert_close("final vs chunked", cf, fs, threshold("LA-o", dtype))
    try:
        from mindspeed_ops.api.triton.chunk_gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return
    ko, kf = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                    use_qk_l2norm_in_kernel=True)
    assert_close("o vs chunk_gated_delta_rule", ko, o, threshold("LA-o", dtype))
    assert_close("final vs chunk_gated_delta_rule", kf, fs, threshold("LA-o", dtype))


def test_layouts_determinism_and_reference_backend():
    q, k, v, g, beta, h0 = make(1, 6, 2, 2, 16, 24, torch.float32, seed=8)
    base = fr(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    # q/k/v as views of one projection (the HF layout), transposed g, padded beta / state
    proj = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], -1)
    qv, kv, vv = torch.split(proj, [32, 32, 48], -1)
    out = fr(qv.unflatten(-1, (2, 16)), kv.unflatten(-1, (2, 16)), vv.unflatten(-1, (2, 24)),
             non_contiguous(g, "transpose"), non_contiguous(beta), initial_state=non_contiguous(h0, "transpose"),
             output_final_state=True)
    assert torch.equal(base[0], out[0]) and torch.equal(base[1], out[1])
    again = fr(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert torch.equal(base[0], again[0]) and torch.equal(base[1], again[1])
    with mindspeed_ops.use_backend("reference"):
        r = fr(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert_close("reference backend o", r[0], base[0], "LA-o")
    assert_close("reference backend final", r[1], base[1], "LA-o")


def test_empty():
    q = torch.empty(2, 0, 1, 16, device=DEVICE)
    h0 = torch.randn(2, 2, 16, 8, device=DEVICE)
    o, fs = fr(q, q, torch.empty(2, 0, 2, 8, device=DEVICE), None, torch.empty(2, 0, 2, device=DEVICE),
               initial_state=h0, output_final_state=True)
    assert o.shape == (2, 0, 2, 8) and torch.equal(fs, h0)


def test_backward_raises():
    q, k, v, g, beta, h0 = make(1, 3, 1, 1, 16, 16, torch.float32, seed=9)
    q.requires_grad_(True)
    o, fs = fr(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    with pytest.raises(NotImplementedError, match="forward-only.*chunk_gated_delta_rule"):
        (o.sum() + fs.sum()).backward()


def test_keyword_policy():
    q, k, v, g, beta, h0 = make(1, 2, 1, 1, 16, 16, torch.float32, seed=10)
    base = fr(q, k, v, g, beta)
    o, _ = fr(q, k, v, g, beta, head_first=False, use_graph=True, max_num_seqs=4, chunk_indices=None)
    assert torch.equal(o, base[0])
    with pytest.raises(ValueError, match="head_first=True"):
        fr(q, k, v, g, beta, head_first=True)
    for name, value in [("use_gate_in_kernel", True), ("A_log", torch.zeros(1)), ("allow_neg_eigval", True),
                        ("transpose_state_layout", True), ("return_intermediate_states", True)]:
        with pytest.raises(NotImplementedError, match=name):
            fr(q, k, v, g, beta, **{name: value})
    fr(q, k, v, g, beta, use_gate_in_kernel=False, A_log=None)          # defaults are fine
    fr_mod._args._WARNED.discard((fr_mod.OP, "some_future_flag"))
    with pytest.warns(UserWarning, match="ignoring unknown keyword argument 'some_future_flag'"):
        fr(q, k, v, g, beta, some_future_flag=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fr(q, k, v, g, beta, some_future_flag=1)                        # once per process
    assert not [w for w in caught if "some_future_flag" in str(w.message)]


def test_bad_input():
    q = torch.randn(1, 4, 2, 16, device=DEVICE)
    v = torch.randn(1, 4, 4, 8, device=DEVICE)
    beta = torch.rand(1, 4, 4, device=DEVICE)
    op = "fused_recurrent_gated_delta_rule"
    with pytest.raises(ValueError, match=rf"{op}: k must have shape \[B, T, H, K\] = \[1, 4, 2, 16\], got"):
        fr(q, q[..., :8], v, None, beta)
    with pytest.raises(ValueError, match=r"HV = 3 \(v.shape\[2\]\) must be a positive multiple of the key heads H = 2"):
        fr(q, q, v[:, :, :3], None, beta[:, :, :3])
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, HV\] = \[1, 4, 4\], got \[1, 4, 4, 1\]"):
        fr(q, q, v, None, beta[..., None])
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV\]"):
        fr(q, q, v, beta[:, :, :2], beta)
    with pytest.raises(ValueError, match="K must be <= 256"):
        x = torch.randn(1, 4, 2, 257, device=DEVICE)
        fr(x, x, v, None, beta)
    with pytest.raises(ValueError, match="batch size must be 1"):
        fr(q.expand(2, -1, -1, -1), q.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), None, beta.expand(2, -1, -1),
           cu_seqlens=torch.tensor([0, 4], device=DEVICE))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[N, HV, K, V\] = \[2, 4, 16, 8\]"):
        fr(q, q, v, None, beta, initial_state=torch.zeros(1, 4, 16, 8, device=DEVICE),
           cu_seqlens=torch.tensor([0, 1, 4], device=DEVICE))
    with pytest.raises(ValueError, match=r"cu_seqlens must be non-decreasing"):
        fr(q, q, v, None, beta, cu_seqlens=torch.tensor([0, 3, 2], device=DEVICE))
    with pytest.raises(TypeError, match="v must have the dtype of q"):
        fr(q, q, v.half(), None, beta)
    with pytest.raises(TypeError, match="float64"):
        fr(q.double(), q.double(), v.double(), None, beta)
    with pytest.raises(TypeError, match="beta must have dtype"):
        fr(q, q, v, None, beta.int())


def test_custom_op():
    q, k, v, g, beta, h0 = make(1, 3, 1, 2, 16, 16, torch.float32, seed=11)
    op = torch.ops.mindspeed_ops.fused_recurrent_gated_delta_rule
    torch.library.opcheck(op, (q, k, v, g, beta, 0.25, h0, True, False, None, None))
    torch.library.opcheck(op, (q, k, v, None, beta, 0.25, None, False, True, None, None))
    f = torch.compile(lambda *a: fr(*a, initial_state=h0, output_final_state=True), fullgraph=True)
    o, fs = f(q, k, v, g, beta)
    wo, wf = ref.recurrent_gated_delta_rule_ref(*to_ref(q, k, v, g, beta), None, to_ref(h0)[0], True)
    assert_close("compiled o", wo, o, "LA-o")
    assert_close("compiled final", wf, fs, "LA-o")


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 2, 16, 64])
def test_gpu_qwen3_next_decode(T):
    for dtype in DTYPES:
        q, k, v, g, beta, h0 = make(8, T, 16, 32, 128, 128, dtype, l2=True, seed=20 + T)
        check(q, k, v, g, beta, h0, l2=True)


@pytest.mark.gpu
def test_gpu_varlen_2100_length_one():
    cu = list(range(2101))
    q, k, v, g, beta, h0 = make(1, 2100, 16, 32, 128, 128, torch.bfloat16, N=2100, l2=True, seed=30)
    check(q, k, v, g, beta, h0, cu=cu, l2=True)
