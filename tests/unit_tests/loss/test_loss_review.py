"""Review regressions for the loss family (SPEC 1.7, 1.8): edge semantics a drop-in replacement for
F.cross_entropy / Liger / cut-cross-entropy must get right. Small shapes (CPU interpreter)."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops.api.triton.chunk_loss import chunk_loss
from mindspeed_ops.api.triton.fused_cross_entropy_loss import FusedCrossEntropyLossFunction, fused_cross_entropy_loss
from mindspeed_ops.ops.loss import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, randn, snapshot
from tests.conftest import DEVICE

IGNORE = -100
REDUCTIONS = ["mean", "sum", "none"]


def _labels(n, V, seed, ignore_frac=0.25):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, V, (n,), generator=g)
    y[torch.rand(n, generator=g) < ignore_frac] = IGNORE
    return y.to(DEVICE)


def _g(loss, seed):
    return randn(loss.shape, torch.float32, DEVICE, seed=seed) if loss.dim() else torch.tensor(0.7, device=DEVICE)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_nonfinite_weight_on_ignored_row_is_excluded(reduction, bad):
    """Bug: ``mean`` summed ``w·valid`` for its denominator, so an inf/NaN weight on an *ignored* row
    (e.g. 1/count on padding) made the loss NaN; the reference's autograd gave 0·inf = NaN gradients."""
    V = 37
    x = randn((6, V), torch.float32, DEVICE, seed=1, scale=2.0)
    y = torch.tensor([3, IGNORE, 0, V - 1, IGNORE, 5], device=DEVICE)
    w = torch.tensor([1.0, bad, 2.0, 0.5, bad, 1.5], device=DEVICE)
    w_clean = torch.where(y != IGNORE, w, torch.zeros_like(w))  # what the ignored rows must not influence
    want = ref.fused_cross_entropy_loss(x.double(), y, w_clean.double(), reduction=reduction)
    for fn in (fused_cross_entropy_loss, ref.fused_cross_entropy_loss):
        xx = (x if fn is fused_cross_entropy_loss else x.double()).detach().requires_grad_(True)
        loss = fn(xx, y, w, reduction=reduction, label_smoothing=0.1)
        loss.backward(_g(loss, 2))
        assert torch.isfinite(loss).all() and torch.isfinite(xx.grad).all(), fn.__module__
        assert_close("loss", ref.fused_cross_entropy_loss(x.double(), y, w_clean.double(), reduction=reduction,
                                                          label_smoothing=0.1), loss, "STAT")
    assert torch.isfinite(want).all()
    # chunk_loss (kernel path and mean's backward denominator)
    h = randn((6, 8), torch.float32, DEVICE, seed=3).requires_grad_(True)
    W = randn((V, 8), torch.float32, DEVICE, seed=4, scale=0.4).requires_grad_(True)
    loss = chunk_loss(h, W, y, loss_weight=w, reduction=reduction, chunk_size=4)
    loss.backward(_g(loss, 5))
    hr, Wr = (t.detach().double().requires_grad_(True) for t in (h, W))
    lr = ref.chunk_loss(hr, Wr, y, loss_weight=w_clean.double(), reduction=reduction)
    lr.backward(_g(loss, 5).double())
    assert_close("chunk loss", lr, loss, "STAT")
    assert_close("chunk dhidden", hr.grad, h.grad, "E-bwd")
    assert_close("chunk dweight", Wr.grad, W.grad, "E-bwd")


