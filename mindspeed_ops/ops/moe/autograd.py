"""Autograd and ``torch.library`` registration of the MoE family (SPEC 1.6).

Same pattern as :mod:`mindspeed_ops.ops.activation.autograd`: custom ops ``mindspeed_ops::<name>`` and
``<name>_bwd`` with fake functions, bodies that ask :mod:`mindspeed_ops.backends` for the
implementation, ``register_autograd``, and a cheap eager path like ``common.eager_autograd``'s, except
that its forward keeps the Triton backend's device gather tables in the autograd context: the eager
backward is then one launch of the forward's gather kernel (no second host->device copy of the
indices, no tables launch). Under ``torch.compile`` the backward ops rebuild the tables from
``split_sizes``/``sorted_idxs``. These enter the ops as 1-D integer tensors (host lists are turned
into CPU tensors by the public functions).
"""
from __future__ import annotations

import operator
from typing import Callable, Sequence, Union

import torch

from ... import backends
from ..common import call_op, pin_backends, reference_vjp
from . import reference as _ref
from . import sort_chunks as _launch

OP, OP_PROBS = _launch.OP, _launch.OP_PROBS
IntList = Union[torch.Tensor, Sequence[int]]


def _ref_backward(dout, split_sizes, sorted_idxs):
    # the primal's values do not matter (the op is linear): autograd through split + cat
    return reference_vjp(_ref.sort_chunks_by_idx, (torch.zeros_like(dout),), dout, split_sizes, sorted_idxs)[0]


def _ref_backward_probs(dout, dprobs, split_sizes, sorted_idxs):
    primals = (torch.zeros_like(dout), torch.zeros_like(dprobs))
    return tuple(reference_vjp(_ref.sort_chunks_by_idx_with_probs, primals, (dout, dprobs), split_sizes,
                               sorted_idxs))


backends.register(OP, "triton", forward=_launch.forward, backward=_launch.backward,
                  forward_saving=_launch.forward_saving, backward_saved=_launch.backward_saved)
backends.register(OP, "reference", forward=_ref.sort_chunks_by_idx, backward=_ref_backward)
backends.register(OP_PROBS, "triton", forward=_launch.forward_with_probs, backward=_launch.backward_with_probs,
                  forward_saving=_launch.forward_with_probs_saving, backward_saved=_launch.backward_with_probs_saved)
backends.register(OP_PROBS, "reference", forward=_ref.sort_chunks_by_idx_with_probs, backward=_ref_backward_probs)


