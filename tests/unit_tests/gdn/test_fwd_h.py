"""chunk_gated_delta_rule_fwd_h (SPEC 1.10.5): kernel vs the float64 reference on realistic w/u (built
by the stage references from the SPEC 1.10.0 recipe), states, GVA, gk, strong decay, varlen with
tails, many short sequences, layouts, errors."""
import pytest
import torch

from mindspeed_ops.api.triton.chunk_gated_delta_rule_fwd_h import chunk_gated_delta_rule_fwd_h
from mindspeed_ops.api.triton.utils import prepare_chunk_indices
from mindspeed_ops.ops.gdn import reference_fwd as ref
from mindspeed_ops.testing import (assert_close, assert_unchanged, dirty_tail, non_contiguous, snapshot, threshold,
                                   to_ref)
from tests.conftest import DEVICE, DTYPES

SEG13 = [0, 31, 64, 65, 130, 200, 333, 390, 512, 600, 777, 800, 1000, 1024]


def make(B, T, H, HV, K, V, dtype, *, BT=64, gate="g", gate_scale=1.0, h0=True, cu=None, seed=0):
    """``(k, w, u, g, gk, h0)`` on DEVICE: k/w/u in ``dtype``, gates and state fp32."""
    x = ref.stage_inputs(B, T, H, HV, K, V, chunk_size=BT, gate=gate, gate_scale=gate_scale, h0=h0,
                         cu_seqlens=None if cu is None else torch.tensor(cu), seed=seed)
    k, w, u = (x[n].to(dtype).to(DEVICE) for n in ("k", "w", "u"))
    g, gk, s0 = (None if x[n] is None else x[n].float().to(DEVICE) for n in ("G", "gk", "h0"))
    return k, w, u, g, gk, s0


def check(k, w, u, g=None, gk=None, h0=None, *, BT=64, cu=None, final=True, save=True, **kw):
    """Run the kernel, compare every output with the float64 reference of the same (rounded) inputs
    (LA-o keyed by k's dtype), check dtypes, shapes, no input mutation and zero tail rows."""
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    before = snapshot(k, w, u, g, gk, h0)
    h, vn, fs = chunk_gated_delta_rule_fwd_h(k, w, u, g=g, gk=gk, initial_state=h0, output_final_state=final,
                                             chunk_size=BT, save_new_value=save, cu_seqlens=cu_t, **kw)
    assert_unchanged(before, k, w, u, g, gk, h0, names=["k", "w", "u", "g", "gk", "h0"])
    rk, rw, ru, rg, rgk, rh0 = to_ref(k, w, u, g, gk, h0)
    wh, wv, wf = ref.chunk_gated_delta_rule_fwd_h_ref(rk, rw, ru, rg, rgk, rh0, final, BT, save,
                                                      None if cu is None else torch.tensor(cu))
    tol = threshold("LA-o", k.dtype)
    assert h.dtype == k.dtype and h.shape == wh.shape
    assert_close("h", wh, h, tol)
    if save:
        assert vn.dtype == u.dtype and vn.shape == u.shape
        assert_close("v_new", wv, vn, tol)
        if cu is not None:
            assert (vn[:, cu[-1]:] == 0).all(), "tail v_new must be 0"
    else:
        assert vn is None
    if final:
        assert fs.dtype == torch.float32 and fs.shape == wf.shape
        assert_close("final_state", wf, fs, tol)
    else:
        assert fs is None
    return h, vn, fs


