"""chunk_gated_delta_rule_bwd_dhu (SPEC 1.10.6): the float64 reference against autograd of a chunked
forward (dh = gradient w.r.t. the state leaving each chunk, dh0, dv2), then the kernel against the
reference: h0/dht on and off, GVA, varlen with poisoned tails and empty sequences, many short
sequences, per-channel gates, head dims, chunk sizes, strong decay, layouts, errors.

Also home of :func:`build`, the backward-pipeline inputs shared by test_bwd_dv / test_bwd_dqkwg."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops.api.triton.chunk_gated_delta_rule_bwd_dhu import chunk_gated_delta_rule_bwd_dhu
from mindspeed_ops.ops.gdn import reference as ref
from mindspeed_ops.ops.gdn import reference_bwd as rb
from mindspeed_ops.ops.gdn import reference_fwd as rf
from mindspeed_ops.ops.gdn import reference_wy as rw
from mindspeed_ops.testing import assert_close, assert_unchanged, err_atol, non_contiguous, snapshot, threshold, to_ref
from tests.conftest import DEVICE, DTYPES

SEG13 = [0, 31, 64, 65, 130, 200, 333, 390, 512, 600, 777, 800, 1000, 1024]


# ------------------------------------------------------------------------------------------------
# shared inputs
# ------------------------------------------------------------------------------------------------

def build(B, T, H, HV, K, V, BT=64, cu=None, gate="g", s=1.0, h0=True, seed=0, device=DEVICE, fwd=True):
    """The SPEC 1.10.0 recipe carried through the forward and the first backward stages in float64 on
    ``device`` with the stage references: ``q, k`` L2-normalised ``[B,T,H,K]``, ``v``, ``β = σ(randn)``,
    ``g = logsigmoid(rand)/s`` with ~20% exact zeros, its chunk cumsum ``G`` (``gate="g"``) or per-channel
    ``gk`` (``gate="gk"``) or none, ``A``/``Ainv``/``w``/``u``, ``h``/``v_new`` (``fwd``), random ``do``,
    ``dht``, ``h0`` (or None), ``dv`` = ``chunk_bwd_dv_local`` reference (random for ``gk``) and, from the
    dhu reference with h0/dht, ``dh``, ``dh0``, ``dv2``."""
    gen = torch.Generator().manual_seed(seed)
    cu_t = None if cu is None else torch.tensor(cu, device=device)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)

    def gates(shape):
        x = F.logsigmoid(torch.rand(shape, generator=gen, dtype=torch.float64)) / s
        x = x * (torch.rand(shape, generator=gen, dtype=torch.float64) > 0.2)
        return ref.chunk_local_cumsum_ref(x.to(device), BT, cu_seqlens=cu_t)

    N = B if cu is None else len(cu) - 1
    d = {"q": F.normalize(rnd(B, T, H, K), dim=-1), "k": F.normalize(rnd(B, T, H, K), dim=-1),
         "v": rnd(B, T, HV, V), "beta": torch.sigmoid(rnd(B, T, HV)), "do": rnd(B, T, HV, V),
         "dht": rnd(N, HV, K, V), "h0": rnd(N, HV, K, V) if h0 else None, "G": None, "gk": None}
    if gate == "g":
        d["G"] = gates((B, T, HV))
    elif gate == "gk":
        d["gk"] = gates((B, T, HV, K))
    A = rw.chunk_scaled_dot_kkt_fwd_ref(d["k"], d["G"], d["gk"], d["beta"], cu_seqlens=cu_t, chunk_size=BT)
    d["Ainv"] = ref.solve_tril_ref(A, cu_t)
    d["w"], d["u"] = rw.recompute_w_u_fwd_ref(d["k"], d["v"], d["beta"], d["Ainv"], d["G"], d["gk"], cu_t)
    if fwd:
        d["h"], d["v_new"], _ = rf.chunk_gated_delta_rule_fwd_h_ref(d["k"], d["w"], d["u"], d["G"], d["gk"], d["h0"],
                                                                    False, BT, True, cu_t)
    d["dv"] = rnd(B, T, HV, V) if gate == "gk" else rb.chunk_bwd_dv_local_ref(d["q"], d["k"], d["do"], d["G"], None,
                                                                            cu_t, BT)
    d["dh"], d["dh0"], d["dv2"] = rb.chunk_gated_delta_rule_bwd_dhu_ref(
        d["q"], d["k"], d["w"], d["do"], d["dv"], d["G"], d["gk"], d["h0"], d["dht"], None, cu_t, BT)
    return d


def cast(x, dtype, cu=None):
    """``x`` in ``dtype`` on the test device; with ``cu``, the tail tokens (positions ``>= cu[-1]``,
    token dim 1) are poisoned with NaN (kernels must never read them)."""
    if x is None:
        return None
    y = x.to(dtype).to(DEVICE)
    if cu is not None and cu[-1] < y.shape[1]:
        y = y.clone()
        y[:, cu[-1]:] = float("nan")
    return y


def close(name, want, out, cls, key):
    """SPEC 0.9 check with the threshold class ``cls`` keyed by the input dtype ``key``."""
    assert out.shape == want.shape, (name, tuple(out.shape), tuple(want.shape))
    assert_close(name, want, out, threshold(cls, key), err_atol(key))


# ------------------------------------------------------------------------------------------------
# the reference against autograd
# ------------------------------------------------------------------------------------------------

def _loss_with_taps(q, k, w, u, G, gk, h0, dht, do, dvx, taps, BT, scale, cu):
    """``Σ o_x·do + Σ v_new·dvx + Σ final·dht`` of a chunked forward written from SPEC 1.10.0 step 5,
    with ``o_x_i = scale·S_cᵀ (e^{G_i} ⊙ q_i)`` (the state part of the output) and ``taps[c]`` added to
    the state leaving chunk c (its gradient is ``dh[c]``)."""
    B, T, _, K = q.shape
    HV, V = u.shape[2], u.shape[3]
    qq, kk = ref._expand_heads(q, HV), ref._expand_heads(k, HV)
    loss = q.new_zeros(())
    off = 0
    for n, (b, bos, eos) in enumerate(ref._sequences(B, T, None if cu is None else torch.tensor(cu))):
        S = h0[n] if h0 is not None else q.new_zeros(HV, K, V)
        for c, s in enumerate(range(bos, eos, BT)):
            e = min(s + BT, eos)
            qc, kc, wc, uc = qq[b, s:e], kk[b, s:e], w[b, s:e], u[b, s:e]
            if G is not None:
                Gc = G[b, s:e]
                qd, kd, dec = qc * torch.exp(Gc)[..., None], kc * torch.exp(Gc[-1] - Gc)[..., None], \
                    torch.exp(Gc[-1])[:, None, None]
            elif gk is not None:
                Gc = gk[b, s:e]
                qd, kd, dec = qc * torch.exp(Gc), kc * torch.exp(Gc[-1] - Gc), torch.exp(Gc[-1])[..., None]
            else:
                qd, kd, dec = qc, kc, 1.0
            vn = uc - torch.einsum("lhk,hkv->lhv", wc, S)
            ox = scale * torch.einsum("lhk,hkv->lhv", qd, S)
            loss = loss + (ox * do[b, s:e]).sum() + (vn * dvx[b, s:e]).sum()
            S = dec * S + torch.einsum("lhk,lhv->hkv", kd, vn) + taps[b, off + c]
        loss = loss + (S * dht[n]).sum()
        off += -(-(eos - bos) // BT) if cu is not None else 0
    return loss


@pytest.mark.parametrize("gate", ["g", "gk", None])
@pytest.mark.parametrize("B,T,H,HV,K,V,BT,cu", [(2, 50, 1, 2, 8, 6, 16, None),
                                                (1, 90, 2, 4, 6, 5, 32, [0, 10, 10, 75, 90]),
                                                (1, 70, 1, 1, 4, 3, 16, [0, 33, 64])])
def test_reference_matches_autograd(B, T, H, HV, K, V, BT, cu, gate):
    """dh[c] (w.r.t. the state leaving chunk c), dh0 and dv2 (= the gradient w.r.t. u, since
    v_new = u − w S) of the reference equal autograd of a chunked forward in float64; so does the
    reference dw = −S dv2 of chunk_bwd_dqkwg (= the gradient w.r.t. w)."""
    d = build(B, T, H, HV, K, V, BT, cu, gate=gate, s=0.3, seed=1, device="cpu")
    cu_t = None if cu is None else torch.tensor(cu)
    N = B if cu is None else len(cu) - 1
    NT = d["h"].shape[1]
    scale = 0.7
    dvx = torch.randn(B, T, HV, V, dtype=torch.float64)
    w, u, h0 = (d[n].clone().requires_grad_(True) for n in ("w", "u", "h0"))
    taps = torch.zeros(B, NT, HV, K, V, dtype=torch.float64, requires_grad=True)
    loss = _loss_with_taps(d["q"], d["k"], w, u, d["G"], d["gk"], h0, d["dht"], d["do"], dvx, taps, BT, scale, cu)
    g_w, g_u, g_h0, g_taps = torch.autograd.grad(loss, (w, u, h0, taps))
    dh, dh0, dv2 = rb.chunk_gated_delta_rule_bwd_dhu_ref(d["q"], d["k"], d["w"], d["do"], dvx, d["G"], d["gk"],
                                                         d["h0"], d["dht"], scale, cu_t, BT)
    assert dh0.shape == (N, HV, K, V) and dh.shape == (B, NT, HV, K, V)
    for name, want, got in (("dh", g_taps, dh), ("dh0", g_h0, dh0), ("dv2", g_u, dv2)):
        assert_close(name, want, got, 1e-12)
    _, _, dw, _ = rb.chunk_bwd_dqkwg_ref(d["q"], d["k"], d["v_new"], d["do"], d["h"], dh, d["G"], dv2, d["w"], cu_t,
                                         BT, scale)
    assert_close("dw", g_w, dw, 1e-12)


# ------------------------------------------------------------------------------------------------
# kernel against the reference
# ------------------------------------------------------------------------------------------------

def check(d, dtype, BT, cu=None, h0=True, dht=True, gate="g", chunk_indices=None):
    """Run the kernel on ``d`` (from :func:`build`) rounded to ``dtype`` and compare with the float64
    reference of the same rounded inputs (LA-d keyed by ``dtype``); returns the outputs."""
    q, k, w, do, dv = (cast(d[n], dtype, cu) for n in ("q", "k", "w", "do", "dv"))
    G = cast(d["G"], torch.float32, cu) if gate == "g" else None
    gk = cast(d["gk"], torch.float32, cu) if gate == "gk" else None
    s0 = cast(d["h0"], torch.float32) if h0 else None
    st = cast(d["dht"], torch.float32) if dht else None
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    ins = (q, k, w, do, dv, G, gk, s0, st)
    before = snapshot(*ins)
    dh, dh0, dv2 = chunk_gated_delta_rule_bwd_dhu(q, k, w, do, dv, g=G, gk=gk, h0=s0, dht=st, cu_seqlens=cu_t,
                                                  chunk_size=BT, chunk_indices=chunk_indices)
    assert_unchanged(before, *ins, names=["q", "k", "w", "do", "dv", "g", "gk", "h0", "dht"])
    want = rb.chunk_gated_delta_rule_bwd_dhu_ref(*to_ref(*ins), cu_seqlens=cu_t, chunk_size=BT)
    assert dh.dtype == dtype and dv2.dtype == dtype
    close("dh", want[0], dh, "LA-d", dtype)
    close("dv2", want[2], dv2, "LA-d", dtype)
    if h0:
        assert dh0.dtype == torch.float32
        close("dh0", want[1], dh0, "LA-d", dtype)
    else:
        assert dh0 is None
    if cu is not None and cu[-1] < q.shape[1]:
        assert (dv2[:, cu[-1]:] == 0).all(), "tail tokens of dv2 must be 0"
    return dh, dh0, dv2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h0,dht", [(True, True), (False, False), (True, False), (False, True)])
def test_matches_reference(dtype, h0, dht, poisoned):
    d = build(2, 100, 2, 2, 32, 32, BT=32, h0=h0, seed=2)
    check(d, dtype, 32, h0=h0, dht=dht)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gva_and_head_dims(dtype, poisoned):
    check(build(1, 70, 1, 4, 16, 24, BT=16, seed=3), dtype, 16)            # GVA G=4, BT = 16
    check(build(1, 64, 1, 1, 100, 100, BT=64, seed=4), dtype, 64)          # D = 100: K in 2 blocks, V masked


@pytest.mark.parametrize("BT,cu", [(64, [0, 15, 100, 130]), (16, SEG13[:7]), (32, [0, 0, 40, 40, 97])])
def test_varlen_poisoned_tail(BT, cu, poisoned):
    d = build(1, cu[-1] + 7, 1, 2, 16, 16, BT=BT, cu=cu, seed=5)
    check(d, torch.float32, BT, cu)
    check(d, torch.float16, BT, cu, h0=False)


def test_many_short_sequences(poisoned):
    """Many sequences of length 1-3 (CPU version of the 2100-sequence case): one program each."""
    lens = torch.randint(1, 4, (40,), generator=torch.Generator().manual_seed(6)).tolist()
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    check(build(1, cu[-1], 1, 2, 16, 16, BT=64, cu=cu, seed=6), torch.float32, 64, cu)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_channel_gates(dtype, poisoned):
    check(build(1, 80, 1, 2, 32, 16, BT=32, gate="gk", s=0.1, seed=7), dtype, 32, gate="gk")
    cu = [0, 20, 70]
    check(build(1, 75, 1, 1, 16, 16, BT=16, cu=cu, gate="gk", seed=8), dtype, 16, cu, gate="gk")


def test_no_gate_equals_zero_gate(poisoned):
    d = build(1, 50, 1, 1, 16, 16, BT=16, gate=None, seed=9)
    a = check(d, torch.float32, 16, gate=None)
    G = torch.zeros(1, 50, 1, device=DEVICE)
    q, k, w, do, dv = (cast(d[n], torch.float32) for n in ("q", "k", "w", "do", "dv"))
    b = chunk_gated_delta_rule_bwd_dhu(q, k, w, do, dv, g=G, h0=cast(d["h0"], torch.float32),
                                       dht=cast(d["dht"], torch.float32), chunk_size=16)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=1e-6, atol=1e-6)


def test_gate_rows_ahead_at_sequence_edges(poisoned):
    """The per-channel decay rows are loaded one chunk step ahead of the reverse scan (``_gate_row``): empty
    sequences, one whole chunk, partial last chunks, sequences ending on a chunk boundary and tail tokens, two key
    blocks (fp32 K = 80)."""
    cu = [0, 0, 16, 16, 41, 64, 64, 70]
    check(build(1, 72, 1, 2, 80, 24, BT=16, cu=cu, gate="gk", s=0.1, seed=41), torch.float32, 16, cu, gate="gk")


def test_one_block_state_with_gates_and_varlen(poisoned):
    """fp16 K = 100 (the interpreter keeps fp16) with varlen: scalar gates keep the state as one 128-row block,
    per-channel gates (and KDA's pre-gated q/k form) as two 64-row blocks (``scan_block_k``)."""
    cu = [0, 37, 90]
    check(build(1, 96, 1, 2, 100, 60, BT=32, cu=cu, gate="gk", s=0.1, seed=11), torch.float16, 32, cu, gate="gk")
    check(build(1, 96, 1, 2, 100, 60, BT=32, cu=cu, seed=12), torch.float16, 32, cu)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strong_decay_partial_chunk(dtype, poisoned):
    """``g = logsigmoid(rand)/0.01`` (G down to ~ −4000 in a chunk) with a partial last chunk: finite."""
    d = build(2, 75, 1, 1, 16, 16, BT=64, s=0.01, seed=10)
    for t in check(d, dtype, 64):
        assert torch.isfinite(t).all()


def test_layouts_determinism_chunk_indices():
    from mindspeed_ops.api.triton.utils import prepare_chunk_indices

    d = build(1, 60, 2, 2, 16, 16, BT=16, seed=11)
    q, k, w, do, dv = (cast(d[n], torch.float32) for n in ("q", "k", "w", "do", "dv"))
    G, s0, st = cast(d["G"], torch.float32), cast(d["h0"], torch.float32), cast(d["dht"], torch.float32)
    do = do[:, :, :, :1].expand_as(do)                  # stride-0 upstream gradient (as from .sum())
    base = chunk_gated_delta_rule_bwd_dhu(q, k, w, do.contiguous(), dv, g=G, h0=s0, dht=st, chunk_size=16)
    again = chunk_gated_delta_rule_bwd_dhu(q, k, w, do.contiguous(), dv, g=G, h0=s0, dht=st, chunk_size=16)
    assert all(torch.equal(x, y) for x, y in zip(base, again)), "not deterministic"
    out = chunk_gated_delta_rule_bwd_dhu(q.transpose(1, 2).contiguous().transpose(1, 2), non_contiguous(k),
                                         non_contiguous(w, "transpose"), do, non_contiguous(dv, "transpose"),
                                         g=non_contiguous(G), h0=non_contiguous(s0),
                                         dht=non_contiguous(st, "transpose"), chunk_size=16)
    assert all(torch.equal(x, y) for x, y in zip(base, out)), "layout changed the result"
    cu = torch.tensor([0, 20, 60], device=DEVICE)
    h0 = s0[:1].expand(2, -1, -1, -1)
    a = chunk_gated_delta_rule_bwd_dhu(q, k, w, do, dv, g=G, h0=h0, cu_seqlens=cu, chunk_size=16)
    b = chunk_gated_delta_rule_bwd_dhu(q, k, w, do, dv, g=G, h0=h0, cu_seqlens=cu, chunk_size=16,
                                       chunk_indices=prepare_chunk_indices(cu, 16))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("K,V,dtype", [(128, 128, torch.bfloat16), (64, 64, torch.float32), (256, 256, torch.float32),
                                       (100, 60, torch.float16), (128, 16, torch.float32), (256, 16, torch.float16)])
def test_autotune_space_is_all_pipelined_or_all_not(K, V, dtype):
    """Pipelined and unpipelined builds round dv/dh differently (H200, fp32 K = V = 64): a shape's autotune space
    keeps one of the two (SPEC 0.6: a timing-based choice must not change the bits)."""
    from mindspeed_ops.ops.gdn import bwd_dhu
    from mindspeed_ops.ops.gdn.common import scan_block_k

    BK, NK = scan_block_k(K, dtype)
    kept = bwd_dhu._prune(bwd_dhu._configs(), _tile_args(dtype, V), BK=BK, NK=NK, BT=64, USE_GK=False)
    assert kept and len({c.num_stages > 1 for c in kept}) == 1


def _tile_args(dtype, V):
    return {"V": V, **{n: torch.empty(0, dtype=dtype) for n in ("q_ptr", "k_ptr", "w_ptr", "do_ptr", "dv_ptr")}}


@pytest.mark.parametrize("K,dtype,gk,deep", [(128, torch.bfloat16, False, True), (64, torch.float32, False, False),
                                             (128, torch.float32, False, False), (256, torch.float16, False, False),
                                             (128, torch.bfloat16, True, False)])
def test_three_stages_only_where_they_fit(K, dtype, gk, deep):
    """3-stage configs (fastest on the H200 at the issues' points) are kept for 16-bit K <= 128 without a per-channel
    gate tile, where their estimated buffers fit; fp32, K = 256 and gk tiles run unpipelined or at 2 stages."""
    from mindspeed_ops.ops.gdn import bwd_dhu
    from mindspeed_ops.ops.gdn.common import scan_block_k

    BK, NK = scan_block_k(K, dtype, one_block=not gk)
    kept = bwd_dhu._prune(bwd_dhu._configs(), _tile_args(dtype, 128), BK=BK, NK=NK, BT=64, USE_GK=gk)
    assert kept
    assert any(c.num_stages == 3 for c in kept) == deep, [str(c) for c in kept]


@pytest.mark.parametrize("K,dtype,one_block,expected", [
    (128, torch.bfloat16, True, (128, 1)), (128, torch.bfloat16, False, (64, 2)), (100, torch.float16, False, (64, 2)),
    (128, torch.float32, True, (64, 2)), (256, torch.bfloat16, True, (64, 4)), (48, torch.bfloat16, False, (64, 1))])
def test_state_blocks(K, dtype, one_block, expected):
    """The scans' state blocks: one 128-row block for 16-bit 64 < K <= 128 (scalar gates), 64-row blocks for the
    reverse scan with per-channel gates (KDA; faster on the H200), fp32 and K > 128."""
    from mindspeed_ops.ops.gdn.common import scan_block_k

    assert scan_block_k(K, dtype, one_block) == expected


def test_per_channel_reverse_scan_uses_64_row_blocks(monkeypatch):
    """chunk_gated_delta_rule_bwd_dhu asks for 64-row blocks with ``gk`` only (scalar gates keep one block)."""
    from mindspeed_ops.ops.gdn import bwd_dhu

    asked = []
    real = bwd_dhu.scan_block_k
    monkeypatch.setattr(bwd_dhu, "scan_block_k", lambda *a, **kw: asked.append(kw.get("one_block")) or real(*a, **kw))
    for gate in ("g", "gk"):
        d = build(1, 40, 1, 1, 32, 16, BT=16, gate=gate, seed=13)
        check(d, torch.float32, 16, gate=gate)
    assert asked == [True, False]


def test_empty():
    q = torch.randn(1, 0, 2, 16, device=DEVICE)
    v = torch.randn(1, 0, 2, 8, device=DEVICE)
    dht = torch.randn(1, 2, 16, 8, device=DEVICE)
    dh, dh0, dv2 = chunk_gated_delta_rule_bwd_dhu(q, q, q, v, v, h0=dht, dht=dht)
    assert dh.shape == (1, 0, 2, 16, 8) and dv2.shape == (1, 0, 2, 8)
    assert torch.equal(dh0, dht), "with no tokens dh0 = dht"
    # zero-length sequences only: dh0 passes dht through, dv2 is all tail (0)
    q, v = torch.randn(1, 5, 2, 16, device=DEVICE), torch.randn(1, 5, 2, 8, device=DEVICE)
    cu = torch.tensor([0, 0, 0], device=DEVICE)
    dh, dh0, dv2 = chunk_gated_delta_rule_bwd_dhu(q, q, q, v, v, h0=dht.expand(2, -1, -1, -1),
                                                  dht=dht.expand(2, -1, -1, -1), cu_seqlens=cu)
    assert dh.shape[1] == 0 and torch.equal(dh0, dht.expand(2, -1, -1, -1)) and (dv2 == 0).all()


def test_bad_input():
    q = torch.randn(1, 32, 2, 16, device=DEVICE)
    w = torch.randn(1, 32, 4, 16, device=DEVICE)
    v = torch.randn(1, 32, 4, 8, device=DEVICE)
    G = torch.randn(1, 32, 4, device=DEVICE)
    f = chunk_gated_delta_rule_bwd_dhu
    with pytest.raises(ValueError, match="chunk_gated_delta_rule_bwd_dhu: q must be 4-D"):
        f(q[0], q, w, v, v)
    with pytest.raises(ValueError, match="k must have shape"):
        f(q, q[..., :8], w, v, v)
    with pytest.raises(ValueError, match="multiple of the key heads"):
        f(q, q, w[:, :, :3], v[:, :, :3], v[:, :, :3])
    with pytest.raises(ValueError, match="w must have shape \\[B, T, HV, K\\] = \\[1, 32, 4, 16\\]"):
        f(q, q, w[..., :8], v, v)
    with pytest.raises(ValueError, match="dv must have shape"):
        f(q, q, w, v, v[..., :4])
    with pytest.raises(ValueError, match="g must have shape"):
        f(q, q, w, v, v, g=G[..., :2])
    with pytest.raises(ValueError, match="not both"):
        f(q, q, w, v, v, g=G, gk=w)
    with pytest.raises(ValueError, match="h0 must have shape \\[N, HV, K, V\\]"):
        f(q, q, w, v, v, h0=torch.zeros(2, 4, 16, 8, device=DEVICE))
    with pytest.raises(ValueError, match="dht must have shape"):
        f(q, q, w, v, v, dht=torch.zeros(1, 4, 8, 16, device=DEVICE))
    with pytest.raises(ValueError, match="K must be <= 256"):
        qb = torch.zeros(1, 4, 1, 257, device=DEVICE)
        f(qb, qb, qb, v[:, :4, :1], v[:, :4, :1])
    with pytest.raises(ValueError, match="chunk_size must be 16, 32 or 64"):
        f(q, q, w, v, v, chunk_size=128)
    with pytest.raises(TypeError, match="float64"):
        f(q.double(), q, w, v, v)
    with pytest.raises(TypeError, match="w must have dtype"):
        f(q, q, w.int(), v, v)
    with pytest.raises(ValueError, match="batch size must be 1"):
        f(q.expand(2, -1, -1, -1), q.expand(2, -1, -1, -1), w.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1),
          v.expand(2, -1, -1, -1), cu_seqlens=torch.tensor([0, 32], device=DEVICE))
    with pytest.raises(ValueError, match="h0 must have shape"):  # varlen: one h0 row per sequence
        f(q, q, w, v, v, h0=torch.zeros(1, 4, 16, 8, device=DEVICE), cu_seqlens=torch.tensor([0, 5, 32], device=DEVICE))
    with pytest.raises(ValueError, match="chunk_indices must have shape"):
        f(q, q, w, v, v, cu_seqlens=torch.tensor([0, 5, 32], device=DEVICE),
          chunk_indices=torch.zeros(3, 2, dtype=torch.int32, device=DEVICE))


