"""Triton kernels of the convolution family (SPEC 1.9). Kernels only: launchers live in causal_conv1d.py.

Tokens are addressed as packed rows ``g`` (``B*T`` of them). Each row knows its sequence ``n``, its
position ``p`` in it and the sequence length ``L`` (fixed length: ``n = g // T``; varlen: ``n`` from a
per-token table built on device). The extended input ``x̃_q`` of a sequence is ``x`` for ``0 <= q < L``
and ``initial_state[n, :, q + W]`` for ``-W <= q < 0`` (0 without a state); loads are masked so that no
program reads a token of another sequence or a tail token (``g >= cu_seqlens[-1]``).
"""
import triton
import triton.language as tl

from ...triton_utils import sigmoid_f32


@triton.jit
def _rows(g, T, total, cu_ptr, seq_ptr, VARLEN: tl.constexpr):
    """For packed rows ``g`` (int64): (n, bb, st, p, L, valid). A token of sequence ``n`` at position
    ``q`` lives at row ``bb*stride_b + (st + q)*stride_t`` of a [B, T, D] tensor. In varlen mode
    ``total`` is N and the packed length ``cu_seqlens[N]`` is read here (no host read in backward)."""
    if VARLEN:
        valid = g < tl.load(cu_ptr + total).to(tl.int64)
        n = tl.load(seq_ptr + g, mask=valid, other=0).to(tl.int64)
        st = tl.load(cu_ptr + n, mask=valid, other=0).to(tl.int64)
        L = tl.load(cu_ptr + n + 1, mask=valid, other=0).to(tl.int64) - st
        bb = n * 0
    else:
        valid = g < total
        n = g // T
        st = n * 0
        L = st + T
        bb = n
    p = g - bb * T - st
    return n, bb, st, p, L, valid


@triton.jit
def _load_x(x_ptr, bb, st, q, L, rmask, cols, cmask, sxb, sxt):
    """fp32 tile of the tokens ``x_q`` for ``0 <= q < L`` (0 elsewhere)."""
    in_x = rmask & (q >= 0) & (q < L)
    return tl.load(x_ptr + (bb * sxb + (st + q) * sxt)[:, None] + cols[None, :],
                   mask=in_x[:, None] & cmask[None, :], other=0.0).to(tl.float32)


@triton.jit
def _load_s(s_ptr, n, q, rmask, cols, cmask, ssn, ssd, ssw, W: tl.constexpr):
    """fp32 tile of the state slots ``initial_state[n, :, q + W]`` for ``-W <= q < 0`` (0 elsewhere)."""
    in_s = rmask & (q < 0) & (q >= -W)
    return tl.load(s_ptr + (n * ssn + (q + W) * ssw)[:, None] + cols[None, :] * ssd,
                   mask=in_s[:, None] & cmask[None, :], other=0.0).to(tl.float32)


@triton.jit
def _load_xt(x_ptr, s_ptr, n, bb, st, q, L, rmask, cols, cmask, sxb, sxt, ssn, ssd, ssw,
             W: tl.constexpr, HAS_STATE: tl.constexpr):
    """fp32 tile of ``x̃_q`` (rows q, columns cols); 0 where nothing is read."""
    v = _load_x(x_ptr, bb, st, q, L, rmask, cols, cmask, sxb, sxt)
    if HAS_STATE:
        sv = _load_s(s_ptr, n, q, rmask, cols, cmask, ssn, ssd, ssw, W)
        v = tl.where((rmask & (q < 0))[:, None], sv, v)  # a select keeps -0.0 (final-state slots are bitwise copies)
    return v


@triton.jit
def _touches_state(q, rmask, W: tl.constexpr):
    """Whether any row of the tile at positions q has a tap in the initial state (q < W-1): a scalar, so
    the state loads sit behind a branch that nearly every tile skips (fewer live registers)."""
    return tl.min(tl.where(rmask, q, W), axis=0) < W - 1


