"""clipped_swiglu (SPEC 1.4): kernel vs float64 reference, edges, layouts, errors, registration."""
import math

import pytest
import torch

from mindspeed_ops import api
from mindspeed_ops.ops.activation import reference as ref
from mindspeed_ops.testing import assert_close, randn, snapshot, assert_unchanged, to_ref, non_contiguous
from tests.conftest import DEVICE, DTYPES, ON_GPU


def _check(x, dy=None, nan_mask=False, **kw):
    """Forward and backward of the op against autograd of the float64 reference."""
    x = x.detach().requires_grad_(True)
    before = snapshot(x)
    y = api.clipped_swiglu(x, **kw)
    dy = randn(y.shape, y.dtype, x.device, seed=7) if dy is None else dy
    dy_before = snapshot(dy)
    y.backward(dy)
    assert_unchanged(before + dy_before, x, dy, names=["gate_up", "dy"])
    (xr,) = to_ref(x, requires_grad=True)
    yr = ref.clipped_swiglu(xr, **kw)
    yr.backward(dy.double())
    assert_close("out", yr, y, "E-fwd", nan_mask=nan_mask)
    assert_close("d gate_up", xr.grad, x.grad, "E-bwd", nan_mask=nan_mask)
    return y, x.grad


SHAPES = [(64, 2 * 96), (3, 5, 2 * 37), (17, 2), (4096, 2 * 2880)] if ON_GPU else [(64, 2 * 96), (3, 5, 2 * 37), (17, 2), (5, 2 * 1100)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_matches_reference(shape, dtype, interleaved):
    _check(randn(shape, dtype, DEVICE, seed=1, scale=4.0), interleaved=interleaved)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True])
def test_expert_batched_bf16(interleaved):
    _check(randn((32, 512, 2 * 2880), torch.bfloat16, DEVICE, seed=2, scale=4.0), interleaved=interleaved)


