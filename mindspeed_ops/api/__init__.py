"""Public API: every operator re-exported flat (``api.<name>``); explicit-backend paths in
``api.triton.<module>`` / ``api.tilelang.<module>`` (MindSpeed-compatible)."""
from .triton.clipped_swiglu import clipped_swiglu

__all__ = ["clipped_swiglu"]
