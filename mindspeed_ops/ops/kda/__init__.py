"""Kimi Delta Attention family (SPEC 1.11): references, the KDA stage kernels and the full operator.

Stage functions are forward-only plain functions (not registered custom ops, no autograd);
``chunk_kda`` is the trainable operator (custom op ``mindspeed_ops::chunk_kda``). The stages KDA shares
with Gated DeltaNet (cumsum, per-channel kkt, solve_tril, w/u, state scans) are those of ``ops/gdn``.
``reference`` holds the token-by-token oracle and the chunked reference.
"""
from .autograd import ChunkKDAFunction, chunk_kda
from .bwd import chunk_kda_bwd_wy_dqkg_fused
from .intra import chunk_kda_fwd_intra

__all__ = ["chunk_kda", "ChunkKDAFunction", "chunk_kda_fwd_intra", "chunk_kda_bwd_wy_dqkg_fused"]
