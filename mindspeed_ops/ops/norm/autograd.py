"""Autograd and ``torch.library`` registration of ``l2norm``, ``rmsnorm_without_weight``, ``rms_norm``.

Each operator is a ``torch.library.custom_op`` (``mindspeed_ops::<name>`` and ``<name>_bwd``) with a
fake function, wired by ``register_autograd``; the op bodies ask :mod:`mindspeed_ops.backends` which
implementation runs (``triton``: the launchers; ``reference``: the pure-PyTorch functions and their
closed-form backwards from ``reference.py``; ``common.reference_vjp`` is not used because autograd
does not record inside a custom-op body, so it would return zeros there).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ... import backends
from ..common import call_op, eager_autograd
from . import l2norm as _l2
from . import reference as _ref
from . import rms_norm as _rms


def _contig(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.contiguous()


# ------------------------------------------------------------------------------------------------
# Backends


def _ref_l2norm_fwd(x, eps, output_dtype):
    y, rstd = _ref.l2norm_fwd(x, eps, output_dtype)
    return y.contiguous(), rstd.float().contiguous()


def _ref_l2norm_bwd(x_or_y, rstd, dy, eps, normalized=False, dx_dtype=None, dy_group=1):
    if dy_group > 1:  # the GVA fold of l2norm.backward's dy_group
        dy = dy.reshape(*x_or_y.shape[:-1], dy_group, x_or_y.shape[-1]).sum(-2, dtype=torch.float32)
    if normalized:
        return _ref.l2norm_bwd(x_or_y, rstd, dy, eps, dx_dtype).contiguous()
    dx, _ = _ref.rms_norm_bwd(dy, x_or_y, None, eps, inv_n=1.0)
    return dx.to(dx_dtype or x_or_y.dtype).contiguous()


def _ref_rmsnorm_ww_fwd(x, eps, return_normalized, rstd_dtype):
    out = _ref.rmsnorm_without_weight(x, eps, return_normalized, rstd_dtype)
    rstd, y = out if return_normalized else (out, None)
    return rstd.contiguous(), _contig(y)


def _ref_rmsnorm_ww_bwd(x, drstd, dy, eps):
    return _ref.rmsnorm_without_weight_bwd(x, drstd, dy, eps).contiguous()


def _ref_rms_norm_bwd(dy, x, weight, eps, offset, need_dweight=True):
    dx, dw = _ref.rms_norm_bwd(dy, x, weight, eps, offset)
    return dx.contiguous(), (_contig(dw) if need_dweight else None)


backends.register("l2norm", "triton", forward=_l2.forward, backward=_l2.backward, forward_pair=_l2.forward_pair)
backends.register("l2norm", "reference", forward=_ref_l2norm_fwd, backward=_ref_l2norm_bwd)
backends.register("rmsnorm_without_weight", "triton", forward=_rms.rmsnorm_without_weight_forward,
                  backward=_rms.rmsnorm_without_weight_backward)
backends.register("rmsnorm_without_weight", "reference", forward=_ref_rmsnorm_ww_fwd, backward=_ref_rmsnorm_ww_bwd)
backends.register("rms_norm", "triton", forward=_rms.rms_norm_forward, backward=_rms.rms_norm_backward)
backends.register("rms_norm", "reference", forward=lambda x, w, eps, offset: _ref.rms_norm(x, w, eps, offset).contiguous(),
                  backward=_ref_rms_norm_bwd)


# ------------------------------------------------------------------------------------------------
# l2norm


@torch.library.custom_op("mindspeed_ops::l2norm", mutates_args=())
def l2norm_op(x: torch.Tensor, eps: float, output_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
    _l2.check_args(x, eps, output_dtype)
    return backends.implementation("l2norm", x.device).forward(x, eps, output_dtype)


@l2norm_op.register_fake
def _(x, eps, output_dtype):
    _l2.check_args(x, eps, output_dtype)
    return x.new_empty(x.shape, dtype=output_dtype or x.dtype), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("mindspeed_ops::l2norm_bwd", mutates_args=())
def l2norm_bwd_op(x_or_y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, eps: float, normalized: bool,
                  dx_dtype: Optional[torch.dtype]) -> torch.Tensor:
    if normalized:
        _l2.check_bwd_args(x_or_y, rstd, dy, dx_dtype)
    return backends.implementation("l2norm", x_or_y.device).backward(x_or_y, rstd, dy, eps, normalized, dx_dtype)


@l2norm_bwd_op.register_fake
def _(x_or_y, rstd, dy, eps, normalized, dx_dtype):
    if normalized:
        _l2.check_bwd_args(x_or_y, rstd, dy, dx_dtype)
    return x_or_y.new_empty(x_or_y.shape, dtype=dx_dtype or x_or_y.dtype)


def _l2norm_setup(ctx, inputs, output):
    x, ctx.eps, _ = inputs
    _, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, rstd)


def _l2norm_backward(ctx, dy, _drstd):
    x, rstd = ctx.saved_tensors
    if dy is None:
        return None, None, None
    return call_op(ctx, l2norm_bwd_op, x, rstd, dy, ctx.eps, False, x.dtype), None, None


l2norm_op.register_autograd(_l2norm_backward, setup_context=_l2norm_setup)
_l2norm = eager_autograd(l2norm_op, _l2norm_setup, _l2norm_backward)


def l2norm(x: torch.Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """L2-normalise the last dim: ``y = x / sqrt(Σ_d x_d² + eps)`` (SPEC 1.1), with autograd.

    ``eps`` sits inside the square root (``F.normalize`` clamps the norm instead), so an all-zero
    row gives ``y = 0`` and a finite gradient ``dy·eps^-1/2``. Math in fp32, one rounding.

    Args:
        x: ``[..., D]`` fp32/fp16/bf16, any leading dims and strides, ``D >= 1`` (65,536 and longer
            rows take a looped path).
        eps: ``>= 0``, added to the sum of squares.
        output_dtype: dtype of ``y`` (fp32/fp16/bf16); ``None`` means ``x.dtype``.

    Returns:
        ``y``, shape of ``x``, contiguous, in ``output_dtype or x.dtype``. The gradient ``dx`` is in
        ``x.dtype``: ``dx = rstd·(dy − ŷ·Σ_d dy·ŷ)`` with ``ŷ = x·rstd`` recomputed in fp32 from the
        saved ``x`` and fp32 ``rstd``.

    Raises:
        ValueError: ``x`` 0-D or ``D == 0``; ``eps`` negative or not finite.
        TypeError: ``x`` not fp32/fp16/bf16 (float64 is reference-only); bad ``output_dtype``.

    Source: the "qk l2norm" of Gated DeltaNet (Yang et al., 2024) and Kimi Delta Attention.
    """
    return _l2norm(x, float(eps), output_dtype)[0]


def l2norm_fwd(x: torch.Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None):
    """Non-autograd l2norm forward: ``(y, rstd)`` (SPEC 1.1).

    ``y`` as in :func:`l2norm`; ``rstd = 1/sqrt(Σ_d x_d² + eps)``, shape ``x.shape[:-1]``, fp32.
    The outputs never require grad. Pair with :func:`l2norm_bwd`.
    """
    with torch.no_grad():
        return l2norm_op(x, float(eps), output_dtype)


def l2norm_bwd(y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, eps: float = 1e-6, *,
               dx_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Non-autograd l2norm backward from the forward output: ``dx = rstd·(dy − y·Σ_d dy·y)``.

    Args:
        y: ``[..., D]`` output of :func:`l2norm_fwd` (its rounding enters the formula; the autograd
            :func:`l2norm` recomputes ``ŷ`` from ``x`` instead).
        rstd: ``y.shape[:-1]`` fp32 from :func:`l2norm_fwd`.
        dy: like ``y`` (any strides, stride 0 included); never written.
        eps: unused (it is inside ``rstd``); accepted for signature compatibility.
        dx_dtype: dtype of ``dx``; ``None`` means ``y.dtype``.

    Raises:
        ValueError: shapes disagree, tensors on different devices. TypeError: ``rstd`` not fp32,
        float64 ``y``/``dy``.
    """
    return l2norm_bwd_op(y, rstd, dy, float(eps), True, dx_dtype)


