"""causal_conv1d / causal_conv1d_fn (SPEC 1.9): kernels vs the float64 reference (forward and every
gradient), states, varlen, tail tokens, layouts, errors, determinism, registration."""
import importlib

import pytest
import torch

import mindspeed_ops
from mindspeed_ops.api.triton.convolution import CausalConv1dFunction, causal_conv1d, causal_conv1d_fn
from mindspeed_ops.ops.conv import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, randn, snapshot
from tests.conftest import DEVICE, DTYPES, ON_GPU

LOW = [d for d in DTYPES if d != torch.float32]


def _make(B, T, D, W, dtype=torch.float32, bias=True, residual=False, state=False, N=None, seed=0):
    x = randn((B, T, D), dtype, DEVICE, seed=seed)
    w = randn((W, D), dtype, DEVICE, seed=seed + 1, scale=0.5)
    b = randn((D,), dtype, DEVICE, seed=seed + 2) if bias else None
    r = randn((B, T, D), dtype, DEVICE, seed=seed + 3) if residual else None
    s = randn((B if N is None else N, D, W), dtype, DEVICE, seed=seed + 4) if state else None
    return x, w, b, r, s


def _leaf(t):
    return None if t is None else t.detach().requires_grad_(True)


def _check(x, w, b=None, r=None, s=None, activation=None, cu=None, final=False, dy=None, dfs=None, fs_class="EXACT"):
    """Forward and every gradient against autograd of the float64 reference; inputs untouched."""
    x, w, b, r, s = (_leaf(t) for t in (x, w, b, r, s))
    before = snapshot(x, w, b, r, s, cu)
    y, fs = causal_conv1d(x, w, b, r, s, activation, cu, final)
    assert y.dtype == x.dtype and y.shape == x.shape and (fs is None) == (not final)
    dy = randn(y.shape, y.dtype, DEVICE, seed=77) if dy is None else dy
    outs, grads = [y], [dy]
    if final:
        dfs = randn(fs.shape, fs.dtype, DEVICE, seed=78) if dfs is None else dfs
        outs.append(fs)
        grads.append(dfs)
    g_before = snapshot(*grads)
    torch.autograd.backward(outs, grads)
    assert_unchanged(before + g_before, x, w, b, r, s, cu, *grads,
                     names=["x", "weight", "bias", "residual", "initial_state", "cu_seqlens", "dy", "dfinal"])
    xr, wr, br, rr, sr = (None if t is None else t.detach().double().requires_grad_(True) for t in (x, w, b, r, s))
    yr, fr = ref.causal_conv1d(xr, wr, br, rr, sr, activation, cu, final)
    torch.autograd.backward([yr] + ([fr] if final else []), [g.double() for g in grads])
    assert_close("y", yr, y, "E-fwd")
    if final:
        assert fs.dtype == (s.dtype if s is not None else x.dtype)
        assert_close("final_state", fr, fs, fs_class)
    for name, t, tr in (("dx", x, xr), ("dweight", w, wr), ("dbias", b, br), ("dresidual", r, rr),
                        ("dinitial_state", s, sr)):
        if t is not None:
            assert t.grad.dtype == t.dtype, name
            assert_close(name, tr.grad, t.grad, "E-bwd")
    return y, fs, tuple(None if t is None else t.grad for t in (x, w, b, r, s))


# ---------------------------------------------------------------------------------------------
# SPEC must-test shapes (reduced on CPU), widths, lengths, dtypes, activations, bias/residual


SHAPES = [(1, 64, 256, 4), (2, 128, 256, 4), (4, 256, 512, 4), (1, 32, 256, 2)] if ON_GPU else \
    [(1, 64, 64, 4), (2, 40, 48, 4), (1, 32, 64, 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "silu", "swish"])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_reference(shape, activation, dtype, poisoned):
    B, T, D, W = shape
    i = SHAPES.index(shape)
    # bias/residual/state combinations rotate over the shapes
    _check(*_make(B, T, D, W, dtype, bias=i % 2 == 0, residual=i != 1, state=i >= 1, seed=i), activation=activation,
           final=True)


