"""Host launchers for ``mhc_post`` (SPEC 1.12.4): checks, tiling, grids."""
from __future__ import annotations

import math

import torch

from ... import triton_utils as tu
from ..common import unit_last_stride
from ...validation import check_same_device, check_same_dtype, check_tensor, reject_float64, shape_str
from .mhc_pre_bmm import _tile, _x3, check_n

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


def forward(x, residual, h_post, h_res):
    from .triton_kernels import mhc_post_fwd_kernel

    n, D = check_args(x, residual, h_post, h_res)
    M = math.prod(residual.shape[:-2])
    out = torch.empty(M, n, D, dtype=tu.kernel_dtype(x.dtype), device=x.device)
    if M and D:
        x2, r3 = _x2(x, M, D), _x3(residual, M, n, D)
        hp = tu.kernel_input(h_post).reshape(M, n)
        hr = tu.kernel_input(h_res).reshape(M, n, n)
        NP, BT, BD, warps = _tile(n, D)
        grid = (tu.cdiv(M, BT), tu.cdiv(D, BD))
        mhc_post_fwd_kernel[grid](x2, r3, hp, hr, out, M, D, x2.stride(0), r3.stride(0), r3.stride(1),
                                  hp.stride(0), hp.stride(1), hr.stride(0), hr.stride(1), hr.stride(2),
                                  out.stride(0), out.stride(1), N=n, NP=NP, BT=BT, BD=BD, num_warps=warps)
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
        hp = tu.kernel_input(h_post).reshape(M, n)
        hr = tu.kernel_input(h_res).reshape(M, n, n)
        g = tu.kernel_input(dout).reshape(M, n, D)
        NP, BT, BD, warps = _tile(n, D, 2048 if n > 4 else 4096)  # n = 8: keeps the [NP, NP] sums unspilled
        mhc_post_bwd_kernel[(tu.cdiv(M, BT),)](x2, r3, hp, hr, g, dx, dr, dhp, dhr, M, D, x2.stride(0),
                                               r3.stride(0), r3.stride(1), hp.stride(0), hp.stride(1),
                                               hr.stride(0), hr.stride(1), hr.stride(2), g.stride(0),
                                               g.stride(1), g.stride(2), N=n, NP=NP, BT=BT, BD=BD,
                                               num_warps=warps)
    elif M:
        dhp.zero_()
        dhr.zero_()
    return (tu.finish(dx, x.dtype).view(x.shape), tu.finish(dr, residual.dtype).view(residual.shape),
            tu.finish(dhp, h_post.dtype).view(h_post.shape), tu.finish(dhr, h_res.dtype).view(h_res.shape))
