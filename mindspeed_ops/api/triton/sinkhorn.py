from ...ops.mhc import hc_split_sinkhorn, sinkhorn, sinkhorn_knopp

__all__ = ["sinkhorn", "hc_split_sinkhorn", "sinkhorn_knopp"]
