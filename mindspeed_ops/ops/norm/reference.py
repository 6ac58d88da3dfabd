"""Pure-PyTorch reference of the norm family (SPEC 1.1, 1.2): the CPU path and the test oracle.

Statistics and products in fp32 for fp16/bf16/fp32 inputs, in float64 when any input is float64;
each output is rounded once, at the end. Differentiable by autograd (its gradients are the backward
oracle), except ``l2norm_bwd``, which is the closed-form backward itself.
"""
from __future__ import annotations

from typing import Optional

import torch


def _cdt(*tensors: Optional[torch.Tensor]) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def l2norm_fwd(x: torch.Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None):
    """``rstd = 1/sqrt(Σ_d x_d² + eps)`` (shape ``x.shape[:-1]``, fp32; float64 for float64 ``x``) and
    ``y = x·rstd`` in ``output_dtype`` or ``x.dtype``. ``eps`` is inside the square root."""
    cdt = _cdt(x)
    xf = x.to(cdt)
    rstd = torch.rsqrt(xf.pow(2).sum(-1) + eps)
    y = xf * rstd.unsqueeze(-1)
    return y.to(output_dtype or x.dtype), rstd


def l2norm(x: torch.Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``x / sqrt(Σ_d x_d² + eps)`` over the last dim (SPEC 1.1)."""
    return l2norm_fwd(x, eps, output_dtype)[0]


def l2norm_bwd(y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, eps: float = 1e-6,
               dx_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Closed-form l2norm backward from the forward output: ``dx = rstd·(dy − y·Σ_d dy·y)``
    (``eps`` is unused: it is inside ``rstd`` already). ``dx`` in ``dx_dtype`` or ``y.dtype``."""
    cdt = _cdt(y, dy, rstd)
    yf, dyf, rf = y.to(cdt), dy.to(cdt), rstd.to(cdt).unsqueeze(-1)
    dx = rf * (dyf - yf * (dyf * yf).sum(-1, keepdim=True))
    return dx.to(dx_dtype or y.dtype)


def rms_rstd(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``1/sqrt(mean_d(x_d²) + eps)``, keepdim ``[..., 1]``, in the compute dtype (fp32 or float64)."""
    xf = x.to(_cdt(x))
    return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rmsnorm_without_weight(x: torch.Tensor, eps: float = 1e-6, return_normalized: bool = False,
                           rstd_dtype: Optional[torch.dtype] = None):
    """``rstd = 1/sqrt(mean(x²) + eps)`` (``[..., 1]`` in ``rstd_dtype`` or ``x.dtype``) and, with
    ``return_normalized``, ``(rstd, x·rstd)`` (``y`` in ``x.dtype``)."""
    r = rms_rstd(x, eps)
    rstd = r.to(rstd_dtype or x.dtype)
    if not return_normalized:
        return rstd
    return rstd, (x.to(r.dtype) * r).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
             offset: float = 0.0) -> torch.Tensor:
    """``y = x·rstd ⊙ (weight + offset)`` computed in fp32 (float64) and rounded once to ``x.dtype``;
    ``weight=None``: ``y = x·rstd`` (``offset`` must then be 0)."""
    if weight is None and offset != 0.0:
        raise ValueError(f"rms_norm: offset must be 0.0 when weight is None, got offset={offset}")
    cdt = _cdt(x, weight)
    xf = x.to(cdt)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (weight.to(cdt) + offset)
    return y.to(x.dtype)


# ------------------------------------------------------------------------------------------------
# Closed-form backwards (the ``reference`` backend's backward; tests check them against autograd)


def rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
                 offset: float = 0.0, drstd: Optional[torch.Tensor] = None, inv_n: Optional[float] = None):
    """Row-norm backward in fp32 (float64): ``dx = r·(g − x̂·(Σ_d g·x̂ + drstd·r)·inv_n)`` with
    ``g = dy ⊙ (weight + offset)`` (``dy`` without a weight, 0 when ``dy`` is ``None``),
    ``r = 1/sqrt(Σ x²·inv_n + eps)`` recomputed from ``x`` (``inv_n`` defaults to ``1/D``: RMS).

    Returns ``(dx in x.dtype, dweight = Σ_rows dy ⊙ x̂ in weight.dtype or None)``.
    """
    cdt = _cdt(x, dy, weight, drstd)
    xf = x.to(cdt)
    inv_n = 1.0 / x.shape[-1] if inv_n is None else inv_n
    r = torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) * inv_n + eps)
    xh = xf * r
    g = torch.zeros_like(xf) if dy is None else dy.to(cdt)
    if weight is not None and dy is not None:
        g = g * (weight.to(cdt) + offset)
    s = (g * xh).sum(-1, keepdim=True)
    if drstd is not None:
        s = s + drstd.to(cdt).reshape(r.shape) * r
    dx = r * (g - xh * (s * inv_n))
    dw = None
    if weight is not None and dy is not None:
        dw = (dy.to(cdt) * xh).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    return dx.to(x.dtype), dw


def rmsnorm_without_weight_bwd(x: torch.Tensor, drstd: Optional[torch.Tensor], dy: Optional[torch.Tensor],
                               eps: float = 1e-6) -> torch.Tensor:
    """``dx = r·(dy − x̂·mean_d(dy ⊙ x̂)) − drstd·r³·x/D``, ``r`` recomputed in fp32 from ``x``."""
    return rms_norm_bwd(dy, x, None, eps, drstd=drstd)[0]
