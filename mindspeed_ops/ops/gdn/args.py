"""Argument checks and the keyword policy shared by the full GDN operators (SPEC 1.10.10, 1.10.11)
and the KDA operator (SPEC 1.11.3, per-channel gates)."""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Optional

import torch

from ...validation import (FLOAT_DTYPES, check_cu_seqlens, check_cu_seqlens_device, check_same_device, check_same_dtype, check_tensor,
                           reject_float64, shape_str)
from .common import check_value_heads

MAX_K = 256
CHUNK_SIZES = (16, 32, 64)

#: keyword policy of SPEC 1.10.10 (0.7): performance hints accepted silently, math-changing options
#: that are not implemented raise when set
HINT_KWARGS = ("cu_seqlens_cpu", "chunk_indices", "use_graph", "max_num_seqs")
UNSUPPORTED_KWARGS = ("use_gate_in_kernel", "A_log", "dt_bias", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
                      "state_v_first", "transpose_state_layout", "cp_context", "return_intermediate_states")
_WARNED: set = set()


def kwargs_policy(op: str, kwargs: dict) -> dict:
    """Apply the keyword policy; returns the accepted hints (``cu_seqlens_cpu``, ``chunk_indices``, ...)."""
    if kwargs.get("head_first", False):
        raise ValueError(f"{op}: head_first=True is not supported (layouts are token-major [B, T, H, D])")
    for name, value in kwargs.items():
        if name == "head_first" or name in HINT_KWARGS:
            continue
        if name in UNSUPPORTED_KWARGS:
            if value is not None and value is not False:
                raise NotImplementedError(f"{op}: {name}={value!r} is not implemented (only the default is)")
            continue
        if (op, name) not in _WARNED:
            _WARNED.add((op, name))
            warnings.warn(f"{op}: ignoring unknown keyword argument {name!r}", UserWarning, stacklevel=3)
    return {k: kwargs[k] for k in HINT_KWARGS if kwargs.get(k) is not None}


def cu_seqlens_hint(op: str, cu_seqlens, hints: dict) -> tuple:
    """``(cu_seqlens, cu_seqlens_cpu)`` for the op from the accepted hints: the hint must be a tensor;
    given alone it also serves as ``cu_seqlens`` (it is a valid offsets tensor by itself)."""
    cu_cpu = hints.get("cu_seqlens_cpu")
    if cu_cpu is not None and not isinstance(cu_cpu, torch.Tensor):
        raise TypeError(f"{op}: cu_seqlens_cpu must be a torch.Tensor (the host copy of cu_seqlens), got "
                        f"{type(cu_cpu).__name__}")
    return (cu_cpu if cu_seqlens is None else cu_seqlens), cu_cpu


