"""Compile-only check (DESIGN 7) of the GDN stage kernels that have no check cases yet
(chunk_local_cumsum, solve_tril): launches recorded dry at real sizes under the interpreter, built for
sm_80 and sm_90 with Triton's NVIDIA backend (catches tl.dot shapes, shared memory, spills)."""

import pytest
import torch

from mindspeed_ops import compile_check as cc
from tests.conftest import COMPILE_ONLY_MARKS, assert_compiled
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
    assert_compiled(results, lambda r: SOLVE_TRIL_SPILL_BYTES[r.arch] if r.launch.qualname == "solve_tril_kernel"
                    and "BT=64" in r.launch.label() else 0)


#: solve_tril runs with one warp although at BT = 64 it then spills (BT = 16 and 32 must not): on the H200 that was the fastest setting
#: at every chunk size (fp32 A -> bf16, as GDN calls it: 87 us at [1, 8192, 32, 64] vs 112 us with 2 warps and
#: 247 us with 4, which do not spill; benchmarks/tune_solve_tril.py, docs/benchmarks/gdn.md). ptxas gives
#: some BT = 64 variants 255 registers and ~0.9 KB of spills, others (half-precision A on sm_90, all on sm_80)
#: 64 registers and ~3.4 KB: those were not timed. BT = 16 and 32 do not spill. The bound catches worse.
SOLVE_TRIL_SPILL_BYTES = {80: 4096, 90: 4096}
