"""Backward stages of KDA (SPEC 1.11): checks and launches.

- :func:`chunk_kda_bwd_wy_dqkg_fused` (SPEC 1.11.2, public): state paths, WY backward and the gate
  gradient of the inter-chunk terms, fused per chunk.
- :func:`chunk_kda_bwd_dav`: ``dAqk`` and the local ``dv`` of the intra-chunk output term.
- :func:`chunk_kda_bwd_intra`: the intra-chunk paths through ``Aqk`` and ``M`` (per-channel decays).

The state-gradient scan between them is GDN's ``chunk_gated_delta_rule_bwd_dhu`` with ``gk``. All are
forward-only plain functions (no autograd); the full operator chains them (``chunk.py``).
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_cu_seqlens, check_same_device, check_tensor, reject_float64
from ..common import unit_last_stride
from ..gdn.common import chunk_table, fold_value_heads, use_triton
from . import args as _args
from . import reference as _ref

WY_OP = "chunk_kda_bwd_wy_dqkg_fused"
DAV_OP = "chunk_kda_bwd_dav"
INTRA_OP = "chunk_kda_bwd_intra"


def _zero_tail(cu_host: Optional[list], T: int, *tensors: Optional[torch.Tensor]) -> None:
    if cu_host is not None and cu_host[-1] < T:
        for t in tensors:
            if t is not None:
                t[:, cu_host[-1]:].zero_()  # tail tokens take part in nothing


# Head-dim tiles are ``tu.dot_tile(K, cap)``; the caps and warps of the launches below are the fastest measured on
# the H200; two of them spill a little on sm_90 (wy_dqkg_config, intra_bwd_config; bounds in
# tests/unit_tests/kda/test_kda_compile.py).


# ------------------------------------------------------------------------------------------------
# dAqk and the local dv
# ------------------------------------------------------------------------------------------------

def dav_forward(v_new, do, Aqk, scale: float, cu_host, cu_seqlens, chunk_indices=None, dA: bool = True,
                dv: bool = True, dA_out: Optional[torch.Tensor] = None):
    """Launch of ``kda_bwd_dav_kernel``: ``(dAq [B,T,HV,BT] fp32, dv [B,T,HV,V] in do.dtype)``; ``dA=False`` /
    ``dv=False`` skip that output (None in its place; ``v_new`` is not read without ``dA``), so the backward
    can form ``dv`` before the state scan that makes ``v_new``. ``dA_out``: ``dAq``'s buffer (made by the caller
    on its own stream before running this on a side stream)."""
    from .triton_kernels import kda_bwd_dav_kernel

    B, T, HV, V = do.shape
    BT = Aqk.shape[-1]
    dev = do.device
    dd, aa = (unit_last_stride(tu.kernel_input(t)) for t in (do, Aqk))
    vn = unit_last_stride(tu.kernel_input(v_new)) if dA else dd
    if not dA:
        dA_out = None
    elif dA_out is None:
        dA_out = torch.empty(B, T, HV, BT, dtype=torch.float32, device=dev)
    dv_out = torch.empty(B, T, HV, V, dtype=tu.kernel_dtype(do.dtype), device=dev) if dv else None
    _zero_tail(cu_host, T, dA_out, dv_out)
    NT, cu, idx = chunk_table(DAV_OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, dev)
    if NT and B and HV and (dA or dv):
        dummy = dd
        a_arg, v_arg = (dummy if t is None else t for t in (dA_out, dv_out))
        kda_bwd_dav_kernel[(NT * B * HV,)](
            vn, dd, aa, a_arg, v_arg, dummy if cu is None else cu, dummy if idx is None else idx, T, B * HV, HV, V,
            float(scale), *vn.stride()[:3], *dd.stride()[:3], *aa.stride()[:3], *a_arg.stride()[:3],
            *v_arg.stride()[:3], BT=BT, BV=tu.dot_tile(V, 32 if dd.dtype == torch.float32 else 64),
            IS_VARLEN=idx is not None, DA=dA, DV=dv, num_warps=8 if dd.dtype == torch.float32 else 4)
    return dA_out, None if dv_out is None else tu.finish(dv_out, do.dtype)


def chunk_kda_bwd_dav(v_new: torch.Tensor, do: torch.Tensor, Aqk: torch.Tensor, scale: Optional[float] = None,
                      cu_seqlens: Optional[torch.Tensor] = None, chunk_indices: Optional[torch.Tensor] = None):
    """Gradients of the intra-chunk output term ``o_i += Σ_{j≤i} Aqk_ij v_new_j`` (KDA backward step 1).

    Args:
        v_new, do: ``[B, T, HV, V]``; Aqk: ``[B, T, HV, BT]`` (``BT`` in {32, 64} is the chunk size);
        scale: the ``Aqk`` scale (None = ``K ** -0.5`` is not knowable here: pass it; default 1).

    Returns:
        ``(dAq [B,T,HV,BT] fp32, dv [B,T,HV,V] in do.dtype)``: ``dAq_ij = scale·(do_i·v_new_j)`` for
        ``j ≤ i`` (the gradient w.r.t. ``Aqk/scale``), ``dv_j = Σ_{i≥j} Aqk_ij do_i``. Tail rows 0.
    """
    check_tensor(DAV_OP, "do", do, ndim=4)
    B, T, HV, V = do.shape
    check_tensor(DAV_OP, "v_new", v_new, shape=(B, T, HV, V), shape_desc="[B, T, HV, V]")
    check_tensor(DAV_OP, "Aqk", Aqk, ndim=4)
    _args.check_chunk_size(DAV_OP, Aqk.shape[-1])
    check_tensor(DAV_OP, "Aqk", Aqk, shape=(B, T, HV, None), shape_desc="[B, T, HV, BT]")
    _args.check_scale(DAV_OP, scale)
    reject_float64(DAV_OP, v_new=v_new, do=do, Aqk=Aqk)
    check_same_device(DAV_OP, v_new=v_new, do=do, Aqk=Aqk)
    cu_host = check_cu_seqlens(DAV_OP, cu_seqlens, batch=B, total=T)
    sc = 1.0 if scale is None else float(scale)
    if not use_triton(do.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.chunk_kda_bwd_dav_ref(v_new, do, Aqk, sc, cu_seqlens)
    return dav_forward(v_new, do, Aqk, sc, cu_host, cu_seqlens, chunk_indices)


# ------------------------------------------------------------------------------------------------
# chunk_kda_bwd_wy_dqkg_fused (SPEC 1.11.2)
# ------------------------------------------------------------------------------------------------

def wy_dqkg_config(K: int, V: int, BT: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """``(BK, BV, num_warps, num_stages)`` of ``kda_bwd_wy_dqkg_kernel``: 32-wide key and V tiles. 16-bit inputs:
    4 warps; at BT = 64 without software pipelining (H200 sweep at T = 8192, HV = 32, K = V = 128,
    ``benchmarks/tune_kda.py``: 1.06 ms vs 1.33 ms for 64-wide V tiles at 8 warps; 68 bytes of spill on sm_90,
    104 varlen; several pipelined 4-warp builds gave wrong results there, see docs/benchmarks/kda.md). fp32
    (IEEE products): 8 warps, 2 stages."""
    BK, BV = tu.dot_tile(K, 32), tu.dot_tile(V, 32)
    if dtype == torch.float32:
        return BK, BV, 8, 2
    return BK, BV, 4, 1 if BT == 64 else 2


def wy_dqkg_forward(q, k, v, v_new, g, beta, A, h, do, dh, dv, scale: float, cu_host, cu_seqlens,
                    chunk_indices=None, fold_heads: bool = True):
    """Launch of ``kda_bwd_wy_dqkg_kernel`` (arguments validated): ``(dq, dk, dv, db, dg, dA)``; ``dq, dk``
    fp32 ``[B,T,H,K]`` (``[B,T,HV,K]`` per value head when ``fold_heads=False``)."""
    from .triton_kernels import kda_bwd_wy_dqkg_kernel

    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = A.shape[-1]
    dev = q.device
    qq, kk, vv, vn, gg, aa, hh, dd, dhh, dvv = (unit_last_stride(tu.kernel_input(t))
                                                for t in (q, k, v, v_new, g, A, h, do, dh, dv))
    bb = tu.kernel_input(beta)
    dq = torch.empty(B, T, HV, K, dtype=torch.float32, device=dev)
    dk = torch.empty_like(dq)
    dg = torch.empty_like(dq)
    dvo = torch.empty(B, T, HV, V, dtype=tu.kernel_dtype(v.dtype), device=dev)
    db = torch.empty(B, T, HV, dtype=torch.float32, device=dev)
    dA = torch.empty(B, T, HV, BT, dtype=torch.float32, device=dev)
    _zero_tail(cu_host, T, dq, dk, dg, dvo, db, dA)
    NT, cu, idx = chunk_table(WY_OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, dev)
    if NT and B and HV:
        dummy = qq
        BK, BV, warps, stages = wy_dqkg_config(K, V, BT, kk.dtype)
        kda_bwd_wy_dqkg_kernel[(NT * B * HV,)](
            qq, kk, vv, vn, gg, bb, aa, hh, dd, dhh, dvv, dq, dk, dvo, db, dg, dA,
            dummy if cu is None else cu, dummy if idx is None else idx, T, B * HV, HV, HV // H, K, V, float(scale),
            *qq.stride()[:3], *kk.stride()[:3], *vv.stride()[:3], *vn.stride()[:3], *gg.stride()[:3],
            *bb.stride(), *aa.stride()[:3], *hh.stride()[:4], *dd.stride()[:3], *dhh.stride()[:4],
            *dvv.stride()[:3], *dq.stride()[:3], *dvo.stride()[:3], *db.stride(), *dA.stride()[:3],
            BT=BT, BK=BK, BV=BV, IS_VARLEN=idx is not None, num_warps=warps, num_stages=stages)
    if fold_heads:
        dq, dk = fold_value_heads(dq, H), fold_value_heads(dk, H)
    return dq, dk, tu.finish(dvo, v.dtype), db, dg, dA


def chunk_kda_bwd_wy_dqkg_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, v_new: torch.Tensor,
                                g: torch.Tensor, beta: torch.Tensor, A: torch.Tensor, h: torch.Tensor,
                                do: torch.Tensor, dh: torch.Tensor, dv: torch.Tensor, scale: Optional[float] = None,
                                cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                                chunk_indices: Optional[torch.Tensor] = None):
    """Fused KDA backward of the state paths, the WY representation and the inter-chunk gate gradient
    (SPEC 1.11.2). Forward-only stage function.

    Per chunk with ``T = A``, ``S = h[c]``, ``dS = dh[c]``, ``dV = dv`` (per value head):
    ``dq_i = scale e^{G_i} ⊙ S do_i``; ``dks_j = e^{Γ−G_j} ⊙ dS v_new_j``; ``dw_i = −S dV_i``;
    ``dT = dV (β v)ᵀ + dw (β e^G k)ᵀ``; ``dA = −Tᵀ dT Tᵀ`` on strictly-lower valid entries;
    ``dv_i = β_i (TᵀdV)_i``; ``dk_j = dks_j + β_j e^{G_j} ⊙ (Tᵀdw)_j``;
    ``db_i = v_i·(TᵀdV)_i + (e^{G_i} ⊙ k_i)·(Tᵀdw)_i``;
    ``dg_i = q_i ⊙ dq_i − k_i ⊙ dks_i + k_i ⊙ β_i e^{G_i} ⊙ (Tᵀdw)_i`` plus, at the chunk's last valid
    position, ``e^{Γ} ⊙ Σ_v (S ⊙ dS)[:, v] + Σ_j k_j ⊙ dks_j``. Exact for any ``A``. The intra-chunk paths
    through ``Aqk`` and ``M`` are not included (the full operator adds them).

    Args:
        q, k: ``[B, T, H, K]``; v, v_new: ``[B, T, HV, V]``; g: ``G [B, T, HV, K]`` (chunk-local cumsum,
            fp32); beta: ``[B, T, HV]``; A: ``Akk [B, T, HV, BT]``; h: ``[B, NT, HV, K, V]`` (states entering
            each chunk); do: ``[B, T, HV, V]``; dh: ``[B, NT, HV, K, V]`` (gradients of the states leaving
            each chunk); dv: ``[B, T, HV, V]`` total gradient w.r.t. ``v_new``. fp32/fp16/bf16.
        scale: None means ``K ** -0.5``; cu_seqlens: packed offsets (``B == 1``); chunk_size: 32 or 64,
            must equal ``A.shape[-1]``; chunk_indices: optional precomputed table, trusted.

    Returns:
        ``(dq [B,T,H,K] fp32, dk [B,T,H,K] fp32 (both summed over shared value heads), dv [B,T,HV,V] in
        v.dtype (w.r.t. the input v), db [B,T,HV] fp32, dg [B,T,HV,K] fp32 (w.r.t. G), dA [B,T,HV,BT]
        fp32)``. Tail rows 0. Deterministic (no atomics; the head sum is a torch reduction).

    Raises:
        ValueError: shapes, chunk size, scale, cu_seqlens, devices. TypeError: non-float (float64) inputs.

    Source: Kimi Team, "Kimi Linear" (2025); WY backward as in Yang et al. (NeurIPS 2024).
    """
    cu_host = _args.check_qkv_gk(WY_OP, q, k, v, g, beta, scale, chunk_size, cu_seqlens, v_new=v_new, A=A, h=h,
                                 do=do, dh=dh, dv=dv)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    for name, t in (("v_new", v_new), ("do", do), ("dv", dv)):
        check_tensor(WY_OP, name, t, shape=(B, T, HV, V), shape_desc="[B, T, HV, V]")
    check_tensor(WY_OP, "A", A, shape=(B, T, HV, chunk_size), shape_desc="[B, T, HV, BT]")
    NT = _args.num_chunks(T, chunk_size, cu_host)
    for name, t in (("h", h), ("dh", dh)):
        check_tensor(WY_OP, name, t, shape=(B, NT, HV, K, V), shape_desc="[B, NT, HV, K, V]")
    if chunk_indices is not None:
        chunk_table(WY_OP, cu_host, cu_seqlens, B, T, chunk_size, chunk_indices)
    sc = K ** -0.5 if scale is None else float(scale)
    if not use_triton(q.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.chunk_kda_bwd_wy_dqkg_fused_ref(q, k, v, v_new, g, beta, A, h, do, dh, dv, sc, cu_seqlens,
                                                        chunk_size)
    return wy_dqkg_forward(q, k, v, v_new, g, beta, A, h, do, dh, dv, sc, cu_host, cu_seqlens, chunk_indices)


# ------------------------------------------------------------------------------------------------
# intra-chunk paths through Aqk and M
# ------------------------------------------------------------------------------------------------

def intra_bwd_forward(q, k, gk, beta, dAq, dAm, dq, dk, dg, db, cu_host, cu_seqlens, chunk_indices=None):
    """Launch of ``kda_bwd_intra_kernel``: adds the intra-chunk gradients **in place** to the fp32 per-value-
    head buffers ``dq, dk, dg [B,T,HV,K]`` and ``db [B,T,HV]`` (contiguous, as ``wy_dqkg_forward`` makes
    them; internal buffers only, never the caller's tensors)."""
    from .triton_kernels import kda_bwd_intra_kernel

    B, T, H, K = q.shape
    HV = gk.shape[2]
    BT = dAq.shape[-1]
    dev = q.device
    qq, kk, gg = (unit_last_stride(tu.kernel_input(t)) for t in (q, k, gk))
    bb = tu.kernel_input(beta)
    assert dAq.stride() == dAm.stride() and dq.stride() == dk.stride() == dg.stride()
    NT, cu, idx = chunk_table(INTRA_OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, dev)
    if NT and B and HV and K:
        dummy = qq
        BK, nw = intra_bwd_config(K, kk.dtype)
        NK = tu.cdiv(K, BK)
        # db is a dot product over all K: with several key tiles each adds its share to a zeroed partial
        # buffer, summed afterwards in a fixed order (deterministic, no atomics)
        dbp = db.unsqueeze(0) if NK == 1 else torch.zeros((NK,) + tuple(db.shape), dtype=db.dtype, device=dev)
        kda_bwd_intra_kernel[(NT * B * HV, BT // 16, NK)](
            qq, kk, gg, bb, dAq, dAm, dq, dk, dg, dbp, dummy if cu is None else cu, dummy if idx is None else idx,
            T, B * HV, HV, HV // H, *qq.stride()[:3], *kk.stride()[:3], *gg.stride()[:3], *bb.stride(),
            *dAq.stride()[:3], *dq.stride()[:3], *dbp.stride(),
            K=K, BT=BT, BK=BK, IS_VARLEN=idx is not None, num_warps=nw)
        if NK > 1:
            db += dbp.sum(0)
    return dq, dk, dg, db


def intra_bwd_config(K: int, dtype: torch.dtype) -> tuple[int, int]:
    """``(BK, num_warps)`` of ``kda_bwd_intra_kernel``. 16-bit: BK = 64 at 2 warps when BK divides K (fastest of
    the eleventh session's H200 sweep at K = 128, both gate regimes: 1.53 vs 1.80 ms at 4 warps, though it spills
    152 bytes on sm_90; docs/benchmarks/kda.md, ``benchmarks/tune_kda.py``), else at 4 warps (a partial key tile
    at 2 warps spills 500-700 bytes, at 4 warps 0-60; not timed). fp32 (IEEE products on the FMA units): 32 at
    8 warps."""
    if dtype == torch.float32:
        return tu.dot_tile(K, 32), 8
    BK = tu.dot_tile(K, 64)
    return BK, 2 if K % BK == 0 else 4


def chunk_kda_bwd_intra(q: torch.Tensor, k: torch.Tensor, gk: torch.Tensor, beta: torch.Tensor, dAq: torch.Tensor,
                        dAm: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None,
                        chunk_indices: Optional[torch.Tensor] = None):
    """Intra-chunk KDA gradients through ``Aqk/scale`` (cotangent ``dAq``, ``j ≤ i``) and ``M`` (cotangent
    ``dAm``, ``j < i``), with ``E_ij = e^{G_i − G_j}`` per channel:
    ``dq_i = Σ_{j≤i} dAq_ij E_ij ⊙ k_j``; ``dk = β ⊙ Rk + C`` with ``Rk_i = Σ_{j<i} dAm_ij E_ij ⊙ k_j`` and
    ``C_j = Σ_{i≥j} E_ij ⊙ (dAq_ij q_i + dAm_ij β_i k_i)``; ``db_i = k_i·Rk_i``;
    ``dG = q ⊙ dq + β k ⊙ Rk − k ⊙ C``.

    Args:
        q, k: ``[B, T, H, K]``; gk: ``G [B, T, HV, K]``; beta: ``[B, T, HV]``; dAq, dAm: ``[B, T, HV, BT]``
        (only the entries inside each chunk's valid triangle are read); cu_seqlens, chunk_indices: varlen.

    Returns:
        ``(dq, dk [B,T,HV,K], db [B,T,HV], dG [B,T,HV,K])`` fp32, per value head; tail rows 0.
    """
    cu_host = _args.check_qkv_gk(INTRA_OP, q, k, None, gk, beta, None, dAq.shape[-1], cu_seqlens, dAq=dAq, dAm=dAm)
    B, T, H, K = q.shape
    HV = gk.shape[2]
    for name, t in (("dAq", dAq), ("dAm", dAm)):
        check_tensor(INTRA_OP, name, t, shape=(B, T, HV, dAq.shape[-1]), shape_desc="[B, T, HV, BT]")
    if not use_triton(q.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            dq, dk, db, dg = _ref.chunk_kda_bwd_intra_ref(q, k, gk, beta, dAq, dAm, cu_seqlens)
            return dq, dk, db, dg
    dq = torch.zeros(B, T, HV, K, dtype=torch.float32, device=q.device)
    dk, dg = torch.zeros_like(dq), torch.zeros_like(dq)
    db = torch.zeros(B, T, HV, dtype=torch.float32, device=q.device)
    a = dAq.float().contiguous()
    m = dAm.float().contiguous()
    intra_bwd_forward(q, k, gk, beta, tu.kernel_input(a), tu.kernel_input(m), dq, dk, dg, db, cu_host, cu_seqlens,
                      chunk_indices)
    return dq, dk, db, dg
