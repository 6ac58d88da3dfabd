"""``mindspeed-ops check`` cases of the convolution family (SPEC 1.9)."""
import torch

from ...checks import CheckCase
from ...testing import randn
from . import reference as ref
from .autograd import causal_conv1d, causal_conv1d_fn


def _tm_inputs(small, real, opts):
    """Token-major inputs: (B, T, D, W); opts: bias, residual, state, lens (varlen lengths, small/real)."""
    def make(device, dtype, is_small):
        B, T, D, W = small if is_small else real
        d = {"x": randn((B, T, D), dtype, device, seed=0), "weight": randn((W, D), dtype, device, seed=1, scale=0.5),
             "activation": opts.get("activation", "silu")}
        N = B
        if "lens" in opts:
            lens = opts["lens"][0 if is_small else 1]
            cu = [0]
            for n in lens:
                cu.append(cu[-1] + n)
            d["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device=device)
            N = len(lens)
        if opts.get("bias"):
            d["bias"] = randn((D,), dtype, device, seed=2)
        if opts.get("residual"):
            d["residual"] = randn((B, T, D), dtype, device, seed=3)
        if opts.get("state"):
            d["initial_state"] = randn((N, D, W), dtype, device, seed=4)
            d["output_final_state"] = True
        return d
    return make


def _fn_inputs(small, real):
    def make(device, dtype, is_small):
        B, D, T, W = small if is_small else real
        xt = randn((B, T, D), dtype, device, seed=0)
        return {"x": xt.transpose(1, 2), "weight": randn((D, W), dtype, device, seed=1, scale=0.5),
                "activation": "silu"}
    return make


CASES = [
    CheckCase("causal_conv1d", "[4, 4096, 8192] W=4 silu", _tm_inputs((2, 64, 64, 4), (4, 4096, 8192, 4), {}),
              causal_conv1d, ref.causal_conv1d, out_classes=("E-fwd", None), grad_inputs=("x", "weight")),
    CheckCase("causal_conv1d", "[1, 8192, 2048] W=4 bias residual state",
              _tm_inputs((1, 48, 40, 4), (1, 8192, 2048, 4), {"bias": True, "residual": True, "state": True}),
              causal_conv1d, ref.causal_conv1d, out_classes=("E-fwd", "EXACT"),
              grad_inputs=("x", "weight", "bias", "residual", "initial_state")),
    CheckCase("causal_conv1d", "varlen [4096, 2048, 5111] D=2048 state",
              _tm_inputs((1, 40, 32, 4), (1, 11255, 2048, 4),
                         {"bias": True, "state": True, "lens": ([9, 1, 30], [4096, 2048, 5111])}),
              causal_conv1d, ref.causal_conv1d, out_classes=("E-fwd", "EXACT"),
              grad_inputs=("x", "weight", "bias", "initial_state")),
    CheckCase("causal_conv1d", "[2, 2048, 1024] W=3 no activation",
              _tm_inputs((2, 33, 24, 3), (2, 2048, 1024, 3), {"activation": None, "bias": True}),
              causal_conv1d, ref.causal_conv1d, out_classes=("E-fwd", None), grad_inputs=("x", "weight", "bias")),
    CheckCase("causal_conv1d", "fn HF Qwen3-Next [2, 8192, 1000]", _fn_inputs((2, 32, 40, 4), (2, 8192, 1000, 4)),
              causal_conv1d_fn, ref.causal_conv1d_fn, out_classes=("E-fwd",), grad_inputs=("x", "weight")),
]
