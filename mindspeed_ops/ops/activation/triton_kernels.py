"""Triton kernels of the activation family. Kernels only: launchers live in the op modules."""
import triton
import triton.language as tl

from ...triton_utils import sigmoid_f32


@triton.jit
def _gate_up_offsets(rows, cols, stride_row, I, INTERLEAVED: tl.constexpr):
    """Element offsets of gate and up for a [BM, BN] tile (int64 rows)."""
    base = rows[:, None] * stride_row
    if INTERLEAVED:
        gate_off = base + 2 * cols[None, :]
        up_off = gate_off + 1
    else:
        gate_off = base + cols[None, :]
        up_off = gate_off + I
    return gate_off, up_off


@triton.jit
def clipped_swiglu_fwd_kernel(x_ptr, y_ptr, M, I, stride_x, stride_y, alpha, limit,
                              HAS_LIMIT: tl.constexpr, INTERLEAVED: tl.constexpr,
                              BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < I)
    gate_off, up_off = _gate_up_offsets(rows, cols, stride_x, I, INTERLEAVED)
    gate = tl.load(x_ptr + gate_off, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + up_off, mask=mask, other=0.0).to(tl.float32)
    if HAS_LIMIT:
        gate = tl.minimum(gate, limit, propagate_nan=tl.PropagateNan.ALL)
        up = tl.clamp(up, -limit, limit, propagate_nan=tl.PropagateNan.ALL)
    y = gate * sigmoid_f32(alpha * gate) * (up + 1.0)
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def clipped_swiglu_bwd_kernel(x_ptr, dy_ptr, dx_ptr, M, I, stride_x, stride_dy_row, stride_dy_col, stride_dx,
                              alpha, limit, HAS_LIMIT: tl.constexpr, INTERLEAVED: tl.constexpr,
                              BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < I)
    gate_off, up_off = _gate_up_offsets(rows, cols, stride_x, I, INTERLEAVED)
    gate = tl.load(x_ptr + gate_off, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + up_off, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + rows[:, None] * stride_dy_row + cols[None, :].to(tl.int64) * stride_dy_col,
                 mask=mask, other=0.0).to(tl.float32)
    g = gate
    u = up
    if HAS_LIMIT:
        g = tl.minimum(gate, limit, propagate_nan=tl.PropagateNan.ALL)
        u = tl.clamp(up, -limit, limit, propagate_nan=tl.PropagateNan.ALL)
    s = sigmoid_f32(alpha * g)
    d_up = dy * g * s
    d_gate = dy * (u + 1.0) * (s + alpha * g * s * (1.0 - s))
    if HAS_LIMIT:
        # inclusive boundaries, like torch.clamp; a NaN input fails the compare and gets 0, as in torch
        d_up = tl.where((up >= -limit) & (up <= limit), d_up, 0.0)
        d_gate = tl.where(gate <= limit, d_gate, 0.0)
    gate_off, up_off = _gate_up_offsets(rows, cols, stride_dx, I, INTERLEAVED)
    tl.store(dx_ptr + gate_off, d_gate.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dx_ptr + up_off, d_up.to(dx_ptr.dtype.element_ty), mask=mask)
