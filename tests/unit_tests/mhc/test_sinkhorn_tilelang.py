"""sinkhorn on the TileLang kernels (SPEC 1.12.1, optional ``tilelang`` backend).

Skipped when TileLang is not installed (or does not import). Without a GPU the same traced kernels run
through TileLang's CPU (C) build, checked against autograd of the float64 reference with the SINK
thresholds of ``test_sinkhorn.py``; the CUDA kernels are compiled for sm_90 (needs ``nvcc``, not a GPU).
On a GPU the CUDA kernels run: through ``api.tilelang.sinkhorn`` and through the dispatcher."""
import os
import shutil
import warnings

import pytest
import torch

from mindspeed_ops import backends
from mindspeed_ops.ops.mhc import reference as ref
from mindspeed_ops.ops.mhc import tilelang_sinkhorn as tk
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, randn, snapshot, to_ref, uniform
from tests.conftest import DEVICE, DTYPES, ON_GPU

_OK, _WHY = tk.available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"TileLang unavailable: {_WHY}")

T = 4096 if ON_GPU else 37  # CPU build: 37 tokens = 2 full programs of 16 and a partial one


def _params(n, dtype=torch.float32, seed=0):
    W = (2 + n) * n
    s = uniform((3,), 0.5, 1.5, dtype, DEVICE, seed=seed + 100)
    b = randn((W,), dtype, DEVICE, seed=seed + 101, scale=0.5)
    return s, b


def _run_launchers(m, s, b, n, iters, grads, eps):
    outs = tk.forward(m, s, b, n, iters, eps)
    return outs, tk.backward(*grads, m, s, b, n, iters, eps)


def _run_api(m, s, b, n, iters, grads, eps):
    from mindspeed_ops.api.tilelang.sinkhorn import sinkhorn

    m, s, b = (t.detach().requires_grad_(True) for t in (m, s, b))
    outs = sinkhorn(m, s, b, n, iters, eps)
    torch.autograd.backward(outs, grads)
    return outs, (m.grad, s.grad, b.grad)


def _check(m, s, b, n, iters, grads=None, eps=1e-6, run=_run_launchers):
    """Run the TileLang kernels (``run``), compare with autograd through the fp64 reference."""
    if grads is None:
        lead = m.shape[:-1]
        grads = [randn((*lead, *tail), m.dtype, DEVICE, seed=7 + i) for i, tail in enumerate(((n,), (n,), (n, n)))]
    before = snapshot(m, s, b, *grads)
    outs, (dm, ds, db) = run(m, s, b, n, iters, grads, eps)
    assert_unchanged(before, m, s, b, *grads)
    mr, sr, br = to_ref(m, s, b, requires_grad=True)
    outs_r = ref.sinkhorn(mr, sr, br, n, iters, eps)
    torch.autograd.backward(outs_r, [g.double() for g in grads])
    for name, r, o in zip(("pre", "post", "comb"), outs_r, outs):
        assert o.dtype == m.dtype and o.shape == r.shape
        assert_close(name, r, o, "SINK-fwd")
    for name, r, o, like in zip(("d mixes", "d hc_scale", "d hc_base"), (mr, sr, br), (dm, ds, db), (m, s, b)):
        assert o.dtype == like.dtype and o.shape == like.shape
        assert_close(name, r.grad, o, "SINK-bwd")
    return outs, (dm, ds, db)


# ------------------------------------------------------------------ kernels (CPU build here, CUDA on a GPU)
# (n, iters): every n of SPEC 1.12.1; iters 1 / few / 20 (each backward iters is its own compiled kernel)
CASES = [(1, 2), (2, 3), (4, 1), (4, 20), (8, 3)] if not ON_GPU else \
    [(n, it) for n in (1, 2, 4, 8) for it in (1, 2, 20)]


@pytest.mark.parametrize("n,iters", CASES)
def test_matches_reference(n, iters, poisoned):  # outputs and partials start NaN: every element is written
    W = (2 + n) * n
    s, b = _params(n, seed=n)
    _check(randn((2, T, W), torch.float32, DEVICE, seed=1), s, b, n, iters)
    _check(randn((1, W), torch.float32, DEVICE, seed=2), s, b, n, iters)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    if dtype == torch.bfloat16 and not ON_GPU:
        pytest.skip("TileLang's C build has no bfloat16")
    s, b = _params(4, dtype, seed=3)
    _check(randn((3, 20, 24), dtype, DEVICE, seed=3), s, b, 4, 20)


