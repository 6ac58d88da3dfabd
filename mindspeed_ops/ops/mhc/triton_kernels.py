"""Triton kernels of the mHC family (SPEC 1.12). Kernels only: launchers live in the op modules.

Sinkhorn: one token's ``n×n`` matrix is a ``[NP, NP]`` slice of a ``[BT, NP, NP]`` tile (many tokens
a program, the whole Sinkhorn loop in registers, no global traffic besides the inputs and outputs).
The backward recomputes the iterations (see ``_sinkhorn_bwd_loop``): the exact gradient of the
unrolled computation, O(steps) work, nothing stored by the forward.
"""
import triton
import triton.language as tl

from ...triton_utils import sigmoid_f32


@triton.jit
def _softmax_eps(C, kmask3, emask3, eps):
    """Row softmax of ``C [BT, NP, NP]`` over valid columns; returns (P̃, P̃ + eps masked to valid entries)."""
    C = tl.where(kmask3, C, float("-inf"))
    mx = tl.max(C, axis=2)
    e = tl.exp(C - mx[:, :, None])
    e = tl.where(kmask3, e, 0.0)
    pt = e / tl.sum(e, axis=2)[:, :, None]
    return pt, tl.where(emask3, pt + eps, 0.0)


@triton.jit
def _col_step(P, eps, pad):
    """``pad [NP]`` is 1.0 on padding indices (``>= N``), 0.0 elsewhere: a padding row/column sums to 0,
    and ``1/(0 + pad + eps)`` stays finite even at ``eps = 0`` (``0·inf`` would put NaN into the valid sums)."""
    r = 1.0 / (tl.sum(P, axis=1) + eps + pad[None, :])
    return P * r[:, None, :]


@triton.jit
def _row_step(P, eps, pad):
    r = 1.0 / (tl.sum(P, axis=2) + eps + pad[None, :])
    return P * r[:, :, None]


@triton.jit
def _sinkhorn_loop(P0, iters, eps, pad):
    P = _col_step(P0, eps, pad)
    for _ in range(1, iters):
        P = _row_step(P, eps, pad)
        P = _col_step(P, eps, pad)
    return P


@triton.jit
def _sinkhorn_bwd_loop(P0, dP, emask3, pad, r_ptr, rows, rmask, M, iters, eps, NP: tl.constexpr):
    """Gradient w.r.t. ``P0`` of the unrolled loop, given ``dP`` of its output.

    Pass 1 re-runs the forward and keeps each step's reciprocal sums ``r_t`` (``NP`` floats a token a
    step) in the fp32 scratch ``r_ptr [steps, M, NP]``; pass 2 walks the steps backwards, rebuilding
    each step's input from its output (``X_t = Y_t / r_t``, a few ulp) and applying
    ``dX = (dY - Σ_axis dY ⊙ Y) · r``. O(steps) work; a CTA barrier separates the passes (the scratch
    rows of a token are written and read only by its program).
    Padding entries are kept at 0 (``pad`` keeps their ``1/(0 + eps)`` factors finite, see ``_col_step``)."""
    S = 2 * iters - 1
    roff = rows[:, None] * NP + tl.arange(0, NP)[None, :]
    rm = rmask[:, None]
    X = P0
    for t in range(0, S):
        base = r_ptr + tl.cast(t, tl.int64) * M * NP
        if t % 2 == 0:
            r = 1.0 / (tl.sum(X, axis=1) + eps + pad[None, :])
            X = X * r[:, None, :]
            tl.store(base + roff, r, mask=rm)
        else:
            r = 1.0 / (tl.sum(X, axis=2) + eps + pad[None, :])
            X = X * r[:, :, None]
            tl.store(base + roff, r, mask=rm)
    tl.debug_barrier()
    for tt in range(0, S):
        t = S - 1 - tt
        r = tl.load(r_ptr + tl.cast(t, tl.int64) * M * NP + roff, mask=rm, other=1.0)
        if t % 2 == 0:
            dP = tl.where(emask3, (dP - tl.sum(dP * X, axis=1)[:, None, :]) * r[:, None, :], 0.0)
            X = X / r[:, None, :]
        else:
            dP = tl.where(emask3, (dP - tl.sum(dP * X, axis=2)[:, :, None]) * r[:, :, None], 0.0)
            X = X / r[:, :, None]
    return dP