def _contiguous_like(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty(t.shape)


def _eager_forward(ctx, op: str, args: tuple):
    """Body of the forward custom op for the eager autograd path: checks, then the backend's forward;
    a backend that can keep its device tables (``forward_saving``) leaves them, with its matching
    ``backward_saved``, in ``ctx`` (``ctx.saved_bwd = None`` otherwise)."""
    ctx.eager = True
    _launch.check_args(args[0], args[1] if op == OP_PROBS else None, args[-2], args[-1], op)
    impl = backends.implementation(op, args[0].device)
    fwd_saving = impl.fns.get("forward_saving")
    if fwd_saving is None:
        ctx.saved_bwd = None
        return impl.forward(*args)
    out, tables = fwd_saving(*args)
    ctx.saved_bwd = (impl.backward_saved, tables)
    return out


def _saved_backward(ctx, *grads):
    """The backend's ``backward_saved`` with the forward's tables, when the eager forward kept them and
    the backward is not itself differentiated (``create_graph=True`` needs the backward op)."""
    if getattr(ctx, "saved_bwd", None) is None:
        return None
    if torch.is_grad_enabled() and any(g is not None and g.requires_grad for g in grads):
        return None
    return ctx.saved_bwd


def _eager_call(op, function: type) -> Callable:
    """Call path of ``op`` (see ``common.eager_autograd``): the op under ``torch.compile``, the plain
    ``autograd.Function`` ``function`` when a tensor input requires grad, else the op's body."""
    body = op._init_fn

    def call(*args):
        if torch.compiler.is_compiling():
            return op(*args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return function.apply(*args)
        return body(*args)

    call.eager_function = function
    return call


# -- sort_chunks_by_idx ------------------------------------------------------------------------------

@torch.library.custom_op("mindspeed_ops::sort_chunks_by_idx", mutates_args=())
def sort_chunks_op(inp: torch.Tensor, split_sizes: torch.Tensor, sorted_idxs: torch.Tensor) -> torch.Tensor:
    _launch.check_args(inp, None, split_sizes, sorted_idxs)
    return backends.implementation(OP, inp.device).forward(inp, split_sizes, sorted_idxs)


@sort_chunks_op.register_fake
def _(inp, split_sizes, sorted_idxs):
    _launch.check_args(inp, None, split_sizes, sorted_idxs)
    return _contiguous_like(inp)


@torch.library.custom_op("mindspeed_ops::sort_chunks_by_idx_bwd", mutates_args=())
def sort_chunks_bwd_op(dout: torch.Tensor, split_sizes: torch.Tensor, sorted_idxs: torch.Tensor) -> torch.Tensor:
    return backends.implementation(OP, dout.device).backward(dout, split_sizes, sorted_idxs)


@sort_chunks_bwd_op.register_fake
def _(dout, split_sizes, sorted_idxs):
    return _contiguous_like(dout)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[-2], inputs[-1])


def _backward(ctx, dout):
    split_sizes, sorted_idxs = ctx.saved_tensors
    return call_op(ctx, sort_chunks_bwd_op, dout, split_sizes, sorted_idxs), None, None


sort_chunks_op.register_autograd(_backward, setup_context=_setup)


@pin_backends
class _SortChunksEager(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, split_sizes, sorted_idxs):
        out = _eager_forward(ctx, OP, (inp, split_sizes, sorted_idxs))
        _setup(ctx, (inp, split_sizes, sorted_idxs), out)
        return out

    @staticmethod
    def backward(ctx, dout):
        saved = _saved_backward(ctx, dout)
        if saved is None:
            return _backward(ctx, dout)
        bwd, tables = saved
        split_sizes, sorted_idxs = ctx.saved_tensors
        return bwd(dout, split_sizes, sorted_idxs, tables), None, None


_sort_chunks = _eager_call(sort_chunks_op, _SortChunksEager)


# -- sort_chunks_by_idx_with_probs -------------------------------------------------------------------

@torch.library.custom_op("mindspeed_ops::sort_chunks_by_idx_with_probs", mutates_args=())
def sort_chunks_probs_op(inp: torch.Tensor, probs: torch.Tensor, split_sizes: torch.Tensor,
                         sorted_idxs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _launch.check_args(inp, probs, split_sizes, sorted_idxs, OP_PROBS)
    return backends.implementation(OP_PROBS, inp.device).forward(inp, probs, split_sizes, sorted_idxs)


@sort_chunks_probs_op.register_fake
def _(inp, probs, split_sizes, sorted_idxs):
    _launch.check_args(inp, probs, split_sizes, sorted_idxs, OP_PROBS)
    return _contiguous_like(inp), _contiguous_like(probs)


@torch.library.custom_op("mindspeed_ops::sort_chunks_by_idx_with_probs_bwd", mutates_args=())
def sort_chunks_probs_bwd_op(dout: torch.Tensor, dprobs: torch.Tensor, split_sizes: torch.Tensor,
                             sorted_idxs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return backends.implementation(OP_PROBS, dout.device).backward(dout, dprobs, split_sizes, sorted_idxs)


@sort_chunks_probs_bwd_op.register_fake
def _(dout, dprobs, split_sizes, sorted_idxs):
    return _contiguous_like(dout), _contiguous_like(dprobs)


def _backward_probs(ctx, dout, dprobs):
    split_sizes, sorted_idxs = ctx.saved_tensors
    need_inp = ctx.needs_input_grad[0] and dout is not None
    need_probs = ctx.needs_input_grad[1] and dprobs is not None
    if need_inp and need_probs:  # one fused launch for both
        d_inp, d_probs = call_op(ctx, sort_chunks_probs_bwd_op, dout, dprobs, split_sizes, sorted_idxs)
    else:
        d_inp = call_op(ctx, sort_chunks_bwd_op, dout, split_sizes, sorted_idxs) if need_inp else None
        d_probs = call_op(ctx, sort_chunks_bwd_op, dprobs, split_sizes, sorted_idxs) if need_probs else None
    return d_inp, d_probs, None, None


sort_chunks_probs_op.register_autograd(_backward_probs, setup_context=_setup)


@pin_backends
class _SortChunksProbsEager(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, probs, split_sizes, sorted_idxs):
        out = _eager_forward(ctx, OP_PROBS, (inp, probs, split_sizes, sorted_idxs))
        _setup(ctx, (inp, probs, split_sizes, sorted_idxs), out)
        return out

    @staticmethod
    def backward(ctx, dout, dprobs):
        saved = _saved_backward(ctx, dout, dprobs)
        if saved is None:
            return _backward_probs(ctx, dout, dprobs)
        bwd, tables = saved
        split_sizes, sorted_idxs = ctx.saved_tensors
        need_inp = ctx.needs_input_grad[0] and dout is not None
        need_probs = ctx.needs_input_grad[1] and dprobs is not None
        if need_inp and need_probs:  # one fused launch for both
            d_inp, d_probs = bwd(dout, dprobs, split_sizes, sorted_idxs, tables)
        else:  # the same tables gather a single tensor (no probs)
            one = _launch.backward_saved
            d_inp = one(dout, split_sizes, sorted_idxs, tables) if need_inp else None
            d_probs = one(dprobs, split_sizes, sorted_idxs, tables) if need_probs else None
        return d_inp, d_probs, None, None


_sort_chunks_probs = _eager_call(sort_chunks_probs_op, _SortChunksProbsEager)


# -- public functions --------------------------------------------------------------------------------

def _index_tensor(op: str, name: str, v: IntList) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{op}: {name} must be a 1-D integer tensor or a list of ints, got {type(v).__name__}")
    try:
        vals = [operator.index(x) for x in v]
    except TypeError:
        raise TypeError(f"{op}: {name} must hold ints, got {[type(x).__name__ for x in v][:8]}") from None
    return torch.tensor(vals, dtype=torch.int64)


def sort_chunks_by_idx(inp: torch.Tensor, split_sizes: IntList, sorted_idxs: IntList) -> torch.Tensor:
    """Reorder consecutive row chunks of ``inp`` (MoE all-to-all token regrouping, SPEC 1.6).

    Chunk ``j`` holds rows ``[Σ_{m<j} split_sizes[m], Σ_{m≤j} split_sizes[m])``; output chunk ``k`` is
    input chunk ``sorted_idxs[k]``, placed consecutively from row 0. Rows at index ``≥ Σ split_sizes``
    stay at their index. Example: ``split_sizes=[2, 3, 1]``, ``sorted_idxs=[2, 0, 1]`` gives input rows
    ``[5, 0, 1, 2, 3, 4]``.

    Args:
        inp: ``[num_tokens, *]``, any dtype (float or integer), any strides; copied bitwise.
        split_sizes: ``[num_splits]`` integers ``≥ 0`` (list, CPU tensor or tensor on ``inp``'s device).
        sorted_idxs: ``[num_splits]``, a permutation of ``0..num_splits-1`` (same forms).

    Returns:
        ``out``: a new contiguous tensor of ``inp``'s shape and dtype. Its gradient flows back as the
        inverse permutation (``d inp = Pᵀ d out``, exact).

    Raises:
        ValueError: wrong rank/length, ``split_sizes``/``sorted_idxs`` on another device, and, for host
            values (lists or CPU tensors), a negative size, ``sum(split_sizes) > num_tokens`` or
            ``sorted_idxs`` not a permutation. Device tensors are trusted (no host sync): invalid
            device values give an unspecified result but never an out-of-bounds access.
        TypeError: non-integer ``split_sizes``/``sorted_idxs``.

    Source: Megatron-LM / TransformerEngine MoE ``sort_chunks_by_index`` (expert-parallel all-to-all
    token dispatch: rank-major ↔ expert-major order).
    """
    return _sort_chunks(inp, _index_tensor(OP, "split_sizes", split_sizes),
                        _index_tensor(OP, "sorted_idxs", sorted_idxs))


def sort_chunks_by_idx_with_probs(inp: torch.Tensor, probs: torch.Tensor, split_sizes: IntList,
                                  sorted_idxs: IntList) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sort_chunks_by_idx` of ``inp`` and of the routing probabilities ``probs`` in one pass.

    Args:
        inp: ``[num_tokens, *]``, any dtype; copied bitwise.
        probs: ``[num_tokens]``, fp32/fp16/bf16/fp64, any stride; permuted identically (bitwise).
        split_sizes, sorted_idxs: as in :func:`sort_chunks_by_idx`.

    Returns:
        ``(out, permuted_probs)``, new contiguous tensors; both gradients are the inverse permutation.

    Raises:
        As :func:`sort_chunks_by_idx`; also ``ValueError`` when ``probs`` is not ``[num_tokens]`` or on
        another device, ``TypeError`` when it is not floating point.

    Source: Megatron-LM / TransformerEngine ``sort_chunks_by_index_with_probs``.
    """
    return _sort_chunks_probs(inp, probs, _index_tensor(OP_PROBS, "split_sizes", split_sizes),
                              _index_tensor(OP_PROBS, "sorted_idxs", sorted_idxs))


moe_sort_chunks_by_index = sort_chunks_by_idx
moe_sort_chunks_by_index_with_probs = sort_chunks_by_idx_with_probs
