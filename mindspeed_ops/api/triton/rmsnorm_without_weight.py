from ...ops.norm import rmsnorm_without_weight

__all__ = ["rmsnorm_without_weight"]
