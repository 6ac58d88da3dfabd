"""Loss family: ``fused_cross_entropy_loss`` / ``FusedCrossEntropyLoss`` / ``FusedCrossEntropyLossFunction``
(SPEC 1.7) and ``chunk_loss`` (SPEC 1.8)."""
from .autograd import FusedCrossEntropyLoss, FusedCrossEntropyLossFunction, chunk_loss, fused_cross_entropy_loss

__all__ = ["fused_cross_entropy_loss", "FusedCrossEntropyLoss", "FusedCrossEntropyLossFunction", "chunk_loss"]
