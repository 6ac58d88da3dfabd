"""``chunk_bwd_dqkwg`` (SPEC 1.10.9): checks and launch of the q/k/w/gate gradients of the chunked
gated delta rule."""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_same_device, check_tensor, reject_float64
from ..common import unit_last_stride
from . import reference_bwd as _ref
from .bwd_dv import check_qk_do
from .common import chunk_table, prune_v_tiles, row_factor_args, use_triton

OP = "chunk_bwd_dqkwg"


def check_args(q, k, v, do, h, dh, g, dv, w, scale, chunk_size, cu_seqlens) -> Optional[list]:
    """Validate the arguments; returns the host copy of ``cu_seqlens`` (or None)."""
    reject_float64(OP, q=q, k=k, v=v, do=do, h=h, dh=dh, g=g, dv=dv, w=w)
    cu_host = check_qk_do(OP, q, k, do, g, scale, chunk_size, cu_seqlens)
    B, T, H, K = q.shape
    HV, V = do.shape[2], do.shape[3]
    check_tensor(OP, "v", v, shape=(B, T, HV, V), shape_desc="[B, T, HV, V]")
    NT = tu.cdiv(T, chunk_size) if cu_host is None else \
        sum(tu.cdiv(b - a, chunk_size) for a, b in zip(cu_host, cu_host[1:]))
    check_tensor(OP, "h", h, shape=(B, NT, HV, K, V), shape_desc="[B, NT, HV, K, V]")
    check_tensor(OP, "dh", dh, shape=(B, NT, HV, K, V), shape_desc="[B, NT, HV, K, V]")
    if dv is not None:
        check_tensor(OP, "dv", dv, shape=(B, T, HV, V), shape_desc="[B, T, HV, V]")
    if w is not None:
        check_tensor(OP, "w", w, shape=(B, T, HV, K), shape_desc="[B, T, HV, K]")
    check_same_device(OP, q=q, k=k, v=v, do=do, h=h, dh=dh, g=g, dv=dv, w=w)
    return cu_host


