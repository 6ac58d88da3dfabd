"""sort_chunks_by_idx / sort_chunks_by_idx_with_probs (SPEC 1.6): bitwise chunk permutation, identity
tail, inverse-permutation backward, host validation, memory safety, registration."""
import pytest
import torch

import mindspeed_ops
from mindspeed_ops import backends
from mindspeed_ops.api.triton import sort_chunks_by_idx as api_mod
from mindspeed_ops.ops import moe
from mindspeed_ops.ops.moe import reference as ref
from mindspeed_ops.ops.moe import sort_chunks as launch
from mindspeed_ops.ops.moe.checks import random_splits
from mindspeed_ops.testing import assert_close, assert_unchanged, randn, snapshot, to_ref
from tests.conftest import DEVICE, DTYPES, ON_GPU

EXACT = 0.0  # SPEC class EXACT (bitwise); as a number so integer outputs work too
sort_chunks = moe.sort_chunks_by_idx
sort_chunks_probs = moe.sort_chunks_by_idx_with_probs


def _check(inp, split_sizes, sorted_idxs, probs=None, dout=None, dprobs=None):
    """Forward and backward, bitwise (EXACT) against autograd of the float64 reference; no mutation."""
    floating = inp.is_floating_point()
    inp = inp.detach().requires_grad_(floating)
    if probs is not None:
        probs = probs.detach().requires_grad_(True)
    before = snapshot(inp, probs, *[t for t in (split_sizes, sorted_idxs) if isinstance(t, torch.Tensor)])
    if probs is None:
        out, pp = sort_chunks(inp, split_sizes, sorted_idxs), None
    else:
        out, pp = sort_chunks_probs(inp, probs, split_sizes, sorted_idxs)
    assert out.shape == inp.shape and out.dtype == inp.dtype and out.is_contiguous()
    xr, pr = to_ref(inp, probs, requires_grad=True)
    out_r = ref.sort_chunks_by_idx(xr, split_sizes, sorted_idxs)
    assert_close("out", out_r, out, EXACT)
    if probs is not None:
        pp_r = ref.sort_chunks_by_idx(pr, split_sizes, sorted_idxs)
        assert_close("permuted_probs", pp_r, pp, EXACT)
    if floating or probs is not None:
        outs, cots, refs = [], [], []
        if floating:
            dout = randn(out.shape, out.dtype, out.device, seed=7) if dout is None else dout
            outs, cots, refs = [out], [dout], [out_r]
        if probs is not None:
            dprobs = randn(pp.shape, pp.dtype, pp.device, seed=8) if dprobs is None else dprobs
            outs, cots, refs = outs + [pp], cots + [dprobs], refs + [pp_r]
        grad_before = snapshot(*cots)
        torch.autograd.backward(outs, cots)
        assert_unchanged(grad_before, *cots, names=["dout", "dprobs"][-len(cots):])
        torch.autograd.backward(refs, [c.double() for c in cots])
        if floating:
            assert_close("d inp", xr.grad, inp.grad, EXACT)
        if probs is not None:
            assert_close("d probs", pr.grad, probs.grad, EXACT)
    after = [inp, probs, *[t for t in (split_sizes, sorted_idxs) if isinstance(t, torch.Tensor)]]
    assert_unchanged(before, *after)
    return out, pp


@pytest.mark.parametrize("NS", [1, 64, 65, 1025])
def test_copy_tiles(NS):
    """The copy step's tile: row segments of at most 4 KiB, a power of two of at most 64 rows, at most 4 KiB with
    few chunks and 32 KiB with more (the per-program chunk lookup spread over more rows), 8 warps for a full one."""
    limit = launch._TILE_BYTES_FEW_CHUNKS if NS <= launch.FEW_CHUNKS else launch._TILE_BYTES
    for word in (1, 2, 4, 8):
        for W in (1, 3, 16, 100, 511, 512, 513, 1024, 1792, 5000):
            bm, bw, warps = launch._tiles(W, word, NS)
            tile = bm * bw * word
            assert bw * word <= 4096 and bm & (bm - 1) == 0 and bm <= 64 and tile <= limit, (W, word, bm, bw)
            assert warps == (8 if tile >= min(limit, 16384) else 4)
            if W * word >= 4096:
                assert tile == limit


