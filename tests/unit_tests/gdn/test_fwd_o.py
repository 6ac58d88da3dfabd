"""chunk_fwd_o (SPEC 1.10.7): kernel vs the float64 reference on realistic q/k/v_new/h (from the stage
references), GVA, K = V = 100, varlen with tails, no gate, scale; and the fwd_h -> fwd_o kernel pipeline
against the token-by-token oracle of SPEC 1.10.0."""
import pytest
import torch

from mindspeed_ops.api.triton.chunk_fwd_o import chunk_fwd_o
from mindspeed_ops.api.triton.chunk_gated_delta_rule_fwd_h import chunk_gated_delta_rule_fwd_h
from mindspeed_ops.api.triton.utils import prepare_chunk_indices
from mindspeed_ops.ops.gdn import reference as gref
from mindspeed_ops.ops.gdn import reference_fwd as ref
from mindspeed_ops.testing import (assert_close, assert_unchanged, dirty_tail, non_contiguous, snapshot, threshold,
                                   to_ref)
from tests.conftest import DEVICE, DTYPES

SEG13 = [0, 31, 64, 65, 130, 200, 333, 390, 512, 600, 777, 800, 1000, 1024]


def make(B, T, H, HV, K, V, dtype, *, BT=64, gate="g", cu=None, seed=0, stage=False):
    """``(q, k, v_new, h, g)`` on DEVICE (q/k/v_new/h in ``dtype``, g fp32) from the float64 references;
    with ``stage=True`` also the raw inputs (for the oracle) and ``w, u, h0``."""
    cu_t = None if cu is None else torch.tensor(cu)
    x = ref.stage_inputs(B, T, H, HV, K, V, chunk_size=BT, gate=gate, cu_seqlens=cu_t, seed=seed)
    h, vn, _ = ref.chunk_gated_delta_rule_fwd_h_ref(x["k"], x["w"], x["u"], x["G"], None, x["h0"], False, BT, True,
                                                    cu_t)
    dev = lambda t: None if t is None else t.to(dtype).to(DEVICE)  # noqa: E731
    g = None if x["G"] is None else x["G"].float().to(DEVICE)
    out = (dev(x["q"]), dev(x["k"]), dev(vn), dev(h), g)
    return (out, x) if stage else out


def check(q, k, v, h, g=None, *, BT=64, cu=None, scale=None, **kw):
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    before = snapshot(q, k, v, h, g)
    o = chunk_fwd_o(q, k, v, h, g, scale=scale, cu_seqlens=cu_t, chunk_size=BT, **kw)
    assert_unchanged(before, q, k, v, h, g, names=["q", "k", "v", "h", "g"])
    want = ref.chunk_fwd_o_ref(*to_ref(q, k, v, h, g), scale, None if cu is None else torch.tensor(cu), BT)
    assert o.dtype == v.dtype and o.shape == v.shape
    assert_close("o", want, o, threshold("LA-o", q.dtype))
    if cu is not None:
        assert (o[:, cu[-1]:] == 0).all(), "tail outputs must be 0"
    return o


