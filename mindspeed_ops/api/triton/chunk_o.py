"""MindSpeed-compatible module path (SPEC 2.1): the output-side GDN stages."""
from ...ops.gdn import chunk_bwd_dqkwg, chunk_bwd_dv_local, chunk_fwd_o

__all__ = ["chunk_fwd_o", "chunk_bwd_dv_local", "chunk_bwd_dqkwg"]
