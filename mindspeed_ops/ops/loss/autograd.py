"""Autograd and ``torch.library`` registration of the loss family (SPEC 1.7, 1.8).

Ops (``torch.ops.mindspeed_ops.*``), each with a fake function, so ``torch.compile(fullgraph=True)``
traces through them:

- ``fused_cross_entropy_loss(logits, labels, loss_weight, ignore_index, label_smoothing,
  lse_square_scale, softcap, inplace_backward) -> (row_loss, lse)``: per-row ``w_i·ℓ_i`` and ``lse``
  (fp32, ``labels.shape``). The reduction is done by the Python wrapper with PyTorch ops, so the
  backward receives the exact per-row upstream gradient ``c_i/w_i`` (``g/Σw``, ``g`` or ``g_i``).
- ``fused_cross_entropy_loss_bwd`` (new gradient) and ``fused_cross_entropy_loss_bwd_inplace``
  (writes the gradient into ``logits``, declared as a mutation, so the version counter is bumped).
- ``chunk_loss(hidden [N, Hd], weight, labels, bias, loss_weight, ..., need_*) -> (loss, lse, dhidden,
  dweight, dbias)``: for ``mean``/``sum`` the gradients of ``Σ w_i·ℓ_i`` (divided by ``Σw`` for a bf16/fp32
  mean) are computed in forward when asked for; backward scales them by ``g`` (``g/Σw`` for an fp16 mean),
  in place in eager mode when the graph is freed. ``chunk_loss_bwd`` recomputes for ``none``.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ..common import bump_version, call_op, eager_autograd, pin_backends, run_op
from . import chunk_loss as _chunk
from . import cross_entropy as _ce
from . import reference as _ref

CE = "fused_cross_entropy_loss"
CHUNK = "chunk_loss"


# ---------------------------------------------------------------------------------------------
# reference backend: the pure-PyTorch functions with their written-out backward


def _ref_ce_forward(logits, labels, loss_weight, ignore_index, eps, lam, softcap):
    """Reference backend (CPU path). Its backward is written out (:func:`reference.cross_entropy_grad`):
    inside a custom op's body autograd does not record, so autograd through the reference cannot run there."""
    rows, lse = _ref.cross_entropy_rows(logits, labels, loss_weight, ignore_index, eps, lam, softcap)
    return rows.to(torch.float32), lse.to(torch.float32)


def _ref_ce_backward(grad, logits, lse, labels, loss_weight, ignore_index, eps, lam, softcap):
    return _ref.cross_entropy_grad(grad, logits, labels, loss_weight, ignore_index, eps, lam, softcap)


def _ref_ce_backward_inplace(grad, logits, *args):
    logits.copy_(_ref_ce_backward(grad, logits, *args))


def _ref_chunk_forward(hidden, weight, labels, bias, loss_weight, ignore_index, reduction, eps, lam, softcap,
                       chunk_size, cdt, accum_dtype, need_dh, need_dw, need_db):
    with torch.no_grad():
        loss, lse = _ref.chunk_loss_core(hidden, weight, labels, bias, loss_weight, ignore_index, reduction, eps, lam,
                                         softcap, cdt, chunk_size)
    grads = (None, None, None)
    if reduction != "none" and (need_dh or need_dw or need_db):  # of the sum of the row losses (or mean, folded)
        grads = _ref.chunk_loss_grads(torch.ones((), device=hidden.device), hidden, weight, labels, bias, loss_weight,
                                      ignore_index, "mean" if _chunk.folds_mean(reduction, cdt) else "sum", eps, lam,
                                      softcap, cdt, chunk_size, (need_dh, need_dw, need_db))
    return (loss.to(torch.float32), lse.to(torch.float32), *grads)


def _ref_chunk_backward(grad, hidden, weight, labels, bias, loss_weight, lse, ignore_index, eps, lam, softcap,
                        chunk_size, cdt, accum_dtype, need_dh, need_dw, need_db):
    return _ref.chunk_loss_grads(grad, hidden, weight, labels, bias, loss_weight, ignore_index, "none", eps, lam,
                                 softcap, cdt, chunk_size, (need_dh, need_dw, need_db))


