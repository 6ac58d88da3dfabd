"""Autograd and ``torch.library`` registration of the mHC family (SPEC 1.12).

Same pattern as :mod:`mindspeed_ops.ops.activation.autograd`: forward and ``_bwd`` custom ops with
fakes, bodies dispatched through :mod:`mindspeed_ops.backends`, ``register_autograd`` plus
``common.eager_autograd`` for the public functions.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ..common import call_op, eager_autograd, reference_vjp
from . import mhc_post as _post
from . import mhc_pre_bmm as _pre
from . import reference as _ref
from . import sinkhorn as _sk
from . import tilelang_sinkhorn as _tl_sk


def _empty(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t, memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------------------------- sinkhorn
backends.register("sinkhorn", "triton", forward=_sk.forward, backward=_sk.backward)
backends.register(
    "sinkhorn", "reference", forward=_ref.sinkhorn,
    backward=lambda dpre, dpost, dcomb, mixes, s, b, *args: tuple(
        reference_vjp(_ref.sinkhorn, (mixes, s, b), (dpre, dpost, dcomb), *args)))
_tl_sk.register()  # TileLang backend: only when tilelang is installed and CUDA is available; below Triton until timed


@torch.library.custom_op("mindspeed_ops::sinkhorn", mutates_args=())
def sinkhorn_op(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, hc_mult: int,
                sinkhorn_iters: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _sk.check_args(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)
    impl = backends.implementation("sinkhorn", mixes.device)
    # contiguous like the fake (the reference backend follows the inputs' layout)
    return tuple(t.contiguous() for t in impl.forward(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps))


@sinkhorn_op.register_fake
def _(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps):
    n = _sk.check_args(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)
    lead = mixes.shape[:-1]
    return mixes.new_empty(*lead, n), mixes.new_empty(*lead, n), mixes.new_empty(*lead, n, n)


@torch.library.custom_op("mindspeed_ops::sinkhorn_bwd", mutates_args=())
def sinkhorn_bwd_op(dpre: torch.Tensor, dpost: torch.Tensor, dcomb: torch.Tensor, mixes: torch.Tensor,
                    hc_scale: torch.Tensor, hc_base: torch.Tensor, hc_mult: int, sinkhorn_iters: int,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = backends.implementation("sinkhorn", mixes.device)
    return tuple(t.contiguous() for t in impl.backward(dpre, dpost, dcomb, mixes, hc_scale, hc_base, hc_mult,
                                                       sinkhorn_iters, eps))


@sinkhorn_bwd_op.register_fake
def _(dpre, dpost, dcomb, mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps):
    return _empty(mixes), _empty(hc_scale), _empty(hc_base)


def _zeros_if_none(g, mixes, *tail):
    return mixes.new_zeros(*mixes.shape[:-1], *tail) if g is None else g


def _sinkhorn_setup(ctx, inputs, output):
    mixes, hc_scale, hc_base, ctx.n, ctx.iters, ctx.eps = inputs
    ctx.save_for_backward(mixes, hc_scale, hc_base)


def _sinkhorn_backward(ctx, dpre, dpost, dcomb):
    mixes, hc_scale, hc_base = ctx.saved_tensors
    n = ctx.n
    dm, ds, db = call_op(ctx, sinkhorn_bwd_op, _zeros_if_none(dpre, mixes, n), _zeros_if_none(dpost, mixes, n),
                         _zeros_if_none(dcomb, mixes, n, n), mixes, hc_scale, hc_base, n, ctx.iters, ctx.eps)
    return dm, ds, db, None, None, None


sinkhorn_op.register_autograd(_sinkhorn_backward, setup_context=_sinkhorn_setup)
_sinkhorn = eager_autograd(sinkhorn_op, _sinkhorn_setup, _sinkhorn_backward)


def sinkhorn(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, hc_mult: int = 4,
             sinkhorn_iters: int = 20, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 mHC mixing split with Sinkhorn-normalised stream mixing (SPEC 1.12.1).

    With ``n = hc_mult``, ``m = mixes``, ``s = hc_scale``, ``b = hc_base`` (fp32 math):
    ``pre = σ(s0·m[:n] + b[:n]) + eps``, ``post = 2·σ(s1·m[n:2n] + b[n:2n])``, and ``comb`` = row softmax of
    ``s2·m[2n:] + b[2n:]`` (row-major ``n×n``) plus ``eps``, then a column normalisation and
    ``sinkhorn_iters - 1`` (row, column) normalisation pairs, each ``X / (sum + eps)``.

    Args:
        mixes: ``[..., (2+n)·n]`` fp32/fp16/bf16, any row stride (e.g. a slice of a wider projection).
        hc_scale: ``[3]``; hc_base: ``[(2+n)·n]``; fp32/fp16/bf16.
        hc_mult: ``n`` in ``[1, 8]`` (4 in DeepSeek-V4). sinkhorn_iters: ``>= 1``. eps: ``>= 0``.

    Returns:
        ``(pre [..., n], post [..., n], comb [..., n, n])`` in ``mixes.dtype``.

    Gradient: the exact gradient of the unrolled iterations (the kernel recomputes them) for ``mixes``,
    ``hc_scale`` and ``hc_base`` (token sums in fp32, deterministic, returned in their dtypes).

    Raises:
        ValueError: ``hc_mult`` outside ``[1, 8]``, ``sinkhorn_iters < 1``, ``eps < 0``, wrong shapes.
        TypeError: float64 or non-float inputs.

    Source: DeepSeek-V4 manifold-constrained hyper-connections (mHC, DeepSeek-AI 2025/2026);
    Sinkhorn & Knopp (1967).
    """
    return _sinkhorn(mixes, hc_scale, hc_base, _sk.as_int(_sk.OP, "hc_mult", hc_mult),
                     _sk.as_int(_sk.OP, "sinkhorn_iters", sinkhorn_iters), float(eps))