def test_spec_example():
    x = torch.arange(6 * 3, dtype=torch.float32, device=DEVICE).view(6, 3)
    p = torch.arange(6, dtype=torch.float32, device=DEVICE) / 8
    for sizes, idxs in [([2, 3, 1], [2, 0, 1]), (torch.tensor([2, 3, 1]), torch.tensor([2, 0, 1], dtype=torch.int32))]:
        out, pp = _check(x, sizes, idxs, probs=p)
        assert torch.equal(out, x[[5, 0, 1, 2, 3, 4]]) and torch.equal(pp, p[[5, 0, 1, 2, 3, 4]])


SHAPES = [(16, 2048, 256), (32, 4096, 128), (257, 1000, 24)]  # (num_splits, num_tokens, hidden)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_reference(shape, dtype, poisoned):
    ns, nt, hidden = shape
    sizes, idxs = random_splits(ns, nt, seed=ns)
    assert (sizes == 0).any()
    dev = DEVICE if ns != 32 else "cpu"  # split sizes on the device and on the host
    _check(randn((nt, hidden), dtype, DEVICE, seed=1), sizes.to(dev), idxs.to(dev),
           probs=randn((nt,), torch.float32, DEVICE, seed=2) if ns == 16 else None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_real_size(dtype):
    sizes, idxs = random_splits(257, 10_000, seed=3)
    _check(randn((10_000, 7168), dtype, DEVICE, seed=4), sizes.to(DEVICE), idxs.to(DEVICE),
           probs=randn((10_000,), torch.float32, DEVICE, seed=5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_tail_rows_unchanged(dtype):
    sizes, idxs = random_splits(7, 90, seed=6, tail=13)
    x = randn((90, 33), dtype, DEVICE, seed=7)
    out, pp = _check(x, sizes, idxs, probs=randn((90,), dtype, DEVICE, seed=8))
    assert torch.equal(out[77:], x[77:])
    assert not torch.equal(out[:77], x[:77])


def test_edge_sizes():
    # num_tokens = 0
    x = torch.empty(0, 5, device=DEVICE)
    out, pp = _check(x, [0, 0], [1, 0], probs=torch.empty(0, device=DEVICE))
    assert out.shape == (0, 5) and pp.shape == (0,)
    x = randn((37, 20), torch.float32, DEVICE, seed=9)
    out, _ = _check(x, [37], [0])  # a single split
    assert torch.equal(out, x)
    out, _ = _check(x, [0, 37, 0], [2, 1, 0])  # every token in one chunk
    assert torch.equal(out, x)
    out, _ = _check(x, [], [])  # no splits: all rows are tail
    assert torch.equal(out, x)
    _check(x, [30, 7], [1, 0], probs=randn((37,), torch.float16, DEVICE, seed=10))


def test_shapes_and_dtypes():
    sizes, idxs = [3, 0, 5, 2], [3, 1, 0, 2]
    _check(randn((11, 2, 3), torch.float16, DEVICE, seed=11), sizes, idxs)  # [num_tokens, *]
    _check(randn((11,), torch.float32, DEVICE, seed=12), sizes, idxs)  # 1-D
    _check(torch.empty(11, 0, device=DEVICE), sizes, idxs, probs=randn((11,), torch.float32, DEVICE, seed=13))
    _check(randn((11, 7), torch.float64, DEVICE, seed=14), sizes, idxs, probs=randn((11,), torch.float64, DEVICE))
    # odd row sizes in bytes: 1- and 2-byte words
    _check(randn((11, 3), torch.float16, DEVICE, seed=15), sizes, idxs)
    for dt in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8, torch.bool):
        x = torch.randint(0, 100, (11, 9), device=DEVICE).to(dt)
        out, pp = _check(x, sizes, idxs, probs=randn((11,), torch.float32, DEVICE, seed=16))
        assert out.dtype == dt


def test_bitwise_nan_payloads():
    bits = torch.randint(-2**31, 2**31 - 1, (13, 8), dtype=torch.int64).to(torch.int32)
    bits[0, :] = 0x7FC00001  # NaNs with payloads are not canonicalised
    x = bits.view(torch.float32).to(DEVICE)
    out = sort_chunks(x, [4, 4, 5], [1, 2, 0])
    want = ref.sort_chunks_by_idx(x, [4, 4, 5], [1, 2, 0])
    assert torch.equal(out.view(torch.int32), want.view(torch.int32))


def test_non_contiguous_inputs_and_grads():
    sizes, idxs = random_splits(9, 60, seed=17, tail=4)
    big = randn((60, 50), torch.float32, DEVICE, seed=18)
    pbig = randn((60, 3), torch.float32, DEVICE, seed=19)
    _check(big[:, 5:37], sizes, idxs, probs=pbig[:, 1])  # column slice, strided probs
    _check(big[:, 5:37].t().contiguous().t(), sizes, idxs)  # transposed storage
    xi = torch.randint(-5, 5, (60, 40), dtype=torch.int32, device=DEVICE)[:, 3:20]  # integer, odd offset
    _check(xi, sizes, idxs)
    # stride-0 upstream gradients (from .sum()) and a transposed one
    x = randn((60, 16), torch.float32, DEVICE, seed=20).requires_grad_()
    p = randn((60,), torch.float32, DEVICE, seed=21).requires_grad_()
    out, pp = sort_chunks_probs(x, p, sizes, idxs)
    (out.sum() + 2 * pp.sum()).backward()
    assert torch.equal(x.grad, torch.ones_like(x)) and torch.equal(p.grad, torch.full_like(p, 2.0))
    _check(x, sizes, idxs, dout=randn((16, 60), torch.float32, DEVICE, seed=22).t())


def test_backward_restores_order():
    sizes, idxs = random_splits(12, 100, seed=23, tail=9)
    for dt in DTYPES:
        x = randn((100, 24), dt, DEVICE, seed=24).requires_grad_()
        p = randn((100,), dt, DEVICE, seed=25).requires_grad_()
        out, pp = sort_chunks_probs(x, p, sizes, idxs)
        dx, dp = torch.autograd.grad([out, pp], [x, p], [out.detach(), pp.detach()])
        assert torch.equal(dx, x.detach()) and torch.equal(dp, p.detach())


def test_only_one_gradient():
    sizes, idxs = [4, 6, 2], [2, 0, 1]
    xi = torch.randint(0, 9, (12, 5), device=DEVICE)  # integer inp: only probs get a gradient
    _check(xi, sizes, idxs, probs=randn((12,), torch.float32, DEVICE, seed=26))
    x = randn((12, 5), torch.float32, DEVICE, seed=27).requires_grad_()
    p = randn((12,), torch.float32, DEVICE, seed=28)
    out, pp = sort_chunks_probs(x, p, sizes, idxs)
    out.backward(out.detach())
    assert torch.equal(x.grad, x.detach())
    out, pp = sort_chunks_probs(x.detach(), p.requires_grad_(), sizes, idxs)
    pp.backward(pp.detach())
    assert torch.equal(p.grad, p.detach())


def test_binary_search_path(monkeypatch):
    monkeypatch.setattr(launch, "SEARCH_BLOCK_MAX", 4)
    sizes, idxs = random_splits(37, 300, seed=29, tail=5)
    _check(randn((300, 8), torch.float32, DEVICE, seed=30), sizes, idxs,
           probs=randn((300,), torch.float16, DEVICE, seed=31))
    _check(randn((30, 8), torch.float16, DEVICE, seed=32), [0, 0, 10, 0, 0, 20, 0], [6, 5, 4, 3, 2, 1, 0])


@pytest.mark.parametrize("search_max", [1024, 2])
def test_invalid_device_values_are_memory_safe(monkeypatch, search_max):
    """Device split_sizes/sorted_idxs are trusted (not checked); bad ones must still stay in bounds:
    every output row is some input row (the launcher is called directly, bypassing host checks)."""
    monkeypatch.setattr(launch, "SEARCH_BLOCK_MAX", search_max)
    x = torch.arange(20, dtype=torch.float32, device=DEVICE).view(20, 1).repeat(1, 4)
    p = torch.arange(20, dtype=torch.float32, device=DEVICE)
    bad = [([5, -3, 100, 7], [3, 3, 9, -2]), ([2**40, 1, 1], [0, 1, 2]), ([10, 10, 10], [2, 1, 0]),
           ([-(2**40)], [5])]
    for sizes, idxs in bad:
        for rev in (False, True):
            s, i = torch.tensor(sizes, device=DEVICE), torch.tensor(idxs, device=DEVICE, dtype=torch.int32)
            out, pp = launch._permute(x, p, s, i, rev)
            if not rev:
                assert ((out >= 0) & (out < 20)).all() and ((pp >= 0) & (pp < 20)).all()


def test_bad_input():
    x = randn((10, 4), torch.float32, DEVICE, seed=33)
    p = randn((10,), torch.float32, DEVICE, seed=34)
    with pytest.raises(ValueError, match="split_sizes must be >= 0"):
        sort_chunks(x, [5, -1, 6], [0, 1, 2])
    with pytest.raises(ValueError, match=r"sum\(split_sizes\) must be <= num_tokens = 10, got 11"):
        sort_chunks(x, torch.tensor([5, 6]), [0, 1])
    with pytest.raises(ValueError, match="sorted_idxs must be a permutation of 0..2"):
        sort_chunks(x, [3, 3, 3], [0, 2, 2])
    with pytest.raises(ValueError, match="sorted_idxs must be a permutation"):
        sort_chunks_probs(x, p, [3, 3, 3], torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match=r"sorted_idxs must have shape \[num_splits\] = \[3\]"):
        sort_chunks(x, [3, 3, 3], [0, 1])
    with pytest.raises(ValueError, match="split_sizes must be 1-D"):
        sort_chunks(x, torch.tensor([[3, 3]]), [0, 1])
    with pytest.raises(TypeError, match="split_sizes must have dtype"):
        sort_chunks(x, torch.tensor([3.0, 3.0]), [0, 1])
    with pytest.raises(TypeError, match="sorted_idxs must hold ints"):
        sort_chunks(x, [3, 3], [0.0, 1.0])
    with pytest.raises(TypeError, match="split_sizes must be a 1-D integer tensor or a list"):
        sort_chunks(x, 10, [0])
    with pytest.raises(ValueError, match="inp must have at least 1 dims"):
        sort_chunks(torch.tensor(1.0, device=DEVICE), [1], [0])
    with pytest.raises(ValueError, match=r"probs must have shape \[num_tokens\] = \[10\], got \[9\]"):
        sort_chunks_probs(x, p[:9], [5, 5], [1, 0])
    with pytest.raises(TypeError, match="probs must have dtype"):
        sort_chunks_probs(x, torch.ones(10, dtype=torch.int32, device=DEVICE), [5, 5], [1, 0])
    with pytest.raises(ValueError, match="split_sizes must be on the host or on"):
        sort_chunks(x, torch.tensor([5, 5], device="meta"), [1, 0])


def test_deterministic():
    sizes, idxs = random_splits(10, 200, seed=35)
    x = randn((200, 40), torch.float16, DEVICE, seed=36).requires_grad_()
    res = []
    for _ in range(2):
        x.grad = None
        out = sort_chunks(x, sizes, idxs)
        out.backward(torch.ones_like(out) * 3)
        res.append((out, x.grad))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])


