"""The fused kkt + solve_tril kernel of the GDN forward (``ops/gdn/kkt_solve.py``): ``Ainv`` against the
unfused ``kkt.forward -> solve_tril.forward`` pipeline it replaces (fp32: rel-RMS <= 1e-6, no absolute
floor; fp16/bf16: TRIL) and against the float64 reference; chunk sizes, key dims (one and two key tiles),
GVA, varlen with length-1 sequences and a tail the kernel must neither read nor write, strong decay, the
folded l2norm rstd, no gate / no beta, determinism, the ``chunk.FUSED_KKT_SOLVE`` switch through the full
operator, and the compile-only check (sm_80 / sm_90) with its register and spill figures."""
import importlib

import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops import api
from mindspeed_ops.ops.gdn import cumsum, kkt, kkt_solve
from mindspeed_ops.ops.gdn import reference as ref
from mindspeed_ops.ops.gdn.common import device_tables
from mindspeed_ops.testing import assert_close, assert_unchanged, snapshot, threshold
from tests.conftest import COMPILE_ONLY_MARKS, DEVICE, DTYPES

solve_tril_mod = importlib.import_module("mindspeed_ops.ops.gdn.solve_tril")  # the package exports the function
chunk_mod = importlib.import_module("mindspeed_ops.ops.gdn.chunk")


def _inputs(T, H, HV, K, BT, dtype, cu=None, seed=0, s=1.0, raw_k=False, tail_poison=False):
    """``(k, G, beta, rk)``: k L2-normalised in ``dtype`` (``raw_k``: raw k and its fp32 rstd ``rk``, the
    l2norm folded in as the GDN forward does), fp32 chunk-local cumsum ``G`` of ``logsigmoid(x)/s`` with
    ~20% exact zeros, sigmoid beta in ``dtype``. ``tail_poison``: NaN / huge values in every input row
    past ``cu[-1]`` (SPEC 0.3: the kernel must not read them)."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(1, T, H, K, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(1, T, HV, generator=gen, dtype=torch.float64)) / s
    g = g * (torch.rand(1, T, HV, generator=gen, dtype=torch.float64) > 0.2)
    beta = torch.sigmoid(torch.randn(1, T, HV, generator=gen, dtype=torch.float64))
    cu_cpu = None if cu is None else torch.tensor(cu)
    G = ref.chunk_local_cumsum_ref(g, BT, cu_seqlens=cu_cpu).float()
    rk = None
    if raw_k:
        k = k * 3.0
        rk = (1.0 / torch.sqrt((k.to(dtype).double() ** 2).sum(-1) + 1e-6)).float().to(DEVICE)
    else:
        k = F.normalize(k, dim=-1)
    k, beta, G = k.to(dtype).to(DEVICE), beta.to(dtype).to(DEVICE), G.to(DEVICE)
    if tail_poison:
        e = cu[-1]
        k[:, e:] = float("nan")
        G[:, e:] = -1e30
        beta[:, e:] = float("inf")
        if rk is not None:
            rk[:, e:] = float("nan")
    return k, G, beta, rk


def _run(k, G, beta, rk, HV, BT, cu=None, out=None):
    """``(fused Ainv, unfused Ainv)`` in k's dtype, the launchers called as ``chunk.forward`` calls them."""
    cu_t, idx = device_tables(cu, BT, k.device)
    fused = kkt_solve.forward(k, G, beta, HV, cu, cu_t, BT, k.dtype, idx, rk=rk, out=out)
    A = kkt.forward(k, G, None, beta, HV, cu, cu_t, BT, torch.float32, idx, rk=rk)
    unfused = solve_tril_mod.forward(A, cu, cu_t, k.dtype, idx)
    return fused, unfused


def _oracle(k, G, beta, rk, BT, cu=None):
    """float64 ``(I + A)^{-1}`` per chunk from the references of SPEC 1.10.2 / 1.10.3."""
    kd = k.double().cpu()
    if rk is not None:
        kd = kd * rk.double().cpu()[..., None]
    cu_cpu = None if cu is None else torch.tensor(cu)
    e = kd.shape[1] if cu is None else cu[-1]
    Gd = None if G is None else G.double().cpu()[:, :e]
    bd = None if beta is None else beta.double().cpu()[:, :e]
    A = ref.chunk_scaled_dot_kkt_ref(kd[:, :e], Gd, bd, cu_seqlens=cu_cpu, chunk_size=BT)
    return ref.solve_tril_ref(A, cu_seqlens=cu_cpu)


