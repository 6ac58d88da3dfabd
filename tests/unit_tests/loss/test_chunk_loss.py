"""chunk_loss (SPEC 1.8): fused LM head + cross-entropy vs the float64 reference, options, gradient needs,
autocast, memory plan, errors, registration."""
import importlib
import itertools

import pytest
import torch

import mindspeed_ops
from mindspeed_ops.api.triton.chunk_loss import chunk_loss
from mindspeed_ops.ops.loss import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, randn, snapshot, uniform
from tests.conftest import DEVICE, DTYPES, ON_GPU

IGNORE = -100
# the launcher module (the package's attribute ``chunk_loss`` is the function)
launch = importlib.import_module("mindspeed_ops.ops.loss.chunk_loss")


def _labels(shape, V, seed, ignore_frac=0.2):
    g = torch.Generator(device="cpu").manual_seed(seed)
    y = torch.randint(0, V, tuple(shape), generator=g)
    y[torch.rand(tuple(shape), generator=g) < ignore_frac] = IGNORE
    return y.to(DEVICE)


def _inputs(lead, Hd, V, dtype, seed, bias=False, weights=False, wdtype=None):
    h = randn((*lead, Hd), dtype, DEVICE, seed=seed)
    W = randn((V, Hd), wdtype or dtype, DEVICE, seed=seed + 1, scale=Hd ** -0.5 * 2)
    b = randn((V,), wdtype or dtype, DEVICE, seed=seed + 2) if bias else None
    y = _labels(lead, V, seed + 3)
    w = uniform(lead, 0.0, 2.0, torch.float32, DEVICE, seed=seed + 4) if weights else None
    if w is not None:
        w.view(-1)[::5] = 0.0
    return h, W, b, y, w


def _check(h, W, b, y, w=None, g=None, grad_tol="E-bwd", loss_tol="STAT", **kw):
    """Loss and every gradient against autograd of the float64 reference; inputs untouched."""
    h, W = h.detach().requires_grad_(True), W.detach().requires_grad_(True)
    b = None if b is None else b.detach().requires_grad_(True)
    before = snapshot(h, W, b, y, w)
    loss = chunk_loss(h, W, y, b, w, **kw)
    assert loss.dtype == torch.float32
    if g is None:
        g = randn(loss.shape, torch.float32, DEVICE, seed=99) if loss.dim() else torch.tensor(0.8, device=DEVICE)
    loss.backward(g)
    assert_unchanged(before, h, W, b, y, w, names=["hidden", "weight", "bias", "labels", "loss_weight"])
    hr, Wr = h.detach().double().requires_grad_(True), W.detach().double().requires_grad_(True)
    br = None if b is None else b.detach().double().requires_grad_(True)
    lr = ref.chunk_loss(hr, Wr, y, br, None if w is None else w.double(), **kw)
    lr.backward(g.double())
    assert_close("loss", lr, loss, loss_tol)
    assert h.grad.dtype == h.dtype and W.grad.dtype == W.dtype
    assert_close("dhidden", hr.grad, h.grad, grad_tol)
    assert_close("dweight", Wr.grad, W.grad, grad_tol)
    if b is not None:
        assert b.grad.dtype == b.dtype
        assert_close("dbias", br.grad, b.grad, grad_tol)
    return loss, (h.grad, W.grad, None if b is None else b.grad)


