"""fused_cross_entropy_loss (SPEC 1.7): kernels vs float64 references, edge semantics, errors, registration."""
import pytest
import torch
import torch.nn.functional as F

import mindspeed_ops
from mindspeed_ops.api.triton.fused_cross_entropy_loss import (FusedCrossEntropyLoss, FusedCrossEntropyLossFunction,
                                                                fused_cross_entropy_loss)
from mindspeed_ops.ops.loss import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, randn, snapshot, uniform
from tests.conftest import DEVICE, DTYPES, ON_GPU

IGNORE = -100


def _labels(shape, V, seed, ignore_frac=0.25):
    g = torch.Generator(device="cpu").manual_seed(seed)
    y = torch.randint(0, V, tuple(shape), generator=g)
    y[torch.rand(tuple(shape), generator=g) < ignore_frac] = IGNORE
    return y.to(DEVICE)


def _upstream(loss, seed):
    return randn(loss.shape, torch.float32, DEVICE, seed=seed) if loss.dim() else torch.tensor(0.7, device=DEVICE)


def _check(logits, labels, loss_weight=None, g=None, nan_mask=False, oracle=None, **kw):
    """Forward and backward against autograd of the float64 reference (or ``oracle``); no input mutation."""
    x = logits.detach().requires_grad_(True)
    before = snapshot(x, labels, loss_weight)
    loss = fused_cross_entropy_loss(x, labels, loss_weight, **kw)
    assert loss.dtype == torch.float32
    g = _upstream(loss, 11) if g is None else g
    g_before = snapshot(g)
    loss.backward(g)
    assert_unchanged(before + g_before, x, labels, loss_weight, g, names=["logits", "labels", "loss_weight", "grad"])
    xr = x.detach().double().requires_grad_(True)
    wr = None if loss_weight is None else loss_weight.double()
    lr = oracle(xr) if oracle is not None else ref.fused_cross_entropy_loss(xr, labels, wr, **kw)
    lr.backward(g.double())
    assert_close("loss", lr, loss, "STAT", nan_mask=nan_mask)
    assert x.grad.dtype == logits.dtype and x.grad.shape == logits.shape
    assert_close("dlogits", xr.grad, x.grad, "E-fwd", nan_mask=nan_mask)
    return loss, x.grad


PARITY = (4096, 32000) if ON_GPU else (32, 1200)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if ON_GPU else DTYPES)
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_pytorch_parity(dtype, eps, reduction):
    x = randn(PARITY, dtype, DEVICE, seed=1, scale=2.0)
    y = _labels(PARITY[:1], PARITY[1], seed=2)
    def oracle(xr):
        return F.cross_entropy(xr, y, ignore_index=IGNORE, reduction=reduction, label_smoothing=eps)

    _check(x, y, oracle=oracle, reduction=reduction, label_smoothing=eps)


@pytest.mark.parametrize("weights", [False, True])
def test_empty_denominator_mean_is_zero(weights):
    x = randn((10, 5), torch.float32, DEVICE, seed=3).requires_grad_(True)
    if weights:  # valid labels, every weight 0
        y, w = _labels((10,), 5, seed=4, ignore_frac=0.0), torch.zeros(10, device=DEVICE)
    else:
        y, w = torch.full((10,), IGNORE, device=DEVICE), None
    loss = fused_cross_entropy_loss(x, y, w)
    assert loss.item() == 0.0 and torch.isfinite(loss) and loss.requires_grad
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_none_shape_and_per_row_scale():
    B, T, V = 3, 5, 300
    x = randn((B, T, V), torch.float32, DEVICE, seed=5, scale=2.0)
    y = _labels((B, T), V, seed=6)
    y[0, 0] = IGNORE
    g = randn((B, T), torch.float32, DEVICE, seed=7)
    g[0, 0] = 0.0
    loss, dx = _check(x, y, g=g, reduction="none")
    assert loss.shape == (B, T)
    # row by row: each row's gradient is its own upstream gradient times the unit-gradient row
    xr = x.double().requires_grad_(True)
    ref.fused_cross_entropy_loss(xr, y, reduction="sum").backward()
    assert_close("rows", xr.grad * g.double().unsqueeze(-1), dx, "E-fwd")
    assert torch.equal(dx[0, 0], torch.zeros_like(dx[0, 0]))


