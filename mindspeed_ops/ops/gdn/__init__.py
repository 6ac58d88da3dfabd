"""Gated DeltaNet family (SPEC 1.10): references, the forward and backward stage kernels and the full operator.

Stage functions are forward-only plain functions (not registered custom ops, no autograd);
``chunk_gated_delta_rule`` is the trainable operator (custom op ``mindspeed_ops::chunk_gated_delta_rule``).
``reference`` holds the token-by-token oracle and the chunked reference of the full operator.
"""
from .autograd import ChunkGatedDeltaRuleFunction, chunk_gated_delta_rule
from .bwd_dhu import chunk_gated_delta_rule_bwd_dhu
from .bwd_dqkwg import chunk_bwd_dqkwg
from .bwd_dv import chunk_bwd_dv_local
from .cumsum import chunk_local_cumsum
from .fused_recurrent import fused_recurrent_gated_delta_rule
from .fwd_h import chunk_gated_delta_rule_fwd_h
from .fwd_o import chunk_fwd_o
from .kkt import chunk_scaled_dot_kkt, chunk_scaled_dot_kkt_fwd
from .solve_tril import solve_tril
from .wy_fast import prepare_wy_repr_bwd, recompute_w_u_fwd

__all__ = ["chunk_gated_delta_rule", "ChunkGatedDeltaRuleFunction", "chunk_local_cumsum", "solve_tril", "chunk_scaled_dot_kkt",
           "chunk_scaled_dot_kkt_fwd", "recompute_w_u_fwd", "prepare_wy_repr_bwd", "chunk_gated_delta_rule_fwd_h",
           "chunk_fwd_o", "fused_recurrent_gated_delta_rule", "chunk_bwd_dv_local", "chunk_gated_delta_rule_bwd_dhu",
           "chunk_bwd_dqkwg"]
