"""Triton kernels of the norm family (``l2norm``, ``rmsnorm_without_weight``, ``rms_norm``).

Kernels only: launchers (tile sizes, grids, dtypes) live in ``l2norm.py`` / ``rms_norm.py``.

One row-kernel design serves all three operators. For a row ``x`` of ``D`` values (fp32 math):

    r = 1 / sqrt(Σ_d x_d² · inv_n + eps)        inv_n = 1 (l2norm) or 1/D (RMS norms)
    x̂ = x · r,   y = x̂ ⊙ (w + offset)  (or y = x̂ without a weight)

and the backward, with ``g = dy ⊙ (w + offset)`` (or ``dy``, or 0 when there is no ``dy``) and an
optional upstream gradient ``dr`` of ``r`` itself:

    c  = (Σ_d g_d·x̂_d + dr·r) · inv_n,     dx = r · (g − x̂·c),     dw = Σ_rows dy ⊙ x̂

(``dr·r·inv_n`` inside ``c`` is the ``−dr·r³·x/D`` term of ``rmsnorm_without_weight``.)

Two paths, chosen by the launcher from ``D`` only, so a row's reduction order never depends on
the number of rows (batch-size invariance):

- tile path (``next_pow2(D) <= MAX_TILE``): a program holds ``BM`` whole rows in registers; x is
  read once in the forward, x and dy once in the backward;
- looped path (longer rows, up to 65,536 and beyond): a per-row statistics kernel walks the row in
  ``BD`` chunks, then an elementwise kernel on a (column chunk, row group) grid applies them.

The small ``@triton.jit`` helpers at the top (``row_sum_squares``, ``rstd_from_sum_squares``,
``rms_bwd_rows``) are the shared row statistics; other norm kernels (gated RMSNorm) may import them.
"""
import triton
import triton.language as tl


# ------------------------------------------------------------------------------------------------
# Reusable row pieces (all fp32)


@triton.jit
def row_sum_squares(x):
    """Per-row ``Σ_d x_d²`` of an fp32 ``[BM, BD]`` tile (masked lanes must hold 0) -> ``[BM]``."""
    return tl.sum(x * x, axis=1)


@triton.jit
def rstd_from_sum_squares(ss, inv_n, eps):
    """``1 / sqrt(ss · inv_n + eps)`` in fp32: ``inv_n = 1/D`` gives the RMS scale, ``1`` the L2 one."""
    return tl.rsqrt(ss * inv_n + eps)


@triton.jit
def rms_bwd_rows(g, xhat, rstd, extra, inv_n):
    """Row-norm backward of an fp32 ``[BM, BD]`` tile.

    ``g``: gradient w.r.t. the normalised row ``x̂`` (``dy`` or ``dy ⊙ w``); ``xhat = x·rstd``;
    ``rstd``: ``[BM]``; ``extra``: ``[BM]`` (or a scalar) added to ``Σ g·x̂`` before the ``inv_n``
    scaling (``dr·rstd`` for a gradient of ``rstd`` itself, else 0). Returns
    ``rstd · (g − x̂ · (Σ_d g·x̂ + extra) · inv_n)``. Masked lanes must hold 0 in ``g`` and ``xhat``.
    """
    c = (tl.sum(g * xhat, axis=1) + extra) * inv_n
    return rstd[:, None] * (g - xhat * c[:, None])


# ------------------------------------------------------------------------------------------------
# Tile path: whole rows in registers


