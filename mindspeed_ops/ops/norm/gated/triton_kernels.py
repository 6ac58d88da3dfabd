"""Triton kernels of the gated RMSNorm (SPEC 1.3). Kernels only: launchers live in ``rms_norm_gated.py``.

Rows are ``[M, D]``; each row is normalised per group of ``N = group_size`` channels (``N = D`` by
default). Program axis 1 is the group ``k``, so a program only ever touches columns
``[k·N, (k+1)·N)`` and loads its slice of ``weight``/``bias`` once. All math is fp32; each output
is rounded once on store (``casting='input'`` adds Qwen3-Next's intermediate roundings, done in
registers with :func:`round_to`).

Per row and group, with ``x' = round(res_dtype, x + residual)`` (or ``x``) and ``a = act(g)``:

- ``norm_before_gate``: ``u = x'``,      ``r = rsqrt(mean(u²) + eps)``, ``y = (u·r ⊙ w + b) ⊙ a``;
- otherwise:           ``u = x' ⊙ a``,  ``r = rsqrt(mean(u²) + eps)``, ``y = u·r ⊙ w + b``.

Backward, with ``û = u·r`` and ``gw = dy ⊙ a ⊙ w`` (``dy ⊙ w`` when the gate comes first):
``du = r·(gw − û·mean(gw ⊙ û))`` (the RMS backward), then ``dx' = du`` and ``dg = dy ⊙ y0 ⊙ act'(g)``
(``y0 = û ⊙ w + b``), or ``dx' = du ⊙ a`` and ``dg = du ⊙ x' ⊙ act'(g)``. ``dweight``/``dbias`` are
fp32 per-program partials (``[programs, D]``) that the launcher sums: deterministic, no atomics.

Two paths, chosen by the launcher from ``N`` only (batch-size invariance):

- tile path: ``BM`` whole group-rows per tile (``BN >= N``); the forward reads x (and g, residual)
  once; the backward loops a program over consecutive row blocks, keeping the dweight/dbias
  accumulators in registers;
- looped path (``N`` beyond one tile, e.g. 65,536): the row is walked in ``BN`` chunks, twice (a
  statistics pass and an output pass). The backward keeps ``(r, c)`` per row in a small fp32
  scratch and walks chunks in the outer loop, so each program's dweight partial is written once.
"""
import triton
import triton.language as tl

from ....triton_utils import sigmoid_f32
from ..triton_kernels import row_sum_squares, rms_bwd_rows, rstd_from_sum_squares

# dtype codes for in-register rounding (launchers map torch dtypes to these)
CODE_F32 = 0
CODE_F16 = 1
CODE_BF16 = 2
# activation codes
ACT_SWISH = 0
ACT_SIGMOID = 1


# ------------------------------------------------------------------------------------------------
# Small pieces


@triton.jit
def round_to(x, CODE: tl.constexpr):
    """Round an fp32 tensor to fp16 (``CODE=1``) or bf16 (``CODE=2``) and back, round-to-nearest-even.

    bf16 is rounded with integer ops on the fp32 bits, which is exact on the GPU and under the CPU
    interpreter (whose fp32->bf16 cast truncates). NaN is kept; overflow rounds to ±inf.
    ``CODE=0`` (fp32) returns ``x``.
    """
    if CODE == 2:
        u = x.to(tl.uint32, bitcast=True)
        u = u + (0x7FFF + ((u >> 16) & 1))
        rounded = ((u >> 16) << 16).to(tl.float32, bitcast=True)
        out = tl.where(x == x, rounded, x)
    elif CODE == 1:
        out = x.to(tl.float16).to(tl.float32)
    else:
        out = x
    return out


@triton.jit
def act_fwd(gate, ACT: tl.constexpr):
    """``act(g)``: ``g·σ(g)`` (swish/silu) or ``σ(g)`` (sigmoid), fp32 (the unused derivative is
    dead code the compiler drops)."""
    a, _ = act_fwd_bwd(gate, ACT)
    return a


