"""Host launchers for ``rms_norm_gated`` (SPEC 1.3): argument checks, tiling, grids.

Tiles depend on the group size ``N`` only (never on the number of rows), so a row's result is the
same bitwise whatever the batch size. The hot shape is ``[B·T·heads, 128]``: the tile path then
packs ``FWD_TILE // 128 = 32`` rows into one program (a 16 KiB bf16 x+g tile, ~40 registers), the
backward ``BWD_TILE // 128 = 16`` rows per block, looped over consecutive blocks by
``BWD_PROGRAMS_PER_SM`` programs per SM (~60 registers: four fit on an SM).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .... import triton_utils as tu
from ....validation import check_choice, check_same_device, check_tensor, reject_float64, shape_str
from ...common import rows_2d
from .reference import ACTIVATIONS, CASTINGS, residual_dtype

OP = "rms_norm_gated"

#: groups of up to this many channels are normalised from one register tile; longer ones are looped
MAX_TILE_N = 8192
#: chunk of the looped path
LOOP_BN = 4096
#: target elements per program tile (rows x padded group) in the forward / backward tile path, and
#: elements per thread that set num_warps (the backward keeps ~8 live fp32 tiles: 8 per thread keeps
#: it near 60 registers at N=128, so 4 programs fit on an SM; measured with ``compile_check`` for sm_90)
FWD_TILE, FWD_PER_THREAD = 4096, 16
BWD_TILE, BWD_PER_THREAD = 2048, 8
#: backward programs per SM (each loops over consecutive row blocks, holding dweight partials)
BWD_PROGRAMS_PER_SM = 4

_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_ACT_CODES = {"swish": 0, "silu": 0, "sigmoid": 1}


def check_args(x: torch.Tensor, g: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               residual: Optional[torch.Tensor], eps: float, activation: str, group_size: Optional[int],
               norm_before_gate: bool, casting: str) -> int:
    """Validate the arguments (also on fake tensors under torch.compile); returns the group size ``N``."""
    reject_float64(OP, x=x, g=g, weight=weight, bias=bias, residual=residual)
    check_tensor(OP, "x", x, min_ndim=1)
    D = x.shape[-1]
    if D < 1:
        raise ValueError(f"{OP}: x's last dim D must be >= 1, got shape {shape_str(x.shape)}")
    check_tensor(OP, "g", g, shape=tuple(x.shape), shape_desc="x.shape")
    if residual is not None:
        check_tensor(OP, "residual", residual, shape=tuple(x.shape), shape_desc="x.shape")
    if weight is not None:
        check_tensor(OP, "weight", weight, shape=(D,), shape_desc="[D]")
    if bias is not None:
        check_tensor(OP, "bias", bias, shape=(D,), shape_desc="[D]")
    check_same_device(OP, x=x, g=g, weight=weight, bias=bias, residual=residual)
    check_choice(OP, "activation", activation, ACTIVATIONS)
    check_choice(OP, "casting", casting, CASTINGS)
    if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{OP}: eps must be a finite number >= 0, got {eps!r}")
    if group_size is None:
        N = D
    else:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
            raise ValueError(f"{OP}: group_size must be None or a positive int, got {group_size!r}")
        if D % group_size:
            raise ValueError(f"{OP}: group_size must divide D = {D}, got {group_size}")
        N = int(group_size)
    if casting == "input":
        bad = []
        if not norm_before_gate:
            bad.append("norm_before_gate=False")
        if group_size is not None and group_size != D:
            bad.append(f"group_size={group_size}")
        if bias is not None:
            bad.append("bias")
        if residual is not None:
            bad.append("residual")
        if bad:
            raise ValueError(f"{OP}: casting='input' (Qwen3-Next rounding) needs norm_before_gate=True, "
                             f"group_size=None, no bias and no residual; got {', '.join(bad)}")
    return N


def _tile(N: int, target: int, per_thread: int) -> tuple[bool, int, int, int]:
    """``(looped, BM, BN, num_warps)`` for group size ``N`` (never depends on the row count)."""
    if N <= MAX_TILE_N:
        bn = tu.next_power_of_2(N)
        bm = max(1, min(128, target // bn))
        looped = False
    else:
        bn, bm, looped = LOOP_BN, 1, True
    warps = max(4, min(16, bm * bn // (32 * per_thread)))
    return looped, bm, bn, warps


def _empty(*shape, dtype, device) -> torch.Tensor:
    """Output/scratch allocation (one place, so tests can poison it with NaN to catch unwritten elements)."""
    return torch.empty(*shape, dtype=dtype, device=device)


def _code(dtype: torch.dtype) -> int:
    return _CODES[dtype]


def _vec(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A ``[D]`` parameter as the kernel reads it (unit stride; fp32 copy of bf16 under the interpreter)."""
    return None if t is None else tu.kernel_input(t).contiguous()



