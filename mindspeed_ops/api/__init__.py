"""Public API: every operator re-exported flat (``api.<name>``); explicit-backend paths in
``api.triton.<module>`` / ``api.tilelang.<module>`` (MindSpeed-compatible, SPEC 2.1)."""
from .triton.chunk_bwd_dqkwg import chunk_bwd_dqkwg
from .triton.chunk_bwd_dv_local import chunk_bwd_dv_local
from .triton.chunk_fwd_o import chunk_fwd_o
from .triton.chunk_gated_delta_rule import ChunkGatedDeltaRuleFunction, chunk_gated_delta_rule
from .triton.chunk_gated_delta_rule_bwd_dhu import chunk_gated_delta_rule_bwd_dhu
from .triton.chunk_gated_delta_rule_fwd_h import chunk_gated_delta_rule_fwd_h
from .triton.chunk_local_cumsum import chunk_local_cumsum
from .triton.chunk_kda import ChunkKDAFunction, chunk_kda
from .triton.chunk_kda_bwd import chunk_kda_bwd_wy_dqkg_fused
from .triton.chunk_kda_fwd_intra import chunk_kda_fwd_intra
from .triton.chunk_loss import chunk_loss
from .triton.chunk_scaled_dot_kkt import chunk_scaled_dot_kkt, chunk_scaled_dot_kkt_fwd
from .triton.clipped_swiglu import clipped_swiglu
from .triton.convolution import CausalConv1dFunction, causal_conv1d, causal_conv1d_fn
from .triton.fused_cross_entropy_loss import (FusedCrossEntropyLoss, FusedCrossEntropyLossFunction,
                                              fused_cross_entropy_loss)
from .triton.fused_recurrent_gated_delta_rule import fused_recurrent_gated_delta_rule
from .triton.inplace_rope import inplace_rope
from .triton.l2norm import L2Norm, l2norm, l2norm_bwd, l2norm_fwd
from .triton.mhc_post import mhc_post
from .triton.mhc_pre_bmm import mhc_pre_bmm
from .triton.rms_norm import rms_norm
from .triton.rms_norm_gated import FusedRMSNormGated, rms_norm_gated
from .triton.rmsnorm_without_weight import rmsnorm_without_weight
from .triton.sinkhorn import hc_split_sinkhorn, sinkhorn, sinkhorn_knopp
from .triton.solve_tril import solve_tril
from .triton.sort_chunks_by_idx import (moe_sort_chunks_by_index, moe_sort_chunks_by_index_with_probs,
                                        sort_chunks_by_idx, sort_chunks_by_idx_with_probs)
from .triton.wy_fast import prepare_wy_repr_bwd, recompute_w_u_fwd
from .triton.utils import get_available_device, prepare_chunk_indices

__all__ = [
    "chunk_kda", "ChunkKDAFunction", "chunk_kda_fwd_intra", "chunk_kda_bwd_wy_dqkg_fused",
    "chunk_gated_delta_rule", "ChunkGatedDeltaRuleFunction", "chunk_scaled_dot_kkt_fwd", "chunk_scaled_dot_kkt",
    "recompute_w_u_fwd", "prepare_wy_repr_bwd", "chunk_gated_delta_rule_fwd_h", "chunk_fwd_o",
    "fused_recurrent_gated_delta_rule", "chunk_bwd_dv_local", "chunk_gated_delta_rule_bwd_dhu", "chunk_bwd_dqkwg",
    "sinkhorn", "hc_split_sinkhorn", "sinkhorn_knopp", "mhc_pre_bmm", "mhc_post", "chunk_local_cumsum", "solve_tril", "chunk_loss", "fused_cross_entropy_loss", "FusedCrossEntropyLoss", "FusedCrossEntropyLossFunction",
    "clipped_swiglu", "causal_conv1d", "CausalConv1dFunction", "causal_conv1d_fn", "inplace_rope", "l2norm", "l2norm_fwd", "l2norm_bwd", "L2Norm", "rms_norm",
    "rmsnorm_without_weight", "sort_chunks_by_idx", "sort_chunks_by_idx_with_probs", "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs", "rms_norm_gated", "FusedRMSNormGated", "get_available_device", "prepare_chunk_indices",
]