@pytest.mark.parametrize("T", [1, 3, 7, 15, 31])
@pytest.mark.parametrize("W", [1, 2, 3, 4, 8])
def test_lengths_and_widths(T, W):
    _check(*_make(2, T, 24, W, torch.float32, residual=True, state=True, seed=T * 10 + W), activation="silu",
           final=True)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("W", [1, 3, 8])
def test_widths_low_precision(W, dtype):
    _check(*_make(1, 31, 40, W, dtype, residual=True, state=True, seed=W), activation="silu", final=True)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_bias_residual_options(bias, residual):
    _check(*_make(2, 19, 33, 4, torch.float32, bias=bias, residual=residual, seed=5), activation="silu")


@pytest.mark.parametrize("D", [10, 100])
def test_d_not_multiple_of_8(D):
    _check(*_make(2, 21, D, 4, torch.float16, bias=False, state=True, seed=D), activation="silu", final=True)


def test_mixed_dtypes():
    """Weight/bias/residual/state may be any float dtype; final state keeps initial_state's dtype."""
    x, _, _, _, _ = _make(1, 17, 24, 4, torch.float16)
    w = randn((4, 24), torch.float32, DEVICE, seed=1)
    b = randn((24,), torch.float32, DEVICE, seed=2)
    r = randn((1, 17, 24), torch.float32, DEVICE, seed=3)
    s = randn((1, 24, 4), torch.float32, DEVICE, seed=4)
    _check(x, w, b, r, s, "silu", final=True)


def test_conv1d_weight_layout():
    """An nn.Conv1d weight [D, 1, W] becomes [W, D] by squeezing and transposing."""
    conv = torch.nn.Conv1d(16, 16, 4, groups=16, padding=3, bias=True).to(DEVICE)
    x = randn((2, 20, 16), torch.float32, DEVICE, seed=6)
    want = conv(x.transpose(1, 2))[..., :20].transpose(1, 2)
    y, _ = causal_conv1d(x, conv.weight.detach().squeeze(1).t(), conv.bias.detach())
    assert_close("vs nn.Conv1d", want.double(), y, "E-fwd")


@pytest.mark.bigmem
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_real_size_bf16(dtype):
    _check(*_make(1, 65536, 8192, 4, dtype, bias=False, residual=True, state=True), activation="silu", final=True)


# ---------------------------------------------------------------------------------------------
# states


def _split_vs_whole(T, split, D, W, dtype, activation="silu", seed=0):
    """Two calls chained through final_state equal one call over all tokens, forward and backward
    (the gradient of the first call's final state flows into the second call's initial_state)."""
    x, w, b, _, s = _make(1, T, D, W, dtype, state=True, seed=seed)
    dy = randn((1, T, D), dtype, DEVICE, seed=seed + 10)
    dfs = randn((1, D, W), dtype, DEVICE, seed=seed + 11)
    x1, w1, b1, s1 = (_leaf(t) for t in (x, w, b, s))
    y1, f1 = causal_conv1d(x1, w1, b1, None, s1, activation, None, True)
    torch.autograd.backward([y1, f1], [dy, dfs])
    x2, w2, b2, s2 = (_leaf(t) for t in (x, w, b, s))
    ya, fa = causal_conv1d(x2[:, :split], w2, b2, None, s2, activation, None, True)
    yb, fb = causal_conv1d(x2[:, split:], w2, b2, None, fa, activation, None, True)
    torch.autograd.backward([ya, yb, fb], [dy[:, :split], dy[:, split:], dfs])
    assert torch.equal(fb, f1), "final state of the chained calls"
    assert_close("y", y1.double(), torch.cat([ya, yb], 1), "E-fwd")
    for name, p, q in (("dx", x1, x2), ("dweight", w1, w2), ("dbias", b1, b2), ("dinitial_state", s1, s2)):
        assert_close(name, p.grad.double(), q.grad, "E-bwd")


