"""sinkhorn / hc_split_sinkhorn / sinkhorn_knopp (SPEC 1.12.1, 1.12.2): kernels vs autograd of the
float64 unrolled reference, layout, saturation, strides, errors, registration."""
import pytest
import torch

from mindspeed_ops.api.triton.sinkhorn import hc_split_sinkhorn, sinkhorn, sinkhorn_knopp
from mindspeed_ops.ops.mhc import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, randn, snapshot, to_ref, uniform
from tests.conftest import DEVICE, DTYPES, ON_GPU

T = 4096 if ON_GPU else 48


def _params(n, dtype=torch.float32, seed=0):
    W = (2 + n) * n
    s = uniform((3,), 0.5, 1.5, dtype, DEVICE, seed=seed + 100)
    b = randn((W,), dtype, DEVICE, seed=seed + 101, scale=0.5)
    return s, b


def _check(m, s, b, n, iters, grads=None, eps=1e-6):
    m, s, b = (t.detach().requires_grad_(True) for t in (m, s, b))
    before = snapshot(m, s, b)
    outs = sinkhorn(m, s, b, n, iters, eps)
    if grads is None:
        grads = [randn(o.shape, o.dtype, DEVICE, seed=7 + i) for i, o in enumerate(outs)]
    g_before = snapshot(*grads)
    torch.autograd.backward(outs, grads)
    assert_unchanged(before + g_before, m, s, b, *grads)
    mr, sr, br = to_ref(m, s, b, requires_grad=True)
    outs_r = ref.sinkhorn(mr, sr, br, n, iters, eps)
    torch.autograd.backward(outs_r, [g.double() for g in grads])
    for name, r, o in zip(("pre", "post", "comb"), outs_r, outs):
        assert o.dtype == m.dtype
        assert_close(name, r, o, "SINK-fwd")
    for name, r, o in zip(("d mixes", "d hc_scale", "d hc_base"), (mr, sr, br), (m, s, b)):
        assert o.grad.dtype == o.dtype
        assert_close(name, r.grad, o.grad, "SINK-bwd")
    return outs, (m.grad, s.grad, b.grad)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("iters", [1, 2, 20])
def test_matches_reference(n, iters):
    W = (2 + n) * n
    s, b = _params(n, seed=n)
    _check(randn((2, T, W), torch.float32, DEVICE, seed=1), s, b, n, iters)
    _check(randn((1, W), torch.float32, DEVICE, seed=2), s, b, n, iters)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    n = 4
    s, b = _params(n, dtype, seed=3)
    _check(randn((3, 20, 24), dtype, DEVICE, seed=3), s, b, n, 20)


