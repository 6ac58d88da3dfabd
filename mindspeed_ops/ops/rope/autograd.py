"""Autograd and ``torch.library`` registration of ``inplace_rope`` (SPEC 1.5).

An in-place op cannot follow the family pattern exactly: ``register_autograd`` is refused for custom ops
that mutate their inputs. So:

- ``mindspeed_ops::inplace_rope`` is a custom op with ``mutates_args=("x",)`` returning nothing; it
  rotates ``x``'s rope channels in place (by −θ when ``inverse``);
- ``mindspeed_ops::inplace_rope_bwd`` is a functional custom op: a new tensor holding the gradient
  rotated by the opposite angle (nope channels copied);
- :class:`InplaceRopeFunction` (a ``torch.autograd.Function``) calls the mutating op, marks ``x``
  dirty and returns ``x`` itself; its backward rotates the incoming gradient by the opposite angle,
  in place (the mutating op again, with ``inverse`` flipped) when allowed, else with the ``_bwd`` op.

``torch.compile(fullgraph=True)`` traces through the Function (Dynamo handles ``mark_dirty``; the
custom ops become ``auto_functionalized`` nodes, which Inductor re-inplaces), forward and backward.
Both op bodies ask :mod:`mindspeed_ops.backends` which implementation runs.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ..common import bump_version, call_op, pin_backends, run_op
from . import inplace_rope as _launch
from . import reference as _ref


def _reference_backward(dy, cos, sin, position_ids, inverse):
    # the vjp of a rotation is the rotation by the opposite angle
    return _ref.inplace_rope(dy.clone(memory_format=torch.contiguous_format), cos, sin, position_ids, not inverse)


backends.register("inplace_rope", "triton", forward=_launch.forward, backward=_launch.backward)
backends.register("inplace_rope", "reference", forward=_ref.inplace_rope, backward=_reference_backward)


@torch.library.custom_op("mindspeed_ops::inplace_rope", mutates_args=("x",))
def inplace_rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor],
                    inverse: bool) -> None:
    _launch.check_args(x, cos, sin, position_ids)
    backends.implementation("inplace_rope", x.device).forward(x, cos, sin, position_ids, inverse)


@inplace_rope_op.register_fake
def _(x, cos, sin, position_ids, inverse):
    _launch.check_args(x, cos, sin, position_ids)


@torch.library.custom_op("mindspeed_ops::inplace_rope_bwd", mutates_args=())
def inplace_rope_bwd_op(dy: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor],
                        inverse: bool) -> torch.Tensor:
    return backends.implementation("inplace_rope", dy.device).backward(dy, cos, sin, position_ids, inverse)


@inplace_rope_bwd_op.register_fake
def _(dy, cos, sin, position_ids, inverse):
    return dy.new_empty(dy.shape)


def _bwd_setup(ctx, inputs, output):
    _, cos, sin, position_ids, ctx.inverse = inputs
    ctx.save_for_backward(cos, sin, position_ids)


def _bwd_backward(ctx, ddx):
    # the backward is linear in dy (a rotation by the opposite angle): its own vjp is the forward rotation
    cos, sin, position_ids = ctx.saved_tensors
    return call_op(ctx, inplace_rope_bwd_op, ddx, cos, sin, position_ids, not ctx.inverse), None, None, None, None


inplace_rope_bwd_op.register_autograd(_bwd_backward, setup_context=_bwd_setup)


def _rotate_in_place(dy: torch.Tensor, inplace_backward: bool) -> bool:
    """Whether the backward may rotate the incoming gradient buffer itself (SPEC 1.5)."""
    return inplace_backward and not dy.requires_grad and _launch.non_overlapping(dy)


@pin_backends
class InplaceRopeFunction(torch.autograd.Function):
    """Autograd of :func:`inplace_rope`: ``x`` is marked dirty and returned; no gradients for ``cos``,
    ``sin``, ``position_ids``."""

    @staticmethod
    def forward(ctx, x, cos, sin, position_ids, inverse, inplace_backward):
        ctx.eager = not torch.compiler.is_compiling()
        run_op(inplace_rope_op, x, cos, sin, position_ids, inverse)
        ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin, position_ids)
        ctx.inverse = inverse
        ctx.inplace_backward = inplace_backward
        return x

    @staticmethod
    def backward(ctx, dy):
        cos, sin, position_ids = ctx.saved_tensors
        if _rotate_in_place(dy, ctx.inplace_backward):
            call_op(ctx, inplace_rope_op, dy, cos, sin, position_ids, not ctx.inverse)
            bump_version(dy)
            dx = dy
        else:
            dx = call_op(ctx, inplace_rope_bwd_op, dy, cos, sin, position_ids, ctx.inverse)
        return dx, None, None, None, None, None


def inplace_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                 inverse: bool = False, inplace_backward: bool = True) -> torch.Tensor:
    """DeepSeek-V4 interleaved rotary embedding of the last ``rope_dim`` channels of each head, in place
    (SPEC 1.5).

    With ``R = rope_dim = 2·cos.shape[-1]`` and a token at position ``p`` (``position_ids[b, t]``, else
    ``t``), each adjacent pair ``(a, b) = (x[..., D-R+2i], x[..., D-R+2i+1])`` becomes
    ``(a·c − b·s, a·s + b·c)`` with ``c = cos[p, i]``, ``s = sin[p, i]`` (``s → −s`` if ``inverse``),
    computed in fp32 and rounded once to ``x.dtype``. The first ``D − R`` ("nope") channels and every
    element outside ``x``'s view are never written.

    Args:
        x: ``[B, T, H, D]`` or packed ``[T, H, D]``, fp32/fp16/bf16; any strides (a slice of a larger
            tensor, a transposed view), but no overlapping elements. Must not be a leaf requiring grad
            (as for every in-place op).
        cos, sin: ``[T_max, R/2]``, same shape, any float dtype (used as fp32), any strides.
        position_ids: ``[B, T]`` or ``[T]`` (broadcast over the batch) for 4-D ``x``, ``[T]`` for packed
            ``x`` (per-sequence positions, restarting at each sequence); int32/int64. Values must lie in
            ``[0, T_max)``: checked for CPU tensors (``IndexError``), a precondition on GPU (not read).
            Default: ``arange(T)``.
        inverse: rotate by ``−θ`` (DeepSeek-V4 applies it to the attention output's rope slice).
        inplace_backward: the backward rotates the incoming gradient by the opposite angle *in place*
            (unless that buffer has overlapping or stride-0 elements, then a copy). Pass ``False`` when
            the output's gradient may be shared with another branch, e.g. ``inplace_rope(x, ...) + w``
            with ``w`` needing the same gradient tensor.

    Returns:
        ``x`` itself (same object), rotated. Gradient: the rotation of the incoming gradient by the
        opposite angle; nope channels pass through unchanged; none for ``cos``/``sin``/``position_ids``.

    Raises:
        ValueError: rank or shape of any argument, ``R > D``, tensors on different devices, ``x`` with
            stride-0 (overlapping) elements.
        TypeError: ``x`` not fp32/fp16/bf16 (float64 is reference-only), ``cos``/``sin`` not floating,
            ``position_ids`` not int32/int64.
        IndexError: ``position_ids=None`` with ``T > T_max``; out-of-range CPU ``position_ids``.

    Source: DeepSeek-V4 model code (interleaved rotary embedding on the last ``rope_dim`` channels,
    with the inverse rotation on the attention output); RoFormer (Su et al., 2021) for RoPE itself.
    """
    if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
        return InplaceRopeFunction.apply(x, cos, sin, position_ids, bool(inverse), bool(inplace_backward))
    # nothing to differentiate: the op alone (Dynamo traces ``ctx.mark_dirty`` only when the Function
    # is recorded for autograd, so a no-grad call must not go through it)
    run_op(inplace_rope_op, x, cos, sin, position_ids, bool(inverse))
    bump_version(x)
    return x
