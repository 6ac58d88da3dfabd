from ...ops.gdn.autograd import ChunkGatedDeltaRuleFunction, chunk_gated_delta_rule

__all__ = ["chunk_gated_delta_rule", "ChunkGatedDeltaRuleFunction"]