@triton.jit
def act_fwd_bwd(gate, ACT: tl.constexpr):
    """``(act(g), act'(g))``: swish ``(g·s, s + g·s·(1−s))``, sigmoid ``(s, s·(1−s))``, ``s = σ(g)``."""
    s = sigmoid_f32(gate)
    if ACT == 0:
        a = gate * s
        da = s + a * (1.0 - s)
    else:
        a = s
        da = s * (1.0 - s)
    return a, da


@triton.jit
def _load_xp(X, R, rows, cols, mask, stride_x, stride_r, HAS_RES: tl.constexpr, RES_CODE: tl.constexpr):
    """``x'`` of a ``[BM, BN]`` tile in fp32: ``x``, or ``x + residual`` rounded to ``residual_out``'s dtype."""
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        res = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = round_to(x + res, RES_CODE)
    return x


@triton.jit
def _fwd_y(u, a, w, b, r, NBG: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
           CAST_INPUT: tl.constexpr, X_CODE: tl.constexpr, Y1_CODE: tl.constexpr):
    """Forward output of a tile from ``u`` (``x'`` or ``x'⊙a``), ``a``, ``[BN]`` ``w``/``b`` and ``[BM]`` ``r``."""
    uh = u * r[:, None]
    if NBG:
        if CAST_INPUT:
            # Qwen3-Next: h = round(x.dtype, x'·r); y1 = round(promote, w·h); y = y1·act(g) (rounded on store)
            h = round_to(uh, X_CODE)
            if HAS_W:
                h = round_to(h * w[None, :], Y1_CODE)
            y = h * a
        else:
            y = uh
            if HAS_W:
                y = y * w[None, :]
            if HAS_B:
                y = y + b[None, :]
            y = y * a
    else:
        y = uh
        if HAS_W:
            y = y * w[None, :]
        if HAS_B:
            y = y + b[None, :]
    return y


@triton.jit
def _bwd_pre(xp, gate, dy, w, ACT: tl.constexpr, NBG: tl.constexpr, HAS_W: tl.constexpr):
    """``(u, gw, a, da)``: the normalised quantity, the gradient reaching ``û``, ``act`` and ``act'``."""
    a, da = act_fwd_bwd(gate, ACT)
    if NBG:
        u = xp
        gw = dy * a
    else:
        u = xp * a
        gw = dy
    if HAS_W:
        gw = gw * w[None, :]
    return u, gw, a, da


