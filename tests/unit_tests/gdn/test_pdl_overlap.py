"""The forward's output stage overlapping its state scan (``mindspeed_ops.ops.pdl``): ``fwd_h`` adds each V-tile's
width to its chunk's ready count once the chunk's ``h`` and ``v_new`` are stored, ``fwd_o`` waits for ``V`` before
reading them, and on Hopper the two launch with programmatic dependent launch. On CPU (interpreter, stage launchers
called directly): the counts are exactly ``V`` for every chunk that exists and 0 elsewhere, and the signalling and
waiting launches give the plain launches' bits. On the GPU: the op's forward with PDL gives the bits without it."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops import api
from mindspeed_ops.ops import pdl
from mindspeed_ops.ops.gdn import fwd_h, fwd_o
from mindspeed_ops.ops.kda import fwd_o as kda_fwd_o
from mindspeed_ops.ops.gdn import reference_fwd as ref
from tests.conftest import DEVICE

CASES = [  # (B, T, H, HV, K, V, BT, cu_seqlens): V over several fwd_h tiles (BV 32 under the interpreter)
    (2, 100, 1, 2, 32, 80, 32, None),          # partial last chunk, three V-tiles of widths 32, 32, 16
    (1, 90, 1, 2, 16, 48, 16, [0, 17, 17, 80]),  # varlen: an empty sequence and 10 tail tokens
]


@pytest.mark.parametrize("B,T,H,HV,K,V,BT,cu", CASES)
def test_ready_counts_and_same_bits(B, T, H, HV, K, V, BT, cu):
    cu_t = None if cu is None else torch.tensor(cu)
    x = ref.stage_inputs(B, T, H, HV, K, V, chunk_size=BT, gate="g", cu_seqlens=cu_t, seed=4)
    dev = lambda t: None if t is None else t.float().to(DEVICE)  # noqa: E731
    k, w, u, G, h0, q = (dev(x[n]) for n in ("k", "w", "u", "G", "h0", "q"))
    cu_d = None if cu is None else cu_t.to(torch.int32).to(DEVICE)
    NT = (T + BT - 1) // BT if cu is None else sum((b - a + BT - 1) // BT for a, b in zip(cu, cu[1:]))
    flags = pdl.ready_counts(B, NT, HV, k.device)
    h1, v1, f1 = fwd_h.forward(k, w, u, G, None, h0, True, BT, True, cu)
    h2, v2, f2 = fwd_h.forward(k, w, u, G, None, h0, True, BT, True, cu, flags=flags)
    assert torch.equal(h1, h2) and torch.equal(v1, v2) and torch.equal(f1, f2)
    assert (flags == V).all(), f"every chunk's ready count must be V = {V}: {flags.unique().tolist()}"
    o1 = fwd_o.forward(q, k, v1, h1, G, None, cu, cu_d, BT)
    o2 = fwd_o.forward(q, k, v2, h2, G, None, cu, cu_d, BT, flags=flags)
    assert torch.equal(o1, o2) and torch.isfinite(o1).all()


def test_kda_fwd_o_waiting_same_bits():
    """KDA's output stage with ready counts (all complete) gives its plain launch's bits."""
    gen = torch.Generator().manual_seed(2)
    B, T, H, HV, K, V, BT, cu = 1, 70, 1, 2, 16, 40, 32, [0, 30, 30, 64]
    NT = 1 + 2

    def r(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE)
    q, v, gk = r(B, T, H, K), r(B, T, HV, V), -torch.rand(B, T, HV, K, generator=gen).to(DEVICE)
    h, Aqk = r(B, NT, HV, K, V), r(B, T, HV, BT)
    cu_d = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    flags = pdl.ready_counts(B, NT, HV, q.device) + V
    o1 = kda_fwd_o.forward(q, v, h, gk, Aqk, 0.5, cu, cu_d, BT)
    o2 = kda_fwd_o.forward(q, v, h, gk, Aqk, 0.5, cu, cu_d, BT, flags=flags)
    assert torch.equal(o1, o2) and torch.isfinite(o1).all()


def test_not_available_on_cpu_or_switched_off(monkeypatch):
    assert not pdl.available(torch.device("cpu"))
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert not pdl.available(torch.device("cuda"))  # never touches CUDA when off
    assert pdl.producer_args(None, True) == {} and pdl.consumer_args(None, True) == {}


@pytest.mark.gpu
@pytest.mark.parametrize("fam", ["gdn", "kda"])
@pytest.mark.parametrize("T,H,HV,cu", [(8192, 4, 8, None), (3000, 2, 2, [0, 1000, 1000, 2999]),
                                       (777, 1, 2, [0, 100, 777])])
def test_op_forward_bitwise_with_and_without_pdl(fam, T, H, HV, cu, monkeypatch):
    """The whole GDN / KDA forward (o and the final state) with the overlap equals it without, in bf16, repeated
    (fresh counts each call); varlen with an empty sequence and tail tokens, and without."""
    gen = torch.Generator().manual_seed(0)
    K = V = 128
    N = 1 if cu is None else len(cu) - 1
    q, k = (torch.randn(1, T, H, K, generator=gen).to(torch.bfloat16).cuda() for _ in range(2))
    v = torch.randn(1, T, HV, V, generator=gen).to(torch.bfloat16).cuda()
    g = F.logsigmoid(torch.randn(1, T, HV, *((K,) if fam == "kda" else ()), generator=gen)).cuda()
    beta = torch.rand(1, T, HV, generator=gen).cuda()
    h0 = torch.randn(N, HV, K, V, generator=gen).cuda()
    kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    if cu is not None:
        kw.update(cu_seqlens=torch.tensor(cu, dtype=torch.int32).cuda(), cu_seqlens_cpu=torch.tensor(cu))
    monkeypatch.setattr(pdl, "ENABLED", False)
    op = api.chunk_kda if fam == "kda" else api.chunk_gated_delta_rule
    want = op(q, k, v, g, beta, **kw)
    monkeypatch.setattr(pdl, "ENABLED", True)
    if not pdl.available(q.device):
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    for _ in range(3):
        got = op(q, k, v, g, beta, **kw)
        for name, a, b in zip(("o", "final_state"), got, want):
            assert torch.isfinite(a).all() and torch.equal(a, b), f"{name} differs with the overlap"


@pytest.mark.parametrize("_", [0], ids=["sm_90"])
def test_signalling_and_waiting_kernels_compile_for_hopper(_):
    """The CPU suite never runs the PDL variants (the trigger, release/acquire atomics, the sleep): build them for
    sm_90 (first autotune config each, bf16 at a real size), spills unbounded (the plain variants' checks bound
    those)."""
    import os

    from mindspeed_ops import compile_check as cc
    from tests.conftest import COMPILE_ONLY_MARKS, assert_compiled

    for mark in COMPILE_ONLY_MARKS:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    assert os.environ.get("TRITON_INTERPRET") == "1"
    B, T, H, HV, K, V, BT = 1, 4096, 16, 16, 128, 128, 64
    with cc.Recorder(dry=True) as rec:
        half = dict(dtype=torch.float16)  # recorded as fp16, built as bf16 (the interpreter has no bf16 loads)
        k, q, w = torch.empty(B, T, H, K, **half), torch.empty(B, T, H, K, **half), torch.empty(B, T, HV, K, **half)
        u, G = torch.empty(B, T, HV, V, **half), torch.empty(B, T, HV)
        flags = pdl.ready_counts(B, T // BT, HV, k.device)
        h, vn, _ = fwd_h.forward(k, w, u, G, None, None, False, BT, True, None, flags=flags, pdl=True)
        fwd_o.forward(q, k, vn, h, G, None, None, None, BT, flags=flags, pdl=True)
        kda_fwd_o.forward(q, vn, h, torch.empty(B, T, HV, K), torch.empty(B, T, HV, BT), 0.1, None, None, BT,
                          flags=flags, pdl=True)
    launches = [cc.as_bf16(l) for l in cc.dedupe(rec.launches) if l.config.startswith("1/")]
    assert all("*bf16" in l.signature.values() for l in launches)
    assert {l.qualname for l in launches} == {"chunk_fwd_h_kernel", "chunk_fwd_o_kernel", "kda_fwd_o_kernel"}
    assert_compiled(cc.compile_launches(launches, archs=(90,), jobs=1), lambda r: None)