def test_inplace_backward_rejects_expanded_logits():
    """Bug: with ``inplace_backward=True`` an expanded (stride-0) ``logits`` had every row's gradient
    written into one shared row: a silently wrong gradient. Now a ValueError naming ``logits``."""
    b = randn((1, 40), torch.float32, DEVICE, seed=6).requires_grad_(True)
    y = _labels(5, 40, seed=7, ignore_frac=0.0)
    with pytest.raises(ValueError, match="logits"):
        fused_cross_entropy_loss(b.expand(5, 40), y, inplace_backward=True)
    # the out-of-place path reads the stride-0 rows correctly
    fused_cross_entropy_loss(b.expand(5, 40), y).backward()
    br = b.detach().double().requires_grad_(True)
    F.cross_entropy(br.expand(5, 40), y).backward()
    assert_close("dlogits of expanded", br.grad, b.grad, "E-fwd")


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compile_with_changing_token_count(reduction):
    """Bug: after a second call with another N (automatic dynamic shapes, the default of
    torch.compile), chunk_loss's default chunk size became a SymInt expression and the op rejected it
    (``chunk_size must be None or a positive int, got Min(s17, ...)``); with ``dynamic=True`` the
    ``math.isfinite`` option check also broke tracing."""
    torch._dynamo.reset()
    tail = (lambda t: t.sum()) if reduction == "none" else (lambda t: t)

    def step(h, W, y):
        return tail(chunk_loss(h, W, y, reduction=reduction, lse_square_scale=1e-3)) + \
            tail(fused_cross_entropy_loss(h @ W.t(), y, reduction=reduction, lse_square_scale=1e-3))

    for dynamic in (None, True):
        f = torch.compile(step, fullgraph=True, dynamic=dynamic)
        for n in (5, 9, 12):
            h = randn((n, 16), torch.float32, DEVICE, seed=n).requires_grad_(True)
            W = randn((50, 16), torch.float32, DEVICE, seed=8, scale=0.3).requires_grad_(True)
            y = _labels(n, 50, seed=n + 1)
            loss = f(h, W, y)
            loss.backward()
            hr, Wr = (t.detach().double().requires_grad_(True) for t in (h, W))
            lr = tail(ref.chunk_loss(hr, Wr, y, reduction=reduction, lse_square_scale=1e-3)) + \
                tail(ref.fused_cross_entropy_loss(hr @ Wr.t(), y, reduction=reduction, lse_square_scale=1e-3))
            lr.backward()
            assert_close(f"loss n={n}", lr, loss, "STAT")
            assert_close(f"dhidden n={n}", hr.grad, h.grad, "E-bwd")
            assert_close(f"dweight n={n}", Wr.grad, W.grad, "E-bwd")
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# passing regressions kept from the review


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_ignored_every_option(reduction):
    x = randn((4, 7), torch.float32, DEVICE, seed=9).requires_grad_(True)
    y = torch.full((4,), IGNORE, device=DEVICE)
    h = randn((4, 8), torch.float32, DEVICE, seed=10).requires_grad_(True)
    W = randn((7, 8), torch.float32, DEVICE, seed=11).requires_grad_(True)
    b = randn((7,), torch.float32, DEVICE, seed=12).requires_grad_(True)
    for opts in ({}, {"label_smoothing": 0.2}, {"lse_square_scale": 0.1}, {"softcap": 3.0}):
        for loss, leaves in ((fused_cross_entropy_loss(x, y, reduction=reduction, **opts), (x,)),
                             (chunk_loss(h, W, y, b, reduction=reduction, **opts), (h, W, b))):
            assert torch.all(loss == 0) and loss.requires_grad, (opts, loss)
            loss.backward(torch.ones_like(loss))
            for t in leaves:
                assert torch.equal(t.grad, torch.zeros_like(t))
                t.grad = None


@pytest.mark.parametrize("V", [1, 2, 129])
@pytest.mark.parametrize("N", [0, 1, 3])
def test_tiny_vocab_and_token_counts(V, N):
    x = randn((N, V), torch.float32, DEVICE, seed=13, scale=3.0)
    y = torch.randint(0, V, (N,)).to(DEVICE)
    if N:
        y[0] = V - 1
    if N > 1:
        y[1] = 0
    for red in REDUCTIONS:
        xx = x.detach().requires_grad_(True)
        loss = fused_cross_entropy_loss(xx, y, reduction=red, label_smoothing=0.1, lse_square_scale=1e-3)
        g = _g(loss, 14)
        loss.backward(g)
        xr = x.double().requires_grad_(True)
        lr = ref.fused_cross_entropy_loss(xr, y, reduction=red, label_smoothing=0.1, lse_square_scale=1e-3)
        lr.backward(g.double())
        assert_close("loss", lr, loss, "STAT")
        assert_close("dlogits", xr.grad, xx.grad, "E-fwd")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0])
def test_pytorch_parity_smoothing_ignored_zero_first_grad(reduction, eps):
    x = randn((20, 33), torch.float32, DEVICE, seed=15, scale=2.0).requires_grad_(True)
    y = _labels(20, 33, seed=16)
    y[0] = IGNORE
    xr = x.detach().double().requires_grad_(True)
    loss = fused_cross_entropy_loss(x, y, reduction=reduction, label_smoothing=eps)
    lr = F.cross_entropy(xr, y, reduction=reduction, label_smoothing=eps)
    g = _g(loss, 17)
    if g.dim():
        g[0] = 0.0
        g[1] = 0.0  # a zero upstream gradient on a valid row too
    loss.backward(g)
    lr.backward(g.double())
    assert_close("loss", lr, loss, "STAT")
    assert_close("dlogits", xr.grad, x.grad, "E-fwd")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extreme_logits(dtype):
    x = randn((6, 50), torch.float32, DEVICE, seed=18)
    x[0, 3] = 1e4
    x[1, :] = -1e4
    x[2, 5] = -1e4
    x[3, :10] = float("-inf")
    y = torch.tensor([3, 4, 5, 12, 0, 49], device=DEVICE)
    xx = x.to(dtype).detach().requires_grad_(True)
    loss = fused_cross_entropy_loss(xx, y, reduction="none")
    loss.sum().backward()
    xr = x.to(dtype).detach().double().requires_grad_(True)
    F.cross_entropy(xr, y, reduction="none").sum().backward()
    assert_close("loss", F.cross_entropy(xr.detach(), y, reduction="none"), loss, "STAT")
    assert_close("dlogits", xr.grad, xx.grad, "E-fwd")


