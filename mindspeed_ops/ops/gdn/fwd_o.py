"""``chunk_fwd_o`` (SPEC 1.10.7): checks and launch of the chunked output (inter-chunk + intra-chunk)."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_cu_seqlens, check_same_device, check_tensor, reject_float64, shape_str
from ..common import unit_last_stride
from . import reference_fwd as _ref
from .common import check_value_heads, chunk_table, prune_v_tiles, row_factor_pair_args, use_triton
from .fwd_h import kernel_view

OP = "chunk_fwd_o"
MAX_K = 256


def check_args(q, k, v, h, g, scale, chunk_size, cu_seqlens) -> tuple[Optional[list], int]:
    """Validate the arguments; returns ``(host copy of cu_seqlens or None, NT)``."""
    reject_float64(OP, q=q, k=k, v=v, h=h, g=g)
    check_tensor(OP, "q", q, ndim=4)
    B, T, H, K = q.shape
    check_tensor(OP, "k", k, shape=(B, T, H, K), shape_desc="[B, T, H, K]")
    check_tensor(OP, "v", v, ndim=4)
    check_tensor(OP, "v", v, shape=(B, T, None, None), shape_desc="[B, T, HV, V]")
    HV, V = v.shape[2], v.shape[3]
    check_value_heads(OP, HV, H, "v.shape[2]", "q.shape[2]")
    if K > MAX_K:
        raise ValueError(f"{OP}: the head dim K must be <= {MAX_K}, got q of shape {shape_str(q.shape)}")
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"{OP}: chunk_size must be 16, 32 or 64, got {chunk_size!r}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"{OP}: scale must be a finite number or None, got {scale!r}")
    if g is not None:
        check_tensor(OP, "g", g, shape=(B, T, HV), shape_desc="[B, T, HV]")
    check_same_device(OP, q=q, k=k, v=v, h=h, g=g)
    cu_host = check_cu_seqlens(OP, cu_seqlens, batch=B, total=T, like=("q", q))
    NT = tu.cdiv(T, chunk_size) if cu_host is None else \
        sum(tu.cdiv(b - a, chunk_size) for a, b in zip(cu_host, cu_host[1:]))
    check_tensor(OP, "h", h, shape=(B, NT, HV, K, V), shape_desc="[B, NT, HV, K, V]")
    return cu_host, NT


def chunk_fwd_o(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, h: torch.Tensor, g: Optional[torch.Tensor] = None,
                scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Output of the chunked gated delta rule (SPEC 1.10.7, step 6 of the 1.10.0 table). Forward-only
    stage function.

    ``o_i = scale·e^{G_i} S_cᵀ q_i + scale·Σ_{j ≤ i, same chunk} (q_i·k_j) e^{G_i − G_j} v_j``.

    Args:
        q, k: ``[B, T, H, K]``, ``K <= 256``; fp32/fp16/bf16.
        v: ``v_new [B, T, HV, V]`` from ``chunk_gated_delta_rule_fwd_h``; ``HV % H == 0`` (GVA).
        h: ``[B, NT, HV, K, V]`` states entering each chunk (varlen: flattened chunk list).
        g: ``[B, T, HV]`` chunk-local cumsum ``G`` (natural log), or None (no decay).
        scale: None means ``K ** -0.5``.
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``); tail outputs are 0.
        chunk_size: ``BT ∈ {16, 32, 64}``.
        chunk_indices: optional precomputed ``[NT, 2]`` table (``prepare_chunk_indices``), trusted.

    Returns:
        ``o [B, T, HV, V]`` in ``v.dtype`` (fp32 accumulation, one rounding).

    Raises:
        ValueError: ranks/shapes (``h`` must match ``NT`` of ``chunk_size`` and ``cu_seqlens``),
            ``HV % H != 0``, ``K > 256``, ``chunk_size``, ``scale``, ``cu_seqlens``, devices.
        TypeError: non-float tensors (float64 is reference-only).
    """
    cu_host, NT = check_args(q, k, v, h, g, scale, chunk_size, cu_seqlens)
    if not use_triton(q.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.chunk_fwd_o_ref(q, k, v, h, g, scale, cu_seqlens, chunk_size)
    return forward(q, k, v, h, g, scale, cu_host, cu_seqlens, chunk_size, chunk_indices)


_prune = prune_v_tiles


def _configs():
    import triton

    return [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)
            for bv, nw, ns in ((128, 8, 2), (64, 4, 2), (128, 4, 3), (64, 4, 3))]


_KERNEL = None


def _kernel():
    """The fwd_o kernel under a small autotuner over the V tile (64/128) and warps/stages."""
    global _KERNEL
    if _KERNEL is None:
        from .triton_fwd import chunk_fwd_o_kernel

        _KERNEL = tu.autotune(_configs(), key=["HV", "GQ", "K", "V", "BT", "USE_G", "IS_VARLEN", "HAS_R"],
                              prune_configs_by={"early_config_prune": _prune})(chunk_fwd_o_kernel)
    return _KERNEL


def forward(q, k, v, h, g, scale, cu_host, cu_seqlens, chunk_size, chunk_indices=None, rq=None, rk=None):
    """Triton launch (arguments already validated). ``rq``, ``rk`` (both or neither, ``[B, T, H]`` fp32, one
    layout): q and k are raw and the products use their l2norm ``rstd·q``, ``rstd·k``."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    NT, cu, idx = chunk_table(OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, v.device)
    qq, kk, vv, gg = (kernel_view(t, BT) for t in (q, k, v, g))
    hh = unit_last_stride(tu.kernel_input(h))
    o = torch.empty(B, T, HV, V, dtype=tu.kernel_dtype(v.dtype), device=v.device)
    if cu_host is not None and cu_host[-1] < T:
        o[:, cu_host[-1]:].zero_()  # tail tokens
    if NT and B and HV and V:
        BK = max(16, min(64, tu.next_power_of_2(K)))
        dummy = qq
        grid = lambda meta: (NT * B * HV * tu.cdiv(V, meta["BV"]),)  # noqa: E731
        rq_ptr, rk_ptr, *sr = row_factor_pair_args(OP, rq, rk, dummy)
        _kernel()[grid](
            qq, kk, vv, hh, dummy if gg is None else gg, o, dummy if cu is None else cu,
            dummy if idx is None else idx, rq_ptr, rk_ptr, T, B, HV, HV // H, K, V,
            float(K ** -0.5 if scale is None else scale),
            *qq.stride()[:3], *kk.stride()[:3], *vv.stride()[:3], *hh.stride()[:4],
            *(gg.stride() if gg is not None else (0, 0, 0)), *o.stride()[:3], *sr,
            BT=BT, BK=BK, USE_G=g is not None, IS_VARLEN=idx is not None, HAS_R=rq is not None)
    return tu.finish(o, v.dtype)
