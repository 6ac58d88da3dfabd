from ...ops.conv import CausalConv1dFunction, causal_conv1d, causal_conv1d_fn

__all__ = ["causal_conv1d", "CausalConv1dFunction", "causal_conv1d_fn"]