def _check(fused, unfused, oracle, dtype):
    """fp32: fused == unfused to rel-RMS 1e-6 with no absolute floor; 16-bit: TRIL (both rounded once from
    fp32 values that agree to fp32 rounding). Both against the float64 oracle: TRIL."""
    assert fused.dtype == unfused.dtype == dtype and fused.shape == unfused.shape
    # not bitwise under the interpreter either: its dots are numpy's BLAS, whose summation order can depend on the
    # operands' shapes (the fused and unfused kernels' tiles differ) and on the CPU (equal on the CI machines up to
    # the twenty-sixth session, 15 cases 1 ulp apart on an AMD EPYC host in the twenty-seventh)
    if dtype == torch.float32:
        assert_close("Ainv fused vs unfused", unfused.double(), fused, 1e-6, err_atol=0.0)
    else:
        assert_close("Ainv fused vs unfused", unfused.double(), fused, threshold("TRIL", dtype))
    e = oracle.shape[1]
    assert_close("Ainv fused vs float64", oracle, fused[:, :e], threshold("TRIL", dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [16, 60, 100, 128])
@pytest.mark.parametrize("BT", [16, 32, 64])
def test_matches_unfused(BT, K, dtype, poisoned):
    """GVA (HV = 2H), a partial last chunk, one (K <= 64) and two (K = 100, 128) key tiles; K = 100 with the
    l2norm rstd folded in (``rk``)."""
    T, H, HV = 2 * BT + 7, 1, 2
    k, G, beta, rk = _inputs(T, H, HV, K, BT, dtype, seed=K + BT, raw_k=K == 100)
    before = snapshot(k, G, beta, rk)
    fused, unfused = _run(k, G, beta, rk, HV, BT)
    assert_unchanged(before, k, G, beta, rk)
    _check(fused, unfused, _oracle(k, G, beta, rk, BT), dtype)


@pytest.mark.parametrize("BT", [16, 32, 64])
def test_varlen_tail_untouched(BT):
    """Odd lengths, length-1 sequences, a zero-length one and a tail after cu_seqlens[-1] whose inputs hold
    NaN / huge values: every row inside a sequence is written (the output buffer starts NaN there), the tail
    rows of a caller's buffer keep their values, and a launcher-allocated output has zero tail rows."""
    cu = [0, 1, 18, 19, 19, 52 + BT, 53 + BT]
    T, H, HV, K = cu[-1] + 6, 1, 2, 60  # GVA at the fewest heads (interpreter time)
    k, G, beta, rk = _inputs(T, H, HV, K, BT, torch.float32, cu=cu, seed=BT, raw_k=True, tail_poison=True)
    out = torch.full((1, T, HV, BT), float("nan"), device=DEVICE)
    out[:, cu[-1]:] = 123.0
    fused, unfused = _run(k, G, beta, rk, HV, BT, cu=cu, out=out)
    assert fused.data_ptr() == out.data_ptr()
    assert (out[:, cu[-1]:] == 123.0).all(), "the kernel wrote a tail row"
    e = cu[-1]
    assert torch.isfinite(out[:, :e]).all(), "a row inside a sequence was not written (or is not finite)"
    _check(out[:, :e], unfused[:, :e], _oracle(k, G, beta, rk, BT, cu), torch.float32)
    alloc, _ = _run(k, G, beta, rk, HV, BT, cu=cu)
    assert torch.equal(alloc[:, :e], out[:, :e]) and (alloc[:, e:] == 0).all() and (unfused[:, e:] == 0).all()
    # length-1 sequences: their single row is [1, 0, ...]
    for t in (0, 18, cu[-2]):
        assert torch.equal(alloc[0, t, :, 0], torch.ones(HV, device=DEVICE)) and (alloc[0, t, :, 1:] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_gva_dtypes(dtype, poisoned):
    BT, cu = 32, [0, 1, 40, 41, 77]
    k, G, beta, rk = _inputs(cu[-1] + 3, 2, 4, 100, BT, dtype, cu=cu, seed=5, tail_poison=True)
    fused, unfused = _run(k, G, beta, rk, 4, BT, cu=cu)
    assert (fused[:, cu[-1]:] == 0).all()
    _check(fused, unfused, _oracle(k, G, beta, rk, BT, cu), dtype)


@pytest.mark.parametrize("BT", [16, 64])
def test_strong_decay_finite(BT, poisoned):
    """``g = logsigmoid(x)/0.01`` (gates down to about -70 per token, cumsums of thousands): finite and equal."""
    k, G, beta, rk = _inputs(2 * BT + 11, 1, 2, 128, BT, torch.float32, seed=3, s=0.01)
    assert G.min() < -500
    fused, unfused = _run(k, G, beta, rk, 2, BT)
    assert torch.isfinite(fused).all()
    _check(fused, unfused, _oracle(k, G, beta, rk, BT), torch.float32)


def test_no_gate_no_beta(poisoned):
    """``G = None`` (no decay) and ``beta = None`` (1) as kkt.forward supports them."""
    BT = 32
    k, G, beta, rk = _inputs(75, 1, 1, 60, BT, torch.float32, seed=9)
    for g_, b_ in ((None, beta), (G, None), (None, None)):
        fused, unfused = _run(k, g_, b_, None, 1, BT)
        _check(fused, unfused, _oracle(k, g_, b_, None, BT), torch.float32)


def test_deterministic():
    BT, cu = 64, [0, 1, 70, 150]
    k, G, beta, rk = _inputs(155, 2, 4, 128, BT, torch.float32, cu=cu, seed=11, raw_k=True)
    cu_t, idx = device_tables(cu, BT, k.device)
    a = kkt_solve.forward(k, G, beta, 4, cu, cu_t, BT, k.dtype, idx, rk=rk)
    b = kkt_solve.forward(k, G, beta, 4, cu, cu_t, BT, k.dtype, idx, rk=rk)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


# ------------------------------------------------------------------------------------------------
# the switch in chunk.py, through the full operator
# ------------------------------------------------------------------------------------------------

def switch_both_ways(monkeypatch, attr: str, counted: dict, expect: dict) -> None:
    """The full operator (fp32, GVA, varlen, l2norm folded in, an initial state, chunk 16) with
    ``chunk.<attr>`` set True, then False: the launchers in ``counted`` (``{key: (module, name)}``) are
    called as ``expect[setting]`` says (cumulative counts), and both settings give the same ``o``, final
    state and gradients. Shared by the tests of the forward's fusion switches."""
    calls = dict.fromkeys(counted, 0)
    for key, (mod, name) in counted.items():
        def f(*a, _real=getattr(mod, name), _key=key, **kw):
            calls[_key] += 1
            return _real(*a, **kw)
        monkeypatch.setattr(mod, name, f)
    gen = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 1, 30, 75], device=DEVICE)
    q, k = torch.randn(1, 80, 1, 60, generator=gen), torch.randn(1, 80, 1, 60, generator=gen)
    v = torch.randn(1, 80, 2, 20, generator=gen)
    g = F.logsigmoid(torch.randn(1, 80, 2, generator=gen))
    beta = torch.sigmoid(torch.randn(1, 80, 2, generator=gen))
    h0 = torch.randn(3, 2, 60, 20, generator=gen)
    ins = [t.to(DEVICE) for t in (q, k, v, g, beta, h0)]
    res = {}
    for fused in (True, False):
        monkeypatch.setattr(chunk_mod, attr, fused)
        leaves = [t.clone().requires_grad_(True) for t in ins]
        o, fs = api.chunk_gated_delta_rule(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                                           use_qk_l2norm_in_kernel=True, cu_seqlens=cu, chunk_size=16)
        (o * torch.cos(o)).sum().add(fs.sum()).backward()
        res[fused] = [o, fs] + [t.grad for t in leaves]
        assert calls == expect[fused], calls
    for name, a, b in zip(("o", "final", "dq", "dk", "dv", "dg", "dbeta", "dh0"), res[False], res[True]):
        assert_close(name, a.double(), b, 1e-6, err_atol=0.0)


