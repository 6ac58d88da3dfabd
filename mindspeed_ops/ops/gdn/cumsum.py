"""``chunk_local_cumsum`` (SPEC 1.10.1): checks, tiling and launch of the chunk-local gate cumsum."""
from __future__ import annotations

import math
import warnings
from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_cu_seqlens, check_tensor, reject_float64
from . import reference as _ref
from .common import chunk_table, use_triton

OP = "chunk_local_cumsum"
_WARNED: set = set()


def check_args(g: torch.Tensor, chunk_size: int, scale: Optional[float], cu_seqlens: Optional[torch.Tensor],
               head_first: bool, output_dtype: Optional[torch.dtype]) -> Optional[list]:
    """Validate the arguments; returns the host copy of ``cu_seqlens`` (or None)."""
    if head_first:
        raise ValueError(f"{OP}: head_first=True is not supported (layouts are token-major [B, T, HV(, K)])")
    reject_float64(OP, g=g)
    check_tensor(OP, "g", g, ndim=(3, 4))
    if not isinstance(chunk_size, int) or not 1 <= chunk_size <= 256 or chunk_size & (chunk_size - 1):
        raise ValueError(f"{OP}: chunk_size must be a power of two in [1, 256], got {chunk_size!r}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"{OP}: scale must be a finite number or None, got {scale!r}")
    if output_dtype is not None and output_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{OP}: output_dtype must be float32/float16/bfloat16 or None, got {output_dtype}")
    return check_cu_seqlens(OP, cu_seqlens, batch=g.shape[0], total=g.shape[1], like=("g", g))


def _tiles(BT: int, C: int) -> int:
    """Columns per program: ~8K gate values a program (all heads of a chunk for scalar gates)."""
    return max(1, min(tu.next_power_of_2(C), max(16, 8192 // BT)))


def chunk_local_cumsum(g: torch.Tensor, chunk_size: int = 64, reverse: bool = False, scale: Optional[float] = None,
                       cu_seqlens: Optional[torch.Tensor] = None, head_first: bool = False,
                       output_dtype: Optional[torch.dtype] = torch.float32,
                       chunk_indices: Optional[torch.Tensor] = None, **kwargs) -> torch.Tensor:
    """Chunk-local inclusive cumsum of log-decay gates (SPEC 1.10.1). Forward-only stage function.

    ``G_t = scale · Σ_{s in chunk(t), s <= t} g_s`` (``reverse=True``: ``s >= t``, computed as a true
    suffix scan, never as "chunk total − prefix"). Chunks of ``chunk_size`` tokens start at every
    sequence start; the last chunk of a sequence may be partial.

    Args:
        g: ``[B, T, HV]`` (scalar gates, GDN) or ``[B, T, HV, K]`` (per-channel gates, KDA);
            fp32/fp16/bf16, any strides. Natural-log units.
        chunk_size: power of two in [1, 256].
        reverse: suffix instead of prefix sums.
        scale: multiplies the sums (``None`` = 1; e.g. ``1/ln 2`` for log2 units).
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``); tail tokens give 0.
        head_first: must be False (``True`` raises ``ValueError``).
        output_dtype: dtype of ``G`` (default fp32; ``None`` = ``g.dtype``).
        chunk_indices: optional precomputed ``[NT, 2]`` table (``prepare_chunk_indices``), trusted.

    Returns:
        ``G`` with ``g``'s shape in ``output_dtype``; accumulation in fp32.

    Raises:
        ValueError: rank not 3/4, bad ``chunk_size``, bad ``cu_seqlens``, ``head_first=True``.
        TypeError: non-float ``g`` (float64 is reference-only) or bad ``output_dtype``.

    Source: chunked gated delta rule (Yang et al., Gated Delta Networks, ICLR 2025).
    """
    for name in kwargs:
        if (OP, name) not in _WARNED:
            _WARNED.add((OP, name))
            warnings.warn(f"{OP}: ignoring unknown keyword argument {name!r}", UserWarning, stacklevel=2)
    cu_host = check_args(g, chunk_size, scale, cu_seqlens, head_first, output_dtype)
    out_dtype = g.dtype if output_dtype is None else output_dtype
    if not use_triton(g.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.chunk_local_cumsum_ref(g, chunk_size, reverse, scale, cu_seqlens, out_dtype)
    return forward(g, chunk_size, reverse, scale, cu_host, cu_seqlens, out_dtype, chunk_indices)


def forward(g: torch.Tensor, chunk_size: int, reverse: bool, scale: Optional[float], cu_host: Optional[list],
            cu_seqlens: Optional[torch.Tensor], out_dtype: torch.dtype,
            chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Triton launch (arguments already validated)."""
    from .triton_kernels import chunk_local_cumsum_kernel

    B, T, HV = g.shape[:3]
    KD = g.shape[3] if g.dim() == 4 else 1
    x = tu.kernel_input(g)
    out = torch.empty(g.shape, dtype=tu.kernel_dtype(out_dtype), device=g.device)
    if cu_host is not None and cu_host[-1] < T:
        out[:, cu_host[-1]:].zero_()  # tail tokens take part in nothing
    BT = chunk_size
    NT, cu, idx = chunk_table(OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, g.device)
    C = HV * KD
    if NT and B and C:
        sx = list(x.stride()) + ([0] if KD == 1 and g.dim() == 3 else [])
        so = list(out.stride()) + ([0] if g.dim() == 3 else [])
        BC = _tiles(BT, C)
        grid = (NT * B, tu.cdiv(C, BC))
        chunk_local_cumsum_kernel[grid](
            x, out, cu if cu is not None else x, idx if idx is not None else x, T, B, C, KD,
            sx[0], sx[1], sx[2], sx[3], so[0], so[1], so[2], so[3], 1.0 if scale is None else float(scale),
            BT=BT, BC=BC, REVERSE=bool(reverse), IS_VARLEN=idx is not None,
            num_warps=8 if BT * BC >= 4096 else 4)
    return tu.finish(out, out_dtype)
