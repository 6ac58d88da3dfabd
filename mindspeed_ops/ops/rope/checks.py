"""``mindspeed-ops check`` cases of the RoPE family.

``inplace_rope`` writes into ``x``; the runner compares functions of its inputs, so both sides rotate a
clone of ``x`` (the gradient still reaches the runner's ``x`` through the clone). With the default
``inplace_backward=True`` the backward also rotates its incoming gradient buffer in place; the library
side multiplies its output by 1 so that buffer is a private copy, not the runner's ``dy`` (which the
runner reuses for the reference).
"""
import torch

from ...checks import CheckCase
from ...testing import randn
from ..rope import inplace_rope
from . import reference as ref


def _run(x, **kw):
    return inplace_rope(x.clone(), **kw).mul(1)


def _reference(x, **kw):
    return ref.inplace_rope(x.clone(), **kw)


def _inputs(shape_small, shape_real, rope_dim, inverse=False, packed=False):
    def make(device, dtype, small):
        shape = shape_small if small else shape_real
        T = shape[-3]
        x = randn(shape, dtype, device, seed=0)
        if packed:  # three sequences, positions restarting at each one
            cuts = [0, T // 3, (2 * T) // 3, T]
            pos = torch.cat([torch.arange(b - a) for a, b in zip(cuts, cuts[1:])]).to(device)
            t_max = max(b - a for a, b in zip(cuts, cuts[1:]))
        else:
            pos, t_max = None, T
        cos, sin = ref.rope_cos_sin(t_max, rope_dim, device=device)
        return {"x": x, "cos": cos, "sin": sin, "position_ids": pos, "inverse": inverse}
    return make


CASES = [
    CheckCase("inplace_rope", name, _inputs(small, real, r, inverse, packed), _run, _reference,
              out_classes=("E-fwd",), grad_inputs=("x",))
    for name, small, real, r, inverse, packed in [
        ("[4, 4096, 32, 64] R=64", (2, 16, 4, 64), (4, 4096, 32, 64), 64, False, False),
        ("[2, 1024, 16, 512] R=64", (1, 16, 4, 512), (2, 1024, 16, 512), 64, False, False),
        ("[2, 1024, 16, 512] R=64 inverse", (1, 16, 4, 512), (2, 1024, 16, 512), 64, True, False),
        ("packed [4096, 8, 192] R=64", (48, 2, 192), (4096, 8, 192), 64, False, True),
    ]
]
