"""Triton kernels of the loss family (SPEC 1.7, 1.8). Kernels only: launchers live in the op modules.

Two row kernels serve both operators:

- :func:`ce_fwd_kernel`: one program per row. One sweep over the row's logits (blocks of ``BLOCK``)
  keeps a running scalar max and a per-lane sum of ``exp(z - max)`` (one ``exp`` per element, one
  cross-warp reduction per block, the sum reduced once at the end), and the per-lane sum of ``z``
  for label smoothing. It writes ``lse`` and the weighted row loss. With ``WRITE_GRAD`` (chunk_loss,
  ``mean``/``sum`` under autograd) a second sweep over the same row, from its end back, writes ``dlogits``.
- :func:`ce_bwd_kernel`: grid ``(rows, column blocks)``; re-reads a block of logits and writes
  ``dlogits = c_i·[p·(1+2λ·lse) − ε/V − (1−ε)·[j=y]]·(softcap chain)`` with the per-row scale
  ``c_i = w_i·g_i`` read row by row. Ignored rows read nothing and write zeros.

Rows are addressed as ``(row // rows_inner)·stride_outer + (row % rows_inner)·stride_inner`` in int64,
so a ``[B, T, V]`` view such as ``x[:, :-1, :]`` is read in place, without a copy.
"""
import triton
import triton.language as tl


