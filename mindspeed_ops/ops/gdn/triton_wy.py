"""Triton kernels of GDN stages 1.10.2 (``chunk_scaled_dot_kkt_fwd``) and 1.10.4
(``recompute_w_u_fwd``, ``prepare_wy_repr_bwd``), and the forward's fused 1.10.2 + 1.10.3
(``kkt_solve_fwd_kernel``: A formed in registers, then inverted as ``solve_tril_kernel`` does). Kernels
only: launchers live in ``kkt.py``, ``wy_fast.py`` and ``kkt_solve.py``.

One program per (chunk, batch row, value head), flattened onto grid axis 0 as
``pid = chunk · (B·HV) + b · HV + head``; the chunk's first token and its sequence end come from
``_chunk_bounds`` (varlen through ``chunk_indices``). Tensors are addressed through their strides
with int64 offsets; rows past the sequence end are neither read (masked loads) nor written.

Products: ``tl.dot`` on ``[BT, BK] x [BK, BT]``-type tiles (the fused kernel: ``[16, BK] x [BK, 16]``
blocks of A) with fp32 accumulation. The operands are
cast to the dtype of the key (value) input: fp32 inputs give IEEE fp32 products (no TF32, SPEC 0.5),
fp16/bf16 inputs use the tensor cores. No ``tl.trans`` anywhere: a transposed operand is loaded
transposed from memory, and where a transposed *computed* matrix is needed (``dMᵀ`` in the
backward) it is computed directly (``dMᵀ = −T·dTᵀ·T``); transposing a dot result in registers is
the pattern Triton 3.4-3.7 miscompiles on Hopper.

Gates: every ``exp`` is of a masked argument (``where(mask, G_i − G_j, 0)`` then masked again), so
out-of-range loads never meet in-range values and strong decay never overflows.
"""
import triton
import triton.language as tl

from .triton_kernels import _chunk_bounds, _inv_diag16_all, _merge_store16, _place16, _row_factor


@triton.jit
def _dot(a, b, DT: tl.constexpr):
    """``a @ b`` with operands in ``DT`` and fp32 accumulation (IEEE when ``DT`` is fp32)."""
    return tl.dot(a.to(DT), b.to(DT), input_precision="ieee")


@triton.jit
def _program(BHV, HV, GRP):
    """(chunk, batch row, value head, q/k head) of this program (int64)."""
    pid = tl.program_id(0).to(tl.int64)
    i_c = pid // BHV
    i_bh = pid % BHV
    i_h = i_bh % HV
    return i_c, i_bh // HV, i_h, i_h // GRP


# ------------------------------------------------------------------------------------------------
# chunk_scaled_dot_kkt_fwd (SPEC 1.10.2)
# ------------------------------------------------------------------------------------------------

@triton.jit
def _kkt_rows(g_base, b_base, r_base, rows, valid, s_gt, s_bt, s_rt,
              HAS_G: tl.constexpr, HAS_BETA: tl.constexpr, HAS_RK: tl.constexpr):
    """Per-row fp32 factors of ``A`` for the tokens ``rows`` (0 where not ``valid``): the gate ``G``, ``β``
    and the l2norm ``rstd`` of k (zeros for the ones not given; ``_kkt_gate`` then skips them)."""
    b_g = tl.zeros(rows.shape, dtype=tl.float32)
    b_beta = b_g
    b_r = b_g
    if HAS_G:
        b_g = tl.load(g_base + rows * s_gt, mask=valid, other=0.0).to(tl.float32)
    if HAS_BETA:
        b_beta = tl.load(b_base + rows * s_bt, mask=valid, other=0.0).to(tl.float32)
    if HAS_RK:
        b_r = _row_factor(r_base, rows, valid, s_rt)
    return b_g, b_beta, b_r


@triton.jit
def _kkt_gate(acc, g_i, g_j, beta_i, r_i, r_j, lower,
              HAS_G: tl.constexpr, HAS_BETA: tl.constexpr, HAS_RK: tl.constexpr):
    """``A = β_i (k_i·k_j) e^{G_i − G_j} r_i r_j`` on ``lower`` (strictly lower, valid rows and columns),
    exact 0 elsewhere, from the fp32 products ``acc = k_i·k_j`` and row (``_i``, ``[n, 1]``) / column
    (``_j``, ``[1, n]``) factors. The gate difference is masked before the ``exp`` (SPEC 1.10). The one
    formula of the scalar-gate ``A``: ``kkt_fwd_kernel`` applies it to the whole chunk, the fused
    ``kkt_solve_fwd_kernel`` to each 16x16 block (same operations, same order)."""
    if HAS_G:
        acc = acc * tl.exp(tl.where(lower, g_i - g_j, 0.0))
    if HAS_BETA:
        acc = acc * beta_i
    if HAS_RK:
        acc = acc * (r_i * r_j)
    return tl.where(lower, acc, 0.0)