def check_args(op: str, q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_size: Optional[int] = None,
               per_channel_gate: bool = False, cu_seqlens_cpu=None) -> tuple[int, int]:
    """Validate without reading device values (also runs on fake tensors); returns ``(N, HV)``.
    ``per_channel_gate``: ``g`` is ``[B, T, HV, K]`` (KDA) instead of ``[B, T, HV]``;
    ``cu_seqlens_cpu``: its metadata is checked (:func:`check_cu_seqlens_cpu`)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state)):
        if t is not None:
            check_tensor(op, name, t, dtypes=FLOAT_DTYPES + (torch.float64,))
    reject_float64(op, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    check_tensor(op, "q", q, ndim=4)
    B, T, H, K = q.shape
    check_tensor(op, "k", k, shape=(B, T, H, K), shape_desc="[B, T, H, K]")
    check_tensor(op, "v", v, ndim=4)
    check_tensor(op, "v", v, shape=(B, T, None, None), shape_desc="[B, T, HV, V]")
    check_same_dtype(op, q=q, k=k, v=v)
    HV, V = v.shape[2], v.shape[3]
    check_value_heads(op, HV, H, "v.shape[2]", "q.shape[2]")
    if K > MAX_K:
        raise ValueError(f"{op}: the head dim K must be <= {MAX_K}, got q of shape {shape_str(q.shape)}")
    check_tensor(op, "beta", beta, shape=(B, T, HV), shape_desc="[B, T, HV]")
    if g is not None:
        if per_channel_gate:
            check_tensor(op, "g", g, shape=(B, T, HV, K), shape_desc="[B, T, HV, K]")
        else:
            check_tensor(op, "g", g, shape=(B, T, HV), shape_desc="[B, T, HV]")
    check_scale(op, scale)
    if chunk_size is not None:
        check_chunk_size(op, chunk_size, CHUNK_SIZES)
    if cu_seqlens is not None:
        check_tensor(op, "cu_seqlens", cu_seqlens, dtypes=(torch.int32, torch.int64), ndim=1)
        if B != 1:
            raise ValueError(f"{op}: with cu_seqlens the batch size must be 1 (pack the batch into one row), got {B}")
        if cu_seqlens.shape[0] < 2:  # N + 1 offsets of N >= 1 sequences
            raise ValueError(f"{op}: cu_seqlens must have at least 2 entries (N + 1 offsets, N >= 1), got shape "
                             f"{shape_str(cu_seqlens.shape)}")
        check_cu_seqlens_device(op, cu_seqlens, "q", q)
    check_cu_seqlens_cpu(op, cu_seqlens, cu_seqlens_cpu)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if initial_state is not None:
        check_tensor(op, "initial_state", initial_state, shape=(N, HV, K, V), shape_desc="[N, HV, K, V]")
    check_same_device(op, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    return N, HV


def check_scale(op: str, scale) -> None:
    """``scale``: None or a finite real number (Python or NumPy; not a bool; symbolic under torch.compile)."""
    if scale is None or isinstance(scale, (torch.SymFloat, torch.SymInt)):  # traced: its value is not ours to read
        return
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{op}: scale must be a real number or None, got {scale!r} ({type(scale).__name__})")
    if not math.isfinite(scale):
        raise ValueError(f"{op}: scale must be a finite number or None, got {scale!r}")


def check_chunk_size(op: str, chunk_size, allowed: tuple) -> int:
    """``chunk_size`` as an int: an integer (Python or NumPy, or a SymInt under torch.compile; not a bool, str or
    float) in ``allowed``."""
    if isinstance(chunk_size, torch.SymInt):
        if chunk_size not in allowed:  # as before this check existed: a guard on the traced value
            raise ValueError(f"{op}: chunk_size must be one of {allowed}, got {chunk_size!r}")
        return chunk_size
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral):
        raise TypeError(f"{op}: chunk_size must be an int (one of {allowed}), got {chunk_size!r} "
                        f"({type(chunk_size).__name__})")
    if chunk_size not in allowed:
        raise ValueError(f"{op}: chunk_size must be one of {allowed}, got {chunk_size!r}")
    return int(chunk_size)


def default_scale(op: str, q, scale):
    """``scale`` as the ops pass it on: ``K ** -0.5`` for None (SPEC 1.10.10), a number as a float. Raises
    ``ValueError`` for None with ``K = 0`` (no default exists; it was a ZeroDivisionError)."""
    K = q.shape[-1] if q.dim() == 4 else 1
    if scale is None:
        if K == 0:
            raise ValueError(f"{op}: q has head dim K = 0 (shape {shape_str(q.shape)}): the default scale K ** -0.5 "
                             "is undefined; pass scale")
        return float(K ** -0.5)
    check_scale(op, scale)
    return scale if isinstance(scale, (torch.SymFloat, torch.SymInt)) else float(scale)


def check_cu_seqlens_cpu(op: str, cu_seqlens, cu_seqlens_cpu) -> None:
    """Metadata of the ``cu_seqlens_cpu`` hint, no value read (runs on fake tensors too): a 1-D
    int32/int64 tensor on the CPU (a device tensor would need the very sync the hint avoids) with as
    many entries as ``cu_seqlens``, which must be given."""
    if cu_seqlens_cpu is None:
        return
    check_tensor(op, "cu_seqlens_cpu", cu_seqlens_cpu, dtypes=(torch.int32, torch.int64), ndim=1)
    if cu_seqlens_cpu.device.type != "cpu":
        raise ValueError(f"{op}: cu_seqlens_cpu must be a CPU tensor (the host copy of cu_seqlens), got one on "
                         f"{cu_seqlens_cpu.device}")
    if cu_seqlens is None:
        raise ValueError(f"{op}: cu_seqlens_cpu is given without cu_seqlens (it is the host copy of cu_seqlens)")
    if cu_seqlens_cpu.shape[0] != cu_seqlens.shape[0]:
        raise ValueError(f"{op}: cu_seqlens_cpu must have the shape of cu_seqlens {shape_str(cu_seqlens.shape)}, "
                         f"got {shape_str(cu_seqlens_cpu.shape)}")


def check_qk_rstd(op: str, q, k, q_rstd, k_rstd, use_qk_l2norm_in_kernel: bool) -> None:
    """The backward op's ``q_rstd``/``k_rstd`` (metadata only, fake tensors too): both or neither, only with the
    in-kernel l2norm, each fp32 ``q.shape[:-1]`` (``k.shape[:-1]``) on q's (k's) device."""
    if q_rstd is None and k_rstd is None:
        return
    if q_rstd is None or k_rstd is None:
        raise ValueError(f"{op}: q_rstd and k_rstd must be given together (the forward returns both), got only "
                         f"{'q_rstd' if k_rstd is None else 'k_rstd'}")
    if not use_qk_l2norm_in_kernel:
        raise ValueError(f"{op}: q_rstd/k_rstd are the in-kernel l2norm's; they were given with "
                         "use_qk_l2norm_in_kernel=False")
    for name, r, x in (("q_rstd", q_rstd, q), ("k_rstd", k_rstd, k)):
        check_tensor(op, name, r, dtypes=(torch.float32,), shape=tuple(x.shape[:-1]),
                     shape_desc=f"{name[0]}.shape[:-1]", device=x.device)


def host_cu(op: str, q, cu_seqlens, cu_seqlens_cpu=None) -> Optional[list]:
    """Host copy of the offsets, validated (SPEC 0.3).

    Without ``cu_seqlens_cpu``: one device->host read of ``cu_seqlens`` (a sync). With it, ``cu_seqlens``
    is not read at all: the hint's metadata is checked against ``cu_seqlens``' (dtype, 1-D, CPU, same
    length), its values are validated (``[0] == 0``, non-decreasing, ``[-1] <= T``) and used. That they
    equal ``cu_seqlens``' values is trusted for a device ``cu_seqlens`` (checking would need the read the hint
    avoids) and checked for a CPU one (free: a mismatch would silently win)."""
    check_cu_seqlens_cpu(op, cu_seqlens, cu_seqlens_cpu)
    if cu_seqlens is None:
        return None
    if cu_seqlens_cpu is None:
        return check_cu_seqlens(op, cu_seqlens, batch=q.shape[0], total=q.shape[1])
    cu_host = check_cu_seqlens(op, cu_seqlens_cpu, batch=q.shape[0], total=q.shape[1], name="cu_seqlens_cpu")
    if cu_seqlens.device.type == "cpu" and not torch.equal(cu_seqlens.long(), cu_seqlens_cpu.long()):
        raise ValueError(f"{op}: cu_seqlens_cpu {cu_host} must hold the values of cu_seqlens (it is their host copy); "
                         "they differ")
    return cu_host