@triton.jit
def norm_fwd_tile_kernel(X, Y, W, RSTD, N, D, stride_x, stride_y, inv_n, eps, offset,
                         HAS_W: tl.constexpr, STORE_Y: tl.constexpr, STORE_RSTD: tl.constexpr,
                         BM: tl.constexpr, BD: tl.constexpr, X2=None, Y2=None, RSTD2=None, stride_x2=0,
                         stride_y2=0, PAIR: tl.constexpr = False):
    """``BM`` rows per program; ``BD >= D``. Writes ``y`` (``[N, D]``, row stride ``stride_y``) and/or
    ``rstd`` (``[N]``) in their pointers' dtypes. ``PAIR``: a second row set of the same ``N, D`` and dtypes
    (``X2, Y2, RSTD2``, its own strides) in the same launch, by the programs after the first set's
    ``⌈N / BM⌉`` (GDN/KDA's q and k: one launch instead of two)."""
    pid = tl.program_id(0).to(tl.int64)
    if PAIR:
        nb = tl.cdiv(N, BM)
        if pid >= nb:
            X = X2
            Y = Y2
            RSTD = RSTD2
            stride_x = stride_x2
            stride_y = stride_y2
            pid -= nb
    rows = pid * BM + tl.arange(0, BM)
    cols = tl.arange(0, BD)
    rmask = rows < N
    cmask = cols < D
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = rstd_from_sum_squares(row_sum_squares(x), inv_n, eps)
    if STORE_RSTD:
        tl.store(RSTD + rows, r.to(RSTD.dtype.element_ty), mask=rmask)
    if STORE_Y:
        y = x * r[:, None]
        if HAS_W:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset
            y = y * w[None, :]
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def norm_bwd_tile_kernel(X, DY, W, RSTD, DR, DX, DWP, N, D, stride_x, stride_dy_row, stride_dy_col, stride_dr,
                         stride_dx, inv_n, eps, offset, blocks_per_prog, stride_dy_group, HAS_DY: tl.constexpr,
                         HAS_W: tl.constexpr, HAS_DW: tl.constexpr, HAS_DR: tl.constexpr, RSTD_GIVEN: tl.constexpr,
                         X_IS_NORMALIZED: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
                         DY_GROUP: tl.constexpr = 1):
    """Backward of ``BM``-row blocks ``[pid·bpp, (pid+1)·bpp)``; ``BD >= D``.

    ``X`` holds ``x`` (``rstd`` recomputed from it unless ``RSTD_GIVEN``) or, with
    ``X_IS_NORMALIZED``, ``x̂`` itself (then ``RSTD_GIVEN`` must be set). ``DY`` has any strides (stride 0
    included; ``DY_GROUP`` rows ``stride_dy_group`` apart summed per row). ``HAS_DW``: partial ``Σ dy ⊙ x̂`` to
    row ``pid`` of ``DWP`` (``[programs, D]``, contiguous); the launcher sums the partials.

    Register budget (the persistent ``HAS_DW`` grid runs several programs an SM only if each stays
    small): per element a thread keeps the ``dweight`` accumulator and, inside one block, ``x̂`` and
    ``g``; ``w`` is re-read from L1/L2 each block instead of living across the loop, ``dy`` is folded
    into the accumulator as soon as ``x̂`` is known, and both loads of a block are issued together.
    """
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BD)
    cmask = cols < D
    if HAS_DW:
        acc_dw = tl.zeros([BM, BD], dtype=tl.float32)
    for b in range(0, blocks_per_prog):
        rows = (pid * blocks_per_prog + b) * BM + tl.arange(0, BM)
        rmask = rows < N
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_DY:
            dy = _load_dy_group(DY + rows[:, None] * stride_dy_row + cols[None, :].to(tl.int64) * stride_dy_col,
                                mask, stride_dy_group, DY_GROUP)
        if RSTD_GIVEN:
            r = tl.load(RSTD + rows, mask=rmask, other=0.0).to(tl.float32)
        else:
            r = rstd_from_sum_squares(row_sum_squares(x), inv_n, eps)
        if X_IS_NORMALIZED:
            xhat = x
        else:
            xhat = x * r[:, None]
        if HAS_DY:
            if HAS_DW:
                acc_dw += tl.where(mask, dy * xhat, 0.0)
            if HAS_W:
                if BM == 1:  # loaded in the tile's own layout: no layout conversion of a [BD] vector
                    w = tl.load(W + cols[None, :], mask=cmask[None, :], other=0.0).to(tl.float32) + offset
                    g = dy * w
                else:
                    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset
                    g = dy * w[None, :]
            else:
                g = dy
        else:
            g = tl.zeros([BM, BD], dtype=tl.float32)
        if HAS_DR:
            dr = tl.load(DR + rows * stride_dr, mask=rmask, other=0.0).to(tl.float32)
            extra = dr * r
        else:
            extra = tl.zeros([BM], dtype=tl.float32)
        dx = rms_bwd_rows(g, xhat, r, extra, inv_n)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
    if HAS_DW:
        tl.store(DWP + pid * D + cols, tl.sum(acc_dw, axis=0), mask=cmask)


# ------------------------------------------------------------------------------------------------
# Looped path: rows longer than one tile


