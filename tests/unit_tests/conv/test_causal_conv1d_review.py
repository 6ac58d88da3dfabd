"""causal_conv1d / causal_conv1d_fn (SPEC 1.9): regression cases from a review of the streaming kernels.

Bugs found (fixed): a non-contiguous ``cu_seqlens`` was indexed as a flat array by the kernels (out-of-bounds
reads: a crash under the interpreter, wrong answers or faults on the GPU); ``causal_conv1d_fn`` with
``seq_idx`` and ``T = 0`` crashed (slice step 0); ``causal_conv1d_fn`` split ``seq_idx`` into runs of equal
consecutive ids, so an id that reappears within a tap's reach (``[0, 0, 1, 0]``, ``[0, -1, 0]``) did not get
the SPEC's taps (``seq_idx[b, τ] == seq_idx[b, t]``). The other cases pin down behaviour that held."""
import functools
import importlib

import pytest
import torch

from mindspeed_ops.api.triton.convolution import causal_conv1d, causal_conv1d_fn
from mindspeed_ops.ops.conv import reference as ref
from mindspeed_ops import testing
from mindspeed_ops.testing import assert_close, assert_unchanged, snapshot
from tests.conftest import DEVICE

randn = functools.partial(testing.randn, device=DEVICE)

launch = importlib.import_module("mindspeed_ops.ops.conv.causal_conv1d")  # the module, not the function

TINY = {k: {"vec": 8, "warps": 1, "r": 2, "maxnreg": None, "maxnreg_edges": None, "programs_per_sm": 1,
            "cs_max": 4} for k in ("fwd", "bwd")}


@pytest.fixture
def tiny_tiles(monkeypatch):
    monkeypatch.setattr(launch, "TUNE", TINY)


def _leaf(t):
    return None if t is None else t.detach().requires_grad_(True)


def _run(x, w, b, r, s, act, cu, final, dy, dfs):
    """Forward + backward of the op and of the float64 reference; returns (outs, grads, ref outs, ref grads)."""
    leaves = [_leaf(t) for t in (x, w, b, r, s)]
    before = snapshot(*leaves, cu, dy, dfs)
    y, fs = causal_conv1d(*leaves, act, cu, final)
    outs, grads = [y] + ([fs] if final else []), [dy] + ([dfs] if final else [])
    torch.autograd.backward(outs, grads)
    assert_unchanged(before, *leaves, cu, dy, dfs)
    refs = [None if t is None else t.detach().double().requires_grad_(True) for t in (x, w, b, r, s)]
    yr, fr = ref.causal_conv1d(*refs, act, cu, final)
    torch.autograd.backward([yr] + ([fr] if final else []), [g.double() for g in grads])
    return (y, fs), [None if t is None else t.grad for t in leaves], (yr, fr), [None if t is None else t.grad for t in refs]


def _check(*args):
    (y, fs), g, (yr, fr), gr = _run(*args)
    assert_close("y", yr, y, "E-fwd")
    if fs is not None:
        assert_close("final_state", fr, fs, "EXACT")
    for name, a, b in zip(("dx", "dweight", "dbias", "dresidual", "dinitial_state"), g, gr):
        if a is not None:
            assert_close(name, b, a, "E-bwd")
    return y, fs, g


@pytest.mark.parametrize("tiles", [False, True])
def test_non_contiguous_cu_seqlens(tiles, monkeypatch, poisoned):
    """cu_seqlens that is a strided view (bug: the kernels read it as a flat array)."""
    if tiles:
        monkeypatch.setattr(launch, "TUNE", TINY)
    cu = torch.tensor([0, 99, 5, 77, 12, 55, 12, 44, 20, 66], dtype=torch.int32, device=DEVICE)[::2]
    assert not cu.is_contiguous()
    N, T, D = 4, 23, 8
    _check(randn((1, T, D), seed=1), randn((4, D), seed=2, scale=0.5), randn((D,), seed=3), randn((1, T, D), seed=4),
           randn((N, D, 4), seed=5), "silu", cu, True, randn((1, T, D), seed=6), randn((N, D, 4), seed=7))