class L2Norm(nn.Module):
    """``nn.Module`` wrapper of :func:`l2norm`: ``forward(x) -> y`` over the last dim."""

    def __init__(self, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.eps = eps
        self.output_dtype = output_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2norm(x, self.eps, self.output_dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, output_dtype={self.output_dtype}"


# ------------------------------------------------------------------------------------------------
# rmsnorm_without_weight


@torch.library.custom_op("mindspeed_ops::rmsnorm_without_weight", mutates_args=())
def rmsnorm_without_weight_op(x: torch.Tensor, eps: float, return_normalized: bool,
                              rstd_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
    _rms.check_rmsnorm_without_weight_args(x, eps, rstd_dtype)
    rstd, y = backends.implementation("rmsnorm_without_weight", x.device).forward(x, eps, return_normalized,
                                                                                 rstd_dtype)
    return rstd, (x.new_empty(0) if y is None else y)


@rmsnorm_without_weight_op.register_fake
def _(x, eps, return_normalized, rstd_dtype):
    _rms.check_rmsnorm_without_weight_args(x, eps, rstd_dtype)
    rstd = x.new_empty(*x.shape[:-1], 1, dtype=rstd_dtype or x.dtype)
    return rstd, (x.new_empty(x.shape) if return_normalized else x.new_empty(0))


@torch.library.custom_op("mindspeed_ops::rmsnorm_without_weight_bwd", mutates_args=())
def rmsnorm_without_weight_bwd_op(x: torch.Tensor, drstd: Optional[torch.Tensor], dy: Optional[torch.Tensor],
                                  eps: float) -> torch.Tensor:
    return backends.implementation("rmsnorm_without_weight", x.device).backward(x, drstd, dy, eps)


@rmsnorm_without_weight_bwd_op.register_fake
def _(x, drstd, dy, eps):
    return x.new_empty(x.shape)


def _rmsnorm_ww_setup(ctx, inputs, output):
    x, ctx.eps, ctx.return_normalized, _ = inputs
    if not ctx.return_normalized:
        ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x)


def _rmsnorm_ww_backward(ctx, drstd, dy):
    (x,) = ctx.saved_tensors
    if not ctx.return_normalized:
        dy = None
    if drstd is None and dy is None:
        return None, None, None, None
    return call_op(ctx, rmsnorm_without_weight_bwd_op, x, drstd, dy, ctx.eps), None, None, None


rmsnorm_without_weight_op.register_autograd(_rmsnorm_ww_backward, setup_context=_rmsnorm_ww_setup)
_rmsnorm_without_weight = eager_autograd(rmsnorm_without_weight_op, _rmsnorm_ww_setup, _rmsnorm_ww_backward)


def rmsnorm_without_weight(x: torch.Tensor, eps: float = 1e-6, return_normalized: bool = False,
                           rstd_dtype: Optional[torch.dtype] = None, *, norm_eps: Optional[float] = None):
    """RMS scale factor of each row, optionally with the normalised rows (SPEC 1.2), with autograd.

    ``rstd = 1/sqrt(mean_d(x_d²) + eps)`` in fp32, rounded once to its output dtype;
    ``y = x·rstd`` (fp32 product, one rounding). DeepSeek-V4 mHC uses only ``rstd``
    (``mixes = (x·fnᵀ)·rstd``): then ``y`` is never written.

    Args:
        x: ``[..., D]`` fp32/fp16/bf16 (e.g. ``[B, S, D]``, ``[B, S, H, D]``), any strides, ``D >= 1``.
        eps: ``>= 0``. ``norm_eps`` (keyword) is an alias (MindSpeed precursor name); passing both
            with different values raises ``ValueError``.
        return_normalized: also return ``y``.
        rstd_dtype: dtype of ``rstd`` (fp32/fp16/bf16); ``None`` means ``x.dtype`` like the
            precursor, ``torch.float32`` keeps the full statistic.

    Returns:
        ``rstd`` (``[..., 1]``, keepdim), or ``(rstd, y)`` with ``y`` like ``x`` in ``x.dtype``.
        Backward: ``dx = r·(dy − x̂·mean_d(dy ⊙ x̂)) − drstd·r³·x/D`` (the ``dy`` term only with
        ``return_normalized``), ``r`` recomputed in fp32 from ``x`` (never from the rounded ``rstd``).

    Raises:
        ValueError: ``x`` 0-D or ``D == 0``; bad ``eps``; conflicting ``eps``/``norm_eps``.
        TypeError: ``x`` not fp32/fp16/bf16 (float64 is reference-only); bad ``rstd_dtype``.

    Source: DeepSeek-V4 manifold-constrained hyper-connections (mHC); MindSpeed's
    ``rmsnorm_without_weight``.
    """
    if norm_eps is not None:
        if eps != 1e-6 and eps != norm_eps:
            raise ValueError(f"rmsnorm_without_weight: pass eps or its alias norm_eps, not both "
                             f"(got eps={eps}, norm_eps={norm_eps})")
        eps = norm_eps
    rstd, y = _rmsnorm_without_weight(x, float(eps), bool(return_normalized), rstd_dtype)
    return (rstd, y) if return_normalized else rstd


# ------------------------------------------------------------------------------------------------
# rms_norm


@torch.library.custom_op("mindspeed_ops::rms_norm", mutates_args=())
def rms_norm_op(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float) -> torch.Tensor:
    _rms.check_rms_norm_args(x, weight, eps, offset)
    return backends.implementation("rms_norm", x.device).forward(x, weight, eps, offset)


@rms_norm_op.register_fake
def _(x, weight, eps, offset):
    _rms.check_rms_norm_args(x, weight, eps, offset)
    return x.new_empty(x.shape)


@torch.library.custom_op("mindspeed_ops::rms_norm_bwd", mutates_args=())
def rms_norm_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float,
                    need_dweight: bool) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw = backends.implementation("rms_norm", x.device).backward(dy, x, weight, eps, offset, need_dweight)
    return dx, (x.new_empty(0) if dw is None else dw)


@rms_norm_bwd_op.register_fake
def _(dy, x, weight, eps, offset, need_dweight):
    dw = weight.new_empty(weight.shape) if (weight is not None and need_dweight) else x.new_empty(0)
    return x.new_empty(x.shape), dw


def _rms_norm_setup(ctx, inputs, output):
    x, weight, ctx.eps, ctx.offset = inputs
    ctx.has_weight = weight is not None
    ctx.save_for_backward(x, weight)


def _rms_norm_backward(ctx, dy):
    x, weight = ctx.saved_tensors
    need_dw = ctx.has_weight and ctx.needs_input_grad[1]
    dx, dw = call_op(ctx, rms_norm_bwd_op, dy, x, weight, ctx.eps, ctx.offset, need_dw)
    return dx, (dw if need_dw else None), None, None


rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)
_rms_norm = eager_autograd(rms_norm_op, _rms_norm_setup, _rms_norm_backward)


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
             offset: float = 0.0) -> torch.Tensor:
    """Weighted RMSNorm over the last dim (SPEC 1.2), with autograd.

    ``y = x·r ⊙ (weight + offset)``, ``r = 1/sqrt(mean_d(x_d²) + eps)``, all in fp32, rounded once
    to ``x.dtype`` (also when ``weight`` is fp32). ``offset=1.0`` is the Gemma ``(1 + w)`` form.

    Args:
        x: ``[..., D]`` fp32/fp16/bf16, any strides, ``D >= 1`` (long rows take a looped path).
        weight: ``[D]``, fp32/fp16/bf16 (may differ from ``x``), or ``None`` (then ``y = x·r``).
        eps: ``>= 0``.
        offset: added to ``weight``; must be 0.0 when ``weight`` is ``None``.

    Returns:
        ``y`` like ``x`` in ``x.dtype`` (contiguous). Backward, with ``gw = dy ⊙ (weight + offset)``:
        ``dx = r·(gw − x̂·mean_d(gw ⊙ x̂))`` in ``x.dtype``; ``dweight = Σ_rows dy ⊙ x̂`` accumulated
        in fp32 by a deterministic two-stage reduction, returned in ``weight.dtype``. ``dy`` is never
        written.

    Raises:
        ValueError: ``x`` 0-D or ``D == 0``; ``weight`` not ``[D]``; ``offset != 0`` without a
            weight; bad ``eps``/``offset``; ``weight`` on another device.
        TypeError: ``x``/``weight`` not fp32/fp16/bf16 (float64 is reference-only).

    Source: Zhang & Sennrich, "Root Mean Square Layer Normalization" (2019); Gemma's ``1 + w``.
    """
    return _rms_norm(x, weight, float(eps), float(offset))
