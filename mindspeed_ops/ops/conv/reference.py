"""Pure-PyTorch reference of the convolution family (SPEC 1.9): the CPU path and the test oracle.

Computes in fp32 for fp16/bf16/fp32 inputs and in float64 for float64 inputs, rounding once. The
token-major reference gathers, for each tap, the input it reads (a token of the same sequence, a slot
of the initial state, or zero) and sums the taps; it is differentiable by autograd (the backward oracle).
"""
from __future__ import annotations

from typing import Optional

import torch


def _cdt(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _act(a: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    return a * torch.sigmoid(a) if activation in ("silu", "swish") else a


def _layout(B: int, T: int, cu_seqlens: Optional[torch.Tensor], device):
    """Per packed row g (of B*T): sequence id, position in the sequence, valid (not a tail token);
    per sequence: start row, length."""
    g = torch.arange(B * T, device=device)
    if cu_seqlens is None:
        n, p = g // max(T, 1), g % max(T, 1)
        valid = torch.ones_like(g, dtype=torch.bool)
        starts = torch.arange(B, device=device) * T
        lens = torch.full((B,), T, device=device)
    else:
        cu = cu_seqlens.to(device=device, dtype=torch.int64)
        starts, lens = cu[:-1], cu[1:] - cu[:-1]
        valid = g < cu[-1]
        n = (torch.searchsorted(cu, g, right=True) - 1).clamp(0, max(cu.numel() - 2, 0))
        p = g - cu[n.clamp(max=cu.numel() - 1)]
    return n, p, valid, starts, lens


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                  residual: Optional[torch.Tensor] = None, initial_state: Optional[torch.Tensor] = None,
                  activation: Optional[str] = None, cu_seqlens: Optional[torch.Tensor] = None,
                  output_final_state: bool = False):
    """Token-major depthwise causal convolution (SPEC 1.9.1); returns ``(y, final_state or None)``."""
    cdt = _cdt(x)
    B, T, D = x.shape
    W = weight.shape[0]
    n, p, valid, starts, lens = _layout(B, T, cu_seqlens, x.device)
    N = starts.numel()
    rows = B * T
    # source rows: the packed tokens, then the state slots (row rows + n*W + m), then one zero row
    parts = [x.reshape(rows, D).to(cdt)]
    if initial_state is not None:
        parts.append(initial_state.to(cdt).transpose(1, 2).reshape(N * W, D))
    zero_row = rows + (N * W if initial_state is not None else 0)
    parts.append(torch.zeros(1, D, dtype=cdt, device=x.device))
    src = torch.cat(parts, 0)

    def index(seq, pos, tok):
        """Source row of extended position ``pos`` of sequence ``seq`` (``tok``: its packed row if pos >= 0)."""
        if initial_state is not None:
            from_state = rows + seq * W + (pos + W).clamp(min=0)
            other = torch.where(pos >= -W, from_state, torch.full_like(pos, zero_row))
        else:
            other = torch.full_like(pos, zero_row)
        return torch.where(pos >= 0, tok, other)

    a = torch.zeros(rows, D, dtype=cdt, device=x.device)
    if bias is not None:
        a = a + bias.to(cdt)
    for j in range(W):
        s = W - 1 - j  # tap j reads the token s steps back
        idx = index(n, p - s, torch.arange(rows, device=x.device) - s)
        idx = torch.where(valid, idx, torch.full_like(idx, zero_row))  # tail tokens read nothing
        a = a + weight[j].to(cdt) * src.index_select(0, idx)
    y = _act(a, activation)
    if residual is not None:
        y = y + residual.reshape(rows, D).to(cdt)
    y = torch.where(valid[:, None], y, torch.zeros((), dtype=cdt, device=x.device))
    y = y.reshape(B, T, D).to(x.dtype)
    if not output_final_state:
        return y, None
    m = torch.arange(W, device=x.device)
    pos = lens[:, None] - W + m[None, :]                       # [N, W]
    seq = torch.arange(N, device=x.device)[:, None].expand(N, W)
    idx = index(seq, pos, starts[:, None] + pos).reshape(-1)
    fs_dtype = initial_state.dtype if initial_state is not None else x.dtype
    fs = src.index_select(0, idx).reshape(N, W, D).transpose(1, 2).to(fs_dtype)
    return y, fs


def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     seq_idx: Optional[torch.Tensor] = None, initial_states: Optional[torch.Tensor] = None,
                     return_final_states: bool = False, final_states_out: Optional[torch.Tensor] = None,
                     activation: Optional[str] = None):
    """Channel-major form (SPEC 1.9.2) written directly from its definition: a tap from time ``τ`` to
    output ``t`` counts only when ``seq_idx[b, τ] == seq_idx[b, t]``; ``seq_idx < 0`` outputs 0."""
    cdt = _cdt(x)
    B, D, T = x.shape
    W = weight.shape[1]
    xc = x.to(cdt)
    pre = initial_states.to(cdt) if initial_states is not None else xc.new_zeros(B, D, W - 1)
    xe = torch.cat([pre, xc], -1)                                # time τ at index τ + W - 1
    a = xc.new_zeros(B, D, T) if bias is None else bias.to(cdt)[None, :, None].expand(B, D, T)
    if seq_idx is not None:
        sie = torch.cat([seq_idx.new_full((B, W - 1), -(2 ** 30)), seq_idx], -1)
    for w in range(W):
        tap = xe[..., w:w + T]
        if seq_idx is not None:
            same = (sie[:, w:w + T] == seq_idx)[:, None, :]
            tap = torch.where(same, tap, torch.zeros((), dtype=cdt))
        a = a + weight[:, w].to(cdt)[None, :, None] * tap
    out = _act(a, activation)
    if seq_idx is not None:
        out = torch.where((seq_idx >= 0)[:, None, :], out, torch.zeros((), dtype=cdt))
    out = out.to(x.dtype)
    if not (return_final_states or final_states_out is not None):
        return out
    fs = xe[..., xe.shape[-1] - (W - 1):]
    fs = fs.to(initial_states.dtype if initial_states is not None else x.dtype)
    if final_states_out is not None:
        final_states_out.copy_(fs)
        fs = final_states_out
    return out, fs


def causal_conv1d_fn_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                          activation: Optional[str] = None) -> torch.Tensor:
    """Grouped-``conv1d`` formulation of :func:`causal_conv1d_fn` without states or ``seq_idx``."""
    cdt = _cdt(x)
    W = weight.shape[1]
    a = torch.nn.functional.conv1d(x.to(cdt), weight.to(cdt)[:, None, :], None if bias is None else bias.to(cdt),
                                   padding=W - 1, groups=x.shape[1])[..., :x.shape[-1]]
    return _act(a, activation).to(x.dtype)