def test_registration_and_compile():
    assert {"sort_chunks_by_idx", "sort_chunks_by_idx_with_probs"} <= set(backends.registered_ops())
    sizes, idxs = random_splits(5, 24, seed=37, tail=2)
    x = randn((24, 8), torch.float32, DEVICE, seed=38).requires_grad_()
    p = randn((24,), torch.float32, DEVICE, seed=39).requires_grad_()
    torch.library.opcheck(torch.ops.mindspeed_ops.sort_chunks_by_idx, (x, sizes, idxs))
    torch.library.opcheck(torch.ops.mindspeed_ops.sort_chunks_by_idx_with_probs, (x, p, sizes, idxs))
    torch.library.opcheck(torch.ops.mindspeed_ops.sort_chunks_by_idx_bwd, (x.detach(), sizes, idxs))
    f = torch.compile(lambda a, b: sort_chunks_probs(a, b, [4, 0, 6, 12, 0], [3, 2, 0, 4, 1]), fullgraph=True)
    out, pp = f(x, p)
    (out.sum() + pp.sum()).backward()
    assert_close("compiled", ref.sort_chunks_by_idx(x.detach(), [4, 0, 6, 12, 0], [3, 2, 0, 4, 1]), out, EXACT)
    assert torch.equal(x.grad, torch.ones_like(x)) and torch.equal(p.grad, torch.ones_like(p))
    g = torch.compile(lambda a, s, i: sort_chunks(a, s, i), fullgraph=True)
    assert_close("compiled tensors", ref.sort_chunks_by_idx(x.detach(), sizes, idxs), g(x, sizes, idxs), EXACT)