def test_switch_default_fused_and_same_result(monkeypatch):
    """Default: the forward runs the fused kernel (one launch instead of kkt + solve_tril); both settings of
    ``chunk.FUSED_KKT_SOLVE`` give the same ``o``, final state and gradients."""
    assert chunk_mod.FUSED_KKT_SOLVE is chunk_mod._env_switch("MINDSPEED_OPS_GDN_FUSED_KKT_SOLVE")
    switch_both_ways(monkeypatch, "FUSED_KKT_SOLVE", {"fused": (kkt_solve, "forward"), "kkt": (kkt, "forward")},
                     {True: {"fused": 1, "kkt": 0}, False: {"fused": 1, "kkt": 1}})


@pytest.mark.parametrize("value,on", [("0", False), ("off", False), ("False", False), ("no", False), ("1", True),
                                      ("", True), ("yes", True)])
def test_env_switch_values(monkeypatch, value, on):
    monkeypatch.setenv("MINDSPEED_OPS_GDN_FUSED_KKT_SOLVE", value)
    assert chunk_mod._env_switch("MINDSPEED_OPS_GDN_FUSED_KKT_SOLVE") is on


def test_env_switch_unknown_value_warns(monkeypatch):
    monkeypatch.setenv("MINDSPEED_OPS_GDN_FUSED_KKT_SOLVE", "maybe")
    with pytest.warns(UserWarning, match="MINDSPEED_OPS_GDN_FUSED_KKT_SOLVE='maybe'"):
        assert chunk_mod._env_switch("MINDSPEED_OPS_GDN_FUSED_KKT_SOLVE") is True


