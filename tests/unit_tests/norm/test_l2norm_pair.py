"""``l2norm.forward_pair`` (internal: the GDN/KDA in-kernel l2norm of q and k in one launch of the tile kernel, the
second row set's programs after the first's): bitwise what ``l2norm.forward`` gives each tensor, with and without
the normalized rows, for odd row counts and head dims, q and k of different strides (views of one projection), the
looped long-row path (two launches), and inputs unchanged."""
import importlib

import pytest
import torch

from mindspeed_ops import compile_check as cc
from mindspeed_ops.testing import assert_unchanged, snapshot
from tests.conftest import COMPILE_ONLY_MARKS, DEVICE, DTYPES, assert_compiled

l2 = importlib.import_module("mindspeed_ops.ops.norm.l2norm")  # the module (the package exports the function)


def _qk(B, T, H, D, dtype, seed, fused):
    gen = torch.Generator().manual_seed(seed)
    if fused:  # q and k as head-strided views of one projection [B, T, 3·H·D] (HF's split), v between them
        qkv = (torch.randn(B, T, 3, H, D, generator=gen) * 3).to(dtype).to(DEVICE)
        return qkv[:, :, 0], qkv[:, :, 2]
    return tuple((torch.randn(B, T, H, D, generator=gen) * 3).to(dtype).to(DEVICE) for _ in range(2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, T, H, D, fused", [(1, 37, 3, 100, False), (2, 5, 2, 60, True), (1, 1, 1, 16, False),
                                               (1, 3, 1, 20000, False), (1, 9, 2, 1, True)])
@pytest.mark.parametrize("write", [True, False])
def test_forward_pair_bitwise_as_two_forwards(dtype, B, T, H, D, fused, write):
    q, k = _qk(B, T, H, D, dtype, seed=T + D, fused=fused)
    before = snapshot(q, k)
    qn, kn, rq, rk = l2.forward_pair(q, k, 1e-6, write=write)
    assert_unchanged(before, q, k)
    for x, xn, r in ((q, qn, rq), (k, kn, rk)):
        y, rstd = l2.forward(x, 1e-6, None)
        assert r.dtype == torch.float32 and r.shape == x.shape[:-1]
        assert torch.equal(r, rstd), (r - rstd).abs().max()
        if write:
            assert xn.dtype == x.dtype and xn.shape == x.shape
            assert torch.equal(xn, y)
        else:
            assert xn is None


def test_forward_pair_mixed_dtypes_keep_their_own():
    """q and k of different dtypes (two launches): each normalized row set in its own dtype, as two forwards."""
    q, _ = _qk(1, 7, 2, 32, torch.float32, seed=1, fused=False)
    _, k = _qk(1, 7, 2, 32, torch.float16, seed=2, fused=False)
    qn, kn, rq, rk = l2.forward_pair(q, k, 1e-6)
    for x, xn, r in ((q, qn, rq), (k, kn, rk)):
        y, rstd = l2.forward(x, 1e-6, None)
        assert xn.dtype == x.dtype and torch.equal(xn, y) and torch.equal(r, rstd)


@pytest.mark.parametrize("D", [pytest.param(1, marks=COMPILE_ONLY_MARKS), pytest.param(128, marks=COMPILE_ONLY_MARKS)])
def test_forward_pair_builds_for_gpu(D):
    """Every launch of forward_pair builds for sm_80/sm_90. At D = 1 the row strides are 1, which Triton passes as
    constants; the pair launch's per-program swap of strides did not build there (fresh-eyes review, thirty-third
    session): D = 1 takes two launches."""
    launches = []
    for write in (True, False):
        with cc.Recorder(dry=True) as rec:
            l2.forward_pair(torch.empty(40, D, dtype=torch.float16), torch.empty(40, D, dtype=torch.float16),
                            write=write)
        launches += rec.launches
    assert {"PAIR=True" in la.label() for la in launches} == {D > 1}
    assert_compiled(cc.compile_launches(cc.dedupe(launches), archs=(80, 90), jobs=1), lambda r: 0)
