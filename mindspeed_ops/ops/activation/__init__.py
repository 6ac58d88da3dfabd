"""Activation family: ``clipped_swiglu`` (SPEC 1.4)."""
from .autograd import clipped_swiglu

__all__ = ["clipped_swiglu"]
