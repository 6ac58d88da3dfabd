"""MoE family: ``sort_chunks_by_idx``, ``sort_chunks_by_idx_with_probs`` (SPEC 1.6)."""
from .autograd import (moe_sort_chunks_by_index, moe_sort_chunks_by_index_with_probs, sort_chunks_by_idx,
                       sort_chunks_by_idx_with_probs)

__all__ = ["sort_chunks_by_idx", "sort_chunks_by_idx_with_probs", "moe_sort_chunks_by_index",
           "moe_sort_chunks_by_index_with_probs"]