@pytest.mark.parametrize("p", [0.9, 0.99, 0.999])
def test_true_class_gradient_relative_precision(p):
    # bf16 runs on CPU through the interpreter shim (fp32 inside, one rounding on the way out)
    N, V = (256, 32000) if ON_GPU else (8, 2000)
    x = randn((N, V), torch.float32, DEVICE, seed=8, scale=2.0)
    y = torch.arange(N, device=DEVICE) * 7 % V
    others = x.clone()
    others[torch.arange(N), y] = float("-inf")
    lse_others = torch.logsumexp(others, dim=-1)
    x[torch.arange(N), y] = lse_others + torch.log(torch.tensor(p / (1 - p)))
    x = x.to(torch.bfloat16).requires_grad_(True)
    fused_cross_entropy_loss(x, y, reduction="sum").backward()
    xr = x.detach().double().requires_grad_(True)
    F.cross_entropy(xr, y, reduction="sum").backward()
    want = xr.grad[torch.arange(N), y]
    got = x.grad[torch.arange(N), y].double()
    assert (want < 0).all()
    assert ((got - want).abs() / want.abs()).max() <= 0.01


def test_bf16_matches_fp32_upcast():
    shape = (256, 32000) if ON_GPU else (16, 1500)
    x = randn(shape, torch.bfloat16, DEVICE, seed=9, scale=3.0)
    y = _labels(shape[:1], shape[1], seed=10)
    a = fused_cross_entropy_loss(x, y, reduction="none")
    b = fused_cross_entropy_loss(x.float(), y, reduction="none")
    assert_close("bf16 vs fp32", b, a, "STAT")


@pytest.mark.parametrize("V", [1, 2, 32001, 50257, 128256, 201088])
def test_vocab_sizes(V):
    N = 4 if ON_GPU else 2
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    x = randn((N, V), dtype, DEVICE, seed=12, scale=2.0)
    y = _labels((N,), V, seed=13, ignore_frac=0.0)
    _check(x, y, reduction="sum")


@pytest.mark.parametrize("dtype", DTYPES)
def test_softcap_large_logits(dtype):
    x = uniform((8, 700), -1000.0, 1000.0, dtype, DEVICE, seed=14)
    y = _labels((8,), 700, seed=15)
    _check(x, y, softcap=30.0, reduction="mean")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_zloss_smoothing_weights(dtype, reduction):
    x = randn((24, 500), dtype, DEVICE, seed=16, scale=3.0)
    y = _labels((24,), 500, seed=17)
    w = uniform((24,), 0.0, 2.0, torch.float32, DEVICE, seed=18)
    w[::3] = 0.0
    _check(x, y, w, reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-4)
    _check(x, y, w.half(), reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-4, softcap=5.0)


def test_out_of_range_labels_are_nan_rows():
    V = 40
    x = randn((6, V), torch.float32, DEVICE, seed=19)
    y = torch.tensor([3, V, 7, -1, IGNORE, 0], device=DEVICE)
    loss, dx = _check(x, y, reduction="none", nan_mask=True)
    bad = torch.tensor([False, True, False, True, False, False], device=DEVICE)
    assert torch.equal(torch.isnan(loss), bad)
    assert torch.isnan(dx[bad]).all() and torch.isfinite(dx[~bad]).all()
    assert torch.isnan(fused_cross_entropy_loss(x, y))


def test_non_contiguous_logits_labels_and_grads():
    B, T, V = (2, 512, 32000) if ON_GPU else (2, 33, 700)
    full = randn((B, T + 1, V), torch.float32, DEVICE, seed=20, scale=2.0)
    lab_full = _labels((B, T + 1), V, seed=21)
    x, y = full[:, :-1, :], lab_full[:, 1:]  # the shifted LM views
    assert not x.is_contiguous() and not y.is_contiguous()
    _check(x, y, reduction="mean", label_smoothing=0.1)
    g_t = randn((T, B), torch.float32, DEVICE, seed=22).t()  # transposed upstream gradient
    _check(x, y, g=g_t, reduction="none")
    xl = x.detach().requires_grad_(True)  # stride-0 upstream gradient from .sum()
    fused_cross_entropy_loss(xl, y, reduction="none").sum().backward()
    xr = x.detach().double().requires_grad_(True)
    ref.fused_cross_entropy_loss(xr, y, reduction="sum").backward()
    assert_close("dlogits from .sum()", xr.grad, xl.grad, "E-fwd")


