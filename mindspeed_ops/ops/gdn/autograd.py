"""Autograd and ``torch.library`` registration of ``chunk_gated_delta_rule`` (SPEC 1.10.10), following
the family pattern of ``ops/activation/autograd.py``: a forward op and a ``_bwd`` op with fake
functions, backends chosen per device, and the eager fast path of ``common.eager_autograd``.

The forward op also returns ``G`` (chunk-local gate cumsum) and ``Ainv`` so the backward does not
recompute them (SPEC 1.10.10: saved tensors are the inputs, ``G``, ``Ainv`` and ``h0``). With the in-kernel
l2norm it returns the normalized ``q̂, k̂`` and their fp32 rstd as well, and those are saved in place of the
raw q and k, so the backward does not normalize q and k again (where that costs no memory: :mod:`.qk_norm`).
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ..common import call_op, contiguous_as, eager_autograd, empty_contiguous_like, reference_vjp
from . import args as _args
from . import chunk as _chunk
from . import qk_norm as _qk_norm
from . import reference as _ref

OP = "chunk_gated_delta_rule"


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0)


def _aux_shapes(q, v, g, chunk_size):
    B, T = q.shape[:2]
    HV = v.shape[2]
    return (B, T, HV), (B, T, HV, chunk_size)


def _reference_forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_l2, cu_seqlens, cu_host,
                       chunk_size, return_qk_norm=True):
    o, final = _ref.chunk_gated_delta_rule_ref(q, k, v, g, beta, scale, initial_state, output_final_state, use_l2,
                                               cu_seqlens, chunk_size)
    # G / Ainv as the Triton backend returns them (same op outputs on every backend)
    G = None if g is None else _ref.chunk_local_cumsum_ref(g, chunk_size, cu_seqlens=cu_seqlens)
    qk = _qk_norm.normalize_reference(q, k, _chunk.L2_EPS) if use_l2 else (None,) * 4
    A = _ref.chunk_scaled_dot_kkt_ref(k if qk[1] is None else qk[1], G, beta, cu_seqlens, chunk_size)
    return (o, final, G, _ref.solve_tril_ref(A, cu_seqlens, output_dtype=k.dtype),
            *(qk if return_qk_norm else (None,) * 4))


def _reference_backward(do, dht, q, k, v, g, beta, G, Ainv, initial_state, scale, use_l2, cu_seqlens, cu_host,
                        chunk_size, q_rstd=None, k_rstd=None):
    """Autograd of the chunked reference (``G``/``Ainv`` recomputed inside; reads ``cu_seqlens`` itself).
    Given the forward's rstd, ``q``/``k`` are its ``q̂``/``k̂``: autograd without the l2norm, then its
    closed-form backward (the exact chain rule: ``dx = rstd·(dŷ − ŷ·Σ dŷ·ŷ)``)."""
    if use_l2 and q_rstd is not None:
        return _qk_norm.through_norm(_reference_backward(do, dht, q, k, v, g, beta, G, Ainv, initial_state, scale,
                                                         False, cu_seqlens, cu_host, chunk_size),
                                     q, k, q_rstd, k_rstd, cu_host)
    want_final = dht is not None
    empty = _ref.no_token_grads(q, k, v, g, beta, initial_state, dht, cu_seqlens)
    if empty is not None:  # nothing processed: autograd would record no graph
        return empty

    def fn(q_, k_, v_, g_, b_, h0_):
        o, final = _ref.chunk_gated_delta_rule_ref(q_, k_, v_, g_, b_, scale, h0_, want_final, use_l2, cu_seqlens,
                                                   chunk_size)
        return (o, final) if want_final else o
    return tuple(reference_vjp(fn, (q, k, v, g, beta, initial_state), (do, dht) if want_final else do))


backends.register(OP, "triton", forward=_chunk.forward, backward=_chunk.backward)
backends.register(OP, "reference", forward=_reference_forward, backward=_reference_backward)


@torch.library.custom_op("mindspeed_ops::chunk_gated_delta_rule", mutates_args=())
def chunk_gdr_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], beta: torch.Tensor,
                 scale: float, initial_state: Optional[torch.Tensor], output_final_state: bool,
                 use_qk_l2norm_in_kernel: bool, cu_seqlens: Optional[torch.Tensor], chunk_size: int,
                 cu_seqlens_cpu: Optional[torch.Tensor] = None, return_qk_norm: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                            torch.Tensor, torch.Tensor]:
    """Returns ``(o, final_state, G, Ainv, qn, kn, q_rstd, k_rstd)``; absent ones are empty tensors (the last four
    unless ``use_qk_l2norm_in_kernel`` and ``return_qk_norm``: then ``qn, kn`` ``[B, T, H, K]`` in q's dtype,
    ``q_rstd, k_rstd`` ``[B, T, H]`` fp32, what ``chunk_gated_delta_rule_bwd`` takes in place of the raw q and k;
    ``return_qk_norm=False`` spares a forward-only call their write)."""
    _args.check_args(OP, q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_size,
                     cu_seqlens_cpu=cu_seqlens_cpu)
    cu_host = _args.host_cu(OP, q, cu_seqlens, cu_seqlens_cpu)  # no read of cu_seqlens when the hint is given
    impl = backends.implementation(OP, q.device)
    outs = impl.forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                        cu_seqlens, cu_host, chunk_size, return_qk_norm)
    # contiguous like the fake (the reference backend follows the inputs' layout)
    return tuple(_empty(outs[0]) if t is None else t.contiguous() for t in outs)


@chunk_gdr_op.register_fake
def _(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, chunk_size,
      cu_seqlens_cpu=None, return_qk_norm=True):
    N, HV = _args.check_args(OP, q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_size,
                             cu_seqlens_cpu=cu_seqlens_cpu)
    B, T, _, K = q.shape
    V = v.shape[3]
    o = q.new_empty(B, T, HV, V)
    final = q.new_empty(N, HV, K, V, dtype=torch.float32) if output_final_state else q.new_empty(0)
    # the fake follows the Triton backend (the one torch.compile runs on GPU)
    G = q.new_empty(B, T, HV, dtype=torch.float32) if g is not None else q.new_empty(0)
    Ainv = q.new_empty(B, T, HV, chunk_size)
    return o, final, G, Ainv, *_qk_norm.fake(q, _qk_norm.wanted(use_qk_l2norm_in_kernel, return_qk_norm))


@torch.library.custom_op("mindspeed_ops::chunk_gated_delta_rule_bwd", mutates_args=())
def chunk_gdr_bwd_op(do: torch.Tensor, dht: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, g: Optional[torch.Tensor], beta: torch.Tensor, G: torch.Tensor,
                     Ainv: torch.Tensor, initial_state: Optional[torch.Tensor], scale: float,
                     use_qk_l2norm_in_kernel: bool, cu_seqlens: Optional[torch.Tensor], chunk_size: int,
                     cu_seqlens_cpu: Optional[torch.Tensor] = None, q_rstd: Optional[torch.Tensor] = None,
                     k_rstd: Optional[torch.Tensor] = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv, dg, dbeta, dh0)`` (absent ones empty). With ``q_rstd``/``k_rstd`` (the forward op's,
    ``use_qk_l2norm_in_kernel`` only), ``q``/``k`` are the forward op's normalized ``qn``/``kn``, not the raw
    inputs; without them the raw q/k, normalized again here."""
    _args.check_qk_rstd(f"{OP}_bwd", q, k, q_rstd, k_rstd, use_qk_l2norm_in_kernel)
    cu_host = _args.host_cu(OP, q, cu_seqlens, cu_seqlens_cpu)
    impl = backends.implementation(OP, q.device)
    dq, dk, dv, dg, dbeta, dh0 = impl.backward(do, dht, q, k, v, g, beta, G, Ainv, initial_state, scale,
                                               use_qk_l2norm_in_kernel, cu_seqlens, cu_host, chunk_size,
                                               q_rstd, k_rstd)
    # one fresh placeholder per absent gradient: a custom op's returns may not alias each other;
    # contiguous like the fake whatever the inputs' layout (see contiguous_as)
    return (contiguous_as(dq, q.dtype), contiguous_as(dk, k.dtype), contiguous_as(dv, v.dtype),
            _empty(q) if dg is None else contiguous_as(dg, g.dtype), contiguous_as(dbeta, beta.dtype),
            _empty(q) if dh0 is None else contiguous_as(dh0, initial_state.dtype))


