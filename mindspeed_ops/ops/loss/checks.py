"""``mindspeed-ops check`` cases of the loss family (SPEC 1.7, 1.8)."""
import torch

from ...checks import CheckCase
from ...testing import randn, uniform
from . import reference as ref
from .autograd import chunk_loss, fused_cross_entropy_loss


def _labels(n, V, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    y = torch.randint(0, V, (n,), generator=g)
    y[torch.rand(n, generator=g) < 0.25] = -100
    return y.to(device)


def _ce_inputs(small, real, opts):
    def make(device, dtype, is_small):
        n, V = small if is_small else real
        d = {"logits": randn((n, V), dtype, device, seed=0, scale=2.0), "labels": _labels(n, V, device, 1)}
        if opts.get("weights"):
            d["loss_weight"] = uniform((n,), 0.0, 2.0, torch.float32, device, seed=2)
        d.update({k: v for k, v in opts.items() if k != "weights"})
        return d
    return make


def _chunk_inputs(small, real, opts):
    def make(device, dtype, is_small):
        n, Hd, V = small if is_small else real
        d = {"hidden": randn((n, Hd), dtype, device, seed=0), "weight": randn((V, Hd), dtype, device, seed=1,
                                                                             scale=2 * Hd ** -0.5),
             "labels": _labels(n, V, device, 2)}
        if opts.get("bias"):
            d["bias"] = randn((V,), dtype, device, seed=3)
        d.update({k: v for k, v in opts.items() if k != "bias"})
        return d
    return make


_CE_OPTS = [
    ("plain", {}),
    ("eps=0.1 z-loss weighted", {"label_smoothing": 0.1, "lse_square_scale": 1e-4, "weights": True}),
    ("softcap=30 none", {"softcap": 30.0, "reduction": "none"}),
]
_CHUNK_OPTS = [
    ("plain", {}),
    ("bias eps=0.1 z-loss softcap", {"bias": True, "label_smoothing": 0.1, "lse_square_scale": 1e-4, "softcap": 30.0}),
    ("none", {"reduction": "none"}),
]

# "Real" shapes keep the real vocabulary sizes (the kernels' tiles depend on V and the dtype only) with
# a moderate N·Hd: the compile-only check records real shapes "dry" on CPU, where chunk_loss's cuBLAS
# products run as CPU matmuls. Full-size accuracy (N = 8192, Hd = 4096 / 2880) is in the [gpu] unit tests.
CASES = [
    CheckCase("fused_cross_entropy_loss", f"{name} {list(real)}", _ce_inputs(small, real, opts),
              fused_cross_entropy_loss, ref.fused_cross_entropy_loss, out_classes=("STAT",), grad_inputs=("logits",),
              grad_class="E-fwd")
    for small, real in [((32, 1000), (4096, 151936)), ((16, 3001), (4096, 32000)), ((8, 5000), (1024, 201088))]
    for name, opts in _CE_OPTS
] + [
    CheckCase("chunk_loss", f"{name} {list(real)}", _chunk_inputs(small, real, opts), chunk_loss, ref.chunk_loss,
              out_classes=("STAT",), grad_inputs=("hidden", "weight") + (("bias",) if opts.get("bias") else ()))
    for small, real in [((40, 32, 500), (256, 256, 151936)), ((24, 48, 3001), (300, 128, 201088))]
    for name, opts in _CHUNK_OPTS
]
