from ...ops.kda import chunk_kda_bwd_wy_dqkg_fused

__all__ = ["chunk_kda_bwd_wy_dqkg_fused"]
