"""Review regressions for sort_chunks_by_idx (SPEC 1.6): non-contiguous index tensors, many chunks
past the compare-count block, odd byte sizes, inverse-permutation backward."""
import pytest
import torch

from mindspeed_ops.api.triton.sort_chunks_by_idx import sort_chunks_by_idx, sort_chunks_by_idx_with_probs
from mindspeed_ops.ops.moe import reference as ref
from mindspeed_ops.ops.moe import sort_chunks as launch
from mindspeed_ops.ops.moe.checks import random_splits
from mindspeed_ops.testing import assert_close, assert_unchanged, randn, snapshot
from tests.conftest import DEVICE

EXACT = "EXACT"


def _strided(t, step=2):
    """``t`` as a view with stride ``step`` (same values)."""
    big = torch.full((t.shape[0] * step,), -5, dtype=t.dtype, device=t.device)
    big[::step] = t
    return big[::step]


def _check(x, sizes, idxs, probs=None):
    x = x.detach().requires_grad_(x.is_floating_point())
    tensors = [t if isinstance(t, torch.Tensor) else None for t in (x, probs, sizes, idxs)]
    before = snapshot(*tensors)
    if probs is None:
        out = sort_chunks_by_idx(x, sizes, idxs)
    else:
        probs = probs.detach().requires_grad_()
        out, pp = sort_chunks_by_idx_with_probs(x, probs, sizes, idxs)
        assert_close("probs", ref.sort_chunks_by_idx(probs.detach(), sizes, idxs), pp, EXACT)
    assert_close("out", ref.sort_chunks_by_idx(x.detach(), sizes, idxs), out, EXACT)
    if x.is_floating_point():
        g = randn(out.shape, out.dtype, DEVICE, seed=5)
        grads = [g] if probs is None else [g, randn(pp.shape, pp.dtype, DEVICE, seed=6)]
        torch.autograd.backward([out] if probs is None else [out, pp], grads)
        for t, gr in zip((x, probs), grads):
            r = t.detach().double().requires_grad_()
            ref.sort_chunks_by_idx(r, sizes, idxs).backward(gr.double())
            assert_close("grad", r.grad, t.grad, EXACT)
    assert_unchanged(before, *tensors)


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_non_contiguous_index_tensors(idx_dtype):
    """The tables kernel read split_sizes / sorted_idxs as dense arrays: a strided (slice) or expanded
    index tensor on inp's device was read with the wrong stride -> a wrong permutation."""
    sizes, idxs = random_splits(7, 30, seed=1, tail=2)
    s, i = _strided(sizes.to(idx_dtype)), _strided(idxs.to(idx_dtype))
    assert not s.is_contiguous()
    _check(randn((30, 3), torch.float32, DEVICE, seed=2), s.to(DEVICE), i.to(DEVICE),
           probs=randn((30,), torch.float32, DEVICE, seed=3))
    _check(randn((30, 3), torch.float32, DEVICE, seed=2), torch.tensor([10]).expand(3).to(DEVICE),
           torch.tensor([2, 0, 1]).to(DEVICE))


def test_non_contiguous_index_tensors_compiled():
    sizes, idxs = random_splits(5, 24, seed=4, tail=1)
    s, i = _strided(sizes).to(DEVICE), _strided(idxs).to(DEVICE)
    x = randn((24, 5), torch.float32, DEVICE, seed=5).requires_grad_()
    f = torch.compile(lambda a, b, c: sort_chunks_by_idx(a, b, c), fullgraph=True)
    out = f(x, s, i)
    assert_close("compiled", ref.sort_chunks_by_idx(x.detach(), sizes, idxs), out, EXACT)
    g = torch.arange(out.numel(), dtype=torch.float32, device=DEVICE).view(out.shape)
    out.backward(g)
    xr = x.detach().clone().requires_grad_()
    ref.sort_chunks_by_idx(xr, sizes, idxs).backward(g)
    assert_close("compiled grad", xr.grad, x.grad, EXACT)


@pytest.mark.parametrize("num_splits", [launch.SEARCH_BLOCK_MAX, launch.SEARCH_BLOCK_MAX + 1])
def test_many_chunks_real_threshold(num_splits):
    """Both sides of the real compare-count / binary-search switch, fp16 rows of one element (2 bytes),
    zero-size chunks, tail rows and probs."""
    sizes, idxs = random_splits(num_splits, 1500, seed=num_splits, tail=7, zeros=200)
    _check(randn((1500,), torch.float16, DEVICE, seed=6), sizes, idxs,
           probs=randn((1500,), torch.float32, DEVICE, seed=7))


@pytest.mark.parametrize("dtype,tail", [(torch.float16, (3,)), (torch.int8, (5,)), (torch.bool, (3,)),
                                        (torch.bfloat16, (1,)), (torch.float16, (3, 1001))])
def test_odd_byte_rows(dtype, tail):
    sizes, idxs = random_splits(6, 20, seed=8, tail=3)
    x = (torch.randn(20, *tail) * 50).to(dtype).to(DEVICE)
    _check(x, sizes.tolist(), idxs.tolist())
    _check(x[:, 1:] if x.dim() == 2 and x.shape[1] > 1 else x, sizes, idxs)  # odd byte offset


def test_edge_partitions():
    x = randn((10, 3), torch.float32, DEVICE, seed=9)
    for sizes, idxs in (([10], [0]), ([4], [0]), ([0, 0, 0], [2, 1, 0]), ([3, 3, 4], [0, 1, 2]), ([], []),
                        ([0, 10, 0], [1, 2, 0])):
        _check(x, sizes, idxs, probs=randn((10,), torch.float32, DEVICE, seed=10))
