"""Triton kernels of the KDA family (SPEC 1.11). Kernels only: launchers live in ``intra.py``,
``fwd_o.py`` and ``bwd.py``. The stages KDA shares with GDN (cumsum, per-channel ``kkt``, ``solve_tril``,
``w/u``, the state scans with ``gk``) are GDN's kernels, not copies.

Conventions (as ``ops/gdn``): token-major tensors addressed through strides with int64 offsets (the
last dim has unit stride: launchers pass ``unit_last_stride`` views); one program per (chunk, batch
row, value head), flattened onto grid axis 0 (``_program``; varlen chunks through ``chunk_indices``);
rows past the sequence end are neither read (masked loads) nor written; fp32 math, one rounding on
store; ``tl.dot`` operands in the key dtype (IEEE fp32 for fp32 inputs, tensor cores for 16-bit ones),
fp32 accumulation; no ``tl.trans`` of a dot result (``_diag_block`` loads its column operands transposed).

Gate robustness (SPEC 1.11): per-channel decays ``e^{G_{i,d} − G_{j,d}}`` cannot leave the dot product.
The chunk is cut into 16-row blocks; inside a diagonal 16x16 block, the lower-left quarters of its 8- and 4-row
halvings each factor through their row sub-block's first row, and the pairs inside its four 4x4 diagonal groups
get the exact per-pair exponential of the masked difference. Across blocks, dots of factors
``e^{G_i − G_r}`` (rows ``i ≥ r``) and ``e^{G_r − G_j}`` (columns ``j < r``), with the reference ``r``
the **first row of the row block**: both arguments are ``≤ 0`` for non-positive gates (gates down to
−1000 never overflow), and no quantity a row uses depends on a later row (bitwise causality).
"""
import triton
import triton.language as tl

from ..gdn.triton_kernels import _chunk_bounds, _chunk_v_tile, _mm, _row_factor
from ..gdn.triton_wy import _dot, _program
from ...triton_utils import exp_fast_f32


@triton.jit
def _row_block(BHV, HV, GRP, cu_ptr, idx_ptr, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """``(batch row, value head, q/k head, block, chunk start, sequence end, block start)`` of a program of the
    one-16-row-block-per-program grids (chunks · B · HV on axis 0, the block on axis 1)."""
    i_c, i_b, i_h, i_hk = _program(BHV, HV, GRP)
    bi = tl.program_id(1)
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    return i_b, i_h, i_hk, bi, start, eos, start + bi * 16


@triton.jit
def _dot_f32(a, b, EXACT: tl.constexpr):
    """``a @ b`` of fp32 operands: IEEE for fp32 inputs (SPEC 0.5), else TF32 (more mantissa than bf16)."""
    if EXACT:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision="tf32")


@triton.jit
def _masked_exp(x, m):
    """``e^x`` where ``m``, 0 elsewhere; ``x`` is replaced by 0 before the exp where masked."""
    return tl.where(m, exp_fast_f32(tl.where(m, x, 0.0)), 0.0)


# ------------------------------------------------------------------------------------------------
# chunk_kda_fwd_intra (SPEC 1.11.1): Aqk, and the elementwise qg / kg
# ------------------------------------------------------------------------------------------------

