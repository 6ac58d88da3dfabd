from ...ops.norm import L2Norm, l2norm, l2norm_bwd, l2norm_fwd

__all__ = ["l2norm", "l2norm_fwd", "l2norm_bwd", "L2Norm"]