@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_short_chunk_with_state(T, dtype):
    """W = 4, a chunk of T < W-1 tokens continuing from a state."""
    _split_vs_whole(4 + T, 4, 32, 4, dtype, seed=T)
    _check(*_make(1, T, 32, 4, dtype, state=True, seed=T), activation="silu", final=True)


@pytest.mark.parametrize("split", [1, 37])
def test_state_continuity(split):
    if ON_GPU:
        _split_vs_whole(1024, 300, 256, 4, torch.float32)
    _split_vs_whole(96, split, 32, 4, torch.float32)


def test_final_state_is_copy():
    """Slots are bitwise copies of the inputs (from the state when L < W), -0.0 included."""
    x, w, _, _, s = _make(2, 2, 16, 4, torch.float16, state=True)
    x[0, 1, 3] = -0.0
    _, fs = causal_conv1d(x, w, initial_state=s, output_final_state=True)
    want = torch.cat([s[:, :, 2:], x.transpose(1, 2)], -1)
    assert torch.equal(fs.view(torch.int16), want.view(torch.int16))
    _, fs = causal_conv1d(x, w, output_final_state=True)  # no state: zeros in front
    assert torch.equal(fs[:, :, :2], torch.zeros_like(fs[:, :, :2])) and torch.equal(fs[:, :, 2:], x.transpose(1, 2))


# ---------------------------------------------------------------------------------------------
# varlen


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)


VARLEN = [[32, 64, 48], [128, 128], [1, 1, 1, 5, 1], [3, 0, 7, 0, 1, 2]]


@pytest.mark.parametrize("lens", VARLEN)
@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen(lens, dtype, poisoned):
    cu = _cu(lens)
    T = sum(lens)
    _check(*_make(1, T, 32, 4, dtype, residual=True, state=True, N=len(lens), seed=len(lens)), activation="silu",
           cu=cu, final=True)


@pytest.mark.gpu
def test_varlen_long():
    lens = [4096, 2048, 5111]
    _check(*_make(1, sum(lens), 2048, 4, torch.bfloat16, state=True, N=3), activation="silu", cu=_cu(lens),
           final=True)


def test_varlen_int64_cu_seqlens_without_state():
    cu = _cu([5, 9, 2]).long()
    _check(*_make(1, 16, 24, 3, torch.float32, bias=False), activation=None, cu=cu, final=True)


def test_packed_equals_batched():
    T, D = 45, 40
    x, w, b, _, s = _make(2, T, D, 4, torch.float32, state=True)
    y2, f2 = causal_conv1d(x, w, b, initial_state=s, activation="silu", output_final_state=True)
    y1, f1 = causal_conv1d(x.reshape(1, 2 * T, D), w, b, initial_state=s, activation="silu",
                           cu_seqlens=torch.tensor([0, T, 2 * T], device=DEVICE), output_final_state=True)
    assert torch.equal(y1.reshape(2, T, D), y2) and torch.equal(f1, f2)


def test_many_short_sequences():
    """2100 sequences of length 1-3 (D = 2048 on GPU; on CPU without states: the per-sequence state
    kernels would run 2100 interpreted programs, states in varlen are covered by test_varlen)."""
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 4, (2100,), generator=g).tolist()
    D = 2048 if ON_GPU else 16
    _check(*_make(1, sum(lens), D, 4, torch.float32 if not ON_GPU else torch.bfloat16, residual=True, state=ON_GPU,
                  N=2100), activation="silu", cu=_cu(lens), final=ON_GPU)


def test_tail_tokens(poisoned):
    """T = 1000, cu_seqlens = [0, 211, 985], tail filled with huge values and NaN."""
    D = 64 if ON_GPU else 16
    x, w, b, r, s = _make(1, 1000, D, 4, torch.float32, residual=True, state=True, N=2)
    x[:, 985:] = 1e30
    x[:, 990, :3] = float("nan")
    r[:, 985:] = float("nan")
    cu = torch.tensor([0, 211, 985], device=DEVICE)
    y, fs, (dx, dw, db, dr, ds) = _check(x, w, b, r, s, "silu", cu=cu, final=True)
    assert (y[:, 985:] == 0).all() and torch.isfinite(y).all() and torch.isfinite(fs).all()
    assert (dx[:, 985:] == 0).all() and (dr[:, 985:] == 0).all()
    assert all(torch.isfinite(t).all() for t in (dx, dw, db, dr, ds))