hc_split_sinkhorn = sinkhorn


# ---------------------------------------------------------------------------------------------- sinkhorn_knopp
backends.register("sinkhorn_knopp", "triton", forward=_sk.knopp_forward, backward=_sk.knopp_backward)
backends.register(
    "sinkhorn_knopp", "reference", forward=_ref.sinkhorn_knopp,
    backward=lambda dp, logits, *args: reference_vjp(_ref.sinkhorn_knopp, (logits,), dp, *args)[0])


@torch.library.custom_op("mindspeed_ops::sinkhorn_knopp", mutates_args=())
def sinkhorn_knopp_op(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    _sk.check_knopp_args(logits, iters, eps)
    return backends.implementation("sinkhorn_knopp", logits.device).forward(logits, iters, eps).contiguous()


@sinkhorn_knopp_op.register_fake
def _(logits, iters, eps):
    _sk.check_knopp_args(logits, iters, eps)
    return _empty(logits)


@torch.library.custom_op("mindspeed_ops::sinkhorn_knopp_bwd", mutates_args=())
def sinkhorn_knopp_bwd_op(dp: torch.Tensor, logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    return backends.implementation("sinkhorn_knopp", logits.device).backward(dp, logits, iters, eps).contiguous()


@sinkhorn_knopp_bwd_op.register_fake
def _(dp, logits, iters, eps):
    return _empty(logits)


def _knopp_setup(ctx, inputs, output):
    logits, ctx.iters, ctx.eps = inputs
    ctx.save_for_backward(logits)


def _knopp_backward(ctx, dp):
    (logits,) = ctx.saved_tensors
    return call_op(ctx, sinkhorn_knopp_bwd_op, dp, logits, ctx.iters, ctx.eps), None, None


sinkhorn_knopp_op.register_autograd(_knopp_backward, setup_context=_knopp_setup)
_sinkhorn_knopp = eager_autograd(sinkhorn_knopp_op, _knopp_setup, _knopp_backward)


def sinkhorn_knopp(logits: torch.Tensor, iters: int = 20, eps: float = 1e-6) -> torch.Tensor:
    """Unrolled Sinkhorn-Knopp normalisation of ``n×n`` logits (SPEC 1.12.2).

    Steps 2-5 of :func:`sinkhorn` with ``C = logits``: row softmax, ``+eps``, column normalisation,
    then ``iters - 1`` (row, column) pairs, each ``X / (sum + eps)``; fp32 math.

    Args:
        logits: ``[..., n, n]`` fp32/fp16/bf16, ``1 <= n <= 64``.
        iters: ``>= 1``. eps: ``>= 0``.

    Returns:
        ``P [..., n, n]`` in ``logits.dtype`` (column sums ``≈ 1 - O(eps)``). Gradient: exact, unrolled.

    Raises:
        ValueError: non-square last dims or ``n > 64``, ``iters < 1``, ``eps < 0``. TypeError: float64.

    Source: Sinkhorn & Knopp (1967); DeepSeek-V4 mHC.
    """
    return _sinkhorn_knopp(logits, _sk.as_int(_sk.OP_KNOPP, "iters", iters), float(eps))


# ---------------------------------------------------------------------------------------------- mhc_pre_bmm
backends.register("mhc_pre_bmm", "triton", forward=_pre.forward, backward=_pre.backward)
backends.register(
    "mhc_pre_bmm", "reference", forward=_ref.mhc_pre_bmm,
    backward=lambda dy, pre, x, out_dtype: tuple(reference_vjp(_ref.mhc_pre_bmm, (pre, x), dy, out_dtype)))


@torch.library.custom_op("mindspeed_ops::mhc_pre_bmm", mutates_args=())
def mhc_pre_bmm_op(pre: torch.Tensor, x: torch.Tensor, out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    _pre.check_args(pre, x, out_dtype)
    return backends.implementation("mhc_pre_bmm", x.device).forward(pre, x, out_dtype).contiguous()


@mhc_pre_bmm_op.register_fake
def _(pre, x, out_dtype):
    _pre.check_args(pre, x, out_dtype)
    return x.new_empty(*x.shape[:-2], x.shape[-1], dtype=out_dtype or x.dtype)


@torch.library.custom_op("mindspeed_ops::mhc_pre_bmm_bwd", mutates_args=())
def mhc_pre_bmm_bwd_op(dy: torch.Tensor, pre: torch.Tensor, x: torch.Tensor,
                       out_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(t.contiguous() for t in backends.implementation("mhc_pre_bmm", x.device).backward(dy, pre, x,
                                                                                             out_dtype))


@mhc_pre_bmm_bwd_op.register_fake
def _(dy, pre, x, out_dtype):
    return _empty(pre), _empty(x)


def _pre_setup(ctx, inputs, output):
    pre, x, ctx.out_dtype = inputs
    ctx.save_for_backward(pre, x)


def _pre_backward(ctx, dy):
    pre, x = ctx.saved_tensors
    dpre, dx = call_op(ctx, mhc_pre_bmm_bwd_op, dy, pre, x, ctx.out_dtype)
    return dpre, dx, None


mhc_pre_bmm_op.register_autograd(_pre_backward, setup_context=_pre_setup)
_mhc_pre_bmm = eager_autograd(mhc_pre_bmm_op, _pre_setup, _pre_backward)


def mhc_pre_bmm(pre: torch.Tensor, x: torch.Tensor, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """mHC pre-mix: ``y = Σ_j pre_j · x_j`` over the ``n`` residual streams (SPEC 1.12.3).

    Args:
        pre: ``[..., n]`` fp32/fp16/bf16 (fp32 in practice), ``1 <= n <= 8``.
        x: ``[..., n, D]`` fp32/fp16/bf16, any leading strides (last dim contiguous or it is copied).
        out_dtype: dtype of ``y``; ``None`` = ``x.dtype`` (``torch.float32`` gives the precursor behaviour).

    Returns:
        ``y [..., D]`` (fp32 accumulation, one rounding). Gradients: ``dpre_j = <dy, x_j>`` (fp32 reduction
        over D, ``pre``'s dtype), ``dx_j = pre_j · dy`` (``x``'s dtype).

    Raises:
        ValueError: ``pre.shape != x.shape[:-1]``, ``n`` outside ``[1, 8]``. TypeError: float64, bad out_dtype.

    Source: DeepSeek-V4 mHC (hyper-connection pre weights).
    """
    return _mhc_pre_bmm(pre, x, out_dtype)


# ---------------------------------------------------------------------------------------------- mhc_post
backends.register("mhc_post", "triton", forward=_post.forward, backward=_post.backward)
backends.register(
    "mhc_post", "reference", forward=_ref.mhc_post,
    backward=lambda dout, x, r, hp, hr: tuple(reference_vjp(_ref.mhc_post, (x, r, hp, hr), dout)))


@torch.library.custom_op("mindspeed_ops::mhc_post", mutates_args=())
def mhc_post_op(x: torch.Tensor, residual: torch.Tensor, h_post: torch.Tensor, h_res: torch.Tensor) -> torch.Tensor:
    _post.check_args(x, residual, h_post, h_res)
    return backends.implementation("mhc_post", x.device).forward(x, residual, h_post, h_res).contiguous()


@mhc_post_op.register_fake
def _(x, residual, h_post, h_res):
    _post.check_args(x, residual, h_post, h_res)
    return _empty(residual)


@torch.library.custom_op("mindspeed_ops::mhc_post_bwd", mutates_args=())
def mhc_post_bwd_op(dout: torch.Tensor, x: torch.Tensor, residual: torch.Tensor, h_post: torch.Tensor,
                    h_res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # contiguous like the fake (the reference's dh_res comes back transposed)
    return tuple(t.contiguous() for t in backends.implementation("mhc_post", x.device).backward(
        dout, x, residual, h_post, h_res))


@mhc_post_bwd_op.register_fake
def _(dout, x, residual, h_post, h_res):
    return _empty(x), _empty(residual), _empty(h_post), _empty(h_res)


def _post_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _post_backward(ctx, dout):
    x, residual, h_post, h_res = ctx.saved_tensors
    return tuple(call_op(ctx, mhc_post_bwd_op, dout, x, residual, h_post, h_res))


mhc_post_op.register_autograd(_post_backward, setup_context=_post_setup)
_mhc_post = eager_autograd(mhc_post_op, _post_setup, _post_backward)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, h_post: torch.Tensor, h_res: torch.Tensor) -> torch.Tensor:
    """mHC post-mix (SPEC 1.12.4), DeepSeek convention (the mixing matrix applied transposed):
    ``out_k = h_post_k · x + Σ_j h_res[j, k] · residual_j`` in fp32, one rounding.

    Args:
        x: layer output ``[..., D]`` fp32/fp16/bf16.
        residual: streams ``[..., n, D]``, same dtype as ``x`` (``TypeError`` otherwise), ``1 <= n <= 8``.
        h_post: ``[..., n]``; h_res: ``[..., n, n]`` (``comb`` of :func:`sinkhorn`); fp32/fp16/bf16.

    Returns:
        ``out [..., n, D]`` in ``x.dtype``. Gradients: ``dx = Σ_k h_post_k·dout_k``,
        ``dresidual_j = Σ_k h_res[j, k]·dout_k``, ``dh_post_k = <dout_k, x>``,
        ``dh_res[j, k] = <residual_j, dout_k>`` (fp32 reductions over D, returned in the inputs' dtypes).

    Raises:
        ValueError: shape mismatches, ``n`` outside ``[1, 8]``. TypeError: dtype mismatch of x/residual, float64.

    Source: DeepSeek-V4 mHC (hyper-connection post/residual mixing).
    """
    return _mhc_post(x, residual, h_post, h_res)