def test_interleaved_equals_permuted_concat():
    x = randn((9, 2 * 33), torch.float32, DEVICE, seed=3, scale=4.0)
    perm = torch.cat([torch.arange(0, 66, 2), torch.arange(1, 66, 2)]).to(DEVICE)
    a = api.clipped_swiglu(x, interleaved=True)
    b = api.clipped_swiglu(x[:, perm], interleaved=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_boundaries_pass_gradient(dtype):
    x = randn((4, 2 * 8), dtype, DEVICE, seed=4)
    x[:, 0] = 7.0          # gate at +L
    x[:, 8] = 7.0          # up at +L
    x[:, 9] = -7.0         # up at -L
    _, dx = _check(x)
    assert (dx[:, [0, 8, 9]] != 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_values_clamped(dtype):
    x = randn((4, 2 * 8), dtype, DEVICE, seed=5)
    x[:, :2] = 100.0
    x[:, 2:4] = -100.0
    x[:, 8:10] = 100.0
    x[:, 10:12] = -100.0
    y, dx = _check(x)
    assert torch.isfinite(y).all() and torch.isfinite(dx).all()
    assert (dx[:, :2] == 0).all() and (dx[:, 8:12] == 0).all()


def test_nan_propagates():
    x = randn((6, 2 * 16), torch.float32, DEVICE, seed=6)
    x[1, 3] = float("nan")   # gate
    x[4, 20] = float("nan")  # up
    y, _ = _check(x, nan_mask=True)
    nan = torch.isnan(y)
    assert nan[1, 3] and nan[4, 4] and int(nan.sum()) == 2


def test_default_alpha_is_1702():
    x = randn((8, 2 * 16), torch.float64, "cpu", seed=8)
    gate, up = x.chunk(2, -1)
    g, u = gate.clamp(max=7), up.clamp(-7, 7)
    want = g * torch.sigmoid(1.702 * g) * (u + 1)
    y = api.clipped_swiglu(x.float().to(DEVICE))
    assert_close("alpha", want, y, "E-fwd")


@pytest.mark.parametrize("limit", [None, math.inf])
def test_no_limit_is_unclipped(limit):
    x = randn((8, 2 * 16), torch.float32, DEVICE, seed=9, scale=20.0)
    gate, up = x.double().chunk(2, -1)
    want = gate * torch.sigmoid(1.702 * gate) * (up + 1)
    assert_close("unclipped", want, api.clipped_swiglu(x, swiglu_limit=limit), "E-fwd")
    _check(x, swiglu_limit=limit)


def test_non_contiguous_input_and_grad():
    x = non_contiguous(randn((33, 2 * 40), torch.float32, DEVICE, seed=10, scale=3.0))
    _check(x)
    x = randn((7, 2 * 40), torch.float32, DEVICE, seed=11).requires_grad_()
    api.clipped_swiglu(x).sum().backward()  # stride-0 upstream gradient
    (xr,) = to_ref(x, requires_grad=True)
    ref.clipped_swiglu(xr).sum().backward()
    assert_close("dx from .sum()", xr.grad, x.grad, "E-bwd")
    dy_t = randn((40, 7), torch.float32, DEVICE, seed=12).t()  # transposed upstream gradient
    _check(randn((7, 2 * 40), torch.float32, DEVICE, seed=13), dy=dy_t)


def test_empty():
    x = torch.empty(0, 8, device=DEVICE, requires_grad=True)
    y = api.clipped_swiglu(x)
    assert y.shape == (0, 4)
    y.sum().backward()
    assert x.grad.shape == (0, 8)


def test_bad_input():
    with pytest.raises(ValueError, match="gate_up's last dim must be even"):
        api.clipped_swiglu(torch.randn(3, 5, device=DEVICE))
    with pytest.raises(ValueError, match="swiglu_limit must be > 0"):
        api.clipped_swiglu(torch.randn(3, 4, device=DEVICE), swiglu_limit=0.0)
    with pytest.raises(TypeError, match="float64"):
        api.clipped_swiglu(torch.randn(3, 4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(TypeError, match="gate_up must have dtype"):
        api.clipped_swiglu(torch.ones(3, 4, dtype=torch.int32, device=DEVICE))


def test_deterministic():
    x = randn((50, 2 * 70), torch.float16, DEVICE, seed=14).requires_grad_()
    outs = []
    for _ in range(2):
        x.grad = None
        y = api.clipped_swiglu(x)
        y.backward(torch.ones_like(y))
        outs.append((y, x.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_registration_and_compile():
    x = randn((6, 2 * 24), torch.float32, DEVICE, seed=15).requires_grad_()
    torch.library.opcheck(torch.ops.mindspeed_ops.clipped_swiglu, (x, 1.702, 7.0, False))
    torch.library.opcheck(torch.ops.mindspeed_ops.clipped_swiglu, (x, 1.702, None, True))
    f = torch.compile(lambda t: api.clipped_swiglu(t, interleaved=True), fullgraph=True)
    y = f(x)
    y.sum().backward()
    assert_close("compiled", ref.clipped_swiglu(x.detach().double(), interleaved=True), y, "E-fwd")


@pytest.mark.large
def test_large_int64_offsets():
    rows, I = 40_000, 36_864
    x = torch.empty(rows, 2 * I, dtype=torch.bfloat16, device=DEVICE)
    x.normal_(generator=torch.Generator(DEVICE).manual_seed(16))
    y = api.clipped_swiglu(x)
    assert_close("last rows", ref.clipped_swiglu(x[-3:].double()), y[-3:], "E-fwd")


def test_reference_backend_gradients():
    """The reference backend's backward (autograd through the reference inside the custom op) is
    not silently zero: regression for autograd keys being excluded inside a custom op's body."""
    import mindspeed_ops

    x = randn((6, 2 * 24), torch.float32, DEVICE, seed=17, scale=3.0).requires_grad_()
    with mindspeed_ops.use_backend("reference"):
        y = api.clipped_swiglu(x)
        y.backward(torch.ones_like(y))
    (xr,) = to_ref(x, requires_grad=True)
    ref.clipped_swiglu(xr).sum().backward()
    assert_close("reference-backend dx", xr.grad, x.grad, "E-bwd")


def test_empty_last_dim():
    """Regression: a [4, 0] input crashed in the Triton launcher (reshape(-1, 0))."""
    x = torch.empty(4, 0, device=DEVICE, requires_grad=True)
    y = api.clipped_swiglu(x)
    y.sum().backward()
    assert y.shape == (4, 0) and x.grad.shape == (4, 0)
