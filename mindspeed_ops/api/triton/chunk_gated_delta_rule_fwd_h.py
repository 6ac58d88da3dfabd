from ...ops.gdn.fwd_h import chunk_gated_delta_rule_fwd_h

__all__ = ["chunk_gated_delta_rule_fwd_h"]