def test_strides_and_unused_outputs():
    n = 4
    s, b = _params(n, seed=8)
    proj = randn((2, 30, 40), torch.float32, DEVICE, seed=8)
    _check(proj[..., 5:29], s, b, n, 20)  # a slice of a wider projection output: row stride 40, no copy
    _check(non_contiguous(randn((30, 24), torch.float32, DEVICE, seed=9)), s, b, n, 20)
    gt = [randn((n, 30), torch.float32, DEVICE, seed=11).t(), randn((n, 30), torch.float32, DEVICE, seed=12).t(),
          randn((30, n, n), torch.float32, DEVICE, seed=13).transpose(-1, -2)]
    _check(randn((30, 24), torch.float32, DEVICE, seed=14), s, b, n, 20, grads=gt)
    # stride-0 gradients (from .sum()) and unused outputs (None: the launcher passes a stride-0 zero)
    m = randn((30, 24), torch.float32, DEVICE, seed=10)
    ones = [torch.ones((), device=DEVICE).expand(30, n), None, torch.ones((), device=DEVICE).expand(30, n, n)]
    dm, ds, db = tk.backward(*ones, m, s, b, n, 20, 1e-6)
    mr, sr, br = to_ref(m, s, b, requires_grad=True)
    pr, _, cr = ref.sinkhorn(mr, sr, br, n, 20)
    (cr.sum() + pr.sum()).backward()
    for name, r, o in (("dm", mr, dm), ("ds", sr, ds), ("db", br, db)):
        assert_close(name, r.grad, o, "SINK-bwd")


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_saturation_and_column_sums():
    n = 4
    s = torch.ones(3, device=DEVICE)
    b = randn((24,), torch.float32, DEVICE, seed=4)
    m = randn((64, 24), torch.float32, DEVICE, seed=5, scale=50.0)
    outs = tk.forward(m, s, b, n, 20)
    grads = tk.backward(*[torch.ones_like(o) for o in outs], m, s, b, n, 20)
    assert all(torch.isfinite(t).all() for t in (*outs, *grads))
    comb = tk.forward(randn((64, 24), torch.float32, DEVICE, seed=6, scale=3.0), *_params(4, seed=6), 4, 20)[2]
    assert (comb.sum(-2) - 1).abs().max() < 1e-5


def test_deterministic_and_empty():
    s, b = _params(4, seed=15)
    m = randn((2, 200, 24), torch.float32, DEVICE, seed=15)
    grads = [randn(sh, torch.float32, DEVICE, seed=16 + i) for i, sh in enumerate(((2, 200, 4), (2, 200, 4),
                                                                                    (2, 200, 4, 4)))]
    r1 = [*tk.forward(m, s, b, 4, 20), *tk.backward(*grads, m, s, b, 4, 20)]
    r2 = [*tk.forward(m, s, b, 4, 20), *tk.backward(*grads, m, s, b, 4, 20)]
    assert all(torch.equal(x, y) for x, y in zip(r1, r2))
    e = torch.empty(0, 24, device=DEVICE)
    pre, post, comb = tk.forward(e, s, b, 4, 20)
    assert comb.shape == (0, 4, 4)
    dm, ds, db = tk.backward(None, None, torch.empty(0, 4, 4, device=DEVICE), e, s, b, 4, 20)
    assert dm.shape == (0, 24) and torch.equal(ds, torch.zeros_like(s)) and torch.equal(db, torch.zeros_like(b))


def test_bad_input():
    s, b = _params(4)
    with pytest.raises(ValueError, match="hc_mult must be an int in"):
        tk.forward(torch.randn(3, 90, device=DEVICE), s, torch.randn(90, device=DEVICE), 9)
    with pytest.raises(ValueError, match="sinkhorn_iters must be an int >= 1"):
        tk.forward(torch.randn(3, 24, device=DEVICE), s, b, 4, 0)
    with pytest.raises(TypeError, match="float64"):
        tk.forward(torch.randn(3, 24, device=DEVICE, dtype=torch.float64), s, b, 4)


# ------------------------------------------------------------------ CUDA code generation without a GPU
def _nvcc() -> bool:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    return shutil.which("nvcc") is not None or os.path.exists(os.path.join(home, "bin", "nvcc"))


