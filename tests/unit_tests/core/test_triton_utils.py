"""mindspeed_ops.triton_utils: the interpreter shim itself (DESIGN 7).

The kernels below are defined at import time, after tests/conftest.py has set TRITON_INTERPRET=1 on a
machine without CUDA, so on CPU they run under the interpreter and on a GPU they are compiled.
"""
import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from mindspeed_ops import triton_utils as tu  # noqa: E402
from tests.conftest import DEVICE, ON_GPU  # noqa: E402

interpreter_only = pytest.mark.skipif(not tu.interpreting(), reason="demonstrates a trap of the CPU interpreter")


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, c, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m).to(tl.float32)
    tl.store(y_ptr + offs, (x * c).to(y_ptr.dtype.element_ty), mask=m)


def _scale(x, y, c):
    n = x.numel()
    _scale_kernel[(tu.cdiv(n, 256),)](x, y, n, c, BLOCK=256)
    return y


@triton.jit
def _row_sum_kernel(x_ptr, y_ptr, n_rows, stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, n_rows):  # i is a Python int under the interpreter, a tensor when compiled
        acc += tl.load(x_ptr + tu.i64(i) * stride + offs).to(tl.float32)
    tl.store(y_ptr + offs, acc)


@triton.jit
def _unary_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, OP: tl.constexpr = "sigmoid"):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    if OP == "sigmoid_fast":
        y = tu.sigmoid_fast_f32(x)
    elif OP == "exp":
        y = tl.exp(x)
    elif OP == "exp_fast":
        y = tu.exp_fast_f32(x)
    else:
        y = tu.sigmoid_f32(x)
    tl.store(y_ptr + offs, y, mask=m)


_CONFIGS = [triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})]


