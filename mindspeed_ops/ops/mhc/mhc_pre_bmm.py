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


#: warps of every mHC stream kernel (pre/post, forward and backward); the launchers size the
#: ``[BT, BD]`` stream tiles in elements a thread (8 = one 16-byte vector of a 16-bit dtype)
_WARPS = 4
_THREADS = 32 * _WARPS


def _vec(dtype: torch.dtype) -> int:
    """Elements of one 16-byte vector of ``dtype`` as the kernel sees it (bf16 is fp32 when interpreting)."""
    return 16 // tu.kernel_dtype(dtype).itemsize


def block_d(D: int, cap: int) -> int:
    """Power-of-two tile of the hidden dim (16..``cap``): the largest one whose masked padding is at most
    1/8 of ``D`` (1280 -> 256, 2560 -> 512, 4096/7168 -> 1024), else the one with the least padding."""
    bd = min(cap, max(16, tu.next_power_of_2(D)))
    best, best_pad = bd, None
    while bd >= 16:
        pad = tu.cdiv(D, bd) * bd - D
        if 8 * pad <= D:
            return bd
        if best_pad is None or pad < best_pad:
            best, best_pad = bd, pad
        bd //= 2
    return best


def vector_aligned(D: int, *tensors: torch.Tensor) -> bool:
    """Whether the D-contiguous accesses of ``tensors`` become 16-byte vectors on the GPU: what Triton's
    specialization can prove (``D``, every stride but the last and each base address multiples of 16)."""
    return D % 16 == 0 and all(t.data_ptr() % 16 == 0 and all(st % 16 == 0 for st in t.stride()[:-1])
                               and t.stride(-1) == 1 for t in tensors)


def stream_tile(D: int, per_thread: int, aligned: bool = True, cap: int = 1024) -> tuple[int, int]:
    """``(BT, BD)`` of a ``[rows, hidden]`` tile holding ``per_thread`` elements a thread (of ``_THREADS``);
    at most 4 when the accesses cannot be vectors (each element then needs its own address)."""
    bd = block_d(D, cap)
    if not aligned:
        per_thread = min(per_thread, 4)
    return max(1, (_THREADS * per_thread) // bd), bd


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
        BT, BD = stream_tile(D, 16, vector_aligned(D, x3, y))
        grid = (tu.cdiv(M, BT) * tu.cdiv(D, BD),)
        mhc_pre_bmm_fwd_kernel[grid](p, x3, y, M, D, p.stride(0), p.stride(1), x3.stride(0), x3.stride(1),
                                     y.stride(0), N=n, BT=BT, BD=BD, num_warps=_WARPS)
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
            # n fp32 [BT, BD] accumulators: 8 elements a thread each from n = 3 on (64 registers at n = 8)
            BT, BD = stream_tile(D, 16 if n <= 2 else 8, vector_aligned(D, x3, g, dx))
            mhc_pre_bmm_bwd_kernel[(tu.cdiv(M, BT),)](p, x3, g, dp, dx, M, D, p.stride(0), p.stride(1),
                                                      x3.stride(0), x3.stride(1), g.stride(0), g.stride(1),
                                                      N=n, BT=BT, BD=BD, num_warps=_WARPS)
        else:
            dp.zero_()
    return tu.finish(dp, pre.dtype).view(pre.shape), tu.finish(dx, x.dtype).view(x.shape)
