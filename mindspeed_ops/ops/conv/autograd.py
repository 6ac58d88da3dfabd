"""Autograd and ``torch.library`` registration of the convolution family (SPEC 1.9).

Ops (``torch.ops.mindspeed_ops.*``), each with a fake function:

- ``causal_conv1d(x, weight, bias, residual, initial_state, activation, cu_seqlens, output_final_state)
  -> (y, final_state)``; ``final_state`` is an empty placeholder when not asked for;
- ``causal_conv1d_bwd(dy, dfinal, x, weight, bias, initial_state, activation, cu_seqlens)
  -> (dx, dweight, dbias, dinitial_state)`` with empty placeholders for absent bias/state.

``dresidual`` is the incoming ``dy`` (returned by the autograd layer, never written to; in varlen mode
a copy with the tail rows zeroed).
``causal_conv1d_fn`` (channel-major) reuses the same op.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ...validation import (check_choice, check_cu_seqlens, check_same_device, check_tensor, reject_float64,
                           shape_str)
from ..common import call_op, eager_autograd, pin_backends, reference_vjp, run_op
from . import causal_conv1d as _launch
from . import reference as _ref

OP = "causal_conv1d"


def _ref_backward(dy, dfinal, x, weight, bias, initial_state, activation, cu_seqlens):
    grads = reference_vjp(_ref.causal_conv1d, (x, weight, bias, None, initial_state), (dy, dfinal), activation,
                          cu_seqlens, True)
    # fresh contiguous buffers: autograd through the reference's concatenation of initial_state and x
    # returns dx and dinitial_state as views of one buffer (outputs of a custom op may not alias)
    return tuple(None if t is None else t.clone(memory_format=torch.contiguous_format)
                 for t in (grads[0], grads[1], grads[2], grads[4]))


backends.register(OP, "triton", forward=_launch.forward, backward=_launch.backward)
backends.register(OP, "reference", forward=_ref.causal_conv1d, backward=_ref_backward)


def _empty(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return like.new_empty(0, dtype=dtype)


@torch.library.custom_op("mindspeed_ops::causal_conv1d", mutates_args=())
def causal_conv1d_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                     residual: Optional[torch.Tensor], initial_state: Optional[torch.Tensor],
                     activation: Optional[str], cu_seqlens: Optional[torch.Tensor],
                     output_final_state: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _launch.check_args(x, weight, bias, residual, initial_state, activation, cu_seqlens, output_final_state)
    impl = backends.implementation(OP, x.device)
    if impl.backend == "reference":  # the Triton launcher reads and checks the values itself (one host read)
        check_cu_seqlens(OP, cu_seqlens, batch=x.shape[0], total=x.shape[1])
    y, fs = impl.forward(x, weight, bias, residual, initial_state, activation, cu_seqlens, output_final_state)
    if fs is None:
        fs = _empty(x, x.dtype if initial_state is None else initial_state.dtype)
    return y.contiguous(), fs.contiguous()  # like the fake (the reference's final_state is a transposed view)


@causal_conv1d_op.register_fake
def _(x, weight, bias, residual, initial_state, activation, cu_seqlens, output_final_state):
    B, T, D, W, N = _launch.check_args(x, weight, bias, residual, initial_state, activation, cu_seqlens,
                                       output_final_state)
    fs_dtype = x.dtype if initial_state is None else initial_state.dtype
    fs = x.new_empty(N, D, W, dtype=fs_dtype) if output_final_state else _empty(x, fs_dtype)
    return torch.empty_like(x, memory_format=torch.contiguous_format), fs


@torch.library.custom_op("mindspeed_ops::causal_conv1d_bwd", mutates_args=())
def causal_conv1d_bwd_op(dy: torch.Tensor, dfinal: Optional[torch.Tensor], x: torch.Tensor, weight: torch.Tensor,
                         bias: Optional[torch.Tensor], initial_state: Optional[torch.Tensor],
                         activation: Optional[str], cu_seqlens: Optional[torch.Tensor]
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = backends.implementation(OP, x.device)
    dx, dw, db, ds = impl.backward(dy, dfinal, x, weight, bias, initial_state, activation, cu_seqlens)
    if db is None:
        db = _empty(x, x.dtype if bias is None else bias.dtype)
    if ds is None:
        ds = _empty(x, x.dtype if initial_state is None else initial_state.dtype)
    return dx, dw, db, ds


@causal_conv1d_bwd_op.register_fake
def _(dy, dfinal, x, weight, bias, initial_state, activation, cu_seqlens):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(weight, memory_format=torch.contiguous_format),
            _empty(x, x.dtype) if bias is None else torch.empty_like(bias, memory_format=torch.contiguous_format),
            _empty(x, x.dtype) if initial_state is None
            else torch.empty_like(initial_state, memory_format=torch.contiguous_format))


def _setup(ctx, inputs, output):
    x, weight, bias, residual, initial_state, activation, cu_seqlens, output_final_state = inputs
    ctx.save_for_backward(x, weight, bias, initial_state, cu_seqlens)
    ctx.activation = activation
    ctx.output_final_state = output_final_state
    ctx.residual_dtype = None if residual is None else residual.dtype


def _backward(ctx, dy, dfinal):
    x, weight, bias, initial_state, cu_seqlens = ctx.saved_tensors
    if not ctx.output_final_state:
        dfinal = None
    dx, dw, db, ds = call_op(ctx, causal_conv1d_bwd_op, dy, dfinal, x, weight, bias, initial_state, ctx.activation,
                             cu_seqlens)
    dres = None
    if ctx.residual_dtype is not None:
        dres = dy if dy.dtype == ctx.residual_dtype else dy.to(ctx.residual_dtype)
        if cu_seqlens is not None:  # tail tokens (at or after cu_seqlens[-1]) get no gradient
            live = torch.arange(dy.shape[1], device=dy.device) < cu_seqlens[-1].to(dy.device)
            dres = torch.where(live[None, :, None], dres, torch.zeros((), dtype=dres.dtype, device=dres.device))
    return (dx, dw, None if bias is None else db, dres, None if initial_state is None else ds, None, None, None)


causal_conv1d_op.register_autograd(_backward, setup_context=_setup)
_causal_conv1d = eager_autograd(causal_conv1d_op, _setup, _backward)


def _norm_activation(activation):
    return "silu" if activation == "swish" else activation


@pin_backends
class CausalConv1dFunction(torch.autograd.Function):
    """MindSpeed-compatible autograd Function: ``CausalConv1dFunction.apply(x, weight, bias, residual,
    initial_state, activation, cu_seqlens, output_final_state) -> (y, final_state or None)``; same
    arguments, kernels and gradients as :func:`causal_conv1d`."""

    @staticmethod
    def forward(ctx, x, weight, bias=None, residual=None, initial_state=None, activation=None, cu_seqlens=None,
                output_final_state=False):
        args = (x, weight, bias, residual, initial_state, _norm_activation(activation), cu_seqlens,
                bool(output_final_state))
        ctx.eager = not torch.compiler.is_compiling()
        y, fs = run_op(causal_conv1d_op, *args)
        _setup(ctx, args, (y, fs))
        return y, (fs if output_final_state else None)

    @staticmethod
    def backward(ctx, dy, dfinal):
        return _backward(ctx, dy, dfinal)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                  residual: Optional[torch.Tensor] = None, initial_state: Optional[torch.Tensor] = None,
                  activation: Optional[str] = None, cu_seqlens: Optional[torch.Tensor] = None,
                  output_final_state: bool = False):
    """Depthwise causal short convolution, token-major, forward and backward (SPEC 1.9.1).

    Per sequence ``n`` of length ``L`` (a batch row, or a packed segment with ``cu_seqlens``), with the
    extended input ``x̃_τ = initial_state[n, :, τ+W]`` for ``τ < 0`` (zeros without a state) and
    ``x̃_τ = x_τ`` for ``τ >= 0``: ``a_t = bias + Σ_j weight[j] ⊙ x̃_{t-W+1+j}``,
    ``y_t = act(a_t) + residual_t``, ``final_state[n, :, m] = x̃_{L-W+m}``. fp32 math, one rounding.

    Args:
        x: ``[B, T, D]`` fp32/fp16/bf16 (unit stride on D is read in place, other layouts are copied).
        weight: ``[W, D]``, ``1 <= W <= 8`` (an ``nn.Conv1d`` weight ``[D, 1, W]`` becomes
            ``weight.squeeze(1).t()``); any float dtype, any strides; ``weight[W-1]`` multiplies the
            current token.
        bias: ``[D]`` or None. residual: ``[B, T, D]`` or None, added after the activation.
        initial_state: ``[N, D, W]`` or None (slot 0 is read only into ``final_state`` when ``L = 0``).
        activation: None, ``'silu'`` or ``'swish'`` (the same).
        cu_seqlens: ``[N+1]`` int32/int64 packed-sequence offsets (``B`` must be 1; read on the host
            once). Tokens at or after ``cu_seqlens[-1]`` are never read; their ``y`` and ``dx`` are 0.
        output_final_state: also return ``final_state`` ``[N, D, W]`` (``initial_state.dtype`` if given,
            else ``x.dtype``; bitwise copies of the inputs when the dtypes agree).

    Returns:
        ``(y, final_state)``: ``y`` ``[B, T, D]`` in ``x.dtype``; ``final_state`` or None.

    Gradients: ``x``, ``weight``, ``bias``, ``residual`` (= ``dy``), ``initial_state``, including the
    upstream gradient of ``final_state``; ``dweight``/``dbias`` are fp32 sums (deterministic), returned
    in their dtypes.

    Raises:
        ValueError: wrong ranks/shapes (a ``[D, W]`` weight gets a hint to transpose), ``W`` outside
            [1, 8], unknown activation, bad ``cu_seqlens`` (``B != 1``, not starting at 0, decreasing,
            past ``T``), ``initial_state`` rows ``!= N``, tensors on different devices.
        TypeError: float64 or non-float tensors, non-integer ``cu_seqlens``.

    Source: the short convolution of Mamba (Gu & Dao, 2023) as used by GDN/KDA mixers (Qwen3-Next,
    Kimi-Linear); MindSpeed ``causal_conv1d`` signature.
    """
    y, fs = _causal_conv1d(x, weight, bias, residual, initial_state, _norm_activation(activation), cu_seqlens,
                           bool(output_final_state))
    return y, (fs if output_final_state else None)


OP_FN = "causal_conv1d_fn"


def _check_fn_args(x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, activation):
    reject_float64(OP_FN, x=x, weight=weight, bias=bias, initial_states=initial_states)
    check_tensor(OP_FN, "x", x, ndim=3)
    B, D, T = x.shape
    check_tensor(OP_FN, "weight", weight, ndim=2)
    W = weight.shape[1]
    if weight.shape[0] != D:
        raise ValueError(f"{OP_FN}: weight must have shape [D, W] = [{D}, W], got {shape_str(weight.shape)}")
    if not 1 <= W <= _launch.MAX_WIDTH:
        raise ValueError(f"{OP_FN}: the convolution width W = weight.shape[1] must be in [1, {_launch.MAX_WIDTH}], "
                         f"got {W}")
    if bias is not None:
        check_tensor(OP_FN, "bias", bias, shape=(D,), shape_desc="[D]")
    check_choice(OP_FN, "activation", activation, _launch.ACTIVATIONS)
    if initial_states is not None:
        check_tensor(OP_FN, "initial_states", initial_states, shape=(B, D, W - 1), shape_desc="[B, D, W-1]")
    if final_states_out is not None:
        check_tensor(OP_FN, "final_states_out", final_states_out, dtypes=(x.dtype,), shape=(B, D, W - 1),
                     shape_desc="[B, D, W-1]")
    if seq_idx is not None:
        check_tensor(OP_FN, "seq_idx", seq_idx, dtypes=(torch.int32, torch.int64), shape=(B, T), shape_desc="[B, T]")
        if initial_states is not None or return_final_states or final_states_out is not None:
            raise ValueError(f"{OP_FN}: seq_idx cannot be combined with initial_states or final states; use "
                             "causal_conv1d with cu_seqlens and [N, D, W] states")
    check_same_device(OP_FN, x=x, weight=weight, bias=bias, seq_idx=seq_idx, initial_states=initial_states,
                      final_states_out=final_states_out)


def _segments(seq_idx: torch.Tensor, W: int) -> Optional[torch.Tensor]:
    """cu_seqlens of the packed [B*T] row: a segment starts at every row start and wherever seq_idx changes.

    None when runs of equal consecutive ids do not give the SPEC's taps (``seq_idx[b, τ] == seq_idx[b, t]``):
    an id of a non-padding output reappears within the W-1 tap reach after another id (e.g.
    ``[0, 0, 1, 0]`` or ``[0, -1, 0]`` with W >= 3); the caller then takes the reference path."""
    B, T = seq_idx.shape
    flat = seq_idx.reshape(-1)
    start = torch.ones_like(flat, dtype=torch.bool)
    start[1:] = flat[1:] != flat[:-1]
    if T:  # (T = 0: no rows, no segments)
        start[::T] = True
    run = start.cumsum(0).reshape(B, T)
    bad = torch.zeros((), dtype=torch.bool, device=seq_idx.device)
    for k in range(2, min(W, T)):  # (a reach of 1 tap: equal ids are one run)
        t_id = seq_idx[:, k:]
        bad = bad | ((t_id >= 0) & (t_id == seq_idx[:, :-k]) & (run[:, k:] != run[:, :-k])).any()
    idx = torch.nonzero(start).flatten()  # (the host synchronisation; the check above joins it)
    if bool(bad):
        return None
    return torch.cat([idx, idx.new_tensor([B * T])])


def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     seq_idx: Optional[torch.Tensor] = None, initial_states: Optional[torch.Tensor] = None,
                     return_final_states: bool = False, final_states_out: Optional[torch.Tensor] = None,
                     activation: Optional[str] = None):
    """Channel-major depthwise causal convolution, the ``causal_conv1d`` package / HF call form (SPEC 1.9.2).

    ``out[b, :, t] = act(bias + Σ_w weight[:, w] ⊙ x[b, :, t-W+1+w])``, time ``τ < 0`` reading
    ``initial_states[b, :, τ+W-1]`` (zeros if absent): a grouped ``conv1d(x, weight[:, None], bias,
    padding=W-1, groups=D)[..., :T]`` followed by the activation. Runs :func:`causal_conv1d` on
    ``x.transpose(1, 2)`` with ``weight.t()`` and the states padded with one leading slot.

    Args:
        x: ``[B, D, T]`` fp32/fp16/bf16, any strides; channel-last memory (``xt.transpose(1, 2)`` of a
            contiguous ``[B, T, D]``) is read in place, other layouts are copied once.
        weight: ``[D, W]``, ``1 <= W <= 8``. bias: ``[D]`` or None.
        seq_idx: ``[B, T]`` int32 (int64 accepted): a tap from time ``τ`` counts only when
            ``seq_idx[b, τ] == seq_idx[b, t]``; positions with ``seq_idx < 0`` output 0. Runs of equal
            consecutive ids go to the kernels as packed segments; an id that reappears within a tap's
            reach after another id (not the usual monotone ``seq_idx``) takes the slow reference path.
        initial_states: ``[B, D, W-1]`` or None. return_final_states: also return ``final_states``
            ``[B, D, W-1]`` (the inputs at times ``T-W+1 .. T-1``, from ``initial_states`` when ``T < W-1``).
        final_states_out: ``[B, D, W-1]`` in ``x.dtype``, written in place and returned (implies
            ``return_final_states``); it stays connected to the autograd graph.
        activation: None, ``'silu'`` or ``'swish'``.

    Returns:
        ``out`` ``[B, D, T]`` in ``x.dtype`` (a transposed view of a ``[B, T, D]`` buffer), or
        ``(out, final_states)``.

    Gradients: ``x``, ``weight``, ``bias``, ``initial_states``; the gradient of ``final_states`` is accepted.

    Raises:
        ValueError: wrong shapes, ``W`` outside [1, 8], unknown activation, ``seq_idx`` combined with
            states. TypeError: float64 or non-float tensors, ``final_states_out`` not in ``x.dtype``.

    Source: Mamba (Gu & Dao, 2023) short convolution; ``causal_conv1d_fn`` of the causal-conv1d package,
    as called by HF Qwen3-Next / Qwen3.5 model code.
    """
    _check_fn_args(x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, activation)
    B, D, T = x.shape
    want_fs = bool(return_final_states or final_states_out is not None)
    xt, w = x.transpose(1, 2), weight.t()
    if seq_idx is None:
        init = None if initial_states is None else torch.nn.functional.pad(initial_states, (1, 0))
        y, fs = causal_conv1d(xt, w, bias, None, init, activation, None, want_fs)
    else:
        cu = _segments(seq_idx.to(x.device), weight.shape[1])
        if cu is None:  # ids reappear within a tap's reach: runs are not the SPEC's taps
            return _ref.causal_conv1d_fn(x, weight, bias, seq_idx, None, False, None, activation)
        y, _ = causal_conv1d(xt.reshape(1, B * T, D), w, bias, None, None, activation, cu, False)
        y = torch.where((seq_idx >= 0)[..., None], y.reshape(B, T, D), torch.zeros((), dtype=y.dtype, device=y.device))
    out = y.transpose(1, 2)
    if not want_fs:
        return out
    fs = fs[..., 1:]
    if final_states_out is not None:
        final_states_out.copy_(fs)
        fs = final_states_out
    return out, fs
