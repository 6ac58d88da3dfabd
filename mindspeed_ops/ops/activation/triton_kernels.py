"""Triton kernels of the activation family. Kernels only: launchers live in the op modules."""
import triton
import triton.language as tl

from ...triton_utils import sigmoid_f32


@triton.jit
def _load_gate_up(x_ptr, rows, cols, stride_row, M, I, INTERLEAVED: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr):
    """gate and up of a [BM, BN] tile in fp32 (int64 rows). Interleaved pairs are read as one
    contiguous [BM, 2*BN] tile and split in registers, so loads stay wide and coalesced."""
    if INTERLEAVED:
        cols2 = tl.program_id(1) * (2 * BN) + tl.arange(0, 2 * BN)
        mask2 = (rows[:, None] < M) & (cols2[None, :] < 2 * I)
        x = tl.load(x_ptr + rows[:, None] * stride_row + cols2[None, :], mask=mask2, other=0.0).to(tl.float32)
        gate, up = tl.split(tl.reshape(x, [BM, BN, 2]))
    else:
        mask = (rows[:, None] < M) & (cols[None, :] < I)
        base = x_ptr + rows[:, None] * stride_row + cols[None, :]
        gate = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(base + I, mask=mask, other=0.0).to(tl.float32)
    return gate, up


@triton.jit
def _store_gate_up(dx_ptr, d_gate, d_up, rows, cols, stride_row, M, I, INTERLEAVED: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr):
    """Write a [BM, BN] tile of gate/up gradients in the layout of gate_up (see _load_gate_up)."""
    if INTERLEAVED:
        cols2 = tl.program_id(1) * (2 * BN) + tl.arange(0, 2 * BN)
        mask2 = (rows[:, None] < M) & (cols2[None, :] < 2 * I)
        pairs = tl.reshape(tl.join(d_gate, d_up), [BM, 2 * BN])
        tl.store(dx_ptr + rows[:, None] * stride_row + cols2[None, :], pairs.to(dx_ptr.dtype.element_ty), mask=mask2)
    else:
        mask = (rows[:, None] < M) & (cols[None, :] < I)
        base = dx_ptr + rows[:, None] * stride_row + cols[None, :]
        tl.store(base, d_gate.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(base + I, d_up.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def clipped_swiglu_fwd_kernel(x_ptr, y_ptr, M, I, stride_x, stride_y, alpha, limit,
                              HAS_LIMIT: tl.constexpr, INTERLEAVED: tl.constexpr,
                              BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    gate, up = _load_gate_up(x_ptr, rows, cols, stride_x, M, I, INTERLEAVED, BM, BN)
    if HAS_LIMIT:
        gate = tl.minimum(gate, limit, propagate_nan=tl.PropagateNan.ALL)
        up = tl.clamp(up, -limit, limit, propagate_nan=tl.PropagateNan.ALL)
    y = gate * sigmoid_f32(alpha * gate) * (up + 1.0)
    mask = (rows[:, None] < M) & (cols[None, :] < I)
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def clipped_swiglu_bwd_kernel(x_ptr, dy_ptr, dx_ptr, M, I, stride_x, stride_dy_row, stride_dy_col, stride_dx,
                              alpha, limit, HAS_LIMIT: tl.constexpr, INTERLEAVED: tl.constexpr,
                              BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < I)
    gate, up = _load_gate_up(x_ptr, rows, cols, stride_x, M, I, INTERLEAVED, BM, BN)
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
    _store_gate_up(dx_ptr, d_gate, d_up, rows, cols, stride_dx, M, I, INTERLEAVED, BM, BN)
