"""Review regressions for ``clipped_swiglu`` (SPEC 1.4): sizes around the 1,024-column tile, strided
inputs and gradients, NaN propagation without a limit, dynamic-shape torch.compile."""
import functools
import math

import pytest
import torch

from mindspeed_ops import api
from mindspeed_ops.ops.activation import reference as ref
from mindspeed_ops import testing
from mindspeed_ops.testing import assert_close, assert_unchanged, snapshot
from tests.conftest import DEVICE

randn = functools.partial(testing.randn, device=DEVICE)  # the kernels, not the CPU path, on a GPU machine


def _check(x, dy, **kw):
    before = snapshot(x, dy)
    xs = x.detach().requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    y = api.clipped_swiglu(xs, **kw)
    yr = ref.clipped_swiglu(xr, **kw)
    assert y.dtype == x.dtype and y.shape == yr.shape
    assert_close("y", yr, y, "E-fwd", nan_mask=True)
    y.backward(dy)
    yr.backward(dy.double())
    assert_close("dx", xr.grad, xs.grad, "E-bwd", nan_mask=True)
    assert_unchanged(before, x, dy, names=["gate_up", "dy"])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("I", [1, 3, 1023, 1025, 2049])
def test_sizes_around_tile(I, interleaved):
    x = randn((3, 2 * I), seed=1, scale=4.0)
    _check(x, randn((3, I), seed=2), interleaved=interleaved)


@pytest.mark.parametrize("interleaved", [False, True])
def test_strided_inputs_and_grads(interleaved):
    big = randn((6, 2 * 10 + 6), seed=1, scale=4.0)
    x = big[:, 3:23]                                               # slice of a fused projection
    _check(x, randn((10,), seed=2).expand(6, 10), interleaved=interleaved)        # stride-0 rows
    xt = randn((20, 6), seed=3, scale=4.0).t()                     # transposed storage
    _check(xt, randn((10, 6), seed=4).t(), interleaved=interleaved)  # transposed dy
    x4 = randn((2, 3, 4, 10), seed=5, scale=4.0)
    _check(x4, randn((2, 3, 4, 5), seed=6), interleaved=interleaved)


@pytest.mark.parametrize("limit", [None, 7.0, math.inf])
def test_nan_propagation(limit):
    x = randn((4, 8), seed=1, scale=4.0)
    x.view(-1)[[1, 6, 17]] = float("nan")
    _check(x, randn((4, 4), seed=2), interleaved=True, swiglu_limit=limit)


def test_compile_dynamic_changing_shapes_and_scalars():
    def f(x, a, lim):
        return api.clipped_swiglu(x, a, lim, interleaved=True)

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for shape, a, lim in [((3, 16), 1.702, 7.0), ((5, 16), 1.5, None), ((2, 3, 24), 1.0, 3.0)]:
        x0 = randn(shape, scale=4.0)
        x1, x2 = (x0.clone().requires_grad_(True) for _ in range(2))
        y1, y2 = cf(x1, a, lim), f(x2, a, lim)
        assert_close("y", y2, y1, "E-fwd")
        y1.square().sum().backward()
        y2.square().sum().backward()
        assert_close("dx", x2.grad, x1.grad, "E-bwd")
