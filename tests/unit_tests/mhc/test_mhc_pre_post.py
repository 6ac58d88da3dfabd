"""mhc_pre_bmm and mhc_post (SPEC 1.12.3, 1.12.4) vs autograd of the float64 references, DeepSeek
convention, strides, errors, registration, and one DeepSeek-V4-style sublayer composition."""
import pytest
import torch

from mindspeed_ops.api.triton.mhc_post import mhc_post
from mindspeed_ops.api.triton.mhc_pre_bmm import mhc_pre_bmm
from mindspeed_ops.api.triton.rmsnorm_without_weight import rmsnorm_without_weight
from mindspeed_ops.api.triton.sinkhorn import sinkhorn
from mindspeed_ops.ops.mhc import reference as ref
from mindspeed_ops.ops.norm import reference as norm_ref
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, randn, snapshot, to_ref, uniform
from tests.conftest import DEVICE, DTYPES, ON_GPU


def _check_pre(pre, x, dy=None, out_dtype=None):
    pre, x = pre.detach().requires_grad_(), x.detach().requires_grad_()
    before = snapshot(pre, x)
    y = mhc_pre_bmm(pre, x, out_dtype)
    assert y.dtype == (out_dtype or x.dtype) and y.shape == x.shape[:-2] + x.shape[-1:]
    dy = randn(y.shape, y.dtype, DEVICE, seed=7) if dy is None else dy
    y.backward(dy)
    assert_unchanged(before, pre, x)
    pr, xr = to_ref(pre, x, requires_grad=True)
    yr = ref.mhc_pre_bmm(pr, xr, torch.float64)
    yr.backward(dy.double())
    assert_close("y", yr, y, "E-fwd")
    assert pre.grad.dtype == pre.dtype and x.grad.dtype == x.dtype
    assert_close("d pre", pr.grad, pre.grad, "E-bwd")
    assert_close("d x", xr.grad, x.grad, "E-bwd")


def _check_post(x, r, hp, hr, dout=None):
    x, r, hp, hr = (t.detach().requires_grad_() for t in (x, r, hp, hr))
    before = snapshot(x, r, hp, hr)
    out = mhc_post(x, r, hp, hr)
    assert out.dtype == x.dtype and out.shape == r.shape
    dout = randn(out.shape, out.dtype, DEVICE, seed=8) if dout is None else dout
    out.backward(dout)
    assert_unchanged(before, x, r, hp, hr)
    refs = to_ref(x, r, hp, hr, requires_grad=True)
    o = ref.mhc_post(*refs)
    o.backward(dout.double())
    assert_close("out", o, out, "E-fwd")
    for name, a, t in zip(("dx", "dresidual", "dh_post", "dh_res"), refs, (x, r, hp, hr)):
        assert t.grad.dtype == t.dtype
        assert_close(name, a.grad, t.grad, "E-bwd")


def _post_inputs(lead, n, D, dtype, seed):
    return (randn((*lead, D), dtype, DEVICE, seed=seed), randn((*lead, n, D), dtype, DEVICE, seed=seed + 1),
            uniform((*lead, n), 0.0, 2.0, torch.float32, DEVICE, seed=seed + 2),
            uniform((*lead, n, n), 0.0, 1.0, torch.float32, DEVICE, seed=seed + 3))