@triton.jit
def norm_row_stats_kernel(X, DY, W, DR, RSTD_IN, RSTD, C, N, D, stride_x, stride_dy_row, stride_dy_col,
                          stride_dr, inv_n, eps, offset,
                          COMPUTE_C: tl.constexpr, HAS_DY: tl.constexpr, HAS_W: tl.constexpr,
                          HAS_DR: tl.constexpr, RSTD_GIVEN: tl.constexpr, X_IS_NORMALIZED: tl.constexpr,
                          BD: tl.constexpr):
    """One row per program, walked in ``BD`` chunks: fp32 ``rstd`` (to ``RSTD``, ``[N]``) and, with
    ``COMPUTE_C``, the backward's ``c = (Σ g·x̂ + dr·r)·inv_n`` (to ``C``, ``[N]``).

    Chunk partial sums are kept lane-wise in a ``[BD]`` accumulator and reduced once at the end,
    so the order depends on ``D`` and ``BD`` only.
    """
    row = tl.program_id(0).to(tl.int64)
    acc_ss = tl.zeros([BD], dtype=tl.float32)
    acc_gx = tl.zeros([BD], dtype=tl.float32)
    for start in range(0, D, BD):
        cols = tl.cast(start, tl.int64) + tl.arange(0, BD)
        cmask = cols < D
        x = tl.load(X + row * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
        if not RSTD_GIVEN:
            acc_ss += x * x
        if COMPUTE_C:
            if HAS_DY:
                g = tl.load(DY + row * stride_dy_row + cols * stride_dy_col, mask=cmask, other=0.0).to(tl.float32)
                if HAS_W:
                    g = g * (tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset)
                acc_gx += g * x
    if RSTD_GIVEN:
        r = tl.load(RSTD_IN + row).to(tl.float32)
    else:
        r = rstd_from_sum_squares(tl.sum(acc_ss, axis=0), inv_n, eps)
    tl.store(RSTD + row, r)
    if COMPUTE_C:
        gx = tl.sum(acc_gx, axis=0)
        if X_IS_NORMALIZED:
            c = gx * inv_n
        else:
            # Σ g·x̂ = r·Σ g·x
            if HAS_DR:
                c = r * (gx + tl.load(DR + row * stride_dr).to(tl.float32)) * inv_n
            else:
                c = r * gx * inv_n
        tl.store(C + row, c)


@triton.jit
def norm_apply_kernel(X, DY, W, RSTD, C, OUT, DWP, N, D, stride_x, stride_dy_row, stride_dy_col, stride_out,
                      offset, rows_per_prog,
                      BWD: tl.constexpr, HAS_DY: tl.constexpr, HAS_W: tl.constexpr, HAS_DW: tl.constexpr,
                      X_IS_NORMALIZED: tl.constexpr, BD: tl.constexpr):
    """Elementwise second pass of the looped path on a (column chunk, row group) grid.

    Forward (``not BWD``): ``OUT = x·r ⊙ (w + offset)``. Backward: ``OUT = dx = r·(g − x̂·c)`` with
    ``r``, ``c`` from :func:`norm_row_stats_kernel`; ``HAS_DW`` writes this row group's fp32 partial
    ``Σ dy ⊙ x̂`` for its column chunk to row ``pid_r`` of ``DWP`` (``[groups, D]``).
    """
    pid_c = tl.program_id(0).to(tl.int64)
    pid_r = tl.program_id(1).to(tl.int64)
    cols = pid_c * BD + tl.arange(0, BD)
    cmask = cols < D
    if HAS_W:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset
    if HAS_DW:
        acc_dw = tl.zeros([BD], dtype=tl.float32)
    for i in range(0, rows_per_prog):
        row = pid_r * rows_per_prog + i
        rvalid = row < N
        mask = cmask & rvalid
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(RSTD + row, mask=rvalid, other=0.0)
        if X_IS_NORMALIZED:
            xhat = x
        else:
            xhat = x * r
        if BWD:
            c = tl.load(C + row, mask=rvalid, other=0.0)
            if HAS_DY:
                dy = tl.load(DY + row * stride_dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(tl.float32)
                if HAS_W:
                    g = dy * w
                else:
                    g = dy
                out = r * (g - xhat * c)
                if HAS_DW:
                    acc_dw += tl.where(mask, dy * xhat, 0.0)
            else:
                out = -r * xhat * c
        else:
            out = xhat
            if HAS_W:
                out = out * w
        tl.store(OUT + row * stride_out + cols, out.to(OUT.dtype.element_ty), mask=mask)
    if HAS_DW:
        tl.store(DWP + pid_r * D + cols, acc_dw, mask=cmask)


# ------------------------------------------------------------------------------------------------
# Helpers kept below the kernels (a jit function's cache key holds its starting line: code added
# above a kernel recompiles it)


@triton.jit
def _load_dy_group(ptrs, mask, stride_group, GROUP: tl.constexpr):
    """fp32 ``Σ_{j < GROUP} dy[ptrs + j·stride_group]``, summed in order j = 0, 1, ...: the gradient of a row
    shared by ``GROUP`` consumers (GVA: the value heads of one key head) folded on load, with the bits of
    ``fold_value_heads``'s one fp32 add for two."""
    dy = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    for j in tl.static_range(1, GROUP):
        dy += tl.load(ptrs + j * stride_group, mask=mask, other=0.0).to(tl.float32)
    return dy
