"""Argument checks and keyword policy of the KDA family (SPEC 1.11), on top of the GDN family's
(``ops/gdn/args.py``: the same shape/dtype/varlen rules with per-channel gates)."""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from ...validation import check_cu_seqlens, check_same_device, check_tensor, reject_float64, shape_str
from ..gdn import args as _gdn_args
from ..gdn.common import check_value_heads

CHUNK_SIZES = (32, 64)
MAX_K = _gdn_args.MAX_K
#: SPEC 1.11.1 / 1.11.3: accepted for compatibility, no effect on the result (the kernels are exact
#: for all gates and always recompute what the backward needs)
NO_EFFECT_KWARGS = ("safe_gate", "lower_bound", "disable_recompute", "use_graph")
_WARNED: set = set()


def check_chunk_size(op: str, chunk_size) -> int:
    """``chunk_size`` as an int, one of :data:`CHUNK_SIZES` (``TypeError`` for a bool, str or float)."""
    return _gdn_args.check_chunk_size(op, chunk_size, CHUNK_SIZES)


check_scale = _gdn_args.check_scale


def kwargs_policy(op: str, kwargs: dict) -> dict:
    """SPEC 1.11.3 keyword policy: that of ``chunk_gated_delta_rule`` (1.10.10) plus ``safe_gate``,
    ``lower_bound``, ``disable_recompute`` accepted with no effect. Returns the accepted hints."""
    rest = {n: v for n, v in kwargs.items() if n not in NO_EFFECT_KWARGS}
    return _gdn_args.kwargs_policy(op, rest)


def stage_kwargs(op: str, kwargs: dict) -> None:
    """Stage functions: the no-effect keywords pass silently, anything else warns once."""
    for name in kwargs:
        if name not in NO_EFFECT_KWARGS and (op, name) not in _WARNED:
            _WARNED.add((op, name))
            warnings.warn(f"{op}: ignoring unknown keyword argument {name!r}", UserWarning, stacklevel=3)


def check_args(op: str, q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_size,
               cu_seqlens_cpu=None) -> tuple[int, int]:
    """Full operator (SPEC 1.11.3): the GDN checks with per-channel ``g [B, T, HV, K]``, ``chunk_size``
    in {32, 64} and an fp32-only ``initial_state``. No device reads (runs on fake tensors). ``(N, HV)``."""
    check_chunk_size(op, chunk_size)
    if g is None:  # the op's schema has a tensor g; chunk_kda itself passes zeros for g=None
        raise ValueError(f"{op}: g must be a [B, T, HV, K] tensor here (chunk_kda accepts g=None as no decay)")
    if isinstance(initial_state, torch.Tensor) and initial_state.dtype != torch.float32:
        raise TypeError(f"{op}: initial_state must have dtype float32 (the state is fp32), got "
                        f"{str(initial_state.dtype).replace('torch.', '')}")
    return _gdn_args.check_args(op, q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_size,
                                per_channel_gate=True, cu_seqlens_cpu=cu_seqlens_cpu)


def check_qkv_gk(op: str, q, k, v, gk, beta, scale, chunk_size, cu_seqlens, **others) -> Optional[list]:
    """Stage functions: ``q, k [B,T,H,K]``, ``v [B,T,HV,V]``, ``gk [B,T,HV,K]``, ``beta [B,T,HV]`` (each
    optional except ``k``), ``K <= 256``, ``HV % H == 0``, chunk size, scale; ``others`` are only
    checked for device and float64. Returns the host copy of ``cu_seqlens`` (or None)."""
    reject_float64(op, q=q, k=k, v=v, gk=gk, beta=beta, **others)
    check_tensor(op, "k", k, ndim=4)
    B, T, H, K = k.shape
    if q is not None:
        check_tensor(op, "q", q, shape=(B, T, H, K), shape_desc="[B, T, H, K]")
    if K > MAX_K:
        raise ValueError(f"{op}: the head dim K must be <= {MAX_K}, got k of shape {shape_str(k.shape)}")
    src = next(((n, t) for n, t in (("v", v), ("gk", gk)) if t is not None), None)
    if src is not None:
        check_tensor(op, src[0], src[1], ndim=4)
    HV = H if src is None else src[1].shape[2]
    check_value_heads(op, HV, H, f"{src[0] if src else 'k'}.shape[2]", "k.shape[2]")
    if v is not None:
        check_tensor(op, "v", v, shape=(B, T, HV, None), shape_desc="[B, T, HV, V]")
    if gk is not None:
        check_tensor(op, "gk", gk, shape=(B, T, HV, K), shape_desc="[B, T, HV, K]")
    if beta is not None:
        check_tensor(op, "beta", beta, shape=(B, T, HV), shape_desc="[B, T, HV]")
    check_chunk_size(op, chunk_size)
    check_scale(op, scale)
    check_same_device(op, q=q, k=k, v=v, gk=gk, beta=beta, **others)
    return check_cu_seqlens(op, cu_seqlens, batch=B, total=T, like=("k", k))


def num_chunks(T: int, BT: int, cu_host: Optional[list]) -> int:
    if cu_host is None:
        return -(-T // BT)
    return sum(-(-(b - a) // BT) for a, b in zip(cu_host, cu_host[1:]))
