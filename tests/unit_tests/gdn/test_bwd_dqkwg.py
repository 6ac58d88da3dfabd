"""chunk_bwd_dqkwg (SPEC 1.10.9): the three backward stage references composed as in the backward
pipeline of SPEC 1.10.0 reproduce autograd of chunk_gated_delta_rule_ref in float64 (dq, dk, dv, dg,
dbeta, dh0); then the kernel against the reference: chunk sizes, GVA, head dims (D = 100, K = 256),
varlen with poisoned tails, optional w/dv and g, strong decay, layouts, determinism, errors; and the
compile-only check of the three backward stage kernels for sm_90."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops.api.triton.chunk_bwd_dqkwg import chunk_bwd_dqkwg
from mindspeed_ops.ops.gdn import reference as ref
from mindspeed_ops.ops.gdn import reference_bwd as rb
from mindspeed_ops.ops.gdn import reference_fwd as rf
from mindspeed_ops.ops.gdn import reference_wy as rw
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, snapshot, to_ref
from tests.conftest import COMPILE_ONLY_MARKS, DEVICE, DTYPES, assert_compiled
from tests.unit_tests.gdn.test_bwd_dhu import SEG13, build, cast, close


# ------------------------------------------------------------------------------------------------
# the composed references against autograd of the full operator
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,T,H,HV,K,V,BT,cu,s,h0,gated", [
    (2, 75, 2, 4, 16, 12, 16, None, 1.0, True, True),
    (1, 100, 1, 2, 16, 16, 32, [0, 10, 10, 70, 95], 0.3, True, True),
    (1, 130, 2, 2, 16, 8, 64, None, 0.01, True, True),       # strong decay, partial last chunk
    (1, 50, 2, 2, 16, 8, 16, None, 1.0, False, True),
    (1, 40, 1, 1, 8, 8, 16, [0, 17, 40], 1.0, True, False),  # g = None
])
def test_pipeline_matches_autograd(B, T, H, HV, K, V, BT, cu, s, h0, gated):
    """SPEC 1.10.0 backward pipeline with the stage references (dv_local, bwd_dhu, bwd_dqkwg here;
    prepare_wy_repr_bwd, chunk_local_cumsum) equals autograd of the chunked reference in float64."""
    gen = torch.Generator().manual_seed(0)
    f = dict(dtype=torch.float64, generator=gen)
    q, k = F.normalize(torch.randn(B, T, H, K, **f), dim=-1), F.normalize(torch.randn(B, T, H, K, **f), dim=-1)
    v, beta = torch.randn(B, T, HV, V, **f), torch.sigmoid(torch.randn(B, T, HV, **f))
    g = F.logsigmoid(torch.rand(B, T, HV, **f)) / s * (torch.rand(B, T, HV, **f) > 0.2) if gated else None
    N = B if cu is None else len(cu) - 1
    cu_t = None if cu is None else torch.tensor(cu)
    init = torch.randn(N, HV, K, V, **f) if h0 else None
    do, dht = torch.randn(B, T, HV, V, **f), torch.randn(N, HV, K, V, **f)
    scale = 0.8
    leaves = [t.clone().requires_grad_(True) if t is not None else None for t in (q, k, v, g, beta, init)]
    o, final = ref.chunk_gated_delta_rule_ref(*leaves[:5], scale=scale, initial_state=leaves[5],
                                              output_final_state=True, cu_seqlens=cu_t, chunk_size=BT)
    wrt = [t for t in leaves if t is not None]
    want = dict(zip([n for n, t in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), leaves) if t is not None],
                    torch.autograd.grad((o * do).sum() + (final * dht).sum(), wrt)))

    G = ref.chunk_local_cumsum_ref(g, BT, cu_seqlens=cu_t) if gated else None
    Ainv = ref.solve_tril_ref(ref.chunk_scaled_dot_kkt_ref(k, G, beta, cu_seqlens=cu_t, chunk_size=BT), cu_t)
    w, u = rw.recompute_w_u_fwd_ref(k, v, beta, Ainv, G, None, cu_t)
    h, v_new, _ = rf.chunk_gated_delta_rule_fwd_h_ref(k, w, u, G, None, init, False, BT, True, cu_t)
    dv_local = rb.chunk_bwd_dv_local_ref(q, k, do, G, scale, cu_t, BT)
    dh, dh0, dv2 = rb.chunk_gated_delta_rule_bwd_dhu_ref(q, k, w, do, dv_local, G, None, init, dht, scale, cu_t, BT)
    dq, dk, dw, dG = rb.chunk_bwd_dqkwg_ref(q, k, v_new, do, h, dh, G, dv2, w, cu_t, BT, scale)
    dk2, dv, dbeta, dG2 = rw.prepare_wy_repr_bwd_ref(k, v, G, beta, Ainv, dw, dv2, cu_t)
    got = {"dq": dq, "dk": dk + dk2, "dv": dv, "dbeta": dbeta, "dh0": dh0}
    if gated:
        got["dg"] = ref.chunk_local_cumsum_ref(dG + dG2, BT, reverse=True, cu_seqlens=cu_t)
    else:
        assert dG is None and dG2 is None
    assert (dh0 is None) == (not h0)
    for name, x in want.items():
        assert_close(name, x, got[name], 1e-10)


# ------------------------------------------------------------------------------------------------
# kernel against the reference
# ------------------------------------------------------------------------------------------------

def check(d, dtype, BT, cu=None, gate=True, with_dw=True, scale=None, chunk_indices=None):
    """Kernel on ``d`` (from ``build``) rounded to ``dtype`` vs the float64 reference of the same rounded
    inputs: LA-d for dq/dk/dw, LA-g for dg, keyed by ``dtype``."""
    q, k, v, do, h, dh, dv, w = (cast(d[n], dtype, cu) for n in ("q", "k", "v_new", "do", "h", "dh", "dv2", "w"))
    if cu is not None:  # h/dh are per chunk, not per token: no tail to poison
        h, dh = cast(d["h"], dtype), cast(d["dh"], dtype)
    G = cast(d["G"], torch.float32, cu) if gate else None
    if not with_dw:
        dv = w = None
    cu_t = None if cu is None else torch.tensor(cu, device=DEVICE)
    ins = (q, k, v, do, h, dh, G, dv, w)
    names = ["q", "k", "v", "do", "h", "dh", "g", "dv", "w"]
    before = snapshot(*ins)
    out = chunk_bwd_dqkwg(q, k, v, do, h, dh, g=G, dv=dv, w=w, cu_seqlens=cu_t, chunk_size=BT, scale=scale,
                          chunk_indices=chunk_indices)
    assert_unchanged(before, *ins, names=names)
    want = rb.chunk_bwd_dqkwg_ref(*to_ref(*ins), cu_seqlens=cu_t, chunk_size=BT, scale=scale)
    for name, x, y, cls in zip(("dq", "dk", "dw", "dg"), want, out, ("LA-d", "LA-d", "LA-d", "LA-g")):
        if x is None:
            assert y is None, f"{name} must be None"
            continue
        assert y.dtype == torch.float32
        close(name, x, y, cls, dtype)
        if cu is not None and cu[-1] < q.shape[1]:
            assert (y[:, cu[-1]:] == 0).all(), f"tail tokens of {name} must be 0"
    assert (out[2] is None) == (not with_dw) and (out[3] is None) == (not gate)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,H,HV,K,V,BT", [(2, 100, 2, 2, 32, 32, 32), (1, 90, 1, 4, 16, 24, 16),
                                             (1, 70, 1, 1, 100, 100, 64), (1, 40, 1, 2, 256, 16, 32)])
def test_matches_reference(B, T, H, HV, K, V, BT, dtype, poisoned):
    """BT 16/32/64, GVA (G = 4: dq/dk summed in the program), D = 100 (two K-blocks, masked V),
    K = 256 (four K-blocks)."""
    check(build(B, T, H, HV, K, V, BT=BT, seed=2), dtype, BT)


@pytest.mark.parametrize("BT,cu", [(64, [0, 15, 100, 130]), (16, SEG13[:6]), (32, [0, 0, 40, 40, 97])])
def test_varlen_poisoned_tail(BT, cu, poisoned):
    d = build(1, cu[-1] + 9, 1, 2, 16, 16, BT=BT, cu=cu, seed=3)
    check(d, torch.float32, BT, cu)
    check(d, torch.float16, BT, cu, with_dw=False, scale=0.5)


def test_optional_outputs_and_no_gate(poisoned):
    d = build(1, 50, 1, 2, 16, 16, BT=16, gate=None, seed=4)
    dq, dk, dw, dg = check(d, torch.float32, 16, gate=False)
    assert dg is None
    q, k, v, do, h, dh, dv, w = (cast(d[n], torch.float32) for n in ("q", "k", "v_new", "do", "h", "dh", "dv2", "w"))
    z = chunk_bwd_dqkwg(q, k, v, do, h, dh, g=torch.zeros(1, 50, 2, device=DEVICE), dv=dv, w=w, chunk_size=16)
    for x, y in zip((dq, dk, dw), z[:3]):
        assert torch.equal(x, y), "g=None must equal g=zeros"
    assert chunk_bwd_dqkwg(q, k, v, do, h, dh, dv=dv, chunk_size=16)[2] is None   # dw needs w and dv
    assert chunk_bwd_dqkwg(q, k, v, do, h, dh, w=w, chunk_size=16)[2] is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_strong_decay_partial_chunk(dtype, poisoned):
    for t in check(build(2, 75, 1, 1, 16, 16, BT=64, s=0.01, seed=5), dtype, 64):
        assert torch.isfinite(t).all()


def test_layouts_determinism_chunk_indices():
    from mindspeed_ops.api.triton.utils import prepare_chunk_indices

    d = build(1, 60, 1, 2, 16, 16, BT=16, seed=6)
    q, k, v, do, h, dh, dv, w, G = (cast(d[n], torch.float32) for n in ("q", "k", "v_new", "do", "h", "dh", "dv2",
                                                                       "w", "G"))
    do = do[:, :, :, :1].expand_as(do)                  # stride-0 upstream gradient
    base = chunk_bwd_dqkwg(q, k, v, do.contiguous(), h, dh, g=G, dv=dv, w=w, chunk_size=16)
    again = chunk_bwd_dqkwg(q, k, v, do.contiguous(), h, dh, g=G, dv=dv, w=w, chunk_size=16)
    assert all(torch.equal(x, y) for x, y in zip(base, again)), "not deterministic"
    out = chunk_bwd_dqkwg(q.transpose(1, 2).contiguous().transpose(1, 2), non_contiguous(k, "transpose"),
                          non_contiguous(v), do, non_contiguous(h), non_contiguous(dh, "transpose"),
                          g=non_contiguous(G), dv=non_contiguous(dv), w=non_contiguous(w, "transpose"), chunk_size=16)
    assert all(torch.equal(x, y) for x, y in zip(base, out)), "layout changed the result"
    cu = [0, 20, 60]
    dc = build(1, 60, 1, 2, 16, 16, BT=16, cu=cu, seed=7)
    check(dc, torch.float32, 16, cu, chunk_indices=prepare_chunk_indices(torch.tensor(cu, device=DEVICE), 16))


def test_empty():
    q, v = torch.randn(1, 0, 2, 16, device=DEVICE), torch.randn(1, 0, 2, 8, device=DEVICE)
    h = torch.randn(1, 0, 2, 16, 8, device=DEVICE)
    dq, dk, dw, dg = chunk_bwd_dqkwg(q, q, v, v, h, h, g=v[..., 0], dv=v, w=q)
    assert dq.shape == dk.shape == dw.shape == (1, 0, 2, 16) and dg.shape == (1, 0, 2)
    q, v = torch.randn(1, 5, 2, 16, device=DEVICE), torch.randn(1, 5, 2, 8, device=DEVICE)
    out = chunk_bwd_dqkwg(q, q, v, v, h, h, g=v[..., 0], dv=v, w=q, cu_seqlens=torch.tensor([0, 0], device=DEVICE))
    assert all((t == 0).all() for t in out)


def test_bad_input():
    q = torch.randn(1, 100, 2, 16, device=DEVICE)
    v = torch.randn(1, 100, 4, 8, device=DEVICE)
    h = torch.randn(1, 2, 4, 16, 8, device=DEVICE)
    f = chunk_bwd_dqkwg
    with pytest.raises(ValueError, match="chunk_bwd_dqkwg: q must be 4-D"):
        f(q[0], q, v, v, h, h)
    with pytest.raises(ValueError, match="v must have shape \\[B, T, HV, V\\]"):
        f(q, q, v[..., :4], v, h, h)
    with pytest.raises(ValueError, match="h must have shape \\[B, NT, HV, K, V\\] = \\[1, 2, 4, 16, 8\\]"):
        f(q, q, v, v, h[:, :1], h)
    with pytest.raises(ValueError, match="h must have shape .* = \\[1, 4, 4, 16, 8\\]"):   # NT follows chunk_size
        f(q, q, v, v, h, h, chunk_size=32)
    with pytest.raises(ValueError, match="dh must have shape"):
        f(q, q, v, v, h, h[..., :4])
    with pytest.raises(ValueError, match="w must have shape"):
        f(q, q, v, v, h, h, dv=v, w=q)
    with pytest.raises(ValueError, match="dv must have shape"):
        f(q, q, v, v, h, h, dv=v[:, :, :2])
    with pytest.raises(ValueError, match="g must have shape"):
        f(q, q, v, v, h, h, g=v)
    with pytest.raises(ValueError, match="multiple of the key heads"):
        f(q, q, v[:, :, :3], v[:, :, :3], h[:, :, :3], h[:, :, :3])
    with pytest.raises(TypeError, match="float64"):
        f(q, q, v, v, h.double(), h)
    with pytest.raises(TypeError, match="do must have dtype"):
        f(q, q, v, v.int(), h, h)
    with pytest.raises(ValueError, match="batch size must be 1"):
        f(*(t.expand(2, *t.shape[1:]) for t in (q, q, v, v, h, h)), cu_seqlens=torch.tensor([0, 100], device=DEVICE))
    with pytest.raises(ValueError, match="h must have shape"):  # varlen: NT = sum of per-sequence chunks
        f(q, q, v, v, h, h, cu_seqlens=torch.tensor([0, 5, 100], device=DEVICE))


# ------------------------------------------------------------------------------------------------
# real sizes (GPU) and compile-only (DESIGN 7)
# ------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("B,T,cu", [(1, 2048, [0, 1024, 1164, 2048]), (1, 1024, None), (2, 2048, None)])
def test_gpu_real_sizes(B, T, cu):
    d = build(B, T, 32, 32, 128, 128, cu=cu, seed=20)
    for dtype in DTYPES:
        check(d, dtype, 64, cu)
    d = build(B, T, 16, 32, 128, 128, BT=16, cu=cu, seed=21)      # GVA, BT = 16
    check(d, torch.bfloat16, 16, cu)
    check(d, torch.float32, 16, cu)


@pytest.mark.gpu
def test_gpu_head_dim_100():
    d = build(2, 1024, 4, 8, 100, 100, seed=22)
    for dtype in DTYPES:
        check(d, dtype, 64)


@COMPILE_ONLY_MARKS[0]
@COMPILE_ONLY_MARKS[1]
def test_kernels_compile_for_gpu():
    """The three backward stage kernels at Qwen3-Next sizes (H = 16, HV = 32, K = V = 128, fp16 and its
    bf16 twin) build for sm_90 with every autotune config (dqkwg's bf16 128-wide K block for sm_80 too), within
    shared memory and without spills, but dqkwg's 128-wide K block (``DQKWG_BK128_SPILL``)."""
    from mindspeed_ops import compile_check as cc
    from mindspeed_ops.api.triton.chunk_bwd_dv_local import chunk_bwd_dv_local
    from mindspeed_ops.api.triton.chunk_gated_delta_rule_bwd_dhu import chunk_gated_delta_rule_bwd_dhu

    T, BT, H, HV, K = 8192, 64, 16, 32, 128
    dt = torch.float16
    q, w, v = torch.empty(1, T, H, K, dtype=dt), torch.empty(1, T, HV, K, dtype=dt), torch.empty(1, T, HV, K, dtype=dt)
    G, h, s = torch.empty(1, T, HV), torch.empty(1, T // BT, HV, K, K, dtype=dt), torch.empty(1, HV, K, K)
    with cc.Recorder(dry=True) as rec:
        chunk_bwd_dv_local(q, q, v, G)
        chunk_gated_delta_rule_bwd_dhu(q, q, w, v, v, G, h0=s, dht=s)
        chunk_bwd_dqkwg(q, q, v, v, h, h, G, dv=v, w=w)
    launches = cc.dedupe(rec.launches)
    assert {la.qualname for la in launches} == {"chunk_bwd_dv_local_kernel", "chunk_bwd_dhu_kernel",
                                                "chunk_bwd_dqkwg_kernel"}
    results = cc.compile_launches(launches + [cc.as_bf16(la) for la in launches[:1]], archs=(90,), jobs=2)
    # A100 (sm_80): dqkwg's 128-wide K block in bf16 (the configuration the H200 sweep chose)
    results += cc.compile_launches([cc.as_bf16(la) for la in launches if "BK=128" in la.label()], archs=(80,), jobs=2)
    assert_compiled(results, lambda r: DQKWG_BK128_SPILL if "BK=128" in r.launch.label() else 0)


#: dqkwg takes K <= 128 in one 128-wide block for fp16/bf16 although it then spills (sm_90: 16-316 bytes by
#: configuration; sm_80: 72-540): on the H200 that was the fastest setting (464 us with 64-wide V tiles, 8
#: warps, 3 stages, 228 bytes of spills, vs 511 us for the best 64-wide K block, which does not spill;
#: benchmarks/tune_gdn_bwd.py, docs/benchmarks/gdn.md). The bound catches worse.
DQKWG_BK128_SPILL = 1024


@pytest.mark.parametrize("K,V,dtype", [(128, 128, torch.bfloat16), (64, 128, torch.float32), (32, 24, torch.float16),
                                       (100, 60, torch.bfloat16), (256, 256, torch.float32)])
def test_autotune_space_has_one_v_tile_and_warp_count(K, V, dtype):
    """The V tile and the warp count set dq/dk/dg's summation order: the autotuner may only choose the stages (else
    a process timing differently rounds differently; SPEC 0.6; the H200 gave other dg bits at 4 and 8 warps)."""
    from mindspeed_ops.ops.gdn import bwd_dqkwg

    kept = bwd_dqkwg._prune(bwd_dqkwg._configs(), {"V": V}, BK=bwd_dqkwg.block_k(K, dtype))
    assert kept and len({(c.kwargs["BV"], c.num_warps) for c in kept}) == 1