# ---------------------------------------------------------------------------------------------
# streaming tiling: many short streams and several chunks per sequence, so that fast and generic
# blocks, stream halos, window rebuilds at sequence edges, streams past T and partial blocks all
# occur at CPU sizes (the GPU tiles are long)

SMALL_TILES = {
    "fwd": {"vec": 8, "warps": 1, "r": 2, "maxnreg": None, "maxnreg_edges": None, "programs_per_sm": 1, "cs_max": 4},
    "bwd": {"vec": 8, "warps": 1, "r": 2, "maxnreg": None, "maxnreg_edges": None, "programs_per_sm": 1, "cs_max": 6},
}


@pytest.fixture
def small_tiles(monkeypatch):
    launch = importlib.import_module("mindspeed_ops.ops.conv.causal_conv1d")  # the module, not the function
    monkeypatch.setattr(launch, "TUNE", SMALL_TILES)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("state", [False, True])
def test_small_tiles_fixed(state, dtype, small_tiles, poisoned):
    # T = 52: a stream's rows past T are a whole block above a fast block ending at T-1
    _check(*_make(2, 53 if state else 52, 24, 4, dtype, residual=True, state=state, seed=31), activation="silu",
           final=state)


@pytest.mark.parametrize("T,state", [(13, True), (37, False), (50, True)])
def test_fixed_length_blocks_equal_one_sequence_varlen(T, state, small_tiles):
    """A fixed-length forward takes the fast block everywhere, partial last blocks included; the same rows as one
    varlen sequence go through the per-block check (generic blocks at the start and the end): bitwise the same y
    and final state. D = 40: several streams per program, some starting past T."""
    x, w, b, r, s = _make(1, T, 40, 4, torch.float32, residual=True, state=state, seed=90 + T)
    fixed = causal_conv1d(x, w, b, r, s, "silu", output_final_state=True)
    cu = torch.tensor([0, T], dtype=torch.int32, device=DEVICE)
    packed = causal_conv1d(x, w, b, r, s, "silu", cu_seqlens=cu, output_final_state=True)
    assert torch.equal(fixed[0], packed[0]) and torch.equal(fixed[1], packed[1])


@pytest.mark.parametrize("W", [1, 2, 3, 8])
def test_small_tiles_widths(W, small_tiles):
    _check(*_make(1, 45, 24, W, torch.float32, residual=True, state=True, seed=40 + W), activation="silu",
           final=True)
    _check(*_make(2, 29, 24, W, torch.float32, bias=False, seed=50 + W), activation=None)


@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("W", [2, 4])
def test_small_tiles_varlen(W, final, small_tiles, poisoned):
    """Sequences shorter and longer than a stream, empty ones, and tail tokens past cu_seqlens[-1]."""
    lens = [13, 1, 40, 0, 3, 29]
    T = sum(lens) + 7
    cu = _cu(lens + [0])[:-1]
    x, w, b, r, s = _make(1, T, 24, W, torch.float32, residual=True, state=final, N=len(lens), seed=60 + W)
    y, fs, (dx, *_) = _check(x, w, b, r, s, "silu", cu=cu, final=final)
    assert (y[:, sum(lens):] == 0).all() and (dx[:, sum(lens):] == 0).all()


@pytest.mark.parametrize("final", [False, True])
def test_small_tiles_varlen_one_stream(final, small_tiles):
    """D = 128 (fp32): one stream per program, so every block's path follows that stream's own
    sequence edges (a sequence ending exactly at a block edge, a block after a short sequence...)."""
    lens = [13, 1, 40, 0, 3, 29, 6, 2, 18]
    cu = _cu(lens)
    _check(*_make(1, sum(lens), 128, 4, torch.float32, state=final, N=len(lens), seed=70), activation="silu", cu=cu,
           final=final)