# ------------------------------------------------------------------------------------------------
# compile-only (DESIGN 7): real sizes, sm_80 / sm_90
# ------------------------------------------------------------------------------------------------

#: Measured with triton 3.6 / its ptxas at [1, 8192, 16 -> 32 heads, K = 128], BT = 64, rk given, one warp
#: (kkt_solve.CONFIG): bf16/fp16 keys 255 registers and ~1 KB of spills on both archs (solve_tril_kernel
#: alone at one warp: 255 registers and ~1.1 KB on sm_90, 64 registers and ~3 KB on sm_80; kkt_fwd_kernel,
#: four warps: 111-168 registers, no spills); fp32 keys 255 registers and ~4.4 KB. BT = 16 and 32 do not spill
#: (72 / 128 registers for half-precision keys), except fp32 keys at BT = 32 on sm_90 (255 registers, 28
#: bytes). The bounds catch worse.
SPILL_BYTES = {64: 6144, 32: 64, 16: 0}


@COMPILE_ONLY_MARKS[0]
@COMPILE_ONLY_MARKS[1]
def test_kernel_compiles_for_gpu():
    from mindspeed_ops import compile_check as cc
    from tests.conftest import assert_compiled

    cu = torch.tensor([0, 100, 8192])
    with cc.Recorder(dry=True) as rec:
        for dt in (torch.float32, torch.float16):
            k = torch.empty(1, 8192, 16, 128, dtype=dt)
            G, beta, rk = torch.empty(1, 8192, 32), torch.empty(1, 8192, 32, dtype=dt), torch.empty(1, 8192, 16)
            for BT in (16, 32, 64):
                kkt_solve.forward(k, G, beta, 32, None, None, BT, dt, None, rk=rk)
            cu_t, idx = device_tables(cu.tolist(), 64, "cpu")
            kkt_solve.forward(k, G, beta, 32, cu.tolist(), cu_t, 64, dt, idx)
    launches = cc.dedupe(rec.launches)
    assert {la.qualname for la in launches} == {"kkt_solve_fwd_kernel"}
    bf16 = [cc.as_bf16(la) for la in launches if "*fp16" in la.signature.values()]
    results = cc.compile_launches(launches + bf16, archs=(80, 90), jobs=2)

    def allowed(r):
        BT = next(bt for bt in SPILL_BYTES if f" BT={bt} " in f" {r.launch.constexpr_str()} ")
        return SPILL_BYTES[BT] if BT == 64 or r.launch.signature["k_ptr"] == "*fp32" else 0
    assert_compiled(results, allowed)
