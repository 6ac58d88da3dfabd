"""l2norm (SPEC 1.1): kernel vs float64 reference, edges, layouts, errors, registration."""
import pytest
import torch

from mindspeed_ops.api.triton.l2norm import L2Norm, l2norm, l2norm_bwd, l2norm_fwd
from mindspeed_ops.ops.norm import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, randn, snapshot, to_ref
from tests.conftest import DEVICE, DTYPES




def _check(x, dy=None, eps=1e-6, output_dtype=None):
    """Forward (y, rstd) and backward (autograd and l2norm_bwd) against the float64 reference."""
    x = x.detach().requires_grad_(True)
    y = l2norm(x, eps, output_dtype)
    assert y.dtype == (output_dtype or x.dtype) and y.shape == x.shape
    dy = randn(y.shape, y.dtype, x.device, seed=7) if dy is None else dy
    before = snapshot(x, dy)
    y.backward(dy)
    y2, rstd = l2norm_fwd(x, eps, output_dtype)
    assert not y2.requires_grad and rstd.dtype == torch.float32 and rstd.shape == x.shape[:-1]
    dx_from_y = l2norm_bwd(y2, rstd, dy, eps, dx_dtype=x.dtype)
    assert_unchanged(before, x, dy, names=["x", "dy"])
    (xr,) = to_ref(x, requires_grad=True)
    yr, rr = ref.l2norm_fwd(xr, eps)
    yr.backward(dy.double())
    assert_close("y", yr, y, "E-fwd")
    assert torch.equal(y, y2)
    assert_close("rstd", rr, rstd, "STAT")
    assert_close("dx", xr.grad, x.grad, "E-bwd")
    assert_close("dx (l2norm_bwd)", xr.grad, dx_from_y, "E-bwd")
    # l2norm_bwd from y follows its own closed form on the rounded y
    assert_close("l2norm_bwd formula", ref.l2norm_bwd(*to_ref(y2, rstd, dy)), dx_from_y, "E-bwd")
    return y, x.grad


D_VALUES = [8, 60, 100, 128, 512, 4096]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", D_VALUES)
def test_head_dims(D, dtype):
    _check(randn((37, D), dtype, DEVICE, seed=D))


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_shape_small(dtype):
    _check(randn((1, 64, 4, 128), dtype, DEVICE, seed=1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1024, 4096])
def test_qk_shape_real(T, dtype):
    _check(randn((1, T, 32, 128), dtype, DEVICE, seed=2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 65536), (3, 20000)])
def test_long_rows_looped_path(shape, dtype):
    _check(randn(shape, dtype, DEVICE, seed=3))


@pytest.mark.parametrize("output_dtype", [torch.float32, torch.float16])
def test_output_dtype(output_dtype):
    _check(randn((9, 128), torch.float16 if output_dtype == torch.float32 else torch.float32, DEVICE, seed=4),
           output_dtype=output_dtype)


@pytest.mark.parametrize("D", [128, 20000])
def test_outputs_fully_written(poisoned, D):
    x = randn((5, D), torch.float32, DEVICE, seed=5).requires_grad_()
    y = l2norm(x)
    y.backward(randn(y.shape, y.dtype, DEVICE, seed=6))
    y2, rstd = l2norm_fwd(x)
    dx = l2norm_bwd(y2, rstd, torch.ones_like(y2))
    for t in (y, x.grad, y2, rstd, dx):
        assert torch.isfinite(t).all()


@pytest.mark.parametrize("D", [128, 20000])
def test_zero_rows(D):
    eps = 1e-6
    x = randn((6, D), torch.float32, DEVICE, seed=8)
    x[[1, 4]] = 0.0
    dy = randn((6, D), torch.float32, DEVICE, seed=9)
    y, dx = _check(x, dy=dy, eps=eps)
    assert torch.isfinite(y).all() and torch.isfinite(dx).all()
    assert (y[[1, 4]] == 0).all()
    assert_close("dx on zero rows", dy[[1, 4]].double() * eps ** -0.5, dx[[1, 4]], "E-bwd")


@pytest.mark.parametrize("shape", [(4096, 128), (5, 20000)])
def test_batch_size_invariance(shape):
    x = randn(shape, torch.float32, DEVICE, seed=10)
    dy = randn(shape, torch.float32, DEVICE, seed=11)
    xa = x.clone().requires_grad_()
    ya = l2norm(xa)
    ya.backward(dy)
    for r in (0, 1, shape[0] - 1):
        xr = x[r:r + 1].clone().requires_grad_()
        yr = l2norm(xr)
        yr.backward(dy[r:r + 1])
        assert torch.equal(ya[r:r + 1], yr), f"row {r} forward differs"
        assert torch.equal(xa.grad[r:r + 1], xr.grad), f"row {r} backward differs"