def test_small_tiles_strided_dy(small_tiles):
    x, w, b, r, s = (_leaf(t) for t in _make(2, 37, 24, 4, torch.float32, residual=True, state=True))
    y, _ = causal_conv1d(x, w, b, r, s, "silu")
    y.sum().backward()
    xr, wr, br, rr, sr = (t.detach().double().requires_grad_(True) for t in (x, w, b, r, s))
    ref.causal_conv1d(xr, wr, br, rr, sr, "silu")[0].sum().backward()
    for name, t, tr in (("dx", x, xr), ("dweight", w, wr), ("dbias", b, br), ("dinitial_state", s, sr)):
        assert_close(name, tr.grad, t.grad, "E-bwd")
    dy = randn((2, 24, 37), torch.float32, DEVICE, seed=3).transpose(1, 2)
    _check(*_make(2, 37, 24, 4, torch.float32, state=True, seed=7), activation="silu", final=True, dy=dy)


# ---------------------------------------------------------------------------------------------
# layouts and gradients


def test_non_contiguous_dy_from_sum():
    x, w, b, r, s = (_leaf(t) for t in _make(2, 23, 40, 4, torch.float32, residual=True, state=True))
    y, _ = causal_conv1d(x, w, b, r, s, "silu")
    y.sum().backward()
    xr, wr, br, rr, sr = (t.detach().double().requires_grad_(True) for t in (x, w, b, r, s))
    ref.causal_conv1d(xr, wr, br, rr, sr, "silu")[0].sum().backward()
    for name, t, tr in (("dx", x, xr), ("dweight", w, wr), ("dbias", b, br), ("dresidual", r, rr),
                        ("dinitial_state", s, sr)):
        assert_close(name, tr.grad, t.grad, "E-bwd")


def test_split_qkv_concat():
    """q, k, v = x.split(D, -1) (strided views), each convolved, outputs concatenated, loss on the concatenation."""
    D = 24
    x = randn((2, 30, 3 * D), torch.float32, DEVICE, seed=1).requires_grad_()
    ws = [randn((4, D), torch.float32, DEVICE, seed=2 + i).requires_grad_() for i in range(3)]
    out = torch.cat([causal_conv1d(t, w, activation="silu")[0] for t, w in zip(x.split(D, -1), ws)], -1)
    g = randn(out.shape, torch.float32, DEVICE, seed=9)
    (out * g).sum().backward()
    xr = x.detach().double().requires_grad_()
    wrs = [w.detach().double().requires_grad_() for w in ws]
    outr = torch.cat([ref.causal_conv1d(t, w, activation="silu")[0] for t, w in zip(xr.split(D, -1), wrs)], -1)
    (outr * g.double()).sum().backward()
    assert_close("out", outr, out, "E-fwd")
    assert_close("dx", xr.grad, x.grad, "E-bwd")
    for w, wr in zip(ws, wrs):
        assert_close("dweight", wr.grad, w.grad, "E-bwd")


def test_non_contiguous_inputs():
    x, w, b, r, s = _make(2, 19, 32, 4, torch.float32, residual=True, state=True)
    dy = randn((2, 32, 19), torch.float32, DEVICE, seed=3).transpose(1, 2)
    dfs = randn((2, 4, 32), torch.float32, DEVICE, seed=4).transpose(1, 2)
    _check(non_contiguous(x), non_contiguous(w, "transpose"), b, non_contiguous(r), non_contiguous(s, "transpose"),
           "silu", final=True, dy=dy, dfs=dfs)


def test_stateful_backward_wide():
    """Stateful backward with D = 3072, T = 64 (state-gradient stores stay in bounds); bf16 on GPU."""
    dtype = torch.bfloat16 if torch.bfloat16 in DTYPES else torch.float16
    _check(*_make(1, 64 if ON_GPU else 16, 3072, 4, dtype, bias=False, state=True), activation="silu", final=True)


def test_bias_none_backward():
    x, w, _, _, _ = (_leaf(t) for t in _make(1, 20, 16, 4, torch.float32))
    y, _ = causal_conv1d(x, w, None, activation="silu")
    y.backward(torch.ones_like(y))
    assert x.grad is not None and w.grad is not None