@triton.jit
def kda_aqk_fwd_kernel(q_ptr, k_ptr, g_ptr, a_ptr, qg_ptr, kg_ptr, cu_ptr, idx_ptr, rq_ptr, rk_ptr, T, BHV, HV, GRP,
                       scale, s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_gb, s_gt, s_gh, s_ab, s_at, s_ah,
                       s_xb, s_xt, s_xh, s_yb, s_yt, s_yh, s_rb, s_rt, s_rh,
                       K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, STORE_A: tl.constexpr,
                       STORE_QG: tl.constexpr, STORE_KG: tl.constexpr, IS_VARLEN: tl.constexpr,
                       HAS_R: tl.constexpr = False, m_ptr=None, beta_ptr=None, s_mb=0, s_mt=0, s_mh=0,
                       s_bb=0, s_bt=0, s_bh=0, STORE_M: tl.constexpr = False, KC: tl.constexpr = 0):
    """``Aqk[i, j] = scale·Σ_d q_{i,d} k_{j,d} e^{G_{i,d} − G_{j,d}}`` for ``j ≤ i`` (valid), else 0, of one
    chunk and value head (``STORE_A``); with ``STORE_M`` (needs ``STORE_A``) also
    ``M[i, j] = β_i Σ_d k_{i,d} k_{j,d} e^{G_{i,d} − G_{j,d}}`` for ``j < i`` (fp32; GDN's per-channel kkt),
    sharing every load and exponential; ``qg = q ⊙ e^{G}`` (``STORE_QG``) and ``kg = k ⊙ e^{Γ − G}``
    (``STORE_KG``, ``Γ`` = ``G`` at the chunk's last valid row).

    Grid ``(chunks · B · HV, BT / 16)``: one 16-row block per program (the blocks are independent; one
    program looping over a chunk's four blocks took 1.04 ms at T = 8192, HV = 32 on the H200).
    Rows in 16-row blocks starting at ``r``: columns of earlier blocks (``j < r``), one 16-column block at a
    time, by ``tl.dot`` of ``q_i e^{G_i − G_r}`` (``k_i e^{G_i − G_r}``) with ``k_j e^{G_r − G_j}`` (``KC > 0``: the
    row block's factored tiles made once, ``KC`` = K rounded up to a power of two wide, in the product dtype;
    ``KC = 0``: ``BK``-wide key tiles, the row block's remade for every column block); the diagonal
    16x16 block by ``_diag_block`` (two halvings, each lower-left quarter through its row sub-block's first
    row, then exact 4x4 diagonal groups), stored apart from the rest."""
    i_b, i_h, i_hk, bi, start, eos, r0 = _row_block(BHV, HV, GRP, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    if r0 < eos:
        o = tl.arange(0, BT)
        o16 = tl.arange(0, 16)
        ri = r0 + o16
        vi = ri < eos
        q_base = q_ptr + i_b * s_qb + i_hk * s_qh
        k_base = k_ptr + i_b * s_kb + i_hk * s_kh
        g_base = g_ptr + i_b * s_gb + i_h * s_gh
        DT = k_ptr.dtype.element_ty
        rq_base = rq_ptr + i_b * s_rb + i_hk * s_rh  # HAS_R: q, k raw, rq/rk their l2norm rstd (same layout)
        rk_base = rk_ptr + i_b * s_rb + i_hk * s_rh
        if STORE_A:
            a_base = a_ptr + i_b * s_ab + i_h * s_ah
            m_base = a_base  # (the unused operands of _store_col_block need a value)
            r_i = tl.zeros([16], dtype=tl.float32)
            rk_i = r_i
            b_bi = r_i
            if HAS_R:
                r_i = _row_factor(rq_base, ri, vi, s_rt)
                rk_i = _row_factor(rk_base, ri, vi, s_rt)
            if STORE_M:
                m_base = m_ptr + i_b * s_mb + i_h * s_mh
                b_bi = tl.load(beta_ptr + i_b * s_bb + ri * s_bt + i_h * s_bh, mask=vi, other=0.0).to(tl.float32)
            # earlier columns one 16-column block at a time ([BK, 16] key tiles, all valid: they precede row r0):
            # no masked 64-wide work, and few registers (a [BK, BT] tile at 2 warps took 64 a thread per tensor)
            if KC > 0:
                # KC = K rounded up to a power of two: the row block's factored tiles once, in the product dtype
                # (what the tiled path casts each column block's to), then one K-wide product per column block
                if bi > 0:
                    dc = tl.arange(0, KC)
                    dcm = dc < K
                    mc = vi[:, None] & dcm[None, :]
                    g_rc = tl.load(g_base + r0 * s_gt + dc, mask=dcm, other=0.0).to(tl.float32)
                    b_gc = tl.load(g_base + ri[:, None] * s_gt + dc[None, :], mask=mc, other=0.0).to(tl.float32)
                    fac_c = _masked_exp(b_gc - g_rc[None, :], mc)
                    b_qf = (tl.load(q_base + ri[:, None] * s_qt + dc[None, :], mask=mc, other=0.0).to(tl.float32)
                            * fac_c).to(DT)
                    if STORE_M:
                        b_kf = (tl.load(k_base + ri[:, None] * s_kt + dc[None, :], mask=mc,
                                        other=0.0).to(tl.float32) * fac_c).to(DT)
                    for c in range(0, bi):
                        cj = start + c * 16 + o16
                        b_kj = _key_block(k_base, g_base, cj, dc, dcm, g_rc, s_kt, s_gt).to(DT)
                        acc = _dot(b_qf, b_kj, DT)
                        acc_m = _dot(b_kf, b_kj, DT) if STORE_M else acc
                        _store_col_block(a_base, m_base, rk_base, ri, vi, cj, eos, c, r_i, rk_i, b_bi, acc, acc_m,
                                         scale, s_at, s_mt, s_rt, HAS_R, STORE_M)
            else:
                for c in range(0, bi):
                    cj = start + c * 16 + o16
                    acc = tl.zeros([16, 16], dtype=tl.float32)
                    acc_m = tl.zeros([16, 16], dtype=tl.float32)
                    for i_k in range((K + BK - 1) // BK):
                        d = i_k * BK + tl.arange(0, BK)
                        dm = d < K
                        mi = vi[:, None] & dm[None, :]
                        g_r = tl.load(g_base + r0 * s_gt + d, mask=dm, other=0.0).to(tl.float32)
                        b_kj = _key_block(k_base, g_base, cj, d, dm, g_r, s_kt, s_gt)
                        b_g = tl.load(g_base + ri[:, None] * s_gt + d[None, :], mask=mi, other=0.0).to(tl.float32)
                        b_q = tl.load(q_base + ri[:, None] * s_qt + d[None, :], mask=mi, other=0.0).to(tl.float32)
                        fac = _masked_exp(b_g - g_r[None, :], mi)
                        acc += _dot(b_q * fac, b_kj, DT)
                        if STORE_M:
                            b_k = tl.load(k_base + ri[:, None] * s_kt + d[None, :], mask=mi, other=0.0).to(tl.float32)
                            acc_m += _dot(b_k * fac, b_kj, DT)
                    _store_col_block(a_base, m_base, rk_base, ri, vi, cj, eos, c, r_i, rk_i, b_bi, acc, acc_m,
                                     scale, s_at, s_mt, s_rt, HAS_R, STORE_M)
            # the diagonal 16x16 block, key tile by key tile (halvings by products, exact 4x4 groups: _diag_block)
            b_d = tl.zeros([16, 16], dtype=tl.float32)
            b_dm = tl.zeros([16, 16], dtype=tl.float32)
            for i_k in range((K + BK - 1) // BK):
                d = i_k * BK + tl.arange(0, BK)
                dm = d < K
                mi = vi[:, None] & dm[None, :]
                b_q = tl.load(q_base + ri[:, None] * s_qt + d[None, :], mask=mi, other=0.0).to(tl.float32)
                b_k = tl.load(k_base + ri[:, None] * s_kt + d[None, :], mask=mi, other=0.0).to(tl.float32)
                b_g = tl.load(g_base + ri[:, None] * s_gt + d[None, :], mask=mi, other=0.0).to(tl.float32)
                d_q, d_m = _diag_block(k_base, g_base, b_q, b_k, b_g, r0, eos, d, dm, s_kt, s_gt, STORE_M,
                                       DT == tl.float32)
                b_d += d_q
                if STORE_M:
                    b_dm += d_m
            if HAS_R:
                b_d = b_d * (r_i[:, None] * rk_i[None, :])
                if STORE_M:
                    b_dm = b_dm * (rk_i[:, None] * rk_i[None, :])
            tl.store(a_base + ri[:, None] * s_at + (bi * 16 + o16)[None, :], (b_d * scale).to(a_ptr.dtype.element_ty),
                     mask=vi[:, None])
            # zeros right of the diagonal block (the strict upper triangle)
            upper = vi[:, None] & (o >= bi * 16 + 16)[None, :]
            tl.store(a_base + ri[:, None] * s_at + o[None, :], tl.zeros([16, BT], dtype=a_ptr.dtype.element_ty),
                     mask=upper)
            if STORE_M:
                b_dm = tl.where(vi[:, None] & (o16[:, None] > o16[None, :]), b_dm * b_bi[:, None], 0.0)
                tl.store(m_base + ri[:, None] * s_mt + (bi * 16 + o16)[None, :], b_dm.to(m_ptr.dtype.element_ty),
                         mask=vi[:, None])
                tl.store(m_base + ri[:, None] * s_mt + o[None, :], tl.zeros([16, BT], dtype=m_ptr.dtype.element_ty),
                         mask=upper)
        if STORE_QG or STORE_KG:
            last = tl.minimum(eos - start, BT) - 1
            for i_k in range((K + BK - 1) // BK):
                d = i_k * BK + tl.arange(0, BK)
                dm = d < K
                m = vi[:, None] & dm[None, :]
                b_g = tl.load(g_base + ri[:, None] * s_gt + d[None, :], mask=m, other=0.0).to(tl.float32)
                if STORE_QG:
                    b_q = tl.load(q_base + ri[:, None] * s_qt + d[None, :], mask=m, other=0.0).to(tl.float32)
                    if HAS_R:
                        b_q = b_q * _row_factor(rq_base, ri, vi, s_rt)[:, None]
                    tl.store(qg_ptr + i_b * s_xb + i_h * s_xh + ri[:, None] * s_xt + d[None, :],
                             (b_q * _masked_exp(b_g, m)).to(qg_ptr.dtype.element_ty), mask=m)
                if STORE_KG:
                    g_last = tl.load(g_base + (start + last) * s_gt + d, mask=dm, other=0.0).to(tl.float32)
                    b_k = tl.load(k_base + ri[:, None] * s_kt + d[None, :], mask=m, other=0.0).to(tl.float32)
                    if HAS_R:
                        b_k = b_k * _row_factor(rk_base, ri, vi, s_rt)[:, None]
                    tl.store(kg_ptr + i_b * s_yb + i_h * s_yh + ri[:, None] * s_yt + d[None, :],
                             (b_k * _masked_exp(g_last[None, :] - b_g, m)).to(kg_ptr.dtype.element_ty), mask=m)


# ------------------------------------------------------------------------------------------------
# output stage: o = scale·(q ⊙ e^G) S_c + Aqk v_new
# ------------------------------------------------------------------------------------------------

@triton.jit
def _key_block(k_base, g_base, cj, d, dm, g_r, s_kt, s_gt):
    """``[len(d), 16]`` fp32 ``k_j e^{G_r − G_j}`` (transposed) of the 16 columns ``cj`` (all valid: they precede
    the row block) over the channels ``d`` (``dm``: inside K), ``g_r`` the reference row's gates."""
    b_kt = tl.load(k_base + cj[None, :] * s_kt + d[:, None], mask=dm[:, None], other=0.0)
    b_gt = tl.load(g_base + cj[None, :] * s_gt + d[:, None], mask=dm[:, None], other=0.0)
    return b_kt.to(tl.float32) * _masked_exp(g_r[:, None] - b_gt.to(tl.float32), dm[:, None])


@triton.jit
def _store_col_block(a_base, m_base, rk_base, ri, vi, cj, eos, c, r_i, rk_i, b_bi, acc, acc_m, scale, s_at, s_mt,
                     s_rt, HAS_R: tl.constexpr, STORE_M: tl.constexpr):
    """Stores one earlier 16-column block ``c`` of ``kda_aqk_fwd_kernel``: ``Aqk = scale·acc`` (and ``M = β_i
    acc_m``), with the l2norm rstd of rows and columns applied when ``HAS_R``."""
    o16 = tl.arange(0, 16)
    if HAS_R:
        rk_j = _row_factor(rk_base, cj, cj < eos, s_rt)
        acc = acc * (r_i[:, None] * rk_j[None, :])
        if STORE_M:
            acc_m = acc_m * (rk_i[:, None] * rk_j[None, :])
    tl.store(a_base + ri[:, None] * s_at + (c * 16 + o16)[None, :], (acc * scale).to(a_base.dtype.element_ty),
             mask=vi[:, None])
    if STORE_M:
        tl.store(m_base + ri[:, None] * s_mt + (c * 16 + o16)[None, :],
                 (acc_m * b_bi[:, None]).to(m_base.dtype.element_ty), mask=vi[:, None])


@triton.jit
def kda_fwd_o_kernel(q_ptr, g_ptr, v_ptr, h_ptr, a_ptr, o_ptr, cu_ptr, idx_ptr, rq_ptr, T, B, HV, GQ, K, V, scale,
                     s_qb, s_qt, s_qh, s_gb, s_gt, s_gh, s_vb, s_vt, s_vh, s_hb, s_hc, s_hh, s_hk,
                     s_ab, s_at, s_ah, s_ob, s_ot, s_oh, s_rb, s_rt, s_rh,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr,
                     HAS_RQ: tl.constexpr = False):
    """One (chunk, value head, V-tile of ``BV``) per program:
    ``o = scale·(q ⊙ e^{G}) S_c + Aqk v_new`` (``Aqk`` lower triangular, scale included), ``q ⊙ e^{G}``
    staged in q's dtype for the product with the state. Program id: flattened
    ``((chunk · B + batch) · HV + head) · NV + V-tile``; ``h`` is indexed by the flattened chunk."""
    i_c, i_b, i_h, start, eos, v0, o_t, rmask, cols, cmask = _chunk_v_tile(T, B, HV, V, cu_ptr, idx_ptr, BT, BV,
                                                                          IS_VARLEN)
    q_c = q_ptr + i_b * s_qb + (i_h // GQ) * s_qh + start * s_qt
    g_c = g_ptr + i_b * s_gb + i_h * s_gh + start * s_gt
    h_c = h_ptr + i_b * s_hb + i_c * s_hc + i_h * s_hh + v0

    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        d = i_k * BK + tl.arange(0, BK)
        dmask = d < K
        m = rmask[:, None] & dmask[None, :]
        b_q = tl.load(q_c + o_t[:, None] * s_qt + d[None, :], mask=m, other=0.0)
        b_g = tl.load(g_c + o_t[:, None] * s_gt + d[None, :], mask=m, other=0.0).to(tl.float32)
        b_qg = (b_q.to(tl.float32) * _masked_exp(b_g, m)).to(b_q.dtype)
        b_h = tl.load(h_c + d[:, None] * s_hk + cols[None, :], mask=dmask[:, None] & cmask[None, :], other=0.0)
        b_o += _mm(b_qg, b_h.to(b_q.dtype))

    causal = (o_t[:, None] >= o_t[None, :]) & rmask[:, None] & rmask[None, :]
    vm = rmask[:, None] & cmask[None, :]
    b_v = tl.load(v_ptr + i_b * s_vb + i_h * s_vh + start * s_vt + v0 + o_t[:, None] * s_vt + cols[None, :],
                  mask=vm, other=0.0)
    b_A = tl.load(a_ptr + i_b * s_ab + i_h * s_ah + start * s_at + o_t[:, None] * s_at + o_t[None, :], mask=causal,
                  other=0.0)
    if HAS_RQ:  # q raw, rq its l2norm rstd
        b_o = b_o * _row_factor(rq_ptr + i_b * s_rb + (i_h // GQ) * s_rh + start * s_rt, o_t, rmask, s_rt)[:, None]
    b_o = b_o * scale + _mm(b_A.to(b_v.dtype), b_v)
    tl.store(o_ptr + i_b * s_ob + i_h * s_oh + start * s_ot + v0 + o_t[:, None] * s_ot + cols[None, :],
             b_o.to(o_ptr.dtype.element_ty), mask=vm)


# ------------------------------------------------------------------------------------------------
# backward: dAqk and the local dv of the intra output term
# ------------------------------------------------------------------------------------------------

@triton.jit
def kda_bwd_dav_kernel(vn_ptr, do_ptr, a_ptr, da_ptr, dv_ptr, cu_ptr, idx_ptr, T, BHV, HV, V, scale,
                       s_nb, s_nt, s_nh, s_ob, s_ot, s_oh, s_ab, s_at, s_ah, s_db, s_dt, s_dh, s_vb, s_vt, s_vh,
                       BT: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr, DA: tl.constexpr, DV: tl.constexpr):
    """Of ``o_i += Σ_{j≤i} Aqk_ij v_new_j`` for one chunk and value head: ``dA_ij = scale·(do_i·v_new_j)``
    (``j ≤ i``, valid; fp32; if ``DA``) and ``dv_j = Σ_{i≥j} Aqk_ij do_i`` (if ``DV``), looping over V tiles."""
    i_c, i_b, i_h, i_hk = _program(BHV, HV, 1)
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    o = tl.arange(0, BT)
    rows = start + o
    valid = rows < eos
    causal = (o[:, None] >= o[None, :]) & valid[:, None] & valid[None, :]
    # At[i, j] = Aqk[j, i], nonzero for i <= j
    b_At = tl.load(a_ptr + i_b * s_ab + i_h * s_ah + rows[None, :] * s_at + o[:, None],
                   mask=(o[:, None] <= o[None, :]) & valid[:, None] & valid[None, :], other=0.0)
    do_base, vn_base = do_ptr + i_b * s_ob + i_h * s_oh, vn_ptr + i_b * s_nb + i_h * s_nh
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        d = i_v * BV + tl.arange(0, BV)
        mr = valid[:, None] & (d < V)[None, :]
        b_do = tl.load(do_base + rows[:, None] * s_ot + d[None, :], mask=mr, other=0.0)
        if DA:
            b_vt = tl.load(vn_base + rows[None, :] * s_nt + d[:, None], mask=(d < V)[:, None] & valid[None, :],
                           other=0.0)
            b_dA += _mm(b_do, b_vt.to(b_do.dtype))
        if DV:
            tl.store(dv_ptr + i_b * s_vb + i_h * s_vh + rows[:, None] * s_vt + d[None, :],
                     _mm(b_At.to(b_do.dtype), b_do).to(dv_ptr.dtype.element_ty), mask=mr)
    if DA:
        tl.store(da_ptr + i_b * s_db + i_h * s_dh + rows[:, None] * s_dt + o[None, :],
                 tl.where(causal, b_dA * scale, 0.0), mask=valid[:, None])


# ------------------------------------------------------------------------------------------------
# chunk_kda_bwd_wy_dqkg_fused (SPEC 1.11.2)
# ------------------------------------------------------------------------------------------------

@triton.jit
def kda_bwd_wy_dqkg_kernel(q_ptr, k_ptr, v_ptr, vn_ptr, g_ptr, beta_ptr, a_ptr, h_ptr, do_ptr, dh_ptr, dv_ptr,
                           dq_ptr, dk_ptr, dvo_ptr, db_ptr, dg_ptr, da_ptr, cu_ptr, idx_ptr,
                           T, BHV, HV, GRP, K, V, scale,
                           s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_nb, s_nt, s_nh,
                           s_gb, s_gt, s_gh, s_bb, s_bt, s_bh, s_ab, s_at, s_ah, s_hb, s_hc, s_hh, s_hk,
                           s_ob, s_ot, s_oh, s_eb, s_ec, s_eh, s_ek, s_wb, s_wt, s_wh,
                           s_xb, s_xt, s_xh, s_yb, s_yt, s_yh, s_zb, s_zt, s_zh, s_db, s_dt, s_dh,
                           BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr):
    """SPEC 1.11.2 for one chunk and value head (``T = A``, ``S = h[c]``, ``dS = dh[c]``, ``dV = dv``).

    V pass: ``dv = β ⊙ TᵀdV``, ``db = Σ v ⊙ TᵀdV``, ``dT = dV (β v)ᵀ``. K pass (``BK`` blocks, each
    with a V loop over the state tiles): ``dq = scale e^{G} ⊙ (do Sᵀ)``, ``dks = e^{Γ−G} ⊙ (v_new dSᵀ)``,
    ``dw = −dV Sᵀ``, ``dT += dw (β e^G k)ᵀ``, ``dk = dks + β e^G ⊙ Tᵀdw``, ``db += (e^G ⊙ k)·Tᵀdw``,
    ``dg = q ⊙ dq − k ⊙ dks + β e^G k ⊙ Tᵀdw`` plus ``e^{Γ} ⊙ Σ_v S ⊙ dS + Σ_j k_j ⊙ dks_j`` at the last
    valid row. Then ``dA = −Tᵀ dT Tᵀ`` (strictly lower). ``dq``, ``dk``, ``dg``, ``db``, ``dA`` fp32 per
    value head (``dq``, ``dk``, ``dg`` share one layout)."""
    i_c, i_b, i_h, i_hk = _program(BHV, HV, GRP)
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    o = tl.arange(0, BT)
    rows = start + o
    valid = rows < eos
    m2 = valid[:, None] & valid[None, :]
    last = tl.minimum(eos - start, BT) - 1
    DT = k_ptr.dtype.element_ty
    # Tt[i, j] = T[j, i]: only feeds products, held in the dot operand dtype
    b_Tt = tl.load(a_ptr + i_b * s_ab + i_h * s_ah + rows[None, :] * s_at + o[:, None], mask=m2,
                   other=0.0).to(tl.float32).to(DT)
    b_beta = tl.load(beta_ptr + i_b * s_bb + rows * s_bt + i_h * s_bh, mask=valid, other=0.0).to(tl.float32)
    b_db = tl.zeros([BT], dtype=tl.float32)
    b_dT = tl.zeros([BT, BT], dtype=tl.float32)

    v_base = v_ptr + i_b * s_vb + i_h * s_vh
    vn_base = vn_ptr + i_b * s_nb + i_h * s_nh
    do_base = do_ptr + i_b * s_ob + i_h * s_oh
    dv_base = dv_ptr + i_b * s_wb + i_h * s_wh
    for i_v in range(0, tl.cdiv(V, BV)):
        e = i_v * BV + tl.arange(0, BV)
        em = e < V
        mr = valid[:, None] & em[None, :]
        b_dV = tl.load(dv_base + rows[:, None] * s_wt + e[None, :], mask=mr, other=0.0).to(tl.float32)
        b_v = tl.load(v_base + rows[:, None] * s_vt + e[None, :], mask=mr, other=0.0).to(tl.float32)
        b_vt = tl.load(v_base + rows[None, :] * s_vt + e[:, None], mask=em[:, None] & valid[None, :],
                       other=0.0).to(tl.float32)
        b_TdV = _dot(b_Tt, b_dV, DT)
        tl.store(dvo_ptr + i_b * s_yb + i_h * s_yh + rows[:, None] * s_yt + e[None, :],
                 (b_beta[:, None] * b_TdV).to(dvo_ptr.dtype.element_ty), mask=mr)
        b_db += tl.sum(b_v * b_TdV, 1)
        b_dT += _dot(b_dV, b_vt * b_beta[None, :], DT)

    q_base = q_ptr + i_b * s_qb + i_hk * s_qh
    k_base = k_ptr + i_b * s_kb + i_hk * s_kh
    g_base = g_ptr + i_b * s_gb + i_h * s_gh
    h_c = h_ptr + i_b * s_hb + i_c * s_hc + i_h * s_hh
    dh_c = dh_ptr + i_b * s_eb + i_c * s_ec + i_h * s_eh
    x_off = i_b * s_xb + i_h * s_xh + rows[:, None] * s_xt
    for i_k in range(0, tl.cdiv(K, BK)):
        d = i_k * BK + tl.arange(0, BK)
        dm = d < K
        mr = valid[:, None] & dm[None, :]
        mc = dm[:, None] & valid[None, :]
        b_dq = tl.zeros([BT, BK], dtype=tl.float32)
        b_dks = tl.zeros([BT, BK], dtype=tl.float32)
        b_dw = tl.zeros([BT, BK], dtype=tl.float32)
        b_sds = tl.zeros([BK], dtype=tl.float32)
        for i_v in range(0, tl.cdiv(V, BV)):
            e = i_v * BV + tl.arange(0, BV)
            em = e < V
            mh = em[:, None] & dm[None, :]
            mv = valid[:, None] & em[None, :]
            # St[v, k] = S[k, v], loaded transposed
            b_St = tl.load(h_c + d[None, :] * s_hk + e[:, None], mask=mh, other=0.0)
            b_dSt = tl.load(dh_c + d[None, :] * s_ek + e[:, None], mask=mh, other=0.0)
            b_do = tl.load(do_base + rows[:, None] * s_ot + e[None, :], mask=mv, other=0.0)
            b_vn = tl.load(vn_base + rows[:, None] * s_nt + e[None, :], mask=mv, other=0.0)
            b_dV = tl.load(dv_base + rows[:, None] * s_wt + e[None, :], mask=mv, other=0.0)
            b_dq += _dot(b_do, b_St, DT)
            b_dks += _dot(b_vn, b_dSt, DT)
            b_dw += _dot(b_dV, b_St, DT)
            b_sds += tl.sum(b_St.to(tl.float32) * b_dSt.to(tl.float32), 0)
        b_q = tl.load(q_base + rows[:, None] * s_qt + d[None, :], mask=mr, other=0.0).to(tl.float32)
        b_k = tl.load(k_base + rows[:, None] * s_kt + d[None, :], mask=mr, other=0.0).to(tl.float32)
        b_g = tl.load(g_base + rows[:, None] * s_gt + d[None, :], mask=mr, other=0.0).to(tl.float32)
        g_last = tl.load(g_base + (start + last) * s_gt + d, mask=dm, other=0.0).to(tl.float32)
        b_eg = _masked_exp(b_g, mr)
        b_dq = scale * b_eg * b_dq
        b_dks = _masked_exp(g_last[None, :] - b_g, mr) * b_dks
        b_dw = -b_dw
        b_kt = tl.load(k_base + rows[None, :] * s_kt + d[:, None], mask=mc, other=0.0).to(tl.float32)
        b_gt = tl.load(g_base + rows[None, :] * s_gt + d[:, None], mask=mc, other=0.0).to(tl.float32)
        b_dT += _dot(b_dw, b_kt * _masked_exp(b_gt, mc) * b_beta[None, :], DT)
        b_Tdw = _dot(b_Tt, b_dw, DT)
        b_bg = b_beta[:, None] * b_eg
        b_dk = b_dks + b_bg * b_Tdw
        b_db += tl.sum(b_eg * b_k * b_Tdw, 1)
        b_dg = b_q * b_dq - b_k * b_dks + b_k * b_bg * b_Tdw
        extra = exp_fast_f32(g_last) * b_sds + tl.sum(b_k * b_dks, 0)
        b_dg += tl.where(o[:, None] == last, extra[None, :], 0.0)
        tl.store(dq_ptr + x_off + d[None, :], b_dq, mask=mr)
        tl.store(dk_ptr + x_off + d[None, :], b_dk, mask=mr)
        tl.store(dg_ptr + x_off + d[None, :], b_dg, mask=mr)

    b_dM = -_dot(b_Tt, _dot(b_dT, b_Tt, DT), DT)
    lower = (o[:, None] > o[None, :]) & m2
    tl.store(da_ptr + i_b * s_db + i_h * s_dh + rows[:, None] * s_dt + o[None, :], tl.where(lower, b_dM, 0.0),
             mask=valid[:, None])
    tl.store(db_ptr + i_b * s_zb + i_h * s_zh + rows * s_zt, b_db, mask=valid)


# ------------------------------------------------------------------------------------------------
# backward: intra-chunk paths through Aqk and M
# ------------------------------------------------------------------------------------------------

@triton.jit
def kda_bwd_intra_kernel(q_ptr, k_ptr, g_ptr, beta_ptr, daq_ptr, dam_ptr, dq_ptr, dk_ptr, dg_ptr, db_ptr,
                         cu_ptr, idx_ptr, T, BHV, HV, GRP,
                         s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
                         s_ab, s_at, s_ah, s_xb, s_xt, s_xh, s_zk, s_zb, s_zt, s_zh,
                         K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Adds the intra-chunk gradients of one chunk, value head, 16-row block and ``BK`` channels to ``dq, dk,
    dg`` (fp32, per value head, updated in place) and its channels' share of ``db`` to ``db[i_k]`` (fp32,
    ``s_zk`` apart per key tile; updated in place), given ``dAq`` (cotangent of ``Aqk/scale``, ``j ≤ i``) and
    ``dAm`` (of ``M``, ``j < i``), both fp32 with the layout of ``A``; ``E_ij = e^{G_i − G_j}`` per channel:

    rows: ``Rq_i = Σ_{j≤i} dAq_ij E_ij ⊙ k_j``, ``Rk_i = Σ_{j<i} dAm_ij E_ij ⊙ k_j``;
    columns: ``C_j = Σ_{i≥j} E_ij ⊙ (dAq_ij q_i + dAm_ij β_i k_i)``;
    ``dq += Rq``, ``dk += β Rk + C``, ``db += k·Rk``, ``dg += q ⊙ Rq + β k ⊙ Rk − k ⊙ C``.

    Grid ``(chunks · B · HV, BT / 16, ⌈K / BK⌉)``: every output element belongs to one program (the
    channels are independent but for ``db``'s dot product, hence its per-tile partial sums). For the block
    starting at ``r``: the row sums over earlier columns use the reference ``r`` (``e^{G_i − G_r}`` x
    ``e^{G_r − G_j}``); the column sums over later rows use the reference ``r + 16``, the first row of those
    rows (``e^{G_i − G_{r+16}}`` x ``e^{G_{r+16} − G_j}``). Pairs inside the block: those of its four 4x4
    diagonal groups get the exact masked exponential, one group row at a time on ``[16, BK]`` tiles, with no
    reductions (a ``[16, 16, BK]`` per-pair tensor and its 3D sums made this kernel 7.6 of a 13 ms KDA training
    step at T = 8192, H200; one program per chunk and head looping over the blocks and tiles, 2.3 ms); the
    others go by products in two halvings (``_bwd_diag_level``). H200, B1 T8192 H16, thirty-second session
    (``tune_kda.py --only intra_bwd``, 110 µs of buffer copies included): 686 µs against 728 with one round of
    products per later 4-row group; exact 2x2 groups under a third halving 753 µs (400 bytes of spill)."""
    i_b, i_h, i_hk, bi, start, eos, r0 = _row_block(BHV, HV, GRP, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    i_k = tl.program_id(2)
    if r0 < eos:
        o = tl.arange(0, BT)
        o16 = tl.arange(0, 16)
        rows = start + o
        valid = rows < eos
        DT = k_ptr.dtype.element_ty
        q_base = q_ptr + i_b * s_qb + i_hk * s_qh
        k_base = k_ptr + i_b * s_kb + i_hk * s_kh
        g_base = g_ptr + i_b * s_gb + i_h * s_gh
        aq_base = daq_ptr + i_b * s_ab + i_h * s_ah
        am_base = dam_ptr + i_b * s_ab + i_h * s_ah
        ri = r0 + o16
        vi = ri < eos
        b_bi = tl.load(beta_ptr + i_b * s_bb + ri * s_bt + i_h * s_bh, mask=vi, other=0.0).to(tl.float32)
        d = i_k * BK + tl.arange(0, BK)
        dm = d < K
        mi = vi[:, None] & dm[None, :]
        b_qa = tl.load(q_base + ri[:, None] * s_qt + d[None, :], mask=mi, other=0.0).to(tl.float32)
        b_ka = tl.load(k_base + ri[:, None] * s_kt + d[None, :], mask=mi, other=0.0).to(tl.float32)
        b_ga = tl.load(g_base + ri[:, None] * s_gt + d[None, :], mask=mi, other=0.0).to(tl.float32)
        b_Rq = tl.zeros([16, BK], dtype=tl.float32)
        b_Rk = tl.zeros([16, BK], dtype=tl.float32)
        b_C = tl.zeros([16, BK], dtype=tl.float32)
        grp = o16 // 4
        in_g = o16 % 4
        # pairs inside the 4x4 diagonal groups first (so the accumulators enter the loop in the elementwise
        # layout: after the dot products they come in the MMA layout, and each step cost three shared-memory
        # conversions), exact per-pair exponentials and no reductions: step t takes for every block row x the
        # t-th row y of x's group, as the column of Rq/Rk (x >= y) and as the row of C (y >= x)
        for t in range(4):
            # every per-row operand is loaded 2D ([16, BK] rows, [16, 1] columns): 1D loads took a layout of
            # their own and cost shared-memory conversions (and barriers) every step on sm_90
            y = r0 + grp * 4 + t
            ok_y = (y < eos)[:, None]
            my = ok_y & dm[None, :]
            k_y = tl.load(k_base + y[:, None] * s_kt + d[None, :], mask=my, other=0.0).to(tl.float32)
            q_y = tl.load(q_base + y[:, None] * s_qt + d[None, :], mask=my, other=0.0).to(tl.float32)
            g_y = tl.load(g_base + y[:, None] * s_gt + d[None, :], mask=my, other=0.0).to(tl.float32)
            b_y = tl.load(beta_ptr + i_b * s_bb + y[:, None] * s_bt + i_h * s_bh, mask=ok_y,
                          other=0.0).to(tl.float32)
            # coefficients dA[x, y] (x >= y; j <= i for dAq, j < i for dAm) and dA[y, x] (y >= x)
            col = ri[:, None] * s_at + (bi * 16 + grp * 4 + t)[:, None]
            aq_c = tl.load(aq_base + col, mask=(vi & (in_g >= t))[:, None] & ok_y, other=0.0)
            am_c = tl.load(am_base + col, mask=(vi & (in_g > t))[:, None] & ok_y, other=0.0)
            row = y[:, None] * s_at + (bi * 16 + o16)[:, None]
            aq_r = tl.load(aq_base + row, mask=(in_g <= t)[:, None] & ok_y, other=0.0)
            am_r = tl.load(am_base + row, mask=(in_g < t)[:, None] & ok_y, other=0.0)
            # one exponential per entry for both directions: e^{G_x − G_y} where y <= x (Rq, Rk), e^{G_y − G_x}
            # where y >= x (C; at x = y both are 1), arguments masked to valid rows, so every exp is <= 1 or of 0;
            # the other direction's entries meet a zero factor (masked loads) and need no outer where
            e = exp_fast_f32(tl.where((in_g >= t)[:, None], tl.where(vi[:, None], b_ga - g_y, 0.0),
                                      tl.where(ok_y, g_y - b_ga, 0.0)))
            e_c = e * k_y
            b_Rq += aq_c * e_c
            b_Rk += am_c * e_c
            b_C += e * (aq_r * q_y + (am_r * b_y) * k_y)
        # pairs across the 4-row groups of the block in two halvings, as the forward's diagonal block: the
        # lower-left 8x8 quarter, then both 8-row halves' lower-left 4x4 quarters, each by products through its
        # row sub-block's first row c (e^{G_x − G_c} x e^{G_c − G_j}, both <= 1: SPEC 1.11's off-diagonal rule
        # one level down); two rounds of products instead of one per later 4-row group (three)
        lo = vi[:, None] & vi[None, :]
        aq_d = tl.load(aq_base + ri[:, None] * s_at + (bi * 16 + o16)[None, :], mask=lo, other=0.0)
        am_d = tl.load(am_base + ri[:, None] * s_at + (bi * 16 + o16)[None, :], mask=lo, other=0.0)
        aq_t = tl.load(aq_base + ri[None, :] * s_at + (bi * 16 + o16)[:, None], mask=lo, other=0.0)
        am_t = tl.load(am_base + ri[None, :] * s_at + (bi * 16 + o16)[:, None], mask=lo, other=0.0)
        b_Rq, b_Rk, b_C = _bwd_diag_level(b_qa, b_ka, b_bi, b_ga, g_base, r0, eos, d, dm, s_gt, aq_d, am_d, aq_t,
                                          am_t, b_Rq, b_Rk, b_C, 8, DT == tl.float32)
        b_Rq, b_Rk, b_C = _bwd_diag_level(b_qa, b_ka, b_bi, b_ga, g_base, r0, eos, d, dm, s_gt, aq_d, am_d, aq_t,
                                          am_t, b_Rq, b_Rk, b_C, 4, DT == tl.float32)
        # earlier columns j, one 16-row block at a time (small tiles keep the registers, hence the occupancy,
        # reasonable: whole [BT, BK] tiles took ~235 registers a thread): Rq, Rk += e^{G_i − G_r} ⊙ dA[i, j]
        # (k_j e^{G_r − G_j}), reference r = the block's first row
        if bi > 0:
            g_r = tl.load(g_base + r0 * s_gt + d, mask=dm, other=0.0).to(tl.float32)
            acc_q = tl.zeros([16, BK], dtype=tl.float32)
            acc_k = tl.zeros([16, BK], dtype=tl.float32)
            for jb in range(0, bi):
                rj = start + jb * 16 + o16  # < r0 < eos: valid
                mj = dm[None, :] & (rj >= 0)[:, None]
                b_k = tl.load(k_base + rj[:, None] * s_kt + d[None, :], mask=mj, other=0.0).to(tl.float32)
                b_g = tl.load(g_base + rj[:, None] * s_gt + d[None, :], mask=mj, other=0.0).to(tl.float32)
                b_kj = b_k * exp_fast_f32(tl.where(mj, g_r[None, :] - b_g, 0.0))
                a_off = ri[:, None] * s_at + (jb * 16 + o16)[None, :]
                b_aq = tl.load(aq_base + a_off, mask=vi[:, None], other=0.0)
                b_am = tl.load(am_base + a_off, mask=vi[:, None], other=0.0)
                acc_q += _dot(b_aq, b_kj, DT)
                acc_k += _dot(b_am, b_kj, DT)
            fac = _masked_exp(b_ga - g_r[None, :], mi)
            b_Rq += fac * acc_q
            b_Rk += fac * acc_k
        # later rows i, one 16-row block at a time: C_j += e^{G_s − G_j} ⊙ Σ_i dA[i, j] (e^{G_i − G_s} ⊙ (q_i,
        # β_i k_i)), reference s = r + 16, the first later row
        r1 = r0 + 16
        if (r1 < eos) & (bi < BT // 16 - 1):  # (r1 past the chunk: another chunk's G, e^{G_s − G_j} may overflow)
            g_r1 = tl.load(g_base + r1 * s_gt + d, mask=dm, other=0.0).to(tl.float32)
            acc_c = tl.zeros([16, BK], dtype=tl.float32)
            for ib in range(bi + 1, BT // 16):
                rz = start + ib * 16 + o16
                vz = rz < eos
                mz = vz[:, None] & dm[None, :]
                b_q = tl.load(q_base + rz[:, None] * s_qt + d[None, :], mask=mz, other=0.0).to(tl.float32)
                b_k = tl.load(k_base + rz[:, None] * s_kt + d[None, :], mask=mz, other=0.0).to(tl.float32)
                b_g = tl.load(g_base + rz[:, None] * s_gt + d[None, :], mask=mz, other=0.0).to(tl.float32)
                b_bz = tl.load(beta_ptr + i_b * s_bb + rz * s_bt + i_h * s_bh, mask=vz, other=0.0).to(tl.float32)
                e1 = _masked_exp(b_g - g_r1[None, :], mz)
                # dA[i, j] transposed: rows j of this block, columns i of block ib
                t_off = rz[None, :] * s_at + (bi * 16 + o16)[:, None]
                mt2 = vi[:, None] & vz[None, :]
                b_aqt = tl.load(aq_base + t_off, mask=mt2, other=0.0)
                b_amt = tl.load(am_base + t_off, mask=mt2, other=0.0)
                acc_c += _dot(b_aqt, b_q * e1, DT) + _dot(b_amt, b_k * e1 * b_bz[:, None], DT)
            b_C += _masked_exp(g_r1[None, :] - b_ga, mi) * acc_c
        x_off = i_b * s_xb + i_h * s_xh + ri[:, None] * s_xt + d[None, :]
        b_dq = tl.load(dq_ptr + x_off, mask=mi, other=0.0) + b_Rq
        b_dk = tl.load(dk_ptr + x_off, mask=mi, other=0.0) + b_bi[:, None] * b_Rk + b_C
        b_dg = tl.load(dg_ptr + x_off, mask=mi, other=0.0) + b_qa * b_Rq + b_bi[:, None] * b_ka * b_Rk - b_ka * b_C
        tl.store(dq_ptr + x_off, b_dq, mask=mi)
        tl.store(dk_ptr + x_off, b_dk, mask=mi)
        tl.store(dg_ptr + x_off, b_dg, mask=mi)
        # int64 tile offset: NK·B·T·HV may pass 2^31
        z_off = db_ptr + i_k.to(tl.int64) * s_zk + i_b * s_zb + i_h * s_zh + ri * s_zt
        tl.store(z_off, tl.load(z_off, mask=vi, other=0.0) + tl.sum(b_ka * b_Rk, 1), mask=vi)


@triton.jit
def _bwd_diag_level(b_q, b_k, b_b, b_g, g_base, r0, eos, d, dm, s_gt, aq_d, am_d, aq_t, am_t, b_Rq, b_Rk, b_C,
                    H: tl.constexpr, EXACT: tl.constexpr):
    """One level of ``kda_bwd_intra_kernel``'s diagonal block: the pairs ``(x, j)`` with ``x`` in the upper and
    ``j`` in the lower ``H`` rows of the same ``2H``-row group, through the upper half's first row ``c``
    (``E_xj = e^{G_x − G_c} e^{G_c − G_j}``, both ``<= 1``): adds ``Rq_x += Σ_j dAq_xj E_xj ⊙ k_j``, ``Rk_x`` the
    same with ``dAm``, and ``C_j += Σ_x E_xj ⊙ (dAq_xj q_x + dAm_xj β_x k_x)``. ``b_q, b_k, b_g``: the block's ``[16, BK]``
    fp32 tiles, ``b_b``: its ``[16]`` β; ``aq_d, am_d`` its ``[16, 16]`` cotangents ``[x, j]``, ``aq_t, am_t``
    transposed; products IEEE for fp32 inputs, else TF32."""
    o16 = tl.arange(0, 16)
    half = o16 % (2 * H)
    same = (o16 // (2 * H))[:, None] == (o16 // (2 * H))[None, :]
    m_x = ((half >= H) & (r0 + o16 < eos))[:, None] & dm[None, :]
    g_cx = tl.load(g_base + (r0 + (o16 // H) * H)[:, None] * s_gt + d[None, :], mask=m_x, other=0.0).to(tl.float32)
    f_x = _masked_exp(b_g - g_cx, m_x)  # e^{G_x − G_c}, upper rows
    c_j = r0 + (o16 // H + 1) * H  # the column's reference: the first row of the next H-row half
    m_j = ((half < H) & (c_j < eos))[:, None] & dm[None, :]
    g_cj = tl.load(g_base + c_j[:, None] * s_gt + d[None, :], mask=m_j, other=0.0).to(tl.float32)
    e_j = _masked_exp(g_cj - b_g, m_j)  # e^{G_c − G_j}, lower rows
    pair = (half >= H)[:, None] & (half < H)[None, :] & same  # [x, j]
    pair_t = (half < H)[:, None] & (half >= H)[None, :] & same  # [j, x]
    b_kj = b_k * e_j
    b_Rq += f_x * _dot_f32(tl.where(pair, aq_d, 0.0), b_kj, EXACT)
    b_Rk += f_x * _dot_f32(tl.where(pair, am_d, 0.0), b_kj, EXACT)
    b_C += e_j * (_dot_f32(tl.where(pair_t, aq_t, 0.0), b_q * f_x, EXACT)
                  + _dot_f32(tl.where(pair_t, am_t, 0.0), b_k * f_x * b_b[:, None], EXACT))
    return b_Rq, b_Rk, b_C


@triton.jit
def _diag_level(b_q, b_k, b_g, b_kt, b_gt, g_base, r0, eos, d, dm, s_gt, d_q, d_m, H: tl.constexpr,
                STORE_M: tl.constexpr, EXACT: tl.constexpr):
    """One level of ``_diag_block``: the pairs ``(i, j)`` of the block with ``i`` in the upper and ``j`` in the
    lower ``H`` rows of the same ``2H``-row group, by one product through the upper half's first row ``c``:
    ``(q_i e^{G_i − G_c}) · (k_j e^{G_c − G_j})``, both factors ``<= 1`` (``c`` is the first row of the row
    sub-block: SPEC 1.11's off-diagonal rule); written into ``d_q`` (``d_m``) on those pairs only (``tl.where``:
    a factor overflowed by gates outside SPEC 1.11 stays on its own pairs)."""
    o16 = tl.arange(0, 16)
    up = (o16 % (2 * H) >= H) & (r0 + o16 < eos)
    c_i = r0 + (o16 // H) * H  # the row's reference: the first row of its H-row half
    m_i = up[:, None] & dm[None, :]
    g_ci = tl.load(g_base + c_i[:, None] * s_gt + d[None, :], mask=m_i, other=0.0).to(tl.float32)
    f_i = _masked_exp(b_g - g_ci, m_i)
    c_j = r0 + (o16 // H + 1) * H  # the column's reference: the first row of the next H-row half
    lo = (o16 % (2 * H) < H) & (c_j < eos)
    m_j = dm[:, None] & lo[None, :]
    g_cj = tl.load(g_base + c_j[None, :] * s_gt + d[:, None], mask=m_j, other=0.0).to(tl.float32)
    b_kj = b_kt * _masked_exp(g_cj - b_gt, m_j)
    pair = (o16 % (2 * H) >= H)[:, None] & (o16 % (2 * H) < H)[None, :] & \
        ((o16 // (2 * H))[:, None] == (o16 // (2 * H))[None, :])
    d_q = tl.where(pair, _dot_f32(b_q * f_i, b_kj, EXACT), d_q)
    if STORE_M:
        d_m = tl.where(pair, _dot_f32(b_k * f_i, b_kj, EXACT), d_m)
    return d_q, d_m


@triton.jit
def _diag_block(k_base, g_base, b_q, b_k, b_g, r0, eos, d, dm, s_kt, s_gt, STORE_M: tl.constexpr,
                EXACT: tl.constexpr):
    """One key tile's share of a diagonal 16x16 block of ``kda_aqk_fwd_kernel``: ``[16, 16]`` fp32
    ``Σ_d q_{i,d} k_{t,d} e^{G_{i,d} − G_{t,d}}`` for ``t ≤ i`` (and the same with ``k_i`` for ``M`` when
    ``STORE_M``; the caller masks M's diagonal), rows ``r0 + i``. ``b_q, b_k, b_g``: the block's ``[16, BK]``
    fp32 tiles (invalid rows zero).

    Two halvings, then exact groups: the lower-left 8x8 quarter and the lower-left 4x4 quarters of both 8-row
    halves are off-diagonal sub-blocks, one product each through its row sub-block's first row (``_diag_level``,
    IEEE for fp32 inputs, else TF32: the factored operands round to 10 mantissa bits, finer than the 16-bit
    operands of the earlier column blocks' products); the four 4x4 diagonal groups get the
    exact masked ``e^{G_x − G_y}`` per pair, four ``[16, BK]`` steps (step ``t``: each row against the ``t``-th
    row of its group). H200, B1 T8192 H16, thirty-first session (``tune_kda.py --only aqk``): the kernel took
    259 µs against 301 with exact 8x8 quarters (8 steps of ``[2, 8, BK]`` exponentials and sums: half of the
    kernel) and 317-459 µs with every level down to the diagonal as products (no reductions, but 255 registers
    and 140-300 bytes of spill at one warp).
    """
    o16 = tl.arange(0, 16)
    rows = r0 + o16
    m_t = dm[:, None] & (rows < eos)[None, :]
    b_kt = tl.load(k_base + rows[None, :] * s_kt + d[:, None], mask=m_t, other=0.0).to(tl.float32)
    b_gt = tl.load(g_base + rows[None, :] * s_gt + d[:, None], mask=m_t, other=0.0).to(tl.float32)
    d_q = tl.zeros([16, 16], dtype=tl.float32)
    d_m = tl.zeros([16, 16], dtype=tl.float32)
    d_q, d_m = _diag_level(b_q, b_k, b_g, b_kt, b_gt, g_base, r0, eos, d, dm, s_gt, d_q, d_m, 8, STORE_M, EXACT)
    d_q, d_m = _diag_level(b_q, b_k, b_g, b_kt, b_gt, g_base, r0, eos, d, dm, s_gt, d_q, d_m, 4, STORE_M, EXACT)
    grp = o16 // 4
    in_g = o16 % 4
    for t in range(4):  # the 4x4 diagonal groups, exact: step t, column y = the t-th row of the row's group
        y = r0 + grp * 4 + t
        m = ((in_g >= t) & (rows < eos))[:, None] & dm[None, :]
        k_y = tl.load(k_base + y[:, None] * s_kt + d[None, :], mask=m, other=0.0).to(tl.float32)
        g_y = tl.load(g_base + y[:, None] * s_gt + d[None, :], mask=m, other=0.0).to(tl.float32)
        e = _masked_exp(b_g - g_y, m) * k_y
        at = o16[None, :] == (grp * 4 + t)[:, None]
        d_q = tl.where(at, tl.sum(b_q * e, 1)[:, None], d_q)
        if STORE_M:
            d_m = tl.where(at, tl.sum(b_k * e, 1)[:, None], d_m)
    return d_q, d_m
