"""Triton kernels of the convolution family (SPEC 1.9). Kernels only: launchers live in causal_conv1d.py.

Streaming kernels (forward, backward). A program owns BD channels (VEC consecutive channels per
thread) and a chunk of G*CS consecutive rows of one batch row (fixed length) or of the packed row
(varlen: chunks ignore sequence boundaries), split into G streams of CS rows. The streams advance in
lockstep, one row each per step, as [G, BD] tiles (on the GPU one warp per stream row when D is
wide; more streams per warp when D is narrow). Each stream keeps the extended inputs ``x̃`` of its
last W-1 rows and, backward, its last W-1 ``gy`` rows in registers (tuples of tiles): every row of
x, dy, y and dx crosses the memory bus once (plus a W-1 row halo per stream), no tap is reloaded
and the activation is evaluated once per element. The forward walks up, the backward walks down
(``dx_t`` needs ``gy_{t..t+W-1}``, ``gy_t`` needs ``x̃_{t-W+1..t}``).

Each block of R steps takes one of two paths, chosen by one scalar test per block:
- fast (nearly every block): for every stream, the R rows lie inside one sequence, need no state
  slot that the window does not already hold, no final-state gradient and no window rebuild; one
  load per row and stream, no lookups (streams entirely past T are masked out);
- generic: per row sequence lookup (varlen), state slots, the upstream final-state gradient for
  the last W positions, rows past T or past ``cu_seqlens[N]`` (outputs 0), and the window rebuilt
  at every sequence edge (forward: at a sequence start from the state slots; backward: at a
  sequence end, ``gy`` window zeroed).
The windows are seeded per stream from ``x̃``, so a fixed-length forward takes the fast path for every
block (partial last ones by their row masks). State slots and final-state gradients are read from [N, W, D]
copies with unit channel stride (the launcher makes them), so a slot reads like a row of x (16-byte loads).

Row indices ``t`` address a [B, T, D] tensor (``b`` = batch row; varlen: ``b = 0`` and ``t`` the
packed row); offsets are int64. The extended input of sequence n at position q is ``x̃_q = x_q`` for
``0 <= q < L`` and ``initial_state[n, :, q + W]`` for ``-W <= q < 0`` (0 without a state).
Under the interpreter every call of a jit helper costs milliseconds, so each block is one call.
"""
import triton
import triton.language as tl

from ...triton_utils import sigmoid_fast_f32


# ----------------------------------------------------------------------------------------------------
# streaming kernels: shared helpers (called once per program, per block or per generic row)


@triton.jit
def _end(cu_ptr, total, T, VARLEN: tl.constexpr):
    """First row past the data: ``cu_seqlens[N]`` (varlen, ``total`` = N), else T."""
    if VARLEN:
        e = tl.load(cu_ptr + total).to(tl.int64)
    else:
        e = tl.cast(T, tl.int64)
    return e


@triton.jit
def _weights(w_ptr, b_ptr, cols, cm, swj, swd, W: tl.constexpr, HAS_BIAS: tl.constexpr):
    """(W-tuple of fp32 [1, BD] weight rows, fp32 [1, BD] bias or 0)."""
    ws = ()
    for j in tl.static_range(W):
        ws = ws + (tl.load(w_ptr + j * swj + cols * swd, mask=cm, other=0.0).to(tl.float32),)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros_like(cols).to(tl.float32)
    return ws, bias


@triton.jit
def _seq_rows(t, b, T, end, cu_ptr, seq_ptr, VARLEN: tl.constexpr):
    """(sequence n, position p, length L, valid) of rows t [G] (n, p, L meaningless unless valid)."""
    valid = t < end
    if VARLEN:
        n = tl.load(seq_ptr + t, mask=valid, other=0).to(tl.int64)
        st = tl.load(cu_ptr + n, mask=valid, other=0).to(tl.int64)
        L = tl.load(cu_ptr + n + 1, mask=valid, other=0).to(tl.int64) - st
        p = t - st
    else:
        n = t * 0 + b
        p = t
        L = t * 0 + T
    return n, p, L, valid


