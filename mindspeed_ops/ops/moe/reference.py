"""Pure-PyTorch reference of the MoE family (SPEC 1.6): the CPU path and the test oracle.

``sort_chunks_by_idx`` is pure data movement: ``split`` + ``cat``, so any dtype is copied bitwise and
autograd through it is the inverse row permutation.
"""
from __future__ import annotations

from typing import Sequence, Union

import torch

IntList = Union[torch.Tensor, Sequence[int]]


def _host(v: IntList) -> list[int]:
    return [int(x) for x in (v.tolist() if isinstance(v, torch.Tensor) else v)]


def sort_chunks_by_idx(inp: torch.Tensor, split_sizes: IntList, sorted_idxs: IntList) -> torch.Tensor:
    """Rows of ``inp`` cut into consecutive chunks of ``split_sizes`` rows, emitted in the order
    ``sorted_idxs``; rows past ``sum(split_sizes)`` stay at their index. Reads the sizes on the host."""
    sizes, order = _host(split_sizes), _host(sorted_idxs)
    total = sum(sizes)
    chunks = torch.split(inp[:total], sizes, dim=0)
    return torch.cat([chunks[i] for i in order] + [inp[total:]], dim=0)


def sort_chunks_by_idx_with_probs(inp: torch.Tensor, probs: torch.Tensor, split_sizes: IntList,
                                  sorted_idxs: IntList) -> tuple[torch.Tensor, torch.Tensor]:
    """``sort_chunks_by_idx`` of ``inp`` and of ``probs`` (``[num_tokens]``) with the same permutation."""
    return sort_chunks_by_idx(inp, split_sizes, sorted_idxs), sort_chunks_by_idx(probs, split_sizes, sorted_idxs)
