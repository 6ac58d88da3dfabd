"""RoPE family (SPEC 1.5): ``inplace_rope`` (DeepSeek-V4 interleaved rotary embedding, in place)."""
from .autograd import InplaceRopeFunction, inplace_rope

__all__ = ["inplace_rope", "InplaceRopeFunction"]
