"""Pure-PyTorch reference of the RoPE family (SPEC 1.5): the CPU path and the test oracle.

Computes in fp32 for fp16/bf16/fp32 inputs and in float64 for float64 inputs, rounding once when the
result is copied back into ``x``.
"""
from __future__ import annotations

from typing import Optional

import torch


def positions(x: torch.Tensor, cos: torch.Tensor, position_ids: Optional[torch.Tensor]) -> torch.Tensor:
    """Positions of ``x``'s tokens (``position_ids`` or ``arange(T)``), checked against ``[0, T_max)``.

    Raises:
        IndexError: a position outside ``[0, cos.shape[0])`` (this reads the values: a device sync on
            GPU tensors, acceptable for the reference only).
    """
    T, t_max = x.shape[-3], cos.shape[0]
    if position_ids is None:
        if T > t_max:
            raise IndexError(f"inplace_rope: positions 0..{T - 1} (T = {T}) are outside [0, T_max) = [0, {t_max})")
        return torch.arange(T, device=x.device)
    pos = position_ids.long()
    if pos.numel():
        lo, hi = int(pos.min()), int(pos.max())
        if lo < 0 or hi >= t_max:
            bad = lo if lo < 0 else hi
            raise IndexError(f"inplace_rope: position_ids must lie in [0, T_max) = [0, {t_max}), got {bad}")
    return pos


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
           inverse: bool = False) -> torch.Tensor:
    """The rotated rope channels ``x[..., D-R:]`` as a new tensor in the compute dtype (fp32/fp64).

    Pair ``i`` = channels ``(D-R+2i, D-R+2i+1)`` = ``(a, b)`` of a token at position ``p``:
    ``a' = a·cos[p,i] − b·sin[p,i]``, ``b' = a·sin[p,i] + b·cos[p,i]`` (``sin → −sin`` if ``inverse``).
    """
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    R, D = 2 * cos.shape[-1], x.shape[-1]
    pos = positions(x, cos, position_ids)
    c = cos.to(cdt)[pos].unsqueeze(-2)  # [..., T, 1, R/2]: broadcast over heads
    s = sin.to(cdt)[pos].unsqueeze(-2)
    if inverse:
        s = -s
    xr = x[..., D - R:].to(cdt)
    a, b = xr[..., 0::2], xr[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


def inplace_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                 inverse: bool = False) -> torch.Tensor:
    """DeepSeek-V4 interleaved RoPE of the last ``R = 2·cos.shape[-1]`` channels of each head, in place.

    Args:
        x: ``[B, T, H, D]`` or packed ``[T, H, D]``, fp32/fp16/bf16/fp64, any strides.
        cos, sin: ``[T_max, R/2]``, any float dtype (used in the compute dtype).
        position_ids: ``[B, T]`` or ``[T]`` integer positions (default ``arange(T)``).
        inverse: rotate by ``−θ``.

    Returns:
        ``x`` itself, its rope channels rotated (computed in fp32, fp64 for fp64 ``x``, rounded once);
        the first ``D − R`` channels are untouched. Differentiable by autograd when ``x`` is not a leaf.

    Raises:
        IndexError: a position outside ``[0, T_max)``.
    """
    D, R = x.shape[-1], 2 * cos.shape[-1]
    out = rotate(x, cos, sin, position_ids, inverse)
    x[..., D - R:].copy_(out)
    return x


def rope_cos_sin(t_max: int, rope_dim: int, base: float = 10000.0, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard RoPE tables for tests and benchmarks: ``θ[p, i] = p · base^(−2i/R)``; returns
    ``(cos θ, sin θ)``, each ``[t_max, rope_dim/2]`` in ``dtype`` (angles computed in float64)."""
    inv_freq = base ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64, device=device) / rope_dim)
    ang = torch.arange(t_max, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)
