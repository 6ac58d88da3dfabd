"""The in-kernel q/k l2norm of the GDN and KDA ops as their backward sees it (SPEC 1.10.10, 1.11.3).

The forward op writes the normalized ``q̂ = q·rstd``, ``k̂`` (in the inputs' dtype) and their fp32 rstd
besides its output, and autograd saves those in place of the raw q and k (the same memory when nothing else
keeps the raw ones alive; fla saves the same), so the backward runs on them instead of normalizing q and k
again (two launches a step). Where q and k are views of v's storage (HF Qwen3-Next splits one projection), the
saved v keeps the raw q, k alive anyway: then they are saved and normalized again in the backward, as q̂, k̂
would be memory on top (:func:`save_normalized`). The forward stages themselves still take the raw q, k and
the rstd (q̂ is never rounded there). Every backend returns the four tensors, so the ops' outputs match their
fake functions everywhere.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ..common import records_autograd
from ..norm import reference as _norm_ref
from ..norm.l2norm import forward_pair as _l2_pair
from .common import zero_tail_rows


def normalize(q: torch.Tensor, k: torch.Tensor, eps: float, q_rstd: Optional[torch.Tensor] = None,
              k_rstd: Optional[torch.Tensor] = None, write: bool = True) -> tuple:
    """``(q̂, k̂, q_rstd, k_rstd)`` by the l2norm kernels of q's device (one launch for both where the backend has
    ``forward_pair``, as Triton's; else one each). Given ``q_rstd``/``k_rstd`` (the forward's, saved), ``q``/``k``
    are already the forward's ``q̂``/``k̂``: returned as they are. ``write=False`` (a forward whose outputs no
    backward will use): ``(None, None, q_rstd, k_rstd)``, the normalized rows never written (the Triton launch
    reads q and k only)."""
    if q_rstd is not None:
        return q, k, q_rstd.contiguous(), k_rstd.contiguous()  # per-token reads in the kernels: unit stride
    if not write:
        return _l2_pair(q, k, eps, write=False)
    l2 = backends.implementation("l2norm", q.device)
    if "forward_pair" in l2.fns:
        return l2.forward_pair(q, k, eps)
    (qn, q_rstd), (kn, k_rstd) = l2.forward(q, eps, None), l2.forward(k, eps, None)
    return qn, kn, q_rstd, k_rstd


def normalize_reference(q: torch.Tensor, k: torch.Tensor, eps: float) -> tuple:
    """:func:`normalize` by the pure-PyTorch l2norm (the reference backends' forward)."""
    (qn, q_rstd), (kn, k_rstd) = _norm_ref.l2norm_fwd(q, eps), _norm_ref.l2norm_fwd(k, eps)
    return qn, kn, q_rstd, k_rstd


def wanted(use_l2: bool, return_qk_norm: bool) -> bool:
    """Whether the forward op returns (and autograd saves) ``q̂, k̂`` and the rstd."""
    return bool(use_l2 and return_qk_norm)


def save_normalized(q, k, v, *others: Optional[torch.Tensor]) -> bool:
    """What the ops' public functions pass as ``return_qk_norm``. True where autograd will record the call (grad
    mode on and an input that requires grad) and saving ``q̂, k̂`` instead of q and k costs no memory: a
    forward-only call does not write them (one write of q and k less), and where q and k are both views of v's
    storage (one split projection) the saved v keeps them alive anyway, so they are saved themselves. False under
    torch.compile: storage identity is no traced property, and saving q̂, k̂ for views would add memory, so a
    compiled graph keeps the recomputing backward (the memory of before)."""
    if torch.compiler.is_compiling() or not records_autograd(q, k, v, *others):
        return False
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return True  # the op's argument checks raise
    base = v.untyped_storage().data_ptr()
    return not (q.untyped_storage().data_ptr() == base and k.untyped_storage().data_ptr() == base)


def fake(q: torch.Tensor, want: bool) -> tuple:
    """The fake functions' ``(qn, kn, q_rstd, k_rstd)``: empty tensors unless ``want`` (:func:`wanted`)."""
    if not want:
        return tuple(q.new_empty(0) for _ in range(4))
    r = q.shape[:-1]
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(r, dtype=torch.float32), \
        q.new_empty(r, dtype=torch.float32)


def saved(q: torch.Tensor, k: torch.Tensor, outputs, want: bool) -> tuple:
    """What autograd saves of q and k: ``(q̂, k̂, q_rstd, k_rstd)`` from the forward op's ``outputs`` where it
    returned them (``want``, :func:`wanted`), else ``(q, k, None, None)`` (the backward normalizes again)."""
    return tuple(outputs) if want else (q, k, None, None)


def through_norm(grads: tuple, q: torch.Tensor, k: torch.Tensor, q_rstd: torch.Tensor, k_rstd: torch.Tensor,
                 cu_host: Optional[list]):
    """Gradients w.r.t. ``q̂``/``k̂`` (``grads[:2]``, from autograd of a reference run without the l2norm on the
    saved ``q``/``k`` = ``q̂``/``k̂``) taken through the l2norm by its closed form (the exact chain rule:
    ``dx = rstd·(dŷ − ŷ·Σ dŷ·ŷ)``); the other gradients as they are. Rows past ``cu_host[-1]`` (varlen tail tokens,
    whose q̂ may be NaN) get zeros, as autograd through the whole reference gives them."""
    dqn, dkn, *rest = grads
    dq, dk = _norm_ref.l2norm_bwd(q, q_rstd, dqn), _norm_ref.l2norm_bwd(k, k_rstd, dkn)
    zero_tail_rows(cu_host, dq, dk)
    return (dq, dk, *rest)