def test_non_contiguous_dy():
    x = randn((33, 128), torch.float32, DEVICE, seed=12).requires_grad_()
    l2norm(x).sum().backward()  # stride-0 upstream gradient
    (xr,) = to_ref(x, requires_grad=True)
    ref.l2norm(xr).sum().backward()
    assert_close("dx from .sum()", xr.grad, x.grad, "E-bwd")
    dy_t = randn((128, 33), torch.float32, DEVICE, seed=13).t()  # transposed upstream gradient
    _check(randn((33, 128), torch.float32, DEVICE, seed=14), dy=dy_t)
    _check(randn((2, 20000), torch.float32, DEVICE, seed=15), dy=randn((20000, 2), torch.float32, DEVICE, seed=16).t())


@pytest.mark.parametrize("kind", ["pad", "transpose"])
def test_non_contiguous_x(kind):
    _check(non_contiguous(randn((3, 24, 64), torch.float32, DEVICE, seed=17), kind))


def test_empty():
    x = torch.empty(0, 3, 64, device=DEVICE, requires_grad=True)
    y = l2norm(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    y2, rstd = l2norm_fwd(x)
    assert rstd.shape == (0, 3)


def test_module():
    m = L2Norm(eps=1e-5, output_dtype=torch.float16)
    x = randn((4, 64), torch.float32, DEVICE, seed=18)
    assert torch.equal(m(x), l2norm(x, 1e-5, torch.float16))
    assert "eps=1e-05" in repr(m)


def test_bad_input():
    with pytest.raises(TypeError, match="float64"):
        l2norm(torch.randn(3, 4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(TypeError, match="x must have dtype"):
        l2norm(torch.ones(3, 4, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="at least 1 dims"):
        l2norm(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="last dim D must be >= 1"):
        l2norm(torch.randn(3, 0, device=DEVICE))
    with pytest.raises(ValueError, match="eps must be"):
        l2norm(torch.randn(3, 4, device=DEVICE), eps=-1.0)
    with pytest.raises(TypeError, match="output_dtype must be"):
        l2norm(torch.randn(3, 4, device=DEVICE), output_dtype=torch.int32)
    y, rstd = l2norm_fwd(torch.randn(3, 4, device=DEVICE))
    with pytest.raises(ValueError, match=r"rstd must have shape y.shape\[:-1\] = \[3\], got \[3, 1\]"):
        l2norm_bwd(y, rstd[:, None], y)
    with pytest.raises(TypeError, match="rstd must have dtype float32"):
        l2norm_bwd(y, rstd.half(), y)
    with pytest.raises(ValueError, match=r"dy must have shape y.shape = \[3, 4\], got \[3, 5\]"):
        l2norm_bwd(y, rstd, torch.randn(3, 5, device=DEVICE))


def test_deterministic():
    x = randn((50, 700), torch.float16, DEVICE, seed=19).requires_grad_()
    dy = randn((50, 700), torch.float16, DEVICE, seed=20)
    outs = []
    for _ in range(2):
        x.grad = None
        y = l2norm(x)
        y.backward(dy)
        outs.append((y, x.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_registration_and_compile():
    x = randn((6, 48), torch.float32, DEVICE, seed=21).requires_grad_()
    torch.library.opcheck(torch.ops.mindspeed_ops.l2norm, (x, 1e-6, None))
    torch.library.opcheck(torch.ops.mindspeed_ops.l2norm, (x, 1e-6, torch.float16))
    y, rstd = l2norm_fwd(x)
    torch.library.opcheck(torch.ops.mindspeed_ops.l2norm_bwd, (y, rstd, torch.randn_like(y), 1e-6, True, None))
    f = torch.compile(lambda t: l2norm(t) * 2.0, fullgraph=True)
    y = f(x)
    y.sum().backward()
    (xr,) = to_ref(x, requires_grad=True)
    (ref.l2norm(xr) * 2.0).sum().backward()
    assert_close("compiled", ref.l2norm(x.detach().double()) * 2.0, y, "E-fwd")
    assert_close("compiled dx", xr.grad, x.grad, "E-bwd")


@pytest.mark.large
def test_large_int64_offsets():
    rows = 2 ** 31 // 128 + 7
    x = torch.empty(rows, 128, dtype=torch.bfloat16, device=DEVICE)
    x.normal_(generator=torch.Generator(DEVICE).manual_seed(22))
    x.requires_grad_()
    y = l2norm(x)
    dy = torch.ones_like(y)
    y.backward(dy)
    (xr,) = to_ref(x[-5:], requires_grad=True)
    yr = ref.l2norm(xr)
    yr.backward(dy[-5:].double())
    assert_close("last rows y", yr, y[-5:], "E-fwd")
    assert_close("last rows dx", xr.grad, x.grad[-5:], "E-bwd")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_backend(dtype):
    """The CPU path (``reference`` backend: closed-form backward) agrees with autograd of the reference."""
    import mindspeed_ops

    with mindspeed_ops.use_backend("reference"):
        _check(randn((2, 5, 96), dtype, DEVICE, seed=23))
        _check(non_contiguous(randn((4, 33), dtype, DEVICE, seed=24), "transpose"), output_dtype=torch.float32)
