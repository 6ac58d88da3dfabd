"""Compile-only check (DESIGN 7) of the GDN stage kernels that have no check cases yet
(chunk_local_cumsum, solve_tril): launches recorded dry at real sizes under the interpreter, built for
sm_80 and sm_90 with Triton's NVIDIA backend (catches tl.dot shapes, shared memory, spills)."""

import pytest
import torch

from mindspeed_ops import compile_check as cc
from tests.conftest import COMPILE_ONLY_MARKS
from mindspeed_ops.ops.gdn.cumsum import chunk_local_cumsum
from mindspeed_ops.ops.gdn.solve_tril import solve_tril


pytestmark = COMPILE_ONLY_MARKS


def _launches():
    cu = torch.tensor([0, 175, 1024, 2764, 4096])
    with cc.Recorder(dry=True) as rec:
        for dt in (torch.float32, torch.float16):
            for rev in (False, True):
                chunk_local_cumsum(torch.empty(2, 4096, 32, dtype=dt), 64, reverse=rev)
                chunk_local_cumsum(torch.empty(1, 4096, 32, dtype=dt), 16, reverse=rev, cu_seqlens=cu)
                chunk_local_cumsum(torch.empty(2, 1000, 4, 128, dtype=dt), 64, reverse=rev)
                for bt in (1, 256):  # chunk_size edges
                    chunk_local_cumsum(torch.empty(1, 1000, 4, dtype=dt), bt, reverse=rev)
            for BT in (16, 32, 64):
                solve_tril(torch.empty(2, 1024, 8, BT, dtype=dt))
                solve_tril(torch.empty(1, 4096, 8, BT, dtype=dt), cu_seqlens=cu, output_dtype=dt)
    launches = cc.dedupe(rec.launches)
    return launches + [cc.as_bf16(l) for l in launches if "*fp16" in l.signature.values()]


def test_stage_kernels_compile_for_gpu():
    launches = _launches()
    kernels = {l.qualname for l in launches}
    assert kernels == {"chunk_local_cumsum_kernel", "solve_tril_kernel"}, kernels
    results = cc.compile_launches(launches, archs=(80, 90), jobs=1)
    bad = [f"{r.launch.label()} sm_{r.arch}: {r.summary}" for r in results if not r.ok]
    assert not bad, "\n".join(bad)
    for r in results:
        assert r.shared is not None and r.shared <= cc.SHARED_LIMIT[r.arch]
        assert not r.spill_stores, f"{r.launch.label()} sm_{r.arch} spills {r.spill_stores} bytes"
