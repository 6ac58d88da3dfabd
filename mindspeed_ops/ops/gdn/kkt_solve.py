"""Fused ``chunk_scaled_dot_kkt_fwd`` + ``solve_tril`` for the GDN forward (scalar gates): ``Ainv`` straight
from k, G and β in one launch, ``A`` never written to global memory. Internal stage of
``chunk_gated_delta_rule`` (see ``chunk.FUSED_KKT_SOLVE``); the public stage functions
``chunk_scaled_dot_kkt_fwd`` and ``solve_tril`` are unchanged.

Numerics are those of the two stages (SPEC 1.10.2, 1.10.3): ``A``'s products formed as
``kkt_fwd_kernel`` forms them (same key tile ``BK``, fp32 accumulation, IEEE for fp32 keys; gates masked
before every ``exp``) and kept in fp32, inverted as ``solve_tril_kernel`` inverts (shared helpers: 16x16
diagonal blocks by forward substitution, merged with IEEE fp32 dots). What differs is only where ``A``
lives: the fp32 ``A`` the unfused path writes and reads back is exactly the value used here.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from .common import chunk_table, row_factor_args
from .kkt import key_tile

OP = "chunk_gated_delta_rule"
#: per chunk size: ``(largest key tile BK, num_warps, num_stages)``. Module-level so
#: benchmarks/tune_kkt_solve.py can sweep it on a GPU. BK defaults to kkt's key tile (``key_tile(K)``, at
#: most 64), so A's products are summed over the same tiles as the unfused kkt kernel sums them. One warp
#: as solve_tril (its substitution's reductions stay inside the warp). H200, B1 T8192 H16 HV32 K128 bf16
#: (tune_kkt_solve.py, fourteenth session): 1 warp 2 stages is best at every BT (BT 64: 103 us vs 146 us
#: for kkt + solve_tril; 2 warps 151, 4 warps 335).
CONFIG = {16: (64, 1, 2), 32: (64, 1, 2), 64: (64, 1, 2)}


def forward(k: torch.Tensor, g: Optional[torch.Tensor], beta: Optional[torch.Tensor], HV: int,
            cu_host: Optional[list], cu_seqlens: Optional[torch.Tensor], BT: int, out_dtype: torch.dtype,
            chunk_indices: Optional[torch.Tensor] = None, rk: Optional[torch.Tensor] = None,
            out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``Ainv [B, T, HV, BT]`` in ``out_dtype``: ``solve_tril(chunk_scaled_dot_kkt_fwd(k, g, beta))`` per
    chunk and value head, arguments already validated (as ``kkt.forward``: ``g`` the fp32 chunk-local
    cumsum ``G`` or None, ``beta`` or None, ``rk`` ``[B, T, H]`` fp32 l2norm rstd of raw ``k`` or None).

    Tail rows (``>= cu_seqlens[-1]``) are 0. With ``out`` (``[B, T, HV, BT]`` of the kernel's dtype for
    ``out_dtype``, any strides) the kernel writes every row inside a sequence into it and never touches the
    tail rows (tests pre-fill it)."""
    from .triton_wy import kkt_solve_fwd_kernel

    B, T, H, K = k.shape
    kx, gx, bx = tu.kernel_input(k), tu.kernel_input(g), tu.kernel_input(beta)
    if out is None:
        out = torch.empty(B, T, HV, BT, dtype=tu.kernel_dtype(out_dtype), device=k.device)
        if cu_host is not None and cu_host[-1] < T:
            out[:, cu_host[-1]:].zero_()  # tail rows
    elif tuple(out.shape) != (B, T, HV, BT) or out.dtype != tu.kernel_dtype(out_dtype):
        raise ValueError(f"{OP}: out must be [B, T, HV, BT] = {[B, T, HV, BT]} {tu.kernel_dtype(out_dtype)}, "
                         f"got {list(out.shape)} {out.dtype}")
    NT, cu, idx = chunk_table(OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, k.device)
    if NT and B and HV:
        dummy = kx
        bk_max, nw, ns = CONFIG[BT]
        r_ptr, *sr = row_factor_args(rk, dummy)
        sg = gx.stride() if gx is not None else (0, 0, 0)
        sb = bx.stride() if bx is not None else (0, 0, 0)
        kkt_solve_fwd_kernel[(NT * B * HV,)](
            kx, gx if gx is not None else dummy, bx if bx is not None else dummy, out,
            cu if cu is not None else dummy, idx if idx is not None else dummy, r_ptr, T, B * HV, HV, HV // H,
            *kx.stride(), *sg, *sb, *out.stride(), *sr,
            K=K, BT=BT, BK=min(bk_max, key_tile(K)), HAS_G=gx is not None, HAS_BETA=bx is not None,
            IS_VARLEN=idx is not None, HAS_RK=rk is not None, num_warps=nw, num_stages=ns)
    return tu.finish(out, out_dtype)