@tu.autotune(_CONFIGS, key=["n"])
@triton.jit
def _double_tuned(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


def _grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


# ---------------------------------------------------------------------------------------------
# autotune


def test_autotune_runs_and_keeps_one_config_under_interpreter():
    x = torch.randn(300, device=DEVICE)
    y = torch.full_like(x, float("nan"))
    _double_tuned[_grid(300)](x, y, 300)
    assert torch.equal(y, x * 2)
    if tu.interpreting():
        assert len(_double_tuned.configs) == 1 and _double_tuned.configs[0].kwargs == {"BLOCK": 32}
    else:
        assert len(_double_tuned.configs) == len(_CONFIGS)


def test_autotune_drops_prune_configs_by_under_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    tuner = tu.autotune(_CONFIGS, key=["n"], prune_configs_by={"early_config_prune": lambda c, a, **k: c})(
        _double_tuned.fn)
    assert len(tuner.configs) == 1


def test_autotune_keeps_its_choices_on_disk(monkeypatch):
    """cache_results: a later process reuses the timed choice (same configs run to run, SPEC 0.6); under the
    interpreter Triton turns it off itself."""
    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return lambda fn: fn

    monkeypatch.setattr(triton, "autotune", fake)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    tu.autotune(_CONFIGS, key=["n"])(lambda: None)
    assert seen["cache_results"] is True
    tu.autotune(_CONFIGS, key=["n"], cache_results=False)(lambda: None)
    assert seen["cache_results"] is False


def _lean_tuner(monkeypatch, key, seconds):
    """A ``triton_utils.autotune`` tuner over ``_CONFIGS`` that keeps all three configs (the launches still run
    interpreted on CPU) and times each config as ``seconds(BLOCK)`` (the interpreter cannot time)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    tuner = tu.autotune(_CONFIGS, key=key, cache_results=False)(_double_tuned.fn)
    monkeypatch.setattr(tuner, "_bench", lambda *a, config, **k: [seconds(config.kwargs["BLOCK"])], raising=False)
    return tuner


def test_fast_tuner_reuses_tritons_key_and_choice(monkeypatch):
    """Several configs: launches whose key was tuned skip Triton's generic key building (host time) but use
    the very tuple Triton caches the choice under, so its disk cache and ``cache`` stay shared; a new key is
    tuned by Triton's own path. Timing is faked (the interpreter cannot time): the 64-wide config wins."""
    tuner = _lean_tuner(monkeypatch, ["n"], lambda block: 1.0 if block == 64 else 2.0)
    assert type(tuner).__name__ == "_CachedKeyAutotuner" and len(tuner.configs) == 3
    seen = []
    run = tuner.fn.run
    monkeypatch.setattr(tuner.fn, "run", lambda *a, **k: (seen.append(k["BLOCK"]), run(*a, **k))[1])
    for n in (300, 300, 100, 300):
        x = torch.randn(n, device=DEVICE)
        y = torch.full_like(x, float("nan"))
        tuner.nargs = "untouched"  # Triton's run resets it, the fast path does not
        tuner[_grid(n)](x, y, n)
        assert torch.equal(y, x * 2)
        key = (n, str(x.dtype), str(y.dtype))  # what Triton's own run keys the choice by
        assert tu.tuning_key(tuner, (x, y, n), {"grid": None, "warmup": False}) == key
        assert tuner.cache[key].kwargs == {"BLOCK": 64}
        seen.append(tuner.nargs)
    assert seen == [64, None, 64, "untouched", 64, None, 64, "untouched"], seen
    assert len(tuner.cache) == 2


def test_fast_tuner_key_by_keyword_and_unknown_key_names(monkeypatch):
    """The key argument passed by keyword and a key name that is no kernel argument (Triton leaves it out): the
    cached tuple is still Triton's own, and the second launch takes the lean path."""
    tuner = _lean_tuner(monkeypatch, ["not_an_argument", "n"], float)
    x = torch.randn(77, device=DEVICE)
    for fast in (False, True):
        y = torch.full_like(x, float("nan"))
        tuner.nargs = "untouched"
        tuner[_grid(77)](x, y, n=77)
        assert torch.equal(y, x * 2) and (tuner.nargs == "untouched") is fast
    assert list(tuner.cache) == [tu.tuning_key(tuner, (x, y), {"n": 77})] == [(77, str(x.dtype), str(y.dtype))]
    assert tuner.cache[(77, str(x.dtype), str(y.dtype))].kwargs == {"BLOCK": 32}


def test_fast_tuner_yields_to_a_patched_autotuner_run(monkeypatch):
    """compile_check's recorder patches ``Autotuner.run`` on the class: while it is patched, launches of a lean
    tuner go through the patch even with their key cached."""
    from triton.runtime.autotuner import Autotuner

    tuner = _lean_tuner(monkeypatch, ["n"], float)
    x = torch.randn(50, device=DEVICE)
    tuner[_grid(50)](x, torch.empty_like(x), 50)  # tuned and cached
    seen = []
    orig = Autotuner.run

    def patched(self, *a, **k):
        seen.append(self)
        return orig(self, *a, **k)

    monkeypatch.setattr(Autotuner, "run", patched)
    assert not tu._is_tritons_run(Autotuner.run) and tu._is_tritons_run(orig)
    tuner[_grid(50)](x, torch.empty_like(x), 50)
    assert seen == [tuner]


@interpreter_only
def test_stock_autotune_with_several_configs_fails_under_interpreter():
    """The trap the shim avoids: plain triton.autotune with >1 config cannot run interpreted."""
    raw = triton.autotune(configs=_CONFIGS, key=["n"])(_double_tuned.fn)
    x = torch.randn(100)
    with pytest.raises(RuntimeError, match="active drivers"):
        raw[_grid(100)](x, torch.empty_like(x), 100)


# ---------------------------------------------------------------------------------------------
# bf16 through kernel_input / kernel_dtype / finish


def _bf16_case():
    x = (torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16).to(DEVICE)
    return x, 1.2345  # a scale that makes most products need rounding


def test_bf16_round_trip_matches_torch_rne():
    x, c = _bf16_case()
    xi = tu.kernel_input(x)
    y = torch.empty(x.shape, dtype=tu.kernel_dtype(torch.bfloat16), device=DEVICE)
    out = tu.finish(_scale(xi, y, c), torch.bfloat16)
    want = (x.float() * c).to(torch.bfloat16)  # torch: fp32 math, one round-to-nearest-even
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    if tu.interpreting():
        assert xi.dtype == torch.float32 and y.dtype == torch.float32
    else:
        assert xi is x and y.dtype == torch.bfloat16


@interpreter_only
def test_naive_bf16_store_truncates_under_interpreter():
    """The trap the shim avoids: an in-kernel fp32 -> bf16 store truncates instead of rounding."""
    x, c = _bf16_case()
    naive = _scale(x, torch.empty_like(x), c)  # bf16 in, bf16 out, no shim
    want = (x.float() * c).to(torch.bfloat16)
    assert not torch.equal(naive, want)
    f = x.float() * c
    truncated = (f.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)  # drop the low 16 bits
    assert torch.equal(naive, truncated)


def test_shim_is_noop_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(4).to(torch.bfloat16)
    assert not tu.interpreting()
    assert tu.kernel_input(x) is x
    assert tu.kernel_dtype(torch.bfloat16) == torch.bfloat16


def test_shim_only_touches_bf16(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for dt in (torch.float32, torch.float16):
        x = torch.randn(4).to(dt)
        assert tu.kernel_input(x) is x and tu.kernel_dtype(dt) == dt
    assert tu.kernel_input(None) is None
    assert tu.kernel_dtype(torch.bfloat16) == torch.float32
    y = torch.randn(4)
    assert tu.finish(y, torch.float32) is y
    assert tu.finish(y, torch.bfloat16).dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------
# i64 on loop variables, sigmoid_f32


def test_i64_on_python_int_loop_variable():
    x = torch.randn(5, 16, device=DEVICE)
    y = torch.empty(16, device=DEVICE)
    _row_sum_kernel[(1,)](x, y, 5, x.stride(0), BLOCK=16)
    torch.testing.assert_close(y, x.sum(0))


def test_sigmoid_f32():
    x = torch.linspace(-30, 30, 301, device=DEVICE)
    y = torch.empty_like(x)
    _unary_kernel[(tu.cdiv(301, 128),)](x, y, 301, BLOCK=128)
    torch.testing.assert_close(y, torch.sigmoid(x), rtol=1e-5, atol=1e-7)


def test_sigmoid_fast_f32():
    """Within a few ulp of the exact sigmoid over the whole range (0 or a subnormal where the exact one is
    subnormal; 0 and 1 at the infinities, NaN kept). Compiled, bitwise equal to sigmoid_f32 wherever that one is
    normal (its SASS is the same ex2/rcp pair plus range fix-ups), and 0 where it is subnormal (x in about
    (-88.72, -87.34)); the interpreter runs sigmoid_f32's formula itself."""
    special = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 15.9, -15.9, 87.0, -87.0, -87.34, -87.5, -88.0, 88.5, -88.5,
                            104.0, -104.0, float("inf"), float("-inf"), float("nan")])
    x = torch.cat([torch.linspace(-120, 120, 4001), torch.randn(4000) * 8, special]).to(DEVICE)
    n = x.numel()
    y, plain = torch.full_like(x, 7.0), torch.full_like(x, 7.0)
    _unary_kernel[(tu.cdiv(n, 128),)](x, y, n, BLOCK=128, OP="sigmoid_fast")
    _unary_kernel[(tu.cdiv(n, 128),)](x, plain, n, BLOCK=128)
    exact = torch.sigmoid(x.double())
    # a few ulp, plus the rounding of x * log2(e) that 2^(...) scales by |x| (tl.exp has it too); 0 where the
    # exact value is subnormal (flush to zero)
    err = (y.double() - exact).abs() / exact.clamp_min(2.0 ** -126)
    tiny = 2.0 ** -126 * (1 + 1e-5)  # flush to zero near the smallest normal, however the exact value rounds
    ok = (err <= 2.0 ** -23 * (4 + 2 * x.double().abs())) | ((exact < tiny) & (y.abs() < tiny))
    assert bool((ok | (x.isnan() & y.isnan())).all()), x[~ok][:8].tolist()
    assert y[-3:-1].tolist() == [1.0, 0.0]
    if tu.interpreting():
        torch.testing.assert_close(y, plain, rtol=0, atol=0, equal_nan=True)
    else:
        normal = plain.abs() >= 2.0 ** -126
        torch.testing.assert_close(y[normal], plain[normal], rtol=0, atol=0, equal_nan=True)
        assert bool((y[~normal & ~plain.isnan()] == 0).all())


