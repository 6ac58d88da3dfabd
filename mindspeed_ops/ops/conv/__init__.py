"""Convolution family (SPEC 1.9): ``causal_conv1d`` (+ ``CausalConv1dFunction``) and the channel-major
``causal_conv1d_fn``.

Importing this package registers the ops (``torch.ops.mindspeed_ops.causal_conv1d[_bwd]``) and their backends."""
from .autograd import CausalConv1dFunction, causal_conv1d, causal_conv1d_fn

__all__ = ["causal_conv1d", "CausalConv1dFunction", "causal_conv1d_fn"]
