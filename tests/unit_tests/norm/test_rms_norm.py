"""rmsnorm_without_weight and rms_norm (SPEC 1.2): kernel vs float64 reference, edges, layouts,
errors, registration."""
import pytest
import torch

from mindspeed_ops.api.triton.rms_norm import rms_norm
from mindspeed_ops.api.triton.rmsnorm_without_weight import rmsnorm_without_weight
from mindspeed_ops.ops.norm import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, randn, snapshot, to_ref
from tests.conftest import DEVICE, DTYPES, ON_GPU




def _check_rms(x, weight=None, offset=0.0, dy=None, eps=1e-6):
    """rms_norm forward and backward (dx, dweight) against autograd of the float64 reference."""
    x = x.detach().requires_grad_(True)
    w = None if weight is None else weight.detach().requires_grad_(True)
    y = rms_norm(x, w, eps, offset)
    assert y.dtype == x.dtype and y.shape == x.shape
    dy = randn(y.shape, y.dtype, x.device, seed=7) if dy is None else dy
    before = snapshot(x, w, dy)
    y.backward(dy)
    assert_unchanged(before, x, w, dy, names=["x", "weight", "dy"])
    xr, wr = to_ref(x, w, requires_grad=True)
    yr = ref.rms_norm(xr, wr, eps, offset)
    yr.backward(dy.double())
    assert_close("y", yr, y, "E-fwd")
    assert_close("dx", xr.grad, x.grad, "E-bwd")
    if w is not None:
        assert w.grad.dtype == w.dtype
        assert_close("dweight", wr.grad, w.grad, "E-bwd")
    return y, x.grad, (None if w is None else w.grad)


def _check_rww(x, return_normalized=True, rstd_dtype=None, eps=1e-6, seed=7, use=("rstd", "y")):
    """rmsnorm_without_weight outputs and dx (through the outputs named in ``use``) vs the reference."""
    x = x.detach().requires_grad_(True)
    before = snapshot(x)
    out = rmsnorm_without_weight(x, eps, return_normalized, rstd_dtype)
    rstd, y = out if return_normalized else (out, None)
    assert rstd.shape == (*x.shape[:-1], 1) and rstd.dtype == (rstd_dtype or x.dtype)
    outs, cots = [], []
    if "rstd" in use:
        outs.append(rstd)
        cots.append(randn(rstd.shape, rstd.dtype, x.device, seed=seed))
    if y is not None:
        assert y.dtype == x.dtype and y.shape == x.shape
        if "y" in use:
            outs.append(y)
            cots.append(randn(y.shape, y.dtype, x.device, seed=seed + 1))
    torch.autograd.backward(outs, cots)
    assert_unchanged(before, x, names=["x"])
    (xr,) = to_ref(x, requires_grad=True)
    rr, yr = ref.rmsnorm_without_weight(xr, eps, True, rstd_dtype)
    ref_outs = ([rr] if "rstd" in use else []) + ([yr] if (y is not None and "y" in use) else [])
    torch.autograd.backward(ref_outs, [c.double() for c in cots])
    assert_close("rstd", rr, rstd, "E-fwd")
    if y is not None:
        assert_close("y", yr, y, "E-fwd")
    assert_close("dx", xr.grad, x.grad, "E-bwd")
    return rstd, y, x.grad