def test_exp_fast_f32():
    """Equal to tl.exp wherever that is a normal number (compiled: bitwise; the same MUFU ex2 without the subnormal
    fix-ups), 0 where it is subnormal; inf, 0 and NaN at the extremes."""
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 88.0, 88.8, -87.0, -87.3, -87.4, -88.0, -103.0, -104.0, -1000.0,
                            float("inf"), float("-inf"), float("nan")])
    x = torch.cat([torch.linspace(-120, 90, 4001), torch.randn(4000) * 8, special]).to(DEVICE)
    n = x.numel()
    y, plain = torch.full_like(x, 7.0), torch.full_like(x, 7.0)
    _unary_kernel[(tu.cdiv(n, 128),)](x, y, n, BLOCK=128, OP="exp_fast")
    _unary_kernel[(tu.cdiv(n, 128),)](x, plain, n, BLOCK=128, OP="exp")
    normal = plain.abs() >= 2.0 ** -126
    torch.testing.assert_close(y[normal], plain[normal], rtol=0, atol=0, equal_nan=True)
    assert bool((y[~normal & ~plain.isnan()].abs() < 2.0 ** -126).all())
    assert y[-3:].isinf()[0] and y[-2] == 0 and y[-1].isnan()
    exact = torch.exp(x.double())
    ok = ((y.double() - exact).abs() <= exact * 2.0 ** -23 * (4 + 2 * x.double().abs())) | (exact < 2.0 ** -126)
    ok |= (exact > torch.finfo(torch.float32).max) & y.isinf()  # overflow, as tl.exp
    assert bool((ok | x.isnan() | x.isinf()).all()), x[~ok][:8].tolist()


