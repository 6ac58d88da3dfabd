"""Host launchers for ``mhc_pre_bmm`` (SPEC 1.12.3): checks, tiling, grids."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ... import triton_utils as tu
from ..common import unit_last_stride
from ...validation import FLOAT_DTYPES, check_same_device, check_tensor, reject_float64, shape_str

OP = "mhc_pre_bmm"


def check_n(op: str, n: int) -> None:
    if not 1 <= n <= 8:
        raise ValueError(f"{op}: the stream count n must be in [1, 8], got {n}")


def check_args(pre, x, out_dtype) -> tuple[int, int]:
    """Validate (also on fake tensors); returns ``(n, D)``."""
    reject_float64(OP, pre=pre, x=x)
    check_tensor(OP, "x", x, min_ndim=2)
    check_tensor(OP, "pre", pre, min_ndim=1)
    n, D = x.shape[-2], x.shape[-1]
    check_n(OP, n)
    if tuple(pre.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"{OP}: pre must have shape x.shape[:-1] = {shape_str(x.shape[:-1])}, "
                         f"got {shape_str(pre.shape)}")
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{OP}: out_dtype must be None or float32/float16/bfloat16, got {out_dtype}")
    check_same_device(OP, pre=pre, x=x)
    return n, D


def _tile(n: int, D: int, budget: int = 4096) -> tuple[int, int, int, int]:
    """(NP, BT, BD, warps): ~``budget`` elements of x a program (16 KB fp32)."""
    NP = max(2, tu.next_power_of_2(n))
    bd = min(max(16, tu.next_power_of_2(D)), max(16, budget // NP))
    bt = max(1, budget // (NP * bd))
    return NP, bt, bd, 8 if NP * bd * bt >= 4096 else 4


def _x3(x, M, n, D):
    return unit_last_stride(tu.kernel_input(x).reshape(M, n, D))


def forward(pre, x, out_dtype: Optional[torch.dtype] = None):
    from .triton_kernels import mhc_pre_bmm_fwd_kernel

    n, D = check_args(pre, x, out_dtype)
    od = out_dtype or x.dtype
    lead = x.shape[:-2]
    M = math.prod(lead)
    y = torch.empty(M, D, dtype=tu.kernel_dtype(od), device=x.device)
    if M and D:
        x3 = _x3(x, M, n, D)
        p = tu.kernel_input(pre).reshape(M, n)
        NP, BT, BD, warps = _tile(n, D)
        grid = (tu.cdiv(M, BT), tu.cdiv(D, BD))
        mhc_pre_bmm_fwd_kernel[grid](p, x3, y, M, D, p.stride(0), p.stride(1), x3.stride(0), x3.stride(1),
                                     y.stride(0), N=n, NP=NP, BT=BT, BD=BD, num_warps=warps)
    return tu.finish(y, od).view(*lead, D)


def backward(dy, pre, x, out_dtype: Optional[torch.dtype] = None):
    from .triton_kernels import mhc_pre_bmm_bwd_kernel

    n, D = x.shape[-2], x.shape[-1]
    M = math.prod(x.shape[:-2])
    dx = torch.empty(M, n, D, dtype=tu.kernel_dtype(x.dtype), device=x.device)
    dp = torch.empty(M, n, dtype=tu.kernel_dtype(pre.dtype), device=x.device)
    if M:
        if D:
            x3 = _x3(x, M, n, D)
            p = tu.kernel_input(pre).reshape(M, n)
            g = tu.kernel_input(dy).reshape(M, D)
            NP, BT, BD, warps = _tile(n, D)
            mhc_pre_bmm_bwd_kernel[(tu.cdiv(M, BT),)](p, x3, g, dp, dx, M, D, p.stride(0), p.stride(1),
                                                      x3.stride(0), x3.stride(1), g.stride(0), g.stride(1),
                                                      N=n, NP=NP, BT=BT, BD=BD, num_warps=warps)
        else:
            dp.zero_()
    return tu.finish(dp, pre.dtype).view(pre.shape), tu.finish(dx, x.dtype).view(x.shape)