# (lead, Hd, V, chunk_size): the SPEC shape on GPU, a ragged reduced one on CPU
PARITY = ((2, 512), 1024, 32000, None) if ON_GPU else ((2, 5), 16, 97, 4)
OPTIONS = list(itertools.product([False, True], [False, True], [0.0, 0.1], [0.0, 1e-4], [None, 30.0]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias,weights,eps,lam,softcap", OPTIONS)
def test_parity_every_option(bias, weights, eps, lam, softcap, reduction):
    lead, Hd, V, cs = PARITY
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    h, W, b, y, w = _inputs(lead, Hd, V, dtype, seed=1, bias=bias, weights=weights)
    _check(h, W, b, y, w, reduction=reduction, label_smoothing=eps, lse_square_scale=lam, softcap=softcap,
           chunk_size=cs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_dtypes_all_options(dtype, reduction):
    h, W, b, y, w = _inputs((3, 7), 24, 130, dtype, seed=2, bias=True, weights=True)
    _check(h, W, b, y, w, reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-4, softcap=30.0,
           chunk_size=8)


def test_none_masked_sum_gradients_exact():
    B, T, Hd, V = 2, 4, 10, 15
    h, W, b, y, _ = _inputs((B, T), Hd, V, torch.float32, seed=3, bias=True)
    y[0, 1] = y[1, 3] = IGNORE
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]], device=DEVICE)
    hh, WW, bb = (t.detach().requires_grad_(True) for t in (h, W, b))
    (chunk_loss(hh, WW, y, bb, reduction="none", chunk_size=3) * mask).sum().backward()
    hr, Wr, br = (t.detach().double().requires_grad_(True) for t in (h, W, b))
    (ref.chunk_loss(hr, Wr, y, br, reduction="none") * mask.double()).sum().backward()
    assert_close("dhidden", hr.grad, hh.grad, "E-bwd")
    assert_close("dweight", Wr.grad, WW.grad, "E-bwd")
    assert_close("dbias", br.grad, bb.grad, "E-bwd")
    live = (mask > 0) & (y != IGNORE)
    assert (hh.grad[live].abs().sum(-1) > 0).all() and not hh.grad[~live].any()


@pytest.mark.parametrize("wdtype", [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16])
def test_many_chunks_fp32_accumulation(wdtype):
    N, Hd, V = (8192, 256, 2048) if ON_GPU else (256, 16, 40)
    h, W, b, y, _ = _inputs((N,), Hd, V, wdtype, seed=4, bias=True)
    _check(h, W, b, y, chunk_size=8, reduction="sum")  # 1024 (GPU) / 32 (CPU) chunks
    hh, WW = h.detach().requires_grad_(True), W.detach().requires_grad_(True)
    loss = chunk_loss(hh, WW, y, chunk_size=8, accum_dtype=None)
    loss.backward()
    assert torch.isfinite(loss) and WW.grad.dtype == wdtype and torch.isfinite(WW.grad).all()


def test_group_plan_does_not_change_results(monkeypatch):
    h, W, b, y, w = _inputs((40,), 40, 70, torch.float32, seed=5, bias=True, weights=True)
    _, single = _check(h, W, b, y, w, chunk_size=6, reduction="mean", label_smoothing=0.1)
    assert launch.group_rows(40, 70, 40, 6, 4, 0) == 40
    monkeypatch.setattr(launch, "group_rows", lambda N, V, Hd, r, g, a: 2 * r)  # groups of 12 rows, fp32 acc
    _, multi = _check(h, W, b, y, w, chunk_size=6, reduction="mean", label_smoothing=0.1)
    _check(h, W, b, y, w, chunk_size=6, reduction="none", label_smoothing=0.1)
    for a, c in zip(single, multi):
        assert_close("single vs grouped", a.double(), c, 1e-5)


def test_group_plan_respects_memory_bound():
    for N, Hd, V, r, gsz, asz in [(8192, 4096, 151936, 256, 2, 4), (16384, 4096, 128256, 512, 2, 4),
                                  (1000, 2880, 201088, 256, 2, 4), (4096, 1024, 32000, 128, 4, 0)]:
        kg = launch.group_rows(N, Hd=Hd, V=V, r=r, g_size=gsz, acc_size=asz)
        acc = 0 if kg >= N else V * Hd * asz
        extra = kg * V * gsz + r * V * 4 + acc
        assert extra <= 2 * r * V * 4 + V * Hd * 4 + (64 << 20), (N, Hd, V, kg)
        assert kg >= min(N, r) and (kg >= N or kg % r == 0)
    assert launch.group_rows(8192, 151936, 4096, 256, 2, 4) == 8192  # the H200 target shape: one group


