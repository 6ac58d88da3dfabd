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
from .bwd_dhu import chunk_gated_delta_rule_bwd_dhu
from .bwd_dqkwg import chunk_bwd_dqkwg
from .bwd_dv import chunk_bwd_dv_local
from .cumsum import chunk_local_cumsum
from .fwd_h import chunk_gated_delta_rule_fwd_h
from .fwd_o import chunk_fwd_o
from .kkt import chunk_scaled_dot_kkt_fwd
from .solve_tril import solve_tril
from .wy_fast import prepare_wy_repr_bwd, recompute_w_u_fwd

OP = "chunk_gated_delta_rule"


def _normalize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from ..norm.autograd import l2norm_fwd

    return l2norm_fwd(x, 1e-6)


def _tables(cu_host: Optional[list], BT: int, device: torch.device):
    """(device cu_seqlens, chunk_indices) built once per call from the host copy (or (None, None))."""
    if cu_host is None:
        return None, None
    cu_cpu = torch.tensor(cu_host, dtype=torch.int64)
    return cu_cpu.to(device), build_chunk_indices(cu_cpu, BT).to(device)


def forward(q, k, v, g, beta, scale: float, initial_state, output_final_state: bool, use_qk_l2norm_in_kernel: bool,
            cu_seqlens: Optional[torch.Tensor], cu_host: Optional[list], chunk_size: int):
    """Returns ``(o, final_state or None, G or None, Ainv)``; arguments already validated."""
    BT = chunk_size
    cu, idx = _tables(cu_host, BT, q.device)
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


def backward(do, dht, q, k, v, g, beta, G, Ainv, initial_state, scale: float, use_qk_l2norm_in_kernel: bool,
             cu_seqlens: Optional[torch.Tensor], cu_host: Optional[list], chunk_size: int):
    """Backward pipeline of SPEC 1.10.0 from the saved inputs, ``G`` and ``Ainv`` (``w, u, h, v_new``
    recomputed). Returns ``(dq, dk, dv, dg or None, dbeta, dh0 or None)``: dq/dk/dg/dbeta/dh0 in fp32."""
    from ..norm.autograd import l2norm_bwd

    BT = chunk_size
    cu, idx = _tables(cu_host, BT, q.device)
    kw = dict(cu_seqlens=cu, chunk_indices=idx)
    G = G if g is not None else None
    if use_qk_l2norm_in_kernel:
        qn, q_rstd = _normalize(q)
        kn, k_rstd = _normalize(k)
    else:
        qn, kn = q, k
    w, u = recompute_w_u_fwd(kn, v, beta, Ainv, g=G, **kw)
    h, v_new, _ = chunk_gated_delta_rule_fwd_h(kn, w, u, g=G, initial_state=initial_state, output_final_state=False,
                                               chunk_size=BT, save_new_value=True, **kw)
    dv_local = chunk_bwd_dv_local(qn, kn, do, g=G, scale=scale, chunk_size=BT, **kw)
    dh, dh0, dv2 = chunk_gated_delta_rule_bwd_dhu(qn, kn, w, do, dv_local, g=G, h0=initial_state, dht=dht,
                                                  scale=scale, chunk_size=BT, **kw)
    dq, dk, dw, dG = chunk_bwd_dqkwg(qn, kn, v_new, do, h, dh, g=G, dv=dv2, w=w, chunk_size=BT, scale=scale, **kw)
    dk2, dv, dbeta, dG2 = prepare_wy_repr_bwd(kn, v, G, beta, Ainv, dw, dv2, chunk_size=BT, **kw)
    dk = dk + dk2
    dg = None
    if G is not None:
        dg = chunk_local_cumsum(dG + dG2, BT, reverse=True, **kw)
    if use_qk_l2norm_in_kernel:
        dq = l2norm_bwd(qn, q_rstd, dq, 1e-6, dx_dtype=torch.float32)
        dk = l2norm_bwd(kn, k_rstd, dk, 1e-6, dx_dtype=torch.float32)
    return dq, dk, dv, dg, dbeta, dh0