def test_deterministic():
    shape = (4, 4096, 2048, 4) if ON_GPU else (2, 96, 64, 4)
    x, w, b, _, s = (_leaf(t) for t in _make(*shape, DTYPES[-1], state=True))
    dy = randn(x.shape, x.dtype, DEVICE, seed=5)
    res = []
    for _ in range(2):
        for t in (x, w, b, s):
            t.grad = None
        y, _ = causal_conv1d(x, w, b, None, s, "silu")
        y.backward(dy)
        res.append([y] + [t.grad.clone() for t in (x, w, b, s)])
    for a, c in zip(*res):
        assert torch.equal(a, c)


def test_empty():
    x, w, b, _, s = (_leaf(t) for t in _make(2, 0, 8, 4, torch.float32, state=True))
    y, fs = causal_conv1d(x, w, b, None, s, "silu", None, True)
    assert y.shape == (2, 0, 8) and torch.equal(fs, s)
    (fs * 2).sum().backward()
    assert torch.equal(s.grad, torch.full_like(s, 2.0)) and (w.grad == 0).all() and x.grad.shape == (2, 0, 8)


def test_autograd_function_class():
    x, w, b, _, s = _make(1, 12, 16, 4, torch.float32, state=True)
    x, w, s = _leaf(x), _leaf(w), _leaf(s)
    y, fs = CausalConv1dFunction.apply(x, w, b, None, s, "silu", None, True)
    y2, fs2 = causal_conv1d(x, w, b, None, s, "silu", None, True)
    assert torch.equal(y, y2) and torch.equal(fs, fs2)
    y, none = CausalConv1dFunction.apply(x, w)
    assert none is None
    y.sum().backward()
    assert x.grad is not None


def test_reference_backend():
    x, w, b, r, s = _make(1, 14, 16, 3, torch.float32, residual=True, state=True)
    with mindspeed_ops.use_backend("reference"):
        _check(x, w, b, r, s, "silu", final=True)


def test_bad_input():
    x = torch.randn(1, 8, 16, device=DEVICE)
    w = torch.randn(4, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight must have shape \[W, D\].*transpose"):
        causal_conv1d(x, w.t().contiguous())
    with pytest.raises(ValueError, match="must be in \\[1, 8\\]"):
        causal_conv1d(x, torch.randn(9, 16, device=DEVICE))
    with pytest.raises(ValueError, match="x must be 3-D"):
        causal_conv1d(x[0], w)
    with pytest.raises(ValueError, match="activation must be one of"):
        causal_conv1d(x, w, activation="gelu")
    with pytest.raises(TypeError, match="float64"):
        causal_conv1d(x.double(), w)
    with pytest.raises(TypeError, match="x must have dtype"):
        causal_conv1d(x.int(), w)
    with pytest.raises(ValueError, match=r"bias must have shape \[D\] = \[16\]"):
        causal_conv1d(x, w, torch.randn(15, device=DEVICE))
    with pytest.raises(ValueError, match=r"residual must have shape"):
        causal_conv1d(x, w, residual=torch.randn(1, 7, 16, device=DEVICE))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[N, D, W\] = \[2, 16, 4\]"):
        causal_conv1d(x, w, initial_state=torch.randn(3, 16, 4, device=DEVICE),
                      cu_seqlens=torch.tensor([0, 3, 8], device=DEVICE))
    with pytest.raises(ValueError, match="pack the batch into one row"):
        causal_conv1d(torch.randn(2, 8, 16, device=DEVICE), w, cu_seqlens=torch.tensor([0, 3, 8], device=DEVICE))
    with pytest.raises(ValueError, match="non-decreasing"):
        causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 5, 3], device=DEVICE))
    with pytest.raises(ValueError, match="cu_seqlens\\[-1\\] must be <= T"):
        causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 9], device=DEVICE))
    with pytest.raises(TypeError, match="cu_seqlens must have dtype"):
        causal_conv1d(x, w, cu_seqlens=torch.tensor([0.0, 8.0], device=DEVICE))
    xc = torch.randn(1, 16, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"causal_conv1d_fn: weight must have shape \[D, W\]"):
        causal_conv1d_fn(xc, w)
    with pytest.raises(ValueError, match="seq_idx cannot be combined"):
        causal_conv1d_fn(xc, w.t(), seq_idx=torch.zeros(1, 8, dtype=torch.int32, device=DEVICE),
                         return_final_states=True)
    with pytest.raises(ValueError, match=r"initial_states must have shape \[B, D, W-1\]"):
        causal_conv1d_fn(xc, w.t(), initial_states=torch.randn(1, 16, 4, device=DEVICE))