@triton.jit
def sinkhorn_fwd_kernel(m_ptr, s_ptr, b_ptr, pre_ptr, post_ptr, comb_ptr, M, stride_m, iters, eps,
                        N: tl.constexpr, NP: tl.constexpr, BT: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    rmask = rows < M
    kk = tl.arange(0, NP)
    kmask = kk < N
    s0 = tl.load(s_ptr).to(tl.float32)
    s1 = tl.load(s_ptr + 1).to(tl.float32)
    s2 = tl.load(s_ptr + 2).to(tl.float32)
    m2 = rmask[:, None] & kmask[None, :]
    base = m_ptr + rows[:, None] * stride_m + kk[None, :]
    mpre = tl.load(base, mask=m2, other=0.0).to(tl.float32)
    mpost = tl.load(base + N, mask=m2, other=0.0).to(tl.float32)
    bpre = tl.load(b_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
    bpost = tl.load(b_ptr + N + kk, mask=kmask, other=0.0).to(tl.float32)
    pre = sigmoid_f32(s0 * mpre + bpre[None, :]) + eps
    post = 2.0 * sigmoid_f32(s1 * mpost + bpost[None, :])
    out2 = rows[:, None] * N + kk[None, :]
    tl.store(pre_ptr + out2, pre.to(pre_ptr.dtype.element_ty), mask=m2)
    tl.store(post_ptr + out2, post.to(post_ptr.dtype.element_ty), mask=m2)

    off = 2 * N + kk[:, None] * N + kk[None, :]                 # [NP(j), NP(k)]
    emask = kmask[:, None] & kmask[None, :]
    emask3 = emask[None, :, :]
    m3 = rmask[:, None, None] & emask3
    mc = tl.load(m_ptr + rows[:, None, None] * stride_m + off[None, :, :], mask=m3, other=0.0).to(tl.float32)
    bc = tl.load(b_ptr + off, mask=emask, other=0.0).to(tl.float32)
    _, P0 = _softmax_eps(s2 * mc + bc[None, :, :], kmask[None, None, :], emask3, eps)
    P = _sinkhorn_loop(P0, iters, eps, tl.where(kmask, 0.0, 1.0))
    out3 = rows[:, None, None] * (N * N) + kk[None, :, None] * N + kk[None, None, :]
    tl.store(comb_ptr + out3, P.to(comb_ptr.dtype.element_ty), mask=m3)


@triton.jit
def sinkhorn_bwd_kernel(m_ptr, s_ptr, b_ptr, dpre_ptr, dpost_ptr, dcomb_ptr, dm_ptr, ds_ptr, db_ptr, r_ptr,
                        M, stride_m, sdpre_r, sdpre_c, sdpost_r, sdpost_c, sdc_r, sdc_j, sdc_k, stride_dm,
                        iters, eps, N: tl.constexpr, NP: tl.constexpr, BT: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BT + tl.arange(0, BT)
    rmask = rows < M
    kk = tl.arange(0, NP)
    kmask = kk < N
    s0 = tl.load(s_ptr).to(tl.float32)
    s1 = tl.load(s_ptr + 1).to(tl.float32)
    s2 = tl.load(s_ptr + 2).to(tl.float32)
    m2 = rmask[:, None] & kmask[None, :]
    base = m_ptr + rows[:, None] * stride_m + kk[None, :]
    mpre = tl.load(base, mask=m2, other=0.0).to(tl.float32)
    mpost = tl.load(base + N, mask=m2, other=0.0).to(tl.float32)
    bpre = tl.load(b_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
    bpost = tl.load(b_ptr + N + kk, mask=kmask, other=0.0).to(tl.float32)
    k64 = kk.to(tl.int64)
    dpre = tl.load(dpre_ptr + rows[:, None] * sdpre_r + k64[None, :] * sdpre_c, mask=m2, other=0.0).to(tl.float32)
    dpost = tl.load(dpost_ptr + rows[:, None] * sdpost_r + k64[None, :] * sdpost_c, mask=m2,
                    other=0.0).to(tl.float32)
    sp = sigmoid_f32(s0 * mpre + bpre[None, :])
    sq = sigmoid_f32(s1 * mpost + bpost[None, :])
    dzp = tl.where(m2, dpre * sp * (1.0 - sp), 0.0)
    dzq = tl.where(m2, 2.0 * dpost * sq * (1.0 - sq), 0.0)
    dbase = dm_ptr + rows[:, None] * stride_dm + kk[None, :]
    tl.store(dbase, (dzp * s0).to(dm_ptr.dtype.element_ty), mask=m2)
    tl.store(dbase + N, (dzq * s1).to(dm_ptr.dtype.element_ty), mask=m2)

    off = 2 * N + kk[:, None] * N + kk[None, :]
    emask = kmask[:, None] & kmask[None, :]
    emask3 = emask[None, :, :]
    m3 = rmask[:, None, None] & emask3
    mc = tl.load(m_ptr + rows[:, None, None] * stride_m + off[None, :, :], mask=m3, other=0.0).to(tl.float32)
    bc = tl.load(b_ptr + off, mask=emask, other=0.0).to(tl.float32)
    pt, P0 = _softmax_eps(s2 * mc + bc[None, :, :], kmask[None, None, :], emask3, eps)
    dP = tl.load(dcomb_ptr + rows[:, None, None] * sdc_r + k64[None, :, None] * sdc_j + k64[None, None, :] * sdc_k,
                 mask=m3, other=0.0).to(tl.float32)
    dP = tl.where(m3, _sinkhorn_bwd_loop(P0, dP, emask3, tl.where(kmask, 0.0, 1.0), r_ptr, rows, rmask, M,
                                                  iters, eps, NP), 0.0)
    dC = tl.where(m3, pt * (dP - tl.sum(dP * pt, axis=2)[:, :, None]), 0.0)
    tl.store(dm_ptr + rows[:, None, None] * stride_dm + off[None, :, :], (dC * s2).to(dm_ptr.dtype.element_ty),
             mask=m3)

    # per-program fp32 partials (summed on the host side: deterministic)
    tl.store(ds_ptr + pid * 3, tl.sum(tl.sum(dzp * mpre, axis=1), axis=0))
    tl.store(ds_ptr + pid * 3 + 1, tl.sum(tl.sum(dzq * mpost, axis=1), axis=0))
    tl.store(ds_ptr + pid * 3 + 2, tl.sum(tl.sum(tl.sum(dC * mc, axis=2), axis=1), axis=0))
    W = (2 + N) * N
    tl.store(db_ptr + pid * W + kk, tl.sum(dzp, axis=0), mask=kmask)
    tl.store(db_ptr + pid * W + N + kk, tl.sum(dzq, axis=0), mask=kmask)
    tl.store(db_ptr + pid * W + off, tl.sum(dC, axis=0), mask=emask)


@triton.jit
def sinkhorn_knopp_fwd_kernel(c_ptr, p_ptr, M, iters, eps, N: tl.constexpr, NP: tl.constexpr, BT: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    kk = tl.arange(0, NP)
    kmask = kk < N
    emask3 = (kmask[:, None] & kmask[None, :])[None, :, :]
    m3 = (rows < M)[:, None, None] & emask3
    off = rows[:, None, None] * (N * N) + kk[None, :, None] * N + kk[None, None, :]
    C = tl.load(c_ptr + off, mask=m3, other=0.0).to(tl.float32)
    _, P0 = _softmax_eps(C, kmask[None, None, :], emask3, eps)
    P = _sinkhorn_loop(P0, iters, eps, tl.where(kmask, 0.0, 1.0))
    tl.store(p_ptr + off, P.to(p_ptr.dtype.element_ty), mask=m3)


@triton.jit
def sinkhorn_knopp_bwd_kernel(c_ptr, dp_ptr, dc_ptr, r_ptr, M, sdp_r, sdp_j, sdp_k, iters, eps, N: tl.constexpr,
                              NP: tl.constexpr, BT: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    rmask = rows < M
    kk = tl.arange(0, NP)
    k64 = kk.to(tl.int64)
    kmask = kk < N
    emask3 = (kmask[:, None] & kmask[None, :])[None, :, :]
    m3 = rmask[:, None, None] & emask3
    off = rows[:, None, None] * (N * N) + kk[None, :, None] * N + kk[None, None, :]
    C = tl.load(c_ptr + off, mask=m3, other=0.0).to(tl.float32)
    pt, P0 = _softmax_eps(C, kmask[None, None, :], emask3, eps)
    dP = tl.load(dp_ptr + rows[:, None, None] * sdp_r + k64[None, :, None] * sdp_j + k64[None, None, :] * sdp_k,
                 mask=m3, other=0.0).to(tl.float32)
    dP = tl.where(m3, _sinkhorn_bwd_loop(P0, dP, emask3, tl.where(kmask, 0.0, 1.0), r_ptr, rows, rmask, M,
                                                  iters, eps, NP), 0.0)
    dC = pt * (dP - tl.sum(dP * pt, axis=2)[:, :, None])
    tl.store(dc_ptr + off, dC.to(dc_ptr.dtype.element_ty), mask=m3)


# ---------------------------------------------------------------------------------------------------
# mhc_pre_bmm / mhc_post: memory-bound stream mixing. Every tile is a 2-D ``[BT rows, BD hidden]``
# block of one stream (contiguous along D: 16-byte vector loads), the ``n`` streams are unrolled with
# ``tl.static_range`` and kept in Triton tuples, and the per-token weights are ``[BT]`` vectors, so no
# kernel needs a layout conversion or a 3-D register tile. The ``n``/``n×n`` weight gradients are
# reductions over D accumulated in fp32 registers across the D loop and stored once.
# ---------------------------------------------------------------------------------------------------

@triton.jit
def mhc_pre_bmm_fwd_kernel(p_ptr, x_ptr, y_ptr, M, D, sp_t, sp_j, sx_t, sx_j, sy_t,
                           N: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """``y[t, d] = Σ_j pre[t, j] · x[t, j, d]``. One program per ``[BT, BD]`` tile of ``y`` (1-D grid:
    row block major, D block minor); ``x``'s last stride is 1."""
    pid = tl.program_id(0)
    nd = (D + BD - 1) // BD
    rows = (pid // nd).to(tl.int64) * BT + tl.arange(0, BT)
    d = (pid % nd) * BD + tl.arange(0, BD)
    rmask = rows < M
    m2 = rmask[:, None] & (d < D)[None, :]
    xoff = rows[:, None] * sx_t + d[None, :]
    acc = tl.zeros([BT, BD], dtype=tl.float32)
    for j in tl.static_range(N):
        pj = tl.load(p_ptr + rows * sp_t + j * sp_j, mask=rmask, other=0.0).to(tl.float32)
        xj = tl.load(x_ptr + xoff + j * sx_j, mask=m2, other=0.0).to(tl.float32)
        acc += pj[:, None] * xj
    tl.store(y_ptr + rows[:, None] * sy_t + d[None, :], acc.to(y_ptr.dtype.element_ty), mask=m2)


@triton.jit
def mhc_pre_bmm_bwd_kernel(p_ptr, x_ptr, dy_ptr, dp_ptr, dx_ptr, M, D, sp_t, sp_j, sx_t, sx_j, sdy_t, sdy_d,
                           N: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """``dx[t, j, :] = pre[t, j] · dy[t, :]`` (``dx`` contiguous) and ``dpre[t, j] = ⟨dy[t], x[t, j]⟩``.

    One program per ``BT`` rows, looping over D in ``BD`` tiles; the products ``x_j · dy`` are summed
    element-wise in ``n`` fp32 ``[BT, BD]`` register tiles and reduced over D once at the end."""
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    rmask = rows < M
    ps = ()
    acc = ()
    for j in tl.static_range(N):
        ps = ps + (tl.load(p_ptr + rows * sp_t + j * sp_j, mask=rmask, other=0.0).to(tl.float32),)
        acc = acc + (tl.zeros([BT, BD], dtype=tl.float32),)
    for d0 in range(0, D, BD):
        d = tl.cast(d0, tl.int64) + tl.arange(0, BD)
        m2 = rmask[:, None] & (d < D)[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * sdy_t + d[None, :] * sdy_d, mask=m2, other=0.0).to(tl.float32)
        xoff = rows[:, None] * sx_t + d[None, :]
        dxoff = rows[:, None] * (N * D) + d[None, :]
        new = ()
        for j in tl.static_range(N):
            xj = tl.load(x_ptr + xoff + j * sx_j, mask=m2, other=0.0).to(tl.float32)
            tl.store(dx_ptr + dxoff + j * D, (ps[j][:, None] * dy).to(dx_ptr.dtype.element_ty), mask=m2)
            new = new + (acc[j] + xj * dy,)
        acc = new
    for j in tl.static_range(N):
        tl.store(dp_ptr + rows * N + j, tl.sum(acc[j], axis=1).to(dp_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def mhc_post_fwd_kernel(x_ptr, r_ptr, hp_ptr, hr_ptr, o_ptr, M, D, sx_t, sr_t, sr_j, shp_t, shr_t, so_t, so_k,
                        N: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """``out[t, k, d] = h_post[t, k] · x[t, d] + Σ_j h_res[t, j, k] · residual[t, j, d]``. One program per
    ``[BT, BD]`` tile (1-D grid as in the pre kernel): ``x`` and the ``n`` residual tiles are loaded once
    and all ``n`` output tiles written. ``h_post``/``h_res`` rows are contiguous (row strides given), so
    the ``n + n²`` weights of a row are immediate offsets from one address."""
    pid = tl.program_id(0)
    nd = (D + BD - 1) // BD
    rows = (pid // nd).to(tl.int64) * BT + tl.arange(0, BT)
    d = (pid % nd) * BD + tl.arange(0, BD)
    rmask = rows < M
    m2 = rmask[:, None] & (d < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * sx_t + d[None, :], mask=m2, other=0.0).to(tl.float32)
    roff = rows[:, None] * sr_t + d[None, :]
    rs = ()
    for j in tl.static_range(N):
        rs = rs + (tl.load(r_ptr + roff + j * sr_j, mask=m2, other=0.0).to(tl.float32),)
    ooff = rows[:, None] * so_t + d[None, :]
    hpp = hp_ptr + rows * shp_t
    hrp = hr_ptr + rows * shr_t
    for k in tl.static_range(N):
        hp = tl.load(hpp + k, mask=rmask, other=0.0).to(tl.float32)
        out = hp[:, None] * x
        for j in tl.static_range(N):
            hr = tl.load(hrp + (j * N + k), mask=rmask, other=0.0).to(tl.float32)
            out += hr[:, None] * rs[j]
        tl.store(o_ptr + ooff + k * so_k, out.to(o_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _lane_sum(v, BT: tl.constexpr, BD: tl.constexpr, VEC: tl.constexpr):
    """``[BT, BD] -> [BT, BD // VEC]``: sums of consecutive runs of ``VEC`` elements (with ``VEC`` the
    elements a thread holds, the thread's own registers: no cross-lane traffic)."""
    return tl.sum(tl.reshape(v, [BT, BD // VEC, VEC]), axis=2)


@triton.jit
def mhc_post_bwd_kernel(x_ptr, r_ptr, hp_ptr, hr_ptr, do_ptr, dx_ptr, dr_ptr, dhp_ptr, dhr_ptr, M, D,
                        sx_t, sr_t, sr_j, shp_t, shr_t, sdo_t, sdo_k, sdo_d,
                        N: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, VEC: tl.constexpr):
    """``dx = Σ_k h_post_k · dout_k``, ``dresidual_j = Σ_k h_res[j, k] · dout_k`` (both contiguous),
    ``dh_post_k = ⟨dout_k, x⟩``, ``dh_res[j, k] = ⟨residual_j, dout_k⟩``.

    One program per ``BT`` rows, looping over D in ``BD`` tiles: the ``n`` ``dout`` tiles of a step stay in
    registers while ``x`` and each residual tile stream past them. The ``n + n²`` dot products are summed
    per lane: ``VEC`` is the run of a tile row one thread holds (the launcher makes a tile row one warp's
    32 runs), so each step adds ``[BT, BD // VEC]`` partials without cross-lane traffic; the lanes are
    reduced once after the loop. The weights (rows contiguous, as in the forward) are re-read from L1
    each step at immediate offsets: hoisting their addresses or values out of the D loop would cost
    ``n + n²`` registers a thread."""
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    rmask = rows < M
    ahp = ()
    for k in tl.static_range(N):
        ahp = ahp + (tl.zeros([BT, BD // VEC], dtype=tl.float32),)
    ahr = ()
    for i in tl.static_range(N * N):
        ahr = ahr + (tl.zeros([BT, BD // VEC], dtype=tl.float32),)
    hpp = hp_ptr + rows * shp_t
    hrp = hr_ptr + rows * shr_t
    for d0 in range(0, D, BD):
        d = tl.cast(d0, tl.int64) + tl.arange(0, BD)
        m2 = rmask[:, None] & (d < D)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sx_t + d[None, :], mask=m2, other=0.0).to(tl.float32)
        dooff = rows[:, None] * sdo_t + d[None, :] * sdo_d
        dos = ()
        for k in tl.static_range(N):
            dos = dos + (tl.load(do_ptr + dooff + k * sdo_k, mask=m2, other=0.0).to(tl.float32),)
        hp = tl.load(hpp, mask=rmask, other=0.0).to(tl.float32)
        dx = hp[:, None] * dos[0]
        for k in tl.static_range(1, N):
            hp = tl.load(hpp + k, mask=rmask, other=0.0).to(tl.float32)
            dx += hp[:, None] * dos[k]
        tl.store(dx_ptr + rows[:, None] * D + d[None, :], dx.to(dx_ptr.dtype.element_ty), mask=m2)
        new = ()
        for k in tl.static_range(N):
            new = new + (ahp[k] + _lane_sum(dos[k] * x, BT, BD, VEC),)
        ahp = new
        roff = rows[:, None] * sr_t + d[None, :]
        droff = rows[:, None] * (N * D) + d[None, :]
        new = ()
        for j in tl.static_range(N):
            r = tl.load(r_ptr + roff + j * sr_j, mask=m2, other=0.0).to(tl.float32)
            hr = tl.load(hrp + j * N, mask=rmask, other=0.0).to(tl.float32)
            dr = hr[:, None] * dos[0]
            for k in tl.static_range(1, N):
                hr = tl.load(hrp + (j * N + k), mask=rmask, other=0.0).to(tl.float32)
                dr += hr[:, None] * dos[k]
            tl.store(dr_ptr + droff + j * D, dr.to(dr_ptr.dtype.element_ty), mask=m2)
            for k in tl.static_range(N):
                new = new + (ahr[j * N + k] + _lane_sum(r * dos[k], BT, BD, VEC),)
        ahr = new
    for k in tl.static_range(N):
        tl.store(dhp_ptr + rows * N + k, tl.sum(ahp[k], axis=1).to(dhp_ptr.dtype.element_ty), mask=rmask)
    for i in tl.static_range(N * N):
        tl.store(dhr_ptr + rows * (N * N) + i, tl.sum(ahr[i], axis=1).to(dhr_ptr.dtype.element_ty), mask=rmask)