CPU_SHAPES = [  # (B, T, H, HV, K, V, BT)
    (1, 256, 1, 2, 64, 64, 64),
    (2, 150, 1, 2, 32, 48, 32),      # partial last chunk
    (1, 120, 1, 4, 32, 32, 16),      # GVA HV = 4H
    (1, 130, 1, 1, 100, 100, 64),    # K = V = 100: masked K blocks and V tiles
    (1, 70, 1, 1, 256, 16, 32),      # K = 256: four K blocks
    (1, 40, 1, 1, 8, 16, 16),        # tiny head dims
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,H,HV,K,V,BT", CPU_SHAPES)
def test_matches_reference(B, T, H, HV, K, V, BT, dtype, poisoned):
    k, w, u, g, _, h0 = make(B, T, H, HV, K, V, dtype, BT=BT, seed=1)
    check(k, w, u, g, h0=h0, BT=BT)


def test_states_optional_outputs_and_no_gate(poisoned):
    k, w, u, g, _, h0 = make(1, 100, 1, 2, 32, 32, torch.float32, BT=32, seed=2)
    check(k, w, u, g, h0=None, BT=32)                       # no initial state
    check(k, w, u, g, h0=h0.half(), BT=32, final=False)     # fp16 state, no final state
    check(k, w, u, g, h0=h0, BT=32, save=False)             # v_new not saved
    k2, w2, u2, _, _, h02 = make(1, 100, 1, 2, 32, 32, torch.float32, BT=32, gate=None, seed=3)
    a = check(k2, w2, u2, None, h0=h02, BT=32)
    b = chunk_gated_delta_rule_fwd_h(k2, w2, u2, g=torch.zeros(1, 100, 2, device=DEVICE), initial_state=h02,
                                     output_final_state=True, chunk_size=32)
    for x, y in zip(a, b):  # g=None equals g = zeros
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gk_variant(dtype, poisoned):
    """Per-channel gates against the per-channel formula; uniform channels equal the scalar gate."""
    k, w, u, _, gk, h0 = make(1, 96, 1, 2, 48, 32, dtype, BT=32, gate="gk", seed=4)
    check(k, w, u, gk=gk, h0=h0, BT=32)
    k, w, u, g, _, h0 = make(1, 96, 1, 2, 48, 32, dtype, BT=32, seed=5)
    a = chunk_gated_delta_rule_fwd_h(k, w, u, g=g, initial_state=h0, output_final_state=True, chunk_size=32)
    b = chunk_gated_delta_rule_fwd_h(k, w, u, gk=g[..., None].expand(-1, -1, -1, 48), initial_state=h0,
                                     output_final_state=True, chunk_size=32)
    for x, y in zip(a, b):
        assert_close("gk == g", x, y, threshold("LA-o", dtype))


def test_gate_rows_ahead_at_sequence_edges(poisoned):
    """The per-channel decay rows are loaded one chunk step ahead (``_gate_row``): empty sequences, one whole chunk,
    partial last chunks, sequences ending on a chunk boundary and tail tokens, with two key blocks (fp32 K = 80)."""
    cu = [0, 0, 16, 16, 41, 64, 64, 70]
    k, w, u, _, gk, h0 = make(1, 72, 1, 2, 80, 24, torch.float32, BT=16, gate="gk", cu=cu, seed=41)
    check(k, w, u, gk=gk, h0=h0, BT=16, cu=cu)


def test_one_block_state_with_gates_and_varlen(poisoned):
    """fp16 K = 100 (the interpreter keeps fp16, so the state is one 128-row block, ``scan_block_k``) with
    per-channel gates and varlen."""
    cu = [0, 37, 90]
    k, w, u, _, gk, h0 = make(1, 96, 1, 2, 100, 60, torch.float16, BT=32, gate="gk", cu=cu, seed=31)
    check(k, w, u, gk=gk, h0=h0, BT=32, cu=cu)
    k, w, u, g, _, h0 = make(1, 96, 1, 2, 100, 60, torch.float16, BT=32, cu=cu, seed=32)
    check(k, w, u, g, h0=h0, BT=32, cu=cu)


@pytest.mark.parametrize("T,BT", [(75, 64), (63, 16)])
def test_strong_decay_finite(T, BT, poisoned):
    """g = logsigmoid(rand)/0.01 (≈ −31…−69 per token) with a partial last chunk: finite, within LA-o."""
    for gate in ("g", "gk"):
        k, w, u, g, gk, h0 = make(2, T, 1, 2, 32, 32, torch.float16, BT=BT, gate=gate, gate_scale=0.01, seed=6)
        h, vn, fs = check(k, w, u, g, gk, h0, BT=BT)
        assert torch.isfinite(h).all() and torch.isfinite(vn).all() and torch.isfinite(fs).all()


@pytest.mark.parametrize("cu", [[0, 15], [0, 0, 40, 40, 97], [0, 1, 2, 67, 130, 131], SEG13[:5]])
def test_varlen_with_tail(cu, poisoned):
    T = cu[-1] + 9
    for dtype in DTYPES:
        k, w, u, g, _, h0 = make(1, T, 1, 2, 32, 32, dtype, BT=32, cu=cu, seed=7)
        clean = check(k, w, u, g, h0=h0, BT=32, cu=cu)
        cu_t = torch.tensor(cu, device=DEVICE)
        dirty = chunk_gated_delta_rule_fwd_h(*(dirty_tail(t, cu[-1]) for t in (k, w, u, g)), initial_state=h0,
                                             output_final_state=True, chunk_size=32, cu_seqlens=cu_t)
        for a, b in zip(clean, dirty):
            assert torch.equal(a, b), "tail tokens changed an output"
    k, w, u, _, gk, h0 = make(1, T, 1, 2, 32, 16, torch.float32, BT=16, gate="gk", cu=cu, seed=8)
    check(k, w, u, gk=gk, h0=h0, BT=16, cu=cu)


def test_many_short_sequences(poisoned):
    """Sequences of length 1-3 (the [gpu] case has 2100 of them with HV = 32)."""
    gen = torch.Generator().manual_seed(9)
    lens = torch.randint(1, 4, (12,), generator=gen)
    cu = [0] + torch.cumsum(lens, 0).tolist()
    k, w, u, g, _, h0 = make(1, cu[-1], 1, 2, 16, 16, torch.float32, cu=cu, seed=10)
    check(k, w, u, g, h0=h0, cu=cu)


def test_layouts_determinism_and_chunk_indices():
    k, w, u, g, _, h0 = make(1, 80, 2, 4, 32, 24, torch.float32, BT=16, seed=11)
    base = chunk_gated_delta_rule_fwd_h(k, w, u, g, initial_state=h0, output_final_state=True, chunk_size=16)
    out = chunk_gated_delta_rule_fwd_h(non_contiguous(k), w.transpose(1, 2).contiguous().transpose(1, 2),
                                       non_contiguous(u, "transpose"), non_contiguous(g),
                                       initial_state=non_contiguous(h0, "transpose"), output_final_state=True,
                                       chunk_size=16)
    again = chunk_gated_delta_rule_fwd_h(k, w, u, g, initial_state=h0, output_final_state=True, chunk_size=16)
    for a, b, c in zip(base, out, again):
        assert torch.equal(a, b) and torch.equal(a, c)
    cu = torch.tensor([0, 30, 80], device=DEVICE)
    a = chunk_gated_delta_rule_fwd_h(k[:1], w[:1], u[:1], g[:1], chunk_size=16, cu_seqlens=cu)
    b = chunk_gated_delta_rule_fwd_h(k[:1], w[:1], u[:1], g[:1], chunk_size=16, cu_seqlens=cu,
                                     chunk_indices=prepare_chunk_indices(cu, 16))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="chunk_indices must have shape \\[NT, 2\\] = \\[6, 2\\]"):
        chunk_gated_delta_rule_fwd_h(k[:1], w[:1], u[:1], g[:1], chunk_size=16, cu_seqlens=cu,
                                     chunk_indices=prepare_chunk_indices(cu, 32))


