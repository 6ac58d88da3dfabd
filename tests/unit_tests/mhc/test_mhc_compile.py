"""Compile-only check (DESIGN 7) of the mHC kernels: launches recorded dry at real sizes under the
interpreter, built for sm_80 and sm_90 with Triton's NVIDIA backend (layouts, shared memory, spills)."""

import pytest
import torch

from mindspeed_ops import compile_check as cc
from tests.conftest import COMPILE_ONLY_MARKS, assert_compiled
import importlib

# launcher modules (the package's names of the same spelling are the public functions)
post = importlib.import_module("mindspeed_ops.ops.mhc.mhc_post")
pre_bmm = importlib.import_module("mindspeed_ops.ops.mhc.mhc_pre_bmm")
sk = importlib.import_module("mindspeed_ops.ops.mhc.sinkhorn")


pytestmark = COMPILE_ONLY_MARKS


def _launches():
    e = torch.empty
    with cc.Recorder(dry=True) as rec:
        for dt in (torch.float16,):
            for n in (4, 8):
                W = (2 + n) * n
                m, s, b = e(65536, W, dtype=dt), e(3, dtype=dt), e(W, dtype=dt)
                sk.forward(m, s, b, n, 20)
                sk.backward(e(65536, n, dtype=dt), e(65536, n, dtype=dt), e(65536, n, n, dtype=dt), m, s, b, n, 20)
            for n in (64,):
                L = e(4096, n, n, dtype=dt)
                sk.knopp_forward(L, 20)
                sk.knopp_backward(e(4096, n, n, dtype=dt), L, 20)
            for n, D in ((4, 4096), (8, 7168)):
                p, x = e(256, n), e(256, n, D, dtype=dt)
                pre_bmm.forward(p, x)
                pre_bmm.backward(e(256, D, dtype=dt), p, x)
                h, r, hp, hr = e(256, D, dtype=dt), e(256, n, D, dtype=dt), e(256, n), e(256, n, n)
                post.forward(h, r, hp, hr)
                post.backward(e(256, n, D, dtype=dt), h, r, hp, hr)
    launches = cc.dedupe(rec.launches)
    return launches + [cc.as_bf16(l) for l in launches if "*fp16" in l.signature.values()]


def test_mhc_kernels_compile_for_gpu():
    launches = _launches()
    assert len({l.qualname for l in launches}) == 8
    results = cc.compile_launches(launches, archs=(90,), jobs=1)
    assert_compiled(results)