def test_inplace_backward():
    base = randn((2, 17, 300), torch.float32, DEVICE, seed=23, scale=2.0)
    y = _labels((2, 16), 300, seed=24)
    x0 = base[:, :-1, :].clone().requires_grad_(True)
    fused_cross_entropy_loss(x0, y).backward()
    want = x0.grad

    # inplace_backward=False: logits bitwise unchanged after forward and backward
    leaf = base.clone().requires_grad_(True)
    view = leaf * 1.0
    before = snapshot(view)
    loss = fused_cross_entropy_loss(view[:, :-1, :], y)
    assert_unchanged(before, view)
    loss.backward()
    assert_unchanged(before, view)

    # inplace_backward=True: intact after forward; after backward the storage holds the gradient
    leaf = base.clone().requires_grad_(True)
    full = leaf * 1.0
    view = full[:, :-1, :]  # a non-contiguous view of a non-leaf tensor
    src = view.detach().clone()
    loss = fused_cross_entropy_loss(view, y, inplace_backward=True)
    assert torch.equal(view.detach(), src)
    v0 = full._version
    loss.backward()
    assert full._version > v0
    assert torch.equal(view.detach(), want)
    assert torch.equal(leaf.grad[:, :-1, :], want) and not leaf.grad[:, -1, :].any()

    x = base[:, :-1, :].clone().requires_grad_(True)  # a contiguous leaf
    src = x.detach().clone()
    loss = fused_cross_entropy_loss(x, y, inplace_backward=True)
    assert torch.equal(x.detach(), src)
    loss.backward()
    assert torch.equal(x.detach(), want) and torch.equal(x.grad, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inplace_backward_copy_path(dtype):
    # a view whose rows need three stride levels is copied for the kernel and the gradient copied back
    base = randn((2, 3, 5, 64), dtype, DEVICE, seed=53, scale=2.0)
    y = _labels((2, 2, 4), 64, seed=54)
    x0 = base[:, :-1, :-1, :].clone().requires_grad_(True)
    fused_cross_entropy_loss(x0, y, label_smoothing=0.1).backward()
    full = base.clone().requires_grad_(True) * 1.0
    view = full[:, :-1, :-1, :]
    fused_cross_entropy_loss(view, y, label_smoothing=0.1, inplace_backward=True).backward()
    assert torch.equal(view.detach(), x0.grad)


def test_inplace_backward_detects_stale_use():
    a = randn((4, 50), torch.float32, DEVICE, seed=25).requires_grad_(True)
    logits = torch.exp(a)  # exp saves its output for backward
    y = _labels((4,), 50, seed=26, ignore_frac=0.0)
    loss = fused_cross_entropy_loss(logits, y, inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_no_grad_returns_loss_and_saves_nothing():
    x = randn((16, 400), torch.float32, DEVICE, seed=27).requires_grad_(True)
    y = _labels((16,), 400, seed=28)
    with torch.no_grad():
        loss = fused_cross_entropy_loss(x, y)
    assert loss.grad_fn is None and not loss.requires_grad
    assert_close("no_grad loss", ref.fused_cross_entropy_loss(x.detach().double(), y), loss, "STAT")


@pytest.mark.gpu
def test_no_grad_allocates_no_gradient_buffer():
    x = randn((4096, 32000), torch.bfloat16, DEVICE, seed=29).requires_grad_(True)
    y = _labels((4096,), 32000, seed=30)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        fused_cross_entropy_loss(x, y)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base < 4 * 1024 * 1024


def test_compatibility_function():
    N, V = (1024, 16384) if ON_GPU else (48, 2048)
    x = randn((N, V), torch.float16, DEVICE, seed=31, scale=2.0).requires_grad_(True)
    y = _labels((N,), V, seed=32).to(torch.int32)
    w = uniform((N,), 0.0, 2.0, torch.float32, DEVICE, seed=33)
    loss = FusedCrossEntropyLossFunction.apply(x, w, y)
    loss.backward()
    xr = x.detach().double().requires_grad_(True)
    lr = (F.cross_entropy(xr, y.long(), reduction="none") * w.double()).sum()
    lr.backward()
    assert loss.dim() == 0 and loss.dtype == torch.float32
    assert_close("loss", lr, loss, "STAT")
    assert_close("dlogits", xr.grad, x.grad, "E-fwd")
    x3 = x.detach().view(2, N // 2, V).requires_grad_(True)  # [B, T, V] with [B, T] labels, no weights
    unweighted = FusedCrossEntropyLossFunction.apply(x3, None, y.view(2, N // 2))
    unweighted.backward()
    xr.grad = None
    F.cross_entropy(xr, y.long(), reduction="sum").backward()
    assert_close("w=None", F.cross_entropy(xr.detach(), y.long(), reduction="sum"), unweighted, "STAT")
    assert_close("w=None dlogits", xr.grad.view(2, N // 2, V), x3.grad, "E-fwd")


def test_module_and_return_lse():
    x = randn((2, 7, 90), torch.float16, DEVICE, seed=34, scale=3.0)
    y = _labels((2, 7), 90, seed=35)
    mod = FusedCrossEntropyLoss(reduction="sum", label_smoothing=0.1, softcap=20.0, return_lse=True)
    loss, lse = mod(x, y)
    assert torch.equal(loss, fused_cross_entropy_loss(x, y, reduction="sum", label_smoothing=0.1, softcap=20.0))
    assert lse.shape == (2, 7) and lse.dtype == torch.float32 and not lse.requires_grad
    z = 20.0 * torch.tanh(x.double() / 20.0)
    assert_close("lse", torch.logsumexp(z, -1), lse, "STAT")  # ignored rows included
    assert "reduction='sum'" in repr(mod)


def test_custom_ignore_index():
    x = randn((12, 64), torch.float32, DEVICE, seed=36)
    y = _labels((12,), 64, seed=37, ignore_frac=0.0)
    y[::2] = 5
    oracle = lambda xr: F.cross_entropy(xr, y, ignore_index=5)  # noqa: E731
    _check(x, y, oracle=oracle, ignore_index=5)


def test_empty():
    x = torch.empty(0, 10, device=DEVICE, requires_grad=True)
    y = torch.empty(0, dtype=torch.long, device=DEVICE)
    assert fused_cross_entropy_loss(x, y, reduction="none").shape == (0,)
    loss = fused_cross_entropy_loss(x, y)
    assert loss.item() == 0.0
    loss.backward()
    assert x.grad.shape == (0, 10)


def test_bad_input():
    x = torch.randn(4, 10, device=DEVICE)
    y = torch.zeros(4, dtype=torch.long, device=DEVICE)
    op = fused_cross_entropy_loss
    with pytest.raises(TypeError, match="float64"):
        op(x.double(), y)
    with pytest.raises(TypeError, match="labels must have dtype int32/int64, got float32"):
        op(x, y.float())
    with pytest.raises(ValueError, match=r"labels must have shape logits.shape\[:-1\] = \[4\], got \[5\]"):
        op(x, torch.zeros(5, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match=r"loss_weight must have shape .* = \[4\], got \[4, 1\]"):
        op(x, y, torch.ones(4, 1, device=DEVICE))
    with pytest.raises(TypeError, match="loss_weight must have dtype"):
        op(x, y, torch.ones(4, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="reduction must be one of"):
        op(x, y, reduction="avg")
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\], got 1.5"):
        op(x, y, label_smoothing=1.5)
    with pytest.raises(ValueError, match="lse_square_scale must be a finite number >= 0"):
        op(x, y, lse_square_scale=-1.0)
    with pytest.raises(ValueError, match="softcap must be None or a number > 0, got 0.0"):
        op(x, y, softcap=0.0)
    with pytest.raises(ValueError, match="softcap must be None or a number > 0, got nan"):
        op(x, y, softcap=float("nan"))
    assert torch.equal(op(x, y, softcap=float("inf")), op(x, y))
    with pytest.raises(ValueError, match="vocabulary V"):
        op(torch.empty(4, 0, device=DEVICE), y)
    with pytest.raises(ValueError, match="logits must have at least 1 dims"):
        op(torch.tensor(1.0, device=DEVICE), y)
    with pytest.raises(ValueError, match="softcap must be"):
        FusedCrossEntropyLoss(softcap=-1.0)


def test_deterministic_and_batch_invariant():
    x = randn((40, 900), torch.float16, DEVICE, seed=38, scale=3.0).requires_grad_(True)
    y = _labels((40,), 900, seed=39)
    outs = []
    for _ in range(2):
        x.grad = None
        loss = fused_cross_entropy_loss(x, y, reduction="none", label_smoothing=0.1, lse_square_scale=1e-4)
        loss.backward(torch.ones_like(loss))
        outs.append((loss, x.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    part = fused_cross_entropy_loss(x[5:9].detach(), y[5:9], reduction="none", label_smoothing=0.1,
                                    lse_square_scale=1e-4)
    assert torch.equal(part, outs[0][0][5:9])


def test_reference_backend_matches():
    x = randn((6, 80), torch.float32, DEVICE, seed=40, scale=2.0).requires_grad_(True)
    y = _labels((6,), 80, seed=41)
    w = uniform((6,), 0.0, 2.0, torch.float32, DEVICE, seed=51)
    kw = dict(label_smoothing=0.1, softcap=10.0, lse_square_scale=1e-3, reduction="none")
    g = randn((6,), torch.float32, DEVICE, seed=52)
    loss = fused_cross_entropy_loss(x, y, w, **kw)
    loss.backward(g)
    with mindspeed_ops.use_backend("reference"):
        x2 = x.detach().clone().requires_grad_(True)
        l2 = fused_cross_entropy_loss(x2, y, w, **kw)
        l2.backward(g)
        x3 = x.detach().clone().requires_grad_(True)
        fused_cross_entropy_loss(x3 * 1.0, y, w, inplace_backward=True, **kw).backward(g)
    assert_close("loss", l2, loss, "STAT")
    assert_close("grad", x2.grad, x.grad, "E-fwd")
    assert_close("inplace grad", x2.grad, x3.grad, "E-fwd")
    # the reference backend's written-out gradient equals autograd through the reference (float64)
    y[1], y[2] = 80, IGNORE
    xr = x.detach().double().requires_grad_(True)
    rows, _ = ref.cross_entropy_rows(xr, y, w.double(), IGNORE, 0.1, 1e-3, 10.0)
    rows.backward(g.double())
    written = ref.cross_entropy_grad(g.double(), xr.detach(), y, w.double(), IGNORE, 0.1, 1e-3, 10.0)
    assert_close("written-out grad", xr.grad, written, 1e-12, nan_mask=True)


def test_registration_and_compile():
    x = randn((6, 50), torch.float32, DEVICE, seed=42).requires_grad_(True)
    y = _labels((6,), 50, seed=43)
    w = uniform((6,), 0.0, 1.0, torch.float32, DEVICE, seed=44)
    torch.library.opcheck(torch.ops.mindspeed_ops.fused_cross_entropy_loss, (x, y, w, IGNORE, 0.1, 1e-4, 30.0, False))
    torch.library.opcheck(torch.ops.mindspeed_ops.fused_cross_entropy_loss, (x, y, None, IGNORE, 0.0, 0.0, None, False))
    lse = torch.logsumexp(x.detach(), -1)
    for op in (torch.ops.mindspeed_ops.fused_cross_entropy_loss_bwd,
               torch.ops.mindspeed_ops.fused_cross_entropy_loss_bwd_inplace):
        torch.library.opcheck(op, (torch.rand(6, device=x.device), x.detach().clone(), lse, y, w, IGNORE, 0.1, 1e-4, 30.0))
    f = torch.compile(lambda a, b, c: fused_cross_entropy_loss(a, b, c, label_smoothing=0.1), fullgraph=True)
    loss = f(x, y, w)
    loss.backward()
    xr = x.detach().double().requires_grad_(True)
    lr = ref.fused_cross_entropy_loss(xr, y, w.double(), label_smoothing=0.1)
    lr.backward()
    assert_close("compiled loss", lr, loss, "STAT")
    assert_close("compiled grad", xr.grad, x.grad, "E-fwd")


@pytest.mark.bigmem
@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bf16_options_real_size(reduction):
    x = randn((8192, 151936), torch.bfloat16, DEVICE, seed=45, scale=2.0)
    y = _labels((8192,), 151936, seed=46)
    w = uniform((8192,), 0.0, 1.0, torch.float32, DEVICE, seed=47)
    _check(x, y, w, reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-4, softcap=30.0)


@pytest.mark.large
def test_large_int64_offsets():
    N, V = 65_600, 32_768
    x = torch.empty(N, V, dtype=torch.bfloat16, device=DEVICE)
    x.normal_(generator=torch.Generator(DEVICE).manual_seed(48))
    x.requires_grad_(True)
    y = _labels((N,), V, seed=49)
    loss = fused_cross_entropy_loss(x, y, reduction="none")
    g = randn((N,), torch.float32, DEVICE, seed=50)
    loss.backward(g)
    tail = slice(N - 4, N)
    xr = x.detach()[tail].double().requires_grad_(True)
    lr = ref.fused_cross_entropy_loss(xr, y[tail], reduction="none")
    lr.backward(g[tail].double())
    assert_close("last rows loss", lr, loss[tail], "STAT")
    assert_close("last rows grad", xr.grad, x.grad[tail], "E-fwd")
