from ...ops.kda import chunk_kda_fwd_intra

__all__ = ["chunk_kda_fwd_intra"]
