"""Triton kernels of the RoPE family. Kernels only: launchers live in the op modules."""
import triton
import triton.language as tl


@triton.jit
def rope_rotate_kernel(src_ptr, dst_ptr, cos_ptr, sin_ptr, pos_ptr,
                       n_tok, T, H,
                       s_b, s_t, s_h, s_d,
                       d_b, d_t, d_h, d_d,
                       cos_t, cos_i, sin_t, sin_i,
                       pos_b, pos_t,
                       R: tl.constexpr, INVERSE: tl.constexpr, HAS_POS: tl.constexpr,
                       BT: tl.constexpr, BH: tl.constexpr, BR: tl.constexpr):
    """Rotate adjacent channel pairs of ``src`` (the rope slice, ``[B, T, H, R]`` by strides) into ``dst``.

    One program: ``BT`` tokens (flattened ``b·T + t``) × ``BH`` heads × all ``R`` channels. ``cos``/``sin``
    rows are loaded once per token and broadcast over the heads; channels are loaded as one contiguous
    row (vectorized when the channel stride is 1) and split into (even, odd) pairs in registers.
    ``src`` and ``dst`` may be the same tensor (in place: each element is read before it is written, by
    the same program). ``INVERSE`` rotates by −θ; the backward of a rotation is the rotation by the
    opposite angle, so this one kernel serves forward, inverse and backward.
    """
    tok = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    head = (tl.program_id(1) * BH + tl.arange(0, BH)).to(tl.int64)
    half = tl.arange(0, BR // 2)
    col = tl.arange(0, BR).to(tl.int64)
    tok_ok = tok < n_tok
    b = tok // T
    t = tok - b * T
    if HAS_POS:
        p = tl.load(pos_ptr + b * pos_b + t * pos_t, mask=tok_ok, other=0).to(tl.int64)
    else:
        p = t
    if BR == R:
        pair_ok = tok_ok[:, None]
        col_ok = col < BR
    else:
        pair_ok = tok_ok[:, None] & (half[None, :] < R // 2)
        col_ok = col < R
    pair = half.to(tl.int64)[None, :]
    c = tl.load(cos_ptr + p[:, None] * cos_t + pair * cos_i, mask=pair_ok, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + p[:, None] * sin_t + pair * sin_i, mask=pair_ok, other=0.0).to(tl.float32)
    if INVERSE:
        s = -s
    c = c[:, None, :]
    s = s[:, None, :]
    mask = tok_ok[:, None, None] & (head < H)[None, :, None] & col_ok[None, None, :]
    src_off = (b * s_b + t * s_t)[:, None, None] + (head * s_h)[None, :, None] + (col * s_d)[None, None, :]
    v = tl.load(src_ptr + src_off, mask=mask, other=0.0).to(tl.float32)
    a, bb = tl.split(tl.reshape(v, (BT, BH, BR // 2, 2)))
    ra = a * c - bb * s
    rb = a * s + bb * c
    out = tl.reshape(tl.join(ra, rb), (BT, BH, BR))
    dst_off = (b * d_b + t * d_t)[:, None, None] + (head * d_h)[None, :, None] + (col * d_d)[None, None, :]
    tl.store(dst_ptr + dst_off, out.to(dst_ptr.dtype.element_ty), mask=mask)
