"""chunk_kda (SPEC 1.11.3): the full operator against the float64 token-by-token oracle, forward and
backward; gate robustness (hard resets, constant and saturated gates), bitwise causality, varlen, GVA,
tail tokens, keyword policy, errors, registration. CPU: reduced shapes under the interpreter (fp32,
fp16); [gpu]: the SPEC shapes in bf16."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops import backends
from mindspeed_ops.api.triton.chunk_kda import ChunkKDAFunction, chunk_kda
from mindspeed_ops.ops.kda import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, snapshot, threshold
from tests.conftest import DEVICE, DTYPES, ON_GPU

GPU_DTYPES = [torch.bfloat16] if ON_GPU else []


def _inputs(B, T, H, HV, K, V, dtype, *, s=0.1, h0=True, N=None, seed=0, beta_one=False, gate=None):
    """Shared recipe of SPEC 1.10.0 with per-channel gates ``[B, T, HV, K]`` (``gate`` overrides g)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V)
    g = F.logsigmoid(torch.rand(B, T, HV, K, generator=gen)) / s
    g = g * (torch.rand(B, T, HV, K, generator=gen) > 0.2)
    if gate is not None:
        g = gate(g, gen)
    beta = torch.ones(B, T, HV) if beta_one else torch.sigmoid(r(B, T, HV))
    init = r(N or B, HV, K, V) if h0 else None
    return (q.to(DEVICE, dtype), k.to(DEVICE, dtype), v.to(DEVICE, dtype), g.to(DEVICE), beta.to(DEVICE, dtype),
            None if init is None else init.to(DEVICE))


def _leaves(ts):
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in ts]


def _run(ins, *, chunk_size=64, cu_seqlens=None, l2=True, final=True, seed=7, dht=True):
    """Ours: (o, final, grads of q, k, v, g, beta, h0) under loss Σ o·do (+ Σ final·dht)."""
    ls = _leaves(ins)
    o, fs = chunk_kda(*ls[:5], initial_state=ls[5], output_final_state=final, use_qk_l2norm_in_kernel=l2,
                      cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen).to(DEVICE, o.dtype)
    loss = (o.float() * do.float()).sum()
    if final and dht:
        loss = loss + (fs * torch.randn(fs.shape, generator=gen).to(DEVICE)).sum()
    loss.backward()
    return o, fs, [None if t is None else t.grad for t in ls]


def _reference(ins, do, dht, *, chunk_size, cu_seqlens, l2, oracle, group=None):
    """Float64 oracle outputs and gradients (loss Σ o·do + Σ final·dht). ``group``: q/k heads per reference
    call (heads are independent; slicing bounds the memory the chunked reference keeps for autograd)."""
    H, HV = ins[0].shape[2], ins[2].shape[2]
    G = HV // H
    group = group or H
    outs, finals, grads = [], [], []
    for h0_ in range(0, H, group):
        hs, vs = slice(h0_, h0_ + group), slice(h0_ * G, (h0_ + group) * G)
        part = [None if t is None else t[:, :, hs] if i < 2 else t[:, vs] if i == 5 else t[:, :, vs]
                for i, t in enumerate(ins)]
        refs = _leaves([None if t is None else t.double() for t in part])
        fn = ref.recurrent_kda_ref if oracle == "recurrent" else ref.chunk_kda_ref
        kw = {} if oracle == "recurrent" else {"chunk_size": chunk_size}
        ro, rf = fn(*refs[:5], initial_state=refs[5], output_final_state=True, use_qk_l2norm_in_kernel=l2,
                    cu_seqlens=cu_seqlens, **kw)
        loss = (ro * do[:, :, vs].double()).sum()
        if dht is not None:
            loss = loss + (rf * dht[:, vs].double()).sum()
        loss.backward()
        outs.append(ro.detach())
        finals.append(rf.detach())
        grads.append([None if t is None else t.grad for t in refs])
    cat = [None if grads[0][i] is None else torch.cat([g[i] for g in grads], 1 if i == 5 else 2) for i in range(6)]
    return torch.cat(outs, 2), torch.cat(finals, 1), cat


