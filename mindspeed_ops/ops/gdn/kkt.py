"""``chunk_scaled_dot_kkt_fwd`` (SPEC 1.10.2): checks and launch of the chunk's gated ``β k kᵀ``."""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_cu_seqlens, check_same_device, check_tensor, reject_float64, shape_str
from . import reference_wy as _ref
from .common import check_value_heads, chunk_table, row_factor_args, use_triton

OP = "chunk_scaled_dot_kkt_fwd"
CHUNK_SIZES = (16, 32, 64)
MAX_K = 256


def key_tile(K: int) -> int:
    """Key-dim tile of the ``tl.dot`` loops: a power of two in [16, 64] (``tl.dot`` needs >= 16)."""
    return max(16, min(64, tu.next_power_of_2(K)))


def kkt_config(BT: int, K: int, dtype: torch.dtype, per_channel: bool) -> tuple[int, int, int]:
    """``(BK, num_warps, num_stages)`` of the scalar-gate / per-channel kernels."""
    if per_channel:
        return min(32, key_tile(K)) if dtype == torch.float32 else key_tile(K), 4, 1
    return key_tile(K), 4, 3


def check_args(k: torch.Tensor, g: Optional[torch.Tensor], gk: Optional[torch.Tensor], beta: Optional[torch.Tensor],
               cu_seqlens: Optional[torch.Tensor], chunk_size: int,
               output_dtype: Optional[torch.dtype]) -> tuple[int, Optional[list]]:
    """Validate the arguments; returns ``(HV, host copy of cu_seqlens or None)``."""
    reject_float64(OP, k=k, g=g, gk=gk, beta=beta)
    check_tensor(OP, "k", k, ndim=4)
    B, T, H, K = k.shape
    if K > MAX_K:
        raise ValueError(f"{OP}: the key head dim K must be <= {MAX_K}, got k of shape {shape_str(k.shape)}")
    if g is not None and gk is not None:
        raise ValueError(f"{OP}: pass the scalar gate g or the per-channel gate gk, not both")
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"{OP}: chunk_size must be 16, 32 or 64, got {chunk_size!r}")
    if output_dtype is not None and output_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{OP}: output_dtype must be float32/float16/bfloat16 or None, got {output_dtype}")
    src = next(((n, t) for n, t in (("beta", beta), ("g", g), ("gk", gk)) if t is not None), None)
    if src is not None:
        check_tensor(OP, src[0], src[1], min_ndim=3)
    HV = H if src is None else src[1].shape[2]
    check_value_heads(OP, HV, H, f"{src[0]}.shape[2]" if src else "k.shape[2]", "k.shape[2]")
    if beta is not None:
        check_tensor(OP, "beta", beta, shape=(B, T, HV), shape_desc="[B, T, HV]")
    if g is not None:
        check_tensor(OP, "g", g, shape=(B, T, HV), shape_desc="[B, T, HV]")
    if gk is not None:
        check_tensor(OP, "gk", gk, shape=(B, T, HV, K), shape_desc="[B, T, HV, K]")
    check_same_device(OP, k=k, g=g, gk=gk, beta=beta)
    return HV, check_cu_seqlens(OP, cu_seqlens, batch=B, total=T, like=("k", k))