def test_registration_and_compile():
    x, w, b, r, s = _make(1, 10, 16, 4, torch.float32, residual=True, state=True)
    x, w, b, r, s = (_leaf(t) for t in (x, w, b, r, s))
    op = torch.ops.mindspeed_ops.causal_conv1d
    torch.library.opcheck(op, (x, w, b, r, s, "silu", None, True))
    torch.library.opcheck(op, (x, w, None, None, None, None, None, False))
    s2 = torch.cat([s, s]).detach().requires_grad_(True)
    torch.library.opcheck(op, (x, w, b, None, s2, "silu", torch.tensor([0, 4, 10], device=DEVICE), True))
    f = torch.compile(lambda *a: causal_conv1d(*a, activation="silu", output_final_state=True), fullgraph=True)
    y, fs = f(x, w, b, r, s)
    (y.sum() + fs.sum()).backward()
    yr, fr = ref.causal_conv1d(*(t.detach().double() for t in (x, w, b, r, s)), "silu", None, True)
    assert_close("compiled y", yr, y, "E-fwd")
    assert_close("compiled fs", fr, fs, "EXACT")
    g = torch.compile(lambda a, c: causal_conv1d_fn(a, c, activation="silu"), fullgraph=True)
    xc = randn((1, 16, 9), torch.float32, DEVICE, seed=3)
    assert_close("compiled fn", ref.causal_conv1d_fn_conv(xc.double(), w.detach().t().double(), None, "silu"),
                 g(xc, w.detach().t()), "E-fwd")


@pytest.mark.large
def test_large_int64_offsets():
    T, D = 2 ** 31 // 4096 + 5, 4096
    x = torch.empty(1, T, D, dtype=torch.bfloat16, device=DEVICE)
    x.normal_(generator=torch.Generator(DEVICE).manual_seed(1))
    w = randn((4, D), torch.bfloat16, DEVICE, seed=2)
    y, fs = causal_conv1d(x, w, activation="silu", output_final_state=True)
    yr, fr = ref.causal_conv1d(x[:, -40:].double(), w.double(), activation="silu",
                               initial_state=x[0, -44:-40].t()[None].double(),  # the 4 tokens before the window
                               output_final_state=True)
    assert_close("last rows", yr, y[:, -40:], "E-fwd")
    assert_close("final state", fr, fs, "EXACT")


# ---------------------------------------------------------------------------------------------
# causal_conv1d_fn (channel-major)


def _check_fn(x, w, b=None, seq_idx=None, init=None, final=False, activation="silu", fs_out=None):
    x, w, b, init = (_leaf(t) for t in (x, w, b, init))
    before = snapshot(x, w, b, seq_idx, init)
    res = causal_conv1d_fn(x, w, b, seq_idx, init, final, fs_out, activation)
    out, fs = (res, None) if not isinstance(res, tuple) else res
    assert out.shape == x.shape and out.dtype == x.dtype
    dout = randn(out.shape, out.dtype, DEVICE, seed=21)
    outs, grads = [out], [dout]
    if fs is not None:
        outs.append(fs)
        grads.append(randn(fs.shape, fs.dtype, DEVICE, seed=22))
    torch.autograd.backward(outs, grads)
    assert_unchanged(before, x, w, b, seq_idx, init, names=["x", "weight", "bias", "seq_idx", "initial_states"])
    xr, wr, br, ir = (None if t is None else t.detach().double().requires_grad_(True) for t in (x, w, b, init))
    rres = ref.causal_conv1d_fn(xr, wr, br, seq_idx, ir, final or fs_out is not None, None, activation)
    outr, fr = (rres, None) if not isinstance(rres, tuple) else rres
    torch.autograd.backward([outr] + ([fr] if fr is not None else []), [g.double() for g in grads])
    assert_close("out", outr, out, "E-fwd")
    if fr is not None:
        assert_close("final_states", fr, fs, "EXACT")
    for name, t, tr in (("dx", x, xr), ("dweight", w, wr), ("dbias", b, br), ("dinitial_states", init, ir)):
        if t is not None:
            assert_close(name, tr.grad, t.grad, "E-bwd")
    return out, fs


