"""mindspeed_ops.interpreter_speedup: a helper called inside an interpreted launch does not re-patch
triton.language, with the same results, the language restored after each launch, and a failing launch
leaving no state behind."""
import os

import pytest
import torch
import triton
import triton.language as tl

from mindspeed_ops import interpreter_speedup as isp

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                reason="the interpreter's own patching (TRITON_INTERPRET=1)")


@triton.jit
def _scaled(x, s):
    return x * s + tl.exp(x * 0.0)


@triton.jit
def _helper_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    y = _scaled(x, 2.0) + _scaled(x, -0.5)
    tl.store(y_ptr + offs, y, mask=m)


@triton.jit
def _failing_kernel(x_ptr, BLOCK: tl.constexpr):
    x = _scaled(tl.load(x_ptr + tl.arange(0, BLOCK)), 1.0)
    tl.store(x_ptr + tl.arange(0, BLOCK + 1), x)  # shape mismatch: the interpreter raises


def _run(x):
    y = torch.full_like(x, float("nan"))
    _helper_kernel[(triton.cdiv(x.numel(), 16),)](x, y, x.numel(), BLOCK=16)
    return y


def test_same_result_and_language_restored():
    x = torch.randn(70, generator=torch.Generator().manual_seed(0))
    load = tl.load
    isp.uninstall()
    try:
        stock = _run(x)
    finally:
        assert isp.install()
    assert isp.install()  # idempotent
    fast = _run(x)
    assert torch.equal(stock, fast) and torch.isfinite(fast).all()
    torch.testing.assert_close(fast, 1.5 * x + 2.0, rtol=1e-6, atol=1e-6)
    assert tl.load is load  # the launch's patching was undone
    assert isp._state["langs"] is None


def test_nested_calls_skip_the_patching(monkeypatch):
    from triton.runtime import interpreter

    x = torch.randn(70, generator=torch.Generator().manual_seed(1))
    isp.uninstall()
    own, calls = interpreter._patch_lang, []
    monkeypatch.setattr(interpreter, "_patch_lang", lambda f: calls.append(f.__name__) or own(f))
    try:
        _run(x)  # Triton's behaviour: the counting stand-in is called directly
        stock = list(calls)
        calls.clear()
        assert isp.install()  # the skip wraps the counting stand-in
        _run(x)
        fast = list(calls)
    finally:
        isp.uninstall()  # back to the stand-in
        monkeypatch.undo()  # back to Triton's own
        isp.install()
    assert stock == ["_helper_kernel"] + ["_scaled"] * 10  # the launch, two helper calls in each of 5 programs
    assert fast == ["_helper_kernel"]


def test_failing_launch_leaves_no_state():
    x = torch.randn(16)
    with pytest.raises(Exception):
        _failing_kernel[(1,)](x, BLOCK=16)
    assert isp._state["langs"] is None
    torch.testing.assert_close(_run(x), 1.5 * x + 2.0, rtol=1e-6, atol=1e-6)


def test_numpy_dtype_table_matches_tritons():
    from triton.runtime import interpreter

    fast = interpreter._get_np_dtype
    own = fast.__wrapped__
    types = [getattr(tl, n) for n in ("int1", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                                      "uint64", "float16", "bfloat16", "float32", "float64", "float8e5",
                                      "float8e4nv")]
    types += [tl.pointer_type(tl.float16), tl.block_type(tl.float32, [4, 8]),
              tl.block_type(tl.pointer_type(tl.int32), [16])]
    for ty in types:
        assert fast(ty) == own(ty), ty


def test_switched_off_by_the_environment(monkeypatch):
    from triton.runtime import interpreter

    isp.uninstall()
    try:
        monkeypatch.setenv("MINDSPEED_OPS_INTERPRETER_SPEEDUP", "0")
        assert not isp.install()
        assert not hasattr(interpreter._patch_lang, "__wrapped__")
    finally:
        monkeypatch.delenv("MINDSPEED_OPS_INTERPRETER_SPEEDUP")
        assert isp.install()
