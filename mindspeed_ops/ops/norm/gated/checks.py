"""``mindspeed-ops check`` cases of the gated RMSNorm (SPEC 1.3): model configurations at real size
(GPU) and small size (CPU interpreter)."""
import torch

from ....checks import CheckCase
from ....testing import randn
from . import reference as ref
from .autograd import rms_norm_gated

OP = "rms_norm_gated"


def _inputs(small_shape, real_shape, *, wdtype=None, bias=False, residual=False, ngroups=None, **options):
    """``make_inputs`` for ``x``/``g`` of ``[rows, D]``; ``wdtype=None``: weight in the case's dtype;
    ``ngroups``: ``group_size = D // ngroups``."""
    def make(device, dtype, small):
        rows, D = small_shape if small else real_shape
        d = {"x": randn((rows, D), dtype, device, seed=0),
             "g": randn((rows, D), dtype, device, seed=1, scale=2.0),
             "weight": randn((D,), wdtype or dtype, device, seed=2, scale=0.5, shift=1.0)}
        if bias:
            d["bias"] = randn((D,), wdtype or dtype, device, seed=3, scale=0.3)
        if residual:
            d["residual"] = randn((rows, D), dtype, device, seed=4)
        if ngroups:
            d["group_size"] = D // ngroups
        d.update(options)
        return d
    return make


def _case(name, small, real, *, bias=False, residual=False, prenorm=False, **kw):
    grads = ("x", "g", "weight") + (("bias",) if bias else ()) + (("residual",) if residual else ())
    return CheckCase(OP, name, _inputs(small, real, bias=bias, residual=residual, prenorm=prenorm, **kw),
                     rms_norm_gated, ref.rms_norm_gated, out_classes=("E-fwd", "E-fwd") if prenorm else ("E-fwd",),
                     grad_inputs=grads)


HOT_REAL = (4 * 4096 * 32, 128)  # [B·T·heads, head_dim] of a GDN/KDA output norm (B=4, T=4096, 32 heads)
HOT_SMALL = (256, 128)

CASES = [
    _case(f"qwen3-next casting=input {list(HOT_REAL)}", HOT_SMALL, HOT_REAL,
          activation="swish", eps=1e-6, casting="input"),
    _case(f"qwen3-next casting=input fp32 weight {list(HOT_REAL)}", HOT_SMALL, HOT_REAL,
          wdtype=torch.float32, activation="swish", eps=1e-6, casting="input"),
    _case(f"qwen3-next casting=fp32 {list(HOT_REAL)}", HOT_SMALL, HOT_REAL, activation="swish", eps=1e-6),
    _case(f"kimi-linear sigmoid fp32 weight {list(HOT_REAL)}", HOT_SMALL, HOT_REAL,
          wdtype=torch.float32, activation="sigmoid", eps=1e-5),
    _case("mamba2 gate-first 8 groups [16384, 8192]", (8, 512), (16384, 8192),
          ngroups=8, norm_before_gate=False, eps=1e-5),
    _case("residual prenorm fp32 residual, bias [16384, 2048]", (16, 384), (16384, 2048),
          bias=True, residual=True, prenorm=True, residual_in_fp32=True),
    _case("long row [64, 65536]", (2, 8192), (64, 65536), bias=True),
]