@chunk_gdr_bwd_op.register_fake
def _(do, dht, q, k, v, g, beta, G, Ainv, initial_state, scale, use_qk_l2norm_in_kernel, cu_seqlens, chunk_size,
      cu_seqlens_cpu=None, q_rstd=None, k_rstd=None):
    _args.check_cu_seqlens_cpu(OP, cu_seqlens, cu_seqlens_cpu)
    _args.check_qk_rstd(f"{OP}_bwd", q, k, q_rstd, k_rstd, use_qk_l2norm_in_kernel)
    like = empty_contiguous_like
    return (like(q), like(k), like(v), q.new_empty(0) if g is None else like(g), like(beta),
            q.new_empty(0) if initial_state is None else like(initial_state))


def _setup(ctx, inputs, output):
    q, k, v, g, beta, scale, h0, output_final_state, use_l2, cu_seqlens, chunk_size = inputs[:11]
    cu_cpu = inputs[11] if len(inputs) > 11 else None  # eager callers may leave the defaulted hint out
    want_qk = _qk_norm.wanted(use_l2, inputs[12] if len(inputs) > 12 else True)
    _, _, G, Ainv, *qk = output
    # outputs kept only for backward: not differentiable, and no zero gradient tensors filled for them
    ctx.mark_non_differentiable(G, Ainv, *qk)
    ctx.set_materialize_grads(False)
    ctx.scale, ctx.use_l2, ctx.chunk_size, ctx.has_final = scale, use_l2, chunk_size, output_final_state
    ctx.has_g, ctx.has_h0 = g is not None, h0 is not None
    q, k, q_rstd, k_rstd = _qk_norm.saved(q, k, qk, want_qk)  # the normalized q and k in place of the raw ones
    ctx.save_for_backward(q, k, v, g, beta, G, Ainv, h0, cu_seqlens, cu_cpu, q_rstd, k_rstd)