@pytest.mark.parametrize("dtype", DTYPES)
def test_fn_hf_call_channel_last(dtype):
    """HF Qwen3-Next: x [2, D, T] seen through .transpose(1, 2) of a contiguous [2, T, D], bias=None, silu."""
    B, D, T = (2, 8192, 1000) if ON_GPU else (2, 64, 40)
    xt = randn((B, T, D), dtype, DEVICE, seed=1)
    x = xt.transpose(1, 2)
    w = randn((D, 4), dtype, DEVICE, seed=2, scale=0.5)
    out, _ = _check_fn(x, w)
    assert_close("vs grouped conv1d", ref.causal_conv1d_fn_conv(x.double(), w.double(), None, "silu"), out, "E-fwd")


def test_fn_channel_first_and_conv1d():
    x = randn((2, 24, 30), torch.float32, DEVICE, seed=3)
    w = randn((24, 3), torch.float32, DEVICE, seed=4)
    b = randn((24,), torch.float32, DEVICE, seed=5)
    for act in (None, "swish"):
        out, _ = _check_fn(x, w, b, activation=act)
        assert_close("vs grouped conv1d", ref.causal_conv1d_fn_conv(x.double(), w.double(), b.double(), act), out,
                     "E-fwd")


def test_fn_seq_idx():
    """Segment boundaries at 63/64/65, 127/128/129, 256/257; -1 padding outputs 0."""
    D, T = (10240, 4099) if ON_GPU else (16, 300)
    starts = [63, 64, 65, 127, 128, 129, 256, 257]
    row = torch.zeros(T, dtype=torch.int32)
    for i, s in enumerate(starts):
        row[s:] = i + 1
    row2 = row.clone()
    row2[-5:] = -1
    seq_idx = torch.stack([row, row2]).to(DEVICE)
    x = randn((2, D, T), torch.float32, DEVICE, seed=6)
    out, _ = _check_fn(x, randn((D, 4), torch.float32, DEVICE, seed=7), randn((D,), torch.float32, DEVICE, seed=8),
                       seq_idx=seq_idx)
    assert (out[1, :, -5:] == 0).all()


def test_fn_states():
    """initial_states + return_final_states with T = 2, W = 4; and final_states_out written in place."""
    x = randn((2, 16, 2), torch.float32, DEVICE, seed=9)
    w = randn((16, 4), torch.float32, DEVICE, seed=10)
    init = randn((2, 16, 3), torch.float32, DEVICE, seed=11)
    _, fs = _check_fn(x, w, None, init=init, final=True)
    assert torch.equal(fs, torch.cat([init[..., 2:], x], -1))
    x = randn((2, 16, 9), torch.float32, DEVICE, seed=12)
    buf = torch.full((2, 16, 3), float("nan"), device=DEVICE)
    _, fs = _check_fn(x, w, None, init=init, fs_out=buf)
    assert fs is buf and torch.equal(buf.detach(), x[..., -3:])


def test_fn_width_one_and_no_states():
    x = randn((1, 8, 5), torch.float16, DEVICE, seed=13)
    out, fs = _check_fn(x, randn((8, 1), torch.float16, DEVICE, seed=14), final=True)
    assert fs.shape == (1, 8, 0)
