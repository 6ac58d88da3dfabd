"""recompute_w_u_fwd and prepare_wy_repr_bwd (SPEC 1.10.4): kernels vs float64 references (the
backward reference checked against autograd through the true inverse), g=None == zeros, GVA,
varlen with poisoned tails, strong decay, head dims, mixed dtypes, layouts, errors, compile-only."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops.api.triton import recompute_w_u_fwd as api_alias
from mindspeed_ops.api.triton.wy_fast import prepare_wy_repr_bwd, recompute_w_u_fwd
from mindspeed_ops.ops.gdn import reference as ref
from mindspeed_ops.ops.gdn import reference_wy as rw
from mindspeed_ops.ops.gdn import wy_fast as wy_fast_module
from mindspeed_ops.testing import (assert_close, assert_unchanged, err_atol, non_contiguous, snapshot, threshold,
                                   to_ref)
from tests.conftest import COMPILE_ONLY_MARKS, DEVICE, DTYPES, assert_compiled

CLASSES = {"w": "LA-o", "u": "LA-o", "dk": "LA-d", "dv": "LA-d", "dbeta": "LA-g", "dg": "LA-g"}


def make_inputs(B, T, H, HV, K, V, BT, dtype, cu=None, seed=0, s=1.0, beta_one=False):
    """Pipeline-like inputs: L2-normalised ``k``, ``v``, sigmoid ``beta`` (or 1) in ``dtype``; fp32
    chunk cumsums ``G`` (scalar) and ``Gk`` (per channel) of ``logsigmoid(rand)/s`` with ~20% zeros;
    ``A = (I + kkt)^{-1}`` computed in float64 from the rounded inputs and stored fp32; random
    ``dw`` (fp32, as chunk_bwd_dqkwg returns it) and ``du`` (``dtype``)."""
    gen = torch.Generator().manual_seed(seed)
    cu_cpu = None if cu is None else torch.tensor(cu)

    def gates(shape):
        g = F.logsigmoid(torch.rand(shape, generator=gen, dtype=torch.float64)) / s
        g = g * (torch.rand(shape, generator=gen, dtype=torch.float64) > 0.2)
        return ref.chunk_local_cumsum_ref(g, BT, cu_seqlens=cu_cpu).float()

    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(dtype)
    v = torch.randn(B, T, HV, V, generator=gen).to(dtype)
    beta = torch.ones(B, T, HV) if beta_one else torch.sigmoid(torch.randn(B, T, HV, generator=gen))
    beta = beta.to(dtype)
    G, Gk = gates((B, T, HV)), gates((B, T, HV, K))
    A = ref.solve_tril_ref(ref.chunk_scaled_dot_kkt_ref(k.double(), G.double(), beta.double(), cu_seqlens=cu_cpu,
                                                        chunk_size=BT), cu_seqlens=cu_cpu).float()
    dw = torch.randn(B, T, HV, K, generator=gen)
    du = torch.randn(B, T, HV, V, generator=gen).to(dtype)
    return [t.to(DEVICE) for t in (k, v, beta, G, Gk, A, dw, du)]


def _close(name, want, out, key):
    assert out.shape == want.shape, (name, out.shape, want.shape)
    assert_close(name, want, out, threshold(CLASSES[name], key), err_atol(key))


def check_fwd(k, v, beta, A, g=None, gk=None, cu=None, **kw):
    before = snapshot(k, v, beta, A, g, gk)
    w, u = recompute_w_u_fwd(k, v, beta, A, g=g, gk=gk, cu_seqlens=cu, **kw)
    assert_unchanged(before, k, v, beta, A, g, gk, names=["k", "v", "beta", "A", "g", "gk"])
    assert w.dtype == k.dtype and u.dtype == v.dtype
    wr, ur = rw.recompute_w_u_fwd_ref(*to_ref(k, v, beta, A, g, gk), cu_seqlens=cu)
    _close("w", wr, w, k.dtype)
    _close("u", ur, u, k.dtype)
    return w, u


def check_bwd(k, v, g, beta, A, dw, du, cu=None, **kw):
    before = snapshot(k, v, g, beta, A, dw, du)
    out = prepare_wy_repr_bwd(k, v, g, beta, A, dw, du, cu_seqlens=cu, chunk_size=A.shape[-1], **kw)
    assert_unchanged(before, k, v, g, beta, A, dw, du, names=["k", "v", "g", "beta", "A", "dw", "du"])
    dk, dv, dbeta, dg = out
    assert dk.dtype == dbeta.dtype == torch.float32 and dv.dtype == v.dtype
    assert (dg is None) == (g is None) and (dg is None or dg.dtype == torch.float32)
    want = rw.prepare_wy_repr_bwd_ref(*to_ref(k, v, g, beta, A, dw, du), cu_seqlens=cu)
    for name, o, wnt in zip(("dk", "dv", "dbeta", "dg"), out, want):
        if wnt is not None:
            _close(name, wnt, o, k.dtype)
    return out


def _tail_zero(cu, *outs):
    for o in outs:
        if o is not None:
            assert torch.isfinite(o).all()
            assert (o[:, cu[-1]:] == 0).all()


# ------------------------------------------------------------------------------------------------
# reference sanity: the 1.10.4 formulas are the gradient of the forward through the true inverse
# ------------------------------------------------------------------------------------------------

def test_reference_is_gradient_through_true_inverse():
    """With ``A`` the exact inverse, ``prepare_wy_repr_bwd_ref`` equals autograd of
    ``w, u = (I + M(k, β, G))^{-1}·(β e^G k, β v)`` (float64), for GVA and varlen; with g=None the
    dbeta path through M (the 'dk part') is kept."""
    cu = torch.tensor([0, 20, 57])
    gen = torch.Generator().manual_seed(0)
    k = F.normalize(torch.randn(1, 57, 1, 8, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, 57, 2, 5, generator=gen, dtype=torch.float64)
    beta = torch.sigmoid(torch.randn(1, 57, 2, generator=gen, dtype=torch.float64))
    G = ref.chunk_local_cumsum_ref(F.logsigmoid(torch.randn(1, 57, 2, generator=gen, dtype=torch.float64)), 16,
                                   cu_seqlens=cu)
    dw = torch.randn(1, 57, 2, 8, generator=gen, dtype=torch.float64)
    du = torch.randn(1, 57, 2, 5, generator=gen, dtype=torch.float64)
    for g in (G, None):
        leaves = [t.clone().requires_grad_(True) for t in (k, v, beta)] + ([G.clone().requires_grad_(True)]
                                                                           if g is not None else [])
        gl = leaves[3] if g is not None else None
        A = ref.solve_tril_ref(ref.chunk_scaled_dot_kkt_ref(leaves[0], gl, leaves[2], cu_seqlens=cu, chunk_size=16),
                               cu_seqlens=cu)                 # differentiable (triangular solve)
        w, u = rw.recompute_w_u_fwd_ref(leaves[0], leaves[1], leaves[2], A, g=gl, cu_seqlens=cu)
        grads = torch.autograd.grad((w * dw).sum() + (u * du).sum(), leaves)
        out = rw.prepare_wy_repr_bwd_ref(k, v, g, beta, A.detach(), dw, du, cu_seqlens=cu)
        for a, b in zip(out, grads):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# kernels vs references
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("BT", [16, 32, 64])
def test_fwd_matches_reference(BT, dtype, poisoned):
    k, v, beta, G, Gk, A, _, _ = make_inputs(2, 100, 1, 2, 32, 48, BT, dtype, seed=BT)  # T % BT != 0
    check_fwd(k, v, beta, A, g=G)
    check_fwd(k, v, beta, A, gk=Gk)
    check_fwd(k, v, beta, A)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("BT", [16, 32, 64])
def test_bwd_matches_reference(BT, dtype, poisoned):
    k, v, beta, G, _, A, dw, du = make_inputs(2, 100, 1, 2, 32, 48, BT, dtype, seed=BT + 1)
    check_bwd(k, v, G, beta, A, dw, du)


def test_g_none_equals_zeros(poisoned):
    """g=None is no decay: all outputs equal those of g = zeros (dg is None). check_bwd compares the
    g=None dbeta with the full reference (its k·k part through M included)."""
    k, v, beta, G, _, A, dw, du = make_inputs(1, 70, 1, 2, 16, 16, 32, torch.float32, seed=2)
    z = torch.zeros_like(G)
    w0, u0 = check_fwd(k, v, beta, A)
    w1, u1 = check_fwd(k, v, beta, A, g=z)
    out0 = check_bwd(k, v, None, beta, A, dw, du)
    out1 = check_bwd(k, v, z, beta, A, dw, du)
    assert out0[3] is None and out1[3] is not None
    for a, b in zip((w0, u0) + out0[:3], (w1, u1) + out1[:3]):
        _same(a, b)


def _same(a, b):
    """Equal: bitwise under the interpreter; on the GPU the gated and ungated kernels are different
    compilations (their fp32 FMA contraction differs), so within a few fp32 ulps."""
    if DEVICE == "cpu":
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_gva(poisoned):
    """H=2 key heads, HV=8 value heads: dk summed over the 4 value heads of each key head."""
    for dtype in DTYPES:
        k, v, beta, G, Gk, A, dw, du = make_inputs(1, 40, 2, 8, 16, 16, 32, dtype, seed=3)
        check_fwd(k, v, beta, A, g=G)
        check_fwd(k, v, beta, A, gk=Gk)
        check_bwd(k, v, G, beta, A, dw, du)
        check_bwd(k, v, None, beta, A, dw, du)


@pytest.mark.parametrize("BT,cu", [(16, [0, 37, 100, 101, 150]), (64, [0, 0, 70, 150, 150, 200])])
def test_varlen_poisoned_tail(BT, cu, poisoned):
    T = cu[-1] + 7
    k, v, beta, G, Gk, A, dw, du = make_inputs(1, T, 1, 2, 16, 24, BT, torch.float32, cu=cu, seed=4)
    e = cu[-1]
    for t, val in ((k, float("nan")), (v, 1e30), (beta, float("nan")), (G, float("inf")), (Gk, float("nan")),
                   (A, float("nan")), (dw, float("nan")), (du, -1e30)):
        t[:, e:] = val
    cu32, cu64 = (torch.tensor(cu, dtype=dt, device=DEVICE) for dt in (torch.int32, torch.int64))
    _tail_zero(cu, *check_fwd(k, v, beta, A, g=G, cu=cu32))
    _tail_zero(cu, *check_bwd(k, v, G, beta, A, dw, du, cu=cu32))
    _tail_zero(cu, *check_fwd(k, v, beta, A, gk=Gk, cu=cu64))
    _tail_zero(cu, *check_bwd(k, v, None, beta, A, dw, du, cu=cu64))


def test_strong_decay_finite(poisoned):
    """g = logsigmoid(rand)/0.01 (G down to ~ -4000 in a chunk), T = 75, and beta = 1."""
    for dtype in DTYPES:
        k, v, beta, G, Gk, A, dw, du = make_inputs(1, 75, 1, 2, 16, 16, 64, dtype, seed=5, s=0.01, beta_one=True)
        for o in check_fwd(k, v, beta, A, g=G) + check_fwd(k, v, beta, A, gk=Gk):
            assert torch.isfinite(o).all()
        for o in check_bwd(k, v, G, beta, A, dw, du):
            assert torch.isfinite(o).all()


@pytest.mark.parametrize("K,V", [(60, 100), (100, 8), (8, 60)])
def test_head_dims(K, V, poisoned):
    k, v, beta, G, Gk, A, dw, du = make_inputs(1, 40, 1, 1, K, V, 32, torch.float32, seed=K)
    check_fwd(k, v, beta, A, g=G)
    if K == 100:
        check_fwd(k, v, beta, A, gk=Gk)
    check_bwd(k, v, G, beta, A, dw, du)


def test_mixed_dtypes_and_layouts():
    """fp16 k/v/du with fp32 G/A/dw (the pipeline's mix), fp16 beta or fp32 beta; non-contiguous
    views (padded last dim, transposed storage, token stride != heads*dim) give the same results."""
    k, v, beta, G, Gk, A, dw, du = make_inputs(1, 50, 1, 2, 16, 16, 16, torch.float16, seed=6)
    ref_f = check_fwd(k, v, beta, A, g=G)
    ref_b = check_bwd(k, v, G, beta, A, dw, du)
    check_fwd(k, v, beta.float(), A.half(), g=G)
    check_bwd(k, v, G.half(), beta.float(), A, dw.half(), du)
    nc = [non_contiguous(t, kind) for t, kind in ((k, "transpose"), (v, "pad"), (beta, "pad"), (G, "pad"),
                                                   (A, "transpose"), (dw, "pad"), (du, "transpose"))]
    kT = k.transpose(1, 2).contiguous().transpose(1, 2)
    for a, b in zip(check_fwd(nc[0], nc[1], nc[2], nc[4], g=nc[3]), ref_f):
        assert torch.equal(a, b)
    for a, b in zip(check_bwd(kT, nc[1], nc[3], nc[2], nc[4], nc[5], nc[6]), ref_b):
        assert torch.equal(a, b)
    gk_nc = Gk.transpose(1, 2).contiguous().transpose(1, 2)
    assert all(torch.equal(a, b) for a, b in zip(recompute_w_u_fwd(k, v, beta, A, gk=gk_nc),
                                                   recompute_w_u_fwd(k, v, beta, A, gk=Gk)))


def test_chunk_indices_determinism_aliases():
    from mindspeed_ops.api.triton.utils import prepare_chunk_indices

    cu = [0, 15, 100, 130]
    cu_t = torch.tensor(cu, device=DEVICE)
    k, v, beta, G, _, A, dw, du = make_inputs(1, 130, 1, 2, 16, 16, 64, torch.float32, cu=cu, seed=7)
    idx = prepare_chunk_indices(cu_t, 64)
    f1 = recompute_w_u_fwd(k, v, beta, A, g=G, cu_seqlens=cu_t)
    f2 = recompute_w_u_fwd(k, v, beta, A, g=G, cu_seqlens=cu_t, chunk_indices=idx)
    b1 = prepare_wy_repr_bwd(k, v, G, beta, A, dw, du, cu_seqlens=cu_t)
    b2 = prepare_wy_repr_bwd(k=k, v=v, g=G, beta=beta, A=A, dw=dw, du=du, cu_seqlens=cu_t, chunk_indices=idx)
    assert all(torch.equal(a, b) for a, b in zip(f1, f2)) and all(torch.equal(a, b) for a, b in zip(b1, b2))
    assert api_alias.recompute_w_u_fwd is recompute_w_u_fwd and api_alias.prepare_wy_repr_bwd is prepare_wy_repr_bwd


def test_empty():
    k = torch.randn(1, 0, 1, 16, device=DEVICE)
    v = torch.randn(1, 0, 2, 8, device=DEVICE)
    b = torch.rand(1, 0, 2, device=DEVICE)
    A = torch.randn(1, 0, 2, 16, device=DEVICE)
    w, u = recompute_w_u_fwd(k, v, b, A)
    assert w.shape == (1, 0, 2, 16) and u.shape == (1, 0, 2, 8)
    dk, dv, db, dg = prepare_wy_repr_bwd(k, v, None, b, A, w, u, chunk_size=16)
    assert dk.shape == (1, 0, 1, 16) and dv.shape == (1, 0, 2, 8) and db.shape == (1, 0, 2) and dg is None
    k, v, beta, G, _, A, dw, du = make_inputs(1, 10, 1, 2, 16, 8, 16, torch.float32, seed=8)
    cu = torch.tensor([0, 0], device=DEVICE)
    assert all((o == 0).all() for o in recompute_w_u_fwd(k, v, beta, A, g=G, cu_seqlens=cu))
    assert all((o == 0).all() for o in prepare_wy_repr_bwd(k, v, G, beta, A, dw, du, cu_seqlens=cu, chunk_size=16))


def test_bad_input():
    k, v, beta, G, Gk, A, dw, du = make_inputs(1, 32, 1, 2, 16, 8, 16, torch.float32, seed=9)
    with pytest.raises(ValueError, match="recompute_w_u_fwd: k must be 4-D"):
        recompute_w_u_fwd(k[0], v, beta, A)
    with pytest.raises(TypeError, match="float64"):
        recompute_w_u_fwd(k, v.double(), beta, A)
    with pytest.raises(TypeError, match="A must have dtype"):
        recompute_w_u_fwd(k, v, beta, A.int())
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, HV\] = \[1, 32, 2\], got \[1, 32, 2, 1\]"):
        recompute_w_u_fwd(k, v, beta[..., None], A)
    with pytest.raises(ValueError, match=r"chunk size BT\) must be 16, 32 or 64, got shape \[1, 32, 2, 8\]"):
        recompute_w_u_fwd(k, v, beta, A[..., :8])
    with pytest.raises(ValueError, match="not both"):
        recompute_w_u_fwd(k, v, beta, A, g=G, gk=Gk)
    with pytest.raises(ValueError, match=r"gk must have shape \[B, T, HV, K\] = \[1, 32, 2, 16\]"):
        recompute_w_u_fwd(k, v, beta, A, gk=Gk[..., :8])
    with pytest.raises(ValueError, match=r"HV = 3 \(v.shape\[2\]\) must be a positive multiple of the key heads H = 2"):
        recompute_w_u_fwd(k.expand(-1, -1, 2, -1), v[:, :, :1].expand(-1, -1, 3, -1), beta, A)
    with pytest.raises(ValueError, match="K must be <= 256"):
        recompute_w_u_fwd(torch.randn(1, 32, 1, 300), v, beta, A)
    with pytest.raises(ValueError, match="batch size must be 1"):
        recompute_w_u_fwd(*(t.expand(2, *t.shape[1:]) for t in (k, v, beta, A)), cu_seqlens=torch.tensor([0, 32]))
    with pytest.raises(ValueError, match=r"prepare_wy_repr_bwd: chunk_size = 64 conflicts with A's last dim .* 16"):
        prepare_wy_repr_bwd(k, v, G, beta, A, dw, du)
    with pytest.raises(ValueError, match=r"dw must have shape \[B, T, HV, K\] = \[1, 32, 2, 16\], got \[1, 32, 2, 8\]"):
        prepare_wy_repr_bwd(k, v, G, beta, A, dw[..., :8], du, chunk_size=16)
    with pytest.raises(ValueError, match=r"du must have shape"):
        prepare_wy_repr_bwd(k, v, G, beta, A, dw, du[..., :4], chunk_size=16)
    with pytest.raises(TypeError, match="prepare_wy_repr_bwd: dw must have dtype float32/float16/bfloat16, got float64"):
        prepare_wy_repr_bwd(k, v, G, beta, A, dw.double(), du, chunk_size=16)
    with pytest.raises(ValueError, match=r"cu_seqlens\[0\] must be 0"):
        prepare_wy_repr_bwd(k, v, G, beta, A, dw, du, chunk_size=16, cu_seqlens=torch.tensor([1, 32]))


# ------------------------------------------------------------------------------------------------
# GPU sizes (SPEC must-test shapes)
# ------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("BT", [16, 32, 64])
@pytest.mark.parametrize("B,T,cu", [(1, 1024, None), (1, 4096, None), (2, 4096, None),
                                    (1, 4096, [0, 1024, 2168, 3087, 4096])])
def test_gpu_real_sizes(B, T, cu, BT):
    cu_t = None if cu is None else torch.tensor(cu, device=DEVICE)
    for dtype in DTYPES:
        k, v, beta, G, Gk, A, dw, du = make_inputs(B, T, 32, 32, 128, 128, BT, dtype, cu=cu, seed=10)
        check_fwd(k, v, beta, A, g=G, cu=cu_t)
        check_bwd(k, v, G, beta, A, dw, du, cu=cu_t)
        check_bwd(k, v, None, beta, A, dw, du, cu=cu_t)
        if T == 1024:
            check_fwd(k, v, beta, A, gk=Gk, cu=cu_t)


@pytest.mark.gpu
def test_gpu_gva_strong_decay():
    for dtype in DTYPES:
        k, v, beta, G, Gk, A, dw, du = make_inputs(2, 1000, 2, 8, 128, 128, 64, dtype, seed=11)
        check_fwd(k, v, beta, A, g=G)
        check_bwd(k, v, G, beta, A, dw, du)
        k, v, beta, G, Gk, A, dw, du = make_inputs(1, 75, 4, 16, 100, 60, 64, dtype, seed=12, s=0.01)
        for o in check_bwd(k, v, G, beta, A, dw, du) + check_fwd(k, v, beta, A, g=G):
            assert torch.isfinite(o).all()


# ------------------------------------------------------------------------------------------------
# compile-only (DESIGN 7): the launches of real sizes, built for sm_80 / sm_90
# ------------------------------------------------------------------------------------------------

WY_BWD_4W_SPILL = 512  # bytes of register spill allowed to wy's backward at 4 warps on sm_90 (see below)


@COMPILE_ONLY_MARKS[0]
@COMPILE_ONLY_MARKS[1]
def test_kernels_compile_for_gpu():
    from mindspeed_ops import compile_check as cc

    T, BT = 8192, 64
    with cc.Recorder(dry=True) as rec:
        for dt in (torch.float32, torch.float16):
            k, v = torch.empty(1, T, 16, 128, dtype=dt), torch.empty(1, T, 32, 128, dtype=dt)
            beta, G, A = torch.empty(1, T, 32, dtype=dt), torch.empty(1, T, 32), torch.empty(1, T, 32, BT)
            recompute_w_u_fwd(k, v, beta, A, g=G)
            recompute_w_u_fwd(k, v, beta, A, gk=torch.empty(1, T, 32, 128), cu_seqlens=torch.tensor([0, 99, T]))
            prepare_wy_repr_bwd(k, v, G, beta, A, torch.empty(1, T, 32, 128), torch.empty_like(v), chunk_size=BT)
            # the GDN pipeline's variant: dqkwg's dk/dG added in the kernel (HAS_ACC), dw in k's dtype, dg's reverse
            # chunk cumsum in the kernel (DG_CUMSUM)
            wy_fast_module.backward(k, v, G, beta, A, torch.empty(1, T, 32, 128, dtype=dt), torch.empty_like(v), None,
                                    None, dk_acc=torch.empty(1, T, 16, 128), dg_acc=torch.empty(1, T, 32),
                                    dg_cumsum=True)
    launches = cc.dedupe(rec.launches)
    assert any("HAS_ACC=True" in la.label() and "DG_CUMSUM=True" in la.label() for la in launches)
    bf16 = [cc.as_bf16(la) for la in launches if "*fp16" in la.signature.values()]
    assert {la.qualname for la in launches} == {"wy_fwd_kernel", "wy_bwd_kernel"}
    # H200 (sm_90) for every dtype; A100 (sm_80) for bf16 (the fp32 builds are slow to compile)
    results = cc.compile_launches(launches + bf16, archs=(90,), jobs=2)
    results += cc.compile_launches(bf16, archs=(80,), jobs=2)

    def spill_allowed(r):  # 16-bit on sm_90: no register spills (fp32 and sm_80 builds not bounded), but the
        # backward at 4 warps (~220 bytes): measured faster than 8 warps without spills (377 vs 537 µs at
        # T = 8192, H200), a stated allowance
        if r.arch != 90 or "fp32" in r.launch.signature["k_ptr"]:
            return None
        four_warp_bwd = r.launch.qualname == "wy_bwd_kernel" and r.launch.options.get("num_warps") == 4
        return WY_BWD_4W_SPILL if four_warp_bwd else 0

    assert_compiled(results, spill_allowed)


@pytest.mark.parametrize("K,V", [(32, 48), (128, 128), (60, 100), (16, 256), (256, 8)])
@pytest.mark.parametrize("BT", [16, 32, 64])
def test_tensor_core_tiles_equal(K, V, BT):
    """Regression (H200, triton 3.6): with BT = 64 in fp16/bf16, key and value tiles of different widths
    (BK = 32, BV = 64 at K = 32, V = 48) made both kernels wrong (w rel-RMS 1.0, dk 1e35); the launch
    configs now use one width for both loops (see wy_fast._tensor_core_tiles)."""
    from mindspeed_ops.ops.gdn import wy_fast
    for dtype in (torch.float16, torch.bfloat16):
        for cfg in (wy_fast.fwd_config(BT, K, V, dtype), wy_fast.bwd_config(BT, K, V, dtype)):
            assert cfg[0] == cfg[1], cfg
