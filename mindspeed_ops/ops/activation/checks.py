"""``mindspeed-ops check`` cases of the activation family."""
import torch

from ...checks import CheckCase
from ...testing import randn
from ..activation import clipped_swiglu
from . import reference as ref


def _inputs(shape_small, shape_real, interleaved):
    def make(device, dtype, small):
        shape = shape_small if small else shape_real
        return {"gate_up": randn(shape, dtype, device, seed=0, scale=4.0), "interleaved": interleaved}
    return make


CASES = [
    CheckCase("clipped_swiglu", f"{'interleaved' if il else 'split'} {list(real)}",
              _inputs(small, real, il), clipped_swiglu, ref.clipped_swiglu,
              out_classes=("E-fwd",), grad_inputs=("gate_up",))
    for small, real, il in [((64, 2 * 96), (4096, 2 * 2880), False), ((64, 2 * 96), (4096, 2 * 2880), True),
                            ((8, 2 * 300), (8192, 2 * 5760), False)]
]
