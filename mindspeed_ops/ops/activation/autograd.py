"""Autograd and ``torch.library`` registration of the activation family.

Pattern every family follows:
- ``torch.library.custom_op("mindspeed_ops::<name>")`` for the forward and ``<name>_bwd`` for the
  backward, each with a fake (meta) function, so ``torch.compile(fullgraph=True)`` traces through;
- the op bodies ask :mod:`mindspeed_ops.backends` which implementation runs (``reference``: the
  pure-PyTorch function, its backward by autograd through it; ``triton``: the launchers);
- ``register_autograd`` wires the two together; ``common.eager_autograd`` gives the public function
  a cheap eager path over the same bodies (custom-op dispatch costs more host time than the kernels).
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ..common import call_op, eager_autograd, reference_vjp
from . import clipped_swiglu as _launch
from . import reference as _ref

backends.register("clipped_swiglu", "triton", forward=_launch.forward, backward=_launch.backward)
backends.register(
    "clipped_swiglu", "reference", forward=_ref.clipped_swiglu,
    backward=lambda dout, gate_up, *args: reference_vjp(_ref.clipped_swiglu, (gate_up,), dout, *args)[0])


@torch.library.custom_op("mindspeed_ops::clipped_swiglu", mutates_args=())
def clipped_swiglu_op(gate_up: torch.Tensor, swiglu_alpha: float, swiglu_limit: Optional[float],
                      interleaved: bool) -> torch.Tensor:
    _launch.check_args(gate_up, swiglu_alpha, swiglu_limit)
    impl = backends.implementation("clipped_swiglu", gate_up.device)
    return impl.forward(gate_up, swiglu_alpha, swiglu_limit, interleaved).contiguous()  # contiguous like the fake (the reference backend follows the inputs' layout)


@clipped_swiglu_op.register_fake
def _(gate_up, swiglu_alpha, swiglu_limit, interleaved):
    I = _launch.check_args(gate_up, swiglu_alpha, swiglu_limit)
    return gate_up.new_empty(*gate_up.shape[:-1], I)


@torch.library.custom_op("mindspeed_ops::clipped_swiglu_bwd", mutates_args=())
def clipped_swiglu_bwd_op(dout: torch.Tensor, gate_up: torch.Tensor, swiglu_alpha: float,
                          swiglu_limit: Optional[float], interleaved: bool) -> torch.Tensor:
    impl = backends.implementation("clipped_swiglu", gate_up.device)
    return impl.backward(dout, gate_up, swiglu_alpha, swiglu_limit, interleaved).contiguous()


@clipped_swiglu_bwd_op.register_fake
def _(dout, gate_up, swiglu_alpha, swiglu_limit, interleaved):
    return torch.empty_like(gate_up, memory_format=torch.contiguous_format)


def _setup(ctx, inputs, output):
    gate_up, ctx.alpha, ctx.limit, ctx.interleaved = inputs
    ctx.save_for_backward(gate_up)


def _backward(ctx, dout):
    (gate_up,) = ctx.saved_tensors
    return call_op(ctx, clipped_swiglu_bwd_op, dout, gate_up, ctx.alpha, ctx.limit, ctx.interleaved), None, None, None


clipped_swiglu_op.register_autograd(_backward, setup_context=_setup)
_clipped_swiglu = eager_autograd(clipped_swiglu_op, _setup, _backward)


def clipped_swiglu(gate_up: torch.Tensor, swiglu_alpha: float = 1.702, swiglu_limit: Optional[float] = 7.0,
                   interleaved: bool = False) -> torch.Tensor:
    """GPT-OSS clipped SwiGLU, forward and backward (SPEC 1.4).

    ``out = ĝ·σ(α·ĝ)·(û + 1)`` with ``ĝ = min(gate, L)``, ``û = clamp(up, -L, L)``, computed in fp32 and
    rounded once.

    Args:
        gate_up: ``[..., 2I]`` fp32/fp16/bf16. ``interleaved=False`` (MindSpeed convention):
            ``gate = gate_up[..., :I]``, ``up = gate_up[..., I:]``; ``interleaved=True`` (GPT-OSS
            checkpoints, HF expert code): ``gate = gate_up[..., 0::2]``, ``up = gate_up[..., 1::2]``.
            Any strides.
        swiglu_alpha: ``α`` of the sigmoid (GPT-OSS: 1.702).
        swiglu_limit: ``L``; ``None`` or ``inf`` disables both clamps.
        interleaved: column layout of ``gate_up``, see above.

    Returns:
        ``[..., I]`` in ``gate_up.dtype``. NaN in gate/up propagates to ``out``.

    Gradient (into ``gate_up``, same layout): passes at exactly ``±L`` (inclusive, like
    ``torch.clamp``) and is 0 where an input was clamped.

    Raises:
        ValueError: odd last dim, ``swiglu_limit <= 0``, non-finite ``swiglu_alpha``.
        TypeError: ``gate_up`` not fp32/fp16/bf16 (float64 is reference-only).

    Source: GPT-OSS model card / reference implementation (OpenAI, 2025), "swiglu with clamping".
    """
    return _clipped_swiglu(gate_up, float(swiglu_alpha), None if swiglu_limit is None else float(swiglu_limit),
                           bool(interleaved))
