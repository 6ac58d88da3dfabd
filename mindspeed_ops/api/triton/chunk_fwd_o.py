from ...ops.gdn.fwd_o import chunk_fwd_o

__all__ = ["chunk_fwd_o"]
