"""Triton kernels of the GDN backward stages (SPEC 1.10.6 ``chunk_gated_delta_rule_bwd_dhu``, 1.10.8
``chunk_bwd_dv_local``, 1.10.9 ``chunk_bwd_dqkwg``). Kernels only: the launchers live in
``bwd_dhu.py`` / ``bwd_dv.py`` / ``bwd_dqkwg.py``.

Conventions (as ``triton_kernels.py``): token-major tensors addressed through their batch, token and
head strides with unit stride on the last dim; int64 scalar bases per chunk, int32 offsets inside the
``[BT, ·]`` tiles; fp32 accumulation, one rounding on store. Products run through ``tl.dot`` with
``input_precision="ieee"`` (``_mm``): IEEE fp32 for fp32 operands (no TF32, SPEC 0.5), tensor cores for
fp16/bf16 operands; fp32 intermediates (states, score tiles) are staged in the operand's dtype for
the product. Every ``exp`` is of a masked difference of chunk-local gate cumsums ``G``: out-of-range
loads are replaced before the subtraction, so the argument is ``<= 0`` for non-positive gates.
Transposes are of loaded tiles only (never of a ``tl.dot`` result).
"""
import triton
import triton.language as tl

from ...triton_utils import i64
from .triton_kernels import _chunk_bounds, _chunk_v_tile, _gate_row, _mm, _row_factor


# ------------------------------------------------------------------------------------------------
# chunk_bwd_dv_local (SPEC 1.10.8)
# ------------------------------------------------------------------------------------------------

