"""Pure-PyTorch reference of the loss family (SPEC 1.7, 1.8): the CPU path and the test oracle.

Computes in fp32 for fp16/bf16/fp32 inputs and in float64 for float64 inputs; losses and ``lse`` are
returned in that precision (fp32 unless float64 went in). The formula is written out explicitly
(``logsumexp``, the target logit, the mean of ``z``, the z-loss), with ignored rows masked before any
gather, so autograd through it is the backward oracle.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..common import autocast_off, has_autocast

_NAN = float("nan")


def _acc_dtype(*tensors: Optional[torch.Tensor]) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def cross_entropy_rows(logits: torch.Tensor, labels: torch.Tensor, loss_weight: Optional[torch.Tensor] = None,
                       ignore_index: int = -100, label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
                       softcap: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row weighted loss ``w_i·ℓ_i`` and ``lse_i`` (SPEC 1.7), both of shape ``logits.shape[:-1]``.

    ``ℓ_i = (1−ε)(lse_i − z_{i,y}) + ε(lse_i − mean_j z_ij) + λ·lse_i²`` with ``z = softcap·tanh(x/softcap)``
    (or ``x``). Ignored rows (``labels == ignore_index``) give 0 and a zero gradient; a label outside ``[0, V)``
    that is not ignored gives a NaN loss and a NaN gradient row. ``lse`` is detached and finite for every row
    with finite logits (ignored and out-of-range rows included).
    """
    acc = _acc_dtype(logits, loss_weight)
    x = logits.to(acc)
    V = x.shape[-1]
    z = softcap * torch.tanh(x / softcap) if softcap is not None and softcap != float("inf") else x
    labels = labels.long()
    valid = labels != ignore_index
    inrange = (labels >= 0) & (labels < V)
    lse_out = torch.logsumexp(z.detach(), dim=-1)
    # out-of-range rows: NaN in every term, so both the loss and its gradient row are NaN
    z = z * torch.where(valid & ~inrange, _NAN, 1.0).to(acc).unsqueeze(-1)
    lse = torch.logsumexp(z, dim=-1)
    safe = torch.where(valid & inrange, labels, torch.zeros_like(labels))
    z_y = z.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    loss = (1.0 - label_smoothing) * (lse - z_y)
    if label_smoothing:
        loss = loss + label_smoothing * (lse - z.mean(dim=-1))
    if lse_square_scale:
        loss = loss + lse_square_scale * lse.square()
    if loss_weight is not None:  # ignored rows' weights leave the graph too (an inf there must not give 0·inf)
        loss = loss * torch.where(valid, loss_weight.to(acc), torch.zeros((), dtype=acc, device=loss.device))
    loss = torch.where(valid, loss, torch.zeros((), dtype=acc, device=loss.device))
    return loss, lse_out


def reduce_rows(rows: torch.Tensor, labels: torch.Tensor, loss_weight: Optional[torch.Tensor], ignore_index: int,
                reduction: str) -> torch.Tensor:
    """``none``: ``rows``; ``sum``: ``Σ rows``; ``mean``: ``Σ rows / Σ_valid w`` and ``0.0`` (still in the
    graph) when that denominator is 0 (SPEC 1.7, decision "empty denominator")."""
    if reduction == "none":
        return rows
    total = rows.sum()
    if reduction == "sum":
        return total
    valid = (labels != ignore_index).reshape(rows.shape)
    if loss_weight is None:
        denom = valid.sum().to(rows.dtype)
    else:  # where, not a product: a non-finite weight on an ignored row must not reach the sum
        denom = torch.where(valid, loss_weight.detach().reshape(rows.shape).to(rows.dtype), 0.0).sum()
    return total / torch.where(denom == 0, torch.ones_like(denom), denom)


def row_upstream(grad: torch.Tensor, labels: torch.Tensor, loss_weight: Optional[torch.Tensor], ignore_index: int,
                 reduction: str, dtype: torch.dtype) -> torch.Tensor:
    """Upstream gradient of each row loss ``w_i·ℓ_i`` for the reduced loss's gradient ``grad``:
    ``g/Σ_valid w`` (mean; ``g`` when that sum is 0), ``g`` (sum), ``g_i`` (none); shape ``labels.shape``."""
    grad = grad.to(dtype)
    if reduction == "none":
        return grad.expand(labels.shape)
    if reduction == "mean":
        valid = labels != ignore_index
        denom = valid.sum().to(dtype) if loss_weight is None else \
            torch.where(valid, loss_weight.detach().to(dtype), 0.0).sum()
        grad = grad / torch.where(denom == 0, torch.ones_like(denom), denom)
    return grad.expand(labels.shape)


