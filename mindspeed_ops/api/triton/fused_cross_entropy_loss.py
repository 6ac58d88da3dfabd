from ...ops.loss import FusedCrossEntropyLoss, FusedCrossEntropyLossFunction, fused_cross_entropy_loss

__all__ = ["fused_cross_entropy_loss", "FusedCrossEntropyLoss", "FusedCrossEntropyLossFunction"]