@triton.jit
def _row_offset(row, rows_inner, stride_outer, stride_inner):
    """int64 element offset of row ``row`` (an int64 scalar) in a two-level row layout."""
    return (row // rows_inner) * stride_outer + (row % rows_inner) * stride_inner


@triton.jit
def _tanh(u):
    """tanh in fp32 without libdevice: an odd polynomial near 0 (no cancellation), exp elsewhere."""
    a = tl.abs(u)
    e = tl.exp(-2.0 * a)
    t = (1.0 - e) / (1.0 + e)
    t = tl.where(u < 0, -t, t)
    u2 = u * u
    p = u * (1.0 + u2 * (-0.3333333333333333 + u2 * (0.13333333333333333 + u2 * -0.05396825396825397)))
    return tl.where(a < 0.125, p, t)


@triton.jit
def _tanh_sech2(u):
    """(tanh u, 1 - tanh² u); the second as 4e/(1+e)² with e = exp(-2|u|), exact where tanh → ±1."""
    a = tl.abs(u)
    e = tl.exp(-2.0 * a)
    inv = 1.0 / (1.0 + e)
    t = (1.0 - e) * inv
    t = tl.where(u < 0, -t, t)
    s2 = 4.0 * e * inv * inv
    u2 = u * u
    p = u * (1.0 + u2 * (-0.3333333333333333 + u2 * (0.13333333333333333 + u2 * -0.05396825396825397)))
    small = a < 0.125
    return tl.where(small, p, t), tl.where(small, 1.0 - p * p, s2)


@triton.jit
def _load_x(x_row, b_ptr, cols, mask, HAS_BIAS: tl.constexpr):
    """Logits of a block in fp32 (plus the fp32 bias)."""
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def _grad_block(x_row, b_ptr, cols, mask, label, lse, c, coef, eps_over_v, one_minus_eps, softcap, inv_softcap,
                HAS_BIAS: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """``c·[p·coef − ε/V − (1−ε)·[j=y]]`` (times the soft-cap chain) for one block, in fp32.

    The true-class entry is this one fp32 expression, rounded once by the caller's store.
    """
    x = _load_x(x_row, b_ptr, cols, mask, HAS_BIAS)
    if HAS_SOFTCAP:
        t, sech2 = _tanh_sech2(x * inv_softcap)
        z = softcap * t
    else:
        z = x
    d = tl.exp(z - lse) * coef - tl.where(cols == label, one_minus_eps, 0.0)
    if HAS_SMOOTHING:
        d = d - eps_over_v
    d = c * d
    if HAS_SOFTCAP:
        d = d * sech2
    return d


@triton.jit
def ce_fwd_kernel(x_ptr, b_ptr, labels_ptr, w_ptr, g_ptr, loss_ptr, lse_ptr, dx_ptr,
                  V, rows_inner, stride_outer, stride_inner, stride_g, stride_dx, ignore_index,
                  eps, lam, softcap, inv_softcap,
                  HAS_BIAS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
                  HAS_ZLOSS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Row statistics and loss (and, with ``WRITE_GRAD``, the row's dlogits scaled by ``w_i·g_i``).

    Writes ``lse[row]`` (after soft-capping, every row) and ``loss[row] = w·ℓ`` (0 on ignored rows,
    NaN when the label is outside ``[0, V)`` and not ``ignore_index``).
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + _row_offset(row, rows_inner, stride_outer, stride_inner)
    offs = tl.arange(0, BLOCK)

    m = tl.full((), float("-inf"), tl.float32)
    s_vec = tl.zeros((BLOCK,), dtype=tl.float32)
    sz_vec = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + offs
        mask = cols < V
        x = _load_x(x_row, b_ptr, cols, mask, HAS_BIAS)
        if HAS_SOFTCAP:
            z = softcap * _tanh(x * inv_softcap)
        else:
            z = x
        z = tl.where(mask, z, float("-inf"))
        new_m = tl.maximum(m, tl.max(z, 0))
        m_safe = tl.where(new_m == float("-inf"), 0.0, new_m)  # a row (so far) of -inf: no -inf - -inf
        s_vec = s_vec * tl.exp(m - m_safe) + tl.exp(z - m_safe)
        if HAS_SMOOTHING:
            sz_vec += tl.where(mask, z, 0.0)
        m = new_m
    lse = m + tl.log(tl.sum(s_vec, 0))

    label = tl.load(labels_ptr + row).to(tl.int64)
    valid = label != ignore_index
    inrange = (label >= 0) & (label < V)
    y = tl.where(inrange, label, 0)
    x_y = tl.load(x_row + y).to(tl.float32)
    if HAS_BIAS:
        x_y += tl.load(b_ptr + y).to(tl.float32)
    if HAS_SOFTCAP:
        z_y = softcap * _tanh(x_y * inv_softcap)
    else:
        z_y = x_y
    loss = (1.0 - eps) * (lse - z_y)
    if HAS_SMOOTHING:
        loss += eps * (lse - tl.sum(sz_vec, 0) / V)
    if HAS_ZLOSS:
        loss += lam * lse * lse
    w = 1.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + row).to(tl.float32)
    loss = loss * w
    loss = tl.where(inrange, loss, float("nan"))
    loss = tl.where(valid, loss, 0.0)
    tl.store(loss_ptr + row, loss)
    tl.store(lse_ptr + row, lse)

    if WRITE_GRAD:
        c = w * tl.load(g_ptr + row * stride_g).to(tl.float32)
        c = tl.where(inrange, c, float("nan"))
        coef = 1.0
        if HAS_ZLOSS:
            coef = 1.0 + 2.0 * lam * lse
        eps_over_v = eps / V
        one_minus_eps = 1.0 - eps
        dx_row = dx_ptr + row * stride_dx
        # last block first: the end of the row, read last by the first sweep, is the likeliest still in L2
        n_blocks = tl.cdiv(V, BLOCK)
        for i in range(0, n_blocks):
            cols = (n_blocks - 1 - i) * BLOCK + offs
            mask = cols < V
            d = _grad_block(x_row, b_ptr, cols, mask & valid, label, lse, c, coef, eps_over_v, one_minus_eps,
                            softcap, inv_softcap, HAS_BIAS, HAS_SMOOTHING, HAS_SOFTCAP)
            d = tl.where(valid, d, 0.0)
            tl.store(dx_row + cols, d.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def ce_bwd_kernel(x_ptr, b_ptr, labels_ptr, w_ptr, g_ptr, lse_ptr, dx_ptr,
                  V, rows_inner, stride_outer, stride_inner, dx_rows_inner, dx_stride_outer, dx_stride_inner,
                  stride_g, ignore_index, eps, lam, softcap, inv_softcap,
                  HAS_BIAS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
                  HAS_ZLOSS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    """dlogits of one ``BLOCK`` of one row from the saved ``lse``; may write in place (``dx_ptr == x_ptr``)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < V
    x_row = x_ptr + _row_offset(row, rows_inner, stride_outer, stride_inner)
    dx_row = dx_ptr + _row_offset(row, dx_rows_inner, dx_stride_outer, dx_stride_inner)

    label = tl.load(labels_ptr + row).to(tl.int64)
    valid = label != ignore_index
    inrange = (label >= 0) & (label < V)
    lse = tl.load(lse_ptr + row)
    c = tl.load(g_ptr + row * stride_g).to(tl.float32)
    if HAS_WEIGHT:
        c = c * tl.load(w_ptr + row).to(tl.float32)
    c = tl.where(inrange, c, float("nan"))
    coef = 1.0
    if HAS_ZLOSS:
        coef = 1.0 + 2.0 * lam * lse
    d = _grad_block(x_row, b_ptr, cols, mask & valid, label, lse, c, coef, eps / V, 1.0 - eps,
                    softcap, inv_softcap, HAS_BIAS, HAS_SMOOTHING, HAS_SOFTCAP)
    d = tl.where(valid, d, 0.0)
    tl.store(dx_row + cols, d.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def scale_kernel(x_ptr, s_ptr, y_ptr, n, IN_PLACE: tl.constexpr, BLOCK: tl.constexpr):
    """``y = x·s`` with the scalar ``s`` read from device memory in fp32, one rounding (contiguous x, y;
    ``IN_PLACE``: ``y`` is ``x``). Grid-stride over blocks, so that in place with ``s == 1`` (nothing to
    read or write) a few thousand programs exit at once instead of one per block."""
    s = tl.load(s_ptr).to(tl.float32)
    if IN_PLACE:
        n = tl.where(s != 1.0, n, 0)
    offs = tl.arange(0, BLOCK)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    for start in range(tl.program_id(0).to(tl.int64) * BLOCK, n, step):
        mask = start + offs < n
        x = tl.load(x_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + start + offs, (x * s).to(y_ptr.dtype.element_ty), mask=mask)