def cross_entropy_grad(grad_rows: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
                       loss_weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                       label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
                       softcap: Optional[float] = None) -> torch.Tensor:
    """The gradient of ``Σ_i grad_rows[i]·w_i·ℓ_i`` w.r.t. ``logits``, written out (SPEC 1.7 backward):
    ``c_i·[p_ij·(1+2λ·lse_i) − ε/V − (1−ε)·[j=y_i]]·(1 − tanh²(x_ij/softcap))``, ``c_i = g_i·w_i``;
    0 on ignored rows, NaN on rows with an out-of-range label. Computed in fp32 (float64), returned
    in ``logits.dtype``. Equal to autograd through :func:`cross_entropy_rows` (tested); used by the
    reference backend, whose backward runs inside a custom op where autograd does not record."""
    acc = _acc_dtype(logits, loss_weight)
    x = logits.detach().to(acc)
    V = x.shape[-1]
    chain = None
    if softcap is not None and softcap != float("inf"):
        t = torch.tanh(x / softcap)
        z, chain = softcap * t, 1.0 - t * t
    else:
        z = x
    labels = labels.long()
    valid = labels != ignore_index
    inrange = (labels >= 0) & (labels < V)
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    d = torch.exp(z - lse) * (1.0 + 2.0 * lse_square_scale * lse) - label_smoothing / V
    safe = torch.where(valid & inrange, labels, torch.zeros_like(labels)).unsqueeze(-1)
    d = d - torch.zeros_like(d).scatter_(-1, safe, 1.0 - label_smoothing)
    c = grad_rows.detach().to(acc)
    c = c.reshape(labels.shape) if c.numel() == labels.numel() else c.expand(labels.shape)
    if loss_weight is not None:
        c = c * loss_weight.detach().to(acc)
    c = torch.where(inrange, c, torch.full_like(c, _NAN))
    d = c.unsqueeze(-1) * d
    if chain is not None:
        d = d * chain
    d = torch.where(valid.unsqueeze(-1), d, torch.zeros((), dtype=acc, device=d.device))
    return d.to(logits.dtype)


def fused_cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor, loss_weight: Optional[torch.Tensor] = None,
                             ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                             lse_square_scale: float = 0.0, softcap: Optional[float] = None,
                             return_lse: bool = False, inplace_backward: bool = False):
    """Reference of :func:`mindspeed_ops.ops.loss.fused_cross_entropy_loss` (same arguments).

    ``inplace_backward`` is accepted and ignored: autograd through the reference never writes into
    ``logits`` (the reference *backend* of the operator emulates the in-place gradient).
    """
    rows, lse = cross_entropy_rows(logits, labels, loss_weight, ignore_index, label_smoothing, lse_square_scale,
                                   softcap)
    loss = reduce_rows(rows, labels, loss_weight, ignore_index, reduction)
    return (loss, lse) if return_lse else loss


def compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """chunk_loss compute dtype: the autocast dtype when autocast is on for the device, else ``hidden.dtype``."""
    dev = hidden.device.type
    if hidden.dtype != torch.float64 and has_autocast(dev) and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return hidden.dtype


