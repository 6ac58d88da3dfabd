"""Review regressions for the mHC family (SPEC 1.12): eps = 0 with a padded (non-power-of-two) stream
count, argument coercion, dynamic-shape compile, odd hidden sizes and gradient layouts."""
import pytest
import torch

from mindspeed_ops.api.triton.mhc_post import mhc_post
from mindspeed_ops.api.triton.mhc_pre_bmm import mhc_pre_bmm
from mindspeed_ops.api.triton.sinkhorn import sinkhorn, sinkhorn_knopp
from mindspeed_ops.ops.mhc import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, randn, snapshot, to_ref, uniform
from tests.conftest import DEVICE


def _sinkhorn_case(n, iters, eps, tokens=5):
    W = (2 + n) * n
    m = randn((tokens, W), torch.float32, DEVICE, seed=n).requires_grad_()
    s = uniform((3,), 0.5, 1.5, torch.float32, DEVICE, seed=1).requires_grad_()
    b = randn((W,), torch.float32, DEVICE, seed=2, scale=0.5).requires_grad_()
    out = sinkhorn(m, s, b, n, iters, eps)
    grads = [randn(o.shape, torch.float32, DEVICE, seed=10 + i) for i, o in enumerate(out)]
    torch.autograd.backward(out, grads)
    refs = to_ref(m, s, b, requires_grad=True)
    want = ref.sinkhorn(*refs, n, iters, eps)
    torch.autograd.backward(want, [g.double() for g in grads])
    for name, w, o in zip(("pre", "post", "comb"), want, out):
        assert_close(name, w, o, "SINK-fwd")
    for name, r, t in zip(("d mixes", "d hc_scale", "d hc_base"), refs, (m, s, b)):
        assert_close(name, r.grad, t.grad, "SINK-bwd")


@pytest.mark.parametrize("n", [1, 3, 5, 6, 7])
def test_sinkhorn_eps_zero_padded_streams(n):
    """eps = 0 is allowed (SPEC: eps >= 0). With n not a power of two the kernels pad the n×n matrix:
    the padding columns/rows sum to 0, and 1/(0 + 0) = inf times the zero padding gave NaN that then
    spread into every valid entry (forward and backward)."""
    _sinkhorn_case(n, 3, 0.0)


@pytest.mark.parametrize("n", [1, 3, 7])
def test_knopp_eps_zero_padded(n):
    L = randn((4, n, n), torch.float32, DEVICE, seed=3, scale=2.0).requires_grad_()
    P = sinkhorn_knopp(L, 4, 0.0)
    g = randn(P.shape, torch.float32, DEVICE, seed=4)
    P.backward(g)
    (Lr,) = to_ref(L, requires_grad=True)
    Pr = ref.sinkhorn_knopp(Lr, 4, 0.0)
    Pr.backward(g.double())
    assert_close("P", Pr, P, "SINK-fwd")
    assert_close("d logits", Lr.grad, L.grad, "SINK-bwd")


def test_sinkhorn_all_stream_counts_small_eps():
    for n in range(1, 9):
        _sinkhorn_case(n, 2, 1e-6, tokens=3)


def test_fractional_counts_rejected():
    """int() used to truncate silently (hc_mult=4.5 ran n=4, sinkhorn_iters=2.5 ran 2 iterations)."""
    m, s, b = torch.randn(3, 24), torch.rand(3), torch.randn(24)
    with pytest.raises(ValueError, match="hc_mult"):
        sinkhorn(m, s, b, 4.5)
    with pytest.raises(ValueError, match="sinkhorn_iters"):
        sinkhorn(m, s, b, 4, 2.5)
    with pytest.raises(ValueError, match="hc_mult"):
        sinkhorn(torch.randn(3, 3), s, torch.randn(3), True)
    with pytest.raises(ValueError, match="iters"):
        sinkhorn_knopp(torch.randn(2, 4, 4), 1.5)
    # integral values of other int-like types still work
    sinkhorn(m, s, b, torch.tensor(4), 2.0)