LEAD = (2, 4096) if ON_GPU else (2, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_pre_bmm_matches_reference(n, dtype):
    pre = uniform((*LEAD, n), 0.0, 1.0, torch.float32, DEVICE, seed=n)
    _check_pre(pre, randn((*LEAD, n, 1280), dtype, DEVICE, seed=n + 1))


@pytest.mark.parametrize("D", [1280, 2560, 7168])
def test_pre_bmm_hidden_sizes(D):
    pre = uniform((2, 2, 4), 0.0, 1.0, torch.float32, DEVICE, seed=D)
    _check_pre(pre, randn((2, 2, 4, D), torch.float16, DEVICE, seed=D + 1))


def test_pre_bmm_flat_out_dtype_strides():
    pre = uniform((5, 4), 0.0, 1.0, torch.float32, DEVICE, seed=30)
    x = randn((5, 4, 200), torch.float16, DEVICE, seed=31)
    _check_pre(pre, x, out_dtype=torch.float32)
    _check_pre(non_contiguous(pre, "transpose"), non_contiguous(x))
    _check_pre(pre, x, dy=randn((200, 5), torch.float16, DEVICE, seed=32).t())  # non-contiguous dy
    xg = x.clone().requires_grad_()
    mhc_pre_bmm(pre, xg).sum().backward()  # stride-0 dy
    assert_close("dx from .sum()", pre.double()[..., None].expand(5, 4, 200), xg.grad, "E-bwd")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_post_matches_reference(n, dtype):
    _check_post(*_post_inputs(LEAD, n, 1280, dtype, seed=40 + n))


@pytest.mark.parametrize("D", [1280, 7168])
def test_post_hidden_sizes_flat(D):
    _check_post(*_post_inputs((3,), 4, D, torch.float16, seed=D))


def test_post_strides():
    x, r, hp, hr = _post_inputs((5,), 4, 96, torch.float32, seed=50)
    _check_post(non_contiguous(x), non_contiguous(r), hp, non_contiguous(hr, "transpose"))
    _check_post(x, r, hp, hr, dout=randn((5, 96, 4), torch.float32, DEVICE, seed=51).transpose(-1, -2))
    rg = r.clone().requires_grad_()
    mhc_post(x, rg, hp, hr).sum().backward()  # stride-0 dout
    assert_close("dres from .sum()", hr.double().sum(-1, keepdim=True).expand(5, 4, 96), rg.grad, "E-bwd")


@pytest.mark.parametrize("dtype", DTYPES)
def test_post_convention_permutation(dtype):
    n, D = 4, 64
    x, r, _, _ = _post_inputs((3,), n, D, dtype, seed=60)
    perm = [2, 0, 3, 1]  # non-symmetric permutation: h_res[j, perm[j]] = 1
    hr = torch.zeros(3, n, n, device=DEVICE)
    for j, k in enumerate(perm):
        hr[:, j, k] = 1.0
    out = mhc_post(x, r, torch.zeros(3, n, device=DEVICE), hr)
    for j, k in enumerate(perm):
        assert torch.equal(out[:, k], r[:, j])


def test_bad_input():
    x, r, hp, hr = _post_inputs((3,), 4, 16, torch.float32, seed=70)
    with pytest.raises(TypeError, match="residual must have the dtype of x"):
        mhc_post(x, r.half(), hp, hr)
    with pytest.raises(ValueError, match="h_res must have shape"):
        mhc_post(x, r, hp, hr[:, :3])
    with pytest.raises(ValueError, match="x must have shape"):
        mhc_post(x[:, :8], r, hp, hr)
    with pytest.raises(ValueError, match="n must be in"):
        mhc_post(x, torch.randn(3, 9, 16, device=DEVICE), torch.rand(3, 9, device=DEVICE),
                 torch.rand(3, 9, 9, device=DEVICE))
    with pytest.raises(ValueError, match=r"pre must have shape x.shape\[:-1\]"):
        mhc_pre_bmm(hp[:, :3], r)
    with pytest.raises(TypeError, match="float64"):
        mhc_pre_bmm(hp, r.double())
    with pytest.raises(TypeError, match="out_dtype must be"):
        mhc_pre_bmm(hp, r, torch.int32)


def test_deterministic_and_empty():
    x, r, hp, hr = _post_inputs((7,), 4, 300, torch.float16, seed=80)
    res = []
    for _ in range(2):
        ts = [t.clone().requires_grad_() for t in (x, r, hp, hr)]
        out = mhc_post(*ts)
        y = mhc_pre_bmm(ts[2], out)
        (out.float().sum() + y.float().sum()).backward()
        res.append([out, y] + [t.grad for t in ts])
    assert all(torch.equal(a, b) for a, b in zip(*res))
    e = torch.empty(0, 4, 8, device=DEVICE, requires_grad=True)
    p = torch.empty(0, 4, device=DEVICE, requires_grad=True)
    y = mhc_pre_bmm(p, e)
    assert y.shape == (0, 8)
    y.sum().backward()
    assert e.grad.shape == (0, 4, 8)


def test_registration_and_compile():
    x, r, hp, hr = _post_inputs((3,), 4, 32, torch.float32, seed=90)
    args = [t.clone().requires_grad_() for t in (x, r, hp, hr)]
    torch.library.opcheck(torch.ops.mindspeed_ops.mhc_post, tuple(args))
    torch.library.opcheck(torch.ops.mindspeed_ops.mhc_pre_bmm, (args[2], args[1], None))
    torch.library.opcheck(torch.ops.mindspeed_ops.mhc_pre_bmm, (args[2], args[1], torch.float32))
    f = torch.compile(lambda a, b, c, d: mhc_pre_bmm(c, mhc_post(a, b, c, d)), fullgraph=True)
    y = f(*args)
    y.sum().backward()
    want = ref.mhc_pre_bmm(hp.double(), ref.mhc_post(*to_ref(x, r, hp, hr)))
    assert_close("compiled", want, y, "E-fwd")


def test_reference_backend_gradients():
    import mindspeed_ops

    x, r, hp, hr = _post_inputs((3,), 4, 32, torch.float32, seed=95)
    ts = [t.clone().requires_grad_() for t in (x, r, hp, hr)]
    with mindspeed_ops.use_backend("reference"):
        mhc_pre_bmm(ts[2], mhc_post(*ts)).sum().backward()
    refs = to_ref(x, r, hp, hr, requires_grad=True)
    ref.mhc_pre_bmm(refs[2], ref.mhc_post(*refs)).sum().backward()
    for a, t in zip(refs, ts):
        assert_close("reference-backend grad", a.grad, t.grad, "E-bwd")


def _sublayer(X, fn, s, b, n, ops):
    """DeepSeek-V4-style mHC sublayer with an identity layer."""
    sk, pre_bmm, post, rstd_fn = ops
    flat = X.flatten(-2)
    mixes = (flat @ fn.t()) * rstd_fn(flat)
    pre, hpost, comb = sk(mixes, s, b, n, 20)
    y = pre_bmm(pre, X)
    return post(y, X, hpost, comb)


def test_family_composition():
    n, D, T = 4, 32, 6
    W = (2 + n) * n
    X = randn((T, n, D), torch.float32, DEVICE, seed=100).requires_grad_()
    fn = randn((W, n * D), torch.float32, DEVICE, seed=101, scale=0.05).requires_grad_()
    s = uniform((3,), 0.5, 1.5, torch.float32, DEVICE, seed=102).requires_grad_()
    b = randn((W,), torch.float32, DEVICE, seed=103, scale=0.3).requires_grad_()
    out = _sublayer(X, fn, s, b, n, (sinkhorn, mhc_pre_bmm, mhc_post, rmsnorm_without_weight))
    dout = randn(out.shape, out.dtype, DEVICE, seed=104)
    out.backward(dout)
    refs = to_ref(X, fn, s, b, requires_grad=True)
    out_r = _sublayer(*refs, n, (ref.sinkhorn, ref.mhc_pre_bmm, ref.mhc_post, norm_ref.rmsnorm_without_weight))
    out_r.backward(dout.double())
    assert_close("sublayer out", out_r, out, "E-fwd")
    for name, a, t in zip(("dX", "dfn", "dhc_scale", "dhc_base"), refs, (X, fn, s, b)):
        assert_close(name, a.grad, t.grad, "E-bwd")
    # identical streams, h_post = 0, h_res from 20 Sinkhorn iterations: every output stream is that stream
    row = randn((T, 1, D), torch.float32, DEVICE, seed=105)
    same = row.expand(T, n, D).contiguous()
    comb = sinkhorn(randn((T, W), torch.float32, DEVICE, seed=106, scale=2.0), s.detach(), b.detach(), n, 20)[2]
    res = mhc_post(torch.zeros(T, D, device=DEVICE), same, torch.zeros(T, n, device=DEVICE), comb)
    assert ((res - same).abs() <= 1e-5 * same.abs() + 1e-7).all()



@pytest.mark.parametrize("n", [3, 5])
def test_odd_streams_hidden_and_row_strides(n):
    """Odd n and D (no vector alignment), row counts that leave partial row tiles, and weights / streams
    that are row slices of wider tensors (row strides handled in the kernels, no copies)."""
    T, D = 7, 37
    xs = randn((T, n, D + 5), torch.float16, DEVICE, seed=120 + n)[..., 2:D + 2]  # row stride n*(D+5)
    pre = uniform((T, 2 * n + 1), 0.0, 1.0, torch.float32, DEVICE, seed=121)[:, 1:n + 1]
    _check_pre(pre, xs)
    x = randn((T, 2 * D), torch.float16, DEVICE, seed=122)[:, :D]
    hp = uniform((T, n + 3), 0.0, 2.0, torch.float32, DEVICE, seed=123)[:, 3:]
    hr = uniform((T, n * n + 2), 0.0, 1.0, torch.float32, DEVICE, seed=124)[:, 1:n * n + 1].unflatten(-1, (n, n))
    assert hp.stride(0) != n and hr.stride(0) != n * n
    _check_post(x, xs, hp, hr)
    _check_post(x, xs, hp, hr.transpose(-1, -2))  # non-contiguous inner weights (copied by the launcher)


@pytest.mark.gpu
def test_real_size_bf16():
    pre = uniform((2, 4096, 4), 0.0, 1.0, torch.float32, DEVICE, seed=110)
    x = randn((2, 4096, 4, 4096), torch.bfloat16, DEVICE, seed=111)
    _check_pre(pre, x)
    _check_post(*_post_inputs((2, 4096), 4, 4096, torch.bfloat16, seed=112))