def test_default_chunk_size():
    rc = launch.resolve_chunk_size
    assert rc(8192, 151936, 4096, None) == 256   # r·V <= N·Hd gives 128, clamped up to 256
    assert rc(16384, 128256, 4096, None) == 512
    assert rc(100, 1000, 64, None) == 100        # clamped to N
    assert rc(4096, 1000, 1024, None) == 4096    # largest power of two with r·V <= N·Hd, <= N
    assert rc(4096, 3000, 1024, None) == 1024
    assert rc(10, 50, 8, 3) == 3


def test_no_grad_loss_only():
    h, W, _, y, _ = _inputs((256,), 512 if ON_GPU else 64, 1000, torch.float32, seed=6)
    h.requires_grad_(True)
    W.requires_grad_(True)
    with torch.no_grad():
        loss, lse = chunk_loss(h, W, y, return_lse=True)
    assert loss.grad_fn is None and not loss.requires_grad and lse.shape == (256,)
    lr, lser = ref.chunk_loss(h.detach().double(), W.detach().double(), y, return_lse=True)
    assert_close("loss", lr, loss, "STAT")
    assert_close("lse", lser, lse, "STAT")


def test_only_needed_gradients(monkeypatch):
    h, W, b, y, _ = _inputs((3, 5), 12, 50, torch.float32, seed=7, bias=True)
    calls = []
    real = launch._sweep
    monkeypatch.setattr(launch, "_sweep", lambda *a, **k: calls.append(a[12:15]) or real(*a, **k))
    for red in ("mean", "none"):
        # bias given while hidden does not require grad
        WW, bb = W.detach().requires_grad_(True), b.detach().requires_grad_(True)
        chunk_loss(h, WW, y, bb, reduction=red).sum().backward()
        Wr, br = W.detach().double().requires_grad_(True), b.detach().double().requires_grad_(True)
        ref.chunk_loss(h.double(), Wr, y, br, reduction=red).sum().backward()
        assert_close("dweight", Wr.grad, WW.grad, "E-bwd")
        assert_close("dbias", br.grad, bb.grad, "E-bwd")
        # weight frozen while hidden requires grad
        hh = h.detach().requires_grad_(True)
        chunk_loss(hh, W, y, b, reduction=red).sum().backward()
        hr = h.detach().double().requires_grad_(True)
        ref.chunk_loss(hr, W.double(), y, b.double(), reduction=red).sum().backward()
        assert_close("dhidden", hr.grad, hh.grad, "E-bwd")
        assert W.grad is None and b.grad is None
    assert (False, True, True) in calls and (True, False, False) in calls
    assert all(c != (True, True, True) for c in calls)


