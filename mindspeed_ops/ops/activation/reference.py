"""Pure-PyTorch reference of the activation family (SPEC 1.4): the CPU path and the test oracle.

Computes in fp32 for fp16/bf16/fp32 inputs and in float64 for float64 inputs, rounding once.
"""
from __future__ import annotations

import math
from typing import Optional

import torch


def clipped_swiglu(gate_up: torch.Tensor, swiglu_alpha: float = 1.702, swiglu_limit: Optional[float] = 7.0,
                   interleaved: bool = False) -> torch.Tensor:
    """GPT-OSS clipped SwiGLU: ``min(gate, L)·σ(α·min(gate, L))·(clamp(up, -L, L) + 1)``.

    ``torch.clamp`` is used on both branches: it propagates NaN and passes the gradient at exactly
    ``±L`` (inclusive boundaries, SPEC 1.4), which ``torch.minimum`` would halve.
    """
    cdt = torch.float64 if gate_up.dtype == torch.float64 else torch.float32
    x = gate_up.to(cdt)
    if interleaved:
        gate, up = x[..., 0::2], x[..., 1::2]
    else:
        gate, up = x.chunk(2, dim=-1)
    if swiglu_limit is not None and not math.isinf(swiglu_limit):
        gate = torch.clamp(gate, max=swiglu_limit)
        up = torch.clamp(up, min=-swiglu_limit, max=swiglu_limit)
    out = gate * torch.sigmoid(swiglu_alpha * gate) * (up + 1)
    return out.to(gate_up.dtype)