def test_compat_function_3d_and_compiled():
    x = randn((2, 15, 77), torch.float16, DEVICE, seed=19, scale=2.0)
    y = _labels(30, 77, seed=20).view(2, 15).to(torch.int32)
    w = torch.rand(2, 15, generator=torch.Generator().manual_seed(21)).to(DEVICE)
    xr = x.double().requires_grad_(True)
    lr = ref.fused_cross_entropy_loss(xr, y, w.double(), reduction="sum")
    lr.backward()
    for fn in (FusedCrossEntropyLossFunction.apply,
               torch.compile(lambda a, b, c: FusedCrossEntropyLossFunction.apply(a, b, c), fullgraph=True)):
        xx = x.detach().requires_grad_(True)
        loss = fn(xx, w, y)
        loss.backward()
        assert loss.dim() == 0 and loss.dtype == torch.float32
        assert_close("loss", lr, loss, "STAT")
        assert_close("dlogits", xr.grad, xx.grad, "E-fwd")
    torch._dynamo.reset()


def test_inplace_backward_transposed_logits():
    leaf = randn((40, 5), torch.float32, DEVICE, seed=22).requires_grad_(True)
    y = _labels(5, 40, seed=23)
    logits = (leaf * 1.0).t()  # last-dim stride != 1: copied for the kernel, gradient copied back
    fused_cross_entropy_loss(logits, y, inplace_backward=True, label_smoothing=0.1).backward()
    xr = leaf.detach().double().t().clone().requires_grad_(True)
    F.cross_entropy(xr, y, label_smoothing=0.1).backward()
    assert_close("dlogits", xr.grad.t(), leaf.grad, "E-fwd")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("need", [(True, True, True), (True, False, False), (False, True, False), (False, False, True)])
def test_chunk_strided_hidden_transposed_weight(reduction, need):
    Hd, V = 16, 301
    h = randn((2, 13, Hd), torch.float32, DEVICE, seed=24)[:, :-1, :]  # the shifted view
    W = randn((Hd, V), torch.float32, DEVICE, seed=25, scale=0.3).t()  # a transposed [Hd, V] parameter
    b = randn((V,), torch.float32, DEVICE, seed=26)
    y = _labels(24, V, seed=27).view(2, 12)
    y[0, 0] = IGNORE
    hh, WW, bb = (t.detach().requires_grad_(r) for t, r in zip((h, W, b), need))
    before = snapshot(hh, WW, bb, y)
    loss = chunk_loss(hh, WW, y, bb, reduction=reduction, label_smoothing=0.05, chunk_size=5)
    if reduction == "none":
        g = randn((12, 2), torch.float32, DEVICE, seed=28).t()  # transposed upstream gradient
        g[0, 0] = 0.0
    else:
        g = torch.tensor(1.7, device=DEVICE)
    g_before = snapshot(g)
    loss.backward(g)
    assert_unchanged(before + g_before, hh, WW, bb, y, g, names=["hidden", "weight", "bias", "labels", "grad"])
    hr, Wr, br = (t.detach().double().requires_grad_(r) for t, r in zip((h, W, b), need))
    lr = ref.chunk_loss(hr, Wr, y, br, reduction=reduction, label_smoothing=0.05)
    lr.backward(g.double())
    assert_close("loss", lr, loss, "STAT")
    for name, t, r in (("dhidden", hh, hr), ("dweight", WW, Wr), ("dbias", bb, br)):
        if t.requires_grad:
            assert t.grad.dtype == t.dtype
            assert_close(name, r.grad, t.grad, "E-bwd")
        else:
            assert t.grad is None


def test_numpy_scalar_options():
    """Options given as numpy scalars (read from a config through numpy) are numbers like any float (bug:
    ``label_smoothing=np.float32(0.1)`` raised "label_smoothing must be in [0, 1], got np.float32(0.1)")."""
    np = pytest.importorskip("numpy")
    x = randn((6, 11), torch.float32, DEVICE, seed=1)
    y = _labels(6, 11, seed=2)
    opts = dict(label_smoothing=0.1, lse_square_scale=1e-3, softcap=5.0)
    want = ref.fused_cross_entropy_loss(x.double(), y, **opts)
    assert_close("loss", want, fused_cross_entropy_loss(x, y, **{k: np.float32(v) for k, v in opts.items()}), "STAT")
    w = randn((7, 11), torch.float32, DEVICE, seed=3)
    want = ref.chunk_loss(x.double(), w.double(), y, **opts)
    assert_close("chunk loss", want, chunk_loss(x, w, y, **{k: np.float64(v) if k == "softcap" else np.float32(v)
                                                             for k, v in opts.items()}), "STAT")
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        fused_cross_entropy_loss(x, y, label_smoothing=np.float32(1.5))