CPU_SHAPES = [  # (B, T, H, HV, K, V, BT)
    (1, 128, 2, 2, 64, 64, 64),
    (2, 100, 1, 2, 32, 48, 32),      # partial last chunk
    (1, 64, 1, 4, 16, 16, 16),       # GVA HV = 4H
    (1, 100, 1, 1, 100, 100, 64),    # K = V = 100
    (1, 40, 1, 1, 256, 16, 32),      # K = 256: K loop of four blocks
    (1, 30, 1, 1, 8, 200, 16),       # tiny K, V over two tiles
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,H,HV,K,V,BT", CPU_SHAPES)
def test_matches_reference(B, T, H, HV, K, V, BT, dtype, poisoned):
    check(*make(B, T, H, HV, K, V, dtype, BT=BT, seed=1), BT=BT)


def test_no_gate_and_scale(poisoned):
    q, k, v, h, _ = make(1, 96, 1, 2, 32, 32, torch.float32, BT=32, gate=None, seed=2)
    a = check(q, k, v, h, None, BT=32)
    assert torch.equal(a, chunk_fwd_o(q, k, v, h, torch.zeros(1, 96, 2, device=DEVICE), chunk_size=32))
    check(q, k, v, h, None, BT=32, scale=0.37)
    q, k, v, h, g = make(1, 96, 1, 2, 32, 32, torch.float16, BT=32, seed=3)
    check(q, k, v, h, g, BT=32, scale=1.0)


@pytest.mark.parametrize("cu", [[0, 15], [0, 0, 40, 40, 97], SEG13[:6]])
def test_varlen_with_tail(cu, poisoned):
    T = cu[-1] + 7
    cu_t = torch.tensor(cu, device=DEVICE)
    for dtype in DTYPES:
        q, k, v, h, g = make(1, T, 1, 2, 32, 32, dtype, BT=32, cu=cu, seed=4)
        clean = check(q, k, v, h, g, BT=32, cu=cu)
        dirty = chunk_fwd_o(*(dirty_tail(t, cu[-1]) for t in (q, k, v)), h, dirty_tail(g, cu[-1]),
                            cu_seqlens=cu_t, chunk_size=32)
        assert torch.equal(clean, dirty), "tail tokens changed an output"
    q, k, v, h, g = make(1, T, 1, 2, 16, 16, torch.float32, BT=16, cu=cu, seed=5)
    o = check(q, k, v, h, g, BT=16, cu=cu, chunk_indices=prepare_chunk_indices(cu_t, 16))
    assert torch.equal(o, chunk_fwd_o(q, k, v, h, g, cu_seqlens=cu_t, chunk_size=16))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cu", [None, [0, 20, 20, 83, 150]])
def test_pipeline_matches_oracle(cu, dtype):
    """w/u from the stage references, then the fwd_h and fwd_o kernels: o and the final state equal the
    token-by-token recurrence (float64) within LA-o."""
    BT, B = 32, (2 if cu is None else 1)
    cu_h = None if cu is None else torch.tensor(cu)
    x = ref.stage_inputs(B, 150, 1, 2, 32, 32, chunk_size=BT, cu_seqlens=cu_h, seed=6)
    cu_t = None if cu is None else cu_h.to(DEVICE)
    dev = lambda t: t.to(dtype).to(DEVICE)  # noqa: E731
    h, vn, fs = chunk_gated_delta_rule_fwd_h(dev(x["k"]), dev(x["w"]), dev(x["u"]), x["G"].float().to(DEVICE),
                                             initial_state=x["h0"].float().to(DEVICE), output_final_state=True,
                                             chunk_size=BT, cu_seqlens=cu_t)
    o = chunk_fwd_o(dev(x["q"]), dev(x["k"]), vn, h, x["G"].float().to(DEVICE), cu_seqlens=cu_t, chunk_size=BT)
    wo, wf = gref.recurrent_gated_delta_rule_ref(x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["h0"], True,
                                                 cu_seqlens=cu_h)
    # the oracle sees unrounded inputs: fp16 is compared at the LA-o bound of its dtype
    assert_close("o", wo, o, threshold("LA-o", dtype))
    assert_close("final_state", wf, fs, threshold("LA-o", dtype))


def test_layouts_and_determinism():
    q, k, v, h, g = make(1, 64, 2, 4, 32, 24, torch.float32, BT=16, seed=7)
    base = chunk_fwd_o(q, k, v, h, g, chunk_size=16)
    nc = chunk_fwd_o(non_contiguous(q), non_contiguous(k, "transpose"), non_contiguous(v),
                     non_contiguous(h, "transpose"), non_contiguous(g), chunk_size=16)
    assert torch.equal(base, nc)
    assert torch.equal(base, chunk_fwd_o(q, k, v, h, g, chunk_size=16))


def test_reference_path(monkeypatch):
    """Without a Triton backend (CPU, no interpreter) the float64-capable reference runs: same contract."""
    import mindspeed_ops.ops.gdn.fwd_o as mod

    q, k, v, h, g = make(1, 70, 1, 2, 32, 16, torch.float16, BT=32, cu=[0, 30, 70], seed=8)
    cu = torch.tensor([0, 30, 70], device=DEVICE)
    kern = chunk_fwd_o(q, k, v, h, g, cu_seqlens=cu, chunk_size=32)
    monkeypatch.setattr(mod, "use_triton", lambda device: False)
    refo = chunk_fwd_o(q, k, v, h, g, cu_seqlens=cu, chunk_size=32)
    assert refo.dtype == kern.dtype and refo.shape == kern.shape
    assert_close("o", refo, kern, threshold("LA-o", torch.float16))


def test_empty():
    q = torch.empty(2, 0, 1, 16, device=DEVICE)
    o = chunk_fwd_o(q, q, torch.empty(2, 0, 2, 8, device=DEVICE), torch.empty(2, 0, 2, 16, 8, device=DEVICE))
    assert o.shape == (2, 0, 2, 8)
    q = torch.randn(1, 10, 1, 16, device=DEVICE)
    o = chunk_fwd_o(q, q, torch.randn(1, 10, 1, 8, device=DEVICE), torch.empty(1, 0, 1, 16, 8, device=DEVICE),
                    cu_seqlens=torch.tensor([0, 0], device=DEVICE))
    assert (o == 0).all()


def test_bad_input():
    q = torch.randn(1, 32, 2, 16, device=DEVICE)
    v = torch.randn(1, 32, 4, 8, device=DEVICE)
    h = torch.randn(1, 1, 4, 16, 8, device=DEVICE)
    f = chunk_fwd_o
    with pytest.raises(ValueError, match="chunk_fwd_o: q must be 4-D"):
        f(q[0], q, v, h)
    with pytest.raises(ValueError, match=r"k must have shape \[B, T, H, K\] = \[1, 32, 2, 16\]"):
        f(q, q[..., :8], v, h)
    with pytest.raises(ValueError, match="multiple of the key heads"):
        f(q, q, v[:, :, :3], h[:, :, :3])
    with pytest.raises(ValueError, match=r"HV = 4 \(v.shape\[2\]\) must be a positive multiple of the key heads H = 0"):
        f(q[:, :, :0], q[:, :, :0], v, h)  # no key heads: a clear error (was a ZeroDivisionError)
    with pytest.raises(ValueError, match=r"h must have shape \[B, NT, HV, K, V\] = \[1, 2, 4, 16, 8\]"):
        f(q, q, v, h, chunk_size=16)
    with pytest.raises(ValueError, match=r"h must have shape \[B, NT, HV, K, V\] = \[1, 2, 4, 16, 8\]"):
        f(q, q, v, h, cu_seqlens=torch.tensor([0, 5, 32], device=DEVICE))
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV\]"):
        f(q, q, v, h, g=torch.zeros(1, 32, 2, device=DEVICE))
    with pytest.raises(ValueError, match="K must be <= 256"):
        x = torch.randn(1, 4, 1, 257, device=DEVICE)
        f(x, x, v[:, :4, :1], torch.randn(1, 1, 1, 257, 8, device=DEVICE))
    with pytest.raises(ValueError, match="chunk_size must be 16, 32 or 64"):
        f(q, q, v, h, chunk_size=8)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        f(q, q, v, h, scale=float("inf"))
    with pytest.raises(ValueError, match="batch size must be 1"):
        f(q.expand(2, -1, -1, -1), q.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), h.expand(2, -1, -1, -1, -1),
          cu_seqlens=torch.tensor([0, 32], device=DEVICE))
    with pytest.raises(TypeError, match="float64"):
        f(q, q, v.double(), h)
    with pytest.raises(TypeError, match="h must have dtype"):
        f(q, q, v, h.int())


@pytest.mark.gpu
@pytest.mark.parametrize("B,T", [(1, 1024), (2, 1024), (1, 4096)])
def test_gpu_real_sizes(B, T):
    for dtype in DTYPES:
        check(*make(B, T, 32, 32, 128, 128, dtype, seed=20))
    check(*make(B, T, 16, 32, 128, 128, torch.bfloat16, seed=21))                 # GVA
    check(*make(B, T, 32, 32, 100, 100, torch.bfloat16, seed=22))


@pytest.mark.gpu
def test_gpu_varlen():
    for dtype in DTYPES:
        check(*make(1, 1024, 32, 32, 128, 128, dtype, cu=SEG13, seed=23), cu=SEG13)