@triton.jit
def kkt_fwd_kernel(k_ptr, g_ptr, beta_ptr, a_ptr, cu_ptr, idx_ptr, rk_ptr, T, BHV, HV, GRP,
                   s_kb, s_kt, s_kh, s_kd, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh, s_ab, s_at, s_ah, s_ac,
                   s_rb, s_rt, s_rh,
                   K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, HAS_G: tl.constexpr,
                   HAS_BETA: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_RK: tl.constexpr = False):
    """``A[i, j] = β_i (k_i·k_j) e^{G_i − G_j}`` for ``j < i`` (valid), else 0, of one chunk and value
    head (scalar gate or none). ``k kᵀ`` by ``tl.dot`` over ``BK``-wide key tiles."""
    i_c, i_b, i_h, i_hk = _program(BHV, HV, GRP)
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    o = tl.arange(0, BT)
    rows = start + o
    valid = rows < eos
    k_base = k_ptr + i_b * s_kb + i_hk * s_kh
    acc = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range((K + BK - 1) // BK):
        d = i_k * BK + tl.arange(0, BK)
        dm = d < K
        b_k = tl.load(k_base + rows[:, None] * s_kt + d[None, :] * s_kd, mask=valid[:, None] & dm[None, :], other=0.0)
        b_kt = tl.load(k_base + rows[None, :] * s_kt + d[:, None] * s_kd, mask=dm[:, None] & valid[None, :],
                       other=0.0)
        acc += _dot(b_k, b_kt, k_ptr.dtype.element_ty)
    lower = (o[:, None] > o[None, :]) & valid[:, None] & valid[None, :]
    b_g, b_beta, b_r = _kkt_rows(g_ptr + i_b * s_gb + i_h * s_gh, beta_ptr + i_b * s_bb + i_h * s_bh,
                                 rk_ptr + i_b * s_rb + i_hk * s_rh, rows, valid, s_gt, s_bt, s_rt,
                                 HAS_G, HAS_BETA, HAS_RK)
    acc = _kkt_gate(acc, b_g[:, None], b_g[None, :], b_beta[:, None], b_r[:, None], b_r[None, :], lower,
                    HAS_G, HAS_BETA, HAS_RK)
    tl.store(a_ptr + i_b * s_ab + i_h * s_ah + rows[:, None] * s_at + o[None, :] * s_ac,
             acc.to(a_ptr.dtype.element_ty), mask=valid[:, None])


@triton.jit
def kkt_gk_fwd_kernel(k_ptr, g_ptr, beta_ptr, a_ptr, cu_ptr, idx_ptr, rk_ptr, T, BHV, HV, GRP,
                      s_kb, s_kt, s_kh, s_kd, s_gb, s_gt, s_gh, s_gd, s_bb, s_bt, s_bh, s_ab, s_at, s_ah, s_ac,
                      s_rb, s_rt, s_rh,
                      K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, HAS_BETA: tl.constexpr,
                      IS_VARLEN: tl.constexpr, HAS_RK: tl.constexpr = False):
    """Per-channel gates: ``A[i, j] = β_i Σ_d k_{i,d} k_{j,d} e^{G_{i,d} − G_{j,d}}`` for ``j < i``.

    Rows in 16-row blocks starting at ``r``. Columns of earlier blocks (``j < r ≤ i``) by one
    ``tl.dot`` of ``k_i e^{G_i − G_r}`` with ``k_j e^{G_r − G_j}`` (both arguments masked differences
    ``≤ 0`` for non-positive gates, so neither factor overflows); the diagonal 16x16 block column by
    column with the exact ``e^{G_i − G_j}`` elementwise."""
    i_c, i_b, i_h, i_hk = _program(BHV, HV, GRP)
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    o = tl.arange(0, BT)
    o16 = tl.arange(0, 16)
    cols = start + o
    col_ok = cols < eos
    k_base = k_ptr + i_b * s_kb + i_hk * s_kh
    g_base = g_ptr + i_b * s_gb + i_h * s_gh
    a_base = a_ptr + i_b * s_ab + i_h * s_ah
    for bi in tl.static_range(BT // 16):
        r0 = start + bi * 16
        ri = r0 + o16
        vi = ri < eos
        acc = tl.zeros([16, BT], dtype=tl.float32)
        for i_k in range((K + BK - 1) // BK):
            d = i_k * BK + tl.arange(0, BK)
            dm = d < K
            mi = vi[:, None] & dm[None, :]
            b_k = tl.load(k_base + ri[:, None] * s_kt + d[None, :] * s_kd, mask=mi, other=0.0).to(tl.float32)
            b_g = tl.load(g_base + ri[:, None] * s_gt + d[None, :] * s_gd, mask=mi, other=0.0).to(tl.float32)
            if bi > 0:
                r_ok = r0 < eos
                g_r = tl.load(g_base + r0 * s_gt + d * s_gd, mask=dm & r_ok, other=0.0).to(tl.float32)
                k_i = b_k * tl.exp(tl.where(mi, b_g - g_r[None, :], 0.0))
                mj = dm[:, None] & ((o < bi * 16) & col_ok & r_ok)[None, :]
                b_kt = tl.load(k_base + cols[None, :] * s_kt + d[:, None] * s_kd, mask=mj, other=0.0).to(tl.float32)
                b_gt = tl.load(g_base + cols[None, :] * s_gt + d[:, None] * s_gd, mask=mj, other=0.0).to(tl.float32)
                k_j = tl.where(mj, b_kt * tl.exp(tl.where(mj, g_r[:, None] - b_gt, 0.0)), 0.0)
                acc += _dot(k_i, k_j, k_ptr.dtype.element_ty)
            for j in range(16):
                c = r0 + j
                mc = dm & (c < eos)
                k_c = tl.load(k_base + c * s_kt + d * s_kd, mask=mc, other=0.0).to(tl.float32)
                g_c = tl.load(g_base + c * s_gt + d * s_gd, mask=mc, other=0.0).to(tl.float32)
                m = (o16 > j)[:, None] & mi & mc[None, :]
                term = tl.where(m, b_k * k_c[None, :] * tl.exp(tl.where(m, b_g - g_c[None, :], 0.0)), 0.0)
                acc += tl.where(o[None, :] == bi * 16 + j, tl.sum(term, 1)[:, None], 0.0)
        if HAS_BETA:
            b_beta = tl.load(beta_ptr + i_b * s_bb + ri * s_bt + i_h * s_bh, mask=vi, other=0.0).to(tl.float32)
            acc = acc * b_beta[:, None]
        if HAS_RK:
            r_base = rk_ptr + i_b * s_rb + i_hk * s_rh
            acc = acc * (_row_factor(r_base, ri, vi, s_rt)[:, None] * _row_factor(r_base, cols, col_ok, s_rt)[None, :])
        acc = tl.where(vi[:, None] & col_ok[None, :] & (o[None, :] < bi * 16 + o16[:, None]), acc, 0.0)
        tl.store(a_base + ri[:, None] * s_at + o[None, :] * s_ac, acc.to(a_ptr.dtype.element_ty), mask=vi[:, None])


# ------------------------------------------------------------------------------------------------
# fused chunk_scaled_dot_kkt_fwd + solve_tril of the GDN forward (scalar gate): A never leaves registers
# ------------------------------------------------------------------------------------------------

@triton.jit
def _k_rows16(k_base, start, eos, di, d, dm, s_kt, s_kd):
    """``[16, BK]`` key tile of the chunk's 16-row block ``di`` (rows past the sequence end read 0)."""
    rows = start + di * 16 + tl.arange(0, 16)
    return tl.load(k_base + rows[:, None] * s_kt + d[None, :] * s_kd, mask=(rows < eos)[:, None] & dm[None, :],
                   other=0.0)


@triton.jit
def _k_cols16(k_base, start, eos, dj, d, dm, s_kt, s_kd):
    """``[BK, 16]``: the key tile of block ``dj`` loaded transposed (no ``tl.trans``, see the module doc)."""
    cols = start + dj * 16 + tl.arange(0, 16)
    return tl.load(k_base + cols[None, :] * s_kt + d[:, None] * s_kd, mask=dm[:, None] & (cols < eos)[None, :],
                   other=0.0)


@triton.jit
def _rows16(g_base, b_base, r_base, start, eos, di, s_gt, s_bt, s_rt,
            HAS_G: tl.constexpr, HAS_BETA: tl.constexpr, HAS_RK: tl.constexpr):
    """``(G, β, rstd, valid)`` of the 16 tokens of block ``di`` (``_kkt_rows``)."""
    rows = start + di * 16 + tl.arange(0, 16)
    valid = rows < eos
    b_g, b_beta, b_r = _kkt_rows(g_base, b_base, r_base, rows, valid, s_gt, s_bt, s_rt, HAS_G, HAS_BETA, HAS_RK)
    return b_g, b_beta, b_r, valid


@triton.jit
def _gated16(acc, g_i, beta_i, r_i, v_i, g_j, r_j, v_j, DIAG: tl.constexpr,
             HAS_G: tl.constexpr, HAS_BETA: tl.constexpr, HAS_RK: tl.constexpr):
    """16x16 block of ``A`` from its products ``acc`` and the factors of its block row (``_i``) and block
    column (``_j``): ``_kkt_gate`` with the strictly-lower mask on a diagonal block (``DIAG``), all valid
    entries of a block below the diagonal."""
    lower = v_i[:, None] & v_j[None, :]
    if DIAG:
        o = tl.arange(0, 16)
        lower = lower & (o[:, None] > o[None, :])
    return _kkt_gate(acc, g_i[:, None], g_j[None, :], beta_i[:, None], r_i[:, None], r_j[None, :], lower,
                     HAS_G, HAS_BETA, HAS_RK)


@triton.jit
def kkt_solve_fwd_kernel(k_ptr, g_ptr, beta_ptr, o_ptr, cu_ptr, idx_ptr, rk_ptr, T, BHV, HV, GRP,
                         s_kb, s_kt, s_kh, s_kd, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh, s_ob, s_ot, s_oh, s_oc,
                         s_rb, s_rt, s_rh,
                         K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, HAS_G: tl.constexpr,
                         HAS_BETA: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_RK: tl.constexpr):
    """``Ainv = (I + A_c)^{-1}`` of one chunk and value head straight from k, G, β (and k's l2norm rstd):
    ``chunk_scaled_dot_kkt_fwd`` followed by ``solve_tril`` without ``A`` in global memory.

    The ``BT // 16`` diagonal and the lower off-diagonal 16x16 blocks of ``k kᵀ`` accumulate in registers
    (``tl.dot`` per block over the ``BK``-wide key tiles, as ``kkt_fwd_kernel`` forms them: operands in
    k's dtype, fp32 accumulation, IEEE for fp32 keys); each block is gated by ``_kkt_gate`` (the formula of
    ``kkt_fwd_kernel``, exps of masked differences); the diagonal blocks are inverted together by
    ``_inv_diag16_all`` and merged by ``_merge_store16`` (both shared with ``solve_tril_kernel``)."""
    i_c, i_b, i_h, i_hk = _program(BHV, HV, GRP)
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    k_base = k_ptr + i_b * s_kb + i_hk * s_kh
    DT = k_ptr.dtype.element_ty
    z = tl.zeros([16, 16], dtype=tl.float32)
    # pIJ = k_i·k_j of block row I, block column J (0-based); only the blocks inside BT are formed
    p00, p10, p11, p20, p21, p22, p30, p31, p32, p33 = z, z, z, z, z, z, z, z, z, z
    for i_k in range((K + BK - 1) // BK):
        d = i_k * BK + tl.arange(0, BK)
        dm = d < K
        c0 = _k_cols16(k_base, start, eos, 0, d, dm, s_kt, s_kd)
        p00 += _dot(_k_rows16(k_base, start, eos, 0, d, dm, s_kt, s_kd), c0, DT)
        if BT >= 32:
            c1 = _k_cols16(k_base, start, eos, 1, d, dm, s_kt, s_kd)
            r1 = _k_rows16(k_base, start, eos, 1, d, dm, s_kt, s_kd)
            p10 += _dot(r1, c0, DT)
            p11 += _dot(r1, c1, DT)
        if BT == 64:
            c2 = _k_cols16(k_base, start, eos, 2, d, dm, s_kt, s_kd)
            r2 = _k_rows16(k_base, start, eos, 2, d, dm, s_kt, s_kd)
            p20 += _dot(r2, c0, DT)
            p21 += _dot(r2, c1, DT)
            p22 += _dot(r2, c2, DT)
            c3 = _k_cols16(k_base, start, eos, 3, d, dm, s_kt, s_kd)
            r3 = _k_rows16(k_base, start, eos, 3, d, dm, s_kt, s_kd)
            p30 += _dot(r3, c0, DT)
            p31 += _dot(r3, c1, DT)
            p32 += _dot(r3, c2, DT)
            p33 += _dot(r3, c3, DT)
    g_base = g_ptr + i_b * s_gb + i_h * s_gh
    b_base = beta_ptr + i_b * s_bb + i_h * s_bh
    r_base = rk_ptr + i_b * s_rb + i_hk * s_rh
    g0, b0, f0, v0 = _rows16(g_base, b_base, r_base, start, eos, 0, s_gt, s_bt, s_rt, HAS_G, HAS_BETA, HAS_RK)
    # Ad: the diagonal blocks' strictly-lower A as one [BT // 16, 16, 16] stack; AIJ: block (I, J), 1-based
    Ad = _place16(_gated16(p00, g0, b0, f0, v0, g0, f0, v0, True, HAS_G, HAS_BETA, HAS_RK), 0, BT // 16)
    A21, A31, A32, A41, A42, A43 = z, z, z, z, z, z
    if BT >= 32:
        g1, b1, f1, v1 = _rows16(g_base, b_base, r_base, start, eos, 1, s_gt, s_bt, s_rt, HAS_G, HAS_BETA, HAS_RK)
        Ad += _place16(_gated16(p11, g1, b1, f1, v1, g1, f1, v1, True, HAS_G, HAS_BETA, HAS_RK), 1, BT // 16)
        A21 = _gated16(p10, g1, b1, f1, v1, g0, f0, v0, False, HAS_G, HAS_BETA, HAS_RK)
    if BT == 64:
        g2, b2, f2, v2 = _rows16(g_base, b_base, r_base, start, eos, 2, s_gt, s_bt, s_rt, HAS_G, HAS_BETA, HAS_RK)
        g3, b3, f3, v3 = _rows16(g_base, b_base, r_base, start, eos, 3, s_gt, s_bt, s_rt, HAS_G, HAS_BETA, HAS_RK)
        Ad += _place16(_gated16(p22, g2, b2, f2, v2, g2, f2, v2, True, HAS_G, HAS_BETA, HAS_RK), 2, BT // 16)
        Ad += _place16(_gated16(p33, g3, b3, f3, v3, g3, f3, v3, True, HAS_G, HAS_BETA, HAS_RK), 3, BT // 16)
        A31 = _gated16(p20, g2, b2, f2, v2, g0, f0, v0, False, HAS_G, HAS_BETA, HAS_RK)
        A32 = _gated16(p21, g2, b2, f2, v2, g1, f1, v1, False, HAS_G, HAS_BETA, HAS_RK)
        A41 = _gated16(p30, g3, b3, f3, v3, g0, f0, v0, False, HAS_G, HAS_BETA, HAS_RK)
        A42 = _gated16(p31, g3, b3, f3, v3, g1, f1, v1, False, HAS_G, HAS_BETA, HAS_RK)
        A43 = _gated16(p32, g3, b3, f3, v3, g2, f2, v2, False, HAS_G, HAS_BETA, HAS_RK)
    Xd = _inv_diag16_all(Ad, BT // 16)
    _merge_store16(o_ptr + i_b * s_ob + i_h * s_oh, start, eos, Xd, A21, A31, A32, A41, A42, A43, s_ot, s_oc, BT)


# ------------------------------------------------------------------------------------------------
# recompute_w_u_fwd (SPEC 1.10.4)
# ------------------------------------------------------------------------------------------------

@triton.jit
def wy_fwd_kernel(k_ptr, v_ptr, beta_ptr, a_ptr, g_ptr, w_ptr, u_ptr, cu_ptr, idx_ptr, rk_ptr, T, BHV, HV, GRP,
                  s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd, s_bb, s_bt, s_bh, s_ab, s_at, s_ah, s_ac,
                  s_gb, s_gt, s_gh, s_gd, s_wb, s_wt, s_wh, s_wd, s_ub, s_ut, s_uh, s_ud, s_rb, s_rt, s_rh,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  GATE: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_RK: tl.constexpr = False):
    """``w = A·(β ⊙ e^{G} ⊙ k)`` (``GATE``: 0 none, 1 scalar, 2 per channel) and ``u = A·(β ⊙ v)`` of
    one chunk and value head; ``A`` restricted to valid rows and columns, loaded once."""
    i_c, i_b, i_h, i_hk = _program(BHV, HV, GRP)
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    o = tl.arange(0, BT)
    rows = start + o
    valid = rows < eos
    # A only feeds products: held in the key dtype (the dot operand dtype)
    b_A = tl.load(a_ptr + i_b * s_ab + i_h * s_ah + rows[:, None] * s_at + o[None, :] * s_ac,
                  mask=valid[:, None] & valid[None, :], other=0.0).to(tl.float32).to(k_ptr.dtype.element_ty)
    b_beta = tl.load(beta_ptr + i_b * s_bb + rows * s_bt + i_h * s_bh, mask=valid, other=0.0).to(tl.float32)

    v_base = v_ptr + i_b * s_vb + i_h * s_vh
    u_base = u_ptr + i_b * s_ub + i_h * s_uh
    for i_v in range((V + BV - 1) // BV):
        d = i_v * BV + tl.arange(0, BV)
        m = valid[:, None] & (d < V)[None, :]
        b_v = tl.load(v_base + rows[:, None] * s_vt + d[None, :] * s_vd, mask=m, other=0.0).to(tl.float32)
        b_u = _dot(b_A, b_v * b_beta[:, None], v_ptr.dtype.element_ty)
        tl.store(u_base + rows[:, None] * s_ut + d[None, :] * s_ud, b_u.to(u_ptr.dtype.element_ty), mask=m)

    scale = b_beta
    if GATE == 1:
        b_g = tl.load(g_ptr + i_b * s_gb + rows * s_gt + i_h * s_gh, mask=valid, other=0.0).to(tl.float32)
        scale = b_beta * tl.exp(tl.where(valid, b_g, 0.0))
    if HAS_RK:
        scale = scale * _row_factor(rk_ptr + i_b * s_rb + i_hk * s_rh, rows, valid, s_rt)
    k_base = k_ptr + i_b * s_kb + i_hk * s_kh
    w_base = w_ptr + i_b * s_wb + i_h * s_wh
    for i_k in range((K + BK - 1) // BK):
        d = i_k * BK + tl.arange(0, BK)
        m = valid[:, None] & (d < K)[None, :]
        b_k = tl.load(k_base + rows[:, None] * s_kt + d[None, :] * s_kd, mask=m, other=0.0).to(tl.float32)
        b_k = b_k * scale[:, None]
        if GATE == 2:
            b_gk = tl.load(g_ptr + i_b * s_gb + i_h * s_gh + rows[:, None] * s_gt + d[None, :] * s_gd, mask=m,
                           other=0.0).to(tl.float32)
            b_k = b_k * tl.exp(tl.where(m, b_gk, 0.0))
        b_w = _dot(b_A, b_k, k_ptr.dtype.element_ty)
        tl.store(w_base + rows[:, None] * s_wt + d[None, :] * s_wd, b_w.to(w_ptr.dtype.element_ty), mask=m)


# ------------------------------------------------------------------------------------------------
# prepare_wy_repr_bwd (SPEC 1.10.4)
# ------------------------------------------------------------------------------------------------

@triton.jit
def wy_bwd_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, a_ptr, dw_ptr, du_ptr, dk_ptr, dv_ptr, db_ptr, dg_ptr,
                  cu_ptr, idx_ptr, T, BHV, HV, GRP,
                  s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
                  s_ab, s_at, s_ah, s_ac, s_wb, s_wt, s_wh, s_wd, s_ub, s_ut, s_uh, s_ud,
                  s_dkb, s_dkt, s_dkh, s_dkd, s_dvb, s_dvt, s_dvh, s_dvd, s_ob, s_ot, s_oh,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  HAS_G: tl.constexpr, IS_VARLEN: tl.constexpr,
                  dkin_ptr, dgin_ptr, s_ib, s_it, s_ih, s_jb, s_jt, s_jh, HAS_ACC: tl.constexpr,
                  DG_CUMSUM: tl.constexpr = False):
    """Backward of ``w, u`` (SPEC 1.10.4) for one chunk and value head, ``T = A``:

    pass 1 (V tiles, then K tiles): ``dv = β ⊙ Tᵀdu``, ``dβ += Σ v ⊙ Tᵀdu``, and both
    ``dT = du·b_vᵀ + dw·b_kᵀ`` and ``dTᵀ`` (each from operands loaded in the needed orientation);
    middle: ``dM = −Tᵀ·dT·Tᵀ`` (strictly lower) and ``dMᵀ = −T·dTᵀ·T`` (strictly upper), ``Q = dM ⊙ D``,
    ``Pᵀ = dMᵀ ⊙ Dᵀ ⊙ β_col`` with ``D_ij = e^{G_i − G_j}``;
    pass 2 (K tiles): ``dk = β e^{G} ⊙ Tᵀdw + β ⊙ (Q k) + Pᵀ k``; the ``k·(…)`` row sums give the
    ``M`` parts of ``dβ`` (``Σ_j dM_ij D_ij k_i·k_j``) and ``dG`` (``β_i Σ_j … − Σ_l P_li k_l·k_i``).
    ``dk`` is written per value head (fp32); the launcher sums value heads sharing a q/k head.
    ``HAS_ACC``: the pipeline's other parts of the gradients are added on the way out, so no separate
    elementwise pass reads them again: ``dkin [B, T, H, K]`` (fp32, per q/k head) into the first value
    head of each group only (the launcher's group sum then counts it once), ``dgin [B, T, HV]`` into dg.
    ``DG_CUMSUM``: dg leaves as its reverse cumsum inside the chunk (the gradient of the gate ``g`` itself
    rather than of its cumsum ``G``), so the pipeline needs no separate reverse-cumsum launch."""
    i_c, i_b, i_h, i_hk = _program(BHV, HV, GRP)
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    o = tl.arange(0, BT)
    rows = start + o
    valid = rows < eos
    m2 = valid[:, None] & valid[None, :]
    a_base = a_ptr + i_b * s_ab + i_h * s_ah
    # Tt[i, j] = T[j, i]; T, Tt, Q, Pt only feed products: held in the dot operand dtype (k's)
    b_Tt = tl.load(a_base + rows[None, :] * s_at + o[:, None] * s_ac, mask=m2, other=0.0).to(tl.float32)
    b_Tt = b_Tt.to(k_ptr.dtype.element_ty)
    b_beta = tl.load(beta_ptr + i_b * s_bb + rows * s_bt + i_h * s_bh, mask=valid, other=0.0).to(tl.float32)
    if HAS_G:
        b_g = tl.load(g_ptr + i_b * s_gb + rows * s_gt + i_h * s_gh, mask=valid, other=0.0).to(tl.float32)
        b_eg = tl.exp(tl.where(valid, b_g, 0.0))
    else:
        b_g = tl.zeros([BT], dtype=tl.float32)
        b_eg = tl.full([BT], 1.0, dtype=tl.float32)
    b_bk = b_beta * b_eg
    b_dT = tl.zeros([BT, BT], dtype=tl.float32)
    b_dTt = tl.zeros([BT, BT], dtype=tl.float32)
    b_db = tl.zeros([BT], dtype=tl.float32)

    v_base = v_ptr + i_b * s_vb + i_h * s_vh
    du_base = du_ptr + i_b * s_ub + i_h * s_uh
    dv_base = dv_ptr + i_b * s_dvb + i_h * s_dvh
    for i_v in range((V + BV - 1) // BV):
        d = i_v * BV + tl.arange(0, BV)
        dm = d < V
        mr = valid[:, None] & dm[None, :]
        mc = dm[:, None] & valid[None, :]
        b_v = tl.load(v_base + rows[:, None] * s_vt + d[None, :] * s_vd, mask=mr, other=0.0).to(tl.float32)
        b_vt = tl.load(v_base + rows[None, :] * s_vt + d[:, None] * s_vd, mask=mc, other=0.0).to(tl.float32)
        b_du = tl.load(du_base + rows[:, None] * s_ut + d[None, :] * s_ud, mask=mr, other=0.0).to(tl.float32)
        b_dut = tl.load(du_base + rows[None, :] * s_ut + d[:, None] * s_ud, mask=mc, other=0.0).to(tl.float32)
        b_Tdu = _dot(b_Tt, b_du, k_ptr.dtype.element_ty)
        tl.store(dv_base + rows[:, None] * s_dvt + d[None, :] * s_dvd,
                 (b_beta[:, None] * b_Tdu).to(dv_ptr.dtype.element_ty), mask=mr)
        b_db += tl.sum(b_v * b_Tdu, 1)
        b_dT += _dot(b_du, b_vt * b_beta[None, :], k_ptr.dtype.element_ty)
        b_dTt += _dot(b_v * b_beta[:, None], b_dut, k_ptr.dtype.element_ty)

    k_base = k_ptr + i_b * s_kb + i_hk * s_kh
    dw_base = dw_ptr + i_b * s_wb + i_h * s_wh
    for i_k in range((K + BK - 1) // BK):
        d = i_k * BK + tl.arange(0, BK)
        dm = d < K
        mr = valid[:, None] & dm[None, :]
        mc = dm[:, None] & valid[None, :]
        b_k = tl.load(k_base + rows[:, None] * s_kt + d[None, :] * s_kd, mask=mr, other=0.0).to(tl.float32)
        b_kt = tl.load(k_base + rows[None, :] * s_kt + d[:, None] * s_kd, mask=mc, other=0.0).to(tl.float32)
        b_dw = tl.load(dw_base + rows[:, None] * s_wt + d[None, :] * s_wd, mask=mr, other=0.0).to(tl.float32)
        b_dwt = tl.load(dw_base + rows[None, :] * s_wt + d[:, None] * s_wd, mask=mc, other=0.0).to(tl.float32)
        b_dT += _dot(b_dw, b_kt * b_bk[None, :], k_ptr.dtype.element_ty)
        b_dTt += _dot(b_k * b_bk[:, None], b_dwt, k_ptr.dtype.element_ty)

    lower = (o[:, None] > o[None, :]) & m2
    upper = (o[:, None] < o[None, :]) & m2
    b_dM = -_dot(b_Tt, _dot(b_dT, b_Tt, k_ptr.dtype.element_ty), k_ptr.dtype.element_ty)
    b_T = tl.load(a_base + rows[:, None] * s_at + o[None, :] * s_ac, mask=m2, other=0.0).to(tl.float32)
    b_T = b_T.to(k_ptr.dtype.element_ty)
    b_dMt = -_dot(b_T, _dot(b_dTt, b_T, k_ptr.dtype.element_ty), k_ptr.dtype.element_ty)
    # Q = dM ⊙ D (strictly lower), Pt = (dM ⊙ D ⊙ β_row)ᵀ (strictly upper)
    b_Q = tl.where(lower, b_dM * tl.exp(tl.where(lower, b_g[:, None] - b_g[None, :], 0.0)), 0.0)
    b_Pt = tl.where(upper, b_dMt * tl.exp(tl.where(upper, b_g[None, :] - b_g[:, None], 0.0)) * b_beta[None, :], 0.0)
    b_Q = b_Q.to(k_ptr.dtype.element_ty)
    b_Pt = b_Pt.to(k_ptr.dtype.element_ty)

    b_dg = tl.zeros([BT], dtype=tl.float32)
    dk_base = dk_ptr + i_b * s_dkb + i_h * s_dkh
    for i_k in range((K + BK - 1) // BK):
        d = i_k * BK + tl.arange(0, BK)
        mr = valid[:, None] & (d < K)[None, :]
        b_k = tl.load(k_base + rows[:, None] * s_kt + d[None, :] * s_kd, mask=mr, other=0.0).to(tl.float32)
        b_dw = tl.load(dw_base + rows[:, None] * s_wt + d[None, :] * s_wd, mask=mr, other=0.0).to(tl.float32)
        b_Tdw = _dot(b_Tt, b_dw, k_ptr.dtype.element_ty)
        b_Qk = _dot(b_Q, b_k, k_ptr.dtype.element_ty)
        b_Ptk = _dot(b_Pt, b_k, k_ptr.dtype.element_ty)
        b_dk = b_bk[:, None] * b_Tdw + b_beta[:, None] * b_Qk + b_Ptk
        if HAS_ACC:  # a masked-off load in the group's other value heads
            first = (i_h % GRP) == 0
            b_dk += tl.load(dkin_ptr + i_b * s_ib + i_hk * s_ih + rows[:, None] * s_it + d[None, :], mask=mr & first,
                            other=0.0).to(tl.float32)
        tl.store(dk_base + rows[:, None] * s_dkt + d[None, :] * s_dkd, b_dk.to(dk_ptr.dtype.element_ty), mask=mr)
        kTdw = tl.sum(b_k * b_Tdw, 1)
        kQk = tl.sum(b_k * b_Qk, 1)
        b_db += b_eg * kTdw + kQk
        b_dg += b_bk * kTdw + b_beta * kQk - tl.sum(b_k * b_Ptk, 1)

    tl.store(db_ptr + i_b * s_ob + rows * s_ot + i_h * s_oh, b_db, mask=valid)
    if HAS_G:
        if HAS_ACC:
            b_dg += tl.load(dgin_ptr + i_b * s_jb + rows * s_jt + i_h * s_jh, mask=valid, other=0.0).to(tl.float32)
        if DG_CUMSUM:  # rows past the sequence end hold 0 (masked loads): a suffix sum over the valid rows
            b_dg = tl.cumsum(b_dg, axis=0, reverse=True)
        tl.store(dg_ptr + i_b * s_ob + rows * s_ot + i_h * s_oh, b_dg, mask=valid)