def test_reference_backend_gradients():
    sizes, idxs = random_splits(6, 30, seed=40, tail=3)
    x = randn((30, 5), torch.float32, DEVICE, seed=41)
    p = randn((30,), torch.float32, DEVICE, seed=42)
    with mindspeed_ops.use_backend("reference"):
        _check(x, sizes, idxs, probs=p)
        _check(x, sizes, idxs)


def test_api_module_and_aliases():
    assert api_mod.moe_sort_chunks_by_index is api_mod.sort_chunks_by_idx is sort_chunks
    assert api_mod.moe_sort_chunks_by_index_with_probs is api_mod.sort_chunks_by_idx_with_probs is sort_chunks_probs


@pytest.mark.skipif(not ON_GPU, reason="device-resident split sizes need a GPU")
def test_device_indices_no_sync():
    sizes, idxs = random_splits(64, 4096, seed=43)
    x = randn((4096, 256), torch.bfloat16, DEVICE, seed=44)
    s, i = sizes.to(DEVICE), idxs.to(DEVICE)
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = sort_chunks(x, s, i)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(out, ref.sort_chunks_by_idx(x, sizes, idxs))


def test_eager_backward_reuses_forward_tables(monkeypatch):
    """The eager forward keeps its device gather tables for the backward: one tables launch (and, for
    host indices, one host->device copy) per forward+backward, with or without probs, one or both
    gradients; the results stay bitwise those of the reference."""
    calls = []
    real = launch._tables
    monkeypatch.setattr(launch, "_tables", lambda *a: calls.append(1) or real(*a))
    sizes, idxs = random_splits(11, 90, seed=50, tail=6)
    for probs in (None, randn((90,), torch.float32, DEVICE, seed=51)):
        calls.clear()
        _check(randn((90, 12), torch.float16, DEVICE, seed=52), sizes, idxs, probs=probs)
        assert len(calls) == 1
    x = randn((90, 12), torch.float32, DEVICE, seed=53)
    p = randn((90,), torch.float32, DEVICE, seed=54)
    w = ref.sort_chunks_by_idx(p, sizes, idxs)  # d/dp <P p, P p'> = p
    for need in ((True, False), (False, True)):
        calls.clear()
        xg, pg = x.clone().requires_grad_(need[0]), p.clone().requires_grad_(need[1])
        out, pp = sort_chunks_probs(xg, pg, sizes, idxs)
        calls.clear()
        (3 * out.sum() + (pp * w).sum()).backward()
        assert len(calls) == 0
        if need[0]:
            assert torch.equal(xg.grad, torch.full_like(x, 3.0))
        else:
            assert torch.equal(pg.grad, p)
    calls.clear()
    with torch.no_grad():  # no autograd: the op's body, tables built once
        sort_chunks(x, sizes, idxs)
    assert len(calls) == 1


@pytest.mark.parametrize("search_max", [1024, 2])
def test_inverse_tables_gather_in_bounds(monkeypatch, search_max):
    """The backward is a gather with the inverse tables: for any device values every row of it is some
    row of the input, and for valid ones it undoes the forward exactly (both table paths)."""
    monkeypatch.setattr(launch, "SEARCH_BLOCK_MAX", search_max)
    x = torch.arange(20, dtype=torch.float32, device=DEVICE).view(20, 1).repeat(1, 3)
    for sizes, idxs in [([5, -3, 100, 7], [3, 3, 9, -2]), ([10, 10, 10], [2, 1, 0]), ([0, 7, 0, 9], [1, 1, 1, 1])]:
        s, i = torch.tensor(sizes, device=DEVICE), torch.tensor(idxs, device=DEVICE)
        back, _ = launch._permute(x, None, s, i, True)
        assert ((back >= 0) & (back < 20)).all()
    s, i = random_splits(9, 20, seed=55, tail=2)
    out, _ = launch._permute(x, None, s.to(DEVICE), i.to(DEVICE), False)
    back, _ = launch._permute(out, None, s.to(DEVICE), i.to(DEVICE), True)
    assert torch.equal(back, x)
