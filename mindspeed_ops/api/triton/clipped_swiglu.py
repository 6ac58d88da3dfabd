from ...ops.activation import clipped_swiglu

__all__ = ["clipped_swiglu"]
