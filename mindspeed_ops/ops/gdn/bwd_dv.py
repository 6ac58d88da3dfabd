"""``chunk_bwd_dv_local`` (SPEC 1.10.8): checks and launch of the intra-chunk value gradient."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_cu_seqlens, check_same_device, check_tensor, reject_float64, shape_str
from ..common import unit_last_stride
from . import reference_bwd as _ref
from .common import check_value_heads, chunk_table, prune_v_tiles, use_triton

OP = "chunk_bwd_dv_local"
MAX_K = 256


def check_qk_do(op: str, q, k, do, g, scale, chunk_size, cu_seqlens) -> Optional[list]:
    """Checks shared by the backward stages that take ``q, k [B,T,H,K]``, ``do [B,T,HV,V]`` and scalar
    ``G [B,T,HV]``; returns the host copy of ``cu_seqlens`` (or None)."""
    check_tensor(op, "q", q, ndim=4)
    B, T, H, K = q.shape
    check_tensor(op, "k", k, shape=(B, T, H, K), shape_desc="[B, T, H, K]")
    check_tensor(op, "do", do, ndim=4)
    check_tensor(op, "do", do, shape=(B, T, None, None), shape_desc="[B, T, HV, V]")
    HV = do.shape[2]
    check_value_heads(op, HV, H, "do.shape[2]", "q.shape[2]")
    if K > MAX_K:
        raise ValueError(f"{op}: the head dim K must be <= {MAX_K}, got q of shape {shape_str(q.shape)}")
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"{op}: chunk_size must be 16, 32 or 64, got {chunk_size!r}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"{op}: scale must be a finite number or None, got {scale!r}")
    if g is not None:
        check_tensor(op, "g", g, shape=(B, T, HV), shape_desc="[B, T, HV]")
    return check_cu_seqlens(op, cu_seqlens, batch=B, total=T, like=("q", q))


def check_args(q, k, do, g, scale, chunk_size, cu_seqlens) -> Optional[list]:
    """Validate the arguments; returns the host copy of ``cu_seqlens`` (or None)."""
    reject_float64(OP, q=q, k=k, do=do, g=g)
    cu_host = check_qk_do(OP, q, k, do, g, scale, chunk_size, cu_seqlens)
    check_same_device(OP, q=q, k=k, do=do, g=g)
    return cu_host


def chunk_bwd_dv_local(q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, g: Optional[torch.Tensor] = None,
                       scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None,
                       chunk_size: int = 64, chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Intra-chunk gradient of the chunked gated delta rule's output w.r.t. ``v_new`` (SPEC 1.10.8,
    step 1 of the backward pipeline of 1.10.0). Forward-only stage function (no autograd).

    ``dv_j = scale·Σ_{i ≥ j, same chunk} (q_i·k_j) e^{G_i − G_j} do_i``.

    Args:
        q, k: ``[B, T, H, K]``, ``K <= 256``; fp32/fp16/bf16, any strides.
        do: ``[B, T, HV, V]`` gradient of ``o``; ``HV % H == 0`` (GVA: value head i reads q/k head
            ``i // (HV // H)``).
        g: ``[B, T, HV]`` chunk-local cumsum ``G`` of the log-decays (natural log, any float), or None
            (no decay; equals zeros).
        scale: None means ``K ** -0.5``.
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``); tail outputs are 0.
        chunk_size: ``BT ∈ {16, 32, 64}``.
        chunk_indices: optional precomputed ``[NT, 2]`` table (``prepare_chunk_indices``), trusted.

    Returns:
        ``dv [B, T, HV, V]`` in ``do.dtype`` (fp32 accumulation, one rounding).

    Raises:
        ValueError: ranks/shapes, ``HV % H != 0``, ``K > 256``, ``chunk_size``, ``scale``,
            ``cu_seqlens`` (``B != 1``, malformed), ``chunk_indices`` shape, devices.
        TypeError: non-float tensors (float64 is reference-only).

    Source: Yang et al., Gated Delta Networks (ICLR 2025), chunked backward.
    """
    cu_host = check_args(q, k, do, g, scale, chunk_size, cu_seqlens)
    if chunk_indices is not None:
        chunk_table(OP, cu_host, cu_seqlens, q.shape[0], q.shape[1], chunk_size, chunk_indices)
    if not use_triton(q.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.chunk_bwd_dv_local_ref(q, k, do, g, scale, cu_seqlens, chunk_size)
    return forward(q, k, do, g, scale, cu_host, cu_seqlens, chunk_size, chunk_indices)


def _configs():
    import triton

    return [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)
            for bv, nw, ns in ((64, 4, 2), (128, 8, 2), (128, 4, 3), (64, 4, 3))]


_prune = prune_v_tiles


_KERNEL = None


def _kernel():
    """The dv_local kernel under a small autotuner over the V tile (64/128) and warps/stages."""
    global _KERNEL
    if _KERNEL is None:
        from .triton_bwd import chunk_bwd_dv_local_kernel

        _KERNEL = tu.autotune(_configs(), key=["HV", "GQ", "K", "V", "BT", "USE_G", "IS_VARLEN"],
                              prune_configs_by={"early_config_prune": _prune})(chunk_bwd_dv_local_kernel)
    return _KERNEL


def block_k(K: int) -> int:
    """K-block of the score tiles: at least 16 (``tl.dot``), at most 64."""
    return max(16, min(64, tu.next_power_of_2(K)))


def forward(q, k, do, g, scale, cu_host, cu_seqlens, chunk_size, chunk_indices=None):
    """Triton launch (arguments already validated)."""
    B, T, H, K = q.shape
    HV, V = do.shape[2], do.shape[3]
    BT = chunk_size
    NT, cu, idx = chunk_table(OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, do.device)
    qq, kk, oo, gg = (unit_last_stride(tu.kernel_input(t)) for t in (q, k, do, g))
    dv = torch.empty(B, T, HV, V, dtype=tu.kernel_dtype(do.dtype), device=do.device)
    if cu_host is not None and cu_host[-1] < T:
        dv[:, cu_host[-1]:].zero_()  # tail tokens
    if NT and B and HV and V:
        dummy = qq
        grid = lambda meta: (NT * B * HV * tu.cdiv(V, meta["BV"]),)  # noqa: E731
        _kernel()[grid](
            qq, kk, oo, dummy if gg is None else gg, dv, dummy if cu is None else cu, dummy if idx is None else idx,
            T, B, HV, HV // H, K, V, float(K ** -0.5 if scale is None else scale),
            *qq.stride()[:3], *kk.stride()[:3], *oo.stride()[:3], *(gg.stride() if gg is not None else (0, 0, 0)),
            *dv.stride()[:3], BT=BT, BK=block_k(K), USE_G=g is not None, IS_VARLEN=idx is not None)
    return tu.finish(dv, do.dtype)
