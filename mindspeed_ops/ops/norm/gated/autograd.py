"""Autograd and ``torch.library`` registration of the gated RMSNorm (SPEC 1.3).

``mindspeed_ops::rms_norm_gated`` always returns ``(y, residual_out)``; ``residual_out`` is an
empty ``[0]`` tensor unless ``prenorm`` (the public function drops it). ``rms_norm_gated_bwd``
returns ``(dx, dg, dweight, dbias, dresidual)`` with empty ``[0]`` tensors for absent inputs.
The op bodies ask :mod:`mindspeed_ops.backends` which implementation runs (``reference``: the
pure-PyTorch function, its backward by autograd through it; ``triton``: the launchers).
"""
from __future__ import annotations

import operator
from typing import Optional

import torch
from torch import nn

from .... import backends
from ...common import call_op, eager_autograd
from ....validation import check_choice
from . import reference as _ref
from . import rms_norm_gated as _launch

OP = "rms_norm_gated"


def _ref_forward(x, g, weight, bias, residual, eps, activation, group_size, norm_before_gate, casting, prenorm,
                 residual_in_fp32):
    out = _ref.rms_norm_gated(x, g, weight, bias, activation, residual, prenorm, residual_in_fp32, eps, group_size,
                              norm_before_gate, casting)
    y, ro = out if prenorm else (out, None)
    return y.contiguous(), None if ro is None else ro.contiguous()


def _ref_backward(dy, dres, x, g, weight, bias, residual, eps, activation, group_size, norm_before_gate, casting,
                  prenorm, residual_in_fp32):
    # closed form of SPEC 1.3 (like the other norms); tests check it against autograd through the reference
    return _ref.rms_norm_gated_bwd(dy, dres if prenorm else None, x, g, weight, bias, activation, residual, prenorm,
                                   residual_in_fp32, eps, group_size, norm_before_gate, casting)


backends.register(OP, "triton", forward=_launch.forward, backward=_launch.backward)
backends.register(OP, "reference", forward=_ref_forward, backward=_ref_backward)


