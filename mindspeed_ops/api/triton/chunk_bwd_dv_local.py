from ...ops.gdn.bwd_dv import chunk_bwd_dv_local

__all__ = ["chunk_bwd_dv_local"]