@triton.jit
def _bwd_out(xp, uh, du, a, da, dy, w, b, NBG: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """``(dx', dg, dweight term, dbias term)`` of a tile from ``du`` (gradient of ``u``) and ``û``."""
    if NBG:
        dy0 = dy * a
        y0 = uh
        if HAS_W:
            y0 = y0 * w[None, :]
        if HAS_B:
            y0 = y0 + b[None, :]
        dg = dy * y0 * da
        dx = du
        cw = dy0 * uh
        cb = dy0
    else:
        dx = du * a
        dg = du * xp * da
        cw = dy * uh
        cb = dy
    return dx, dg, cw, cb


@triton.jit
def _load_wb(W, B, cols, cmask, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BN: tl.constexpr):
    if HAS_W:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        w = tl.zeros([BN], dtype=tl.float32)
    if HAS_B:
        b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        b = tl.zeros([BN], dtype=tl.float32)
    return w, b


@triton.jit
def _store_grads(DX, DG, DR, DRO, rows, cols, mask, dx, dg, stride_dx, stride_dg, stride_dr,
                 stride_dro_row, stride_dro_col, HAS_RES: tl.constexpr, HAS_DRO: tl.constexpr):
    """Store ``dx = dx' (+ d residual_out)``, ``dg`` and, with a residual, ``dresidual = dx``."""
    if HAS_DRO:
        dx += tl.load(DRO + rows[:, None] * stride_dro_row + cols[None, :].to(tl.int64) * stride_dro_col,
                      mask=mask, other=0.0).to(tl.float32)
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DG + rows[:, None] * stride_dg + cols[None, :], dg.to(DG.dtype.element_ty), mask=mask)
    if HAS_RES:
        tl.store(DR + rows[:, None] * stride_dr + cols[None, :], dx.to(DR.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------------
# Tile path: BM whole group-rows per tile


@triton.jit
def gated_fwd_tile_kernel(X, G, W, B, R, Y, RO, M, N, stride_x, stride_g, stride_r, stride_y, stride_ro,
                          inv_n, eps,
                          ACT: tl.constexpr, NBG: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                          HAS_RES: tl.constexpr, STORE_RES: tl.constexpr, CAST_INPUT: tl.constexpr,
                          X_CODE: tl.constexpr, RES_CODE: tl.constexpr, Y1_CODE: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr):
    """Grid ``(cdiv(M, BM), D // N)``: rows ``[pid·BM, pid·BM + BM)``, group ``program_id(1)``; ``BN >= N``."""
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cidx = tl.arange(0, BN)
    cmask = cidx < N
    cols = tl.program_id(1) * N + cidx
    mask = (rows < M)[:, None] & cmask[None, :]
    xp = _load_xp(X, R, rows, cols, mask, stride_x, stride_r, HAS_RES, RES_CODE)
    if STORE_RES:
        tl.store(RO + rows[:, None] * stride_ro + cols[None, :], xp.to(RO.dtype.element_ty), mask=mask)
    gate = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    a = act_fwd(gate, ACT)
    w, b = _load_wb(W, B, cols, cmask, HAS_W, HAS_B, BN)
    if NBG:
        u = xp
    else:
        u = xp * a
    r = rstd_from_sum_squares(row_sum_squares(u), inv_n, eps)
    y = _fwd_y(u, a, w, b, r, NBG, HAS_W, HAS_B, CAST_INPUT, X_CODE, Y1_CODE)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def gated_bwd_tile_kernel(X, G, W, B, R, DY, DRO, DX, DG, DR, DWP, DBP, M, N, D, blocks_per_prog,
                          stride_x, stride_g, stride_r, stride_dy_row, stride_dy_col, stride_dro_row,
                          stride_dro_col, stride_dx, stride_dg, stride_dr, inv_n, eps,
                          ACT: tl.constexpr, NBG: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                          HAS_RES: tl.constexpr, HAS_DRO: tl.constexpr, RES_CODE: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr):
    """Grid ``(programs, D // N)``: program ``pid`` takes row blocks ``[pid·bpp, (pid+1)·bpp)`` of group
    ``program_id(1)``. ``DY``/``DRO`` have any strides (stride 0 included). Writes its fp32 partial
    ``Σ dy0 ⊙ û`` / ``Σ dy0`` to row ``pid`` of ``DWP``/``DBP`` (``[programs, D]``)."""
    pid = tl.program_id(0).to(tl.int64)
    cidx = tl.arange(0, BN)
    cmask = cidx < N
    cols = tl.program_id(1) * N + cidx
    w, b = _load_wb(W, B, cols, cmask, HAS_W, HAS_B, BN)
    acc_w = tl.zeros([BM, BN], dtype=tl.float32)
    acc_b = tl.zeros([BM, BN], dtype=tl.float32)
    for i in range(0, blocks_per_prog):
        rows = (pid * blocks_per_prog + i) * BM + tl.arange(0, BM)
        mask = (rows < M)[:, None] & cmask[None, :]
        xp = _load_xp(X, R, rows, cols, mask, stride_x, stride_r, HAS_RES, RES_CODE)
        gate = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :].to(tl.int64) * stride_dy_col,
                     mask=mask, other=0.0).to(tl.float32)
        u, gw, a, da = _bwd_pre(xp, gate, dy, w, ACT, NBG, HAS_W)
        r = rstd_from_sum_squares(row_sum_squares(u), inv_n, eps)
        uh = u * r[:, None]
        du = rms_bwd_rows(gw, uh, r, 0.0, inv_n)
        dx, dg, cw, cb = _bwd_out(xp, uh, du, a, da, dy, w, b, NBG, HAS_W, HAS_B)
        _store_grads(DX, DG, DR, DRO, rows, cols, mask, dx, dg, stride_dx, stride_dg, stride_dr,
                     stride_dro_row, stride_dro_col, HAS_RES, HAS_DRO)
        if HAS_W:
            acc_w += tl.where(mask, cw, 0.0)
        if HAS_B:
            acc_b += tl.where(mask, cb, 0.0)
    if HAS_W:
        tl.store(DWP + pid * D + cols, tl.sum(acc_w, axis=0), mask=cmask)
    if HAS_B:
        tl.store(DBP + pid * D + cols, tl.sum(acc_b, axis=0), mask=cmask)


