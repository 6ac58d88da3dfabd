"""Compile-only check (DESIGN 7) of every kernel a KDA training step launches: the operator's forward and
backward recorded dry at a real size under the interpreter (GVA 16/32 heads, K = V = 128, with and without
the in-kernel l2norm, varlen), built for sm_90 (every dtype) and sm_80 (bf16) with Triton's NVIDIA backend:
catches tl.dot shapes, shared memory and register spills before a GPU does. fp32 is recorded without the
l2norm only: chunk_kda's real-size check cases (all with it on, GVA and varlen among them) are built for sm_80 and
sm_90 in fp32 by tests/unit_tests/core/test_compile_only.py."""
import pytest
import torch

from mindspeed_ops import compile_check as cc
from mindspeed_ops.api import chunk_kda
from tests.conftest import COMPILE_ONLY_MARKS, assert_compiled, side_stream_inline

pytestmark = COMPILE_ONLY_MARKS

#: spill bytes allowed on sm_90 per kernel (16-bit inputs; fp32 builds are not bounded, their IEEE products
#: run on the FMA units with larger register tiles); 0 for every kernel not listed. The listed launches spill
#: and still ran fastest on the H200: the WY/state backward at 4 warps and one stage 68 bytes (104 varlen,
#: bwd.wy_dqkg_config), the intra-chunk backward at BK = 64 / 2 warps 68 bytes (104 varlen; thirty-second
#: session's halvings; bwd.intra_bwd_config, eleventh session: 1.53 ms vs 1.80 ms at 4 warps without spills), the
#: Aqk kernel at BK = 32 / 1 warp / 1 stage 0-48 bytes (intra.aqk_config, thirty-second session: 241-243 µs, the
#: fastest of the sweep).
SPILL_ALLOWED: dict = {"kda_bwd_wy_dqkg_kernel": 128, "kda_bwd_intra_kernel": 128, "kda_aqk_fwd_kernel": 64}


def _step(T, H, HV, K, dt, l2, cu):
    """chunk_kda forward and backward on empty tensors (a dry recording launches nothing)."""
    q, k = (torch.empty(1, T, H, K, dtype=dt, requires_grad=True) for _ in range(2))
    v, g = (torch.empty(1, T, HV, K, dtype=dt, requires_grad=True) for _ in range(2))
    beta = torch.empty(1, T, HV, dtype=dt, requires_grad=True)
    o, _ = chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=l2, cu_seqlens=cu)
    o.backward(torch.empty_like(o))


def _launches():
    T, H, HV, K = 4096, 16, 32, 128
    varlen = torch.tensor([0, 1000, 2500, T])
    # fp32 only without the l2norm: test_compile_only's chunk_kda check cases build the fp32 launches with it on
    with cc.Recorder(dry=True) as rec:
        for dt, l2, cu in ((torch.float16, True, None), (torch.float16, False, varlen), (torch.float32, False, varlen)):
            _step(T, H, HV, K, dt, l2, cu)
    # the intra backward also at a K its 64-wide key tile does not divide (it launches at 4 warps there: 2
    # spilled 500-700 bytes)
    with cc.Recorder(dry=True) as odd:
        _step(T, H, HV, 100, torch.float16, True, None)
    odd = [la for la in odd.launches if la.qualname == "kda_bwd_intra_kernel"]
    assert odd and all(la.options.get("num_warps") == 4 for la in odd), [la.label() for la in odd]
    # on a GPU the backward forks (ops/side_stream.py) and splits dAqk / dv into two launches: record that path
    # with the streams stubbed
    with side_stream_inline(), cc.Recorder(dry=True) as forked:
        _step(T, H, HV, K, torch.float16, True, None)
    forked = [la for la in forked.launches if la.qualname == "kda_bwd_dav_kernel"]
    assert {("DA=True" in la.label(), "DV=True" in la.label()) for la in forked} == {(True, False), (False, True)}
    launches = cc.dedupe(rec.launches + odd + forked)
    return launches, [cc.as_bf16(la) for la in launches if "*fp16" in la.signature.values()]


def test_kda_kernels_compile_for_gpu():
    launches, bf16 = _launches()
    names = {la.qualname for la in launches}
    for kernel in ("kda_aqk_fwd_kernel", "kda_bwd_intra_kernel", "kda_bwd_wy_dqkg_kernel", "kda_fwd_o_kernel"):
        assert kernel in names, names
    assert any("STORE_M=True" in la.label() for la in launches)  # Aqk and M from one kernel
    results = cc.compile_launches(launches + bf16, archs=(90,), jobs=2)
    results += cc.compile_launches(bf16, archs=(80,), jobs=2)

    def spill_allowed(r):  # bounded for 16-bit q/k on sm_90 (the first two kernel arguments)
        if r.arch != 90 or "*fp32" in list(r.launch.signature.values())[:2]:
            return None
        return SPILL_ALLOWED.get(r.launch.qualname, 0)

    assert_compiled(results, spill_allowed)