def test_fn_seq_idx_empty_time():
    """T = 0 with seq_idx (bug: ValueError 'slice step cannot be zero' from the segment builder)."""
    x = torch.randn(2, 8, 0, device=DEVICE, requires_grad=True)
    w = randn((8, 4), seed=1).requires_grad_(True)
    out = causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 0, dtype=torch.int32, device=DEVICE), activation="silu")
    assert out.shape == (2, 8, 0)
    out.sum().backward()
    assert x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros_like(w))


@pytest.mark.parametrize("row", [[0, 0, 1, 0, 0, 0, 2, 2, 1], [0, 0, -1, 0, 0, 1, -1, -1, 1], [3, 3, 3, 1, 3, 3, 2, 3, 3]])
def test_fn_seq_idx_reappearing_ids(row):
    """SPEC 1.9.2: a tap counts when seq_idx[b, τ] == seq_idx[b, t] (also across a different id in between);
    bug: runs of equal consecutive ids were used instead. Forward and gradients."""
    D, W = 8, 4
    seq_idx = torch.tensor([row, sorted(row)], dtype=torch.int32, device=DEVICE)
    x, w, b = (_leaf(t) for t in (randn((2, D, len(row)), seed=1), randn((D, W), seed=2), randn((D,), seed=3)))
    out = causal_conv1d_fn(x, w, b, seq_idx, activation="silu")
    xr, wr, br = (t.detach().double().requires_grad_(True) for t in (x, w, b))
    outr = ref.causal_conv1d_fn(xr, wr, br, seq_idx, activation="silu")
    assert_close("out", outr, out, "E-fwd")
    dout = randn(out.shape, seed=4)
    out.backward(dout)
    outr.backward(dout.double())
    for name, t, tr in (("dx", x, xr), ("dweight", w, wr), ("dbias", b, br)):
        assert_close(name, tr.grad, t.grad, "E-bwd")


def test_fn_seq_idx_monotone_takes_kernels(monkeypatch):
    """Ordinary (monotone, -1 padded) seq_idx never takes the reference fallback."""
    def boom(*a, **k):
        raise AssertionError("reference fallback taken")

    autograd = importlib.import_module("mindspeed_ops.ops.conv.autograd")
    monkeypatch.setattr(autograd._ref, "causal_conv1d_fn", boom)
    seq_idx = torch.tensor([[0, 0, 0, 1, 2, 2, 2, 2, -1, -1], [-1, 0, 0, 0, 0, 3, 3, 3, 3, 3]], dtype=torch.int32,
                           device=DEVICE)
    out = causal_conv1d_fn(randn((2, 8, 10), seed=1), randn((8, 4), seed=2), seq_idx=seq_idx, activation="silu")
    assert (out[0, :, -2:] == 0).all() and (out[1, :, 0] == 0).all()


def test_tiling_invariance():
    """y, final_state, dx and d initial_state do not depend on the tiling (only dweight/dbias may, by
    fp32 summation order): several TUNE settings, varlen with empty/short sequences and a tail."""
    lens = [13, 1, 0, 21, 3, 2]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEVICE)
    T, D, W, N = sum(lens) + 3, 24, 4, len(lens)
    args = (randn((1, T, D), seed=1), randn((W, D), seed=2, scale=0.5), randn((D,), seed=3), None,
            randn((N, D, W), seed=4), "silu", cu, True, randn((1, T, D), seed=5), randn((N, D, W), seed=6))
    results = []
    for cfg in (None, TINY, {k: dict(TINY[k], r=1, cs_max=3, warps=2, vec=2) for k in TINY},
                {k: dict(TINY[k], r=4, cs_max=8, programs_per_sm=64) for k in TINY}):
        old = launch.TUNE
        launch.TUNE = old if cfg is None else cfg
        try:
            (y, fs), g, _, _ = _run(*args)
        finally:
            launch.TUNE = old
        results.append((y, fs, g[0], g[4]))
    for other in results[1:]:
        for name, a, b in zip(("y", "final_state", "dx", "dinitial_state"), results[0], other):
            assert torch.equal(a, b), name


