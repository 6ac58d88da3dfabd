"""``fused_recurrent_gated_delta_rule`` (SPEC 1.10.11): checks, launcher, op registration and the public
function of the recurrent (decode) gated delta rule.

Forward only: registered as ``torch.ops.mindspeed_ops.fused_recurrent_gated_delta_rule`` (fake function,
so ``torch.compile(fullgraph=True)`` traces through) with an autograd formula whose backward raises
``NotImplementedError`` naming ``chunk_gated_delta_rule``, the trainable operator. The raise happens
when the backward runs (inside the ``..._bwd`` op), not when a graph is traced, so compiling a
forward whose inputs happen to require grad still works.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ... import triton_utils as tu
from ..common import call_op, eager_autograd, unit_last_stride
from . import args as _args
from . import reference as _ref

OP = "fused_recurrent_gated_delta_rule"
def check_args(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu=None) -> tuple[int, int]:
    """Validate without reading device values (also on fake tensors); returns ``(N, HV)``."""
    return _args.check_args(OP, q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)


def _host_cu(q, cu_seqlens, cu_seqlens_cpu) -> Optional[list]:
    return _args.host_cu(OP, q, cu_seqlens, cu_seqlens_cpu)


def _tiles(K: int, V: int) -> tuple[int, int, int]:
    """``(BK, BV, warps)``: the whole K in one block, V tiles keeping ~4K fp32 state values a program."""
    bk = tu.next_power_of_2(K)
    bv = min(tu.next_power_of_2(V), max(16, 4096 // bk))
    return bk, bv, max(1, min(4, bk * bv // 1024))


def forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
            cu_seqlens_cpu=None):
    """Triton launch; returns ``(o, final_state or None)``."""
    from .triton_recurrent import fused_recurrent_gdr_fwd_kernel

    cu_host = _host_cu(q, cu_seqlens, cu_seqlens_cpu)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_host is None else len(cu_host) - 1
    dev = q.device
    qq, kk, vv = (unit_last_stride(tu.kernel_input(t)) for t in (q, k, v))
    gg, bb, h0 = (tu.kernel_input(t) for t in (g, beta, initial_state))
    h0 = unit_last_stride(h0)
    o = torch.empty(B, T, HV, V, dtype=tu.kernel_dtype(q.dtype), device=dev)
    if cu_host is not None and cu_host[-1] < T:
        o[:, cu_host[-1]:].zero_()  # tail tokens
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev) if output_final_state else None
    cu = None if cu_host is None else torch.tensor(cu_host, dtype=torch.int64, device=dev)
    if N and HV and V:
        BK, BV, warps = _tiles(K, V)
        z3 = (0, 0, 0)
        dummy = qq
        fused_recurrent_gdr_fwd_kernel[(N * HV * tu.cdiv(V, BV),)](
            qq, kk, vv, dummy if gg is None else gg, bb, dummy if h0 is None else h0, o,
            dummy if ht is None else ht, dummy if cu is None else cu,
            T, HV, HV // H, K, V, float(scale),
            *qq.stride()[:3], *kk.stride()[:3], *vv.stride()[:3], *(gg.stride() if gg is not None else z3),
            *bb.stride(), *(h0.stride()[:3] if h0 is not None else z3), *o.stride()[:3],
            *(ht.stride()[:3] if ht is not None else z3),
            BK=BK, BV=BV, USE_G=g is not None, HAS_H0=h0 is not None, STORE_FINAL=ht is not None,
            L2NORM=bool(use_qk_l2norm_in_kernel), IS_VARLEN=cu is not None, num_warps=warps)
    elif ht is not None:
        ht.copy_(initial_state) if initial_state is not None else ht.zero_()
    return tu.finish(o, q.dtype), ht


def _reference(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
               cu_seqlens_cpu=None):
    """The ``reference`` backend: the recurrence of SPEC 1.10.0 in fp32 (token by token)."""
    cu_host = _host_cu(q, cu_seqlens, cu_seqlens_cpu)
    cu = None if cu_host is None else torch.tensor(cu_host, dtype=torch.int64)
    return _ref.recurrent_gated_delta_rule_ref(q, k, v, g, beta, scale, initial_state, output_final_state,
                                               use_qk_l2norm_in_kernel, cu)


backends.register(OP, "triton", forward=forward)
backends.register(OP, "reference", forward=_reference)


# ------------------------------------------------------------------------------------------------
# torch.library registration
# ------------------------------------------------------------------------------------------------

def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0, dtype=torch.float32)


@torch.library.custom_op(f"mindspeed_ops::{OP}", mutates_args=())
def fused_recurrent_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                       beta: torch.Tensor, scale: float, initial_state: Optional[torch.Tensor],
                       output_final_state: bool, use_qk_l2norm_in_kernel: bool, cu_seqlens: Optional[torch.Tensor],
                       cu_seqlens_cpu: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    check_args(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu)
    impl = backends.implementation(OP, q.device)
    o, fs = impl.forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                         cu_seqlens, cu_seqlens_cpu)
    return o, (fs if fs is not None else _empty(q))


@fused_recurrent_op.register_fake
def _(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
      cu_seqlens_cpu):
    N, HV = check_args(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu)
    B, T, _, K = q.shape
    V = v.shape[3]
    fs = q.new_empty(N, HV, K, V, dtype=torch.float32) if output_final_state else _empty(q)
    return q.new_empty(B, T, HV, V), fs


BACKWARD_ERROR = (f"{OP} is forward-only (decode); train with chunk_gated_delta_rule "
                  "(mindspeed_ops.api.chunk_gated_delta_rule), which has the same arguments and math")


@torch.library.custom_op(f"mindspeed_ops::{OP}_bwd", mutates_args=())
def fused_recurrent_bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError(BACKWARD_ERROR)


@fused_recurrent_bwd_op.register_fake
def _(do, q, k, v, beta):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)


def _setup(ctx, inputs, output):
    q, k, v, g, beta, _, initial_state = inputs[:7]
    ctx.save_for_backward(q, k, v, beta)
    ctx.has_g, ctx.has_h0 = g is not None, initial_state is not None
    ctx.g_like = None if g is None else (g.shape, g.dtype)
    ctx.h0_like = None if initial_state is None else (initial_state.shape, initial_state.dtype)


def _backward(ctx, do, dfs):
    q, k, v, beta = ctx.saved_tensors
    dq, dk, dv, dbeta = call_op(ctx, fused_recurrent_bwd_op, do, q, k, v, beta)  # raises when it runs
    dg = None if ctx.g_like is None else dbeta.new_zeros(ctx.g_like[0], dtype=ctx.g_like[1])
    dh0 = None if ctx.h0_like is None else dbeta.new_zeros(ctx.h0_like[0], dtype=ctx.h0_like[1])
    return dq, dk, dv, dg, dbeta, None, dh0, None, None, None, None


fused_recurrent_op.register_autograd(_backward, setup_context=_setup)
_fused_recurrent = eager_autograd(fused_recurrent_op, _setup, _backward)


def fused_recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                                     beta: torch.Tensor, scale: Optional[float] = None,
                                     initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                                     use_qk_l2norm_in_kernel: bool = False,
                                     cu_seqlens: Optional[torch.Tensor] = None, **kwargs):
    """Recurrent gated delta rule for decode and very short chunks (SPEC 1.10.11): the recurrence of
    SPEC 1.10.0 token by token in one kernel, the state in fp32 registers. Forward only.

    Per sequence n and value head h (q/k head ``h // (HV/H)``), ``S ← initial_state[n, h]`` or 0, per token:
    ``S ← e^{g_t} S``; ``e_t = v_t − Sᵀ k̂_t``; ``S ← S + β_t k̂_t e_tᵀ``; ``o_t = scale · Sᵀ q̂_t``
    (``q̂, k̂`` = ``x / sqrt(Σx² + 1e-6)`` when ``use_qk_l2norm_in_kernel``, else q, k).

    Args:
        q, k: ``[B, T, H, K]`` (``K <= 256``), v: ``[B, T, HV, V]``; one dtype among fp32/fp16/bf16,
            any strides; ``HV % H == 0`` (GVA).
        g: ``[B, T, HV]`` raw natural-log decay (any float), or None (no decay).
        beta: ``[B, T, HV]`` (rank 3 exactly), any float, used as given (no sigmoid).
        scale: None means ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` any float (used in fp32), or None (zeros).
        output_final_state: also return the state after each sequence's last token.
        use_qk_l2norm_in_kernel: normalise q and k as above.
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``); tail tokens are never read
            and give ``o = 0``.
        **kwargs: SPEC 1.10.10 keyword policy: ``head_first=True`` raises ``ValueError``;
            ``cu_seqlens_cpu`` (host copy of ``cu_seqlens``, saves a sync; validated as in
            ``chunk_gated_delta_rule``), ``chunk_indices``, ``use_graph``, ``max_num_seqs`` accepted;
            ``use_gate_in_kernel``, ``A_log``, ``dt_bias``, ``use_beta_sigmoid_in_kernel``,
            ``allow_neg_eigval``, ``state_v_first``, ``transpose_state_layout``, ``cp_context``,
            ``return_intermediate_states`` raise ``NotImplementedError`` when set; anything else is
            ignored with a one-time warning.

    Returns:
        ``(o [B, T, HV, V] in q.dtype, final_state [N, HV, K, V] fp32 or None)``.

    Raises:
        ValueError: shapes/ranks, ``HV % H``, ``K > 256``, ``cu_seqlens`` (``B != 1``, malformed),
            ``initial_state`` shape, devices, ``head_first=True``.
        TypeError: q/k/v dtypes differ, non-float inputs (float64 is reference-only).
        NotImplementedError: from ``backward()`` (train with ``chunk_gated_delta_rule``), and for the
            unsupported keywords above.

    Source: Yang, Kautz, Hatamizadeh, Gated Delta Networks (ICLR 2025); Qwen3-Next decode path.
    """
    cu_seqlens, cu_cpu = _args.cu_seqlens_hint(OP, cu_seqlens, _args.kwargs_policy(OP, kwargs))
    check_args(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_cpu)
    sc = float(_args.default_scale(OP, q, scale))
    o, fs = _fused_recurrent(q, k, v, g, beta, sc, initial_state, bool(output_final_state),
                             bool(use_qk_l2norm_in_kernel), cu_seqlens, cu_cpu)
    return o, (fs if output_final_state else None)
