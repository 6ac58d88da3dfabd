"""``chunk_gated_delta_rule`` (SPEC 1.10.10): the forward composed of the stage kernels.

Pipeline (SPEC 1.10.0 table): optional in-kernel l2norm of q/k -> ``G = chunk_local_cumsum(g)`` ->
``A = chunk_scaled_dot_kkt(k, G, beta)`` -> ``Ainv = solve_tril(A)`` -> ``w, u = recompute_w_u_fwd`` ->
``h, v_new, final_state = chunk_gated_delta_rule_fwd_h`` -> ``o = chunk_fwd_o``. The backward needs
only the inputs, ``G`` and ``Ainv`` (``w, u, h, v_new`` are recomputed).
"""
from __future__ import annotations

from typing import Optional

import torch

from ...varlen import build_chunk_indices
from .cumsum import chunk_local_cumsum
from .fwd_h import chunk_gated_delta_rule_fwd_h
from .fwd_o import chunk_fwd_o
from .kkt import chunk_scaled_dot_kkt_fwd
from .solve_tril import solve_tril
from .wy_fast import recompute_w_u_fwd

OP = "chunk_gated_delta_rule"


def _normalize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from ..norm.autograd import l2norm_fwd

    return l2norm_fwd(x, 1e-6)


def forward(q, k, v, g, beta, scale: float, initial_state, output_final_state: bool, use_qk_l2norm_in_kernel: bool,
            cu_seqlens: Optional[torch.Tensor], cu_host: Optional[list], chunk_size: int):
    """Returns ``(o, final_state or None, G or None, Ainv)``; arguments already validated."""
    BT = chunk_size
    cu_cpu = None if cu_host is None else torch.tensor(cu_host, dtype=torch.int64)
    idx = None if cu_cpu is None else build_chunk_indices(cu_cpu, BT).to(q.device)
    cu = None if cu_cpu is None else cu_cpu.to(q.device)
    if use_qk_l2norm_in_kernel:
        q, _ = _normalize(q)
        k, _ = _normalize(k)
    G = None if g is None else chunk_local_cumsum(g, BT, cu_seqlens=cu, chunk_indices=idx)
    A = chunk_scaled_dot_kkt_fwd(k, g=G, beta=beta, cu_seqlens=cu, chunk_size=BT, output_dtype=torch.float32,
                                 chunk_indices=idx)
    Ainv = solve_tril(A, cu_seqlens=cu, output_dtype=k.dtype, chunk_indices=idx)
    w, u = recompute_w_u_fwd(k, v, beta, Ainv, g=G, cu_seqlens=cu, chunk_indices=idx)
    h, v_new, final = chunk_gated_delta_rule_fwd_h(k, w, u, g=G, initial_state=initial_state,
                                                  output_final_state=output_final_state, chunk_size=BT,
                                                  save_new_value=True, cu_seqlens=cu, chunk_indices=idx)
    o = chunk_fwd_o(q, k, v_new, h, g=G, scale=scale, cu_seqlens=cu, chunk_size=BT, chunk_indices=idx)
    return o, final, G, Ainv
