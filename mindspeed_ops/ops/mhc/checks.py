"""``mindspeed-ops check`` cases of the mHC family (SPEC 1.12)."""
import torch

from ...checks import CheckCase
from ...testing import randn, uniform
from . import reference as ref
from .autograd import mhc_post, mhc_pre_bmm, sinkhorn, sinkhorn_knopp


def _sinkhorn_inputs(n, small_tokens, real_tokens):
    def make(device, dtype, small):
        W = (2 + n) * n
        return {"mixes": randn((small_tokens if small else real_tokens, W), dtype, device, seed=0),
                "hc_scale": uniform((3,), 0.5, 1.5, dtype, device, seed=1),
                "hc_base": randn((W,), dtype, device, seed=2, scale=0.5), "hc_mult": n}
    return make


def _knopp_inputs(n):
    def make(device, dtype, small):
        return {"logits": randn((8 if small else 65536 // n, n, n), dtype, device, seed=3, scale=2.0)}
    return make


def _pre_inputs(n, D):
    def make(device, dtype, small):
        T, d = (4, 320) if small else (8192, D)
        return {"pre": uniform((T, n), 0.0, 1.0, torch.float32, device, seed=4),
                "x": randn((T, n, d), dtype, device, seed=5)}
    return make


def _post_inputs(n, D):
    def make(device, dtype, small):
        T, d = (4, 320) if small else (8192, D)
        return {"x": randn((T, d), dtype, device, seed=6), "residual": randn((T, n, d), dtype, device, seed=7),
                "h_post": uniform((T, n), 0.0, 2.0, torch.float32, device, seed=8),
                "h_res": uniform((T, n, n), 0.0, 1.0, torch.float32, device, seed=9)}
    return make


CASES = [
    *[CheckCase("sinkhorn", f"n={n} [65536, {(2 + n) * n}]", _sinkhorn_inputs(n, 96, 65536), sinkhorn, ref.sinkhorn,
                out_classes=("SINK-fwd",) * 3, grad_inputs=("mixes", "hc_scale", "hc_base"), grad_class="SINK-bwd")
      for n in (4, 8)],
    *[CheckCase("sinkhorn_knopp", f"n={n}", _knopp_inputs(n), sinkhorn_knopp, ref.sinkhorn_knopp,
                out_classes=("SINK-fwd",), grad_inputs=("logits",), grad_class="SINK-bwd") for n in (4, 64)],
    *[CheckCase("mhc_pre_bmm", f"n={n} [8192, {n}, {D}]", _pre_inputs(n, D), mhc_pre_bmm, ref.mhc_pre_bmm,
                grad_inputs=("pre", "x")) for n, D in ((4, 4096), (8, 7168))],
    *[CheckCase("mhc_post", f"n={n} [8192, {n}, {D}]", _post_inputs(n, D), mhc_post, ref.mhc_post,
                grad_inputs=("x", "residual", "h_post", "h_res")) for n, D in ((4, 4096), (8, 7168))],
]