@pytest.mark.parametrize("n", [5, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_wide(dtype, n):
    """n > 4 with 16-bit inputs runs the fp32 kernels on fp32 copies (sinkhorn._wide): outputs and gradients
    still in the input dtypes, also for the stride-0 gradients of ``.sum()`` and an unused output."""
    W = (2 + n) * n
    s, b = _params(n, dtype, seed=n)
    _check(randn((3, 20, W), dtype, DEVICE, seed=n), s, b, n, 20)
    m = randn((7, W), dtype, DEVICE, seed=9).requires_grad_()
    pre, post, comb = sinkhorn(m, s, b, n, 20)
    (pre.sum() + comb.sum()).backward()
    assert m.grad.dtype == dtype and torch.isfinite(m.grad).all()


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # interpreter's exp(+large) = inf: σ -> 0, as on GPU
def test_saturation_finite():
    for n in (1, 4, 8):
        W = (2 + n) * n
        s = torch.ones(3, device=DEVICE)
        b = randn((W,), torch.float32, DEVICE, seed=4)
        m = randn((64, W), torch.float32, DEVICE, seed=5, scale=50.0).requires_grad_()
        outs = sinkhorn(m, s, b, n, 20)
        sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
        assert all(torch.isfinite(o).all() for o in outs) and torch.isfinite(m.grad).all()


def test_layout_and_column_sums():
    n = 4
    # distinct constant blocks: pre logits 1, post logits -2, comb logits a fixed non-symmetric pattern
    comb_logits = (torch.arange(n * n, dtype=torch.float32) ** 2 % 7) / 3.0
    m = torch.cat([torch.full((n,), 1.0), torch.full((n,), -2.0), comb_logits]).to(DEVICE).expand(5, -1)
    s = torch.tensor([1.0, 1.0, 1.0], device=DEVICE)
    b = torch.zeros((2 + n) * n, device=DEVICE)
    pre, post, comb = sinkhorn(m, s, b, n, 20)
    sig = torch.sigmoid
    assert torch.allclose(pre, (sig(torch.tensor(1.0)) + 1e-6).to(DEVICE).expand(5, n), rtol=1e-6)
    assert torch.allclose(post, (2 * sig(torch.tensor(-2.0))).to(DEVICE).expand(5, n), rtol=1e-6)
    want = ref.sinkhorn_knopp(comb_logits.view(n, n).double(), 20)
    assert_close("comb row-major", want.expand(5, n, n), comb, "SINK-fwd")
    transposed = ref.sinkhorn_knopp(comb_logits.view(n, n).t().double(), 20)
    assert (transposed - want).abs().max() > 1e-2  # a column-major read would fail the line above
    full = sinkhorn(randn((64, 24), torch.float32, DEVICE, seed=6, scale=3.0), *_params(4, seed=6), 4, 20)[2]
    assert (full.sum(-2) - 1).abs().max() < 1e-5


def test_non_contiguous_and_stride0_grads():
    n = 4
    s, b = _params(n, seed=8)
    proj = randn((2, 30, 40), torch.float32, DEVICE, seed=8)
    _check(proj[..., 5:29], s, b, n, 20)  # slice of a wider projection output
    _check(non_contiguous(randn((30, 24), torch.float32, DEVICE, seed=9)), s, b, n, 3)
    m = randn((30, 24), torch.float32, DEVICE, seed=10).requires_grad_()
    sg, bg = s.clone().requires_grad_(), b.clone().requires_grad_()
    pre, post, comb = sinkhorn(m, sg, bg, n, 20)
    (comb.sum() + pre.sum()).backward()  # stride-0 gradients, post unused
    mr, sr, br = to_ref(m, s, b, requires_grad=True)
    pr, _, cr = ref.sinkhorn(mr, sr, br, n, 20)
    (cr.sum() + pr.sum()).backward()
    for name, r, o in (("dm", mr, m), ("ds", sr, sg), ("db", br, bg)):
        assert_close(name, r.grad, o.grad, "SINK-bwd")
    gt = [randn((n, 30), torch.float32, DEVICE, seed=11).t(), randn((n, 30), torch.float32, DEVICE, seed=12).t(),
          randn((30, n, n), torch.float32, DEVICE, seed=13).transpose(-1, -2)]
    _check(randn((30, 24), torch.float32, DEVICE, seed=14), s, b, n, 5, grads=gt)


def test_alias_and_empty():
    assert hc_split_sinkhorn is sinkhorn
    s, b = _params(2)
    m = torch.empty(0, 8, device=DEVICE, requires_grad=True)
    pre, post, comb = sinkhorn(m, s, b, 2)
    assert comb.shape == (0, 2, 2)
    (pre.sum() + comb.sum()).backward()
    assert m.grad.shape == (0, 8)


def test_bad_input():
    s, b = _params(4)
    m = torch.randn(3, 24, device=DEVICE)
    with pytest.raises(ValueError, match="hc_mult must be an int in"):
        sinkhorn(torch.randn(3, 90, device=DEVICE), s, torch.randn(90, device=DEVICE), 9)
    with pytest.raises(ValueError, match=r"mixes must have shape \[..., \(2\+n\)\*n\]"):
        sinkhorn(torch.randn(3, 23, device=DEVICE), s, b, 4)
    with pytest.raises(ValueError, match="sinkhorn_iters must be an int >= 1"):
        sinkhorn(m, s, b, 4, 0)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        sinkhorn(m, s, b, 4, 20, -1.0)
    with pytest.raises(ValueError, match="hc_scale must have shape"):
        sinkhorn(m, torch.ones(2, device=DEVICE), b, 4)
    with pytest.raises(ValueError, match="hc_base must have shape"):
        sinkhorn(m, s, b[:-1], 4)
    with pytest.raises(TypeError, match="float64"):
        sinkhorn(m.double(), s, b, 4)
    with pytest.raises(ValueError, match=r"logits must have shape \[..., n, n\]"):
        sinkhorn_knopp(torch.randn(2, 3, 4, device=DEVICE))
    with pytest.raises(ValueError, match="iters must be an int >= 1"):
        sinkhorn_knopp(torch.randn(2, 3, 3, device=DEVICE), 0)


def test_deterministic():
    s, b = _params(4, seed=15)
    m = randn((2, 200, 24), torch.float32, DEVICE, seed=15).requires_grad_()
    sg = s.clone().requires_grad_()
    res = []
    for _ in range(2):
        m.grad = sg.grad = None
        outs = sinkhorn(m, sg, b, 4, 20)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        res.append([*outs, m.grad, sg.grad])
    assert all(torch.equal(a, c) for a, c in zip(*res))


def test_registration_and_compile():
    s, b = _params(4, seed=16)
    m = randn((6, 24), torch.float32, DEVICE, seed=16).requires_grad_()
    torch.library.opcheck(torch.ops.mindspeed_ops.sinkhorn, (m, s.requires_grad_(), b, 4, 3, 1e-6))
    L = randn((5, 4, 4), torch.float32, DEVICE, seed=17).requires_grad_()
    torch.library.opcheck(torch.ops.mindspeed_ops.sinkhorn_knopp, (L, 3, 1e-6))
    f = torch.compile(lambda t: sinkhorn(t, s, b, 4, 5), fullgraph=True)
    pre, post, comb = f(m)
    (pre.sum() + post.sum() + comb.sum()).backward()
    assert_close("compiled comb", ref.sinkhorn(m.detach().double(), s.double(), b.double(), 4, 5)[2], comb,
                 "SINK-fwd")


def test_reference_backend_gradients():
    import mindspeed_ops

    s, b = _params(4, seed=18)
    m = randn((6, 24), torch.float32, DEVICE, seed=18).requires_grad_()
    with mindspeed_ops.use_backend("reference"):
        outs = sinkhorn(m, s, b, 4, 4)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    mr, = to_ref(m, requires_grad=True)
    outs_r = ref.sinkhorn(mr, s.double(), b.double(), 4, 4)
    sum(o.sum() for o in outs_r).backward()
    assert_close("reference-backend dm", mr.grad, m.grad, "SINK-bwd")


@pytest.mark.parametrize("n", [1, 4, 16, 64])
@pytest.mark.parametrize("iters", [1, 20])
def test_knopp_matches_reference(n, iters):
    L = randn((3, n, n), torch.float32, DEVICE, seed=n, scale=2.0).requires_grad_()
    P = sinkhorn_knopp(L, iters)
    dp = randn(P.shape, P.dtype, DEVICE, seed=20)
    P.backward(dp)
    (Lr,) = to_ref(L, requires_grad=True)
    Pr = ref.sinkhorn_knopp(Lr, iters)
    Pr.backward(dp.double())
    assert_close("P", Pr, P, "SINK-fwd")
    assert_close("d logits", Lr.grad, L.grad, "SINK-bwd")


@pytest.mark.parametrize("dtype", DTYPES)
def test_knopp_equals_sinkhorn_comb(dtype):
    n = 4
    s, b = _params(n, dtype, seed=21)
    m = randn((10, 24), dtype, DEVICE, seed=21)
    comb = sinkhorn(m, s, b, n, 20)[2]
    logits = (s[2].float() * m[:, 2 * n:].float() + b[2 * n:].float()).view(10, n, n)
    assert_close("knopp vs comb", sinkhorn_knopp(logits, 20).double(), comb, "SINK-fwd")
    _ = sinkhorn_knopp(non_contiguous(logits.to(dtype), "transpose"), 20)  # any strides accepted


@pytest.mark.gpu
def test_real_size_n4():
    s, b = _params(4, seed=22)
    _check(randn((2, 4096, 24), torch.float32, DEVICE, seed=22), s, b, 4, 20)
