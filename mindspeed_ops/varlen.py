"""Packed-sequence (varlen) helpers shared by every family that takes ``cu_seqlens`` (SPEC 0.3)."""
from __future__ import annotations

import torch


def build_chunk_indices(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[NT, 2]`` int32 table of ``(sequence id, chunk id inside the sequence)`` for the
    ``NT = Σ_n ceil(L_n / chunk_size)`` chunks, in packed order, on ``cu_seqlens.device``. No checks:
    callers validate (``validation.check_cu_seqlens``)."""
    cu = cu_seqlens.to(torch.int64)
    n_chunks = (cu[1:] - cu[:-1] + chunk_size - 1) // chunk_size
    seq_ids = torch.repeat_interleave(torch.arange(n_chunks.numel(), device=cu.device), n_chunks)
    first = torch.repeat_interleave(torch.cumsum(n_chunks, 0) - n_chunks, n_chunks)
    chunk_ids = torch.arange(seq_ids.numel(), device=cu.device) - first
    return torch.stack([seq_ids, chunk_ids], dim=1).to(torch.int32)
