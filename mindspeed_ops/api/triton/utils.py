"""``prepare_chunk_indices`` and ``get_available_device`` (SPEC 2.1, 0.3)."""
from __future__ import annotations

import torch

from ...validation import check_cu_seqlens, check_positive
from ...varlen import build_chunk_indices


def get_available_device() -> str:
    """``"cuda"`` when a CUDA device is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def prepare_chunk_indices(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Chunk table of packed sequences (SPEC 0.3).

    Args:
        cu_seqlens: ``[N+1]`` int32/int64, ``cu_seqlens[0] == 0``, non-decreasing.
        chunk_size: ``BT`` > 0.

    Returns:
        ``[NT, 2]`` int32 on ``cu_seqlens.device``: row ``j`` is ``(sequence id, chunk id inside the
        sequence)`` for the ``NT = Σ_n ceil(L_n / BT)`` chunks in packed order. Zero-length sequences
        contribute no rows.

    Raises:
        ValueError/TypeError: malformed ``cu_seqlens`` or ``chunk_size <= 0``.
    """
    check_positive("prepare_chunk_indices", "chunk_size", chunk_size)
    check_cu_seqlens("prepare_chunk_indices", cu_seqlens, batch=1, total=int(cu_seqlens[-1]) if cu_seqlens.numel() else 0)
    return build_chunk_indices(cu_seqlens, chunk_size)


__all__ = ["get_available_device", "prepare_chunk_indices"]