@torch.library.custom_op("mindspeed_ops::rms_norm_gated", mutates_args=())
def rms_norm_gated_op(x: torch.Tensor, g: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                      residual: Optional[torch.Tensor], eps: float, activation: str, group_size: Optional[int],
                      norm_before_gate: bool, casting: str, prenorm: bool,
                      residual_in_fp32: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _launch.check_args(x, g, weight, bias, residual, eps, activation, group_size, norm_before_gate, casting)
    impl = backends.implementation(OP, x.device)
    y, ro = impl.forward(x, g, weight, bias, residual, eps, activation, group_size, norm_before_gate, casting,
                         prenorm, residual_in_fp32)
    return y, (x.new_empty(0) if ro is None else ro)


@rms_norm_gated_op.register_fake
def _(x, g, weight, bias, residual, eps, activation, group_size, norm_before_gate, casting, prenorm,
      residual_in_fp32):
    _launch.check_args(x, g, weight, bias, residual, eps, activation, group_size, norm_before_gate, casting)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if prenorm:
        ro = x.new_empty(x.shape, dtype=_ref.residual_dtype(x.dtype, residual_in_fp32))
    else:
        ro = x.new_empty(0)
    return y, ro


def _or_empty(t: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0) if t is None else t.contiguous()


@torch.library.custom_op("mindspeed_ops::rms_norm_gated_bwd", mutates_args=())
def rms_norm_gated_bwd_op(dy: torch.Tensor, dres: Optional[torch.Tensor], x: torch.Tensor, g: torch.Tensor,
                          weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                          residual: Optional[torch.Tensor], eps: float, activation: str, group_size: Optional[int],
                          norm_before_gate: bool, casting: str, prenorm: bool, residual_in_fp32: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = backends.implementation(OP, x.device)
    dx, dg, dw, db, dr = impl.backward(dy, dres, x, g, weight, bias, residual, eps, activation, group_size,
                                       norm_before_gate, casting, prenorm, residual_in_fp32)
    return dx.contiguous(), dg.contiguous(), _or_empty(dw, x), _or_empty(db, x), _or_empty(dr, x)


@rms_norm_gated_bwd_op.register_fake
def _(dy, dres, x, g, weight, bias, residual, eps, activation, group_size, norm_before_gate, casting, prenorm,
      residual_in_fp32):
    def like(t):
        return x.new_empty(0) if t is None else torch.empty_like(t, memory_format=torch.contiguous_format)

    return like(x), like(g), like(weight), like(bias), like(residual)


def _setup(ctx, inputs, output):
    x, g, weight, bias, residual = inputs[:5]
    ctx.save_for_backward(x, g, weight, bias, residual)
    ctx.options = inputs[5:]  # eps, activation, group_size, norm_before_gate, casting, prenorm, residual_in_fp32
    ctx.present = (weight is not None, bias is not None, residual is not None)


def _backward(ctx, dy, dres):
    x, g, weight, bias, residual = ctx.saved_tensors
    prenorm = ctx.options[5]
    if dy is None:
        dy = torch.zeros_like(x)
    dx, dg, dw, db, dr = call_op(ctx, rms_norm_gated_bwd_op, dy, dres if prenorm else None, x, g, weight, bias,
                                 residual, *ctx.options)
    has_w, has_b, has_r = ctx.present
    return (dx, dg, dw if has_w else None, db if has_b else None, dr if has_r else None,
            None, None, None, None, None, None, None)


rms_norm_gated_op.register_autograd(_backward, setup_context=_setup)
_rms_norm_gated = eager_autograd(rms_norm_gated_op, _setup, _backward)


def rms_norm_gated(x: torch.Tensor, g: torch.Tensor, weight: Optional[torch.Tensor] = None,
                   bias: Optional[torch.Tensor] = None, activation: str = "swish",
                   residual: Optional[torch.Tensor] = None, prenorm: bool = False, residual_in_fp32: bool = False,
                   eps: float = 1e-6, group_size: Optional[int] = None, norm_before_gate: bool = True,
                   casting: str = "fp32"):
    """Gated RMSNorm, forward and backward (SPEC 1.3): the output norm of GDN/KDA layers.

    Per row and per group of ``group_size`` channels, in fp32:
    ``norm_before_gate=True``: ``y = (x'·r ⊙ weight + bias) ⊙ act(g)`` with ``r = 1/sqrt(mean(x'²) + eps)``;
    ``norm_before_gate=False`` (Mamba-2 style): ``z = x' ⊙ act(g)``, ``y = z·r_z ⊙ weight + bias``.
    ``x' = x + residual`` (rounded to ``residual_out``'s dtype) or ``x``.

    Args:
        x: ``[..., D]`` fp32/fp16/bf16 (the attention output), any row strides.
        g: gate, same shape as ``x``; fp32/fp16/bf16, may differ from ``x``'s dtype.
        weight, bias: ``[D]``, any float dtype, or ``None``.
        activation: ``'swish'``/``'silu'`` (``g·σ(g)``, Qwen3-Next) or ``'sigmoid'`` (``σ(g)``, Kimi-Linear).
        residual: optional ``[..., D]`` added to ``x`` before the norm (any float dtype).
        prenorm: also return ``residual_out = x'``.
        residual_in_fp32: keep ``residual_out`` (and ``x'``) in fp32 instead of ``x.dtype``.
        eps: added to the mean square (Qwen3-Next 1e-6, Kimi-Linear 1e-5).
        group_size: channels per normalisation group; must divide ``D``; ``None`` means ``D``.
        norm_before_gate: see above.
        casting: ``'fp32'`` (every step in fp32, one rounding; the Kimi-Linear formula and the fused
            kernel convention) or ``'input'`` (Qwen3-Next's rounding order: ``h = round(x.dtype, x'·r)``,
            ``y1 = weight ⊙ h`` rounded to ``promote(weight.dtype, x.dtype)``,
            ``y = round(x.dtype, y1·act(g_fp32))``; needs ``norm_before_gate=True``, no ``group_size``,
            no ``bias``, no ``residual``). Its gradient is that of the rounding-free math.

    Returns:
        ``y`` (``[..., D]``, ``x.dtype``), or ``(y, residual_out)`` with ``prenorm`` (``residual_out`` in
        fp32 when ``residual_in_fp32`` else ``x.dtype``).

    Gradients: ``x``, ``g``, ``weight``, ``bias``, ``residual``; ``dweight``/``dbias`` accumulated in
    fp32 (deterministic two-stage reduction) and returned in their dtypes. With a residual (or
    ``prenorm``), ``dx = dresidual = dx' + d(residual_out)``.

    Raises:
        ValueError: unknown ``activation``/``casting``, ``group_size`` not dividing ``D``, a shape
            mismatch, ``casting='input'`` with an unsupported option, tensors on different devices.
        TypeError: a non-float tensor or float64 (float64 is reference-only).

    Source: Qwen3-Next / Qwen3.5 ``GatedDeltaNet`` output norm (swish gate), Kimi-Linear KDA output
    norm (sigmoid gate), Mamba-2 grouped gated RMSNorm (``norm_before_gate=False``).
    """
    check_choice(OP, "activation", activation, _ref.ACTIVATIONS)
    check_choice(OP, "casting", casting, _ref.CASTINGS)
    if isinstance(group_size, bool):  # operator.index(True) == 1 would silently mean groups of 1 channel
        raise ValueError(f"{OP}: group_size must be None or a positive int, got {group_size!r}")
    try:
        eps = float(eps)
        group_size = None if group_size is None else operator.index(group_size)
    except (TypeError, ValueError):
        raise ValueError(f"{OP}: eps must be a finite number >= 0 and group_size None or an int, "
                         f"got eps={eps!r}, group_size={group_size!r}") from None
    y, ro = _rms_norm_gated(x, g, weight, bias, residual, eps, activation, group_size,
                            bool(norm_before_gate), casting, bool(prenorm), bool(residual_in_fp32))
    return (y, ro) if prenorm else y


class FusedRMSNormGated(nn.Module):
    """``nn.Module`` form of :func:`rms_norm_gated` (SPEC 1.3).

    Args:
        hidden_size: ``D`` (per-head dim for GDN/KDA output norms, e.g. 128).
        elementwise_affine: learnable ``weight`` ``[D]`` initialised to ones (``False``: no weight).
        eps: 1e-5 by default (Kimi-Linear); Qwen3-Next uses 1e-6.
        activation, group_size, norm_before_gate, casting: as in :func:`rms_norm_gated`.
        device, dtype: of the weight.

    ``forward(x, g, residual=None, prenorm=False, residual_in_fp32=False)`` returns ``y`` or
    ``(y, residual_out)``. Kimi-Linear's output norm is
    ``FusedRMSNormGated(128, eps=1e-5, activation='sigmoid')`` with an fp32 weight; Qwen3-Next's is
    ``FusedRMSNormGated(128, eps=1e-6, casting='input')``.

    Raises:
        ValueError: bad ``activation``/``casting``, ``group_size`` not dividing ``hidden_size``, or
            ``casting='input'`` with ``group_size``/``norm_before_gate=False``.
    """

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 activation: str = "swish", group_size: Optional[int] = None, norm_before_gate: bool = True,
                 casting: str = "fp32", device=None, dtype=None):
        super().__init__()
        check_choice("FusedRMSNormGated", "activation", activation, _ref.ACTIVATIONS)
        check_choice("FusedRMSNormGated", "casting", casting, _ref.CASTINGS)
        if group_size is not None and (isinstance(group_size, bool) or group_size <= 0 or hidden_size % group_size):
            raise ValueError(f"FusedRMSNormGated: group_size must divide hidden_size = {hidden_size}, got {group_size}")
        if casting == "input" and (not norm_before_gate or group_size not in (None, hidden_size)):
            raise ValueError("FusedRMSNormGated: casting='input' needs norm_before_gate=True and group_size=None")
        self.hidden_size = hidden_size
        self.elementwise_affine = elementwise_affine
        self.eps = eps
        self.activation = activation
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.casting = casting
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, g: torch.Tensor, residual: Optional[torch.Tensor] = None,
                prenorm: bool = False, residual_in_fp32: bool = False):
        return rms_norm_gated(x, g, self.weight, self.bias, self.activation, residual, prenorm, residual_in_fp32,
                              self.eps, self.group_size, self.norm_before_gate, self.casting)

    def extra_repr(self) -> str:
        s = f"{self.hidden_size}, eps={self.eps}, activation={self.activation!r}"
        if self.group_size is not None:
            s += f", group_size={self.group_size}"
        if not self.norm_before_gate:
            s += ", norm_before_gate=False"
        if self.casting != "fp32":
            s += f", casting={self.casting!r}"
        if not self.elementwise_affine:
            s += ", elementwise_affine=False"
        return s