@triton.jit
def _xt(xb, q, sxt, s_ptr, n, pos, ok, cols, cm, ssn, ssw, W: tl.constexpr, HAS_STATE: tl.constexpr):
    """fp32 [G, BD] tile of ``x̃`` at positions pos [G] of sequences n (raw rows q = rows of those
    positions when pos >= 0): x, a state slot, or 0 (no state, or where ok is false)."""
    v = tl.load((xb + q * sxt)[:, None] + cols, mask=(ok & (pos >= 0))[:, None] & cm, other=0.0).to(tl.float32)
    if HAS_STATE:
        sm = ok & (pos < 0) & (pos >= -W)
        sv = tl.load((s_ptr + n * ssn + (pos + W) * ssw)[:, None] + cols, mask=sm[:, None] & cm, other=0.0)
        v = tl.where(sm[:, None], sv.to(tl.float32), v)  # a select keeps -0.0
    return v


# ----------------------------------------------------------------------------------------------------
# forward


@triton.jit
def _preact_taps(taps, ws, bias, W: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Pre-activation of a row block, fp32: ``bias + Σ_j w_j · taps_j`` (taps oldest first)."""
    if HAS_BIAS:
        a = bias + ws[0] * taps[0]
    else:
        a = ws[0] * taps[0]
    for j in tl.static_range(1, W):
        a += ws[j] * taps[j]
    return a


@triton.jit
def _act_grad(a, dy, SILU: tl.constexpr):
    """Gradient at the pre-activation: ``dy · silu'(a)`` (or ``dy`` without activation)."""
    if SILU:
        sg = sigmoid_fast_f32(a)
        dy = dy * (sg * (1.0 + a * (1.0 - sg)))
    return dy


@triton.jit
def _bwd_step(gy, gwin, taps, ws, dw, db, W: tl.constexpr):
    """One row of the backward walk: ``dx`` from this row's ``gy`` and the later rows' (``gwin``,
    newest first), and the row's contribution added to the ``dweight``/``dbias`` partials."""
    dx = ws[W - 1] * gy
    for s in tl.static_range(1, W):
        dx += ws[W - 1 - s] * gwin[s - 1]
    dwn = ()
    for j in tl.static_range(W):
        dwn = dwn + (dw[j] + gy * taps[j],)
    return dx, dwn, db + gy


@triton.jit
def _fwd_block_fast(win, r0, T, xb, yb, rb, cols, cm, ws, bias, sxt, srt, D,
                    W: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                    R: tl.constexpr):
    """R steps: rows r0..r0+R-1 of every stream (streams past T masked out), taps from the window.
    All loads of the block are issued before the first store (the compiler cannot move a load above
    a store to a pointer that might alias it)."""
    xs = ()
    rs = ()
    for r in tl.static_range(R):
        t = r0 + r
        m = (t < T)[:, None] & cm
        xs = xs + (tl.load(xb + (t * sxt)[:, None] + cols, mask=m, other=0.0),)
        if HAS_RES:
            rs = rs + (tl.load(rb + (t * srt)[:, None] + cols, mask=m, other=0.0),)
    for r in tl.static_range(R):
        t = r0 + r
        taps = win + (xs[r].to(tl.float32),)
        a = _preact_taps(taps, ws, bias, W, HAS_BIAS)
        y = a
        if SILU:
            y = a * sigmoid_fast_f32(a)
        if HAS_RES:
            y += rs[r].to(tl.float32)
        tl.store(yb + (t * D)[:, None] + cols, y.to(yb.dtype.element_ty), mask=(t < T)[:, None] & cm)
        win = taps[1:]
    return win


@triton.jit
def _fwd_block_generic(win, r0, b, T, end, xb, yb, rb, s_ptr, cu_ptr, seq_ptr, cols, cm, ws, bias,
                       sxt, srt, ssn, ssw, D,
                       W: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                       HAS_STATE: tl.constexpr, VARLEN: tl.constexpr, R: tl.constexpr):
    """R steps of any rows: a sequence start resets the window to the state slots (or 0); rows past T
    are skipped, rows past end get y = 0."""
    for r in range(R):  # a runtime loop: little code, few registers (the rare path)
        t = r0 + tl.cast(r, tl.int64)
        inch = t < T
        n, p, L, valid = _seq_rows(t, b, T, end, cu_ptr, seq_ptr, VARLEN)
        ok = inch & valid
        start = ok & (p == 0)
        new = ()
        for k in tl.static_range(W - 1):
            if HAS_STATE:
                sv = tl.load((s_ptr + n * ssn + (k + 1) * ssw)[:, None] + cols, mask=start[:, None] & cm,
                             other=0.0).to(tl.float32)
            else:
                sv = 0.0
            new = new + (tl.where(start[:, None], sv, win[k]),)
        xv = tl.load(xb + (t * sxt)[:, None] + cols, mask=ok[:, None] & cm, other=0.0).to(tl.float32)
        taps = new + (xv,)
        a = _preact_taps(taps, ws, bias, W, HAS_BIAS)
        y = a
        if SILU:
            y = a * sigmoid_fast_f32(a)
        if HAS_RES:
            y += tl.load(rb + (t * srt)[:, None] + cols, mask=ok[:, None] & cm, other=0.0).to(tl.float32)
        y = tl.where(ok[:, None], y, 0.0)  # rows past cu_seqlens[N] get 0
        tl.store(yb + (t * D)[:, None] + cols, y.to(yb.dtype.element_ty), mask=inch[:, None] & cm)
        win = taps[1:]
    return win


@triton.jit
def causal_conv1d_fwd_kernel(x_ptr, w_ptr, b_ptr, r_ptr, s_ptr, y_ptr, cu_ptr, seq_ptr, T, total, D, n_ct,
                             sxb, sxt, swj, swd, srb, srt, ssn, ssd, ssw, CS,
                             W: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                             HAS_STATE: tl.constexpr, VARLEN: tl.constexpr,
                             G: tl.constexpr, R: tl.constexpr, BD: tl.constexpr):
    """y = act(a) + residual for the G*CS rows of chunk ``pid % n_ct`` of batch row ``pid // n_ct``
    (stream g: rows [.. + g*CS, .. + (g+1)*CS)); y is contiguous [B, T, D]; rows past
    cu_seqlens[N] get 0. CS is a multiple of R; the state is [N, W, D]-shaped (ssd = 1)."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // n_ct
    s0 = (pid - b * n_ct) * G * CS + tl.arange(0, G).to(tl.int64) * CS  # first row of each stream
    cols = (tl.program_id(1) * BD + tl.arange(0, BD))[None, :]
    cm = cols < D
    end = _end(cu_ptr, total, T, VARLEN)
    ws, bias = _weights(w_ptr, b_ptr, cols, cm, swj, swd, W, HAS_BIAS)
    xb = x_ptr + b * sxb
    yb = y_ptr + b * T * D
    rb = r_ptr + b * srb
    n0, p0, L0, ok0 = _seq_rows(s0, b, T, end, cu_ptr, seq_ptr, VARLEN)
    win = ()  # x̃ of rows t-W+1 .. t-1, in the sequence of row t
    for k in tl.static_range(W - 1):
        win = win + (_xt(xb, s0 - (W - 1) + k, sxt, s_ptr, n0, p0 - (W - 1) + k, ok0, cols, cm, ssn, ssw,
                         W, HAS_STATE),)
    for i in range(0, CS // R):
        r0 = s0 + tl.cast(i, tl.int64) * R
        if W > 1 and not VARLEN:  # one sequence per batch row, its start set up above: every block is fast (the
            # row masks cover a partial last block), with no per-block check across the streams (cross-warp)
            win = _fwd_block_fast(win, r0, T, xb, yb, rb, cols, cm, ws, bias, sxt, srt, D,
                                  W, SILU, HAS_BIAS, HAS_RES, R)
        else:
            last = r0 + (R - 1)
            good = last < T
            if VARLEN:  # no sequence start in the block (the window is already that of the sequence)
                okb = last < end
                n_lo = tl.load(seq_ptr + r0, mask=okb, other=0)
                n_hi = tl.load(seq_ptr + last, mask=okb, other=-1)
                st = tl.load(cu_ptr + n_lo, mask=okb, other=0).to(tl.int64)
                good = okb & (n_lo == n_hi) & (r0 > st)
            if W > 1 and tl.min((good | (r0 >= T)).to(tl.int32), axis=0) > 0:  # (W = 1: empty windows)
                win = _fwd_block_fast(win, r0, T, xb, yb, rb, cols, cm, ws, bias, sxt, srt, D,
                                      W, SILU, HAS_BIAS, HAS_RES, R)
            else:
                win = _fwd_block_generic(win, r0, b, T, end, xb, yb, rb, s_ptr, cu_ptr, seq_ptr, cols, cm, ws,
                                         bias, sxt, srt, ssn, ssw, D, W, SILU, HAS_BIAS, HAS_RES, HAS_STATE,
                                         VARLEN, R)


# ----------------------------------------------------------------------------------------------------
# backward


@triton.jit
def _gy_rows(t, n, p, ok, xb, dyb, s_ptr, cols, cm, ws, bias, sxt, sdt, sdd, ssn, ssw,
             W: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr):
    """gy of rows t [G] at positions p of sequences n, from scratch (0 where ok is false): the
    backward's halo rows past each stream."""
    a = bias
    for j in tl.static_range(W):
        v = _xt(xb, t - (W - 1) + j, sxt, s_ptr, n, p - (W - 1) + j, ok, cols, cm, ssn, ssw, W, HAS_STATE)
        if j == 0 and not HAS_BIAS:
            a = ws[0] * v
        else:
            a += ws[j] * v
    dy = tl.load(dyb + (t * sdt)[:, None] + cols.to(tl.int64) * sdd, mask=ok[:, None] & cm, other=0.0).to(tl.float32)
    return tl.where(ok[:, None], _act_grad(a, dy, SILU), 0.0)


@triton.jit
def _bwd_block_fast(win, gwin, dw, db, hi, T, end, xb, dyb, dxb, cols, cm, ws, bias, sxt, sdt, sdd, D,
                    W: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, R: tl.constexpr):
    """R steps down from rows hi of every stream: taps are x rows t-W+1..t, gwin = gy_{t+1..t+W-1}.
    Streams past T keep loading their taps (the rows below them use them) but read no dy and store
    nothing. All loads of the block are issued before the first store."""
    xs = ()
    dys = ()
    for r in tl.static_range(R):
        t = hi - r
        q = t - (W - 1)
        xs = xs + (tl.load(xb + (q * sxt)[:, None] + cols, mask=((q >= 0) & (q < end))[:, None] & cm,
                           other=0.0),)
        dys = dys + (tl.load(dyb + (t * sdt)[:, None] + cols.to(tl.int64) * sdd, mask=(t < T)[:, None] & cm, other=0.0),)
    for r in tl.static_range(R):
        t = hi - r
        taps = (xs[r].to(tl.float32),) + win
        gy = _act_grad(_preact_taps(taps, ws, bias, W, HAS_BIAS), dys[r].to(tl.float32), SILU)
        dx, dw, db = _bwd_step(gy, gwin, taps, ws, dw, db, W)
        tl.store(dxb + (t * D)[:, None] + cols, dx.to(dxb.dtype.element_ty), mask=(t < T)[:, None] & cm)
        win = taps[:W - 1]
        gwin = ((gy,) + gwin)[:W - 1]
    return win, gwin, dw, db


@triton.jit
def _bwd_block_generic(win, gwin, dw, db, hi, b, T, end, xb, dyb, dxb, s_ptr, df_ptr, cu_ptr, seq_ptr, cols, cm,
                       ws, bias, sxt, sdt, sdd, ssn, ssw, sfn, sfw, D,
                       W: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr,
                       HAS_DF: tl.constexpr, VARLEN: tl.constexpr, R: tl.constexpr):
    """R steps down of any rows: the last row of a sequence rebuilds the window (x̃ of its sequence)
    and zeroes the gy window; state slots, final-state gradient; rows past T or end give dx = 0."""
    for r in range(R):  # a runtime loop: little code, few registers (the rare path)
        t = hi - tl.cast(r, tl.int64)
        inch = t < T
        n, p, L, valid = _seq_rows(t, b, T, end, cu_ptr, seq_ptr, VARLEN)
        ok = inch & valid
        last = ok & (p == L - 1)
        new = ()
        gnew = ()
        for k in tl.static_range(W - 1):
            v = _xt(xb, t - (W - 2) + k, sxt, s_ptr, n, p - (W - 2) + k, last, cols, cm, ssn, ssw, W, HAS_STATE)
            new = new + (tl.where(last[:, None], v, win[k]),)
            gnew = gnew + (tl.where(last[:, None], 0.0, gwin[k]),)
        taps = (_xt(xb, t - (W - 1), sxt, s_ptr, n, p - (W - 1), ok, cols, cm, ssn, ssw, W, HAS_STATE),) + new
        gy = tl.load(dyb + (t * sdt)[:, None] + cols.to(tl.int64) * sdd, mask=ok[:, None] & cm, other=0.0).to(tl.float32)
        gy = tl.where(ok[:, None], _act_grad(_preact_taps(taps, ws, bias, W, HAS_BIAS), gy, SILU), 0.0)
        dx, dw, db = _bwd_step(gy, gnew, taps, ws, dw, db, W)
        if HAS_DF:
            mf = p - L + W  # final-state slot that copied x_t
            dx += tl.load((df_ptr + n * sfn + mf * sfw)[:, None] + cols, mask=(ok & (mf >= 0))[:, None] & cm,
                          other=0.0).to(tl.float32)
        tl.store(dxb + (t * D)[:, None] + cols, dx.to(dxb.dtype.element_ty), mask=inch[:, None] & cm)
        win = taps[:W - 1]
        gwin = ((gy,) + gnew)[:W - 1]
    return win, gwin, dw, db


@triton.jit
def causal_conv1d_bwd_kernel(x_ptr, w_ptr, b_ptr, s_ptr, dy_ptr, df_ptr, dx_ptr, part_ptr, cu_ptr, seq_ptr,
                             T, total, D, n_ct,
                             sxb, sxt, swj, swd, ssn, ssd, ssw, sdb, sdt, sdd, sfn, sfd, sfw, CS,
                             W: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr,
                             HAS_DF: tl.constexpr, VARLEN: tl.constexpr,
                             G: tl.constexpr, R: tl.constexpr, BD: tl.constexpr):
    """dx for the G*CS rows of chunk ``pid % n_ct`` of batch row ``pid // n_ct``, every stream walked
    downwards, and this program's fp32 partial sums of dweight and dbias (rows 0..W-1 and W of
    part_ptr[pid], a [programs, W+1, D] buffer); no atomics. CS is a multiple of R; the state and the final-state
    gradient are [N, W, D]-shaped (ssd = sfd = 1)."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // n_ct
    s1 = (pid - b * n_ct) * G * CS + (tl.arange(0, G).to(tl.int64) + 1) * CS  # one past each stream's rows
    cols = (tl.program_id(1) * BD + tl.arange(0, BD))[None, :]
    cm = cols < D
    end = _end(cu_ptr, total, T, VARLEN)
    ws, bias = _weights(w_ptr, b_ptr, cols, cm, swj, swd, W, HAS_BIAS)
    xb = x_ptr + b * sxb
    dyb = dy_ptr + b * sdb
    dxb = dx_ptr + b * T * D
    # windows of the first row processed (s1 - 1): x̃ of rows s1-W+1 .. s1-1 and gy of rows s1 .. s1+W-2
    # of its sequence (0 past the sequence end)
    u = s1 - 1
    nu, pu, Lu, oku = _seq_rows(u, b, T, end, cu_ptr, seq_ptr, VARLEN)
    oku = oku & (u < T)
    win = ()
    gwin = ()
    for k in tl.static_range(W - 1):  # (taps below T are loaded even when row u is past T: fast rows use them)
        win = win + (_xt(xb, u - (W - 2) + k, sxt, s_ptr, nu, pu - (W - 2) + k, u - (W - 2) + k < end, cols, cm,
                         ssn, ssw, W, HAS_STATE),)
        gwin = gwin + (_gy_rows(s1 + k, nu, pu + 1 + k, oku & (pu + 1 + k < Lu), xb, dyb, s_ptr, cols, cm, ws, bias,
                                sxt, sdt, sdd, ssn, ssw, W, SILU, HAS_BIAS, HAS_STATE),)
    dw = ()
    for j in tl.static_range(W):
        dw = dw + (tl.zeros([G, BD], dtype=tl.float32),)
    db = tl.zeros([G, BD], dtype=tl.float32)
    for i in range(0, CS // R):
        hi = s1 - 1 - tl.cast(i, tl.int64) * R
        lo = hi - (R - 1)
        if VARLEN:  # one sequence, no state tap, not its last row (no window rebuild), no final-state slot
            okb = hi < end
            n_lo = tl.load(seq_ptr + lo, mask=okb, other=0)
            n_hi = tl.load(seq_ptr + hi, mask=okb, other=-1)
            st = tl.load(cu_ptr + n_lo, mask=okb, other=0).to(tl.int64)
            en = tl.load(cu_ptr + n_lo + 1, mask=okb, other=0).to(tl.int64)
            good = okb & (n_lo == n_hi) & (lo - st >= W - 1)
            if HAS_DF:
                good = good & (hi + W < en)
            else:
                good = good & (hi + 1 < en)
        else:
            good = (hi < T) & (lo >= W - 1)
            if HAS_DF:
                good = good & (hi + W < T)
        if W > 1 and tl.min((good | (lo >= T)).to(tl.int32), axis=0) > 0:  # (W = 1: empty windows)
            win, gwin, dw, db = _bwd_block_fast(win, gwin, dw, db, hi, T, end, xb, dyb, dxb, cols, cm, ws, bias,
                                                sxt, sdt, sdd, D, W, SILU, HAS_BIAS, R)
        else:
            win, gwin, dw, db = _bwd_block_generic(win, gwin, dw, db, hi, b, T, end, xb, dyb, dxb, s_ptr, df_ptr,
                                                   cu_ptr, seq_ptr, cols, cm, ws, bias, sxt, sdt, sdd,
                                                   ssn, ssw, sfn, sfw, D,
                                                   W, SILU, HAS_BIAS, HAS_STATE, HAS_DF, VARLEN, R)
    c1 = tl.program_id(1) * BD + tl.arange(0, BD)
    for j in tl.static_range(W):
        tl.store(part_ptr + (pid * (W + 1) + j) * D + c1, tl.sum(dw[j], axis=0), mask=c1 < D)
    tl.store(part_ptr + (pid * (W + 1) + W) * D + c1, tl.sum(db, axis=0), mask=c1 < D)


# ----------------------------------------------------------------------------------------------------
# per-sequence state kernels (final state, d initial_state) and their tile helpers


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
            gy = _act_grad(a, gy, True)
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