def chunk_loss_core(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: Optional[torch.Tensor],
                    loss_weight: Optional[torch.Tensor], ignore_index: int, reduction: str, label_smoothing: float,
                    lse_square_scale: float, softcap: Optional[float], compute_dtype: torch.dtype,
                    chunk_size: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, lse) of chunk_loss for ``hidden [N, Hd]`` with an explicit compute dtype.

    ``hidden``/``weight`` are rounded to ``compute_dtype`` (as the kernels' matrix products see them),
    then the logits are formed in fp32 (float64 for float64 inputs) chunk by chunk; the bias is added
    in that precision.
    """
    acc = _acc_dtype(hidden, weight)
    with autocast_off(hidden.device.type):
        h = hidden if hidden.dtype == compute_dtype else hidden.to(compute_dtype)
        w = weight if weight.dtype == compute_dtype else weight.to(compute_dtype)
        h, w = h.to(acc), w.to(acc)
        N = h.shape[0]
        step = max(1, chunk_size or N)
        rows, lses = [], []
        for i in range(0, max(N, 1), step):
            logits = h[i:i + step] @ w.t()
            if bias is not None:
                logits = logits + bias.to(acc)
            r, l = cross_entropy_rows(logits, labels[i:i + step],
                                      None if loss_weight is None else loss_weight[i:i + step],
                                      ignore_index, label_smoothing, lse_square_scale, softcap)
            rows.append(r)
            lses.append(l)
        rows = torch.cat(rows)[:N]
        lse = torch.cat(lses)[:N]
        return reduce_rows(rows, labels, loss_weight, ignore_index, reduction), lse


def chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: Optional[torch.Tensor] = None,
               loss_weight: Optional[torch.Tensor] = None, ignore_index: int = -100, reduction: str = "mean",
               label_smoothing: float = 0.0, lse_square_scale: float = 0.0, softcap: Optional[float] = None,
               return_lse: bool = False, chunk_size: Optional[int] = None,
               accum_dtype: Optional[torch.dtype] = torch.float32):
    """Reference of :func:`mindspeed_ops.ops.loss.chunk_loss` (same arguments): exactly
    ``fused_cross_entropy_loss(hidden @ weightᵀ + bias, labels, ...)`` with fp32 (float64) logits.

    ``accum_dtype`` is accepted and ignored (autograd accumulates in the working precision).
    """
    lead = hidden.shape[:-1]
    cdt = compute_dtype(hidden)
    loss, lse = chunk_loss_core(hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1), bias,
                                None if loss_weight is None else loss_weight.reshape(-1), ignore_index, reduction,
                                label_smoothing, lse_square_scale, softcap, cdt, chunk_size)
    if reduction == "none":
        loss = loss.reshape(lead)
    lse = lse.reshape(lead)
    return (loss, lse) if return_lse else loss


def chunk_loss_grads(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                     bias: Optional[torch.Tensor], loss_weight: Optional[torch.Tensor], ignore_index: int,
                     reduction: str, label_smoothing: float, lse_square_scale: float, softcap: Optional[float],
                     compute_dtype: torch.dtype, chunk_size: Optional[int] = None, need=(True, True, True)):
    """Written-out gradients ``(dhidden, dweight, dbias)`` of chunk_loss for ``hidden [N, Hd]`` and the
    gradient ``grad`` of its (reduced) loss: per chunk ``G`` from :func:`cross_entropy_grad`, then
    ``G·W``, ``Gᵀ·hidden``, ``Σ_rows G`` in fp32 (float64); each returned in its input's dtype (None
    where not in ``need`` or no bias). The reference backend's path (see :func:`cross_entropy_grad`)."""
    acc = _acc_dtype(hidden, weight)
    with autocast_off(hidden.device.type):
        h = (hidden if hidden.dtype == compute_dtype else hidden.to(compute_dtype)).detach().to(acc)
        w = (weight if weight.dtype == compute_dtype else weight.to(compute_dtype)).detach().to(acc)
        N = h.shape[0]
        rows_g = row_upstream(grad, labels, loss_weight, ignore_index, reduction, acc)
        dh = torch.zeros_like(h) if need[0] else None
        dw = torch.zeros_like(w) if need[1] else None
        db = torch.zeros(w.shape[0], dtype=acc, device=w.device) if need[2] and bias is not None else None
        step = max(1, chunk_size or N)
        for i in range(0, N, step):
            logits = h[i:i + step] @ w.t()
            if bias is not None:
                logits = logits + bias.detach().to(acc)
            G = cross_entropy_grad(rows_g[i:i + step], logits, labels[i:i + step],
                                   None if loss_weight is None else loss_weight[i:i + step], ignore_index,
                                   label_smoothing, lse_square_scale, softcap)
            if dh is not None:
                dh[i:i + step] = G @ w
            if dw is not None:
                dw += G.t() @ h[i:i + step]
            if db is not None:
                db += G.sum(0)
    return (None if dh is None else dh.to(hidden.dtype), None if dw is None else dw.to(weight.dtype),
            None if db is None else db.to(bias.dtype))
