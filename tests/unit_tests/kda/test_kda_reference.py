"""KDA references (SPEC 1.11, 0.8): the chunked reference agrees with the token-by-token oracle to 1e-10
in float64, outputs and gradients; strong decay / hard resets stay finite; stage references compose
to the full operator (forward and the backward pipeline)."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops.ops.gdn.reference import chunk_local_cumsum_ref
from mindspeed_ops.ops.gdn.reference_bwd import _fold_heads, chunk_gated_delta_rule_bwd_dhu_ref
from mindspeed_ops.ops.gdn.reference_fwd import chunk_gated_delta_rule_fwd_h_ref
from mindspeed_ops.ops.kda import reference as R
from mindspeed_ops.testing import rel_rms

F64 = torch.float64


def _inputs(B, T, H, HV, K, V, *, s=0.1, N=None, seed=0, hard=False):
    gen = torch.Generator().manual_seed(seed)
    r = (lambda *shape: torch.randn(*shape, generator=gen, dtype=F64))
    g = F.logsigmoid(torch.rand(B, T, HV, K, generator=gen, dtype=F64)) / s
    g = g * (torch.rand(B, T, HV, K, generator=gen, dtype=F64) > 0.2)
    if hard:
        g = torch.where(torch.rand(B, T, HV, 1, generator=gen, dtype=F64) < 0.1, torch.full_like(g, -1000.0), g)
    beta = torch.sigmoid(r(B, T, HV))
    return [t.requires_grad_() for t in (r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V), g, beta, r(N or B, HV, K, V))]


def _grads(fn, ins, **kw):
    o, fs = fn(*ins[:5], initial_state=ins[5], output_final_state=True, **kw)
    gen = torch.Generator().manual_seed(9)
    do, dht = torch.randn(o.shape, generator=gen, dtype=F64), torch.randn(fs.shape, generator=gen, dtype=F64)
    return (o, fs) + torch.autograd.grad((o * do).sum() + (fs * dht).sum(), ins)


@pytest.mark.parametrize("B,T,H,HV,K,V,BT,cu", [
    (2, 70, 1, 2, 8, 6, 32, None),
    (1, 45, 2, 2, 16, 8, 64, None),
    (1, 60, 1, 2, 8, 8, 32, [0, 10, 11, 45]),
])
def test_chunked_equals_recurrent_fp64(B, T, H, HV, K, V, BT, cu):
    cu_t = None if cu is None else torch.tensor(cu)
    ins = _inputs(B, T, H, HV, K, V, N=None if cu is None else len(cu) - 1)
    a = _grads(R.recurrent_kda_ref, ins, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_t)
    b = _grads(R.chunk_kda_ref, ins, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_t, chunk_size=BT)
    for name, x, y in zip(("o", "final", "dq", "dk", "dv", "dg", "dbeta", "dh0"), a, b):
        assert rel_rms(y, x) < 1e-10, name
    if cu is not None:
        assert torch.equal(b[0][:, cu[-1]:], torch.zeros_like(b[0][:, cu[-1]:]))  # tail tokens


def test_hard_reset_and_strong_decay_finite():
    ins = _inputs(1, 70, 1, 1, 8, 8, s=0.01, hard=True)
    assert ins[3].min() == -1000.0
    a = _grads(R.recurrent_kda_ref, ins)
    b = _grads(R.chunk_kda_ref, ins, chunk_size=64)
    for x, y in zip(a, b):
        assert torch.isfinite(y).all()
        assert rel_rms(y, x) < 1e-10


def test_g_none_is_no_decay_and_float32_compute():
    ins = [t.detach() for t in _inputs(1, 20, 1, 1, 8, 8)]
    a = R.chunk_kda_ref(ins[0], ins[1], ins[2], None, ins[4], chunk_size=32, output_final_state=True)
    b = R.chunk_kda_ref(ins[0], ins[1], ins[2], torch.zeros_like(ins[3]), ins[4], chunk_size=32,
                        output_final_state=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    o, fs = R.chunk_kda_ref(*(t.half() for t in ins[:5]), chunk_size=32, output_final_state=True)
    assert o.dtype == torch.float16 and fs.dtype == torch.float32


def test_stage_references_compose_to_the_operator():
    """Forward: intra -> state scan (gk) -> output; backward: dAv -> dhu (gk) -> wy_dqkg -> intra ->
    reverse cumsum, against autograd of the chunked reference (varlen, GVA, h0)."""
    B, T, H, HV, K, V, BT, scale = 1, 70, 1, 2, 8, 6, 32, 0.3
    cu = torch.tensor([0, 33, 34, 70])
    q, k, v, g, beta, h0 = (t.detach() for t in _inputs(B, T, H, HV, K, V, N=3))
    k = F.normalize(k, dim=-1)
    ins = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    o, fs, *grads = _grads(R.chunk_kda_ref, ins, scale=scale, cu_seqlens=cu, chunk_size=BT)
    G = chunk_local_cumsum_ref(g, BT, cu_seqlens=cu)
    w, u, _, _, Aqk, Akk = R.chunk_kda_fwd_intra_ref(q, k, v, G, beta, scale, cu, BT)
    h, vn, fs2 = chunk_gated_delta_rule_fwd_h_ref(k, w, u, gk=G, initial_state=h0, output_final_state=True,
                                                  chunk_size=BT, cu_seqlens=cu)
    o2 = R.chunk_kda_fwd_o_ref(q, vn, h, G, Aqk, scale, cu, BT)
    assert rel_rms(o2, o) < 1e-12 and rel_rms(fs2, fs) < 1e-12
    gen = torch.Generator().manual_seed(9)
    do, dht = torch.randn(o.shape, generator=gen, dtype=F64), torch.randn(fs.shape, generator=gen, dtype=F64)
    dAq, dvl = R.chunk_kda_bwd_dav_ref(vn, do, Aqk, scale, cu)
    dh, dh0, dv2 = chunk_gated_delta_rule_bwd_dhu_ref(q, k, w, do, dvl, gk=G, h0=h0, dht=dht, scale=scale,
                                                      cu_seqlens=cu, chunk_size=BT)
    dq, dk, dv, db, dG, dAm = R.chunk_kda_bwd_wy_dqkg_fused_ref(q, k, v, vn, G, beta, Akk, h, do, dh, dv2, scale, cu,
                                                                BT, fold_heads=False)
    dq2, dk2, db2, dG2 = R.chunk_kda_bwd_intra_ref(q, k, G, beta, dAq, dAm, cu)
    dg = chunk_local_cumsum_ref(dG + dG2, BT, reverse=True, cu_seqlens=cu)
    ours = (_fold_heads(dq + dq2, H), _fold_heads(dk + dk2, H), dv, dg, db + db2, dh0)
    for name, ref, out in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads, ours):
        assert rel_rms(out, ref) < 1e-12, name
