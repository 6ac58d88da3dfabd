"""In-kernel qk l2norm folded into the forward stages (GDN SPEC 1.10.10, KDA SPEC 1.11.3): with
``use_qk_l2norm_in_kernel=True`` the forward passes raw q, k and their fp32 rstd to kkt, wy, fwd_h,
fwd_o and KDA's Aqk / fwd_o, which multiply the rstd where q̂ = rstd·q, k̂ = rstd·k enter a product.

In fp32 that must equal the same op fed q̂, k̂ normalised outside (in float64, rounded to fp32) with
``use_qk_l2norm_in_kernel=False``, to rounding (every stage intermediate too, so a fold applied twice,
forgotten, or read from the wrong head / token is caught where it happens); gradients still go through
the l2norm backward against the float64 oracle. Cases: GVA (H=2, HV=4), varlen with tail tokens (NaN
q/k there), partial last chunks, K = 60 / 100, non-contiguous q/k, chunk sizes 16/32/64, no decay, and
fp16 with a zero key row (rstd = 1000) next to a large value."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops import api
from mindspeed_ops.api.triton.chunk_kda import chunk_kda
from mindspeed_ops.ops.gdn import cumsum, fwd_h, fwd_o, kkt, wy_fast
from mindspeed_ops.ops.gdn import reference as gdn_ref
from mindspeed_ops.ops.gdn.common import device_tables
from mindspeed_ops.ops.gdn.solve_tril import forward as solve_tril_forward
from mindspeed_ops.ops.kda import fwd_o as kda_fwd_o
from mindspeed_ops.ops.kda import intra as kda_intra
from mindspeed_ops.ops.kda import reference as kda_ref
from mindspeed_ops.testing import assert_close, threshold
from tests.conftest import DEVICE

FOLD_TOL = 1e-5  # fp32: the fold differs from the prenormalised run by rounding only


def _l2n(x):
    """q̂ = x / sqrt(Σx² + 1e-6) in float64, rounded to fp32 (the prenormalised comparison input)."""
    xd = x.double()
    return (xd * torch.rsqrt(xd.pow(2).sum(-1, keepdim=True) + 1e-6)).float()


def _rstd(x):
    return torch.rsqrt(x.double().pow(2).sum(-1) + 1e-6).float().contiguous()


def _inputs(B, T, H, HV, K, V, *, kda=False, N=None, h0=True, g_none=False, layout="contig", scale_k=3.0, seed=0,
            dtype=torch.float32):
    """Recipe of SPEC 1.10.0 (k scaled so its norm is far from 1). ``layout``: "contig", or "view" for q a
    transposed view and k a strided slice (both non-contiguous)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)
    if layout == "view":
        q = r(B, H, T, K).transpose(1, 2)
        k = (r(B, T, H, 2 * K) * scale_k)[..., 1::2]
        assert not q.is_contiguous() and not k.is_contiguous()
    else:
        q, k = r(B, T, H, K), r(B, T, H, K) * scale_k
    v = r(B, T, HV, V)
    gshape = (B, T, HV, K) if kda else (B, T, HV)
    g = F.logsigmoid(torch.rand(*gshape, generator=gen)) / 0.5
    g = g * (torch.rand(*gshape, generator=gen) > 0.2)
    beta = torch.sigmoid(r(B, T, HV))
    init = r(N or B, HV, K, V) if h0 else None
    q, k, v = (t.to(DEVICE, dtype) for t in (q, k, v))
    return (q, k, v, None if g_none else g.to(DEVICE), beta.to(DEVICE, dtype),
            None if init is None else init.to(DEVICE))


def _op_pair(op, ins, BT, cu):
    """(fold: raw q, k with in-kernel l2norm) and (q̂, k̂ normalised outside in fp32, no in-kernel l2norm)."""
    q, k, v, g, beta, h0 = ins
    a = op(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
           cu_seqlens=cu, chunk_size=BT)
    b = op(_l2n(q), _l2n(k), v, g, beta, initial_state=h0, output_final_state=True,
           use_qk_l2norm_in_kernel=False, cu_seqlens=cu, chunk_size=BT)
    return a, b


def _check_pair(a, b, cu=None, T=None):
    for name, x, y in zip(("o", "final_state"), a, b):
        assert torch.isfinite(x).all(), name
        assert_close(name, y.double(), x, FOLD_TOL)
        assert (x - y).abs().max().item() < 1e-4 * max(1.0, y.abs().max().item()), name
    if cu is not None and int(cu[-1]) < T:
        assert torch.equal(a[0][:, int(cu[-1]):], torch.zeros_like(a[0][:, int(cu[-1]):]))