def _compare(ins, *, chunk_size=64, cu_seqlens=None, l2=True, final=True, oracle="recurrent", group=None):
    """Ours vs the float64 oracle: o, final state and every gradient (thresholds keyed by q.dtype)."""
    before = snapshot(*ins)
    o, fs, grads = _run(ins, chunk_size=chunk_size, cu_seqlens=cu_seqlens, l2=l2, final=final)
    assert o.dtype == ins[0].dtype and (fs is None) == (not final)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen).to(DEVICE, o.dtype)
    dht = torch.randn(fs.shape, generator=gen).to(DEVICE) if final else None
    ro, rf, rgrads = _reference(ins, do, dht, chunk_size=chunk_size, cu_seqlens=cu_seqlens, l2=l2, oracle=oracle,
                                group=group)
    tol = {c: threshold(c, ins[0].dtype) for c in ("LA-o", "LA-d", "LA-g")}
    assert_close("o", ro, o, tol["LA-o"])
    if final:
        assert fs.dtype == torch.float32
        assert_close("final_state", rf, fs, tol["LA-o"])
    for name, r_, t, g, cls in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), rgrads, ins, grads,
                                   ("LA-d", "LA-d", "LA-d", "LA-g", "LA-g", "LA-d")):
        if t is None:
            assert g is None
            continue
        assert g is not None and g.dtype == t.dtype, name
        assert torch.isfinite(g).all(), name
        assert_close(name, r_, g, tol[cls])
    assert_unchanged(before, *ins)
    return o, fs, grads


# ------------------------------------------------------------------------------------------------
# accuracy against the oracle
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,shape,BT", [
    (torch.float32, (2, 63, 2, 2, 16, 16), 64),       # partial chunk, B = 2
    (torch.float16, (1, 70, 1, 2, 32, 24), 32),       # GVA, 3 chunks of 32
])
def test_matches_oracle(dtype, shape, BT):
    _compare(_inputs(*shape, dtype), chunk_size=BT)


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_gva_chunk32(dtype):
    """SPEC: chunk_size 32 with varlen ``[0, 31, 96, 160]`` (reduced: ``[0, 31, 60, 75]``), each sequence
    with its own h0 and dht."""
    cu = torch.tensor([0, 31, 60, 75], dtype=torch.int32, device=DEVICE)
    _compare(_inputs(1, 75, 1, 2, 16, 16, dtype, N=3), chunk_size=32, cu_seqlens=cu)


@pytest.mark.parametrize("K,V", [(60, 100), (8, 8)])
def test_head_dims_no_l2_no_final_no_h0(K, V):
    _compare(_inputs(1, 37, 1, 1, K, V, torch.float32, h0=False, s=1.0), chunk_size=32, l2=False, final=False)


def test_hard_reset_gates():
    """Gates −1000 (per channel) at 5% of the positions: finite and within thresholds."""
    def gate(g, gen):
        hit = torch.rand(g.shape[:3] + (1,), generator=gen) < 0.05
        hit[:, 5] = True
        return torch.where(hit, torch.full_like(g, -1000.0), g)
    _compare(_inputs(1, 64, 1, 2, 16, 16, torch.float16, gate=gate), chunk_size=64)


