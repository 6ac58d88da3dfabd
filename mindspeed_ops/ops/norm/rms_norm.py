"""Host launchers of the row-norm kernels (SPEC 1.1, 1.2).

``rows_forward`` / ``rows_backward`` drive the shared row kernels of ``triton_kernels.py`` for all
three operators (``l2norm.py`` calls them with ``inv_n = 1``); below them are the argument checks and
launchers of ``rmsnorm_without_weight`` and ``rms_norm``.

Tiling is chosen from ``D`` alone (never from the number of rows), so every row is reduced in the
same order whatever the batch: row ``r`` is bitwise the same in a call of 1 row or 65,536 rows.

- ``next_pow2(D) <= MAX_TILE`` (16,384; 8,192 for a backward with ``dweight``): tile path,
  ``BM = max(1, 4096 // BD)`` whole rows per program (at least 4,096 elements a program, 16 per
  thread: two 16-byte loads of bf16) and ``num_warps = BM·BD / 512`` clamped to [4, 32]. The
  forward reads ``x`` once and writes ``y`` once (~48 registers: five programs an SM); the
  backward reads ``x``, ``dy`` once and writes ``dx`` once. With a weight gradient, the backward
  is a persistent grid, each program over a contiguous range of row blocks, keeping its fp32
  ``Σ dy ⊙ x̂`` in registers: the partials are ``[programs, D]`` fp32 (4-8 MB at D = 4096),
  summed by torch (deterministic two-stage reduction). Its size is what the register file holds
  (:func:`dw_maxnreg`: 16-bit inputs are capped at 64 registers for whole-row tiles, giving four
  8-warp programs an SM; uncapped kernels get two).
- longer rows: a statistics kernel walks each row in 4,096-element chunks, then an elementwise
  kernel on a (column chunk, row group) grid applies the statistics (one extra read of ``x``).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import FLOAT_DTYPES, check_tensor, dtype_name, reject_float64, shape_str
from ..common import rows_2d

#: largest power-of-two row kept whole in registers; longer rows take the looped path
MAX_TILE = 16384
#: the same for the backward with a weight gradient, which also keeps ``w`` and the ``dweight``
#: accumulator in registers (at 16,384 it would spill: ptxas, sm_90)
MAX_TILE_DW = 8192
#: column chunk of the looped path
LOOP_BD = 4096
LOOP_WARPS = 8


def tile_config(D: int, max_tile: int = MAX_TILE) -> Optional[tuple[int, int, int]]:
    """``(BM, BD, num_warps)`` of the tile path for rows of ``D``, or ``None`` for the looped path."""
    BD = tu.next_power_of_2(D)
    if BD > max_tile:
        return None
    BM = max(1, 4096 // BD)
    num_warps = min(32, max(4, BM * BD // 512))
    return BM, BD, num_warps


def _resident(num_warps: int, regs: int = 128) -> int:
    """Programs of ``num_warps`` warps at ``regs`` registers a thread that one SM's 64K-register file
    holds (the persistent grids launch this many per SM; 128 is the uncapped backward's budget)."""
    return max(1, 65536 // (32 * num_warps * regs))


def dw_maxnreg(BM: int, BD: int, elem_bytes: int, w_bytes: int = 2) -> Optional[int]:
    """Register cap (``maxnreg``) of the tile backward with ``dweight``, or ``None`` (uncapped).

    Uncapped, ptxas gives it 87-128 registers at 16 elements a thread (the fp32 ``dweight``
    accumulator, ``x̂`` and ``g`` stay live through the row reductions): two 8-warp programs an SM,
    too few rows in flight to saturate HBM. With 16-bit inputs ptxas meets these caps without
    spilling (it re-expands the packed bf16/fp16 inputs instead of keeping fp32 copies; checked on
    sm_80/sm_90 with ``mindspeed-ops compile-check``): 64 for whole-row tiles (``BD >= 2048``,
    four 8-warp programs an SM; 72 with an fp32 weight, three) and 80 for many-row tiles
    (``BD <= 256``, three programs). The mid sizes and fp32 inputs spill under a cap and stay
    uncapped. ``elem_bytes``: the larger of ``x``'s and ``dy``'s element sizes; ``w_bytes``: the weight's.
    """
    if elem_bytes != 2:
        return None
    if BD >= 2048 and BM <= 2:
        return 64 if w_bytes <= 2 else 72
    if BD <= 256:
        return 80
    return None


def _dy_2d(dy: torch.Tensor, N: int, D: int) -> torch.Tensor:
    """``dy`` as ``[N, D]`` with any strides (stride 0 from ``.sum()`` and transposes included)."""
    return tu.kernel_input(dy).reshape(N, D)


def _vec(t: Optional[torch.Tensor], N: int) -> Optional[torch.Tensor]:
    """A per-row tensor (``[..., 1]`` or ``[...]``) as ``[N]`` with any stride."""
    return None if t is None else tu.kernel_input(t).reshape(N)


def rows_forward(x2: torch.Tensor, weight: Optional[torch.Tensor], *, inv_n: float, eps: float, offset: float = 0.0,
                 y_dtype: Optional[torch.dtype] = None, rstd_dtype: Optional[torch.dtype] = None):
    """Row-norm forward of ``x2`` (``[N, D]``, unit column stride, any row stride, as the kernel sees it).

    Returns ``(y [N, D] in y_dtype or None, rstd [N] in rstd_dtype or None)``; ``None`` dtypes skip
    that output (``rstd`` only: the normalised rows are never written).
    """
    from .triton_kernels import norm_apply_kernel, norm_fwd_tile_kernel, norm_row_stats_kernel

    N, D = x2.shape
    dev = x2.device
    y = None if y_dtype is None else torch.empty(N, D, dtype=tu.kernel_dtype(y_dtype), device=dev)
    w = None if weight is None else tu.kernel_input(weight).contiguous()
    cfg = tile_config(D)
    if cfg is not None:
        rstd = None if rstd_dtype is None else torch.empty(N, dtype=tu.kernel_dtype(rstd_dtype), device=dev)
        if N:
            BM, BD, warps = cfg
            norm_fwd_tile_kernel[(tu.cdiv(N, BM),)](
                x2, x2 if y is None else y, x2 if w is None else w, x2 if rstd is None else rstd,
                N, D, x2.stride(0), 0 if y is None else y.stride(0), float(inv_n), float(eps), float(offset),
                HAS_W=w is not None, STORE_Y=y is not None, STORE_RSTD=rstd is not None,
                BM=BM, BD=BD, num_warps=warps)
        if rstd is not None:
            rstd = tu.finish(rstd, rstd_dtype)
    else:
        r32 = torch.empty(N, dtype=torch.float32, device=dev)
        if N:
            norm_row_stats_kernel[(N,)](
                x2, x2, x2, x2, x2, r32, r32, N, D, x2.stride(0), 0, 0, 0, float(inv_n), float(eps), 0.0,
                COMPUTE_C=False, HAS_DY=False, HAS_W=False, HAS_DR=False, RSTD_GIVEN=False, X_IS_NORMALIZED=False,
                BD=LOOP_BD, num_warps=LOOP_WARPS)
            if y is not None:
                grid, rpp = _apply_grid(N, D, dev)
                norm_apply_kernel[grid](
                    x2, x2, x2 if w is None else w, r32, r32, y, r32, N, D, x2.stride(0), 0, 0, y.stride(0),
                    float(offset), rpp, BWD=False, HAS_DY=False, HAS_W=w is not None, HAS_DW=False,
                    X_IS_NORMALIZED=False, BD=LOOP_BD, num_warps=LOOP_WARPS)
        rstd = None if rstd_dtype is None else r32.to(rstd_dtype)
    if y is not None:
        y = tu.finish(y, y_dtype)
    return y, rstd


def rows_forward_pair(xa: torch.Tensor, xb: torch.Tensor, *, inv_n: float, eps: float,
                      y_dtype: Optional[torch.dtype] = None, rstd_dtype: Optional[torch.dtype] = None):
    """:func:`rows_forward` (no weight) of two row sets of one shape and dtype (GDN/KDA's q and k): one launch of
    the tile kernel where ``D`` takes the tile path, else two calls. Returns ``((ya, ra), (yb, rb))``, each as
    :func:`rows_forward`'s; every row's arithmetic is that of :func:`rows_forward` (bitwise the same)."""
    from .triton_kernels import norm_fwd_tile_kernel

    N, D = xa.shape
    cfg = tile_config(D)
    # a row stride of 1 (D = 1) reaches the kernel as a constant, which its per-program swap of strides cannot take
    # (it does not build for the GPU): two launches there
    if cfg is None or xb.shape != xa.shape or xb.dtype != xa.dtype or not N or D == 1 or 1 in (xa.stride(0),
                                                                                                 xb.stride(0)):
        return tuple(rows_forward(x, None, inv_n=inv_n, eps=eps, y_dtype=y_dtype, rstd_dtype=rstd_dtype)
                     for x in (xa, xb))
    dev = xa.device
    ya, yb = (None if y_dtype is None else torch.empty(N, D, dtype=tu.kernel_dtype(y_dtype), device=dev)
              for _ in range(2))
    ra, rb = (None if rstd_dtype is None else torch.empty(N, dtype=tu.kernel_dtype(rstd_dtype), device=dev)
              for _ in range(2))
    BM, BD, warps = cfg
    norm_fwd_tile_kernel[(2 * tu.cdiv(N, BM),)](
        xa, xa if ya is None else ya, xa, xa if ra is None else ra, N, D, xa.stride(0),
        0 if ya is None else ya.stride(0), float(inv_n), float(eps), 0.0,
        HAS_W=False, STORE_Y=ya is not None, STORE_RSTD=ra is not None, BM=BM, BD=BD,
        X2=xb, Y2=xb if yb is None else yb, RSTD2=xb if rb is None else rb, stride_x2=xb.stride(0),
        stride_y2=0 if yb is None else yb.stride(0), PAIR=True, num_warps=warps)
    return tuple((None if y is None else tu.finish(y, y_dtype), None if r is None else tu.finish(r, rstd_dtype))
                 for y, r in ((ya, ra), (yb, rb)))


def _apply_grid(N: int, D: int, device: torch.device) -> tuple[tuple[int, int], int]:
    """(column chunks, row groups) grid of the looped elementwise pass, and rows per group."""
    chunks = tu.cdiv(D, LOOP_BD)
    groups = max(1, min(N, tu.cdiv(tu.num_sms(device) * _resident(LOOP_WARPS), chunks)))
    rpp = tu.cdiv(N, groups)
    return (chunks, tu.cdiv(N, rpp)), rpp


def rows_backward(x2: torch.Tensor, dy2: Optional[torch.Tensor], weight: Optional[torch.Tensor], *,
                  inv_n: float, eps: float, offset: float = 0.0, rstd: Optional[torch.Tensor] = None,
                  dr: Optional[torch.Tensor] = None, x_is_normalized: bool = False, dx_dtype: torch.dtype,
                  need_dw: bool = False):
    """Row-norm backward: ``dx = r·(g − x̂·(Σ g·x̂ + dr·r)·inv_n)`` with ``g = dy ⊙ (w + offset)``.

    ``x2``: ``[N, D]`` rows as the kernel sees them (``x``, or ``x̂`` when ``x_is_normalized``, then
    ``rstd`` is required); ``dy2``: ``[N, D]`` any strides, ``[N, G, D]`` (the gradient of each row is
    the fp32 sum of its ``G`` rows: added in order by the tile kernel, by ``torch.sum`` for rows too long
    for one tile), or ``None`` (no gradient of the
    normalised output); ``rstd``: ``[N]`` fp32 saved statistics, else recomputed from ``x``;
    ``dr``: ``[N]`` gradient of ``rstd``, any stride. Returns ``(dx [N, D] in dx_dtype, dweight fp32
    [D] or None)`` (``dweight = Σ_rows dy ⊙ x̂``, only with ``need_dw`` and a weight).
    """
    from .triton_kernels import norm_apply_kernel, norm_bwd_tile_kernel, norm_row_stats_kernel

    N, D = x2.shape
    dev = x2.device
    w = None if weight is None else tu.kernel_input(weight).contiguous()
    need_dw = bool(need_dw and w is not None and dy2 is not None)
    dx = torch.empty(N, D, dtype=tu.kernel_dtype(dx_dtype), device=dev)
    if N == 0:
        return tu.finish(dx, dx_dtype), (torch.zeros(D, dtype=torch.float32, device=dev) if need_dw else None)
    dummy = x2
    cfg = tile_config(D, MAX_TILE_DW if need_dw else MAX_TILE)
    group, s_group = 1, 0
    if dy2 is not None and dy2.dim() == 3:
        if cfg is None:  # the looped path takes [N, D]: sum first (a torch pass, long rows only)
            dy2 = dy2.sum(1, dtype=torch.float32) if dy2.shape[1] > 1 else dy2[:, 0]
        else:
            group, s_group = dy2.shape[1], dy2.stride(1)
            dy2 = dy2[:, 0]
    sdy = (0, 0) if dy2 is None else (dy2.stride(0), dy2.stride(1))
    sdr = 0 if dr is None else dr.stride(0)
    flags = dict(HAS_DY=dy2 is not None, HAS_W=w is not None, HAS_DR=dr is not None)
    if cfg is not None:
        BM, BD, warps = cfg
        nblocks = tu.cdiv(N, BM)
        opts = {}
        if need_dw:
            elem = max(x2.element_size(), dy2.element_size())
            cap = dw_maxnreg(BM, BD, elem, w.element_size())
            if cap is not None:
                opts["maxnreg"] = cap
            progs = min(nblocks, tu.num_sms(dev) * _resident(warps, cap or 128))
            bpp = tu.cdiv(nblocks, progs)
            progs = tu.cdiv(nblocks, bpp)
            dwp = torch.empty(progs, D, dtype=torch.float32, device=dev)
        else:
            bpp, progs, dwp = 1, nblocks, dummy
        norm_bwd_tile_kernel[(progs,)](
            x2, dummy if dy2 is None else dy2, dummy if w is None else w, dummy if rstd is None else rstd,
            dummy if dr is None else dr, dx, dwp, N, D, x2.stride(0), sdy[0], sdy[1], sdr, dx.stride(0),
            float(inv_n), float(eps), float(offset), bpp, s_group, HAS_DW=need_dw, RSTD_GIVEN=rstd is not None,
            X_IS_NORMALIZED=x_is_normalized, BM=BM, BD=BD, DY_GROUP=group, num_warps=warps, **opts, **flags)
    else:
        r32 = torch.empty(N, dtype=torch.float32, device=dev)
        c32 = torch.empty(N, dtype=torch.float32, device=dev)
        norm_row_stats_kernel[(N,)](
            x2, dummy if dy2 is None else dy2, dummy if w is None else w, dummy if dr is None else dr,
            dummy if rstd is None else rstd, r32, c32, N, D, x2.stride(0), sdy[0], sdy[1], sdr,
            float(inv_n), float(eps), float(offset), COMPUTE_C=True, RSTD_GIVEN=rstd is not None,
            X_IS_NORMALIZED=x_is_normalized, BD=LOOP_BD, num_warps=LOOP_WARPS, **flags)
        grid, rpp = _apply_grid(N, D, dev)
        dwp = torch.empty(grid[1], D, dtype=torch.float32, device=dev) if need_dw else dummy
        norm_apply_kernel[grid](
            x2, dummy if dy2 is None else dy2, dummy if w is None else w, r32, c32, dx, dwp, N, D, x2.stride(0),
            sdy[0], sdy[1], dx.stride(0), float(offset), rpp, BWD=True, HAS_DY=dy2 is not None,
            HAS_W=w is not None, HAS_DW=need_dw, X_IS_NORMALIZED=x_is_normalized, BD=LOOP_BD,
            num_warps=LOOP_WARPS)
    dw = dwp.sum(0) if need_dw else None
    return tu.finish(dx, dx_dtype), dw


# ------------------------------------------------------------------------------------------------
# Argument checks (also run on fake tensors under torch.compile)


def check_eps(op: str, eps) -> None:
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{op}: eps must be a finite number >= 0, got {eps!r}")


def check_x(op: str, x: torch.Tensor) -> int:
    """``x`` is ``[..., D]`` fp32/fp16/bf16 with ``D >= 1``; returns ``D``."""
    reject_float64(op, x=x)
    check_tensor(op, "x", x, min_ndim=1)
    if x.shape[-1] < 1:
        raise ValueError(f"{op}: x's last dim D must be >= 1, got shape {shape_str(x.shape)}")
    return x.shape[-1]


def check_out_dtype(op: str, name: str, dtype: Optional[torch.dtype]) -> None:
    if dtype is not None and dtype not in FLOAT_DTYPES:
        allowed = "/".join(dtype_name(d) for d in FLOAT_DTYPES)
        got = dtype_name(dtype) if isinstance(dtype, torch.dtype) else repr(dtype)
        raise TypeError(f"{op}: {name} must be None or {allowed}, got {got}")


def check_rmsnorm_without_weight_args(x: torch.Tensor, eps: float, rstd_dtype: Optional[torch.dtype]) -> None:
    op = "rmsnorm_without_weight"
    check_x(op, x)
    check_eps(op, eps)
    check_out_dtype(op, "rstd_dtype", rstd_dtype)


def check_rms_norm_args(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float) -> None:
    op = "rms_norm"
    D = check_x(op, x)
    check_eps(op, eps)
    if not isinstance(offset, (int, float)) or isinstance(offset, bool) or not math.isfinite(offset):
        raise ValueError(f"{op}: offset must be a finite number, got {offset!r}")
    if weight is None:
        if offset != 0.0:
            raise ValueError(f"{op}: offset must be 0.0 when weight is None (y = x̂·(weight + offset) needs a "
                             f"weight), got offset={offset}")
        return
    reject_float64(op, weight=weight)
    check_tensor(op, "weight", weight, shape=(D,), shape_desc="[D]")
    if weight.device != x.device:
        raise ValueError(f"{op}: weight must be on {x.device} (like x), got {weight.device}")


# ------------------------------------------------------------------------------------------------
# Launchers of the two RMS operators (backend "triton")


def rmsnorm_without_weight_forward(x: torch.Tensor, eps: float = 1e-6, return_normalized: bool = False,
                                   rstd_dtype: Optional[torch.dtype] = None):
    """``(rstd [..., 1] in rstd_dtype or x.dtype, y [..., D] in x.dtype or None)``."""
    check_rmsnorm_without_weight_args(x, eps, rstd_dtype)
    D = x.shape[-1]
    x2 = rows_2d(tu.kernel_input(x))
    y, rstd = rows_forward(x2, None, inv_n=1.0 / D, eps=eps, y_dtype=x.dtype if return_normalized else None,
                           rstd_dtype=rstd_dtype or x.dtype)
    rstd = rstd.view(*x.shape[:-1], 1)
    return rstd, (None if y is None else y.view(x.shape))


def rmsnorm_without_weight_backward(x: torch.Tensor, drstd: Optional[torch.Tensor], dy: Optional[torch.Tensor],
                                    eps: float = 1e-6) -> torch.Tensor:
    """``dx = r·(dy − x̂·mean(dy ⊙ x̂)) − drstd·r³·x/D`` with ``r`` recomputed in fp32 from ``x``."""
    D = x.shape[-1]
    x2 = rows_2d(tu.kernel_input(x))
    N = x2.shape[0]
    dx, _ = rows_backward(x2, None if dy is None else _dy_2d(dy, N, D), None, inv_n=1.0 / D, eps=eps,
                          dr=_vec(drstd, N), dx_dtype=x.dtype)
    return dx.view(x.shape)


def rms_norm_forward(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
                     offset: float = 0.0) -> torch.Tensor:
    """``y = x̂ ⊙ (weight + offset)`` in ``x.dtype``."""
    check_rms_norm_args(x, weight, eps, offset)
    D = x.shape[-1]
    x2 = rows_2d(tu.kernel_input(x))
    y, _ = rows_forward(x2, weight, inv_n=1.0 / D, eps=eps, offset=offset, y_dtype=x.dtype)
    return y.view(x.shape)


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
                      offset: float = 0.0, need_dweight: bool = True):
    """``(dx in x.dtype, dweight in weight.dtype or None)``; ``dweight`` summed in fp32 over rows."""
    D = x.shape[-1]
    x2 = rows_2d(tu.kernel_input(x))
    N = x2.shape[0]
    dx, dw = rows_backward(x2, _dy_2d(dy, N, D), weight, inv_n=1.0 / D, eps=eps, offset=offset, dx_dtype=x.dtype,
                           need_dw=need_dweight)
    return dx.view(x.shape), (None if dw is None else dw.to(weight.dtype))