def chunk_scaled_dot_kkt_fwd(k: torch.Tensor, g: Optional[torch.Tensor] = None, gk: Optional[torch.Tensor] = None,
                             beta: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None,
                             chunk_size: int = 64, output_dtype: Optional[torch.dtype] = torch.float32,
                             chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Strictly-lower gated key Gram matrix of every chunk (SPEC 1.10.2, step 2 of the chunked gated
    delta rule). Forward-only stage function.

    ``A[t, j] = β_t · Σ_d k_{t,d} k_{s_j,d} · e^{G_t − G_{s_j}}`` for chunk positions ``j < i`` (``t`` at
    position ``i``, ``s_j`` the token at position ``j`` of the same chunk, inside the sequence); 0
    otherwise, diagonal included. With ``gk`` the decay is per channel, inside the sum.

    Args:
        k: ``[B, T, H, K]`` keys, ``K <= 256``, fp32/fp16/bf16, any strides.
        g: ``[B, T, HV]`` chunk-local cumsum ``G`` of scalar log-decay gates (natural log; fp32 usually,
            any float accepted), or None (no decay).
        gk: ``[B, T, HV, K]`` per-channel ``G`` (KDA-style), or None. Not together with ``g``.
        beta: ``[B, T, HV]`` (None = 1).
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``).
        chunk_size: ``BT`` in {16, 32, 64}.
        output_dtype: dtype of ``A`` (default fp32; None = ``k.dtype``).
        chunk_indices: optional precomputed ``[NT, 2]`` table for ``chunk_size``, trusted.

    Returns:
        ``A [B, T, HV, BT]``. ``HV`` comes from ``beta``/``g``/``gk`` (value head ``h`` reads key head
        ``h // (HV // H)``), or ``H`` when none is given. Tail rows (``>= cu_seqlens[-1]``) are 0.
        Products accumulate in fp32 (IEEE for fp32 keys); rounded once to ``output_dtype``.

    Raises:
        ValueError: bad ranks/shapes, ``K > 256``, ``HV % H != 0``, both ``g`` and ``gk``, bad
            ``chunk_size``, ``cu_seqlens`` or ``chunk_indices``, tensors on different devices.
        TypeError: non-float inputs (float64 is reference-only) or bad ``output_dtype``.

    Source: Yang et al., "Gated Delta Networks" (ICLR 2025), WY/UT chunk form.
    """
    HV, cu_host = check_args(k, g, gk, beta, cu_seqlens, chunk_size, output_dtype)
    out_dtype = k.dtype if output_dtype is None else output_dtype
    if not use_triton(k.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.chunk_scaled_dot_kkt_fwd_ref(k, g, gk, beta, cu_seqlens, chunk_size, out_dtype)
    return forward(k, g, gk, beta, HV, cu_host, cu_seqlens, chunk_size, out_dtype, chunk_indices)


chunk_scaled_dot_kkt = chunk_scaled_dot_kkt_fwd


def forward(k: torch.Tensor, g: Optional[torch.Tensor], gk: Optional[torch.Tensor], beta: Optional[torch.Tensor],
            HV: int, cu_host: Optional[list], cu_seqlens: Optional[torch.Tensor], BT: int, out_dtype: torch.dtype,
            chunk_indices: Optional[torch.Tensor] = None, rk: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Triton launch (arguments already validated). ``rk`` ``[B, T, H]`` fp32: k is raw and the products
    use ``k̂ = rk·k`` (the l2norm folded in, k̂ never rounded)."""
    from .triton_wy import kkt_fwd_kernel, kkt_gk_fwd_kernel

    B, T, H, K = k.shape
    kx, gx, bx = tu.kernel_input(k), tu.kernel_input(g if gk is None else gk), tu.kernel_input(beta)
    out = torch.empty(B, T, HV, BT, dtype=tu.kernel_dtype(out_dtype), device=k.device)
    if cu_host is not None and cu_host[-1] < T:
        out[:, cu_host[-1]:].zero_()  # tail rows
    NT, cu, idx = chunk_table(OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, k.device)
    if NT and B and HV and K:
        dummy = kx
        sb = bx.stride() if bx is not None else (0, 0, 0)
        BK, nw, ns = kkt_config(BT, K, kx.dtype, gk is not None)
        common = dict(K=K, BT=BT, BK=BK, HAS_BETA=bx is not None, IS_VARLEN=idx is not None, num_warps=nw,
                      num_stages=ns)
        grid = (NT * B * HV,)
        r_ptr, *sr = row_factor_args(rk, dummy)
        args = (kx, gx if gx is not None else dummy, bx if bx is not None else dummy, out,
                cu if cu is not None else dummy, idx if idx is not None else dummy, r_ptr, T, B * HV, HV, HV // H)
        if gk is None:
            sg = gx.stride() if gx is not None else (0, 0, 0)
            kkt_fwd_kernel[grid](*args, *kx.stride(), *sg, *sb, *out.stride(), *sr, HAS_G=gx is not None,
                                 HAS_RK=rk is not None, **common)
        else:
            kkt_gk_fwd_kernel[grid](*args, *kx.stride(), *gx.stride(), *sb, *out.stride(), *sr,
                                    HAS_RK=rk is not None, **common)
    elif K == 0 and NT:
        out.zero_()
    return tu.finish(out, out_dtype)
