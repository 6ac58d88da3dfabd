"""Triton kernels of the GDN forward stages (SPEC 1.10.5 ``chunk_gated_delta_rule_fwd_h`` and 1.10.7
``chunk_fwd_o``). Kernels only: the launchers live in ``fwd_h.py`` / ``fwd_o.py``.

Conventions (as ``triton_kernels.py``): token-major tensors addressed through their batch, token and
head strides with unit stride on the last dim, int64 offsets, fp32 accumulation, one rounding on
store. ``tl.dot`` runs with ``input_precision="ieee"``: IEEE fp32 products for fp32 operands (no
TF32, SPEC 0.5); fp16/bf16 operands still use the tensor cores. Every ``exp`` is of a masked
difference of chunk-local gate cumsums (``G``), so its argument is ``<= 0`` for non-positive gates and
never combines an out-of-range load with an in-range value.
"""
import triton
import triton.language as tl

from ...triton_utils import i64
from .triton_kernels import _chunk_v_tile, _gate_row, _mm, _row_factor


# ------------------------------------------------------------------------------------------------
# chunk_gated_delta_rule_fwd_h (SPEC 1.10.5)
# ------------------------------------------------------------------------------------------------

@triton.jit
def _load_state(base, i_kb, cols, K, nv, s_k, BK: tl.constexpr):
    """Rows ``[i_kb·BK, (i_kb+1)·BK)`` x ``cols < nv`` of a ``[K, V]`` state (unit stride on V) in fp32;
    ``base`` already points at the program's first column."""
    rows = i_kb * BK + tl.arange(0, BK)
    mask = (rows < K)[:, None] & (cols < nv)[None, :]
    return tl.load(base + rows[:, None] * s_k + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_state(base, i_kb, cols, K, nv, s_k, S, BK: tl.constexpr):
    rows = i_kb * BK + tl.arange(0, BK)
    mask = (rows < K)[:, None] & (cols < nv)[None, :]
    tl.store(base + rows[:, None] * s_k + cols[None, :], S.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _w_times_state(w_c, o_t, rmask, s_wt, i_kb, K, S, BK: tl.constexpr):
    """``w[chunk rows, block] @ S_block`` ([BT, BV], fp32 accumulate); S staged in w's dtype (SPEC 1.10).
    ``w_c`` points at the chunk's first token."""
    d = i_kb * BK + tl.arange(0, BK)
    b_w = tl.load(w_c + o_t[:, None] * s_wt + d[None, :], mask=rmask[:, None] & (d < K)[None, :], other=0.0)
    return _mm(b_w, S.to(b_w.dtype))


@triton.jit
def _state_update(S, k_c, gk_c, o_t, rmask, g_last, s_kt, s_gkt, i_kb, K, b_v,
                  BK: tl.constexpr, USE_GK: tl.constexpr, rk_c=None, s_rt=0, RK_ON_K: tl.constexpr = False,
                  KG: tl.constexpr = False):
    """``S_block ← [diag(e^{Γ})] S_block + (k_block [⊙ e^{Γ − G}])ᵀ b_v``; ``b_v`` is already scaled by
    the scalar factor ``e^{Γ − G_i}`` and cast to k's dtype; the scalar decay of S is applied by the
    caller. ``k`` is read transposed ([BK, BT]) straight from memory; ``k_c``/``gk_c`` point at the
    chunk's first token, ``g_last`` is the block's gate row ``Γ`` (``_gate_row``, loaded ahead). ``RK_ON_K``: k's columns are scaled by
    the l2norm rstd at ``rk_c`` (fp32, then cast) instead of ``b_v`` (fp16: rstd·v_new can overflow).
    ``KG``: k already holds ``k ⊙ e^{Γ − G}`` (rounded to its dtype as here), only ``Γ`` is read."""
    d = i_kb * BK + tl.arange(0, BK)
    dmask = d < K
    m = dmask[:, None] & rmask[None, :]
    b_kt = tl.load(k_c + o_t[None, :] * s_kt + d[:, None], mask=m, other=0.0)
    if RK_ON_K:
        b_kt = (b_kt.to(tl.float32) * _row_factor(rk_c, o_t, rmask, s_rt)[None, :]).to(b_v.dtype)
    if USE_GK:
        if not KG:
            b_gk = tl.load(gk_c + o_t[None, :] * s_gkt + d[:, None], mask=m, other=0.0).to(tl.float32)
            fac = tl.where(m, tl.exp(tl.where(m, g_last[:, None] - b_gk, 0.0)), 0.0)
            b_kt = (b_kt.to(tl.float32) * fac).to(b_v.dtype)
        S = S * tl.exp(g_last)[:, None]
    return S + _mm(b_kt, b_v)


@triton.jit
def chunk_fwd_h_kernel(k_ptr, w_ptr, u_ptr, g_ptr, gk_ptr, h0_ptr, h_ptr, vn_ptr, ht_ptr, cu_ptr, off_ptr, rk_ptr,
                       T, HV, GQ, K, V,
                       s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_gb, s_gt, s_gh,
                       s_gkb, s_gkt, s_gkh, s_0n, s_0h, s_0k, s_hb, s_hc, s_hh, s_hk, s_vb, s_vt, s_vh,
                       s_tn, s_th, s_tk, s_rb, s_rt, s_rh,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NK: tl.constexpr,
                       USE_G: tl.constexpr, USE_GK: tl.constexpr, HAS_H0: tl.constexpr,
                       STORE_FINAL: tl.constexpr, SAVE_VNEW: tl.constexpr, IS_VARLEN: tl.constexpr,
                       HAS_RK: tl.constexpr = False, KG: tl.constexpr = False):
    """One (sequence, value head, V-tile of ``BV``) per program, scanning the sequence's chunks with
    the fp32 state ``[K, BV]`` in registers as up to four ``[BK, BV]`` blocks (``K <= 4·BK``).

    Per chunk c: ``h[c] = S`` (k's dtype); ``v_new = u − w S`` (stored in u's dtype); then
    ``S ← e^{Γ} S + (e^{Γ−G} ⊙ k)ᵀ v_new`` (per channel with ``USE_GK``). Rows past the sequence end
    are never read (masked loads give 0, so they add nothing) nor written. Program id: flattened
    ``(sequence · HV + head) · NV + V-tile``; varlen sequences take their tokens from ``cu_seqlens``
    and their first chunk's index in ``h`` from ``off`` (exclusive cumsum of chunks per sequence).
    Addressing: int64 scalar bases per chunk (token offsets past 2^31 are fine), int32 offsets
    inside the ``[BT, ·]`` tiles. ``HAS_RK``: k is the raw key and ``rk`` its l2norm rstd,
    folded into ``v_new`` (``kᵀ diag(rk) v_new``) so the normalized key is never rounded; fp16 folds it
    into k instead (``rk`` is up to 1/sqrt(eps) = 1000, a zero key's, so ``rk·v_new`` rounded to fp16 passes
    65504 for ``|v_new| > 65.5``, and inf·0 put NaN in the state). ``KG`` (with ``USE_GK``): k is
    ``k ⊙ e^{Γ − G}`` per value head (KDA's kg, made once by the intra-chunk kernel), so the scan reads
    only the gate's last row per chunk: no ``[K, BT]`` gate tile nor exponentials per V-tile program."""
    pid = tl.program_id(0).to(tl.int64)
    NV = tl.cdiv(V, BV)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_h = i_nh % HV
    if IS_VARLEN:
        bos = tl.load(cu_ptr + i_n).to(tl.int64)
        eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
        boh = tl.load(off_ptr + i_n).to(tl.int64)
        i_b = i_n * 0
    else:
        bos = i_n * 0
        eos = bos + T
        boh = bos
        i_b = i_n
    v0 = i_v * BV
    nv = V - v0                     # valid columns of this tile
    o_t = tl.arange(0, BT)
    cols = tl.arange(0, BV)
    cmask = cols < nv
    k_base = k_ptr + i_b * s_kb + (i_h // GQ) * s_kh
    w_base = w_ptr + i_b * s_wb + i_h * s_wh
    u_base = u_ptr + i_b * s_ub + i_h * s_uh + v0
    g_base = g_ptr + i_b * s_gb + i_h * s_gh
    gk_base = gk_ptr + i_b * s_gkb + i_h * s_gkh
    vn_base = vn_ptr + i_b * s_vb + i_h * s_vh + v0

    S1 = tl.zeros([BK, BV], dtype=tl.float32)
    if NK > 1:
        S2 = tl.zeros([BK, BV], dtype=tl.float32)
    if NK > 2:
        S3 = tl.zeros([BK, BV], dtype=tl.float32)
    if NK > 3:
        S4 = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        h0_base = h0_ptr + i_n * s_0n + i_h * s_0h + v0
        S1 = _load_state(h0_base, 0, cols, K, nv, s_0k, BK)
        if NK > 1:
            S2 = _load_state(h0_base, 1, cols, K, nv, s_0k, BK)
        if NK > 2:
            S3 = _load_state(h0_base, 2, cols, K, nv, s_0k, BK)
        if NK > 3:
            S4 = _load_state(h0_base, 3, cols, K, nv, s_0k, BK)

    RK_ON_K: tl.constexpr = HAS_RK and k_ptr.dtype.element_ty == tl.float16  # see the docstring
    NTn = (eos - bos + BT - 1) // BT
    # per-channel decay rows (the first chunk's here), each loaded one step ahead of its use (``_gate_row``)
    gn1 = tl.zeros([BK], dtype=tl.float32)
    gn2 = gn1
    gn3 = gn1
    gn4 = gn1
    if USE_GK:
        r0 = tl.minimum(eos, bos + BT) - 1
        gn1 = _gate_row(gk_base, r0, s_gkt, 0, K, eos > bos, BK)
        if NK > 1:
            gn2 = _gate_row(gk_base, r0, s_gkt, 1, K, eos > bos, BK)
        if NK > 2:
            gn3 = _gate_row(gk_base, r0, s_gkt, 2, K, eos > bos, BK)
        if NK > 3:
            gn4 = _gate_row(gk_base, r0, s_gkt, 3, K, eos > bos, BK)
    for i_t in range(0, NTn):
        start = bos + i64(i_t) * BT
        rmask = o_t < eos - start
        last = tl.minimum(eos - start, BT) - 1
        gl1 = gn1
        gl2 = gn2
        gl3 = gn3
        gl4 = gn4
        if USE_GK:  # this chunk's rows are in; the next chunk's (its last row: the sequence's end at most) go out
            r1 = tl.minimum(eos, start + 2 * BT) - 1
            more = start + BT < eos
            gn1 = _gate_row(gk_base, r1, s_gkt, 0, K, more, BK)
            if NK > 1:
                gn2 = _gate_row(gk_base, r1, s_gkt, 1, K, more, BK)
            if NK > 2:
                gn3 = _gate_row(gk_base, r1, s_gkt, 2, K, more, BK)
            if NK > 3:
                gn4 = _gate_row(gk_base, r1, s_gkt, 3, K, more, BK)
        h_c = h_ptr + i_b * s_hb + (boh + i64(i_t)) * s_hc + i_h * s_hh + v0
        w_c = w_base + start * s_wt
        k_c = k_base + start * s_kt
        gk_c = gk_base + start * s_gkt
        _store_state(h_c, 0, cols, K, nv, s_hk, S1, BK)
        b_v = _w_times_state(w_c, o_t, rmask, s_wt, 0, K, S1, BK)
        if NK > 1:
            _store_state(h_c, 1, cols, K, nv, s_hk, S2, BK)
            b_v += _w_times_state(w_c, o_t, rmask, s_wt, 1, K, S2, BK)
        if NK > 2:
            _store_state(h_c, 2, cols, K, nv, s_hk, S3, BK)
            b_v += _w_times_state(w_c, o_t, rmask, s_wt, 2, K, S3, BK)
        if NK > 3:
            _store_state(h_c, 3, cols, K, nv, s_hk, S4, BK)
            b_v += _w_times_state(w_c, o_t, rmask, s_wt, 3, K, S4, BK)
        vm = rmask[:, None] & cmask[None, :]
        b_u = tl.load(u_base + start * s_ut + o_t[:, None] * s_ut + cols[None, :], mask=vm, other=0.0)
        b_v = b_u.to(tl.float32) - b_v
        if SAVE_VNEW:
            tl.store(vn_base + start * s_vt + o_t[:, None] * s_vt + cols[None, :], b_v.to(vn_ptr.dtype.element_ty),
                     mask=vm)
        if USE_G:
            g_c = g_base + start * s_gt
            g_last = tl.load(g_c + last * s_gt).to(tl.float32)
            b_g = tl.load(g_c + o_t * s_gt, mask=rmask, other=0.0).to(tl.float32)
            fac = tl.where(rmask, tl.exp(tl.where(rmask, g_last - b_g, 0.0)), 0.0)
            b_v = b_v * fac[:, None]
            dec = tl.exp(g_last)
            S1 = S1 * dec
            if NK > 1:
                S2 = S2 * dec
            if NK > 2:
                S3 = S3 * dec
            if NK > 3:
                S4 = S4 * dec
        rk_c = rk_ptr + i_b * s_rb + (i_h // GQ) * s_rh + start * s_rt
        if HAS_RK and not RK_ON_K:
            b_v = b_v * _row_factor(rk_c, o_t, rmask, s_rt)[:, None]
        b_v = b_v.to(k_ptr.dtype.element_ty)
        S1 = _state_update(S1, k_c, gk_c, o_t, rmask, gl1, s_kt, s_gkt, 0, K, b_v, BK, USE_GK, rk_c, s_rt,
                           RK_ON_K, KG)
        if NK > 1:
            S2 = _state_update(S2, k_c, gk_c, o_t, rmask, gl2, s_kt, s_gkt, 1, K, b_v, BK, USE_GK, rk_c, s_rt,
                               RK_ON_K, KG)
        if NK > 2:
            S3 = _state_update(S3, k_c, gk_c, o_t, rmask, gl3, s_kt, s_gkt, 2, K, b_v, BK, USE_GK, rk_c, s_rt,
                               RK_ON_K, KG)
        if NK > 3:
            S4 = _state_update(S4, k_c, gk_c, o_t, rmask, gl4, s_kt, s_gkt, 3, K, b_v, BK, USE_GK, rk_c, s_rt,
                               RK_ON_K, KG)

    if STORE_FINAL:
        ht_base = ht_ptr + i_n * s_tn + i_h * s_th + v0
        _store_state(ht_base, 0, cols, K, nv, s_tk, S1, BK)
        if NK > 1:
            _store_state(ht_base, 1, cols, K, nv, s_tk, S2, BK)
        if NK > 2:
            _store_state(ht_base, 2, cols, K, nv, s_tk, S3, BK)
        if NK > 3:
            _store_state(ht_base, 3, cols, K, nv, s_tk, S4, BK)


# ------------------------------------------------------------------------------------------------
# chunk_fwd_o (SPEC 1.10.7)
# ------------------------------------------------------------------------------------------------

@triton.jit
def chunk_fwd_o_kernel(q_ptr, k_ptr, v_ptr, h_ptr, g_ptr, o_ptr, cu_ptr, idx_ptr, rq_ptr, rk_ptr,
                       T, B, HV, GQ, K, V, scale,
                       s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_hb, s_hc, s_hh, s_hk,
                       s_gb, s_gt, s_gh, s_ob, s_ot, s_oh, s_rb, s_rt, s_rh,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr,
                       IS_VARLEN: tl.constexpr, HAS_R: tl.constexpr = False):
    """One (chunk, value head, V-tile of ``BV``) per program:
    ``o = scale·(e^{G} ⊙ (q S_c) + ((q kᵀ) ⊙ e^{G_i − G_j})_{j ≤ i} v)``, looping over K in blocks of
    ``BK`` for both ``q S_c`` ([BT, BV]) and ``q kᵀ`` ([BT, BT]). Program id: flattened
    ``((chunk · B + batch) · HV + head) · NV + V-tile``; ``h`` is indexed by the flattened chunk (varlen:
    the row of ``chunk_indices``). int64 scalar bases per chunk, int32 offsets inside the tiles."""
    i_c, i_b, i_h, start, eos, v0, o_t, rmask, cols, cmask = _chunk_v_tile(T, B, HV, V, cu_ptr, idx_ptr, BT, BV,
                                                                          IS_VARLEN)
    q_c = q_ptr + i_b * s_qb + (i_h // GQ) * s_qh + start * s_qt
    k_c = k_ptr + i_b * s_kb + (i_h // GQ) * s_kh + start * s_kt
    h_c = h_ptr + i_b * s_hb + i_c * s_hc + i_h * s_hh + v0

    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        d = i_k * BK + tl.arange(0, BK)
        dmask = d < K
        b_q = tl.load(q_c + o_t[:, None] * s_qt + d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
        b_kt = tl.load(k_c + o_t[None, :] * s_kt + d[:, None], mask=dmask[:, None] & rmask[None, :], other=0.0)
        b_h = tl.load(h_c + d[:, None] * s_hk + cols[None, :], mask=dmask[:, None] & cmask[None, :], other=0.0)
        b_o += _mm(b_q, b_h.to(b_q.dtype))
        b_A += _mm(b_q, b_kt.to(b_q.dtype))

    if HAS_R:  # q, k raw; rq, rk (same layout) their l2norm rstd: o_i = rq_i (q_i S + Σ_j (q_i·k_j) rk_j ...)
        r_off = i_b * s_rb + (i_h // GQ) * s_rh + start * s_rt
        b_rq = _row_factor(rq_ptr + r_off, o_t, rmask, s_rt)
        b_o = b_o * b_rq[:, None]
        b_A = b_A * (b_rq[:, None] * _row_factor(rk_ptr + r_off, o_t, rmask, s_rt)[None, :])
    causal = (o_t[:, None] >= o_t[None, :]) & rmask[:, None] & rmask[None, :]
    if USE_G:
        g_c = g_ptr + i_b * s_gb + i_h * s_gh + start * s_gt
        b_g = tl.load(g_c + o_t * s_gt, mask=rmask, other=0.0).to(tl.float32)
        b_o = b_o * tl.where(rmask, tl.exp(tl.where(rmask, b_g, 0.0)), 0.0)[:, None]
        b_A = b_A * tl.exp(tl.where(causal, b_g[:, None] - b_g[None, :], 0.0))
    b_A = tl.where(causal, b_A, 0.0)
    vm = rmask[:, None] & cmask[None, :]
    b_v = tl.load(v_ptr + i_b * s_vb + i_h * s_vh + start * s_vt + v0 + o_t[:, None] * s_vt + cols[None, :],
                  mask=vm, other=0.0)
    b_o = (b_o + _mm(b_A.to(b_v.dtype), b_v)) * scale
    tl.store(o_ptr + i_b * s_ob + i_h * s_oh + start * s_ot + v0 + o_t[:, None] * s_ot + cols[None, :],
             b_o.to(o_ptr.dtype.element_ty), mask=vm)