CASES = [  # (B, T, H, HV, K, V, BT, cu_seqlens, N, extra)
    pytest.param(1, 70, 2, 4, 60, 24, 32, None, None, {}, id="gva-K60-partial-BT32"),
    pytest.param(1, 90, 2, 4, 100, 20, 64, [0, 17, 83], 2, {"tail_nan": True}, id="gva-varlen-tail-K100-BT64"),
    pytest.param(2, 40, 2, 4, 32, 16, 32, None, None, {"layout": "view"}, id="noncontig-B2-BT32"),
    pytest.param(1, 45, 1, 2, 16, 16, 64, None, None, {"g_none": True, "h0": False}, id="no-decay-no-h0"),
]


def _case_inputs(B, T, H, HV, K, V, N, extra, kda):
    extra = dict(extra)
    tail_nan = extra.pop("tail_nan", False)
    ins = list(_inputs(B, T, H, HV, K, V, kda=kda, N=N, **extra))
    return ins, tail_nan


def _nan_tail(ins, end):
    """Tail tokens (past cu_seqlens[-1]) of q, k hold NaN: their rstd is NaN and must never be read."""
    for i in (0, 1):
        t = ins[i].clone()
        t[:, end:] = float("nan")
        ins[i] = t
    return ins


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("B,T,H,HV,K,V,BT,cu,N,extra", CASES)
def test_fold_equals_prenormalized(B, T, H, HV, K, V, BT, cu, N, extra, kda):
    ins, tail_nan = _case_inputs(B, T, H, HV, K, V, N, extra, kda=kda)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    if tail_nan:
        ins = _nan_tail(ins, cu[-1])
    if not kda and ins[3] is None:
        BT = 16  # GDN also has chunk_size 16: its no-decay case runs it (KDA: 64)
    a, b = _op_pair(chunk_kda if kda else api.chunk_gated_delta_rule, ins, BT, cu_t)
    _check_pair(a, b, cu_t, T)


# ------------------------------------------------------------------------------------------------
# every stage intermediate (launchers called as the operators call them)
# ------------------------------------------------------------------------------------------------

def _gdn_stages(q, k, v, g, beta, h0, BT, cu_host, rq=None, rk=None):
    cu, idx = device_tables(cu_host, BT, q.device)
    G = None if g is None else cumsum.forward(g, BT, False, None, cu_host, cu, torch.float32, idx)
    HV = v.shape[2]
    A = kkt.forward(k, G, None, beta, HV, cu_host, cu, BT, torch.float32, idx, rk=rk)
    Ainv = solve_tril_forward(A, cu_host, cu, k.dtype, idx)
    w, u = wy_fast.forward(k, v, beta, Ainv, G, None, cu_host, cu, idx, rk=rk)
    h, v_new, final = fwd_h.forward(k, w, u, G, None, h0, True, BT, True, cu_host, rk=rk)
    o = fwd_o.forward(q, k, v_new, h, G, K_SCALE, cu_host, cu, BT, idx, rq=rq, rk=rk)
    return dict(A=A, w=w, u=u, h=h, v_new=v_new, final=final, o=o)


def _kda_stages(q, k, v, g, beta, h0, BT, cu_host, rq=None, rk=None):
    cu, idx = device_tables(cu_host, BT, q.device)
    G = cumsum.forward(g, BT, False, None, cu_host, cu, torch.float32, idx)
    w, u, qg, kg, Aqk, Akk = kda_intra.forward(q, k, v, G, beta, K_SCALE, cu_host, cu, BT, idx, output_qg=True,
                                               output_kg=True, rq=rq, rk=rk)
    h, v_new, final = fwd_h.forward(k, w, u, None, G, h0, True, BT, True, cu_host, rk=rk)
    o = kda_fwd_o.forward(q, v_new, h, G, Aqk, K_SCALE, cu_host, cu, BT, idx, rq=rq)
    return dict(w=w, u=u, qg=qg, kg=kg, Aqk=Aqk, Akk=Akk, h=h, v_new=v_new, final=final, o=o)


