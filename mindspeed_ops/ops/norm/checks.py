"""``mindspeed-ops check`` cases of ``l2norm``, ``rmsnorm_without_weight`` and ``rms_norm``.

Real shapes: ``[8192, 4096]`` rows (a 4k-hidden layer at 8k tokens), ``[4, 4096, 64, 128]`` heads
(GDN/KDA q/k l2norm, per-head RMSNorm), the DeepSeek-V4 mHC ``[B, S, 4·7168]`` flattened streams, and
one ``65,536``-wide row (the looped path). Small shapes keep the interpreter under ~100 programs.
"""
import torch

from ...checks import CheckCase
from ...testing import randn
from . import reference as ref
from .autograd import l2norm, rms_norm, rmsnorm_without_weight


def _x(small, real, scale=1.0, shift=0.0):
    def make(device, dtype, is_small):
        return {"x": randn(small if is_small else real, dtype, device, seed=0, scale=scale, shift=shift)}
    return make


def _xw(small, real, offset=0.0, w_dtype=None):
    def make(device, dtype, is_small):
        shape = small if is_small else real
        return {"x": randn(shape, dtype, device, seed=0),
                "weight": randn(shape[-1:], w_dtype or dtype, device, seed=1, scale=0.5, shift=1.0),
                "offset": offset}
    return make


def _rww(x, **kw):
    return rmsnorm_without_weight(x, return_normalized=True, **kw)


def _rww_ref(x, **kw):
    return ref.rmsnorm_without_weight(x, return_normalized=True, **kw)


_L2 = [((64, 128), (8192, 4096)), ((2, 8, 4, 128), (4, 4096, 64, 128)), ((3, 100), (65536, 100)),
       ((1, 65536), (1, 65536))]
_RMS = [((64, 128), (8192, 4096)), ((2, 8, 4, 128), (4, 4096, 64, 128)), ((3, 769), (2, 1024, 7168)),
        ((1, 65536), (1, 65536))]

CASES = (
    [CheckCase("l2norm", str(list(real)), _x(small, real), l2norm, ref.l2norm, out_classes=("E-fwd",),
               grad_inputs=("x",)) for small, real in _L2]
    + [CheckCase("rmsnorm_without_weight", f"{list(real)} (rstd, y)", _x(small, real), _rww, _rww_ref,
                 out_classes=("E-fwd", "E-fwd"), grad_inputs=("x",)) for small, real in _RMS]
    + [CheckCase("rmsnorm_without_weight", "mHC [2, 4096, 4*7168] rstd only", _x((2, 4, 4 * 96), (2, 4096, 4 * 7168)),
                 rmsnorm_without_weight, ref.rmsnorm_without_weight, out_classes=("E-fwd",), grad_inputs=("x",))]
    + [CheckCase("rms_norm", str(list(real)), _xw(small, real), rms_norm, ref.rms_norm, out_classes=("E-fwd",),
                 grad_inputs=("x", "weight")) for small, real in _RMS]
    + [CheckCase("rms_norm", "Gemma 1+w, fp32 weight [8192, 4096]", _xw((64, 256), (8192, 4096), 1.0, torch.float32),
                 rms_norm, ref.rms_norm, out_classes=("E-fwd",), grad_inputs=("x", "weight")),
       CheckCase("rms_norm", "large-mean rows [4096, 769]", _x((3, 769), (4096, 769), scale=1.0, shift=1000.0),
                 rms_norm, ref.rms_norm, out_classes=("E-fwd",), grad_inputs=("x",))]
)
