from ...ops.loss import chunk_loss

__all__ = ["chunk_loss"]
