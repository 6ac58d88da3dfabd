from ...ops.gdn.bwd_dqkwg import chunk_bwd_dqkwg

__all__ = ["chunk_bwd_dqkwg"]