K_SCALE = 0.25


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("BT,cu", [(32, [0, 13, 50, 71]), (64, None)], ids=["varlen-tail-BT32", "BT64"])
def test_stage_intermediates(kda, BT, cu, poisoned):
    """GVA H=2, HV=4, K=60, partial chunks; tail tokens past cu_seqlens[-1] (NaN in q, k); outputs start
    NaN-filled (``poisoned``), so an unwritten element shows."""
    T = 75
    ins = list(_inputs(1, T, 2, 4, 60, 20, kda=kda, N=None if cu is None else len(cu) - 1, seed=3))
    if cu is not None:
        ins = _nan_tail(ins, cu[-1])
    q, k, v, g, beta, h0 = ins
    run = _kda_stages if kda else _gdn_stages
    fold = run(q, k, v, g, beta, h0, BT, cu, rq=_rstd(q), rk=_rstd(k))
    pre = run(_l2n(q), _l2n(k), v, g, beta, h0, BT, cu)
    for name in pre:
        x, y = fold[name], pre[name]
        assert x.shape == y.shape, name
        if cu is not None and name not in ("h", "final"):  # token-major: tail rows are 0 (not NaN)
            assert torch.equal(x[:, cu[-1]:], torch.zeros_like(x[:, cu[-1]:])), name
        assert torch.isfinite(x).all(), name
        assert_close(name, y.double(), x, FOLD_TOL)


# ------------------------------------------------------------------------------------------------
# gradients through the l2norm path (backward recomputes with q̂, k̂) vs the float64 oracle
# ------------------------------------------------------------------------------------------------

def _grads_vs_oracle(op, oracle, ins, BT, cu):
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in ins]
    o, fs = op(*leaves[:5], initial_state=leaves[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
               cu_seqlens=cu, chunk_size=BT)
    refs = [None if t is None else t.detach().double().contiguous().requires_grad_(True) for t in ins]
    ro, rf = oracle(*refs[:5], initial_state=refs[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
                    cu_seqlens=cu)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen).to(DEVICE)
    dht = torch.randn(fs.shape, generator=gen).to(DEVICE)
    ((o.float() * do).sum() + (fs * dht).sum()).backward()
    ((ro * do.double()).sum() + (rf * dht.double()).sum()).backward()
    tol = {c: threshold(c, torch.float32) for c in ("LA-o", "LA-d", "LA-g")}
    assert_close("o", ro, o, tol["LA-o"])
    assert_close("final_state", rf, fs, tol["LA-o"])
    for name, r_, t, cls in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), refs, leaves,
                                ("LA-d", "LA-d", "LA-d", "LA-g", "LA-g", "LA-d")):
        assert torch.isfinite(t.grad).all(), name
        assert_close(name, r_.grad, t.grad, tol[cls])


def test_gdn_gradients_gva_noncontig_k60():
    ins = _inputs(1, 50, 2, 4, 60, 12, layout="view", seed=5)
    _grads_vs_oracle(api.chunk_gated_delta_rule, gdn_ref.recurrent_gated_delta_rule_ref, ins, 32, None)


def test_kda_gradients_gva_varlen_k100():
    cu = torch.tensor([0, 21, 44], dtype=torch.int32, device=DEVICE)
    ins = _inputs(1, 44, 2, 4, 100, 12, kda=True, N=2, seed=6)
    _grads_vs_oracle(chunk_kda, kda_ref.recurrent_kda_ref, ins, 32, cu)


# ------------------------------------------------------------------------------------------------
# fp16: a zero key (rstd = 1/sqrt(eps) = 1000) next to a value above 65.5
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_fp16_zero_key_row_finite(kda):
    """rstd·v_new = 1000·100 is past fp16's 65504: folding the rstd into v_new (then rounding it to k's
    dtype) made inf, and inf·0 (the zero key) NaN in the state. Must match the oracle like main did."""
    B, T, H, K, V = 1, 40, 1, 32, 16
    q, k, v, g, beta, h0 = _inputs(B, T, H, H, K, V, kda=kda, g_none=not kda, h0=False, seed=2, scale_k=1.0)
    k, v = k.clone(), v.clone()
    k[:, 5] = 0.0
    v[:, 5] = 100.0
    beta = torch.ones_like(beta)
    ins = [t.half() for t in (q, k, v)] + [g, beta.half()]
    op = chunk_kda if kda else api.chunk_gated_delta_rule
    o, fs = op(*ins, output_final_state=True, use_qk_l2norm_in_kernel=True, chunk_size=32)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    oracle = kda_ref.recurrent_kda_ref if kda else gdn_ref.recurrent_gated_delta_rule_ref
    ro, rf = oracle(*[None if t is None else t.double() for t in ins], output_final_state=True,
                    use_qk_l2norm_in_kernel=True)
    assert_close("o", ro, o, threshold("LA-o", torch.float16))
    assert_close("final_state", rf, fs, threshold("LA-o", torch.float16))


def test_autotune_keys_hold_the_fold_constexprs():
    """The autotuned launchers key on the new constexprs (a config tuned without the fold is not reused)."""
    assert "HAS_RK" in fwd_h._kernel().keys
    assert "HAS_R" in fwd_o._kernel().keys
    assert "HAS_RQ" in kda_fwd_o._kernel().keys