def _backward(ctx, do, dfinal, dG, dAinv, *d_qk_norm):
    q, k, v, g, beta, G, Ainv, h0, cu_seqlens, cu_cpu, q_rstd, k_rstd = ctx.saved_tensors
    dht = dfinal if ctx.has_final and dfinal is not None else None
    if do is None:
        do = torch.zeros(*q.shape[:2], *v.shape[2:], dtype=q.dtype, device=q.device)
    dq, dk, dv, dg, dbeta, dh0 = call_op(ctx, chunk_gdr_bwd_op, do, dht, q, k, v, g, beta, G, Ainv, h0, ctx.scale,
                                         ctx.use_l2, cu_seqlens, ctx.chunk_size, cu_cpu, q_rstd, k_rstd)
    return (dq, dk, dv, dg if ctx.has_g else None, dbeta, None, dh0 if ctx.has_h0 else None, None, None, None, None,
            None, None)


chunk_gdr_op.register_autograd(_backward, setup_context=_setup)
_chunk_gdr = eager_autograd(chunk_gdr_op, _setup, _backward)


class ChunkGatedDeltaRuleFunction:
    """MindSpeed/fla-style entry: ``ChunkGatedDeltaRuleFunction.apply(q, k, v, g, beta, scale, initial_state,
    output_final_state, use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=64)`` -> ``(o, final_state)``."""

    @staticmethod
    def apply(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=64):
        return chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
                                      use_qk_l2norm_in_kernel, cu_seqlens, chunk_size)


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                           beta: torch.Tensor, scale: Optional[float] = None,
                           initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                           use_qk_l2norm_in_kernel: bool = False, cu_seqlens: Optional[torch.Tensor] = None,
                           chunk_size: int = 64, **kwargs):
    """Chunked gated delta rule of Qwen3-Next / Qwen3.5 linear attention, forward and backward (SPEC 1.10.10).

    Per sequence and value head, with state ``S ∈ R^{K×V}`` (fp32): ``S ← e^{g_t} S``;
    ``S ← S + β_t k_t (v_t − Sᵀk_t)ᵀ``; ``o_t = scale · Sᵀ q_t`` — computed chunk by chunk in the
    WY/UT form (SPEC 1.10.0) by the stage kernels of this family.

    Args:
        q, k: ``[B, T, H, K]``, ``K <= 256``; v: ``[B, T, HV, V]`` (``HV`` a multiple of ``H``: grouped value
            heads, value head ``i`` reads q/k head ``i // (HV/H)``); same dtype fp32/fp16/bf16.
        g: ``[B, T, HV]`` raw log-decay gates (natural log, usually ``<= 0``), any float dtype; ``None`` = no decay.
        beta: ``[B, T, HV]`` update strengths, used as given (no sigmoid).
        scale: output scale; ``None`` = ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` (``N`` = B, or the number of sequences with ``cu_seqlens``), used in fp32.
        output_final_state: also return the final states.
        use_qk_l2norm_in_kernel: L2-normalise q and k first (``x / sqrt(Σx² + 1e-6)``), gradients included.
        cu_seqlens: ``[N+1]`` int32/int64 packed-sequence offsets (then ``B == 1``); tokens past
            ``cu_seqlens[-1]`` get ``o = 0``.
        chunk_size: 16, 32 or 64.
        **kwargs: fla/MindSpeed keyword policy (SPEC 1.10.10): ``head_first=True`` raises ``ValueError``;
            ``cu_seqlens_cpu``, ``chunk_indices``, ``use_graph``, ``max_num_seqs`` are accepted hints; the
            unimplemented options (``use_gate_in_kernel``, ``A_log``, ...) raise ``NotImplementedError``
            when set; anything else is ignored with a one-time warning.
            ``cu_seqlens_cpu``: a host (CPU) copy of ``cu_seqlens``; with it the forward and the backward
            never read ``cu_seqlens`` back to the host (no device->host sync). It must be a 1-D int32/int64
            CPU tensor with as many entries as ``cu_seqlens`` (``TypeError``/``ValueError`` otherwise), and
            its values are validated like ``cu_seqlens``' and used by the Triton launchers; that they
            equal ``cu_seqlens``' is trusted (not checked: that would be the sync). Given without
            ``cu_seqlens`` it serves as the offsets. The reference backend reads ``cu_seqlens`` itself.

    Returns:
        ``(o [B, T, HV, V] in q.dtype, final_state [N, HV, K, V] fp32 or None)``.

    Gradients: q, k, v, g (when given), beta, initial_state (when given); the gradient of
    ``final_state`` is consumed.

    Raises:
        ValueError: shapes (q/k mismatch, ``HV % H``, beta/g, ``K > 256``, initial_state), chunk_size,
            varlen with ``B != 1``, devices. TypeError: q/k/v dtypes differ, integer inputs.

    Source: Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule" (ICLR 2025),
    eq. (10) and the chunkwise WY form; Qwen3-Next model code.
    """
    cu_seqlens, cu_cpu = _args.cu_seqlens_hint(OP, cu_seqlens, _args.kwargs_policy(OP, kwargs))
    scale = _args.default_scale(OP, q, scale)
    chunk_size = _args.check_chunk_size(OP, chunk_size, _args.CHUNK_SIZES)  # before any cast: "64" is no int
    o, final, *_ = _chunk_gdr(q, k, v, g, beta, scale, initial_state, bool(output_final_state),
                              bool(use_qk_l2norm_in_kernel), cu_seqlens, chunk_size, cu_cpu,
                              _qk_norm.save_normalized(q, k, v, g, beta, initial_state))
    return o, (final if output_final_state else None)