D_VALUES = [50, 100, 769, 1200, 4096, 7168]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", D_VALUES)
def test_rms_norm_dims(D, dtype):
    _check_rms(randn((2, 3, D), dtype, DEVICE, seed=D), randn((D,), dtype, DEVICE, seed=D + 1, shift=1.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", D_VALUES)
def test_rmsnorm_without_weight_dims(D, dtype):
    _check_rww(randn((2, 3, D), dtype, DEVICE, seed=D))


@pytest.mark.parametrize("dtype", DTYPES)
def test_shapes_3d_4d(dtype):
    s3, s4 = ((2, 1024, 4096), (2, 16, 64, 512)) if ON_GPU else ((2, 8, 4096), (2, 4, 8, 512))
    _check_rms(randn(s3, dtype, DEVICE, seed=1), randn(s3[-1:], dtype, DEVICE, seed=2, shift=1.0))
    rstd, _, _ = _check_rww(randn(s4, dtype, DEVICE, seed=3))
    assert rstd.shape == (*s4[:-1], 1)


@pytest.mark.parametrize("shape", [(1, 65536), (3, 20000)])
def test_long_rows_looped_path(shape):
    D = shape[-1]
    _check_rms(randn(shape, torch.float32, DEVICE, seed=4), randn((D,), torch.float32, DEVICE, seed=5, shift=1.0))
    _check_rms(randn(shape, torch.float16, DEVICE, seed=6), randn((D,), torch.float32, DEVICE, seed=7), offset=1.0)
    _check_rms(randn(shape, torch.float32, DEVICE, seed=8))
    _check_rww(randn(shape, torch.float32, DEVICE, seed=9))
    _check_rww(randn(shape, torch.float16, DEVICE, seed=10), return_normalized=False)


@pytest.mark.parametrize("D", [769, 12000])
def test_weight_tile_limit(D):
    """D between the two tile limits: forward on the tile path, weighted backward looped."""
    _check_rms(randn((3, D), torch.float32, DEVICE, seed=D), randn((D,), torch.float32, DEVICE, seed=11, shift=1.0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_return_normalized_both_outputs(dtype):
    x = randn((5, 300), dtype, DEVICE, seed=12)
    _check_rww(x, use=("rstd", "y"))
    _check_rww(x, use=("y",))
    _check_rww(x, use=("rstd",))


@pytest.mark.parametrize("rstd_dtype", [None, torch.float32, torch.float16])
def test_rstd_dtype(rstd_dtype):
    x = randn((7, 256), torch.float16 if rstd_dtype is None else torch.float32, DEVICE, seed=13)
    rstd, _, _ = _check_rww(x, return_normalized=False, rstd_dtype=rstd_dtype)
    if rstd_dtype == torch.float32:
        assert_close("rstd STAT", ref.rms_rstd(x.double()), rstd, "STAT")


def test_rstd_only_from_fp32_x_not_rounded_output():
    """The backward recomputes r in fp32 from x: dx matches the reference even with an fp16 rstd."""
    x = randn((6, 512), torch.float32, DEVICE, seed=14, scale=3.0)
    _check_rww(x, return_normalized=False, rstd_dtype=torch.float16)


def test_norm_eps_alias():
    x = randn((4, 96), torch.float32, DEVICE, seed=15)
    a = rmsnorm_without_weight(x, norm_eps=1e-3)
    b = rmsnorm_without_weight(x, eps=1e-3)
    assert torch.equal(a, b)
    assert torch.equal(rmsnorm_without_weight(x, 1e-3, norm_eps=1e-3), b)
    with pytest.raises(ValueError, match="not both"):
        rmsnorm_without_weight(x, eps=1e-5, norm_eps=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_offset_equals_weightless(dtype):
    x = randn((9, 640), dtype, DEVICE, seed=16)
    dy = randn((9, 640), dtype, DEVICE, seed=17)
    y1, dx1, dw = _check_rms(x, torch.zeros(640, dtype=dtype, device=DEVICE), offset=1.0, dy=dy)
    y0, dx0, _ = _check_rms(x, None, dy=dy)
    assert torch.equal(y1, y0) and torch.equal(dx1, dx0)
    _, y2, _ = _check_rww(x)
    assert torch.equal(y2, y0)


def test_offset_without_weight_raises():
    with pytest.raises(ValueError, match="offset must be 0.0 when weight is None"):
        rms_norm(torch.randn(3, 8, device=DEVICE), None, offset=1.0)


@pytest.mark.parametrize("w_dtype", [torch.float32, torch.float16])
def test_weight_dtype_differs(w_dtype):
    x = randn((11, 384), torch.float16 if w_dtype == torch.float32 else torch.float32, DEVICE, seed=18)
    _, _, dw = _check_rms(x, randn((384,), w_dtype, DEVICE, seed=19, shift=1.0), offset=0.5)
    assert dw.dtype == w_dtype


def test_ragged_large_mean():
    """D = 769, 3 rows, x = 1000 + small pattern: masked lanes must not enter the statistics."""
    D = 769
    pattern = torch.arange(3 * D, dtype=torch.float32, device=DEVICE).reshape(3, D).remainder(7) * 0.01
    x = 1000.0 + pattern
    y, _, _ = _check_rms(x, randn((D,), torch.float32, DEVICE, seed=20, shift=1.0))
    _check_rww(x)
    _check_rms(x.half())


def test_many_small_rows_dweight():
    rows, dtype = (65536, torch.bfloat16) if ON_GPU else (4096, torch.float16)
    _check_rms(randn((rows, 128), dtype, DEVICE, seed=21), randn((128,), dtype, DEVICE, seed=22, shift=1.0))


def test_two_norms_with_residual():
    x = randn((6, 16, 256), torch.float32, DEVICE, seed=23).requires_grad_()
    w1 = randn((256,), torch.float32, DEVICE, seed=24, shift=1.0).requires_grad_()
    w2 = randn((256,), torch.float32, DEVICE, seed=25, shift=1.0).requires_grad_()
    y1 = rms_norm(x, w1)
    z = y1 + rms_norm(y1, w2)
    dz = randn(z.shape, z.dtype, DEVICE, seed=26)
    z.backward(dz)
    xr, w1r, w2r = to_ref(x, w1, w2, requires_grad=True)
    y1r = ref.rms_norm(xr, w1r)
    zr = y1r + ref.rms_norm(y1r, w2r)
    zr.backward(dz.double())
    assert_close("z", zr, z, "E-fwd")
    for n, a, b in (("dx", xr, x), ("dw1", w1r, w1), ("dw2", w2r, w2)):
        assert_close(n, a.grad, b.grad, "E-bwd")


def test_non_contiguous_dy():
    shape = (2, 1024, 256) if ON_GPU else (2, 64, 256)
    x = randn(shape, torch.float32, DEVICE, seed=27).requires_grad_()
    w = randn((256,), torch.float32, DEVICE, seed=28, shift=1.0).requires_grad_()
    rms_norm(x, w).sum().backward()  # stride-0 upstream gradient
    xr, wr = to_ref(x, w, requires_grad=True)
    ref.rms_norm(xr, wr).sum().backward()
    assert_close("dx from .sum()", xr.grad, x.grad, "E-bwd")
    assert_close("dw from .sum()", wr.grad, w.grad, "E-bwd")
    dy_t = randn((shape[0], shape[2], shape[1]), torch.float32, DEVICE, seed=29).transpose(1, 2)
    _check_rms(x, w, dy=dy_t)
    x2 = x.detach().requires_grad_()
    r, y = rmsnorm_without_weight(x2, return_normalized=True)
    (r.sum() + (y * 2).sum()).backward()  # stride-0 drstd and dy
    x2r = to_ref(x2, requires_grad=True)[0]
    rr, yr = ref.rmsnorm_without_weight(x2r, return_normalized=True)
    (rr.sum() + (yr * 2).sum()).backward()
    assert_close("rww dx from .sum()", x2r.grad, x2.grad, "E-bwd")


@pytest.mark.parametrize("kind", ["pad", "transpose"])
def test_non_contiguous_x(kind):
    x = non_contiguous(randn((3, 20, 64), torch.float32, DEVICE, seed=30), kind)
    _check_rms(x, randn((64,), torch.float32, DEVICE, seed=31, shift=1.0))
    _check_rms(x, randn((128,), torch.float32, DEVICE, seed=31, shift=1.0)[::2])  # strided weight
    _check_rww(x)


@pytest.mark.parametrize("D", [128, 20000])
def test_outputs_fully_written(poisoned, D):
    x = randn((5, D), torch.float32, DEVICE, seed=32).requires_grad_()
    w = randn((D,), torch.float32, DEVICE, seed=33).requires_grad_()
    y = rms_norm(x, w)
    y.backward(torch.ones_like(y))
    r, y2 = rmsnorm_without_weight(x, return_normalized=True)
    r3 = rmsnorm_without_weight(x)
    for t in (y, x.grad, w.grad, r, y2, r3):
        assert torch.isfinite(t).all()


@pytest.mark.parametrize("D", [128, 20000])
def test_zero_rows_finite(D):
    x = randn((4, D), torch.float32, DEVICE, seed=34)
    x[2] = 0.0
    y, dx, dw = _check_rms(x, randn((D,), torch.float32, DEVICE, seed=35, shift=1.0))
    assert (y[2] == 0).all() and torch.isfinite(dx).all() and torch.isfinite(dw).all()
    _check_rww(x)


@pytest.mark.parametrize("shape", [(4096, 128), (5, 20000), (40, 4096)])
def test_batch_size_invariance(shape):
    x = randn(shape, torch.float32, DEVICE, seed=36)
    dy = randn(shape, torch.float32, DEVICE, seed=37)
    w = randn(shape[-1:], torch.float32, DEVICE, seed=38, shift=1.0)
    xa = x.clone().requires_grad_()
    ya = rms_norm(xa, w)
    ya.backward(dy)
    ra = rmsnorm_without_weight(x)
    for r in (0, 1, shape[0] - 1):
        xr = x[r:r + 1].clone().requires_grad_()
        yr = rms_norm(xr, w)
        yr.backward(dy[r:r + 1])
        assert torch.equal(ya[r:r + 1], yr), f"row {r} forward differs"
        assert torch.equal(xa.grad[r:r + 1], xr.grad), f"row {r} backward differs"
        assert torch.equal(ra[r:r + 1], rmsnorm_without_weight(x[r:r + 1])), f"row {r} rstd differs"


def test_empty():
    x = torch.empty(0, 4, 64, device=DEVICE, requires_grad=True)
    w = torch.ones(64, device=DEVICE, requires_grad=True)
    y = rms_norm(x, w)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros_like(w))
    r, y2 = rmsnorm_without_weight(x, return_normalized=True)
    assert r.shape == (0, 4, 1) and y2.shape == x.shape


def test_bad_input():
    x = torch.randn(3, 8, device=DEVICE)
    with pytest.raises(TypeError, match="float64"):
        rms_norm(x.double())
    with pytest.raises(TypeError, match="x must have dtype"):
        rmsnorm_without_weight(torch.ones(3, 8, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"rms_norm: weight must have shape \[D\] = \[8\], got \[7\]"):
        rms_norm(x, torch.ones(7, device=DEVICE))
    with pytest.raises(TypeError, match="rms_norm: weight must have dtype float32/float16/bfloat16, got float64"):
        rms_norm(x, torch.ones(8, dtype=torch.float64, device=DEVICE))
    with pytest.raises(ValueError, match="at least 1 dims"):
        rms_norm(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="last dim D must be >= 1"):
        rmsnorm_without_weight(torch.randn(3, 0, device=DEVICE))
    with pytest.raises(ValueError, match="eps must be"):
        rms_norm(x, eps=float("nan"))
    with pytest.raises(TypeError, match="rstd_dtype must be"):
        rmsnorm_without_weight(x, rstd_dtype=torch.int64)
    with pytest.raises(ValueError, match="rms_norm: weight must be on"):
        rms_norm(x, torch.ones(8, device="meta"))


def test_deterministic():
    x = randn((300, 256), torch.float16, DEVICE, seed=39).requires_grad_()
    w = randn((256,), torch.float32, DEVICE, seed=40).requires_grad_()
    dy = randn((300, 256), torch.float16, DEVICE, seed=41)
    outs = []
    for _ in range(2):
        x.grad = w.grad = None
        y = rms_norm(x, w, offset=1.0)
        y.backward(dy)
        outs.append((y, x.grad, w.grad))
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_registration_and_compile():
    x = randn((6, 40), torch.float32, DEVICE, seed=42).requires_grad_()
    w = randn((40,), torch.float32, DEVICE, seed=43).requires_grad_()
    ops = torch.ops.mindspeed_ops
    torch.library.opcheck(ops.rms_norm, (x, w, 1e-6, 1.0))
    torch.library.opcheck(ops.rms_norm, (x, None, 1e-6, 0.0))
    torch.library.opcheck(ops.rmsnorm_without_weight, (x, 1e-6, True, None))
    torch.library.opcheck(ops.rmsnorm_without_weight, (x, 1e-6, False, torch.float32))

    def fn(t, w):
        r, y = rmsnorm_without_weight(t, return_normalized=True)
        return rms_norm(t, w, offset=1.0) + y * r

    f = torch.compile(fn, fullgraph=True)
    out = f(x, w)
    out.sum().backward()
    xr, wr = to_ref(x, w, requires_grad=True)
    rr, yr = ref.rmsnorm_without_weight(xr, return_normalized=True)
    outr = ref.rms_norm(xr, wr, offset=1.0) + yr * rr
    outr.sum().backward()
    assert_close("compiled", outr, out, "E-fwd")
    assert_close("compiled dx", xr.grad, x.grad, "E-bwd")
    assert_close("compiled dw", wr.grad, w.grad, "E-bwd")


@pytest.mark.large
def test_large_int64_offsets():
    x = torch.empty(1, 524_289, 4096, dtype=torch.bfloat16, device=DEVICE)
    x.normal_(generator=torch.Generator(DEVICE).manual_seed(44))
    w = torch.randn(4096, dtype=torch.bfloat16, device=DEVICE)
    x.requires_grad_()
    y = rms_norm(x, w)
    y.backward(torch.ones_like(y))
    xr, wr = to_ref(x[:, -3:], w, requires_grad=True)
    yr = ref.rms_norm(xr, wr)
    yr.backward(torch.ones_like(yr))
    assert_close("last rows y", yr, y[:, -3:], "E-fwd")
    assert_close("last rows dx", xr.grad, x.grad[:, -3:], "E-bwd")
    r = rmsnorm_without_weight(x.detach())
    assert_close("last rows rstd", ref.rmsnorm_without_weight(x[:, -3:].detach().double()), r[:, -3:], "E-fwd")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_backend(dtype):
    """The CPU path (``reference`` backend: closed-form backwards) agrees with autograd of the reference."""
    import mindspeed_ops

    with mindspeed_ops.use_backend("reference"):
        x = randn((2, 5, 96), dtype, DEVICE, seed=45)
        _check_rms(x, randn((96,), torch.float32, DEVICE, seed=46, shift=1.0), offset=0.5)
        _check_rms(non_contiguous(x, "transpose"))
        _check_rww(x, use=("rstd", "y"))
        _check_rww(x, use=("y",))
        _check_rww(x, return_normalized=False, rstd_dtype=torch.float32)