# ------------------------------------------------------------------------------------------------
# real sizes (GPU)
# ------------------------------------------------------------------------------------------------

@pytest.mark.bigmem
@pytest.mark.gpu
@pytest.mark.parametrize("B,T,HV", [(1, 1024, 32), (2, 1024, 32), (1, 32768, 32)])
def test_gpu_real_sizes(B, T, HV):
    d = build(B, T, HV, HV, 128, 128, seed=20, fwd=False)
    for dtype in DTYPES:
        check(d, dtype, 64)
    check(d, torch.bfloat16, 64, h0=False, dht=False)


@pytest.mark.gpu
def test_gpu_varlen_and_gva():
    rng = torch.Generator().manual_seed(21)
    cuts = sorted(torch.randperm(8191, generator=rng)[:299].add(1).tolist())
    for cu in (SEG13, [0] + cuts + [8192]):            # 13 and ~300 segments
        d = build(1, cu[-1], 16, 32, 128, 128, cu=cu, seed=22, fwd=False)
        check(d, torch.bfloat16, 64, cu)
        check(d, torch.float32, 64, cu, h0=False)
    check(build(1, 2048, 4, 16, 128, 128, gate="gk", seed=23, fwd=False), torch.bfloat16, 64, gate="gk")


@pytest.mark.bigmem
@pytest.mark.gpu
def test_gpu_2100_short_sequences():
    """2100 sequences of length 1-3 with HV = 32: 67,200 (sequence, head) programs (> 65,535)."""
    lens = torch.randint(1, 4, (2100,), generator=torch.Generator().manual_seed(24)).tolist()
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    # K = V = 64: the point is the program count; at 128 the fp64 oracle's per-sequence states take ~65 GB
    d = build(1, cu[-1], 16, 32, 64, 64, cu=cu, seed=24, fwd=False)
    check(d, torch.bfloat16, 64, cu)
