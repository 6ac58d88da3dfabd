"""Host launchers for ``inplace_rope`` (SPEC 1.5): argument checks, tiling, grids.

One kernel (:func:`~.triton_kernels.rope_rotate_kernel`) rotates the rope slice of a tensor from a
source into a destination view: forward (in place, ``src is dst``), ``inverse=True`` (−θ), the in-place
backward (the forward kernel by the opposite angle on the gradient buffer) and the out-of-place backward.
No autotuning: the kernel is in place (DESIGN 8), so tile sizes are fixed by the shape.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import (FLOAT_DTYPES, INDEX_DTYPES, check_same_device, check_tensor, reject_float64,
                           shape_str)
from . import reference as _ref

OP = "inplace_rope"
#: dtypes accepted for ``cos``/``sin`` ("any float", used as fp32)
TABLE_DTYPES = FLOAT_DTYPES + (torch.float64,)
#: elements (tokens × heads × rope channels) per program; 16 KiB of bf16
_TILE = 8192


def check_args(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]) -> int:
    """Validate the arguments (also on fake tensors under torch.compile); returns ``R = rope_dim``.

    Raises ``TypeError`` (dtypes), ``ValueError`` (ranks, shapes, devices, ``R > D``, an ``x`` whose
    elements overlap in memory) and ``IndexError`` (``position_ids=None`` with ``T > T_max``). Position
    values are not read here (no device sync).
    """
    reject_float64(OP, x=x)
    check_tensor(OP, "x", x, ndim=(3, 4))
    check_tensor(OP, "cos", cos, dtypes=TABLE_DTYPES, ndim=2)
    check_tensor(OP, "sin", sin, dtypes=TABLE_DTYPES, ndim=2)
    if sin.shape != cos.shape:
        raise ValueError(f"{OP}: sin must have the shape of cos {shape_str(cos.shape)}, got {shape_str(sin.shape)}")
    R, D = 2 * cos.shape[1], x.shape[-1]
    if R == 0:
        raise ValueError(f"{OP}: cos must have shape [T_max, R/2] with R/2 >= 1, got {shape_str(cos.shape)}")
    if R > D:
        raise ValueError(f"{OP}: rope_dim R = 2*cos.shape[-1] = {R} must be <= the head dim D = {D} "
                         f"of x {shape_str(x.shape)}")
    T = x.shape[-3]
    if position_ids is None:
        if T > cos.shape[0]:
            raise IndexError(f"{OP}: without position_ids the positions are 0..T-1 with T = {T}, outside "
                             f"[0, T_max) = [0, {cos.shape[0]}); pass position_ids or a longer cos/sin")
    else:
        check_tensor(OP, "position_ids", position_ids, dtypes=INDEX_DTYPES, ndim=(1, 2) if x.dim() == 4 else 1)
        if position_ids.dim() == 2:
            check_tensor(OP, "position_ids", position_ids, dtypes=None, shape=(x.shape[0], T), shape_desc="[B, T]")
        else:
            check_tensor(OP, "position_ids", position_ids, dtypes=None, shape=(T,), shape_desc="[T]")
    check_same_device(OP, x=x, cos=cos, sin=sin, position_ids=position_ids)
    if any(st == 0 and n > 1 for st, n in zip(x.stride(), x.shape)):
        raise ValueError(f"{OP}: x is written in place and must not have overlapping elements (stride 0), "
                         f"got shape {shape_str(x.shape)} with strides {list(x.stride())}")
    return R


def non_overlapping(t: torch.Tensor) -> bool:
    """True when ``t``'s elements provably occupy distinct memory (dims sorted by stride, each stride
    past the span of the smaller ones). False for stride-0 (expanded) tensors and exotic layouts."""
    extent = 1
    for st, n in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if st < extent:
            return False
        extent += (n - 1) * st
    return True


def _tiles(n_tok: int, H: int, R: int) -> tuple[int, int, int, int]:
    br = tu.next_power_of_2(R)
    bh = min(tu.next_power_of_2(H), max(1, 4096 // br))
    bt = max(1, min(tu.next_power_of_2(n_tok), _TILE // (bh * br)))
    return bt, bh, br, 4 if bt * bh * br <= 4096 else 8


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 4 else t.unsqueeze(0)


def _rotate(src: torch.Tensor, dst: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            position_ids: Optional[torch.Tensor], inverse: bool) -> None:
    """Launch the kernel on rope slices ``src``/``dst`` (``[B, T, H, R]`` views, any strides)."""
    from .triton_kernels import rope_rotate_kernel

    B, T, H, R = src.shape
    n_tok = B * T
    if n_tok == 0 or H == 0:
        return
    cos, sin = tu.kernel_input(cos), tu.kernel_input(sin)
    if position_ids is None:
        pos, pos_b, pos_t = cos, 0, 0  # any pointer: never read
    elif position_ids.dim() == 1:
        pos, pos_b, pos_t = position_ids, 0, position_ids.stride(0)
    else:
        pos, (pos_b, pos_t) = position_ids, position_ids.stride()
    bt, bh, br, warps = _tiles(n_tok, H, R)
    grid = (tu.cdiv(n_tok, bt), tu.cdiv(H, bh))
    rope_rotate_kernel[grid](src, dst, cos, sin, pos, n_tok, T, H, *src.stride(), *dst.stride(), *cos.stride(),
                             *sin.stride(), pos_b, pos_t, R=R, INVERSE=bool(inverse),
                             HAS_POS=position_ids is not None, BT=bt, BH=bh, BR=br, num_warps=warps)


def _check_positions_on_host(x: torch.Tensor, cos: torch.Tensor, position_ids: Optional[torch.Tensor]) -> None:
    # CPU tensors (the interpreter) are checked: an out-of-range position would read outside cos/sin
    # there. Device tensors are not (SPEC 1.5: a precondition; no device->host sync).
    if position_ids is not None and position_ids.device.type == "cpu":
        _ref.positions(x, cos, position_ids)


def forward(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
            inverse: bool = False) -> None:
    """Rotate ``x[..., D-R:]`` in place by +θ (``-θ`` if ``inverse``). Arguments as checked by
    :func:`check_args`. Writes only the rope channels of ``x``'s view."""
    _check_positions_on_host(x, cos, position_ids)
    D, R = x.shape[-1], 2 * cos.shape[-1]
    rope = _as_4d(x[..., D - R:])
    if rope.numel() == 0:
        return
    kdt = tu.kernel_dtype(x.dtype)
    if kdt != x.dtype or not non_overlapping(rope):
        # interpreter bf16 shim (rotate an fp32 working copy, round once on copy_ back), or a layout whose
        # elements might alias: rotate a dense copy, then write back
        work = torch.empty(rope.shape, dtype=kdt, device=x.device)
        work.copy_(rope)
        _rotate(work, work, cos, sin, position_ids, inverse)
        rope.copy_(work)
    else:
        _rotate(rope, rope, cos, sin, position_ids, inverse)


def backward(dy: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
             inverse: bool = False) -> torch.Tensor:
    """Out-of-place gradient of the forward with flag ``inverse``: a new contiguous tensor holding ``dy``
    with its rope channels rotated by the opposite angle and its nope channels copied. ``dy`` (any
    strides, stride 0 included) is not written."""
    _check_positions_on_host(dy, cos, position_ids)
    D, R = dy.shape[-1], 2 * cos.shape[-1]
    src = tu.kernel_input(dy)
    dx = torch.empty(dy.shape, dtype=tu.kernel_dtype(dy.dtype), device=dy.device)
    if dy.numel():
        if D > R:
            dx[..., : D - R].copy_(src[..., : D - R])
        _rotate(_as_4d(src[..., D - R:]), _as_4d(dx[..., D - R:]), cos, sin, position_ids, not inverse)
    return tu.finish(dx, dy.dtype)
