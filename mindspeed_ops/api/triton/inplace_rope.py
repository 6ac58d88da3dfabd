from ...ops.rope import inplace_rope

__all__ = ["inplace_rope"]