def test_reference_path(monkeypatch):
    """Without a Triton backend (CPU, no interpreter) the float64-capable reference runs: same contract."""
    import mindspeed_ops.ops.gdn.fwd_h as mod

    k, w, u, g, _, h0 = make(1, 70, 1, 2, 32, 16, torch.float16, BT=32, cu=[0, 30, 70], seed=12)
    cu = torch.tensor([0, 30, 70], device=DEVICE)
    kern = chunk_gated_delta_rule_fwd_h(k, w, u, g, initial_state=h0, output_final_state=True, chunk_size=32,
                                        cu_seqlens=cu)
    monkeypatch.setattr(mod, "use_triton", lambda device: False)
    refo = chunk_gated_delta_rule_fwd_h(k, w, u, g, initial_state=h0, output_final_state=True, chunk_size=32,
                                        cu_seqlens=cu)
    for name, a, b in zip(("h", "v_new", "final_state"), refo, kern):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert_close(name, a, b, threshold("LA-o", torch.float16))


@pytest.mark.parametrize("K,dtype,gate,deep", [(128, torch.bfloat16, None, True), (100, torch.float16, "kg", True),
                                               (128, torch.float32, None, False), (256, torch.bfloat16, None, False),
                                               (128, torch.bfloat16, "gk", False)])
