"""``chunk_kda_fwd_o``: the KDA output stage (SPEC 1.11, ``o_i = scale·S_cᵀ qg_i + Σ_{j≤i} Aqk_ij v_new_j``).

GDN's ``chunk_fwd_o`` (SPEC 1.10.7) takes a scalar gate and recomputes ``q kᵀ`` inside; with per-channel
gates the intra-chunk matrix is ``Aqk`` from ``chunk_kda_fwd_intra``, so this stage takes it instead of
``k``. Forward-only plain function (no autograd).
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_tensor
from ..common import unit_last_stride
from ..gdn.common import chunk_table, row_factor_args, use_triton
from . import args as _args
from . import reference as _ref

OP = "chunk_kda_fwd_o"


def check_args(q, v, h, gk, Aqk, scale, chunk_size, cu_seqlens) -> Optional[list]:
    """Validate; returns the host copy of ``cu_seqlens`` (or None)."""
    cu_host = _args.check_qkv_gk(OP, q, q, v, gk, None, scale, chunk_size, cu_seqlens, h=h, Aqk=Aqk)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    check_tensor(OP, "Aqk", Aqk, shape=(B, T, HV, chunk_size), shape_desc="[B, T, HV, BT]")
    NT = _args.num_chunks(T, chunk_size, cu_host)
    check_tensor(OP, "h", h, shape=(B, NT, HV, K, V), shape_desc="[B, NT, HV, K, V]")
    return cu_host


def chunk_kda_fwd_o(q: torch.Tensor, v: torch.Tensor, h: torch.Tensor, gk: torch.Tensor, Aqk: torch.Tensor,
                    scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                    chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Output of chunked KDA (SPEC 1.11): ``o_i = scale·S_cᵀ (q_i ⊙ e^{G_i}) + Σ_{j ≤ i, same chunk} Aqk_ij v_j``.

    Args:
        q: ``[B, T, H, K]`` (raw: the decay ``e^{G}`` is applied inside), ``K <= 256``.
        v: ``v_new [B, T, HV, V]`` from ``chunk_gated_delta_rule_fwd_h`` (``HV % H == 0``, GVA).
        h: ``[B, NT, HV, K, V]`` states entering each chunk (varlen: flattened chunk list).
        gk: ``[B, T, HV, K]`` chunk-local per-channel cumsum ``G`` (natural log).
        Aqk: ``[B, T, HV, BT]`` from ``chunk_kda_fwd_intra`` (scale included, lower triangular).
        scale: None means ``K ** -0.5``; cu_seqlens: packed offsets (``B == 1``), tail outputs 0;
        chunk_size: 32 or 64; chunk_indices: optional precomputed table, trusted.

    Returns:
        ``o [B, T, HV, V]`` in ``v.dtype`` (fp32 accumulation, ``q ⊙ e^G`` staged in q's dtype).

    Raises:
        ValueError: shapes, chunk size, scale, cu_seqlens, devices. TypeError: non-float (float64) inputs.
    """
    cu_host = check_args(q, v, h, gk, Aqk, scale, chunk_size, cu_seqlens)
    sc = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if not use_triton(q.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.chunk_kda_fwd_o_ref(q, v, h, gk, Aqk, sc, cu_seqlens, chunk_size)
    return forward(q, v, h, gk, Aqk, sc, cu_host, cu_seqlens, chunk_size, chunk_indices)


def _configs():
    import triton

    return [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)
            for bv, nw, ns in ((64, 4, 2), (128, 8, 2), (64, 4, 3), (128, 4, 3))]


def _prune(configs, named_args, **kwargs):
    """Drop V tiles wider than V needs (rounded up to a power of two, at least 32), and for fp32 the
    128-wide tile with 4 warps (it spills on sm_90)."""
    vmax = max(32, tu.next_power_of_2(named_args["V"]))
    f32 = named_args["q_ptr"].dtype == torch.float32
    kept = [c for c in configs if c.kwargs["BV"] <= vmax and not (f32 and c.kwargs["BV"] == 128 and c.num_warps == 4)]
    return kept or configs[:1]


_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        from .triton_kernels import kda_fwd_o_kernel

        _KERNEL = tu.autotune(_configs(), key=["HV", "GQ", "K", "V", "BT", "IS_VARLEN", "HAS_RQ"],
                              prune_configs_by={"early_config_prune": _prune})(kda_fwd_o_kernel)
    return _KERNEL


def forward(q, v, h, gk, Aqk, scale: float, cu_host, cu_seqlens, chunk_size: int, chunk_indices=None, rq=None):
    """Triton launch (arguments validated); ``rq`` ``[B, T, H]`` fp32: q is raw and the state product uses
    its l2norm ``rq·q`` (never rounded)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    NT, cu, idx = chunk_table(OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, v.device)
    qq, vv, hh, gg, aa = (unit_last_stride(tu.kernel_input(t)) for t in (q, v, h, gk, Aqk))
    o = torch.empty(B, T, HV, V, dtype=tu.kernel_dtype(v.dtype), device=v.device)
    if cu_host is not None and cu_host[-1] < T:
        o[:, cu_host[-1]:].zero_()  # tail tokens
    if NT and B and HV and V:
        BK = tu.dot_tile(K, 64)
        dummy = qq
        grid = lambda meta: (NT * B * HV * tu.cdiv(V, meta["BV"]),)  # noqa: E731
        r_ptr, *sr = row_factor_args(rq, dummy)
        _kernel()[grid](
            qq, gg, vv, hh, aa, o, dummy if cu is None else cu, dummy if idx is None else idx, r_ptr,
            T, B, HV, HV // H, K, V, float(scale),
            *qq.stride()[:3], *gg.stride()[:3], *vv.stride()[:3], *hh.stride()[:4], *aa.stride()[:3],
            *o.stride()[:3], *sr, BT=BT, BK=BK, IS_VARLEN=idx is not None, HAS_RQ=rq is not None)
    return tu.finish(o, v.dtype)
