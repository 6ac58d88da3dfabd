"""Input validation shared by every operator, so all of them report bad input the same way.

Rules (SPEC 0.7): wrong shape/rank -> ``ValueError``; unsupported or mismatched dtype -> ``TypeError``;
tensors on different devices or an unsupported device -> ``ValueError``. Every message starts with
the operator name, names the argument and gives expected vs actual, e.g.
``rms_norm: weight must have shape [4096], got [4095]``.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                torch.float64: "float64", torch.int32: "int32", torch.int64: "int64"}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def shape_str(shape: Sequence) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def check_tensor(op: str, name: str, t, *, dtypes: Optional[Iterable[torch.dtype]] = FLOAT_DTYPES,
                 ndim: Optional[int | Sequence[int]] = None, min_ndim: Optional[int] = None,
                 shape: Optional[Sequence[int]] = None, shape_desc: str = "",
                 device: Optional[torch.device] = None) -> None:
    """Check one tensor argument; raise ``TypeError``/``ValueError`` naming ``op`` and ``name``.

    ``shape`` entries may be ``None`` (any size). ``shape_desc`` is a symbolic form (``"[B, T, H]"``)
    shown before the numeric expected shape.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            allowed = "/".join(dtype_name(d) for d in dtypes)
            raise TypeError(f"{op}: {name} must have dtype {allowed}, got {dtype_name(t.dtype)}")
    if ndim is not None:
        allowed_nd = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed_nd:
            want = " or ".join(str(n) for n in allowed_nd)
            raise ValueError(f"{op}: {name} must be {want}-D, got {t.dim()}-D with shape {shape_str(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{op}: {name} must have at least {min_ndim} dims, got shape {shape_str(t.shape)}")
    if shape is not None:
        ok = t.dim() == len(shape) and all(e is None or e == a for e, a in zip(shape, t.shape))
        if not ok:
            want = shape_str(["*" if s is None else s for s in shape])
            prefix = f"{shape_desc} = " if shape_desc else ""
            raise ValueError(f"{op}: {name} must have shape {prefix}{want}, got {shape_str(t.shape)}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{op}: {name} must be on {device} (like the other inputs), got {t.device}")


def check_same_device(op: str, **tensors) -> torch.device:
    """All non-None tensors on one device; returns it."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    dev = items[0][1].device
    for n, t in items[1:]:
        if t.device != dev:
            raise ValueError(f"{op}: {n} is on {t.device} but {items[0][0]} is on {dev}; "
                             "all tensors must be on one device")
    return dev


def check_same_dtype(op: str, **tensors) -> None:
    items = [(n, t) for n, t in tensors.items() if t is not None]
    for n, t in items[1:]:
        if t.dtype != items[0][1].dtype:
            raise TypeError(f"{op}: {n} must have the dtype of {items[0][0]} "
                            f"({dtype_name(items[0][1].dtype)}), got {dtype_name(t.dtype)}")


def check_positive(op: str, name: str, value, *, allow_zero: bool = False) -> None:
    if value is None or (value < 0 if allow_zero else value <= 0):
        rel = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{op}: {name} must be {rel}, got {value}")


def check_choice(op: str, name: str, value, choices: Iterable) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{op}: {name} must be one of {choices}, got {value!r}")


def check_cu_seqlens_device(op: str, cu_seqlens: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    """Offsets live on ``like``'s device or on the host (a host copy is read as it is)."""
    if cu_seqlens.device != like.device and cu_seqlens.device.type != "cpu":
        raise ValueError(f"{op}: cu_seqlens is on {cu_seqlens.device} but {like_name} is on {like.device}")


def check_cu_seqlens(op: str, cu_seqlens: Optional[torch.Tensor], *, batch: int, total: int,
                     name: str = "cu_seqlens", like: Optional[tuple[str, torch.Tensor]] = None) -> Optional[list[int]]:
    """Validate packed-sequence offsets (SPEC 0.3) and return them as a host list (one sync, allowed).
    ``name``: the argument named in errors (``cu_seqlens_cpu`` when the host copy is checked); ``like``:
    ``(name, tensor)`` whose device the offsets must share unless they are on the host."""
    if cu_seqlens is None:
        return None
    check_tensor(op, name, cu_seqlens, dtypes=INDEX_DTYPES, ndim=1)
    if like is not None:
        check_cu_seqlens_device(op, cu_seqlens, *like)
    if batch != 1:
        raise ValueError(f"{op}: with {name} the batch size must be 1 (pack the batch into one row), got {batch}")
    if cu_seqlens.numel() < 1:
        raise ValueError(f"{op}: {name} must have at least 1 entry, got shape {shape_str(cu_seqlens.shape)}")
    host = cu_seqlens.tolist()
    if host[0] != 0:
        raise ValueError(f"{op}: {name}[0] must be 0, got {host[0]}")
    if any(b < a for a, b in zip(host, host[1:])):
        raise ValueError(f"{op}: {name} must be non-decreasing, got {host[:16]}{'...' if len(host) > 16 else ''}")
    if host[-1] > total:
        raise ValueError(f"{op}: {name}[-1] must be <= T = {total}, got {host[-1]}")
    return host


def reject_float64(op: str, **tensors) -> None:
    """The public API takes fp32/fp16/bf16; float64 is for the references only (SPEC 0.5)."""
    for n, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
            raise TypeError(f"{op}: {n} must have dtype float32/float16/bfloat16, got float64 "
                            "(float64 is accepted by the reference implementations only)")