# ---------------------------------------------------------------------------------------------
# environment check and host helpers


def test_check_interpreter_env_numpy(monkeypatch):
    import numpy as np

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(np, "__version__", "2.4.0")
    with pytest.raises(RuntimeError, match=r"numpy 2.4.0.*install 'numpy<2.4'"):
        tu.check_interpreter_env()
    monkeypatch.setattr(np, "__version__", "3.0.1")
    with pytest.raises(RuntimeError):
        tu.check_interpreter_env()
    monkeypatch.setattr(np, "__version__", "2.3.5")
    tu.check_interpreter_env()
    monkeypatch.setattr(np, "__version__", "2.4.0")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    tu.check_interpreter_env()  # only matters under the interpreter


def test_installed_numpy_is_fine_for_the_interpreter():
    tu.check_interpreter_env()


@pytest.mark.parametrize("a,b,want", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (64, 64, 1), (65, 64, 2),
                                      (2**40 + 1, 2**20, 2**20 + 1)])
def test_cdiv(a, b, want):
    assert tu.cdiv(a, b) == want == triton.cdiv(a, b)


@pytest.mark.parametrize("n,want", [(0, 1), (1, 1), (2, 2), (3, 4), (64, 64), (65, 128), (1000, 1024),
                                    (2**31 - 1, 2**31)])
def test_next_power_of_2(n, want):
    assert tu.next_power_of_2(n) == want
    if n >= 1:
        assert want == triton.next_power_of_2(n)


def test_num_sms():
    assert tu.num_sms(torch.device("cpu")) == 4
    if ON_GPU:
        assert tu.num_sms(torch.device("cuda")) == torch.cuda.get_device_properties(0).multi_processor_count


def test_host_to_device_same_device_is_identity():
    t = torch.arange(5)
    assert tu.host_to_device(t, "cpu") is t


@pytest.mark.gpu
def test_host_to_device_cuda_values_after_queued_work():
    """The pinned, non-blocking copy lands in stream order: a consumer queued after it sees the values."""
    t = torch.arange(1000, dtype=torch.int64)
    busy = torch.randn(4096, 4096, device="cuda")
    busy = busy @ busy  # queue work ahead of the copy
    d = tu.host_to_device(t, "cuda")
    assert d.device.type == "cuda" and torch.equal(d.cpu(), t)


def test_interpreting_follows_the_environment(monkeypatch):
    """``interpreting`` reads os.environ's byte store directly (host time): it must still see every change."""
    for value, want in (("1", True), ("0", False), ("true", False), ("1", True)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert tu.interpreting() is want
    monkeypatch.delenv("TRITON_INTERPRET")
    assert tu.interpreting() is False