# ------------------------------------------------------------------------------------------------
# Looped path: group-rows longer than one tile


@triton.jit
def gated_fwd_looped_kernel(X, G, W, B, R, Y, RO, M, N, stride_x, stride_g, stride_r, stride_y, stride_ro,
                            inv_n, eps,
                            ACT: tl.constexpr, NBG: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                            HAS_RES: tl.constexpr, STORE_RES: tl.constexpr, CAST_INPUT: tl.constexpr,
                            X_CODE: tl.constexpr, RES_CODE: tl.constexpr, Y1_CODE: tl.constexpr,
                            BM: tl.constexpr, BN: tl.constexpr):
    """Grid ``(cdiv(M, BM), D // N)``; the group is walked in ``BN`` chunks twice (sum of squares,
    then output). Lane-wise partial sums are reduced once, so the order depends on ``N``/``BN`` only."""
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rmask = rows < M
    base = tl.program_id(1) * N
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for start in range(0, N, BN):
        cidx = start + tl.arange(0, BN)
        cols = base + cidx
        mask = rmask[:, None] & (cidx < N)[None, :]
        xp = _load_xp(X, R, rows, cols, mask, stride_x, stride_r, HAS_RES, RES_CODE)
        if STORE_RES:
            tl.store(RO + rows[:, None] * stride_ro + cols[None, :], xp.to(RO.dtype.element_ty), mask=mask)
        if NBG:
            u = xp
        else:
            gate = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            u = xp * act_fwd(gate, ACT)
        acc += u * u
    r = rstd_from_sum_squares(tl.sum(acc, axis=1), inv_n, eps)
    for start in range(0, N, BN):
        cidx = start + tl.arange(0, BN)
        cmask = cidx < N
        cols = base + cidx
        mask = rmask[:, None] & cmask[None, :]
        xp = _load_xp(X, R, rows, cols, mask, stride_x, stride_r, HAS_RES, RES_CODE)
        gate = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        a = act_fwd(gate, ACT)
        w, b = _load_wb(W, B, cols, cmask, HAS_W, HAS_B, BN)
        if NBG:
            u = xp
        else:
            u = xp * a
        y = _fwd_y(u, a, w, b, r, NBG, HAS_W, HAS_B, CAST_INPUT, X_CODE, Y1_CODE)
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def gated_bwd_looped_kernel(X, G, W, B, R, DY, DRO, DX, DG, DR, DWP, DBP, STATS, M, N, D, NG, rows_per_prog,
                            iters, stride_x, stride_g, stride_r, stride_dy_row, stride_dy_col, stride_dro_row,
                            stride_dro_col, stride_dx, stride_dg, stride_dr, inv_n, eps,
                            ACT: tl.constexpr, NBG: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                            HAS_RES: tl.constexpr, HAS_DRO: tl.constexpr, RES_CODE: tl.constexpr,
                            BM: tl.constexpr, BN: tl.constexpr):
    """Grid ``(programs, D // N)``: program ``pid`` owns rows ``[pid·rpp, (pid+1)·rpp)`` of group
    ``program_id(1)`` (``iters = cdiv(rpp, BM)`` row blocks).

    Pass 1 stores ``r`` and ``c = r·mean(gw ⊙ u)`` per (row, group) to ``STATS`` (fp32 ``[M·NG, 2]``);
    pass 2 walks column chunks (outer) and rows (inner), writes ``dx``/``dg`` and this program's
    dweight/dbias partial for the chunk (row ``pid`` of ``DWP``/``DBP``)."""
    pid = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1)
    base = k * N
    row_lo = pid * rows_per_prog
    row_hi = tl.minimum(row_lo + rows_per_prog, M)
    for i in range(0, iters):
        rows = row_lo + tl.cast(i, tl.int64) * BM + tl.arange(0, BM)
        rmask = rows < row_hi
        acc_ss = tl.zeros([BM, BN], dtype=tl.float32)
        acc_gu = tl.zeros([BM, BN], dtype=tl.float32)
        for start in range(0, N, BN):
            cidx = start + tl.arange(0, BN)
            cmask = cidx < N
            cols = base + cidx
            mask = rmask[:, None] & cmask[None, :]
            xp = _load_xp(X, R, rows, cols, mask, stride_x, stride_r, HAS_RES, RES_CODE)
            gate = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :].to(tl.int64) * stride_dy_col,
                         mask=mask, other=0.0).to(tl.float32)
            w, b = _load_wb(W, B, cols, cmask, HAS_W, False, BN)
            u, gw, a, da = _bwd_pre(xp, gate, dy, w, ACT, NBG, HAS_W)
            acc_ss += u * u
            acc_gu += gw * u
        r = rstd_from_sum_squares(tl.sum(acc_ss, axis=1), inv_n, eps)
        c = r * tl.sum(acc_gu, axis=1) * inv_n
        sidx = (rows * NG + k) * 2
        tl.store(STATS + sidx, r, mask=rmask)
        tl.store(STATS + sidx + 1, c, mask=rmask)
    tl.debug_barrier()  # pass 2 reads statistics that other threads of this program wrote
    for start in range(0, N, BN):
        cidx = start + tl.arange(0, BN)
        cmask = cidx < N
        cols = base + cidx
        w, b = _load_wb(W, B, cols, cmask, HAS_W, HAS_B, BN)
        acc_w = tl.zeros([BM, BN], dtype=tl.float32)
        acc_b = tl.zeros([BM, BN], dtype=tl.float32)
        for i in range(0, iters):
            rows = row_lo + tl.cast(i, tl.int64) * BM + tl.arange(0, BM)
            rmask = rows < row_hi
            mask = rmask[:, None] & cmask[None, :]
            sidx = (rows * NG + k) * 2
            r = tl.load(STATS + sidx, mask=rmask, other=0.0)
            c = tl.load(STATS + sidx + 1, mask=rmask, other=0.0)
            xp = _load_xp(X, R, rows, cols, mask, stride_x, stride_r, HAS_RES, RES_CODE)
            gate = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :].to(tl.int64) * stride_dy_col,
                         mask=mask, other=0.0).to(tl.float32)
            u, gw, a, da = _bwd_pre(xp, gate, dy, w, ACT, NBG, HAS_W)
            uh = u * r[:, None]
            du = r[:, None] * (gw - uh * c[:, None])
            dx, dg, cw, cb = _bwd_out(xp, uh, du, a, da, dy, w, b, NBG, HAS_W, HAS_B)
            _store_grads(DX, DG, DR, DRO, rows, cols, mask, dx, dg, stride_dx, stride_dg, stride_dr,
                         stride_dro_row, stride_dro_col, HAS_RES, HAS_DRO)
            if HAS_W:
                acc_w += tl.where(mask, cw, 0.0)
            if HAS_B:
                acc_b += tl.where(mask, cb, 0.0)
        if HAS_W:
            tl.store(DWP + pid * D + cols, tl.sum(acc_w, axis=0), mask=cmask)
        if HAS_B:
            tl.store(DBP + pid * D + cols, tl.sum(acc_b, axis=0), mask=cmask)