def _kernel_operands(x, g, residual, weight, bias, N):
    """Row views (bf16 widened under the interpreter) and parameter vectors the kernels read:
    ``(D, groups per row, rows, x, g, residual, weight, bias)``."""
    D = x.shape[-1]
    xk = rows_2d(tu.kernel_input(x))
    gk = rows_2d(tu.kernel_input(g))
    rk = None if residual is None else rows_2d(tu.kernel_input(residual))
    return D, D // N, xk.shape[0], xk, gk, rk, _vec(weight), _vec(bias)

def forward(x: torch.Tensor, g: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
            residual: Optional[torch.Tensor], eps: float, activation: str, group_size: Optional[int],
            norm_before_gate: bool, casting: str, prenorm: bool, residual_in_fp32: bool):
    """Triton forward; returns ``(y, residual_out)`` (``residual_out`` is ``None`` unless ``prenorm``)."""
    N = check_args(x, g, weight, bias, residual, eps, activation, group_size, norm_before_gate, casting)
    from .triton_kernels import gated_fwd_looped_kernel, gated_fwd_tile_kernel

    D, NG, M, xk, gk, rk, wk, bk = _kernel_operands(x, g, residual, weight, bias, N)
    res_dt = residual_dtype(x.dtype, residual_in_fp32)
    y = _empty(M, D, dtype=tu.kernel_dtype(x.dtype), device=x.device)
    ro = _empty(M, D, dtype=tu.kernel_dtype(res_dt), device=x.device) if prenorm else None
    if M:
        looped, bm, bn, warps = _tile(N, FWD_TILE, FWD_PER_THREAD)
        kernel = gated_fwd_looped_kernel if looped else gated_fwd_tile_kernel
        y1_dt = x.dtype if weight is None else torch.promote_types(weight.dtype, x.dtype)
        kernel[(tu.cdiv(M, bm), NG)](
            xk, gk, xk if wk is None else wk, xk if bk is None else bk, xk if rk is None else rk, y,
            y if ro is None else ro, M, N, xk.stride(0), gk.stride(0), 0 if rk is None else rk.stride(0),
            y.stride(0), 0 if ro is None else ro.stride(0), 1.0 / N, float(eps),
            ACT=_ACT_CODES[activation], NBG=bool(norm_before_gate), HAS_W=wk is not None, HAS_B=bk is not None,
            HAS_RES=rk is not None, STORE_RES=ro is not None, CAST_INPUT=casting == "input",
            X_CODE=_code(x.dtype), RES_CODE=_code(res_dt), Y1_CODE=_code(y1_dt), BM=bm, BN=bn, num_warps=warps)
    y = tu.finish(y, x.dtype).view(x.shape)
    if ro is not None:
        ro = tu.finish(ro, res_dt).view(x.shape)
    return y, ro


def _grad_rows(t: torch.Tensor, M: int, D: int) -> torch.Tensor:
    """An upstream gradient as ``[M, D]`` with any strides (a view when possible: stride 0 from
    ``.sum()`` and transposed layouts are read in place)."""
    return tu.kernel_input(t).reshape(M, D)


