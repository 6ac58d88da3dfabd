"""Host helpers shared by the GDN stage launchers: kernel-or-reference choice, chunk tables."""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ...validation import check_tensor, shape_str
from ...varlen import build_chunk_indices


def use_triton(device: torch.device) -> bool:
    """Stage kernels are plain functions (not registered ops): Triton where it can run (CUDA, or
    CPU under ``TRITON_INTERPRET=1``), the pure-PyTorch reference otherwise."""
    return backends.backend_status("triton", device)[0]


def chunk_table(op: str, cu_host: Optional[list], cu_seqlens: Optional[torch.Tensor], B: int, T: int, BT: int,
                chunk_indices: Optional[torch.Tensor]) -> tuple[int, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(NT, cu_seqlens for the kernel, chunk_indices for the kernel)``: fixed length ``NT = ceil(T/BT)``
    per batch row; varlen ``NT = Σ ceil(L_n/BT)`` and the ``[NT, 2]`` table (built if not supplied;
    a supplied one is trusted, SPEC 0.3, after a shape check)."""
    if cu_host is None:
        return (T + BT - 1) // BT, None, None
    nt = sum((b - a + BT - 1) // BT for a, b in zip(cu_host, cu_host[1:]))
    if chunk_indices is None:  # from the host copy (same table as api.triton.utils.prepare_chunk_indices)
        chunk_indices = build_chunk_indices(torch.tensor(cu_host, dtype=torch.int64), BT)
    else:
        check_tensor(op, "chunk_indices", chunk_indices, dtypes=(torch.int32, torch.int64), ndim=2)
        if tuple(chunk_indices.shape) != (nt, 2):
            raise ValueError(f"{op}: chunk_indices must have shape [NT, 2] = [{nt}, 2] for chunk_size {BT}, "
                             f"got {shape_str(chunk_indices.shape)}")
    return nt, cu_seqlens, chunk_indices