def test_deep_pipelines_only_where_they_fit(K, dtype, gate, deep):
    """4-stage configs (fastest on the H200 at the issues' points) are kept for 16-bit K <= 128 (KDA's pre-gated k
    too), where their estimated buffers fit; not for fp32, K = 256 or a per-channel gate tile."""
    from mindspeed_ops.ops.gdn import fwd_h
    from mindspeed_ops.ops.gdn.common import scan_block_k

    BK, NK = scan_block_k(K, dtype)
    t = torch.empty(0, dtype=dtype)
    kept = fwd_h._prune(fwd_h._configs(), {"V": 128, "k_ptr": t, "w_ptr": t, "u_ptr": t}, BK=BK, NK=NK, BT=64,
                        USE_GK=gate is not None, KG=gate == "kg")
    assert kept
    assert any(c.num_stages == 4 for c in kept) == deep, [str(c) for c in kept]


def test_empty():
    k, w, u = (torch.empty(2, 0, 1, 16, device=DEVICE) for _ in range(3))
    h0 = torch.randn(2, 1, 16, 16, device=DEVICE)
    h, vn, fs = chunk_gated_delta_rule_fwd_h(k, w, u, initial_state=h0, output_final_state=True)
    assert h.shape == (2, 0, 1, 16, 16) and vn.shape == (2, 0, 1, 16) and torch.equal(fs, h0)
    k, w, u = (torch.randn(1, 10, 1, 16, device=DEVICE) for _ in range(3))
    h, vn, fs = chunk_gated_delta_rule_fwd_h(k, w, u, initial_state=h0, output_final_state=True,
                                             cu_seqlens=torch.tensor([0, 0, 0], device=DEVICE))
    assert h.shape == (1, 0, 1, 16, 16) and (vn == 0).all() and torch.equal(fs, h0)