backends.register(CE, "triton", forward=_ce.forward, backward=_ce.backward, backward_inplace=_ce.backward_inplace)
backends.register(CE, "reference", forward=_ref_ce_forward, backward=_ref_ce_backward,
                  backward_inplace=_ref_ce_backward_inplace)
backends.register(CHUNK, "triton", forward=_chunk.forward, backward=_chunk.backward)
backends.register(CHUNK, "reference", forward=_ref_chunk_forward, backward=_ref_chunk_backward)


# ---------------------------------------------------------------------------------------------
# fused_cross_entropy_loss ops


@torch.library.custom_op("mindspeed_ops::fused_cross_entropy_loss", mutates_args=())
def ce_op(logits: torch.Tensor, labels: torch.Tensor, loss_weight: Optional[torch.Tensor], ignore_index: int,
          label_smoothing: float, lse_square_scale: float, softcap: Optional[float],
          inplace_backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _ce.check_args(logits, labels, loss_weight, ignore_index, "none", label_smoothing, lse_square_scale, softcap)
    impl = backends.implementation(CE, logits.device)
    return impl.forward(logits, labels, loss_weight, ignore_index, label_smoothing, lse_square_scale, softcap)


@ce_op.register_fake
def _(logits, labels, loss_weight, ignore_index, label_smoothing, lse_square_scale, softcap, inplace_backward):
    _ce.check_args(logits, labels, loss_weight, ignore_index, "none", label_smoothing, lse_square_scale, softcap)
    lead = logits.shape[:-1]
    return logits.new_empty(lead, dtype=torch.float32), logits.new_empty(lead, dtype=torch.float32)


@torch.library.custom_op("mindspeed_ops::fused_cross_entropy_loss_bwd", mutates_args=())
def ce_bwd_op(grad: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor,
              loss_weight: Optional[torch.Tensor], ignore_index: int, label_smoothing: float, lse_square_scale: float,
              softcap: Optional[float]) -> torch.Tensor:
    impl = backends.implementation(CE, logits.device)
    return impl.backward(grad, logits, lse, labels, loss_weight, ignore_index, label_smoothing, lse_square_scale,
                         softcap).contiguous()  # like the fake (the reference follows logits' layout)


@ce_bwd_op.register_fake
def _(grad, logits, lse, labels, loss_weight, ignore_index, label_smoothing, lse_square_scale, softcap):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


@torch.library.custom_op("mindspeed_ops::fused_cross_entropy_loss_bwd_inplace", mutates_args=("logits",))
def ce_bwd_inplace_op(grad: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor,
                      loss_weight: Optional[torch.Tensor], ignore_index: int, label_smoothing: float,
                      lse_square_scale: float, softcap: Optional[float]) -> None:
    impl = backends.implementation(CE, logits.device)
    impl.backward_inplace(grad, logits, lse, labels, loss_weight, ignore_index, label_smoothing, lse_square_scale,
                          softcap)


@ce_bwd_inplace_op.register_fake
def _(grad, logits, lse, labels, loss_weight, ignore_index, label_smoothing, lse_square_scale, softcap):
    return None


def _ce_setup(ctx, inputs, output):
    logits, labels, loss_weight, ignore_index, eps, lam, softcap, inplace = inputs
    _, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(logits, lse, labels, loss_weight)
    ctx.opts = (ignore_index, eps, lam, softcap)
    ctx.inplace = inplace


def _ce_backward(ctx, grad_rows, _grad_lse):
    logits, lse, labels, loss_weight = ctx.saved_tensors
    if ctx.inplace:
        ce_bwd_inplace_op(grad_rows, logits, lse, labels, loss_weight, *ctx.opts)
        dx = logits.detach()
    else:
        dx = call_op(ctx, ce_bwd_op, grad_rows, logits, lse, labels, loss_weight, *ctx.opts)
    return dx, None, None, None, None, None, None, None


ce_op.register_autograd(_ce_backward, setup_context=_ce_setup)
_ce_call = eager_autograd(ce_op, _ce_setup, _ce_backward)


# ---------------------------------------------------------------------------------------------
# chunk_loss ops


def _chunk_grad_shapes(hidden, weight, bias, reduction, need_dh, need_dw, need_db):
    pre = reduction != "none"
    e = (0,)
    return ((tuple(hidden.shape) if need_dh and pre else e, hidden.dtype),
            (tuple(weight.shape) if need_dw and pre else e, weight.dtype),
            (tuple(bias.shape) if need_db and pre and bias is not None else e,
             bias.dtype if bias is not None else hidden.dtype))


def _placeholders(grads, shapes, like):
    return tuple(like.new_empty(0, dtype=dt) if g is None else g for g, (_, dt) in zip(grads, shapes))


@torch.library.custom_op("mindspeed_ops::chunk_loss", mutates_args=())
def chunk_op(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: Optional[torch.Tensor],
             loss_weight: Optional[torch.Tensor], ignore_index: int, reduction: str, label_smoothing: float,
             lse_square_scale: float, softcap: Optional[float], chunk_size: Optional[int], compute_dtype: torch.dtype,
             accum_dtype: Optional[torch.dtype], need_dhidden: bool, need_dweight: bool,
             need_dbias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    N, Hd, V = _chunk.check_args(hidden, weight, labels, bias, loss_weight, ignore_index, reduction, label_smoothing,
                                 lse_square_scale, softcap, chunk_size, accum_dtype)
    # the default chunk size is resolved here, on concrete sizes: under torch.compile with a dynamic
    # N it would be a SymInt expression (which is not an int, and would not fit the schema)
    r = _chunk.resolve_chunk_size(N, V, Hd, chunk_size)
    impl = backends.implementation(CHUNK, hidden.device)
    out = impl.forward(hidden, weight, labels, bias, loss_weight, ignore_index, reduction, label_smoothing,
                       lse_square_scale, softcap, r, compute_dtype, accum_dtype, need_dhidden, need_dweight,
                       need_dbias)
    # gradients not computed (None) become empty placeholders of the fake function's dtypes
    shapes = _chunk_grad_shapes(hidden, weight, bias, reduction, need_dhidden, need_dweight, need_dbias)
    # contiguous like the fake (the reference's gradients follow the inputs' layout)
    return tuple(t.contiguous() for t in (out[0], out[1], *_placeholders(out[2:], shapes, hidden)))


@chunk_op.register_fake
def _(hidden, weight, labels, bias, loss_weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
      chunk_size, compute_dtype, accum_dtype, need_dhidden, need_dweight, need_dbias):
    N, _, _ = _chunk.check_args(hidden, weight, labels, bias, loss_weight, ignore_index, reduction, label_smoothing,
                                lse_square_scale, softcap, chunk_size, accum_dtype)
    loss = hidden.new_empty((N,) if reduction == "none" else (), dtype=torch.float32)
    lse = hidden.new_empty((N,), dtype=torch.float32)
    grads = [hidden.new_empty(s, dtype=dt) for s, dt in
             _chunk_grad_shapes(hidden, weight, bias, reduction, need_dhidden, need_dweight, need_dbias)]
    return (loss, lse, *grads)


@torch.library.custom_op("mindspeed_ops::chunk_loss_bwd", mutates_args=())
def chunk_bwd_op(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                 bias: Optional[torch.Tensor], loss_weight: Optional[torch.Tensor], lse: torch.Tensor,
                 ignore_index: int, label_smoothing: float, lse_square_scale: float, softcap: Optional[float],
                 chunk_size: Optional[int], compute_dtype: torch.dtype, accum_dtype: Optional[torch.dtype],
                 need_dhidden: bool, need_dweight: bool,
                 need_dbias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = backends.implementation(CHUNK, hidden.device)
    r = _chunk.resolve_chunk_size(hidden.shape[0], weight.shape[0], hidden.shape[1], chunk_size)  # as in forward
    out = impl.backward(grad, hidden, weight, labels, bias, loss_weight, lse, ignore_index, label_smoothing,
                        lse_square_scale, softcap, r, compute_dtype, accum_dtype, need_dhidden,
                        need_dweight, need_dbias)
    shapes = _chunk_grad_shapes(hidden, weight, bias, "sum", need_dhidden, need_dweight, need_dbias)
    return tuple(t.contiguous() for t in _placeholders(out, shapes, hidden))


@chunk_bwd_op.register_fake
def _(grad, hidden, weight, labels, bias, loss_weight, lse, ignore_index, label_smoothing, lse_square_scale, softcap,
      chunk_size, compute_dtype, accum_dtype, need_dhidden, need_dweight, need_dbias):
    return tuple(hidden.new_empty(s, dtype=dt) for s, dt in
                 _chunk_grad_shapes(hidden, weight, bias, "sum", need_dhidden, need_dweight, need_dbias))


def _ref_scale(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The reference of the scale kernel: fp32 product, one rounding to ``x.dtype``."""
    return (x.to(torch.float32) * s.to(torch.float32)).to(x.dtype)


@torch.library.custom_op("mindspeed_ops::chunk_loss_scale", mutates_args=())
def chunk_scale_op(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``x·s`` (``s`` a 0-dim fp32 tensor): the backward of chunk_loss mean/sum, fp32 product, one rounding."""
    if backends.implementation(CHUNK, x.device).backend == "reference":
        return _ref_scale(x, s).contiguous()
    return _chunk.scale(x, s)


@chunk_scale_op.register_fake
def _(x, s):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _scale_in_place(ctx, grad_loss: torch.Tensor) -> bool:
    """Whether backward may scale the saved gradients in place and hand them on: an eager forward (nothing
    traced), no ``create_graph``, a plain upstream gradient (not one of functorch's batched/vmapped
    wrappers, nor a subclass) and a graph freed after this backward (not ``retain_graph``, which would
    scale them again next time). The graph task's flag is a private PyTorch function: without it, never.
    Each tensor scaled in place also has its version bumped, so that a backward that still runs twice (a
    retried task whose first try failed after this node) raises PyTorch's in-place error, not a gradient
    scaled twice."""
    if not getattr(ctx, "eager", False) or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    ft = torch._C._functorch
    if type(grad_loss) is not torch.Tensor or any(
            getattr(ft, f, lambda t: False)(grad_loss) for f in
            ("is_batchedtensor", "is_legacy_batchedtensor", "is_functorch_wrapped_tensor")):
        return False
    keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    try:
        return keep_graph is not None and not keep_graph()
    except RuntimeError:  # not inside a graph task
        return False


def _scale_(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    if backends.implementation(CHUNK, x.device).backend == "reference":
        return x.copy_(_ref_scale(x, s))
    _chunk.scale_(x, s)
    bump_version(x)  # the kernel wrote through the data pointer
    return x


def _chunk_setup(ctx, inputs, output):
    (hidden, weight, labels, bias, loss_weight, ignore_index, reduction, eps, lam, softcap, chunk_size, cdt, adt,
     need_dh, need_dw, need_db) = inputs
    loss, lse, dh, dw, db = output
    # outputs kept only for backward: not differentiable, and no zero gradient tensors filled for them (the
    # loss, the only differentiable output, always has its gradient when backward runs)
    ctx.mark_non_differentiable(lse, dh, dw, db)
    ctx.set_materialize_grads(False)
    ctx.reduction = reduction
    ctx.folded = _chunk.folds_mean(reduction, cdt)
    ctx.need = (need_dh, need_dw, need_db and bias is not None)
    if reduction == "none":
        ctx.save_for_backward(hidden, weight, labels, bias, loss_weight, lse)
        ctx.opts = (ignore_index, eps, lam, softcap, chunk_size, cdt, adt)
    else:
        ctx.save_for_backward(dh, dw, db, labels, loss_weight)
        ctx.ignore_index = ignore_index


def _chunk_backward(ctx, grad_loss, *_unused):
    need_dh, need_dw, need_db = ctx.need
    if ctx.reduction == "none":
        hidden, weight, labels, bias, loss_weight, lse = ctx.saved_tensors
        dh, dw, db = call_op(ctx, chunk_bwd_op, grad_loss, hidden, weight, labels, bias, loss_weight, lse,
                             *ctx.opts, need_dh, need_dw, need_db)
    else:
        dh, dw, db, labels, loss_weight = ctx.saved_tensors
        # the forward computed the gradients of Σ w_i·ℓ_i (of the mean if folded); scale by g (sum, folded
        # mean) or g/Σw (fp16 mean), a 0-dim tensor
        if ctx.reduction == "mean" and not ctx.folded:
            grad_loss = grad_loss / _chunk.safe_denominator(labels, loss_weight, ctx.ignore_index)
        in_place = _scale_in_place(ctx, grad_loss)
        # a saved-tensor hook may hand back a non-contiguous tensor: that one is scaled into a new one
        dh, dw, db = ((_scale_(t, grad_loss) if in_place and t.is_contiguous()
                       else call_op(ctx, chunk_scale_op, t, grad_loss)) if need else None
                      for t, need in ((dh, need_dh), (dw, need_dw), (db, need_db)))
    return (dh if need_dh else None, dw if need_dw else None, None, db if need_db else None,
            None, None, None, None, None, None, None, None, None, None, None, None)


chunk_op.register_autograd(_chunk_backward, setup_context=_chunk_setup)
_chunk_call = eager_autograd(chunk_op, _chunk_setup, _chunk_backward)


# ---------------------------------------------------------------------------------------------
# public functions


def _reduce(rows: torch.Tensor, labels: torch.Tensor, loss_weight: Optional[torch.Tensor], ignore_index: int,
            reduction: str) -> torch.Tensor:
    return _ref.reduce_rows(rows, labels, loss_weight, ignore_index, reduction)


def fused_cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor, loss_weight: Optional[torch.Tensor] = None,
                             ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                             lse_square_scale: float = 0.0, softcap: Optional[float] = None,
                             return_lse: bool = False, inplace_backward: bool = False):
    """Memory-lean, fp32-exact LM cross-entropy over materialised logits (SPEC 1.7).

    Row i (fp32, one online max/sum pass over V; ``ε = label_smoothing``, ``λ = lse_square_scale``):
    ``z = softcap·tanh(x/softcap)`` (or ``x``), ``lse_i = log Σ_j exp(z_ij)``,
    ``ℓ_i = (1−ε)(lse_i − z_{i,y_i}) + ε(lse_i − mean_j z_ij) + λ·lse_i²`` (PyTorch label smoothing:
    uniform mass over all V classes including the target), scaled by ``loss_weight[i]``.

    Args:
        logits: ``[..., V]`` fp32/fp16/bf16, any strides (``x[:, :-1, :]`` views are read in place).
        labels: ``logits.shape[:-1]``, int32/int64. ``ignore_index`` rows give 0 and a zero gradient
            and leave every sum and denominator; a label outside ``[0, V)`` that is not
            ``ignore_index`` gives a NaN loss and a NaN gradient row (no synchronising range check).
        loss_weight: ``logits.shape[:-1]``, any float dtype, or None (all ones); scales the whole row
            loss (z-loss included). No gradient flows into it.
        reduction: ``'mean'`` = ``Σ_valid w_i·ℓ_i / Σ_valid w_i`` (the mean over non-ignored rows when
            unweighted); **when that denominator is 0 (all rows ignored, or all valid weights 0) the
            result is 0.0, not NaN, and stays connected to the graph (backward gives a zero
            gradient)**; ``'sum'`` = ``Σ_valid w_i·ℓ_i``; ``'none'`` = ``w_i·ℓ_i`` of shape
            ``labels.shape``.
        label_smoothing: ``ε`` in [0, 1]. lse_square_scale: z-loss ``λ >= 0``.
        softcap: None or ``> 0`` (Gemma-2 style logit soft-capping, applied before everything;
            ``inf`` = none).
        return_lse: also return ``lse`` (fp32, ``labels.shape``, after soft-capping, every row,
            detached; train a z-loss through ``lse_square_scale``).
        inplace_backward: backward writes the gradient into ``logits``' storage and returns it as
            the gradient (``logits`` is intact after forward; its version counter is bumped in
            backward so a later use of the stale values by autograd is detected).

    Returns:
        ``loss`` (fp32: scalar for mean/sum, ``labels.shape`` for none), or ``(loss, lse)``.

    Gradient: ``∂/∂z_ij = c_i·[p_ij·(1+2λ·lse_i) − ε/V − (1−ε)·[j=y_i]]``, times ``1 − tanh²(x/softcap)``, with
    the row scale ``c_i = w_i·g/Σw`` (mean), ``w_i·g`` (sum), ``w_i·g_i`` (none), the true-class entry computed
    in fp32 as one expression and rounded once; returned in ``logits.dtype``. The forward saves ``logits`` (no
    copy) and fp32 ``lse``; under ``torch.no_grad()`` nothing is saved.

    Raises:
        TypeError: logits not fp32/fp16/bf16, labels not int32/int64, loss_weight not floating.
        ValueError: shape mismatches, ``V < 1``, ``reduction`` not in mean/sum/none, ``ε`` outside
            [0, 1], ``λ < 0``, ``softcap <= 0``, tensors on different devices, ``inplace_backward=True``
            with a ``logits`` whose elements share memory (an expanded view).

    Source: PyTorch ``F.cross_entropy`` semantics; z-loss from PaLM (Chowdhery et al., 2022); logit
    soft-capping from Gemma 2 (Gemma Team, 2024).
    """
    _ce.check_args(logits, labels, loss_weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap)
    if inplace_backward:
        _ce.check_inplace(logits)
    w = None if loss_weight is None else loss_weight.detach()
    rows, lse = _ce_call(logits, labels, w, int(ignore_index), float(label_smoothing), float(lse_square_scale),
                         _ce.norm_softcap(softcap), bool(inplace_backward))
    loss = _reduce(rows, labels, w, ignore_index, reduction)
    return (loss, lse) if return_lse else loss


class FusedCrossEntropyLoss(torch.nn.Module):
    """Module form of :func:`fused_cross_entropy_loss`: ``forward(logits, labels, loss_weight=None)``."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 lse_square_scale: float = 0.0, softcap: Optional[float] = None, return_lse: bool = False,
                 inplace_backward: bool = False):
        super().__init__()
        _ce.check_options("FusedCrossEntropyLoss", ignore_index, reduction, label_smoothing, lse_square_scale, softcap)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.lse_square_scale = lse_square_scale
        self.softcap = softcap
        self.return_lse = return_lse
        self.inplace_backward = inplace_backward

    def forward(self, logits: torch.Tensor, labels: torch.Tensor, loss_weight: Optional[torch.Tensor] = None):
        return fused_cross_entropy_loss(logits, labels, loss_weight, self.ignore_index, self.reduction,
                                        self.label_smoothing, self.lse_square_scale, self.softcap, self.return_lse,
                                        self.inplace_backward)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, lse_square_scale={self.lse_square_scale}, "
                f"softcap={self.softcap}, inplace_backward={self.inplace_backward}")


@pin_backends
class FusedCrossEntropyLossFunction(torch.autograd.Function):
    """MindSpeed-compatible autograd Function: ``FusedCrossEntropyLossFunction.apply(logits, loss_weight,
    labels) -> loss``, the fp32 scalar ``Σ_i w_i·ℓ_i`` over non-ignored rows (``ignore_index=-100``, no
    smoothing, no z-loss, no softcap); ``loss_weight=None`` means all ones. Same kernels and gradient
    as :func:`fused_cross_entropy_loss` with ``reduction='sum'``.
    """

    @staticmethod
    def forward(ctx, logits, loss_weight, labels):
        _ce.check_args(logits, labels, loss_weight, -100, "sum", 0.0, 0.0, None)
        w = None if loss_weight is None else loss_weight.detach()
        ctx.eager = not torch.compiler.is_compiling()
        rows, lse = run_op(ce_op, logits, labels, w, -100, 0.0, 0.0, None, False)
        ctx.save_for_backward(logits, lse, labels, w)
        return rows.sum()

    @staticmethod
    def backward(ctx, grad):
        logits, lse, labels, w = ctx.saved_tensors
        g = grad.to(torch.float32).expand(labels.shape)
        return call_op(ctx, ce_bwd_op, g, logits, lse, labels, w, -100, 0.0, 0.0, None), None, None


def chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: Optional[torch.Tensor] = None,
               loss_weight: Optional[torch.Tensor] = None, ignore_index: int = -100, reduction: str = "mean",
               label_smoothing: float = 0.0, lse_square_scale: float = 0.0, softcap: Optional[float] = None,
               return_lse: bool = False, chunk_size: Optional[int] = None,
               accum_dtype: Optional[torch.dtype] = torch.float32):
    """Fused LM head + cross-entropy that never builds the full ``[tokens, V]`` logits (SPEC 1.8).

    Exactly ``fused_cross_entropy_loss(hidden @ weightᵀ + bias, labels, ...)`` with the same options
    and decisions (empty-denominator ``mean`` is a graph-connected 0.0; out-of-range labels give NaN
    rows), where each chunk's logits are accumulated in fp32 and kept in fp32 for the loss.

    Args:
        hidden: ``[..., Hd]`` fp32/fp16/bf16 (``N`` = product of the leading dims).
        weight: ``[V, Hd]`` fp32/fp16/bf16 (the LM head, hidden-first argument order).
        labels: ``hidden.shape[:-1]`` int32/int64, already shifted by the caller.
        bias: ``[V]`` or None; added in fp32 to the fp32 logits.
        loss_weight: ``hidden.shape[:-1]`` float or None. Other options as in fused_cross_entropy_loss.
        chunk_size: rows per chunk (any positive int); ``None``: the largest power of two ``r`` with
            ``r·V <= N·Hd``, clamped to ``[min(N, 256), N]``. Larger chunks trade memory for speed where
            the fp32 ``dweight`` accumulator is re-read per group: at ``[16384, 4096] x 128256`` bf16 on
            an H200, 2048 took 87 ms vs 110 ms for the default 512 (one run), with 245 MiB more peak memory
            (``benchmarks/tune_chunk_loss.py``, docs/benchmarks/losses.md).
        accum_dtype: dtype of the ``dweight``/``dbias`` accumulators across chunks (fp32 default;
            ``None``: the weight's dtype); results are cast once at the end.

    Compute dtype: the autocast dtype when autocast is enabled for the device, else ``hidden.dtype``;
    ``weight`` is cast to it for the matrix products (cuBLAS, fp32 accumulation, fp32 logits).
    Gradients come back in each input's own dtype; none for ``labels``/``loss_weight``; only those
    needed are computed (frozen weight, hidden without grad); under ``torch.no_grad()`` only the loss.
    ``mean``/``sum`` compute the gradients during forward and scale them by the scalar upstream
    gradient in backward; ``none`` recomputes each chunk's logits in backward so that any per-token
    upstream gradient is folded into ``dlogits`` before ``dweight``.

    Memory beyond inputs, returned outputs and gradients: ``<= 2·r·V·4 + V·Hd·4`` bytes (+ small).

    Returns: ``loss`` (fp32) or ``(loss, lse)`` (``lse``: fp32, ``hidden.shape[:-1]``, detached).

    Raises: TypeError (dtypes, float64 hidden/weight/bias, bad accum_dtype), ValueError (shapes,
    options, ``chunk_size <= 0``, devices).

    Source: "fused linear cross-entropy" as in Liger-Kernel (Hsu et al., 2024) and Cut Your Losses
    (Wijmans et al., 2024); semantics of SPEC 1.7.
    """
    N, Hd, V = _chunk.check_args(hidden, weight, labels, bias, loss_weight, ignore_index, reduction, label_smoothing,
                                 lse_square_scale, softcap, chunk_size, accum_dtype)
    lead = hidden.shape[:-1]
    cdt = _ref.compute_dtype(hidden)
    grad_on = torch.is_grad_enabled()
    need_dh = grad_on and hidden.requires_grad
    need_dw = grad_on and weight.requires_grad
    need_db = grad_on and bias is not None and bias.requires_grad
    w = None if loss_weight is None else loss_weight.detach().reshape(N)
    loss, lse, *_ = _chunk_call(hidden.reshape(N, Hd), weight, labels.reshape(N), bias, w, int(ignore_index),
                                reduction, float(label_smoothing), float(lse_square_scale),
                                _ce.norm_softcap(softcap), chunk_size, cdt, accum_dtype, need_dh, need_dw, need_db)
    if reduction == "none":
        loss = loss.view(lead)
    lse = lse.view(lead)
    return (loss, lse) if return_lse else loss
