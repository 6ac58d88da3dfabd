"""The in-kernel q/k l2norm of the GDN and KDA ops as their backward sees it (SPEC 1.10.10, 1.11.3).

The forward op writes the normalized ``q̂ = q·rstd``, ``k̂`` (in the inputs' dtype) and their fp32 rstd
besides its output, and autograd saves those in place of the raw q and k (the same memory; fla saves the
same), so the backward runs on them instead of normalizing q and k again (two launches a step). The forward
stages themselves still take the raw q, k and the rstd (q̂ is never rounded there). Every backend returns the
four tensors, so the ops' outputs match their fake functions everywhere.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ..norm import reference as _norm_ref


def normalize(q: torch.Tensor, k: torch.Tensor, eps: float, q_rstd: Optional[torch.Tensor] = None,
              k_rstd: Optional[torch.Tensor] = None) -> tuple:
    """``(q̂, k̂, q_rstd, k_rstd)`` by the l2norm kernels of q's device (one launch each). Given ``q_rstd``/``k_rstd``
    (the forward's, saved), ``q``/``k`` are already the forward's ``q̂``/``k̂``: returned as they are."""
    if q_rstd is not None:
        return q, k, q_rstd.contiguous(), k_rstd.contiguous()  # per-token reads in the kernels: unit stride
    l2 = backends.implementation("l2norm", q.device)
    (qn, q_rstd), (kn, k_rstd) = l2.forward(q, eps, None), l2.forward(k, eps, None)
    return qn, kn, q_rstd, k_rstd


def normalize_reference(q: torch.Tensor, k: torch.Tensor, eps: float) -> tuple:
    """:func:`normalize` by the pure-PyTorch l2norm (the reference backends' forward)."""
    (qn, q_rstd), (kn, k_rstd) = _norm_ref.l2norm_fwd(q, eps), _norm_ref.l2norm_fwd(k, eps)
    return qn, kn, q_rstd, k_rstd


def fake(q: torch.Tensor, use_l2: bool) -> tuple:
    """The fake functions' ``(qn, kn, q_rstd, k_rstd)``: empty tensors without the in-kernel l2norm."""
    if not use_l2:
        return tuple(q.new_empty(0) for _ in range(4))
    r = q.shape[:-1]
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(r, dtype=torch.float32), \
        q.new_empty(r, dtype=torch.float32)


def saved(q: torch.Tensor, k: torch.Tensor, outputs, use_l2: bool) -> tuple:
    """What autograd saves of q and k: ``(q̂, k̂, q_rstd, k_rstd)`` from the forward op's ``outputs`` with the
    in-kernel l2norm, else ``(q, k, None, None)``."""
    return tuple(outputs) if use_l2 else (q, k, None, None)


def through_norm(grads: tuple, q: torch.Tensor, k: torch.Tensor, q_rstd: torch.Tensor, k_rstd: torch.Tensor):
    """Gradients w.r.t. ``q̂``/``k̂`` (``grads[:2]``, from autograd of a reference run without the l2norm on the
    saved ``q``/``k`` = ``q̂``/``k̂``) taken through the l2norm by its closed form (the exact chain rule:
    ``dx = rstd·(dŷ − ŷ·Σ dŷ·ŷ)``); the other gradients as they are."""
    dqn, dkn, *rest = grads
    return (_norm_ref.l2norm_bwd(q, q_rstd, dqn), _norm_ref.l2norm_bwd(k, k_rstd, dkn), *rest)