def test_bad_input():
    k = torch.randn(1, 32, 2, 16, device=DEVICE)
    w = torch.randn(1, 32, 4, 16, device=DEVICE)
    u = torch.randn(1, 32, 4, 8, device=DEVICE)
    f = chunk_gated_delta_rule_fwd_h
    op = "chunk_gated_delta_rule_fwd_h"
    with pytest.raises(ValueError, match=f"{op}: k must be 4-D"):
        f(k[0], w, u)
    with pytest.raises(ValueError, match=r"w must have shape \[B, T, HV, K\] = \[1, 32, 4, 16\], got \[1, 32, 4, 15\]"):
        f(k, w[..., :15], u)
    with pytest.raises(ValueError, match="multiple of the key heads"):
        f(k, w[:, :, :3], u[:, :, :3])
    with pytest.raises(ValueError, match=r"HV = 4 \(w.shape\[2\]\) must be a positive multiple of the key heads H = 0"):
        f(k[:, :, :0], w, u)  # no key heads: a clear error (was a ZeroDivisionError)
    with pytest.raises(ValueError, match=r"u must have shape \[B, T, HV, V\]"):
        f(k, w, u[:, :31])
    with pytest.raises(ValueError, match="K must be <= 256"):
        f(torch.randn(1, 4, 1, 257, device=DEVICE), torch.randn(1, 4, 1, 257, device=DEVICE), u[:, :4, :1])
    with pytest.raises(ValueError, match="not both"):
        f(k, w, u, g=torch.zeros(1, 32, 4, device=DEVICE), gk=torch.zeros(1, 32, 4, 16, device=DEVICE))
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV\]"):
        f(k, w, u, g=torch.zeros(1, 32, 4, 1, device=DEVICE))
    with pytest.raises(ValueError, match=r"gk must have shape \[B, T, HV, K\]"):
        f(k, w, u, gk=torch.zeros(1, 32, 4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="chunk_size must be 16, 32 or 64, got 128"):
        f(k, w, u, chunk_size=128)
    with pytest.raises(ValueError, match=r"initial_state must have shape \[N, HV, K, V\] = \[1, 4, 16, 8\]"):
        f(k, w, u, initial_state=torch.zeros(2, 4, 16, 8, device=DEVICE))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[N, HV, K, V\] = \[2, 4, 16, 8\]"):
        f(k, w, u, initial_state=torch.zeros(1, 4, 16, 8, device=DEVICE),
          cu_seqlens=torch.tensor([0, 5, 32], device=DEVICE))
    with pytest.raises(ValueError, match="batch size must be 1"):
        f(k.expand(2, -1, -1, -1), w.expand(2, -1, -1, -1), u.expand(2, -1, -1, -1),
          cu_seqlens=torch.tensor([0, 32], device=DEVICE))
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\] must be <= T = 32"):
        f(k, w, u, cu_seqlens=torch.tensor([0, 33], device=DEVICE))
    with pytest.raises(TypeError, match="float64"):
        f(k.double(), w, u)
    with pytest.raises(TypeError, match="u must have dtype"):
        f(k, w, u.int())


@pytest.mark.gpu
@pytest.mark.parametrize("B,T", [(1, 1024), (2, 1024), (1, 4096)])
def test_gpu_real_sizes(B, T):
    for dtype in DTYPES:
        k, w, u, g, _, h0 = make(B, T, 32, 32, 128, 128, dtype, seed=20)
        check(k, w, u, g, h0=h0)
    k, w, u, g, _, h0 = make(B, T, 16, 32, 128, 128, torch.bfloat16, seed=21)     # GVA
    check(k, w, u, g, h0=h0)
    k, w, u, _, gk, h0 = make(B, T, 32, 32, 128, 128, torch.bfloat16, gate="gk", seed=22)
    check(k, w, u, gk=gk, h0=h0)


@pytest.mark.bigmem
@pytest.mark.gpu
def test_gpu_varlen_and_short_sequences():
    for dtype in DTYPES:
        k, w, u, g, _, h0 = make(1, 1024, 32, 32, 128, 128, dtype, cu=SEG13, seed=23)
        check(k, w, u, g, h0=h0, cu=SEG13)
    gen = torch.Generator().manual_seed(24)
    lens = torch.randint(1, 4, (2100,), generator=gen)
    cu = [0] + torch.cumsum(lens, 0).tolist()
    # K = V = 64: the point is 2100 sequences; at 128 the per-sequence states and their fp64 comparison
    # take ~48 GB and minutes of CPU time
    k, w, u, g, _, h0 = make(1, cu[-1] + 5, 16, 32, 64, 64, torch.bfloat16, cu=cu, seed=25)
    check(k, w, u, g, h0=h0, cu=cu)
