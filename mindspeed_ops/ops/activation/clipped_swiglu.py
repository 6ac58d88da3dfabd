"""Host launchers for ``clipped_swiglu`` (SPEC 1.4): argument checks, tiling, grids."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_tensor, reject_float64, shape_str
from ..common import rows_2d

OP = "clipped_swiglu"


def check_args(gate_up: torch.Tensor, swiglu_alpha: float, swiglu_limit: Optional[float]) -> int:
    """Validate the arguments (also on fake tensors under torch.compile); returns ``I``."""
    reject_float64(OP, gate_up=gate_up)
    check_tensor(OP, "gate_up", gate_up, min_ndim=1)
    if gate_up.shape[-1] % 2:
        raise ValueError(f"{OP}: gate_up's last dim must be even (2I), got shape {shape_str(gate_up.shape)}")
    if swiglu_limit is not None and not swiglu_limit > 0:
        raise ValueError(f"{OP}: swiglu_limit must be > 0, None or inf, got {swiglu_limit}")
    if not isinstance(swiglu_alpha, (int, float)) or not math.isfinite(swiglu_alpha):
        raise ValueError(f"{OP}: swiglu_alpha must be a finite number, got {swiglu_alpha!r}")
    return gate_up.shape[-1] // 2


def _limit(swiglu_limit: Optional[float]) -> tuple[bool, float]:
    if swiglu_limit is None or math.isinf(swiglu_limit):
        return False, 0.0
    return True, float(swiglu_limit)


def _tiles(I: int) -> tuple[int, int, int]:
    """(rows, columns, warps) of a tile: ~4096 outputs per program, 8 warps (16 fp32 values a thread
    per live tensor keeps the backward under the register limit)."""
    bn = min(tu.next_power_of_2(I), 1024)
    bm = max(1, 4096 // bn)
    return bm, bn, 8 if bm * bn >= 2048 else 4


def forward(gate_up: torch.Tensor, swiglu_alpha: float = 1.702, swiglu_limit: Optional[float] = 7.0,
            interleaved: bool = False) -> torch.Tensor:
    from .triton_kernels import clipped_swiglu_fwd_kernel

    I = check_args(gate_up, swiglu_alpha, swiglu_limit)
    lead = gate_up.shape[:-1]
    x = rows_2d(tu.kernel_input(gate_up))
    M = x.shape[0]
    y = torch.empty(M, I, dtype=tu.kernel_dtype(gate_up.dtype), device=gate_up.device)
    if M and I:
        has_limit, limit = _limit(swiglu_limit)
        bm, bn, warps = _tiles(I)
        grid = (tu.cdiv(M, bm), tu.cdiv(I, bn))
        clipped_swiglu_fwd_kernel[grid](x, y, M, I, x.stride(0), y.stride(0), float(swiglu_alpha), limit,
                                        HAS_LIMIT=has_limit, INTERLEAVED=interleaved, BM=bm, BN=bn,
                                        num_warps=warps)
    return tu.finish(y, gate_up.dtype).view(*lead, I)


def backward(dout: torch.Tensor, gate_up: torch.Tensor, swiglu_alpha: float = 1.702,
             swiglu_limit: Optional[float] = 7.0, interleaved: bool = False) -> torch.Tensor:
    from .triton_kernels import clipped_swiglu_bwd_kernel

    I = gate_up.shape[-1] // 2
    x = rows_2d(tu.kernel_input(gate_up))
    M = x.shape[0]
    dy = tu.kernel_input(dout).reshape(M, I)  # any strides (stride-0 from .sum() included)
    dx = torch.empty(M, 2 * I, dtype=tu.kernel_dtype(gate_up.dtype), device=gate_up.device)
    if M and I:
        has_limit, limit = _limit(swiglu_limit)
        bm, bn, warps = _tiles(I)
        grid = (tu.cdiv(M, bm), tu.cdiv(I, bn))
        clipped_swiglu_bwd_kernel[grid](x, dy, dx, M, I, x.stride(0), dy.stride(0), dy.stride(1), dx.stride(0),
                                        float(swiglu_alpha), limit, HAS_LIMIT=has_limit, INTERLEAVED=interleaved,
                                        BM=bm, BN=bn, num_warps=warps)
    return tu.finish(dx, gate_up.dtype).view(gate_up.shape)
