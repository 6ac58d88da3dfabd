"""chunk_local_cumsum (SPEC 1.10.1): kernel vs float64 reference, exact reverse case, varlen, tails,
layouts, errors."""
import math

import pytest
import torch

from mindspeed_ops.api.triton.chunk_local_cumsum import chunk_local_cumsum
from mindspeed_ops.ops.gdn import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, randn, snapshot
from tests.conftest import DEVICE, DTYPES, ON_GPU

SEG13 = [0, 31, 64, 65, 130, 200, 333, 390, 512, 600, 777, 800, 1000, 1024]


def _check(g, **kw):
    before = snapshot(g)
    out = chunk_local_cumsum(g, **kw)
    assert_unchanged(before, g, names=["g"])
    want = ref.chunk_local_cumsum_ref(g.double(), kw.get("chunk_size", 64), kw.get("reverse", False),
                                      kw.get("scale"), kw.get("cu_seqlens"))
    od = kw.get("output_dtype", torch.float32)
    assert out.dtype == (g.dtype if od is None else od) and out.shape == g.shape
    assert_close("G", want, out, "STAT" if out.dtype == torch.float32 else "E-fwd")
    return out


SHAPES = [(1, 1024, 32, 64), (1, 1024, 32, 16), (2, 512, 32, 64)]
if ON_GPU:
    SHAPES.append((2, 4096, 32, 64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("B,T,HV,BT", SHAPES)
def test_scalar_matches_reference(B, T, HV, BT, reverse, dtype, poisoned):
    _check(randn((B, T, HV), dtype, DEVICE, seed=1), chunk_size=BT, reverse=reverse)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("cu", [[0, 175, 1024], [0, 175, 1024, 2764, 4096], SEG13])
def test_varlen(cu, reverse, poisoned):
    T = cu[-1]
    HV = 32 if ON_GPU else 8
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    for dtype in DTYPES:
        _check(randn((1, T, HV), dtype, DEVICE, seed=2), chunk_size=64, reverse=reverse, cu_seqlens=cu_t)
    _check(randn((1, T, HV), torch.float32, DEVICE, seed=3), chunk_size=16, reverse=reverse,
           cu_seqlens=cu_t.long())


@pytest.mark.parametrize("reverse", [False, True])
def test_vector_gates(reverse, poisoned):
    shape = (2, 1000, 4, 128) if ON_GPU else (2, 300, 4, 128)
    for dtype in DTYPES:
        _check(randn(shape, dtype, DEVICE, seed=4), chunk_size=64, reverse=reverse)
    _check(randn((1, 200, 3, 40), torch.float32, DEVICE, seed=5), chunk_size=32, reverse=reverse,
           cu_seqlens=torch.tensor([0, 7, 7, 100, 190], device=DEVICE))


def test_scale():
    g = randn((1, 256, 8), torch.float32, DEVICE, seed=6)
    out = _check(g, chunk_size=64, scale=1 / math.log(2))
    _check(g, chunk_size=64, scale=-0.25, reverse=True)
    assert_close("scale", ref.chunk_local_cumsum_ref(g.double(), 64) / math.log(2), out, "STAT")


def _exact_input(shape_tail=()):
    g = torch.ones(1, 64, *shape_tail, device=DEVICE)
    g[:, :32] = 1e8
    return g


@pytest.mark.parametrize("tail", [(1,), (64,), (3, 5), (2, 128)])
def test_exact_reverse_suffix(tail):
    """32 values 1e8 then 32 ones, reverse: the suffix sums of the ones are exact (a true suffix scan,
    not chunk total - prefix), whatever the launch configuration (tile width, scalar/vector)."""
    want = torch.arange(32, 0, -1, dtype=torch.float32, device=DEVICE)
    g = _exact_input(tail)
    out = chunk_local_cumsum(g, chunk_size=64, reverse=True)
    got = out[0, 32:].reshape(32, -1)
    assert torch.equal(got, want[:, None].expand_as(got))
    # the same inside a longer, packed input: chunk starts at a sequence start
    g2 = torch.cat([torch.full((1, 10, *tail), 3.0, device=DEVICE), g], 1)
    out2 = chunk_local_cumsum(g2, chunk_size=64, reverse=True, cu_seqlens=torch.tensor([0, 10, 74], device=DEVICE))
    got2 = out2[0, 42:].reshape(32, -1)
    assert torch.equal(got2, want[:, None].expand_as(got2))


def test_tail_tokens_zero(poisoned):
    g = randn((1, 300, 4), torch.float32, DEVICE, seed=7)
    g[:, 250:] = float("nan")
    cu = torch.tensor([0, 100, 250], device=DEVICE)
    for rev in (False, True):
        out = chunk_local_cumsum(g, chunk_size=64, reverse=rev, cu_seqlens=cu)
        assert (out[:, 250:] == 0).all() and torch.isfinite(out).all()
        g_ok = g.clone()
        g_ok[:, 250:] = 0
        assert_close("G", ref.chunk_local_cumsum_ref(g_ok.double(), 64, rev, cu_seqlens=cu), out, "STAT")


@pytest.mark.parametrize("BT", [1, 2, 256])
def test_chunk_size_edges(BT):
    _check(randn((2, 300, 3), torch.float32, DEVICE, seed=8), chunk_size=BT, reverse=True)
    _check(randn((1, 70, 2, 16), torch.float32, DEVICE, seed=9), chunk_size=BT)


def test_output_dtype():
    g = randn((2, 100, 4), torch.float16, DEVICE, seed=10)
    _check(g, chunk_size=32, output_dtype=None)
    _check(g.float(), chunk_size=32, output_dtype=torch.float16)


def test_non_contiguous():
    g = non_contiguous(randn((2, 200, 6), torch.float32, DEVICE, seed=11))
    assert not g.is_contiguous()
    _check(g, chunk_size=64, reverse=True)
    gv = randn((2, 100, 16, 3), torch.float32, DEVICE, seed=12).transpose(2, 3)  # [2,100,3,16] strided
    _check(gv, chunk_size=32)
    gs = randn((2, 128, 3, 4), torch.float32, DEVICE, seed=13)[..., 1]  # scalar gates with a head stride of 4
    _check(gs, chunk_size=16, reverse=True)


def test_supplied_chunk_indices_equal():
    from mindspeed_ops.api.triton.utils import prepare_chunk_indices

    cu = torch.tensor(SEG13, device=DEVICE)
    g = randn((1, 1024, 4), torch.float32, DEVICE, seed=14)
    a = chunk_local_cumsum(g, chunk_size=64, cu_seqlens=cu)
    b = chunk_local_cumsum(g, chunk_size=64, cu_seqlens=cu, chunk_indices=prepare_chunk_indices(cu, 64))
    assert torch.equal(a, b)


def test_empty_and_deterministic():
    assert chunk_local_cumsum(torch.empty(2, 0, 4, device=DEVICE)).shape == (2, 0, 4)
    g = randn((1, 512, 16), torch.float16, DEVICE, seed=15)
    assert torch.equal(chunk_local_cumsum(g, reverse=True), chunk_local_cumsum(g, reverse=True))


def test_unknown_kwarg_warns_once():
    g = randn((1, 16, 2), torch.float32, DEVICE, seed=16)
    with pytest.warns(UserWarning, match="ignoring unknown keyword argument 'foo_test_kw'"):
        chunk_local_cumsum(g, foo_test_kw=1)


def test_bad_input():
    g = randn((1, 64, 4), torch.float32, DEVICE, seed=17)
    with pytest.raises(ValueError, match="chunk_local_cumsum: g must be 3 or 4-D"):
        chunk_local_cumsum(g[0])
    with pytest.raises(ValueError, match="chunk_size must be a power of two"):
        chunk_local_cumsum(g, chunk_size=48)
    with pytest.raises(ValueError, match="chunk_size must be a power of two"):
        chunk_local_cumsum(g, chunk_size=512)
    with pytest.raises(ValueError, match="head_first=True"):
        chunk_local_cumsum(g, head_first=True)
    with pytest.raises(TypeError, match="float64"):
        chunk_local_cumsum(g.double())
    with pytest.raises(TypeError, match="g must have dtype"):
        chunk_local_cumsum(g.int())
    with pytest.raises(ValueError, match="batch size must be 1"):
        chunk_local_cumsum(g.expand(2, -1, -1), cu_seqlens=torch.tensor([0, 64], device=DEVICE))
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\] must be <= T = 64"):
        chunk_local_cumsum(g, cu_seqlens=torch.tensor([0, 65], device=DEVICE))
    with pytest.raises(ValueError, match="non-decreasing"):
        chunk_local_cumsum(g, cu_seqlens=torch.tensor([0, 30, 20], device=DEVICE))
    with pytest.raises(ValueError, match=r"chunk_indices must have shape \[NT, 2\] = \[2, 2\]"):
        chunk_local_cumsum(g, chunk_size=32, cu_seqlens=torch.tensor([0, 64], device=DEVICE),
                           chunk_indices=torch.zeros(1, 2, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("reverse", [False, True])
def test_gpu_real_sizes(reverse):
    for dtype in DTYPES:
        _check(randn((2, 4096, 32), dtype, DEVICE, seed=18), chunk_size=64, reverse=reverse)
        _check(randn((1, 4096, 32), dtype, DEVICE, seed=19), chunk_size=64, reverse=reverse,
               cu_seqlens=torch.tensor([0, 175, 1024, 2764, 4096], device=DEVICE))
        _check(randn((2, 1000, 4, 128), dtype, DEVICE, seed=20), chunk_size=64, reverse=reverse)