def test_compile_dynamic_hc_mult_from_shape():
    """torch.compile(dynamic=True) with hc_mult taken from the streams' shape passes a SymInt."""
    n, D = 3, 8
    W = (2 + n) * n

    def sublayer(X, fn, sc, bs, lib):
        pre, post, comb = lib.sinkhorn(X.flatten(-2) @ fn.t(), sc, bs, X.shape[-2], 3, 1e-6)
        return lib.mhc_post(torch.tanh(lib.mhc_pre_bmm(pre, X)), X, post, comb)

    class Ops:
        pass

    ops = Ops()
    ops.sinkhorn, ops.mhc_pre_bmm, ops.mhc_post = sinkhorn, mhc_pre_bmm, mhc_post
    X = randn((2, 5, n, D), torch.float32, DEVICE, seed=1).requires_grad_()
    fn = randn((W, n * D), torch.float32, DEVICE, seed=2, scale=0.1)
    sc = uniform((3,), 0.5, 1.5, torch.float32, DEVICE, seed=3)
    bs = randn((W,), torch.float32, DEVICE, seed=4, scale=0.5)
    f = torch.compile(lambda *a: sublayer(*a, ops), fullgraph=True, dynamic=True)
    out = f(X, fn, sc, bs)
    g = randn(out.shape, torch.float32, DEVICE, seed=5)
    out.backward(g)
    Xr, fr, sr, br = to_ref(X, fn, sc, bs)
    Xr.requires_grad_()
    want = sublayer(Xr, fr, sr, br, ref)
    want.backward(g.double())
    assert_close("out", want, out, "E-fwd")
    assert_close("d X", Xr.grad, X.grad, "SINK-bwd")


def _grad_like(shape, dtype, kind):
    g = randn(shape, dtype, DEVICE, seed=9)
    if kind == "transposed":
        return g.transpose(-1, -2).contiguous().transpose(-1, -2)
    if kind == "expanded":  # stride 0 in every leading dim
        return randn(shape[-1:], dtype, DEVICE, seed=9).expand(shape)
    return g


@pytest.mark.parametrize("n,D", [(3, 1), (5, 17), (7, 129), (8, 100), (2, 3)])
@pytest.mark.parametrize("kind", ["plain", "transposed", "expanded"])
def test_pre_post_odd_sizes_and_grad_layouts(n, D, kind, poisoned):
    dtype = torch.float16
    x = randn((7, n, D), dtype, DEVICE, seed=1).requires_grad_()
    p = uniform((7, n), -1.0, 1.0, torch.float32, DEVICE, seed=2).requires_grad_()
    before = snapshot(x, p)
    y = mhc_pre_bmm(p, x)
    dy = _grad_like(y.shape, dtype, kind)
    dy_before = snapshot(dy)
    y.backward(dy)
    assert_unchanged(before, x, p)
    assert_unchanged(dy_before, dy)
    xr, pr = to_ref(x, p, requires_grad=True)
    ref.mhc_pre_bmm(pr, xr, torch.float64).backward(dy.double())
    assert_close("y", ref.mhc_pre_bmm(pr.detach(), xr.detach(), torch.float64), y, "E-fwd")
    assert_close("d x", xr.grad, x.grad, "E-bwd")
    assert_close("d pre", pr.grad, p.grad, "E-bwd")

    ins = [randn((7, D), dtype, DEVICE, seed=3), randn((7, n, D), dtype, DEVICE, seed=4),
           uniform((7, n), 0.0, 2.0, torch.float32, DEVICE, seed=5),
           uniform((7, n, n), 0.0, 1.0, torch.float32, DEVICE, seed=6)]
    ins = [t.requires_grad_() for t in ins]
    before = snapshot(*ins)
    out = mhc_post(*ins)
    dout = _grad_like(out.shape, dtype, kind)
    out.backward(dout)
    assert_unchanged(before, *ins)
    refs = to_ref(*ins, requires_grad=True)
    want = ref.mhc_post(*refs)
    want.backward(dout.double())
    assert_close("out", want, out, "E-fwd")
    for name, r, t in zip(("dx", "dresidual", "dh_post", "dh_res"), refs, ins):
        assert_close(name, r.grad, t.grad, "E-bwd")