def test_autocast_bf16_fp32_inputs():
    h, W, _, y, _ = _inputs((2, 6), 32, 90, torch.float32, seed=8)
    hh, WW = h.detach().requires_grad_(True), W.detach().requires_grad_(True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        loss = chunk_loss(hh, WW, y, chunk_size=5)
    loss.backward()
    assert hh.grad.dtype == torch.float32 and WW.grad.dtype == torch.float32
    # oracle: the bf16-rounded operands, in float64
    hr = h.to(torch.bfloat16).double().requires_grad_(True)
    Wr = W.to(torch.bfloat16).double().requires_grad_(True)
    lr = ref.chunk_loss(hr, Wr, y)
    lr.backward()
    assert_close("loss", lr, loss, "STAT")
    bf16_bwd = 8e-3  # E-bwd keyed by the compute dtype
    assert_close("dhidden", hr.grad, hh.grad, bf16_bwd)
    assert_close("dweight", Wr.grad, WW.grad, bf16_bwd)


def test_large_bias_added_once():
    h, W, _, y, _ = _inputs((24,), 16, 120, torch.float32, seed=9)
    b = 500.0 + randn((120,), torch.float32, DEVICE, seed=10, scale=3.0)
    loss, _ = _check(h, W, b, y, reduction="sum", chunk_size=7)
    assert_close("loss", ref.chunk_loss(h.double(), W.double(), y, b.double(), reduction="sum"), loss, "STAT")


@pytest.mark.bigmem
def test_gpt_oss_head_ragged_last_chunk():
    N, Hd, V, cs = (1000, 2880, 201088, 256) if ON_GPU else (40, 48, 3001, 16)
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    h, W, _, y, _ = _inputs((N,), Hd, V, dtype, seed=11)
    _check(h, W, None, y, chunk_size=cs)


def test_all_labels_ignored():
    h, W, b, _, _ = _inputs((6,), 8, 20, torch.float32, seed=12, bias=True)
    y = torch.full((6,), IGNORE, device=DEVICE)
    hh, WW, bb = (t.detach().requires_grad_(True) for t in (h, W, b))
    loss = chunk_loss(hh, WW, y, bb)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert not hh.grad.any() and not WW.grad.any() and not bb.grad.any()


def test_out_of_range_labels_nan_rows():
    h, W, _, y, _ = _inputs((6,), 8, 20, torch.float32, seed=13)
    y = torch.tensor([1, 20, 3, -1, IGNORE, 5], device=DEVICE)
    hh = h.detach().requires_grad_(True)
    loss = chunk_loss(hh, W, y, reduction="none")
    loss.backward(torch.ones_like(loss))
    bad = torch.tensor([False, True, False, True, False, False], device=DEVICE)
    assert torch.equal(torch.isnan(loss), bad) and torch.isnan(hh.grad[bad]).all()
    assert torch.isfinite(hh.grad[~bad]).all()


def test_non_contiguous_inputs_and_grads():
    h, W, b, y, w = _inputs((3, 9), 20, 64, torch.float32, seed=14, bias=True, weights=True)
    _check(non_contiguous(h), non_contiguous(W, "transpose"), b, y.t().contiguous().t(), w, reduction="mean",
           chunk_size=5)
    g = randn((9, 3), torch.float32, DEVICE, seed=15).t()  # transposed upstream gradient
    _check(h, W, b, y, w, g=g, reduction="none", chunk_size=5)
    hh = h.detach().requires_grad_(True)
    chunk_loss(hh, W, y, reduction="none").sum().backward()  # stride-0 upstream gradient
    hr = h.detach().double().requires_grad_(True)
    ref.chunk_loss(hr, W.double(), y, reduction="sum").backward()
    assert_close("dhidden from .sum()", hr.grad, hh.grad, "E-bwd")


def test_return_lse_and_empty():
    h, W, b, y, _ = _inputs((2, 3), 8, 30, torch.float16, seed=16, bias=True)
    loss, lse = chunk_loss(h, W, y, b, return_lse=True, softcap=10.0)
    assert lse.shape == (2, 3) and lse.dtype == torch.float32 and not lse.requires_grad
    _, lser = ref.chunk_loss(h.double(), W.double(), y, b.double(), return_lse=True, softcap=10.0)
    assert_close("lse", lser, lse, "STAT")
    he = torch.empty(0, 8, device=DEVICE, requires_grad=True)
    Wg = W.float().requires_grad_(True)
    loss = chunk_loss(he, Wg, torch.empty(0, dtype=torch.long, device=DEVICE))
    assert loss.item() == 0.0
    loss.backward()
    assert he.grad.shape == (0, 8) and not Wg.grad.any()
    assert chunk_loss(he.detach(), Wg, torch.empty(0, dtype=torch.long, device=DEVICE),
                      reduction="none").shape == (0,)


def test_bad_input():
    h = torch.randn(4, 8, device=DEVICE)
    W = torch.randn(10, 8, device=DEVICE)
    y = torch.zeros(4, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight must have shape \[V, Hd\] = \[8, 8\] .*got \[8, 10\]"):
        chunk_loss(h, W.t(), y)  # [Hd, V] order
    with pytest.raises(ValueError, match=r"weight must have shape \[V, Hd\] = \[10, 8\].*got \[10, 9\]"):
        chunk_loss(h, torch.randn(10, 9, device=DEVICE), y)
    with pytest.raises(ValueError, match="weight must be 2-D"):
        chunk_loss(h, W[None], y)
    with pytest.raises(TypeError, match="hidden must have dtype float32/float16/bfloat16, got float64"):
        chunk_loss(h.double(), W, y)
    with pytest.raises(TypeError, match="labels must have dtype int32/int64"):
        chunk_loss(h, W, y.float())
    with pytest.raises(ValueError, match=r"labels must have shape hidden.shape\[:-1\] = \[4\], got \[3\]"):
        chunk_loss(h, W, y[:3])
    with pytest.raises(ValueError, match=r"bias must have shape \[V\] = \[10\], got \[9\]"):
        chunk_loss(h, W, y, torch.zeros(9, device=DEVICE))
    with pytest.raises(ValueError, match="chunk_size must be None or a positive int, got 0"):
        chunk_loss(h, W, y, chunk_size=0)
    with pytest.raises(TypeError, match="accum_dtype must be None or one of"):
        chunk_loss(h, W, y, accum_dtype=torch.int32)
    with pytest.raises(ValueError, match="reduction must be one of"):
        chunk_loss(h, W, y, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        chunk_loss(h, W, y, label_smoothing=-0.1)
    with pytest.raises(ValueError, match="softcap must be None or a number > 0"):
        chunk_loss(h, W, y, softcap=-2.0)


def test_deterministic():
    h, W, b, y, w = _inputs((48,), 16, 200, torch.float16, seed=17, bias=True, weights=True)
    outs = []
    for _ in range(2):
        hh, WW, bb = (t.detach().requires_grad_(True) for t in (h, W, b))
        loss = chunk_loss(hh, WW, y, bb, w, chunk_size=16, label_smoothing=0.1)
        loss.backward()
        outs.append((loss, hh.grad, WW.grad, bb.grad))
    assert all(torch.equal(a, c) for a, c in zip(*outs))


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_upstream_gradient_scaling_in_place(reduction, dtype, backend, monkeypatch):
    """mean/sum scale the forward's gradients by g in backward, in place when the graph is freed (a factor of
    exactly 1 reads and writes nothing on the device), out of place under retain_graph, which may run again."""
    h, W, b, y, w = _inputs((37,), 24, 130, dtype, seed=21, bias=True, weights=True)
    calls = []
    real = launch.scale_
    monkeypatch.setattr(launch, "scale_", lambda x, s: calls.append(x.shape) or real(x, s))
    with mindspeed_ops.use_backend(backend):
        for g in (1.0, 0.37):  # freed graph: in place (the Triton launcher) for every needed gradient
            calls.clear()
            _check(h, W, b, y, w, g=torch.tensor(g, device=DEVICE), reduction=reduction, chunk_size=8)
            assert len(calls) == (3 if backend == "triton" else 0)
        calls.clear()
        hh, WW, bb = (t.detach().requires_grad_(True) for t in (h, W, b))
        loss = chunk_loss(hh, WW, y, bb, w, reduction=reduction, chunk_size=8)
        grads = []
        for g in (1.0, 2.5, 1.0):  # retained graph: the saved gradients stay as the forward made them
            grads.append(torch.autograd.grad(loss, (hh, WW, bb), torch.tensor(g, device=DEVICE), retain_graph=True))
        assert not calls
        for a, c in zip(grads[0], grads[2]):
            assert torch.equal(a, c)
        for a, c in zip(grads[0], grads[1]):
            assert_close("2.5 x gradient", a.double() * 2.5, c, "E-bwd")


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_in_place_scaling_edge_cases(backend):
    """The in-place path of mean/sum's backward: a retried backward (its first try failed after this node,
    before autograd freed it) raises PyTorch's in-place error instead of scaling twice; a saved-tensor hook
    that unpacks non-contiguous tensors still gets exact gradients; a vmapped upstream gradient
    (is_grads_batched) is scaled out of place."""
    h, W, b, y, w = _inputs((13,), 16, 60, torch.float32, seed=23, bias=True, weights=True)
    hr, Wr = h.detach().double().requires_grad_(True), W.detach().double().requires_grad_(True)
    ref.chunk_loss(hr, Wr, y, None, w.double()).backward()
    with mindspeed_ops.use_backend(backend):
        hh, WW = h.detach().requires_grad_(True), W.detach().requires_grad_(True)
        loss = chunk_loss(hh, WW, y, None, w, chunk_size=4)
        tries = []

        def fail_once(grad_inputs, grad_outputs):
            tries.append(1)
            if len(tries) == 1:
                raise RuntimeError("a hook that fails once")
        loss.grad_fn.register_hook(fail_once)
        with pytest.raises(RuntimeError, match="fails once"):
            loss.backward()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()

        hh, WW = h.detach().requires_grad_(True), W.detach().requires_grad_(True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t.t().contiguous().t() if t.dim() == 2
                                                      else t):
            loss = chunk_loss(hh, WW, y, None, w, chunk_size=4)
        loss.backward()
        assert_close("dhidden", hr.grad, hh.grad, "E-bwd")
        assert_close("dweight", Wr.grad, WW.grad, "E-bwd")

        if backend == "reference":  # the Triton launchers do not run under vmap
            hh = h.detach().requires_grad_(True)
            loss = chunk_loss(hh, W, y, None, w, chunk_size=4)
            gs = torch.tensor([1.0, 0.5, -2.0], device=DEVICE)
            (dh,) = torch.autograd.grad(loss, hh, gs, is_grads_batched=True)
            for i, g in enumerate(gs.tolist()):
                assert_close(f"batched dhidden {i}", hr.grad * g, dh[i], "E-bwd")


def test_backward_runs_with_the_forwards_backend(monkeypatch):
    """use_backend around the forward holds for its backward too, wherever that runs (on CUDA autograd runs
    backward on a thread of its own, which does not see the caller's context; here: a backward called
    after the ``with`` block, and one called from another thread)."""
    import threading

    h, W, b, y, w = _inputs((9,), 12, 40, torch.float32, seed=22, bias=True)
    calls = []
    monkeypatch.setattr(launch, "scale_", lambda x, s: calls.append(1) or x)
    monkeypatch.setattr(launch, "scale", lambda x, s: calls.append(1) or x)
    for how in ("after", "thread"):
        hh, WW = h.detach().requires_grad_(True), W.detach().requires_grad_(True)
        with mindspeed_ops.use_backend("reference"):
            loss = chunk_loss(hh, WW, y, chunk_size=4)
        if how == "after":
            loss.backward()
        else:
            t = threading.Thread(target=loss.backward)
            t.start()
            t.join()
        assert not calls and hh.grad is not None
        hr, Wr = h.detach().double().requires_grad_(True), W.detach().double().requires_grad_(True)
        ref.chunk_loss(hr, Wr, y).backward()
        assert_close("dhidden", hr.grad, hh.grad, "E-bwd")


def test_reference_backend_matches():
    h, W, b, y, w = _inputs((10,), 12, 40, torch.float32, seed=18, bias=True, weights=True)
    for red in ("mean", "none"):
        with mindspeed_ops.use_backend("reference"):
            _check(h, W, b, y, w, reduction=red, chunk_size=4, softcap=20.0, lse_square_scale=1e-3)


def test_registration_and_compile():
    h, W, b, y, w = _inputs((6,), 8, 30, torch.float32, seed=19, bias=True, weights=True)
    h.requires_grad_(True)
    W.requires_grad_(True)
    b.requires_grad_(True)
    for red, need in (("mean", (True, True, True)), ("none", (True, True, True)), ("sum", (False, True, False))):
        torch.library.opcheck(torch.ops.mindspeed_ops.chunk_loss,
                              (h, W, y, b, w, IGNORE, red, 0.1, 1e-4, 30.0, 4, torch.float32, torch.float32, *need))
    lse = torch.rand(6, device=h.device)
    torch.library.opcheck(torch.ops.mindspeed_ops.chunk_loss_bwd,
                          (torch.rand(6, device=h.device), h.detach(), W.detach(), y, b.detach(), w, lse, IGNORE, 0.1, 1e-4, 30.0, 4,
                           torch.float32, torch.float32, True, True, True))
    torch.library.opcheck(torch.ops.mindspeed_ops.chunk_loss_scale, (W.detach().half(), torch.tensor(0.3, device=W.device)))
    for red, tail in (("none", lambda t: t.sum()), ("mean", lambda t: t * 3.0)):
        f = torch.compile(lambda a, c, d, e: tail(chunk_loss(a, c, e, d, reduction=red, chunk_size=4)),
                          fullgraph=True)
        h.grad = W.grad = b.grad = None
        loss = f(h, W, b, y)
        loss.backward()
        hr, Wr, br = (t.detach().double().requires_grad_(True) for t in (h, W, b))
        lr = tail(ref.chunk_loss(hr, Wr, y, br, reduction=red))
        lr.backward()
        assert_close("compiled loss", lr, loss, "STAT")
        assert_close("compiled dhidden", hr.grad, h.grad, "E-bwd")
        assert_close("compiled dweight", Wr.grad, W.grad, "E-bwd")
        assert_close("compiled dbias", br.grad, b.grad, "E-bwd")
    g = torch.compile(lambda a, c, e: chunk_loss(a, c, e), fullgraph=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        assert torch.isfinite(g(h, W, y))


@pytest.mark.bigmem
@pytest.mark.gpu
def test_memory_bound():
    N, Hd, V = 16384, 4096, 128256
    h = randn((N, Hd), torch.bfloat16, DEVICE, seed=20).requires_grad_(True)
    W = randn((V, Hd), torch.bfloat16, DEVICE, seed=21, scale=Hd ** -0.5).requires_grad_(True)
    y = _labels((N,), V, seed=22)
    r = launch.resolve_chunk_size(N, V, Hd, None)
    bound = 2 * r * V * 4 + V * Hd * 4 + (64 << 20)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = chunk_loss(h, W, y)
    loss.backward()
    torch.cuda.synchronize()
    returned = h.grad.numel() * 2 + W.grad.numel() * 2 + 2 * N * 4 + 64  # grads, loss, lse
    extra = torch.cuda.max_memory_allocated() - base - returned
    assert extra <= bound, f"extra {extra / 2**30:.2f} GiB > bound {bound / 2**30:.2f} GiB"


@pytest.mark.large
def test_large_logical_logits():
    N, Hd, V = 16896, 256, 128256  # N·V > 2^31
    h, W, _, y, _ = _inputs((N,), Hd, V, torch.bfloat16, seed=23)
    hh = h.detach().requires_grad_(True)
    loss = chunk_loss(hh, W, y, reduction="none")
    g = randn((N,), torch.float32, DEVICE, seed=24)
    loss.backward(g)
    tail = slice(N - 8, N)
    hr = h[tail].double().requires_grad_(True)
    lr = ref.chunk_loss(hr, W.double(), y[tail], reduction="none")
    lr.backward(g[tail].double())
    assert_close("last rows loss", lr, loss[tail], "STAT")
    assert_close("last rows dhidden", hr.grad, hh.grad[tail], "E-bwd")


def test_meta_device_shapes():
    """Regression: chunk_loss on 'meta' tensors failed in the autocast lookup."""
    loss = chunk_loss(torch.empty(3, 8, device="meta"), torch.empty(5, 8, device="meta"),
                      torch.zeros(3, dtype=torch.long, device="meta"))
    assert loss.device.type == "meta" and loss.shape == () and loss.dtype == torch.float32