def _half_channels_strong(g, gen):
    """Strong decay (the recipe's) on the first half of the channels, 10x milder on the rest."""
    strong = torch.arange(g.shape[-1]) < g.shape[-1] // 2
    return torch.where(strong, g, g * 0.1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("regime", ["mild", "mixed_tiles", "spread_29", "spread_31"])
def test_gate_regimes(dtype, regime):
    """Mild gates, strong decay on half the channels (K = 64: two key tiles of 32 in different regimes), and
    constant gates whose 16-row spread sits just inside (15 · 1.95) and outside (15 · 2.1) 30, the bound of a
    gate-dependent diagonal-block path tried in the tenth session (kda.md): within thresholds vs the oracle."""
    gate = {"mild": None, "mixed_tiles": _half_channels_strong,
            "spread_29": lambda g, gen: torch.full_like(g, -1.95), "spread_31": lambda g, gen: torch.full_like(g, -2.1)}
    _compare(_inputs(1, 80, 1, 2, 64, 16, dtype, s=1.0 if regime == "mild" else 0.1, gate=gate[regime]),
             chunk_size=64)


@pytest.mark.parametrize("value", [-8.0, -4.0, 0.0])
def test_constant_gates(value):
    """SPEC: constant per-channel gates (reduced from T = 8192): finite, within thresholds vs fp64."""
    _compare(_inputs(1, 96, 1, 1, 16, 16, torch.float16, gate=lambda g, gen: torch.full_like(g, value)),
             chunk_size=64, oracle="chunked")


@pytest.mark.parametrize("dtype", DTYPES)
def test_saturated_gates_gradients_finite(dtype):
    """``g ≡ −5`` everywhere (``T = 256``, reduced on CPU): pairwise gate differences up to 5·63 never reach an
    ``exp``; gradients finite and within thresholds."""
    shape = (1, 256, 2, 2, 128, 128) if ON_GPU else (1, 128, 1, 1, 16, 16)
    _compare(_inputs(*shape, dtype, gate=lambda g, gen: torch.full_like(g, -5.0)), chunk_size=64, oracle="chunked")


def test_varlen_padding_gates_2100_style_short_sequences_and_tail():
    """Short sequences (1-3 tokens; reduced from 2100 with HV = 32), −1000 gates on padding-like positions,
    tail tokens (past cu_seqlens[-1]) holding NaN/huge values: o and gradients there are 0."""
    gen = torch.Generator().manual_seed(3)
    lens = torch.randint(1, 4, (12,), generator=gen).tolist()
    cu_list = [0]
    for n in lens:
        cu_list.append(cu_list[-1] + n)
    T = cu_list[-1] + 5
    ins = list(_inputs(1, T, 1, 1, 16, 16, torch.float32, N=len(lens)))
    g = ins[3].clone()
    for s in cu_list[1:-1]:
        g[:, s] = -1000.0                                    # first token of every sequence: hard reset
    ins[3] = g
    for i in (0, 1, 2, 4):
        t = ins[i].clone()
        t[:, cu_list[-1]:] = float("nan")
        ins[i] = t
    g = ins[3].clone()
    g[:, cu_list[-1]:] = 1e30
    ins[3] = g
    cu = torch.tensor(cu_list, dtype=torch.int32, device=DEVICE)
    o, _, grads = _compare(tuple(ins), chunk_size=32, cu_seqlens=cu, oracle="chunked")
    end = cu_list[-1]
    assert torch.equal(o[:, end:], torch.zeros_like(o[:, end:]))
    for gr in grads[:5]:
        assert torch.equal(gr[:, end:], torch.zeros_like(gr[:, end:]))


def test_g_none_equals_zero_gates_and_beta_one():
    q, k, v, _, beta, h0 = _inputs(1, 40, 1, 1, 16, 16, torch.float32, beta_one=True)
    a = chunk_kda(q, k, v, None, beta, initial_state=h0, output_final_state=True, chunk_size=32)
    b = chunk_kda(q, k, v, torch.zeros(1, 40, 1, 16, device=DEVICE), beta, initial_state=h0,
                  output_final_state=True, chunk_size=32)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_only_final_state_and_t1():
    """``loss = final_state.sum()`` (no gradient for o) and ``T = 1`` with fp16 inputs and an fp32 h0."""
    ins = _leaves(_inputs(1, 1, 1, 1, 16, 16, torch.float16))
    o, fs = chunk_kda(*ins[:5], initial_state=ins[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
                      chunk_size=32)
    fs.sum().backward()
    refs = _leaves([t.double() for t in _inputs(1, 1, 1, 1, 16, 16, torch.float16)])
    ro, rf = ref.recurrent_kda_ref(*refs[:5], initial_state=refs[5], output_final_state=True,
                                   use_qk_l2norm_in_kernel=True)
    rf.sum().backward()
    assert_close("o", ro, o, "LA-o")
    assert_close("final", rf, fs, threshold("LA-o", torch.float16))
    assert torch.equal(ins[0].grad, torch.zeros_like(ins[0].grad))      # q does not reach the final state
    for name, a, b in zip(("dk", "dv", "dg", "dbeta", "dh0"), refs[1:], ins[1:]):
        assert_close(name, a.grad, b.grad, threshold("LA-g", torch.float16))


def test_empty_input_and_zero_length_sequences():
    """``T = 0``: empty output, the state passes through (and its gradient); a zero-length sequence keeps
    its initial state."""
    q = torch.randn(1, 0, 1, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(1, 0, 2, 16, device=DEVICE, requires_grad=True)
    g = torch.zeros(1, 0, 2, 16, device=DEVICE, requires_grad=True)
    b = torch.zeros(1, 0, 2, device=DEVICE, requires_grad=True)
    h0 = torch.randn(1, 2, 16, 16, device=DEVICE, requires_grad=True)
    o, fs = chunk_kda(q, q, v, g, b, initial_state=h0, output_final_state=True, chunk_size=32)
    assert o.shape == (1, 0, 2, 16) and torch.equal(fs, h0)
    fs.sum().backward()
    assert torch.equal(h0.grad, torch.ones_like(h0))
    ins = _inputs(1, 10, 1, 1, 16, 16, torch.float32, N=3)
    cu = torch.tensor([0, 4, 4, 10], device=DEVICE)
    _, fs, _ = _compare(ins, chunk_size=32, cu_seqlens=cu)
    assert torch.equal(fs[1], ins[5][1])


# ------------------------------------------------------------------------------------------------
# causality (bitwise)
# ------------------------------------------------------------------------------------------------

def _causal_pair(ins, P, *, chunk_size, cu_seqlens=None, lo=None, later_gate=None):
    """Outputs before ``P`` and gradients of positions before ``P`` (loss on ``o[:P]`` only) for the inputs
    and for a copy whose positions ``>= P`` (up to ``lo`` when given) are replaced by fresh finite values
    (gates: ``later_gate`` when given)."""
    gen = torch.Generator().manual_seed(11)
    alt = []
    for i, t in enumerate(ins[:5]):
        t2 = t.clone()
        fresh = torch.randn(t2[:, P:lo].shape, generator=gen).to(DEVICE)
        if i == 3 and later_gate is not None:
            fresh = torch.full_like(fresh, later_gate)
        elif i == 3:
            fresh = -0.7 * (0.75 + 0.25 * torch.rand(t2[:, P:lo].shape, generator=gen)).to(DEVICE)
        elif i == 4:
            fresh = torch.sigmoid(fresh)
        t2[:, P:lo] = fresh.to(t2.dtype)
        alt.append(t2)
    alt.append(ins[5])
    out = []
    for xs in (ins, alt):
        ls = _leaves(xs)
        o, _ = chunk_kda(*ls[:5], initial_state=ls[5], use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens,
                         chunk_size=chunk_size)
        do = torch.randn(o[:, :P].shape, generator=torch.Generator().manual_seed(5)).to(DEVICE, o.dtype)
        (o[:, :P].float() * do.float()).sum().backward()
        out.append((o[:, :P], [t.grad[:, :P] for t in ls[:5]], ls[5].grad))
    return out


def _assert_same_prefix(pair, h0=True):
    """``_causal_pair``'s two runs agree bitwise: outputs, gradients (and ``dh0``)."""
    (o1, g1, h1), (o2, g2, h2) = pair
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)
    if h0:
        assert torch.equal(h1, h2)


def _causal_inputs(T, dtype, H=1, HV=2, K=16, V=16, N=None):
    def gate(g, gen):
        return -0.7 * (0.75 + 0.25 * torch.rand(g.shape, generator=gen))
    return _inputs(1, T, H, HV, K, V, dtype, beta_one=True, gate=gate, N=N)


@pytest.mark.parametrize("dtype", DTYPES + GPU_DTYPES)
@pytest.mark.parametrize("BT", [32, 64])
def test_causality_t22_p21(dtype, BT):
    """SPEC: ``T = 22, P = 21`` (reduced heads on CPU), β = 1, ``g = −0.7·(0.75 + 0.25·rand)`` per channel;
    perturbing position 21 leaves ``o[:21]`` and every gradient of positions ``< 21`` bitwise equal."""
    shape = dict(H=4, HV=4, K=128, V=128) if ON_GPU else {}
    _assert_same_prefix(_causal_pair(_causal_inputs(22, dtype, **shape), 21, chunk_size=BT))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("BT", [32, 64])
@pytest.mark.parametrize("later_gate", [-1000.0, -40.0])
def test_causality_hard_gate_later_in_the_block(dtype, BT, later_gate):
    """A hard gate from position 21 on (inside the 16-row block 16..31): ``o[:21]`` and the gradients of positions
    ``< 21`` stay bitwise equal (a kernel choosing its diagonal-block path by the whole block's gates broke
    this: review repro, tenth session, kda.md)."""
    _assert_same_prefix(_causal_pair(_causal_inputs(22, dtype), 21, chunk_size=BT, later_gate=later_gate))


def test_causality_t130_p70_and_varlen():
    _assert_same_prefix(_causal_pair(_causal_inputs(130, torch.float32, HV=1), 70, chunk_size=64), h0=False)
    # varlen: perturb the tail of the second sequence [20, 60) from position 45 on
    cu = torch.tensor([0, 20, 60], device=DEVICE)
    _assert_same_prefix(_causal_pair(_causal_inputs(60, torch.float32, HV=1, N=2), 45, chunk_size=32,
                                     cu_seqlens=cu), h0=False)


# ------------------------------------------------------------------------------------------------
# API: non-contiguous inputs, determinism, reference backend, keywords, errors, registration
# ------------------------------------------------------------------------------------------------

def test_hf_call_non_contiguous_and_determinism():
    """HF Kimi-Linear call: q/k/v views of one projection (non-contiguous), fp32 g, sigmoid beta, in-kernel
    l2norm, fp32 h0, int32 cu_seqlens; a transposed (non-contiguous) upstream gradient; two runs bitwise
    equal."""
    dtype = torch.float16
    q, k, v, g, beta, h0 = _inputs(1, 40, 2, 2, 16, 16, dtype, N=2)
    qkv = torch.cat([q, k, v], dim=-1)
    q2, k2, v2 = qkv[..., :16], qkv[..., 16:32], qkv[..., 32:]
    assert not q2.is_contiguous()
    cu = torch.tensor([0, 25, 40], dtype=torch.int32, device=DEVICE)
    _compare((q2, k2, v2, g, beta, h0), chunk_size=32, cu_seqlens=cu)
    runs = []
    for _ in range(2):
        ls = _leaves((q2, k2, v2, g, beta, h0))
        o, fs = chunk_kda(*ls[:5], initial_state=ls[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
                          cu_seqlens=cu)
        do = torch.randn(o.shape[:2] + (o.shape[3], o.shape[2]), generator=torch.Generator().manual_seed(1))
        do = do.to(DEVICE, o.dtype).transpose(-1, -2)                 # non-contiguous gradient
        (o.float() * do.float()).sum().backward()
        runs.append([o, fs] + [t.grad for t in ls])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_stride0_gradient_and_reference_backend():
    """``o.sum()`` (stride-0 upstream gradient); the ``reference`` backend gives the same results."""
    ins = _inputs(1, 20, 1, 1, 16, 16, torch.float32)
    res = []
    for backend in ("triton", "reference"):
        with backends.use_backend(backend, ops=["chunk_kda"]):
            ls = _leaves(ins)
            o, fs = chunk_kda(*ls[:5], initial_state=ls[5], output_final_state=True, chunk_size=32)
            (o.sum() + fs.sum()).backward()
            res.append([o, fs] + [t.grad for t in ls])
    for name, a, b in zip(("o", "final", "dq", "dk", "dv", "dg", "dbeta", "dh0"), *res):
        assert_close(name, b, a, 1e-5)


def test_keyword_policy():
    q, k, v, g, beta, _ = _inputs(1, 8, 1, 1, 16, 16, torch.float32, h0=False)
    with pytest.raises(ValueError, match="head_first"):
        chunk_kda(q, k, v, g, beta, head_first=True)
    with pytest.raises(NotImplementedError, match="use_gate_in_kernel"):
        chunk_kda(q, k, v, g, beta, use_gate_in_kernel=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        a = chunk_kda(q, k, v, g, beta, safe_gate=True, lower_bound=-5.0, disable_recompute=True, head_first=False,
                      cu_seqlens_cpu=None, chunk_size=32)
    b = chunk_kda(q, k, v, g, beta, chunk_size=32)
    assert torch.equal(a[0], b[0])
    with pytest.warns(UserWarning, match="some_kda_flag"):
        chunk_kda(q, k, v, g, beta, some_kda_flag=1, chunk_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        chunk_kda(q, k, v, g, beta, some_kda_flag=1, chunk_size=32)  # once per process
    o, fs = ChunkKDAFunction.apply(q, k, v, g, beta, None, None, True, False, None, 32)
    assert torch.equal(o, b[0]) and fs.dtype == torch.float32


def test_bad_input():
    q, k, v, g, beta, h0 = _inputs(2, 8, 2, 4, 16, 16, torch.float32)
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, HV\] = \[2, 8, 4\], got \[2, 8, 4, 1\]"):
        chunk_kda(q, k, v, g, beta[..., None])
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV, K\] = \[2, 8, 4, 16\]"):
        chunk_kda(q, k, v, g[..., 0], beta)
    with pytest.raises(ValueError, match="multiple"):
        chunk_kda(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(ValueError, match="HV = 0 .* positive multiple"):  # no value heads: rejected, not a crash
        chunk_kda(q, k, v[:, :, :0], g[:, :, :0], beta[:, :, :0], use_qk_l2norm_in_kernel=True)
    with pytest.raises(ValueError, match=r"chunk_size must be one of \(32, 64\), got 16"):
        chunk_kda(q, k, v, g, beta, chunk_size=16)
    with pytest.raises(ValueError, match="batch size must be 1"):
        chunk_kda(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 8], device=DEVICE))
    with pytest.raises(ValueError, match="initial_state"):
        chunk_kda(q, k, v, g, beta, initial_state=h0[:1])
    with pytest.raises(TypeError, match="initial_state must have dtype float32"):
        chunk_kda(q, k, v, g, beta, initial_state=h0.to(torch.bfloat16))
    with pytest.raises(TypeError):
        chunk_kda(q, k, v.half(), g, beta)
    with pytest.raises(TypeError, match="float64"):
        chunk_kda(q.double(), k.double(), v.double(), g, beta)
    with pytest.raises(ValueError, match="K must be <= 256"):
        x = torch.randn(1, 2, 1, 300, device=DEVICE)
        chunk_kda(x, x, v[:1, :2, :1], torch.zeros(1, 2, 1, 300, device=DEVICE), beta[:1, :2, :1])


def test_registration_and_compile():
    ins = _inputs(1, 20, 1, 1, 16, 16, torch.float32)
    ls = _leaves(ins)
    torch.library.opcheck(torch.ops.mindspeed_ops.chunk_kda, (*ls[:5], 0.25, ls[5], True, True, None, 32),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    f = torch.compile(lambda *a: chunk_kda(*a, initial_state=ls[5], output_final_state=True,
                                           use_qk_l2norm_in_kernel=True, chunk_size=32), fullgraph=True)
    o, fs = f(*ls[:5])
    o2, fs2 = chunk_kda(*ls[:5], initial_state=ls[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
                        chunk_size=32)
    assert torch.allclose(o, o2, atol=1e-6) and torch.allclose(fs, fs2, atol=1e-6)
    (o.sum() + fs.sum()).backward()
    assert all(t.grad is not None for t in ls)


# ------------------------------------------------------------------------------------------------
# GPU: the SPEC shapes
# ------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 1000, 4, 4, 128, 128), (2, 63, 4, 4, 64, 64), (2, 1500, 4, 4, 256, 256),
                                   (2, 512, 2, 8, 64, 64)])
def test_real_size(dtype, shape):
    _compare(_inputs(*shape, dtype), oracle="chunked")


@pytest.mark.gpu
def test_real_chunk32_varlen_bf16():
    _compare(_inputs(2, 160, 2, 2, 64, 64, torch.bfloat16), chunk_size=32, oracle="chunked")
    cu = torch.tensor([0, 31, 96, 160], dtype=torch.int32, device=DEVICE)
    _compare(_inputs(1, 160, 2, 2, 64, 64, torch.bfloat16, N=3), chunk_size=32, cu_seqlens=cu, oracle="chunked")


@pytest.mark.gpu
@pytest.mark.parametrize("value", [-8.0, -4.0, 0.0])
def test_real_constant_gates_bf16(value):
    _compare(_inputs(1, 8192, 1, 1, 128, 128, torch.bfloat16, gate=lambda g, gen: torch.full_like(g, value)),
             oracle="chunked")


@pytest.mark.gpu
def test_real_2100_short_sequences_and_tail():
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 4, (2100,), generator=gen).tolist()
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    _compare(_inputs(1, int(cu[-1]), 16, 32, 64, 64, torch.bfloat16, N=2100), cu_seqlens=cu, oracle="chunked")
    cu = torch.tensor([0, 211, 985], dtype=torch.int32, device=DEVICE)
    _compare(_inputs(1, 1000, 4, 4, 128, 128, torch.bfloat16, N=2), cu_seqlens=cu, oracle="chunked")


@pytest.mark.bigmem
@pytest.mark.gpu
def test_real_kimi_shape_bf16():
    _compare(_inputs(1, 8192, 96, 96, 128, 128, torch.bfloat16, s=1.0), oracle="chunked", group=4)


@pytest.mark.gpu
def test_real_determinism_bf16():
    ins = _inputs(1, 4096, 16, 16, 128, 128, torch.bfloat16)
    first = None
    for _ in range(10):
        o, fs, grads = _run(ins)
        cur = [o, fs] + grads
        if first is None:
            first = cur
        else:
            assert all(torch.equal(a, b) for a, b in zip(first, cur))


@pytest.mark.large
@pytest.mark.exclusive
def test_large_last_row_bf16():
    """``B·T·HV·K > 2^31``: forward and backward run; the last batch row matches the reference on that row.
    Inputs are drawn on the device and are the leaves themselves (no second copy): the backward alone
    needs ~110 GB here, so the case runs alone (``exclusive``)."""
    B, T, H, K = 2100, 1024, 8, 128
    torch.manual_seed(0)
    dt = torch.bfloat16
    q, k, v = (torch.randn(B, T, H, K, device=DEVICE, dtype=dt) for _ in range(3))
    g = F.logsigmoid(torch.rand(B, T, H, K, device=DEVICE)) * 10.0
    beta = torch.sigmoid(torch.randn(B, T, H, device=DEVICE)).to(dt)
    ls = [t.requires_grad_(True) for t in (q, k, v, g, beta)]
    last = _leaves([t[-1:].detach().double() for t in ls])
    o, _ = chunk_kda(*ls, use_qk_l2norm_in_kernel=True)
    o[-1].float().sum().backward()
    o_last = o[-1:].detach().clone()
    del o
    ro, _ = ref.chunk_kda_ref(*last, use_qk_l2norm_in_kernel=True)
    ro.sum().backward()
    assert_close("o[-1]", ro, o_last, "LA-o")
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), last, ls):
        assert_close(name, a.grad, b.grad[-1:], threshold("LA-g", torch.bfloat16))