@triton.jit
def _preact(x_ptr, s_ptr, w_ptr, b_ptr, n, bb, st, q, L, rmask, cols, cmask, sxb, sxt, ssn, ssd, ssw, swj, swd,
            W: tl.constexpr, HAS_STATE: tl.constexpr, HAS_BIAS: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """``a_q = bias + Σ_j weight[j] ⊙ x̃_{q-W+1+j}`` in fp32, [BR, BD] (token taps, then state taps)."""
    acc = tl.zeros([BR, BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(W):
        wj = tl.load(w_ptr + j * swj + cols * swd, mask=cmask, other=0.0).to(tl.float32)
        acc += wj[None, :] * _load_x(x_ptr, bb, st, q - (W - 1) + j, L, rmask, cols, cmask, sxb, sxt)
    if HAS_STATE:
        if _touches_state(q, rmask, W):
            for j in tl.static_range(W - 1):
                wj = tl.load(w_ptr + j * swj + cols * swd, mask=cmask, other=0.0).to(tl.float32)
                acc += wj[None, :] * _load_s(s_ptr, n, q - (W - 1) + j, rmask, cols, cmask, ssn, ssd, ssw, W)
    return acc


@triton.jit
def causal_conv1d_fwd_kernel(x_ptr, w_ptr, b_ptr, r_ptr, s_ptr, y_ptr, cu_ptr, seq_ptr, T, total, n_rows, D,
                             sxb, sxt, swj, swd, srb, srt, ssn, ssd, ssw,
                             W: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                             HAS_STATE: tl.constexpr, VARLEN: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """y = act(a) + residual for a [BT tokens, BD channels] tile; tail rows get 0. y is contiguous [B*T, D]."""
    g = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    n, bb, st, p, L, valid = _rows(g, T, total, cu_ptr, seq_ptr, VARLEN)
    a = _preact(x_ptr, s_ptr, w_ptr, b_ptr, n, bb, st, p, L, valid, cols, cmask, sxb, sxt, ssn, ssd, ssw, swj, swd,
                W, HAS_STATE, HAS_BIAS, BT, BD)
    y = a
    if SILU:
        y = a * sigmoid_f32(a)
    if HAS_RES:
        y += tl.load(r_ptr + (bb * srb + (st + p) * srt)[:, None] + cols[None, :],
                     mask=valid[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    y = tl.where(valid[:, None], y, 0.0)
    tl.store(y_ptr + g[:, None] * D + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=(g < n_rows)[:, None] & cmask[None, :])


@triton.jit
def _sequence_bounds(cu_ptr, n, T, VARLEN: tl.constexpr):
    """(start token, length, batch row) of sequence ``n`` (int64): a packed segment of ``cu_seqlens``
    in varlen mode, else batch row ``n`` of length ``T``."""
    if VARLEN:
        st = tl.load(cu_ptr + n).to(tl.int64)
        L = tl.load(cu_ptr + n + 1).to(tl.int64) - st
        bb = n * 0
    else:
        st = n * 0
        L = st + T
        bb = n
    return st, L, bb


@triton.jit
def causal_conv1d_final_state_kernel(x_ptr, s_ptr, f_ptr, cu_ptr, T, D, sxb, sxt, ssn, ssd, ssw,
                                     W: tl.constexpr, WP: tl.constexpr, HAS_STATE: tl.constexpr,
                                     VARLEN: tl.constexpr, BD: tl.constexpr):
    """final_state[n, :, m] = x̃_{L-W+m} (copies), one sequence and BD channels per program; f is [N, D, W]."""
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    m = tl.arange(0, WP)
    mmask = m < W
    st, L, bb = _sequence_bounds(cu_ptr, n, T, VARLEN)
    q = L - W + m
    v = _load_xt(x_ptr, s_ptr, n, bb, st, q, L, mmask, cols, cmask, sxb, sxt, ssn, ssd, ssw, W, HAS_STATE)
    tl.store(f_ptr + n * D * W + cols[None, :] * W + m[:, None], v.to(f_ptr.dtype.element_ty),
             mask=mmask[:, None] & cmask[None, :])


@triton.jit
def _dxt(x_ptr, s_ptr, w_ptr, b_ptr, dy_ptr, df_ptr, n, bb, st, p, L, rmask, cols, cmask,
         sxb, sxt, ssn, ssd, ssw, swj, swd, sdb, sdt, sdd, sfn, sfd, sfw,
         W: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr,
         HAS_DF: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """Gradient of the extended input at positions p: ``Σ_s weight[W-1-s] ⊙ gy_{p+s}`` plus the upstream
    final-state gradient of the slot that copied ``x̃_p``. Also returns ``gy_p`` (0 outside [0, L))."""
    dx = tl.zeros([BR, BD], dtype=tl.float32)
    gy0 = tl.zeros([BR, BD], dtype=tl.float32)
    for s in tl.static_range(W):
        q = p + s
        ok = rmask & (q >= 0) & (q < L)
        gy = tl.load(dy_ptr + (bb * sdb + (st + q) * sdt)[:, None] + cols[None, :].to(tl.int64) * sdd,
                     mask=ok[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        if SILU:
            a = _preact(x_ptr, s_ptr, w_ptr, b_ptr, n, bb, st, q, L, ok, cols, cmask, sxb, sxt, ssn, ssd, ssw,
                        swj, swd, W, HAS_STATE, HAS_BIAS, BR, BD)
            sg = sigmoid_f32(a)
            gy = gy * (sg * (1.0 + a * (1.0 - sg)))
        wj = tl.load(w_ptr + (W - 1 - s) * swj + cols * swd, mask=cmask, other=0.0).to(tl.float32)
        dx += wj[None, :] * gy
        if s == 0:
            gy0 = gy
    if HAS_DF:
        m = p - L + W
        okf = rmask & (m >= 0) & (m < W)
        dx += tl.load(df_ptr + (n * sfn + m * sfw)[:, None] + cols[None, :] * sfd,
                      mask=okf[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    return dx, gy0


@triton.jit
def causal_conv1d_bwd_kernel(x_ptr, w_ptr, b_ptr, s_ptr, dy_ptr, df_ptr, dx_ptr, dw_ptr, db_ptr, cu_ptr, seq_ptr,
                             T, total, n_rows, D, TILES,
                             sxb, sxt, swj, swd, ssn, ssd, ssw, sdb, sdt, sdd, sfn, sfd, sfw,
                             W: tl.constexpr, WP: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr,
                             HAS_STATE: tl.constexpr, HAS_DF: tl.constexpr, VARLEN: tl.constexpr,
                             BT: tl.constexpr, BD: tl.constexpr):
    """dx for TILES consecutive [BT, BD] token tiles, and this program's fp32 partial sums of dweight
    ([W, BD] into dw_ptr[pid_c]) and dbias ([BD] into db_ptr[pid_c]); no atomics."""
    pid_d = tl.program_id(0)
    pid_c = tl.program_id(1).to(tl.int64)
    cols = pid_d * BD + tl.arange(0, BD)
    cmask = cols < D
    jr = tl.arange(0, WP)
    dw = tl.zeros([WP, BD], dtype=tl.float32)
    db = tl.zeros([BD], dtype=tl.float32)
    for i in range(TILES):
        g = (pid_c * TILES + tl.cast(i, tl.int64)) * BT + tl.arange(0, BT)
        n, bb, st, p, L, valid = _rows(g, T, total, cu_ptr, seq_ptr, VARLEN)
        dx, gy = _dxt(x_ptr, s_ptr, w_ptr, b_ptr, dy_ptr, df_ptr, n, bb, st, p, L, valid, cols, cmask,
                      sxb, sxt, ssn, ssd, ssw, swj, swd, sdb, sdt, sdd, sfn, sfd, sfw,
                      W, SILU, HAS_BIAS, HAS_STATE, HAS_DF, BT, BD)
        tl.store(dx_ptr + g[:, None] * D + cols[None, :], dx.to(dx_ptr.dtype.element_ty),
                 mask=(g < n_rows)[:, None] & cmask[None, :])
        db += tl.sum(gy, axis=0)
        for j in tl.static_range(W):
            xv = _load_x(x_ptr, bb, st, p - (W - 1) + j, L, valid, cols, cmask, sxb, sxt)
            dw += tl.where(jr[:, None] == j, tl.sum(gy * xv, axis=0)[None, :], 0.0)
        if HAS_STATE:
            if _touches_state(p, valid, W):
                for j in tl.static_range(W - 1):
                    sv = _load_s(s_ptr, n, p - (W - 1) + j, valid, cols, cmask, ssn, ssd, ssw, W)
                    dw += tl.where(jr[:, None] == j, tl.sum(gy * sv, axis=0)[None, :], 0.0)
    tl.store(dw_ptr + pid_c * W * D + jr[:, None] * D + cols[None, :], dw, mask=(jr < W)[:, None] & cmask[None, :])
    tl.store(db_ptr + pid_c * D + cols, db, mask=cmask)


@triton.jit
def causal_conv1d_bwd_state_kernel(x_ptr, w_ptr, b_ptr, s_ptr, dy_ptr, df_ptr, ds_ptr, cu_ptr, T, D,
                                   sxb, sxt, swj, swd, ssn, ssd, ssw, sdb, sdt, sdd, sfn, sfd, sfw,
                                   W: tl.constexpr, WP: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr,
                                   HAS_DF: tl.constexpr, VARLEN: tl.constexpr, BD: tl.constexpr):
    """d initial_state[n, :, m] = dx̃ at extended position m - W; ds is [N, D, W]."""
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    m = tl.arange(0, WP)
    mmask = m < W
    st, L, bb = _sequence_bounds(cu_ptr, n, T, VARLEN)
    p = m.to(tl.int64) - W
    dx, gy = _dxt(x_ptr, s_ptr, w_ptr, b_ptr, dy_ptr, df_ptr, n, bb, st, p, L, mmask, cols, cmask,
                  sxb, sxt, ssn, ssd, ssw, swj, swd, sdb, sdt, sdd, sfn, sfd, sfw,
                  W, SILU, HAS_BIAS, True, HAS_DF, WP, BD)
    tl.store(ds_ptr + n * D * W + cols[None, :] * W + m[:, None], dx.to(ds_ptr.dtype.element_ty),
             mask=mmask[:, None] & cmask[None, :])
