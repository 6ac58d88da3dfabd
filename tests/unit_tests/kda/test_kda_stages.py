"""KDA stage kernels (SPEC 1.11.1 chunk_kda_fwd_intra, 1.11.2 chunk_kda_bwd_wy_dqkg_fused, and the internal
output / dAqk / intra-backward stages) against their float64 references, on inputs produced by the
forward stages; varlen, GVA, chunk sizes 32/64, hard-reset gates, tail rows, poisoned outputs, errors."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops.api.triton.chunk_kda_bwd import chunk_kda_bwd_wy_dqkg_fused
from mindspeed_ops.api.triton.chunk_kda_fwd_intra import chunk_kda_fwd_intra
from mindspeed_ops.ops.gdn.reference import chunk_local_cumsum_ref
from mindspeed_ops.ops.gdn.reference_bwd import chunk_gated_delta_rule_bwd_dhu_ref
from mindspeed_ops.ops.gdn.reference_fwd import chunk_gated_delta_rule_fwd_h_ref
from mindspeed_ops.ops.kda import reference as R
from mindspeed_ops.ops.kda.bwd import chunk_kda_bwd_dav, chunk_kda_bwd_intra
from mindspeed_ops.ops.kda.fwd_o import chunk_kda_fwd_o
from mindspeed_ops.testing import assert_close, assert_unchanged, snapshot, threshold
from tests.conftest import DEVICE, DTYPES, ON_GPU

F64 = torch.float64


def _pipeline(B, T, H, HV, K, V, BT, *, cu=None, s=0.1, hard=False, seed=0):
    """Float64 CPU tensors of the whole KDA chain (forward and backward stages) from the shared recipe."""
    gen = torch.Generator().manual_seed(seed)
    r = (lambda *shape: torch.randn(*shape, generator=gen, dtype=F64))
    q, k, v = F.normalize(r(B, T, H, K), dim=-1), F.normalize(r(B, T, H, K), dim=-1), r(B, T, HV, V)
    g = F.logsigmoid(torch.rand(B, T, HV, K, generator=gen, dtype=F64)) / s
    g = g * (torch.rand(B, T, HV, K, generator=gen, dtype=F64) > 0.2)
    if hard:
        g = torch.where(torch.rand(B, T, HV, 1, generator=gen, dtype=F64) < 0.05, torch.full_like(g, -1000.0), g)
    beta = torch.sigmoid(r(B, T, HV))
    N = B if cu is None else len(cu) - 1
    h0, scale = r(N, HV, K, V), K ** -0.5
    G = chunk_local_cumsum_ref(g, BT, cu_seqlens=cu)
    w, u, _, _, Aqk, Akk = R.chunk_kda_fwd_intra_ref(q, k, v, G, beta, scale, cu, BT)
    h, vn, _ = chunk_gated_delta_rule_fwd_h_ref(k, w, u, gk=G, initial_state=h0, chunk_size=BT, cu_seqlens=cu)
    do, dht = r(B, T, HV, V), r(N, HV, K, V)
    dAq, dvl = R.chunk_kda_bwd_dav_ref(vn, do, Aqk, scale, cu)
    dh, _, dv2 = chunk_gated_delta_rule_bwd_dhu_ref(q, k, w, do, dvl, gk=G, h0=h0, dht=dht, scale=scale,
                                                    cu_seqlens=cu, chunk_size=BT)
    *_, dAm = R.chunk_kda_bwd_wy_dqkg_fused_ref(q, k, v, vn, G, beta, Akk, h, do, dh, dv2, scale, cu, BT)
    return dict(q=q, k=k, v=v, G=G, beta=beta, Aqk=Aqk, Akk=Akk, h=h, v_new=vn, do=do, dh=dh, dv2=dv2, dAq=dAq,
                dAm=dAm, scale=scale)


def _dev(x, dtype):
    return x.to(DEVICE, dtype)


def _cu(cu):
    return None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)


# ------------------------------------------------------------------------------------------------
# chunk_kda_fwd_intra (SPEC 1.11.1)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,shape,BT,cu", [
    (torch.float32, (1, 100, 1, 2, 32, 16), 64, [0, 31, 96, 100]),      # varlen, GVA
    (torch.float16, (2, 63, 1, 1, 16, 16), 32, None),                    # partial chunk
    (torch.float32, (1, 40, 1, 1, 60, 20), 32, None),                    # K = 60
])
def test_fwd_intra(dtype, shape, BT, cu, poisoned):
    B, T, H, HV, K, V = shape
    p = _pipeline(B, T, H, HV, K, V, BT, cu=None if cu is None else torch.tensor(cu), hard=True)
    q, k, v, beta = (_dev(p[n], dtype) for n in ("q", "k", "v", "beta"))
    G = _dev(p["G"], torch.float32)
    before = snapshot(q, k, v, G, beta)
    out = chunk_kda_fwd_intra(q, k, v, G, beta, cu_seqlens=_cu(cu), chunk_size=BT, output_qg=True)
    assert_unchanged(before, q, k, v, G, beta)
    refs = R.chunk_kda_fwd_intra_ref(*(t.double() for t in (q, k, v, G, beta)), cu_seqlens=_cu(cu), chunk_size=BT,
                                     output_qg=True)
    for name, o, r_, dt in zip(("w", "u", "qg", "kg", "Aqk", "Akk"), out, refs, (k, v, q, k, k, k)):
        assert o.dtype == dt.dtype, name
        assert_close(name, r_, o, threshold("LA-o" if name != "Akk" else "TRIL", dtype))


def test_fwd_intra_keywords_and_errors():
    p = _pipeline(1, 20, 1, 1, 16, 16, 32)
    q, k, v, G, beta = (_dev(p[n], torch.float32) for n in ("q", "k", "v", "G", "beta"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        w, u, qg, kg, Aqk, Akk = chunk_kda_fwd_intra(q, k, v, G, beta, chunk_size=32, disable_recompute=True,
                                                     safe_gate=True, lower_bound=-5.0, use_graph=False)
    assert qg is not None
    assert chunk_kda_fwd_intra(q, k, v, G, beta, chunk_size=32)[2] is None
    with pytest.warns(UserWarning, match="odd_flag"):
        chunk_kda_fwd_intra(q, k, v, G, beta, chunk_size=32, odd_flag=1)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_kda_fwd_intra(q, k, v, G, beta, chunk_size=16)
    with pytest.raises(ValueError, match=r"gk must have shape \[B, T, HV, K\]"):
        chunk_kda_fwd_intra(q, k, v, G[..., :8], beta, chunk_size=32)
    with pytest.raises(ValueError, match="multiple"):
        chunk_kda_fwd_intra(q.expand(1, 20, 2, 16), k.expand(1, 20, 2, 16), v, G, beta, chunk_size=32)
    with pytest.raises(TypeError, match="float64"):
        chunk_kda_fwd_intra(q.double(), k, v, G, beta, chunk_size=32)


# ------------------------------------------------------------------------------------------------
# chunk_kda_bwd_wy_dqkg_fused (SPEC 1.11.2)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,shape,BT,cu", [
    (torch.float32, (1, 80, 1, 2, 16, 24), 32, [0, 15, 50, 70]),       # varlen + tail rows, GVA
    (torch.float16, (2, 70, 1, 1, 32, 16), 64, None),
])
def test_bwd_wy_dqkg_fused(dtype, shape, BT, cu, poisoned):
    B, T, H, HV, K, V = shape
    p = _pipeline(B, T, H, HV, K, V, BT, cu=None if cu is None else torch.tensor(cu))
    names = ("q", "k", "v", "v_new", "G", "beta", "Akk", "h", "do", "dh", "dv2")
    ins = [_dev(p[n], torch.float32 if n == "G" else dtype) for n in names]
    before = snapshot(*ins)
    out = chunk_kda_bwd_wy_dqkg_fused(*ins, scale=p["scale"], cu_seqlens=_cu(cu), chunk_size=BT)
    assert_unchanged(before, *ins)
    refs = R.chunk_kda_bwd_wy_dqkg_fused_ref(*(t.double() for t in ins), scale=p["scale"], cu_seqlens=_cu(cu),
                                             chunk_size=BT)
    for name, o, r_, cls in zip(("dq", "dk", "dv", "db", "dg", "dA"), out, refs,
                                ("LA-d", "LA-d", "LA-d", "LA-g", "LA-g", "LA-d")):
        assert o.dtype == (dtype if name == "dv" else torch.float32), name
        assert o.shape == r_.shape, name
        assert_close(name, r_, o, threshold(cls, dtype))
        if cu is not None:
            assert torch.equal(o[:, cu[-1]:], torch.zeros_like(o[:, cu[-1]:])), name


def test_bwd_wy_dqkg_fused_errors():
    p = _pipeline(1, 20, 1, 1, 16, 16, 32)
    names = ("q", "k", "v", "v_new", "G", "beta", "Akk", "h", "do", "dh", "dv2")
    ins = [_dev(p[n], torch.float32) for n in names]
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_kda_bwd_wy_dqkg_fused(*ins, chunk_size=16)
    with pytest.raises(ValueError, match=r"A must have shape \[B, T, HV, BT\] = \[1, 20, 1, 64\]"):
        chunk_kda_bwd_wy_dqkg_fused(*ins, chunk_size=64)
    bad = list(ins)
    bad[7] = bad[7][:, :0]
    with pytest.raises(ValueError, match="h must have shape"):
        chunk_kda_bwd_wy_dqkg_fused(*bad, chunk_size=32)


# ------------------------------------------------------------------------------------------------
# internal stages: output, dAqk / local dv, intra backward
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_fwd_o_dav_intra_bwd(dtype, poisoned):
    cu = [0, 20, 21, 75]
    p = _pipeline(1, 80, 1, 2, 16, 24, 32, cu=torch.tensor(cu))
    cut = _cu(cu)
    q, vn, h, Aqk, do = (_dev(p[n], dtype) for n in ("q", "v_new", "h", "Aqk", "do"))
    G = _dev(p["G"], torch.float32)
    o = chunk_kda_fwd_o(q, vn, h, G, Aqk, p["scale"], cut, 32)
    assert_close("o", R.chunk_kda_fwd_o_ref(*(t.double() for t in (q, vn, h, G, Aqk)), p["scale"], cut, 32), o,
                 threshold("LA-o", dtype))
    assert torch.equal(o[:, 75:], torch.zeros_like(o[:, 75:]))
    dAq, dv = chunk_kda_bwd_dav(vn, do, Aqk, p["scale"], cut)
    rdAq, rdv = R.chunk_kda_bwd_dav_ref(*(t.double() for t in (vn, do, Aqk)), p["scale"], cut)
    assert_close("dAq", rdAq, dAq, threshold("LA-d", dtype))
    assert_close("dv", rdv, dv, threshold("LA-d", dtype))
    k, beta = _dev(p["k"], dtype), _dev(p["beta"], dtype)
    dAm = _dev(p["dAm"], torch.float32)
    out = chunk_kda_bwd_intra(q, k, G, beta, dAq, dAm, cut)
    refs = R.chunk_kda_bwd_intra_ref(*(t.double() for t in (q, k, G, beta, dAq, dAm)), cut)
    for name, a, b in zip(("dq", "dk", "db", "dG"), refs, out):
        assert_close(name, a, b, threshold("LA-g", dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_intra_bwd_key_tiles_gva_varlen(dtype):
    """K = 60 spans several key tiles (a partial last one): db's per-tile partial sums, GVA, varlen chunks
    shorter than a 16-row block, a tail after cu_seqlens[-1]."""
    cu = [0, 5, 40, 41, 90]
    p = _pipeline(1, 96, 1, 2, 60, 8, 32, cu=torch.tensor(cu), seed=3)
    q, k, beta = (_dev(p[n], dtype) for n in ("q", "k", "beta"))
    G, dAq, dAm = (_dev(p[n], torch.float32) for n in ("G", "dAq", "dAm"))
    out = chunk_kda_bwd_intra(q, k, G, beta, dAq, dAm, _cu(cu))
    refs = R.chunk_kda_bwd_intra_ref(*(t.double() for t in (q, k, G, beta, dAq, dAm)), _cu(cu))
    for name, a, b in zip(("dq", "dk", "db", "dG"), refs, out):
        assert_close(name, a, b, threshold("LA-g", dtype))
        assert torch.equal(b[:, 90:], torch.zeros_like(b[:, 90:])), name


def test_intra_bwd_hard_reset_gates_finite():
    p = _pipeline(1, 64, 1, 1, 16, 16, 64, hard=True, s=0.01)
    q, k, G, beta, dAq, dAm = (_dev(p[n], torch.float32) for n in ("q", "k", "G", "beta", "dAq", "dAm"))
    assert G.min() < -900
    out = chunk_kda_bwd_intra(q, k, G, beta, dAq, dAm)
    refs = R.chunk_kda_bwd_intra_ref(*(t.double() for t in (q, k, G, beta, dAq, dAm)))
    for name, a, b in zip(("dq", "dk", "db", "dG"), refs, out):
        assert torch.isfinite(b).all(), name
        assert_close(name, a, b, "LA-g")


@pytest.mark.gpu
@pytest.mark.parametrize("shape,BT,cu", [
    ((2, 1000, 4, 4, 128, 128), 64, None), ((2, 63, 4, 4, 64, 64), 64, None), ((2, 512, 2, 8, 64, 64), 64, None),
    ((2, 300, 2, 2, 256, 256), 64, None), ((2, 160, 2, 2, 64, 64), 32, None),
    ((1, 160, 2, 2, 64, 64), 32, [0, 31, 96, 160]), ((2, 1024, 4, 4, 128, 128), 64, None),
    ((1, 4096, 2, 8, 256, 128), 64, [0, 1, 17, 200, 333, 1000, 1024, 1100, 2000, 2500, 2501, 3000, 3900, 4000]),
])
def test_real_stages_bf16(shape, BT, cu):
    """SPEC 1.11.1 / 1.11.2 must-test shapes in bf16 (forward intra, then the fused backward): chunk sizes 32
    and 64, GVA, K = 256, a 13-segment varlen batch whose last 96 tokens are tail tokens."""
    assert ON_GPU
    B, T, H, HV, K, V = shape
    p = _pipeline(B, T, H, HV, K, V, BT, cu=None if cu is None else torch.tensor(cu), hard=True)
    dt = torch.bfloat16
    q, k, v, beta = (_dev(p[n], dt) for n in ("q", "k", "v", "beta"))
    G = _dev(p["G"], torch.float32)
    out = chunk_kda_fwd_intra(q, k, v, G, beta, cu_seqlens=_cu(cu), chunk_size=BT, output_qg=True)
    refs = R.chunk_kda_fwd_intra_ref(*(t.double() for t in (q, k, v, G, beta)), cu_seqlens=_cu(cu), chunk_size=BT,
                                     output_qg=True)
    for name, o, r_ in zip(("w", "u", "qg", "kg", "Aqk", "Akk"), out, refs):
        assert_close(name, r_, o, threshold("LA-o" if name != "Akk" else "TRIL", dt))
    names = ("q", "k", "v", "v_new", "G", "beta", "Akk", "h", "do", "dh", "dv2")
    ins = [_dev(p[n], torch.float32 if n == "G" else dt) for n in names]
    out = chunk_kda_bwd_wy_dqkg_fused(*ins, scale=p["scale"], cu_seqlens=_cu(cu), chunk_size=BT)
    refs = R.chunk_kda_bwd_wy_dqkg_fused_ref(*(t.double() for t in ins), scale=p["scale"], cu_seqlens=_cu(cu),
                                             chunk_size=BT)
    for name, o, r_, cls in zip(("dq", "dk", "dv", "db", "dg", "dA"), out, refs,
                                ("LA-d", "LA-d", "LA-d", "LA-g", "LA-g", "LA-d")):
        assert_close(name, r_, o, threshold(cls, dt))


def test_aqk_diagonal_quarters_keep_a_rising_gate_local():
    """A rising G (outside SPEC 1.11's non-positive gates) at row 8 of a 16-row block overflows the factor of the
    diagonal block's lower-left 8x8 quarter; the other sub-blocks (rows 0-7, and rows 9-15 against columns 8-15:
    4x4 quarters through rows 4 and 12, exact 4x4 groups) must not see it."""
    from mindspeed_ops.ops.kda import intra

    T, K, BT = 32, 16, 32
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, T, 1, K, generator=gen) * 0.3
    k = torch.randn(1, T, 1, K, generator=gen) * 0.3
    G = torch.zeros(1, T, 1, K)
    G[0, 8, 0, 0] = 200.0
    q[0, 8, 0, 0] = k[0, 8, 0, 0] = 0.0
    beta = torch.full((1, T, 1), 0.5)
    A, _, _, M = intra.aqk_forward(*(_dev(t, torch.float32) for t in (q, k, G)), K ** -0.5, None, None, BT,
                                   beta=_dev(beta, torch.float32))
    qd, kd, Gd = q[0, :, 0].double(), k[0, :, 0].double(), G[0, :, 0].double()
    D = Gd[:, None, :] - Gd[None, :, :]
    E = torch.where(torch.ones(T, T, dtype=torch.bool).tril()[:, :, None], D, float("-inf")).exp()
    ref = K ** -0.5 * torch.einsum("id,jd,ijd->ij", qd, kd, E)
    A = A[0, :, 0].double().cpu()
    for rows, cols in ((slice(0, 8), slice(0, 16)), (slice(9, 16), slice(8, 16))):
        assert torch.isfinite(A[rows, cols]).all()
        assert torch.allclose(A[rows, cols], ref[rows, cols], rtol=1e-5, atol=1e-6)
    assert torch.isfinite(M[0, :8, 0].cpu()).all() and torch.isfinite(M[0, 9:16, 0, 8:16].cpu()).all()