@triton.jit
def chunk_bwd_dv_local_kernel(q_ptr, k_ptr, do_ptr, g_ptr, dv_ptr, cu_ptr, idx_ptr,
                              T, B, HV, GQ, K, V, scale,
                              s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_ob, s_ot, s_oh, s_gb, s_gt, s_gh,
                              s_vb, s_vt, s_vh,
                              BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr,
                              IS_VARLEN: tl.constexpr):
    """One (chunk, value head, V-tile of ``BV``) per program:
    ``dv = scale·((k qᵀ) ⊙ e^{G_i − G_j})_{i ≥ j} do`` — the transposed score tile ``Aᵀ[j, i] = k_j·q_i``
    accumulated over K in blocks of ``BK``, masked to ``i ≥ j`` inside the sequence, then one
    ``[BT, BT] x [BT, BV]`` product. Program id: flattened ``((chunk · B + batch) · HV + head) · NV + tile``."""
    i_c, i_b, i_h, start, eos, v0, o_t, rmask, cols, cmask = _chunk_v_tile(T, B, HV, V, cu_ptr, idx_ptr, BT, BV,
                                                                          IS_VARLEN)
    q_c = q_ptr + i_b * s_qb + (i_h // GQ) * s_qh + start * s_qt
    k_c = k_ptr + i_b * s_kb + (i_h // GQ) * s_kh + start * s_kt

    b_At = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        d = i_k * BK + tl.arange(0, BK)
        dmask = d < K
        b_k = tl.load(k_c + o_t[:, None] * s_kt + d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
        b_qt = tl.load(q_c + o_t[None, :] * s_qt + d[:, None], mask=dmask[:, None] & rmask[None, :], other=0.0)
        b_At += _mm(b_k, b_qt.to(b_k.dtype))

    # row j (key position), column i (query position): keep i >= j inside the sequence
    keep = (o_t[None, :] >= o_t[:, None]) & rmask[:, None] & rmask[None, :]
    if USE_G:
        b_g = tl.load(g_ptr + i_b * s_gb + i_h * s_gh + start * s_gt + o_t * s_gt, mask=rmask, other=0.0)
        b_g = b_g.to(tl.float32)
        b_At = b_At * tl.exp(tl.where(keep, b_g[None, :] - b_g[:, None], 0.0))
    b_At = tl.where(keep, b_At * scale, 0.0)
    vm = rmask[:, None] & cmask[None, :]
    b_do = tl.load(do_ptr + i_b * s_ob + i_h * s_oh + start * s_ot + v0 + o_t[:, None] * s_ot + cols[None, :],
                   mask=vm, other=0.0)
    b_dv = _mm(b_At.to(b_do.dtype), b_do)
    tl.store(dv_ptr + i_b * s_vb + i_h * s_vh + start * s_vt + v0 + o_t[:, None] * s_vt + cols[None, :],
             b_dv.to(dv_ptr.dtype.element_ty), mask=vm)


# ------------------------------------------------------------------------------------------------
# chunk_gated_delta_rule_bwd_dhu (SPEC 1.10.6)
# ------------------------------------------------------------------------------------------------

@triton.jit
def _load_blk(base, i_kb, cols, K, nv, s_k, BK: tl.constexpr):
    """Rows ``[i_kb·BK, (i_kb+1)·BK)`` x ``cols < nv`` of a ``[K, V]`` matrix (unit stride on V) in fp32;
    ``base`` points at the program's first column."""
    rows = i_kb * BK + tl.arange(0, BK)
    mask = (rows < K)[:, None] & (cols < nv)[None, :]
    return tl.load(base + rows[:, None] * s_k + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_blk(base, i_kb, cols, K, nv, s_k, X, BK: tl.constexpr):
    rows = i_kb * BK + tl.arange(0, BK)
    mask = (rows < K)[:, None] & (cols < nv)[None, :]
    tl.store(base + rows[:, None] * s_k + cols[None, :], X.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _k_times_ds(k_c, gk_c, o_t, rmask, g_last, s_kt, s_gkt, i_kb, K, dS, BK: tl.constexpr, USE_GK: tl.constexpr,
                QKG: tl.constexpr = False):
    """``(k_block [⊙ e^{Γ − G}]) @ dS_block`` ([BT, BV], fp32 accumulate; dS staged in k's dtype); ``QKG``: k
    already holds ``k ⊙ e^{Γ − G}``. ``g_last``: the block's gate row ``Γ`` (``_gate_row``, loaded ahead)."""
    d = i_kb * BK + tl.arange(0, BK)
    dmask = d < K
    m = rmask[:, None] & dmask[None, :]
    b_k = tl.load(k_c + o_t[:, None] * s_kt + d[None, :], mask=m, other=0.0)
    if USE_GK and not QKG:
        b_gk = tl.load(gk_c + o_t[:, None] * s_gkt + d[None, :], mask=m, other=0.0).to(tl.float32)
        fac = tl.where(m, tl.exp(tl.where(m, g_last[None, :] - b_gk, 0.0)), 0.0)
        b_k = (b_k.to(tl.float32) * fac).to(b_k.dtype)
    return _mm(b_k, dS.to(b_k.dtype))


@triton.jit
def _ds_update(dS, q_c, w_c, gk_c, o_t, rmask, g_last, s_qt, s_wt, s_gkt, i_kb, K, b_do, b_dv2,
               BK: tl.constexpr, USE_GK: tl.constexpr, QKG: tl.constexpr = False):
    """``dS_block ← [diag(e^{Γ})] dS_block + (q_block [⊙ e^{G}])ᵀ b_do − w_blockᵀ b_dv2``. ``b_do`` is
    already scaled by ``scale`` (and ``e^{G_i}`` for scalar gates; the caller applies the scalar decay
    of dS); q and w are read transposed ([BK, BT]) straight from memory. ``QKG``: q already holds
    ``q ⊙ e^{G}``. ``g_last``: the block's gate row ``Γ`` (``_gate_row``, loaded ahead)."""
    d = i_kb * BK + tl.arange(0, BK)
    dmask = d < K
    m = dmask[:, None] & rmask[None, :]
    b_qt = tl.load(q_c + o_t[None, :] * s_qt + d[:, None], mask=m, other=0.0)
    b_wt = tl.load(w_c + o_t[None, :] * s_wt + d[:, None], mask=m, other=0.0)
    if USE_GK:
        if not QKG:
            b_gk = tl.load(gk_c + o_t[None, :] * s_gkt + d[:, None], mask=m, other=0.0).to(tl.float32)
            b_qt = (b_qt.to(tl.float32) * tl.where(m, tl.exp(tl.where(m, b_gk, 0.0)), 0.0)).to(b_qt.dtype)
        dS = dS * tl.exp(g_last)[:, None]
    return dS + _mm(b_qt, b_do.to(b_qt.dtype)) - _mm(b_wt, b_dv2.to(b_wt.dtype))


@triton.jit
def chunk_bwd_dhu_kernel(q_ptr, k_ptr, w_ptr, do_ptr, dv_ptr, g_ptr, gk_ptr, dht_ptr, dh_ptr, dh0_ptr, dv2_ptr,
                         cu_ptr, off_ptr, T, HV, GQ, K, V, scale,
                         s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ob, s_ot, s_oh,
                         s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_gkb, s_gkt, s_gkh, s_tn, s_th, s_tk,
                         s_hb, s_hc, s_hh, s_hk, s_0n, s_0h, s_0k, s_2b, s_2t, s_2h,
                         BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NK: tl.constexpr,
                         USE_G: tl.constexpr, USE_GK: tl.constexpr, HAS_DHT: tl.constexpr,
                         STORE_DH0: tl.constexpr, IS_VARLEN: tl.constexpr, QKG: tl.constexpr = False):
    """One (sequence, value head, V-tile of ``BV``) per program: the reverse scan over the sequence's
    chunks with the fp32 gradient ``dS [K, BV]`` in registers as up to four ``[BK, BV]`` blocks.

    Per chunk c, last to first: ``dh[c] = dS`` (dh's dtype); ``dv2 = dv + (e^{Γ−G} ⊙ k) dS``;
    ``dS ← e^{Γ} dS + scale·(e^{G} ⊙ q)ᵀ do − wᵀ dv2`` (per channel with ``USE_GK``). After the first
    chunk, ``dh0 = dS`` (fp32). Rows past the sequence end are never read (masked loads give 0) nor
    written. Program id: flattened ``(sequence · HV + head) · NV + tile`` (no 65,535 grid limit);
    varlen sequences take their tokens from ``cu_seqlens`` and their first chunk's index in ``dh`` from
    ``off`` (exclusive cumsum of chunks per sequence). ``QKG`` (with ``USE_GK``): q and k are ``q ⊙ e^{G}``
    and ``k ⊙ e^{Γ − G}`` per value head (KDA's qg, kg), so the scan reads only each chunk's last gate row."""
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
    nv = V - v0
    o_t = tl.arange(0, BT)
    cols = tl.arange(0, BV)
    cmask = cols < nv
    q_base = q_ptr + i_b * s_qb + (i_h // GQ) * s_qh
    k_base = k_ptr + i_b * s_kb + (i_h // GQ) * s_kh
    w_base = w_ptr + i_b * s_wb + i_h * s_wh
    do_base = do_ptr + i_b * s_ob + i_h * s_oh + v0
    dv_base = dv_ptr + i_b * s_vb + i_h * s_vh + v0
    dv2_base = dv2_ptr + i_b * s_2b + i_h * s_2h + v0
    g_base = g_ptr + i_b * s_gb + i_h * s_gh
    gk_base = gk_ptr + i_b * s_gkb + i_h * s_gkh

    dS1 = tl.zeros([BK, BV], dtype=tl.float32)
    if NK > 1:
        dS2 = tl.zeros([BK, BV], dtype=tl.float32)
    if NK > 2:
        dS3 = tl.zeros([BK, BV], dtype=tl.float32)
    if NK > 3:
        dS4 = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_DHT:
        t_base = dht_ptr + i_n * s_tn + i_h * s_th + v0
        dS1 = _load_blk(t_base, 0, cols, K, nv, s_tk, BK)
        if NK > 1:
            dS2 = _load_blk(t_base, 1, cols, K, nv, s_tk, BK)
        if NK > 2:
            dS3 = _load_blk(t_base, 2, cols, K, nv, s_tk, BK)
        if NK > 3:
            dS4 = _load_blk(t_base, 3, cols, K, nv, s_tk, BK)

    NTn = (eos - bos + BT - 1) // BT
    # per-channel decay rows (the last chunk's: the sequence's last row), each loaded one step ahead (``_gate_row``)
    gn1 = tl.zeros([BK], dtype=tl.float32)
    gn2 = gn1
    gn3 = gn1
    gn4 = gn1
    if USE_GK:
        gn1 = _gate_row(gk_base, eos - 1, s_gkt, 0, K, eos > bos, BK)
        if NK > 1:
            gn2 = _gate_row(gk_base, eos - 1, s_gkt, 1, K, eos > bos, BK)
        if NK > 2:
            gn3 = _gate_row(gk_base, eos - 1, s_gkt, 2, K, eos > bos, BK)
        if NK > 3:
            gn4 = _gate_row(gk_base, eos - 1, s_gkt, 3, K, eos > bos, BK)
    for i_r in range(0, NTn):
        i_t = NTn - 1 - i64(i_r)
        start = bos + i_t * BT
        rmask = o_t < eos - start
        last = tl.minimum(eos - start, BT) - 1
        gl1 = gn1
        gl2 = gn2
        gl3 = gn3
        gl4 = gn4
        if USE_GK:  # the previous chunk (a whole one) ends right before this one's start
            gn1 = _gate_row(gk_base, start - 1, s_gkt, 0, K, i_t > 0, BK)
            if NK > 1:
                gn2 = _gate_row(gk_base, start - 1, s_gkt, 1, K, i_t > 0, BK)
            if NK > 2:
                gn3 = _gate_row(gk_base, start - 1, s_gkt, 2, K, i_t > 0, BK)
            if NK > 3:
                gn4 = _gate_row(gk_base, start - 1, s_gkt, 3, K, i_t > 0, BK)
        h_c = dh_ptr + i_b * s_hb + (boh + i_t) * s_hc + i_h * s_hh + v0
        q_c = q_base + start * s_qt
        k_c = k_base + start * s_kt
        w_c = w_base + start * s_wt
        gk_c = gk_base + start * s_gkt
        _store_blk(h_c, 0, cols, K, nv, s_hk, dS1, BK)
        b_dv2 = _k_times_ds(k_c, gk_c, o_t, rmask, gl1, s_kt, s_gkt, 0, K, dS1, BK, USE_GK, QKG)
        if NK > 1:
            _store_blk(h_c, 1, cols, K, nv, s_hk, dS2, BK)
            b_dv2 += _k_times_ds(k_c, gk_c, o_t, rmask, gl2, s_kt, s_gkt, 1, K, dS2, BK, USE_GK, QKG)
        if NK > 2:
            _store_blk(h_c, 2, cols, K, nv, s_hk, dS3, BK)
            b_dv2 += _k_times_ds(k_c, gk_c, o_t, rmask, gl3, s_kt, s_gkt, 2, K, dS3, BK, USE_GK, QKG)
        if NK > 3:
            _store_blk(h_c, 3, cols, K, nv, s_hk, dS4, BK)
            b_dv2 += _k_times_ds(k_c, gk_c, o_t, rmask, gl4, s_kt, s_gkt, 3, K, dS4, BK, USE_GK, QKG)
        vm = rmask[:, None] & cmask[None, :]
        b_do = tl.load(do_base + start * s_ot + o_t[:, None] * s_ot + cols[None, :], mask=vm, other=0.0)
        b_do = b_do.to(tl.float32) * scale
        if USE_G:
            g_c = g_base + start * s_gt
            g_last = tl.load(g_c + last * s_gt).to(tl.float32)
            b_g = tl.load(g_c + o_t * s_gt, mask=rmask, other=0.0).to(tl.float32)
            b_dv2 = b_dv2 * tl.where(rmask, tl.exp(tl.where(rmask, g_last - b_g, 0.0)), 0.0)[:, None]
            b_do = b_do * tl.where(rmask, tl.exp(tl.where(rmask, b_g, 0.0)), 0.0)[:, None]
            dec = tl.exp(g_last)
            dS1 = dS1 * dec
            if NK > 1:
                dS2 = dS2 * dec
            if NK > 2:
                dS3 = dS3 * dec
            if NK > 3:
                dS4 = dS4 * dec
        b_dv = tl.load(dv_base + start * s_vt + o_t[:, None] * s_vt + cols[None, :], mask=vm, other=0.0)
        b_dv2 += b_dv.to(tl.float32)
        tl.store(dv2_base + start * s_2t + o_t[:, None] * s_2t + cols[None, :], b_dv2.to(dv2_ptr.dtype.element_ty),
                 mask=vm)
        dS1 = _ds_update(dS1, q_c, w_c, gk_c, o_t, rmask, gl1, s_qt, s_wt, s_gkt, 0, K, b_do, b_dv2, BK, USE_GK, QKG)
        if NK > 1:
            dS2 = _ds_update(dS2, q_c, w_c, gk_c, o_t, rmask, gl2, s_qt, s_wt, s_gkt, 1, K, b_do, b_dv2, BK,
                             USE_GK, QKG)
        if NK > 2:
            dS3 = _ds_update(dS3, q_c, w_c, gk_c, o_t, rmask, gl3, s_qt, s_wt, s_gkt, 2, K, b_do, b_dv2, BK,
                             USE_GK, QKG)
        if NK > 3:
            dS4 = _ds_update(dS4, q_c, w_c, gk_c, o_t, rmask, gl4, s_qt, s_wt, s_gkt, 3, K, b_do, b_dv2, BK,
                             USE_GK, QKG)

    if STORE_DH0:
        z_base = dh0_ptr + i_n * s_0n + i_h * s_0h + v0
        _store_blk(z_base, 0, cols, K, nv, s_0k, dS1, BK)
        if NK > 1:
            _store_blk(z_base, 1, cols, K, nv, s_0k, dS2, BK)
        if NK > 2:
            _store_blk(z_base, 2, cols, K, nv, s_0k, dS3, BK)
        if NK > 3:
            _store_blk(z_base, 3, cols, K, nv, s_0k, dS4, BK)


# ------------------------------------------------------------------------------------------------
# chunk_bwd_dqkwg (SPEC 1.10.9)
# ------------------------------------------------------------------------------------------------

@triton.jit
def chunk_bwd_dqkwg_kernel(q_ptr, k_ptr, v_ptr, do_ptr, h_ptr, dh_ptr, g_ptr, dv_ptr,
                           dq_ptr, dk_ptr, dw_ptr, dg_ptr, cu_ptr, idx_ptr, rq_ptr,
                           T, B, H, GQ, K, V, scale,
                           s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh,
                           s_hb, s_hc, s_hh, s_hk, s_db, s_dc, s_dh, s_dk, s_gb, s_gt, s_gh,
                           s_ub, s_ut, s_uh, s_qob, s_qot, s_qoh, s_wb, s_wt, s_wh, s_gn, s_gob, s_got, s_goh,
                           s_rb, s_rt, s_rh, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           USE_G: tl.constexpr, HAS_DW: tl.constexpr, IS_VARLEN: tl.constexpr,
                           NORM_DQ: tl.constexpr = False):
    """One (chunk, q/k head, K-block of ``BK``, phase) per program, looping over the ``GQ`` value heads
    that share the q/k head (GVA: their ``dq``/``dk`` are summed in registers in head order, so the
    result is deterministic without atomics). Two phases keep the register footprint small:

    - phase 0 (``dq``, ``dw``): one pass over V in tiles of ``BV`` accumulates ``dA = do vᵀ`` ([BT, BT]),
      ``do Sᵀ`` and ``dv Sᵀ`` ([BT, BK]) and ``⟨S, dS⟩``; then
      ``dq = scale·(e^{G} ⊙ do Sᵀ + (dA ⊙ e^{G_i − G_j})_{j ≤ i} k)``, ``dw = −dv Sᵀ`` (per value head),
      and the dg part ``Σ_d q ⊙ dq`` (+ ``e^{Γ}⟨S, dS⟩`` on the chunk's last valid row);
    - phase 1 (``dk``): ``dAᵀ = v doᵀ`` and ``v dSᵀ``; then
      ``dk = scale·(dAᵀ ⊙ e^{G_i − G_j})_{i ≥ j} q + e^{Γ − G} ⊙ v dSᵀ`` and the dg part
      ``−Σ_d k ⊙ dk`` (+ ``Σ k ⊙ (e^{Γ − G} ⊙ v dSᵀ)`` on the last valid row).

    Each phase writes its K-block's dg part to its own slot ``dg[2·i_k + phase]``; the launcher sums the
    slots with torch (deterministic). ``dAᵀ`` is a product of its own (no transpose of a ``tl.dot``
    result). Program id: flattened ``(((chunk · B + batch) · H + head) · NK + K-block) · 2 + phase``
    (the programs of one chunk are adjacent, so do/v/h/dh come from L2 for the later ones); ``h``/``dh``
    are indexed by the flattened chunk. ``NORM_DQ`` (one K-block, ``BK >= K``): ``q`` is the l2-normalized
    ``q̂`` and ``rq`` its fp32 rstd ``[B, T, H]``; the l2norm backward ``rq·(dq − q̂ Σ_d dq ⊙ q̂)`` is applied to
    the summed ``dq`` before its store (in dq's dtype), so no separate pass reads it back."""
    pid = tl.program_id(0).to(tl.int64)
    NKB = tl.cdiv(K, BK)
    i_p = pid % 2
    rest = pid // 2
    i_k = rest % NKB
    rest = rest // NKB
    i_hq = rest % H
    rest = rest // H
    i_b = rest % B
    i_c = rest // B
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    o_t = tl.arange(0, BT)
    rmask = o_t < eos - start
    last = tl.minimum(eos - start, BT) - 1
    d = i_k * BK + tl.arange(0, BK)
    dmask = d < K
    km = rmask[:, None] & dmask[None, :]
    b_q = tl.load(q_ptr + i_b * s_qb + i_hq * s_qh + start * s_qt + o_t[:, None] * s_qt + d[None, :],
                  mask=km, other=0.0)
    b_k = tl.load(k_ptr + i_b * s_kb + i_hq * s_kh + start * s_kt + o_t[:, None] * s_kt + d[None, :],
                  mask=km, other=0.0)
    out_off = i_b * s_qob + i_hq * s_qoh + start * s_qot + o_t[:, None] * s_qot + d[None, :]
    b_sum = tl.zeros([BT, BK], dtype=tl.float32)
    if i_p == 0:
        causal = (o_t[:, None] >= o_t[None, :]) & rmask[:, None] & rmask[None, :]     # [i, j]: j <= i
        for i_g in range(0, GQ):
            i_h = i_hq * GQ + i64(i_g)
            v_c = v_ptr + i_b * s_vb + i_h * s_vh + start * s_vt
            do_c = do_ptr + i_b * s_ob + i_h * s_oh + start * s_ot
            dv_c = dv_ptr + i_b * s_ub + i_h * s_uh + start * s_ut
            h_c = h_ptr + i_b * s_hb + i_c * s_hc + i_h * s_hh
            dh_c = dh_ptr + i_b * s_db + i_c * s_dc + i_h * s_dh
            b_dA = tl.zeros([BT, BT], dtype=tl.float32)
            b_dqs = tl.zeros([BT, BK], dtype=tl.float32)
            b_dw = tl.zeros([BT, BK], dtype=tl.float32)
            b_hdh = tl.zeros([BK], dtype=tl.float32)
            for i_v in range(0, tl.cdiv(V, BV)):
                cols = i_v * BV + tl.arange(0, BV)
                cmask = cols < V
                vm = rmask[:, None] & cmask[None, :]
                vmt = cmask[:, None] & rmask[None, :]
                hmt = cmask[:, None] & dmask[None, :]
                b_do = tl.load(do_c + o_t[:, None] * s_ot + cols[None, :], mask=vm, other=0.0)
                b_vt = tl.load(v_c + o_t[None, :] * s_vt + cols[:, None], mask=vmt, other=0.0)    # [BV, BT]
                b_ht = tl.load(h_c + d[None, :] * s_hk + cols[:, None], mask=hmt, other=0.0)      # [BV, BK]
                b_dA += _mm(b_do, b_vt.to(b_do.dtype))
                b_dqs += _mm(b_do, b_ht.to(b_do.dtype))
                if HAS_DW:
                    b_dv = tl.load(dv_c + o_t[:, None] * s_ut + cols[None, :], mask=vm, other=0.0)
                    b_dw += _mm(b_dv, b_ht.to(b_dv.dtype))
                if USE_G:
                    b_dht = tl.load(dh_c + d[None, :] * s_dk + cols[:, None], mask=hmt, other=0.0)
                    b_hdh += tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), 0)
            if USE_G:
                g_c = g_ptr + i_b * s_gb + i_h * s_gh + start * s_gt
                b_g = tl.load(g_c + o_t * s_gt, mask=rmask, other=0.0).to(tl.float32)
                g_last = tl.load(g_c + last * s_gt).to(tl.float32)
                b_dA = b_dA * tl.exp(tl.where(causal, b_g[:, None] - b_g[None, :], 0.0))
                b_dqs = b_dqs * tl.where(rmask, tl.exp(tl.where(rmask, b_g, 0.0)), 0.0)[:, None]
            b_dA = tl.where(causal, b_dA * scale, 0.0)
            b_dq = b_dqs * scale + _mm(b_dA.to(b_k.dtype), b_k)
            if HAS_DW:
                tl.store(dw_ptr + i_b * s_wb + i_h * s_wh + start * s_wt + o_t[:, None] * s_wt + d[None, :],
                         (-b_dw).to(dw_ptr.dtype.element_ty), mask=km)
            if USE_G:
                b_dg = tl.sum(b_dq * b_q.to(tl.float32), 1)
                b_dg = tl.where(o_t == last, b_dg + tl.exp(g_last) * tl.sum(b_hdh, 0), b_dg)
                tl.store(dg_ptr + (2 * i_k) * s_gn + i_b * s_gob + i_h * s_goh + start * s_got + o_t * s_got,
                         b_dg.to(dg_ptr.dtype.element_ty), mask=rmask)
            b_sum += b_dq
        if NORM_DQ:  # the row's whole K is in this block (the launcher's condition)
            b_qf = b_q.to(tl.float32)
            b_rq = _row_factor(rq_ptr + i_b * s_rb + i_hq * s_rh + start * s_rt, o_t, rmask, s_rt)
            b_sum = b_rq[:, None] * (b_sum - b_qf * tl.sum(b_sum * b_qf, 1)[:, None])
        tl.store(dq_ptr + out_off, b_sum.to(dq_ptr.dtype.element_ty), mask=km)
    else:
        causal_t = (o_t[None, :] >= o_t[:, None]) & rmask[:, None] & rmask[None, :]   # [j, i]: i >= j
        for i_g in range(0, GQ):
            i_h = i_hq * GQ + i64(i_g)
            v_c = v_ptr + i_b * s_vb + i_h * s_vh + start * s_vt
            do_c = do_ptr + i_b * s_ob + i_h * s_oh + start * s_ot
            dh_c = dh_ptr + i_b * s_db + i_c * s_dc + i_h * s_dh
            b_dAt = tl.zeros([BT, BT], dtype=tl.float32)
            b_dks = tl.zeros([BT, BK], dtype=tl.float32)
            for i_v in range(0, tl.cdiv(V, BV)):
                cols = i_v * BV + tl.arange(0, BV)
                cmask = cols < V
                vm = rmask[:, None] & cmask[None, :]
                vmt = cmask[:, None] & rmask[None, :]
                hmt = cmask[:, None] & dmask[None, :]
                b_v = tl.load(v_c + o_t[:, None] * s_vt + cols[None, :], mask=vm, other=0.0)
                b_dot = tl.load(do_c + o_t[None, :] * s_ot + cols[:, None], mask=vmt, other=0.0)  # [BV, BT]
                b_dht = tl.load(dh_c + d[None, :] * s_dk + cols[:, None], mask=hmt, other=0.0)    # [BV, BK]
                b_dAt += _mm(b_v, b_dot.to(b_v.dtype))
                b_dks += _mm(b_v, b_dht.to(b_v.dtype))
            if USE_G:
                g_c = g_ptr + i_b * s_gb + i_h * s_gh + start * s_gt
                b_g = tl.load(g_c + o_t * s_gt, mask=rmask, other=0.0).to(tl.float32)
                g_last = tl.load(g_c + last * s_gt).to(tl.float32)
                b_dAt = b_dAt * tl.exp(tl.where(causal_t, b_g[None, :] - b_g[:, None], 0.0))
                b_dks = b_dks * tl.where(rmask, tl.exp(tl.where(rmask, g_last - b_g, 0.0)), 0.0)[:, None]
            b_dAt = tl.where(causal_t, b_dAt * scale, 0.0)
            b_dk = b_dks + _mm(b_dAt.to(b_q.dtype), b_q)
            if USE_G:
                b_kf = b_k.to(tl.float32)
                b_dg = -tl.sum(b_dk * b_kf, 1)
                b_dg = tl.where(o_t == last, b_dg + tl.sum(tl.sum(b_dks * b_kf, 1), 0), b_dg)
                tl.store(dg_ptr + (2 * i_k + 1) * s_gn + i_b * s_gob + i_h * s_goh + start * s_got + o_t * s_got,
                         b_dg.to(dg_ptr.dtype.element_ty), mask=rmask)
            b_sum += b_dk
        tl.store(dk_ptr + out_off, b_sum.to(dk_ptr.dtype.element_ty), mask=km)