def chunk_bwd_dqkwg(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, h: torch.Tensor,
                    dh: torch.Tensor, g: Optional[torch.Tensor] = None, dv: Optional[torch.Tensor] = None,
                    w: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None,
                    chunk_size: int = 64, scale: Optional[float] = None,
                    chunk_indices: Optional[torch.Tensor] = None):
    """Gradients w.r.t. ``q``, ``k``, ``w`` and the gate cumsum ``G`` of the chunked gated delta rule
    (SPEC 1.10.9, step 3 of the backward pipeline of 1.10.0). Forward-only stage function (no autograd).

    Per chunk c (``S_c = h[c]`` entering, ``dS_c = dh[c]`` leaving, ``v = v_new``):

    - ``dq_i = scale·e^{G_i} S_c do_i + scale·Σ_{j≤i} (do_i·v_j) e^{G_i−G_j} k_j``;
    - ``dk_j = scale·Σ_{i≥j} (do_i·v_j) e^{G_i−G_j} q_i + e^{Γ_c−G_j} dS_c v_j``;
    - ``dw_i = −S_c dv_i``;
    - ``dG_i = q_i·dq_i − k_i·dk_i``, plus at the chunk's last valid position
      ``e^{Γ_c}·⟨S_c, dS_c⟩ + Σ_j k_j·(e^{Γ_c−G_j} dS_c v_j)``;

    all per value head; the returned ``dq``, ``dk`` are summed over the value heads sharing a q/k head
    (in a fixed order inside one program: deterministic, no atomics).

    Args:
        q, k: ``[B, T, H, K]``, ``K <= 256``; fp32/fp16/bf16, any strides.
        v: ``v_new [B, T, HV, V]`` from ``chunk_gated_delta_rule_fwd_h``; ``HV % H == 0`` (GVA).
        do: ``[B, T, HV, V]`` gradient of ``o``.
        h: ``[B, NT, HV, K, V]`` states entering each chunk; dh: same shape, gradients w.r.t. the states
            leaving each chunk (``chunk_gated_delta_rule_bwd_dhu``); varlen: flattened chunk list.
        g: ``[B, T, HV]`` chunk-local cumsum ``G`` (natural log), or None (no decay, ``dg`` is None).
        dv: ``dv2 [B, T, HV, V]`` from ``chunk_gated_delta_rule_bwd_dhu``, or None.
        w: ``[B, T, HV, K]`` from ``recompute_w_u_fwd``, or None; ``dw`` is computed iff ``w`` and ``dv``
            are both given.
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``); tail gradients are 0.
        chunk_size: ``BT ∈ {16, 32, 64}``.
        scale: None means ``K ** -0.5`` (the MindSpeed precursor defaulted to 1.0: pass it explicitly).
        chunk_indices: optional precomputed ``[NT, 2]`` table (``prepare_chunk_indices``), trusted.

    Returns:
        ``(dq [B, T, H, K], dk [B, T, H, K], dw [B, T, HV, K] or None, dg [B, T, HV] or None)``, all fp32.

    Raises:
        ValueError: ranks/shapes (``h``/``dh`` must match ``NT`` of ``chunk_size`` and ``cu_seqlens``),
            ``HV % H != 0``, ``K > 256``, ``chunk_size``, ``scale``, ``cu_seqlens``, ``chunk_indices``
            shape, devices.
        TypeError: non-float tensors (float64 is reference-only).

    Source: Yang et al., Gated Delta Networks (ICLR 2025), chunked backward.
    """
    cu_host = check_args(q, k, v, do, h, dh, g, dv, w, scale, chunk_size, cu_seqlens)
    if not use_triton(q.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            if chunk_indices is not None:
                chunk_table(OP, cu_host, cu_seqlens, q.shape[0], q.shape[1], chunk_size, chunk_indices)
            return _ref.chunk_bwd_dqkwg_ref(q, k, v, do, h, dh, g, dv, w, cu_seqlens, chunk_size, scale)
    return forward(q, k, v, do, h, dh, g, dv, w, scale, cu_host, cu_seqlens, chunk_size, chunk_indices)


def _configs():
    import triton

    return [triton.Config({"BV": bv}, num_warps=8, num_stages=ns) for bv, ns in ((64, 2), (32, 2), (64, 3), (32, 3))]


def _prune(configs, named_args, **kwargs):
    """V tiles as the other chunk launchers, then only the widest left: dq, dk and dg sum one product per V tile,
    so the tile sets their summation order, and a timing-based choice could round differently in another process
    (SPEC 0.6: bitwise run to run; BV 64 was also the fastest at K = V = 128 on the H200). Only the stages stay
    tuned, which keep the order. The warp count is fixed at 8: it sets the layout of dg's row sums, whose order
    differs between 4 and 8 warps (H200, K = V = 64: tests/unit_tests/core/test_autotune_bits.py), and with a
    128-wide K block 4 warps gave wrong results on triton 3.6 (BV 32, 3 stages: rel-RMS 7e-3)."""
    kept = prune_v_tiles(configs, named_args, **kwargs)
    widest = max(c.kwargs["BV"] for c in kept)
    return [c for c in kept if c.kwargs["BV"] == widest]


_KERNEL = None


def _kernel():
    """The dqkwg kernel under a small autotuner over the stages (one V tile and 8 warps per shape: ``_prune``)."""
    global _KERNEL
    if _KERNEL is None:
        from .triton_bwd import chunk_bwd_dqkwg_kernel

        _KERNEL = tu.autotune(_configs(), key=["H", "GQ", "K", "V", "BT", "USE_G", "HAS_DW", "IS_VARLEN", "BK",
                                                 "NORM_DQ"],
                              prune_configs_by={"early_config_prune": _prune})(chunk_bwd_dqkwg_kernel)
    return _KERNEL


def block_k(K: int, dtype: torch.dtype) -> int:
    """K-block of one program: at least 16 (``tl.dot``). fp16/bf16 with ``64 < K <= 128``: the whole K in
    one block (each program then computes its chunk's ``do vᵀ`` once, not per block: 464 µs vs 511 µs at
    the best 64-wide configuration, B1 T8192 H16 HV32 K=V=128 on the H200, benchmarks/tune_gdn_bwd.py);
    otherwise at most 64 (fp32 products run on the FMA units with larger register tiles)."""
    b = max(16, tu.next_power_of_2(K))
    if b == 128 and dtype in (torch.float16, torch.bfloat16):
        return 128
    return min(64, b)


def folds_q_norm(q: torch.Tensor) -> bool:
    """Whether :func:`forward` can take ``q_rstd`` for this ``q``: one program holds a row's whole K."""
    K = q.shape[-1]
    return block_k(K, tu.kernel_dtype(q.dtype)) >= K


def forward(q, k, v, do, h, dh, g, dv, w, scale, cu_host, cu_seqlens, chunk_size, chunk_indices=None,
            dw_dtype=torch.float32, q_rstd=None):
    """Triton launch (arguments already validated). ``dw_dtype``: the GDN pipeline asks for k's dtype, the
    operand dtype its only consumer (wy's backward) rounds dw to before every product anyway: half the
    bytes written and read, the same result. ``q_rstd`` (``[B, T, H]`` fp32, only where
    :func:`folds_q_norm`): ``q`` is the l2-normalized ``q̂ = q_raw·q_rstd`` and the returned ``dq`` is the
    gradient of ``q_raw`` in q's dtype (the l2norm backward applied in the kernel, ``l2norm.backward``'s
    formula with ``normalized=True``), not the fp32 gradient of ``q̂``."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    dev = q.device
    NT, cu, idx = chunk_table(OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, dev)
    qq, kk, vv, oo, hh, dhh = (unit_last_stride(tu.kernel_input(t)) for t in (q, k, v, do, h, dh))
    gg, uu = (unit_last_stride(tu.kernel_input(t)) for t in (g, dv))
    has_dw = w is not None and dv is not None
    BK = block_k(K, qq.dtype)
    NKB = tu.cdiv(K, BK)
    assert q_rstd is None or NKB == 1, "q_rstd needs one K-block (folds_q_norm)"
    dq = torch.empty(B, T, H, K, dtype=torch.float32 if q_rstd is None else tu.kernel_dtype(q.dtype), device=dev)
    dk = torch.empty(B, T, H, K, dtype=torch.float32, device=dev)
    dw = torch.empty(B, T, HV, K, dtype=dw_dtype, device=dev) if has_dw else None
    dg = torch.empty(B, T, HV, dtype=torch.float32, device=dev) if g is not None else None
    # dg parts (two phases x K-blocks), summed with torch (deterministic)
    dg_part = None if dg is None else torch.empty(2 * NKB, B, T, HV, dtype=torch.float32, device=dev)
    if cu_host is not None and cu_host[-1] < T:  # tail tokens: never written by the kernel
        end = cu_host[-1]
        for t in (dq, dk, dw, dg):
            if t is not None:
                t[:, end:].zero_()
        if dg_part is not None:
            dg_part[:, :, end:].zero_()
    if NT and B and H and K:
        dummy = qq
        z3 = (0, 0, 0)
        grid = (NT * B * H * NKB * 2,)
        r_ptr, *sr = row_factor_args(q_rstd, dummy)
        _kernel()[grid](
            qq, kk, vv, oo, hh, dhh, dummy if gg is None else gg, dummy if (uu is None or not has_dw) else uu,
            dq, dk, dummy if dw is None else dw, dummy if dg_part is None else dg_part,
            dummy if cu is None else cu, dummy if idx is None else idx, r_ptr,
            T, B, H, HV // H, K, V, float(K ** -0.5 if scale is None else scale),
            *qq.stride()[:3], *kk.stride()[:3], *vv.stride()[:3], *oo.stride()[:3], *hh.stride()[:4],
            *dhh.stride()[:4], *(gg.stride() if gg is not None else z3),
            *(uu.stride()[:3] if (uu is not None and has_dw) else z3), *dq.stride()[:3],
            *(dw.stride()[:3] if dw is not None else z3), *(dg_part.stride() if dg_part is not None else (0, 0, 0, 0)),
            *sr,
            BT=BT, BK=BK, USE_G=g is not None, HAS_DW=has_dw, IS_VARLEN=idx is not None, NORM_DQ=q_rstd is not None)
        if dg is not None:
            torch.sum(dg_part, 0, out=dg)
    elif dg is not None:
        dg.zero_()  # no key channels (K = 0) or nothing but tail tokens
    if q_rstd is not None:
        dq = tu.finish(dq, q.dtype)
    return dq, dk, dw, dg

