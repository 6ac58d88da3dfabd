from ...ops.gdn.kkt import chunk_scaled_dot_kkt, chunk_scaled_dot_kkt_fwd

__all__ = ["chunk_scaled_dot_kkt_fwd", "chunk_scaled_dot_kkt"]
