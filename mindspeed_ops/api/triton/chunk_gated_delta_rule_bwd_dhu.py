from ...ops.gdn.bwd_dhu import chunk_gated_delta_rule_bwd_dhu

__all__ = ["chunk_gated_delta_rule_bwd_dhu"]
