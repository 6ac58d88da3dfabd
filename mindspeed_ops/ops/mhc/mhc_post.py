"""Host launchers for ``mhc_post`` (SPEC 1.12.4): checks, tiling, grids."""
from __future__ import annotations

import math

import torch

from ... import triton_utils as tu
from ..common import unit_last_stride
from ...validation import check_same_device, check_same_dtype, check_tensor, reject_float64, shape_str
from .mhc_pre_bmm import _THREADS, _WARPS, _vec, _x3, block_d, check_n, stream_tile, vector_aligned

OP = "mhc_post"


def check_args(x, residual, h_post, h_res) -> tuple[int, int]:
    """Validate (also on fake tensors); returns ``(n, D)``."""
    reject_float64(OP, x=x, residual=residual, h_post=h_post, h_res=h_res)
    check_tensor(OP, "x", x, min_ndim=1)
    check_tensor(OP, "residual", residual, min_ndim=2)
    check_same_dtype(OP, x=x, residual=residual)
    n, D = residual.shape[-2], residual.shape[-1]
    check_n(OP, n)
    lead = tuple(residual.shape[:-2])
    if tuple(x.shape) != lead + (D,):
        raise ValueError(f"{OP}: x must have shape [..., D] = {shape_str(lead + (D,))} (residual is "
                         f"{shape_str(residual.shape)}), got {shape_str(x.shape)}")
    check_tensor(OP, "h_post", h_post, shape=lead + (n,), shape_desc="[..., n]")
    check_tensor(OP, "h_res", h_res, shape=lead + (n, n), shape_desc="[..., n, n]")
    check_same_device(OP, x=x, residual=residual, h_post=h_post, h_res=h_res)
    return n, D


def _x2(x, M, D):
    return unit_last_stride(tu.kernel_input(x).reshape(M, D))


def _weights(h, M, *inner):
    """``h`` as ``[M, *inner]`` with contiguous inner dims (any row stride; else a copy: ``n + n²`` values a
    token): the kernels address a token's weights as immediate offsets from one pointer."""
    w = tu.kernel_input(h).reshape(M, *inner)
    want, size = [], 1
    for s in reversed(inner):
        want.insert(0, size)
        size *= s
    if any(st != ws and s > 1 for st, ws, s in zip(w.stride()[1:], want, inner)):
        w = w.contiguous()
    return w


def forward(x, residual, h_post, h_res):
    from .triton_kernels import mhc_post_fwd_kernel

    n, D = check_args(x, residual, h_post, h_res)
    M = math.prod(residual.shape[:-2])
    out = torch.empty(M, n, D, dtype=tu.kernel_dtype(x.dtype), device=x.device)
    if M and D:
        x2, r3 = _x2(x, M, D), _x3(residual, M, n, D)
        hp, hr = _weights(h_post, M, n), _weights(h_res, M, n, n)
        # x and the n residual tiles in registers
        BT, BD = stream_tile(D, 16 if n <= 2 else 8, vector_aligned(D, x2, r3, out))
        grid = (tu.cdiv(M, BT) * tu.cdiv(D, BD),)
        mhc_post_fwd_kernel[grid](x2, r3, hp, hr, out, M, D, x2.stride(0), r3.stride(0), r3.stride(1),
                                  hp.stride(0), hr.stride(0), out.stride(0), out.stride(1),
                                  N=n, BT=BT, BD=BD, num_warps=_WARPS)
    return tu.finish(out, x.dtype).view(residual.shape)


def backward(dout, x, residual, h_post, h_res):
    from .triton_kernels import mhc_post_bwd_kernel

    n, D = residual.shape[-2], residual.shape[-1]
    M = math.prod(residual.shape[:-2])
    dev = x.device
    dx = torch.empty(M, D, dtype=tu.kernel_dtype(x.dtype), device=dev)
    dr = torch.empty(M, n, D, dtype=tu.kernel_dtype(residual.dtype), device=dev)
    dhp = torch.empty(M, n, dtype=tu.kernel_dtype(h_post.dtype), device=dev)
    dhr = torch.empty(M, n, n, dtype=tu.kernel_dtype(h_res.dtype), device=dev)
    if M and D:
        x2, r3 = _x2(x, M, D), _x3(residual, M, n, D)
        hp, hr = _weights(h_post, M, n), _weights(h_res, M, n, n)
        g = tu.kernel_input(dout).reshape(M, n, D)
        # a tile row is one warp's 32 lanes x per_row elements (a 16-byte vector, fewer when the n fp32
        # dout tiles would pass 32 registers a thread); the warps take different rows, so the n + n² dot
        # products of a tile reduce in each lane's registers (VEC = per_row), across lanes once at the end
        # (one element a lane when the accesses cannot be vectors: per_row would not be the lane's run)
        per_row = min(_vec(x.dtype), 1 << ((32 // n).bit_length() - 1))
        if not vector_aligned(D, x2, r3, g, dx, dr):
            per_row = 1
        BD = block_d(D, 32 * per_row)
        BT = max(_WARPS, (_THREADS * per_row) // BD)
        mhc_post_bwd_kernel[(tu.cdiv(M, BT),)](x2, r3, hp, hr, g, dx, dr, dhp, dhr, M, D, x2.stride(0),
                                               r3.stride(0), r3.stride(1), hp.stride(0), hr.stride(0),
                                               g.stride(0), g.stride(1), g.stride(2), N=n, BT=BT, BD=BD,
                                               VEC=min(per_row, BD), num_warps=_WARPS)
    elif M:
        dhp.zero_()
        dhr.zero_()
    return (tu.finish(dx, x.dtype).view(x.shape), tu.finish(dr, residual.dtype).view(residual.shape),
            tu.finish(dhp, h_post.dtype).view(h_post.shape), tu.finish(dhr, h_res.dtype).view(h_res.shape))