@pytest.mark.skipif(not _nvcc(), reason="nvcc not found (TileLang compiles CUDA kernels with it)")
def test_cuda_kernels_compile_for_sm90():
    fwd = tk.kernel_source("fwd", 4, iters=20, target="cuda:sm_90")
    bwd = tk.kernel_source("bwd", 4, iters=20, target="cuda:sm_90")
    assert "__global__" in fwd and "sinkhorn_fwd" in fwd
    assert "__global__" in bwd and "sinkhorn_bwd" in bwd
    # one barrier, after the per-token code (never inside the divergent `row < M` branch)
    assert bwd.count("__syncthreads()") == 1
    assert "__syncthreads" not in fwd and "atomic" not in bwd


# ------------------------------------------------------------------ registration and the API path
@pytest.fixture
def restore_registration():
    """Put the ``sinkhorn`` registry entry of ``tilelang`` back as it was (the family may register it)."""
    before = backends._REGISTRY.get("sinkhorn", {}).get("tilelang")
    yield
    backends.unregister("sinkhorn", "tilelang")
    if before is not None:
        backends._REGISTRY["sinkhorn"]["tilelang"] = before
    backends.clear_cache()


def test_registration(restore_registration, monkeypatch):
    monkeypatch.delenv(backends.ENV_BACKEND, raising=False)
    backends.unregister("sinkhorn", "tilelang")
    registered = tk.register()
    assert registered == torch.cuda.is_available()
    if registered:
        assert backends.select("sinkhorn", "cuda") == "triton"  # below triton until timed faster
        with backends.use_backend("tilelang", ops=["sinkhorn"]):
            assert backends.select("sinkhorn", "cuda") == "tilelang"
    else:
        assert "tilelang" not in backends.registered_backends("sinkhorn")
    with pytest.raises(backends.BackendUnavailableError, match="tilelang needs CUDA"):
        with backends.use_backend("tilelang", ops=["sinkhorn"]):
            backends.select("sinkhorn", "cpu")


@pytest.mark.skipif(ON_GPU, reason="the fallback is taken for non-CUDA tensors")
def test_api_falls_back_on_cpu_with_warning():
    from mindspeed_ops.api.tilelang.sinkhorn import hc_split_sinkhorn, sinkhorn
    from mindspeed_ops.api.triton.sinkhorn import sinkhorn as generic

    assert hc_split_sinkhorn is sinkhorn
    s, b = _params(4, seed=21)
    m = randn((10, 24), torch.float32, DEVICE, seed=21)
    with pytest.warns(UserWarning, match="running the default sinkhorn backend instead of TileLang: .*need CUDA"):
        outs = sinkhorn(m, s, b, 4, 20)
    for o, g in zip(outs, generic(m, s, b, 4, 20)):
        assert torch.equal(o, g)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_api_and_dispatch_on_gpu(n, restore_registration, monkeypatch):
    W = (2 + n) * n
    s, b = _params(n, seed=30 + n)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="api.tilelang.sinkhorn")  # no fallback on a GPU with TileLang
        _check(randn((2, T, W), torch.float32, DEVICE, seed=31), s, b, n, 20, run=_run_api)

    # through the dispatcher: MINDSPEED_OPS_BACKEND (seen by the autograd engine's device threads too)
    calls = []

    def counted(name, fn):
        def wrapper(*args):
            calls.append(name)
            return fn(*args)
        return wrapper

    backends.register("sinkhorn", "tilelang", forward=counted("fwd", tk.forward),
                      backward=counted("bwd", tk.backward), priority=tk.DEFAULT_PRIORITY)
    monkeypatch.setenv(backends.ENV_BACKEND, "tilelang")
    from mindspeed_ops.api.triton.sinkhorn import sinkhorn

    def run_dispatch(m, s, b, n, iters, grads, eps):
        m, s, b = (t.detach().requires_grad_(True) for t in (m, s, b))
        outs = sinkhorn(m, s, b, n, iters, eps)
        torch.autograd.backward(outs, grads)
        return outs, (m.grad, s.grad, b.grad)

    _check(randn((2, T, W), torch.float32, DEVICE, seed=32), s, b, n, 20, run=run_dispatch)
    assert calls == ["fwd", "bwd"]