def backward(dy: torch.Tensor, dres: Optional[torch.Tensor], x: torch.Tensor, g: torch.Tensor,
             weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
             eps: float, activation: str, group_size: Optional[int], norm_before_gate: bool, casting: str,
             prenorm: bool, residual_in_fp32: bool):
    """Triton backward; returns ``(dx, dg, dweight, dbias, dresidual)`` (``None`` for absent inputs).

    ``dres`` is the upstream gradient of ``residual_out`` (only with ``prenorm``); it is added to
    ``dx``. ``casting='input'`` uses the rounding-free gradient (SPEC 1.3), i.e. the ``fp32`` one.
    ``dweight``/``dbias`` are summed in fp32 from per-program partials and returned in their dtypes.
    """
    from .triton_kernels import gated_bwd_looped_kernel, gated_bwd_tile_kernel

    N = x.shape[-1] if group_size is None else int(group_size)
    D, NG, M, xk, gk, rk, wk, bk = _kernel_operands(x, g, residual, weight, bias, N)
    dyk = _grad_rows(dy, M, D)
    drok = _grad_rows(dres, M, D) if (prenorm and dres is not None) else None
    dev = x.device
    dx = _empty(M, D, dtype=tu.kernel_dtype(x.dtype), device=dev)
    dg = _empty(M, D, dtype=tu.kernel_dtype(g.dtype), device=dev)
    dr = None if rk is None else _empty(M, D, dtype=tu.kernel_dtype(residual.dtype), device=dev)
    dw = db = None
    if M:
        looped, bm, bn, warps = _tile(N, BWD_TILE, BWD_PER_THREAD)
        target = max(1, tu.cdiv(BWD_PROGRAMS_PER_SM * tu.num_sms(dev), NG))
        if looped:
            rows_per_prog = tu.cdiv(M, min(M, target))
            n_prog = tu.cdiv(M, rows_per_prog)
        else:
            nb = tu.cdiv(M, bm)
            bpp = tu.cdiv(nb, min(nb, target))
            n_prog = tu.cdiv(nb, bpp)
        dwp = _empty(n_prog, D, dtype=torch.float32, device=dev) if wk is not None else None
        dbp = _empty(n_prog, D, dtype=torch.float32, device=dev) if bk is not None else None
        common = dict(ACT=_ACT_CODES[activation], NBG=bool(norm_before_gate), HAS_W=wk is not None,
                      HAS_B=bk is not None, HAS_RES=rk is not None, HAS_DRO=drok is not None,
                      RES_CODE=_code(residual_dtype(x.dtype, residual_in_fp32)), BM=bm, BN=bn, num_warps=warps)
        ptrs = (xk, gk, xk if wk is None else wk, xk if bk is None else bk, xk if rk is None else rk, dyk,
                dyk if drok is None else drok, dx, dg, dx if dr is None else dr,
                dx if dwp is None else dwp, dx if dbp is None else dbp)
        strides = (xk.stride(0), gk.stride(0), 0 if rk is None else rk.stride(0), dyk.stride(0), dyk.stride(1),
                   0 if drok is None else drok.stride(0), 0 if drok is None else drok.stride(1),
                   dx.stride(0), dg.stride(0), 0 if dr is None else dr.stride(0))
        if looped:
            stats = _empty(M * NG * 2, dtype=torch.float32, device=dev)
            gated_bwd_looped_kernel[(n_prog, NG)](
                *ptrs, stats, M, N, D, NG, rows_per_prog, tu.cdiv(rows_per_prog, bm), *strides, 1.0 / N,
                float(eps), **common)
        else:
            gated_bwd_tile_kernel[(n_prog, NG)](*ptrs, M, N, D, bpp, *strides, 1.0 / N, float(eps), **common)
        if dwp is not None:
            dw = dwp.sum(0).to(weight.dtype)
        if dbp is not None:
            db = dbp.sum(0).to(bias.dtype)
    else:
        if weight is not None:
            dw = torch.zeros_like(weight, memory_format=torch.contiguous_format)
        if bias is not None:
            db = torch.zeros_like(bias, memory_format=torch.contiguous_format)
    dx = tu.finish(dx, x.dtype).view(x.shape)
    dg = tu.finish(dg, g.dtype).view(g.shape)
    if dr is not None:
        dr = tu.finish(dr, residual.dtype).view(residual.shape)
    return dx, dg, dw, db, dr