def test_strided_and_expanded_inputs(tiny_tiles):
    """x strided in time and by batch, weight transposed, a state seen through a transpose and slice,
    dy strided, stride-0 x and gradients; varlen and fixed length."""
    base = randn((3, 50, 30), seed=1)
    x = base[1:, ::2, 2:26]                                    # [2, 25, 24], unit D stride, time stride 2
    w = randn((24, 4), seed=2, scale=0.5).t()
    s = randn((2, 5, 24), seed=3).transpose(1, 2)[:, :, :4]
    dy = randn((2, 25, 48), seed=4)[:, :, ::2]
    _check(x, w, None, randn((2, 25, 24), seed=5), s, "silu", None, True, dy, randn((2, 24, 4), seed=6))
    cu = torch.tensor([0, 5, 5, 17, 18, 23], device=DEVICE)
    _check(x[:1], w, randn((24,), seed=7), None, randn((5, 4, 24), seed=8).transpose(1, 2), "silu", cu, True,
           dy[:1], randn((5, 24, 4), seed=9))
    xe = randn((1, 1, 24), seed=10).expand(2, 19, 24)
    _check(xe, w, None, None, None, "silu", None, True, torch.ones((), device=DEVICE).expand(2, 19, 24),
           torch.ones((), device=DEVICE).expand(2, 24, 4))


@pytest.mark.parametrize("lens,T", [([], 5), ([0, 0], 3), ([0, 4, 0], 4)])
def test_varlen_degenerate(lens, T, tiny_tiles, poisoned):
    """No sequences (cu_seqlens = [0]), only empty ones, empty ones around one sequence; tail tokens NaN."""
    cu = torch.tensor([0] + torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist(), device=DEVICE)
    N, D, W = len(lens), 8, 3
    x = randn((1, T, D), seed=1)
    x[:, int(cu[-1]):] = float("nan")
    s = randn((N, D, W), seed=2)
    y, fs, g = _check(x, randn((W, D), seed=3), randn((D,), seed=4), None, s, "silu", cu, True,
                      randn((1, T, D), seed=5), randn((N, D, W), seed=6))
    assert (y[:, int(cu[-1]):] == 0).all() and (g[0][:, int(cu[-1]):] == 0).all()
    empty = torch.tensor([n == 0 for n in lens], dtype=torch.bool, device=DEVICE)
    assert torch.equal(fs[empty], s[empty])  # an empty sequence's final state is its initial state


def test_final_state_only_backward(tiny_tiles):
    """Only final_state reaches the loss (dy materialised as zeros), and y only with output_final_state."""
    x, s = randn((2, 11, 8), seed=1), randn((2, 8, 4), seed=2)
    w = randn((4, 8), seed=3, scale=0.5)
    _check(x, w, None, None, s, "silu", None, True, torch.zeros(2, 11, 8, device=DEVICE), randn((2, 8, 4), seed=4))
    xl, sl = _leaf(x), _leaf(s)
    y, fs = causal_conv1d(xl, w, None, None, sl, "silu", None, True)
    fs.sum().backward()
    expect = torch.zeros_like(x)
    expect[:, -4:] = 1
    assert torch.equal(xl.grad, expect) and torch.equal(sl.grad, torch.zeros_like(s))


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("cu,match", [([0, 5, 3], "non-decreasing"), ([0, 9], r"cu_seqlens\[-1\] must be <= T"),
                                      ([1, 8], r"cu_seqlens\[0\] must be 0")])
def test_bad_cu_seqlens_values_every_backend(backend, cu, match):
    """SPEC 0.3: bad cu_seqlens values raise ValueError on every backend (bug: only the Triton launcher read
    and checked them; the reference backend, the default CPU path, returned a silently wrong y)."""
    import mindspeed_ops

    x, w = randn((1, 8, 16), seed=1), randn((4, 16), seed=2)
    with mindspeed_ops.use_backend(backend), pytest.raises(ValueError, match=match):
        causal_conv1d(x, w, cu_seqlens=torch.tensor(cu, device=DEVICE))
