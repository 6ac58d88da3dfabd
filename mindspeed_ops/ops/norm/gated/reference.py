"""Pure-PyTorch reference of the gated RMSNorm (SPEC 1.3): the CPU path and the test oracle.

Both casting modes are written out literally:

- ``casting='fp32'``: every step in fp32 (float64 for float64 inputs), one rounding at the end;
- ``casting='input'``: Qwen3-Next's rounding order (``h`` rounded to ``x.dtype``, ``weight * h`` in
  the promoted dtype, the gate product in fp32, one last rounding to ``x.dtype``).

Autograd through these functions is the backward oracle (dtype casts differentiate as identity, so
``casting='input'`` has the rounding-free gradient the SPEC asks for).
"""
from __future__ import annotations

from typing import Optional

import torch

ACTIVATIONS = ("swish", "silu", "sigmoid")
CASTINGS = ("fp32", "input")


def activation_fn(g: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(g)``: ``g·σ(g)`` for ``'swish'``/``'silu'``, ``σ(g)`` for ``'sigmoid'`` (in ``g``'s dtype)."""
    if activation in ("swish", "silu"):
        return g * torch.sigmoid(g)
    if activation == "sigmoid":
        return torch.sigmoid(g)
    raise ValueError(f"rms_norm_gated: activation must be one of {ACTIVATIONS}, got {activation!r}")


def residual_dtype(x_dtype: torch.dtype, residual_in_fp32: bool) -> torch.dtype:
    """dtype of ``residual_out``: fp32 with ``residual_in_fp32`` (float64 stays float64), else ``x.dtype``."""
    if x_dtype == torch.float64 or not residual_in_fp32:
        return x_dtype
    return torch.float32


def rms_norm_gated(x: torch.Tensor, g: torch.Tensor, weight: Optional[torch.Tensor] = None,
                   bias: Optional[torch.Tensor] = None, activation: str = "swish",
                   residual: Optional[torch.Tensor] = None, prenorm: bool = False, residual_in_fp32: bool = False,
                   eps: float = 1e-6, group_size: Optional[int] = None, norm_before_gate: bool = True,
                   casting: str = "fp32"):
    """Gated RMSNorm, reference semantics of SPEC 1.3 (same signature as the public op).

    Shapes: ``x``, ``g``, ``residual`` ``[..., D]``; ``weight``, ``bias`` ``[D]``. Returns ``y``
    (``x.dtype``) or ``(y, residual_out)`` when ``prenorm``.

    ``x' = round(residual_dtype, x + residual)`` (or ``x``) is what the norm sees and what
    ``residual_out`` holds: the residual stream is kept in ``residual_out``'s dtype.
    No argument validation here beyond the activation name (the public op validates).
    """
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    D = x.shape[-1]
    N = D if group_size is None else int(group_size)

    # 1. residual stream
    residual_out = None
    if residual is not None or prenorm:
        s = x.to(cdt) if residual is None else x.to(cdt) + residual.to(cdt)
        residual_out = s.to(residual_dtype(x.dtype, residual_in_fp32), copy=True)
        xp = residual_out.to(cdt)
    else:
        xp = x.to(cdt)

    if casting == "input":
        # Qwen3-Next gated RMSNorm, rounding order kept literally:
        #   variance = x.pow(2).mean(-1); h = (x * rsqrt(variance + eps)).to(input_dtype)
        #   h = weight * h;  y = (h * silu(gate.float())).to(input_dtype)
        variance = xp.pow(2).mean(-1, keepdim=True)
        h = (xp * torch.rsqrt(variance + eps)).to(x.dtype)
        y1 = h if weight is None else weight * h
        y = (y1 * activation_fn(g.to(cdt), activation)).to(x.dtype)
    elif casting == "fp32":
        lead = xp.shape[:-1]
        xs = xp.reshape(*lead, D // N, N)
        a = activation_fn(g.to(cdt), activation).reshape(*lead, D // N, N)
        w = None if weight is None else weight.to(cdt).reshape(D // N, N)
        b = None if bias is None else bias.to(cdt).reshape(D // N, N)
        if norm_before_gate:
            r = torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps)
            y0 = xs * r
            if w is not None:
                y0 = y0 * w
            if b is not None:
                y0 = y0 + b
            y = y0 * a
        else:
            z = xs * a
            r = torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps)
            y = z * r
            if w is not None:
                y = y * w
            if b is not None:
                y = y + b
        y = y.reshape(*lead, D).to(x.dtype)
    else:
        raise ValueError(f"rms_norm_gated: casting must be one of {CASTINGS}, got {casting!r}")
    return (y, residual_out) if prenorm else y


def rms_norm_gated_bwd(dy: torch.Tensor, dres: Optional[torch.Tensor], x: torch.Tensor, g: torch.Tensor,
                       weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                       activation: str = "swish", residual: Optional[torch.Tensor] = None, prenorm: bool = False,
                       residual_in_fp32: bool = False, eps: float = 1e-6, group_size: Optional[int] = None,
                       norm_before_gate: bool = True, casting: str = "fp32"):
    """Closed-form backward of :func:`rms_norm_gated` (the ``reference`` backend's backward).

    The SPEC 1.3 gradient written out (fp32, or float64 for float64 inputs); it equals autograd
    through :func:`rms_norm_gated` (tested in float64) and never returns aliased tensors. ``casting='input'`` uses the rounding-free math (the ``fp32`` one).
    ``dres`` is the upstream gradient of ``residual_out`` (``None``: zero). Returns
    ``(dx, dg, dweight, dbias, dresidual)`` in the dtypes of their inputs, ``None`` for absent ones.
    """
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    D = x.shape[-1]
    N = D if group_size is None else int(group_size)
    NG = D // N
    lead = x.shape[:-1]
    if residual is not None or prenorm:
        s = x.to(cdt) if residual is None else x.to(cdt) + residual.to(cdt)
        xp = s.to(residual_dtype(x.dtype, residual_in_fp32)).to(cdt)
    else:
        xp = x.to(cdt)
    xs = xp.reshape(*lead, NG, N)
    gs = g.to(cdt).reshape(*lead, NG, N)
    dys = dy.to(cdt).reshape(*lead, NG, N)
    sg = torch.sigmoid(gs)
    if activation in ("swish", "silu"):
        a = gs * sg
        da = sg + a * (1 - sg)
    else:
        a = sg
        da = sg * (1 - sg)
    w = None if weight is None else weight.to(cdt).reshape(NG, N)
    b = None if bias is None else bias.to(cdt).reshape(NG, N)
    if norm_before_gate:
        u = xs
        dy0 = dys * a  # gradient of y0 = û ⊙ w + b
    else:
        u = xs * a
        dy0 = dys  # gradient of y = û ⊙ w + b
    gw = dy0 if w is None else dy0 * w
    r = torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)
    uh = u * r
    du = r * (gw - uh * (gw * uh).mean(-1, keepdim=True))
    if norm_before_gate:
        y0 = uh if w is None else uh * w
        if b is not None:
            y0 = y0 + b
        dg = dys * y0 * da
        dxp = du
    else:
        dg = du * xs * da
        dxp = du * a
    dxp = dxp.reshape(*lead, D)
    if prenorm and dres is not None:
        dxp = dxp + dres.to(cdt)
    dw = None if weight is None else (dy0 * uh).reshape(-1, D).sum(0).to(weight.dtype)
    db = None if bias is None else dy0.reshape(-1, D).sum(0).to(bias.dtype)
    dr = None if residual is None else dxp.to(residual.dtype, copy=True)  # never an alias of dx
    return dxp.to(x.dtype), dg.reshape(*lead, D).to(g.dtype), dw, db, dr
