"""``chunk_kda_fwd_intra`` (SPEC 1.11.1): the intra-chunk forward of KDA.

``Aqk`` and ``M`` (GDN's per-channel ``chunk_scaled_dot_kkt_fwd`` product) come from one KDA kernel
(``kda_aqk_fwd_kernel``, which also writes the elementwise ``qg``, ``kg``); ``Akk = (I + M)^{-1}`` from GDN's
``solve_tril``, ``w, u`` from GDN's ``recompute_w_u_fwd`` (``gk``).
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from ..common import unit_last_stride
from ..gdn.solve_tril import forward as _solve_forward
from ..gdn.wy_fast import forward as _wy_forward
from ..gdn.common import chunk_table, row_factor_pair_args, use_triton
from . import args as _args
from . import reference as _ref

OP = "chunk_kda_fwd_intra"


def aqk_config(K: int, dtype: torch.dtype, store_a: bool = True) -> tuple[int, int, int]:
    """``(BK, num_warps, num_stages)`` of the Aqk (and M) kernel; BK >= 16 (``tl.dot``). 16-bit: 32 (K's power of
    two if smaller), one warp; 1 stage where the earlier column blocks take the row block's factored tiles once
    (K <= 128, :func:`aqk_column_width`), else 3. H200 sweeps (``tune_kda.py --only aqk``, docs/benchmarks/kda.md):
    thirty-first session, B1 T8192 H16: 301 µs against 340 at the previous 64 / 2 warps, 259 µs with the diagonal
    block's 4x4 groups (4-28 bytes of spill on sm_90); thirty-second, the factored row tiles once: 243 µs at 1
    stage against 328 at 3 (and 277 at 64 / 2 warps / 1 stage). fp32 at 8 warps and BK = min(32, K rounded up to
    a power of two): at 4 it spills ~5 KB on sm_90 (compile-only check). Without ``store_a`` (the backward's
    elementwise ``qg``/``kg`` pass) 64 at 2 warps (``tune_kda.py --only qgkg``)."""
    if dtype == torch.float32:
        return tu.dot_tile(K, 32), 8, 3
    if not store_a:
        return tu.dot_tile(K, 64), 2, 3
    return tu.dot_tile(K, 32), 1, 1 if aqk_column_width(K, dtype) else 3


def aqk_column_width(K: int, dtype: torch.dtype) -> int:
    """Key width of the Aqk kernel's earlier-column products (its ``KC``): K rounded up to a power of two, at
    least 16 (``tl.dot``'s inner dimension on NVIDIA), for 16-bit inputs and K <= 128, the row block's factored q/k
    tiles then made once, in the product dtype, for all its earlier column blocks (they were remade per column
    block: 259 -> 243 µs, B1 T8192 H16, H200); else 0, ``BK``-wide key tiles (fp32 products and K = 256 would
    take too many registers at one warp)."""
    if dtype == torch.float32 or K > 128:
        return 0
    return tu.dot_tile(K, 128)


def aqk_forward(q: torch.Tensor, k: torch.Tensor, gk: torch.Tensor, scale: float, cu_host: Optional[list],
                cu_seqlens: Optional[torch.Tensor], BT: int, chunk_indices: Optional[torch.Tensor] = None, *,
                store_a: bool = True, store_qg: bool = False, store_kg: bool = False,
                rq: Optional[torch.Tensor] = None, rk: Optional[torch.Tensor] = None,
                beta: Optional[torch.Tensor] = None):
    """Launch of ``kda_aqk_fwd_kernel`` (arguments validated): ``(Aqk in k.dtype or None, qg in q.dtype or
    None, kg in k.dtype or None, M fp32 or None)``, tail rows 0. ``rq``, ``rk`` (both or neither,
    ``[B, T, H]`` fp32, one layout): q, k are raw and every product uses their l2norm ``rstd·q``, ``rstd·k``.
    ``beta [B, T, HV]`` (with ``store_a``): also ``M`` (GDN's per-channel kkt, ``[B, T, HV, BT]``) from the
    same loads and exponentials."""
    from .triton_kernels import kda_aqk_fwd_kernel

    B, T, H, K = k.shape
    HV = gk.shape[2]
    dev = k.device
    qq, kk, gg = (unit_last_stride(tu.kernel_input(t)) for t in (q, k, gk))
    A = torch.empty(B, T, HV, BT, dtype=tu.kernel_dtype(k.dtype), device=dev) if store_a else None
    qg = torch.empty(B, T, HV, K, dtype=tu.kernel_dtype(q.dtype), device=dev) if store_qg else None
    kg = torch.empty(B, T, HV, K, dtype=tu.kernel_dtype(k.dtype), device=dev) if store_kg else None
    M = torch.empty(B, T, HV, BT, dtype=torch.float32, device=dev) if beta is not None and store_a else None
    if cu_host is not None and cu_host[-1] < T:
        for t in (A, qg, kg, M):
            if t is not None:
                t[:, cu_host[-1]:].zero_()  # tail rows take part in nothing
    NT, cu, idx = chunk_table(OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, dev)
    if NT and B and HV and (store_a or K):
        dummy = kk
        z3 = (0, 0, 0)
        rq_ptr, rk_ptr, *sr = row_factor_pair_args("chunk_kda_fwd_intra", rq, rk, dummy)
        BK, nw, ns = aqk_config(K, kk.dtype, store_a)
        m_args = {}
        if M is not None:
            bb = tu.kernel_input(beta)
            m_args = dict(m_ptr=M, beta_ptr=bb, s_mb=M.stride(0), s_mt=M.stride(1), s_mh=M.stride(2),
                          s_bb=bb.stride(0), s_bt=bb.stride(1), s_bh=bb.stride(2), STORE_M=True)
        kda_aqk_fwd_kernel[(NT * B * HV, BT // 16)](
            qq, kk, gg, dummy if A is None else A, dummy if qg is None else qg, dummy if kg is None else kg,
            dummy if cu is None else cu, dummy if idx is None else idx, rq_ptr, rk_ptr,
            T, B * HV, HV, HV // H, float(scale),
            *qq.stride()[:3], *kk.stride()[:3], *gg.stride()[:3], *(A.stride()[:3] if A is not None else z3),
            *(qg.stride()[:3] if qg is not None else z3), *(kg.stride()[:3] if kg is not None else z3), *sr,
            K=K, BT=BT, BK=BK, STORE_A=store_a, STORE_QG=store_qg, STORE_KG=store_kg,
            IS_VARLEN=idx is not None, HAS_R=rq is not None, num_warps=nw, num_stages=ns,
            KC=aqk_column_width(K, kk.dtype) if store_a else 0, **m_args)
    return tuple(None if t is None else tu.finish(t, dt) for t, dt in ((A, k.dtype), (qg, q.dtype), (kg, k.dtype),
                                                                       (M, torch.float32)))


def forward(q, k, v, gk, beta, scale: float, cu_host, cu_seqlens, BT: int, chunk_indices=None, *,
            output_qg: bool = False, output_kg: bool = True, rq=None, rk=None):
    """Triton path of :func:`chunk_kda_fwd_intra` (arguments validated): ``(w, u, qg, kg, Aqk, Akk)``;
    ``rq``, ``rk``: see :func:`aqk_forward`."""
    # Aqk and M (GDN's per-channel kkt) from one kernel: same loads, same exponentials
    Aqk, qg, kg, M = aqk_forward(q, k, gk, scale, cu_host, cu_seqlens, BT, chunk_indices, store_qg=output_qg,
                                 store_kg=output_kg, rq=rq, rk=rk, beta=beta)
    Akk = _solve_forward(M, cu_host, cu_seqlens, k.dtype, chunk_indices)
    del M
    w, u = _wy_forward(k, v, beta, Akk, None, gk, cu_host, cu_seqlens, chunk_indices, rk=rk)
    return w, u, qg, kg, Aqk, Akk


def chunk_kda_fwd_intra(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, beta: torch.Tensor,
                        scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None,
                        chunk_size: int = 64, chunk_indices: Optional[torch.Tensor] = None, output_qg: bool = False,
                        **kwargs):
    """Intra-chunk forward of Kimi Delta Attention (SPEC 1.11.1). Forward-only stage function.

    Per chunk (positions ``i, j``; ``G = gk`` per channel, ``Γ`` its value at the chunk's last valid row):
    ``M_ij = β_i Σ_d k_id k_jd e^{G_id − G_jd}`` (``j < i``), ``Akk = (I + M)^{-1}``;
    ``Aqk_ij = scale Σ_d q_id k_jd e^{G_id − G_jd}`` (``j ≤ i``); ``w = Akk (β ⊙ e^G ⊙ k)``,
    ``u = Akk (β ⊙ v)``, ``qg = q ⊙ e^G``, ``kg = k ⊙ e^{Γ − G}``. Exact for every gate (hard resets at
    −1000 included): exponentials only of masked differences (see ``triton_kernels``).

    Args:
        q, k: ``[B, T, H, K]``, ``K <= 256``; v: ``[B, T, HV, V]`` (``HV % H == 0``; value head ``i`` reads
            q/k head ``i // (HV/H)``); fp32/fp16/bf16 (may differ), any strides.
        gk: ``[B, T, HV, K]`` chunk-local cumsum ``G`` of the per-channel log-decay (natural log, fp32).
        beta: ``[B, T, HV]``.
        scale: ``Aqk`` scale; None means ``K ** -0.5``.
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``); tail rows are 0.
        chunk_size: ``BT`` in {32, 64}.
        chunk_indices: optional precomputed ``[NT, 2]`` table for ``chunk_size``, trusted.
        output_qg: also return ``qg`` (else None).
        **kwargs: ``disable_recompute=True`` implies ``output_qg=True``; ``safe_gate``, ``lower_bound``,
            ``use_graph`` have no effect; anything else is ignored with a one-time warning.

    Returns:
        ``(w [B,T,HV,K] k.dtype, u [B,T,HV,V] v.dtype, qg [B,T,HV,K] q.dtype or None, kg [B,T,HV,K] k.dtype,
        Aqk [B,T,HV,BT] k.dtype, Akk [B,T,HV,BT] k.dtype (the inverse, unit diagonal included))``.

    Raises:
        ValueError: shapes, ``K > 256``, ``HV % H``, chunk_size, scale, cu_seqlens, devices.
        TypeError: non-float inputs (float64 is reference-only).

    Source: Kimi Team, "Kimi Linear" (2025), Kimi Delta Attention, chunkwise form.
    """
    _args.stage_kwargs(OP, kwargs)
    output_qg = bool(output_qg or kwargs.get("disable_recompute", False))
    for name, t in (("q", q), ("v", v), ("gk", gk), ("beta", beta)):
        if t is None:
            raise TypeError(f"{OP}: {name} must be a torch.Tensor, got None")
    cu_host = _args.check_qkv_gk(OP, q, k, v, gk, beta, scale, chunk_size, cu_seqlens)
    if chunk_indices is not None:
        chunk_table(OP, cu_host, cu_seqlens, k.shape[0], k.shape[1], chunk_size, chunk_indices)
    sc = k.shape[-1] ** -0.5 if scale is None else float(scale)
    if not use_triton(k.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.chunk_kda_fwd_intra_ref(q, k, v, gk, beta, sc, cu_seqlens, chunk_size, output_qg)
    return forward(q, k, v, gk, beta, sc, cu_host, cu_seqlens, chunk_size, chunk_indices, output_qg=output_qg)
