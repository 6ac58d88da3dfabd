"""mindspeed_ops.backends: default selection, overrides, errors (DESIGN 3)."""
import pytest
import torch

from mindspeed_ops import BackendUnavailableError, backends, use_backend

OP = "clipped_swiglu"  # a real op with reference + triton registered
DUMMY = "_test_only_op"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """Every test starts without the global override and with the interpreter flag on (the CPU CI
    setting; backends reads it at call time, and these tests only select, never launch a kernel)."""
    monkeypatch.delenv(backends.ENV_BACKEND, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def dummy():
    """A throw-away op with only a reference implementation; removed from the registry afterwards."""
    backends.registered_ops()  # load the real families first
    impl = backends.register(DUMMY, "reference", forward=lambda x: x)
    yield impl
    backends.unregister(DUMMY)


def test_families_registered():
    assert OP in backends.registered_ops()
    assert backends.registered_backends(OP) == ["reference", "triton"]  # BACKENDS order


def test_default_cpu_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backends.triton_interpreting()
    assert backends.select(OP, "cpu") == "triton"
    assert backends.backend_status("triton", "cpu") == (True, "CPU under TRITON_INTERPRET=1")


@pytest.mark.parametrize("value", ["0", None])
def test_default_cpu_without_interpreter(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    assert not backends.triton_interpreting()
    assert backends.select(OP, "cpu") == "reference"
    ok, why = backends.backend_status("triton", "cpu")
    assert not ok and "TRITON_INTERPRET=1" in why


def test_implementation_functions():
    impl = backends.implementation(OP, torch.device("cpu"))
    assert impl.op == OP and callable(impl.forward) and callable(impl.backward)
    with pytest.raises(AttributeError, match=r"clipped_swiglu\[triton\] has no function 'nope'"):
        impl.nope


def test_env_override(monkeypatch):
    monkeypatch.setenv(backends.ENV_BACKEND, "reference")
    assert backends.select(OP, "cpu") == "reference"
    monkeypatch.setenv(backends.ENV_BACKEND, "triton")
    assert backends.select(OP, "cpu") == "triton"


def test_env_override_triton_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv(backends.ENV_BACKEND, "triton")
    with pytest.raises(BackendUnavailableError, match=r"clipped_swiglu: backend 'triton' requested by "
                       r"MINDSPEED_OPS_BACKEND=triton is not available: triton needs a CUDA device"):
        backends.select(OP, "cpu")


def test_env_override_unknown_name(monkeypatch):
    monkeypatch.setenv(backends.ENV_BACKEND, "nonsense")
    with pytest.raises(BackendUnavailableError, match="unknown backend 'nonsense'"):
        backends.select(OP, "cpu")


def test_use_backend_beats_env(monkeypatch):
    monkeypatch.setenv(backends.ENV_BACKEND, "triton")
    with use_backend("reference"):
        assert backends.select(OP, "cpu") == "reference"
    assert backends.select(OP, "cpu") == "triton"


def test_use_backend_nesting_innermost_wins():
    assert backends.select(OP, "cpu") == "triton"
    with use_backend("reference"):
        assert backends.select(OP, "cpu") == "reference"
        with use_backend("triton"):
            assert backends.select(OP, "cpu") == "triton"
        assert backends.select(OP, "cpu") == "reference"
    assert backends.select(OP, "cpu") == "triton"


def test_use_backend_restored_after_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with use_backend("reference"):
            raise RuntimeError("boom")
    assert backends.select(OP, "cpu") == "triton"


def test_use_backend_ops_filter(dummy):
    with use_backend("reference", ops=[OP]):
        assert backends.select(OP, "cpu") == "reference"
        with use_backend("triton", ops=[DUMMY]):  # not about OP: the outer override still applies
            assert backends.select(OP, "cpu") == "reference"
    with use_backend("reference", ops=[DUMMY]):  # another op only
        assert backends.select(OP, "cpu") == "triton"


def test_use_backend_global_missing_impl_falls_back(dummy):
    # a global override names a backend this op does not have: the op keeps its default
    with use_backend("triton"):
        assert backends.select(DUMMY, "cpu") == "reference"
        assert backends.select(OP, "cpu") == "triton"


def test_use_backend_explicit_missing_impl_raises(dummy):
    with use_backend("triton", ops=[DUMMY]):
        with pytest.raises(BackendUnavailableError, match=r"_test_only_op: backend 'triton' requested by "
                           r"use_backend\('triton'\) has no implementation of this op; available: reference"):
            backends.select(DUMMY, "cpu")


def test_use_backend_unknown_name():
    with pytest.raises(ValueError, match=r"use_backend: name must be one of .*got 'tritonn'"):
        with use_backend("tritonn"):
            pass


@pytest.mark.parametrize("name", ["tilelang", "cuda", "cutlass"])
def test_unavailable_backend(name):
    # none of these can run on CPU tensors (and tilelang / the compiled extension are not installed here)
    with use_backend(name):
        with pytest.raises(BackendUnavailableError, match=rf"clipped_swiglu: backend '{name}' requested by "
                           rf"use_backend\('{name}'\) is not available: "):
            backends.implementation(OP, "cpu")
    ok, why = backends.backend_status(name, "cpu")
    assert not ok and why


def test_unavailable_error_reasons():
    ok, why = backends.backend_status("cuda", "cpu")
    assert not ok and ("not built" in why or "needs CUDA" in why)
    ok, why = backends.backend_status("tilelang", "cpu")
    assert not ok and ("not installed" in why or "needs CUDA" in why)
    assert issubclass(BackendUnavailableError, RuntimeError)


def test_triton_on_cpu_without_interpreter_via_use_backend(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with use_backend("triton"):
        with pytest.raises(BackendUnavailableError, match=r"needs a CUDA device or TRITON_INTERPRET=1 "
                           r"\(tensors are on cpu\)"):
            backends.implementation(OP, "cpu")


def test_unknown_op():
    with pytest.raises(KeyError, match="no operator named 'no_such_op'"):
        backends.implementation("no_such_op", "cpu")


def test_register_rejects_unknown_backend():
    with pytest.raises(ValueError, match=r"register: backend must be one of .*got 'opencl'"):
        backends.register(DUMMY, "opencl", forward=lambda x: x)
    assert DUMMY not in backends._REGISTRY


def test_register_default_priorities(dummy):
    assert dummy.priority == -100
    try:
        t = backends.register(DUMMY, "triton", forward=lambda x: x)
        c = backends.register(DUMMY, "cuda", forward=lambda x: x, archs=["sm90"])
        assert t.priority == 0 and c.priority == 10 and c.archs == frozenset({"sm90"})
    finally:
        backends.unregister(DUMMY)


def test_arch_restricted_override_raises(dummy):
    backends.register(DUMMY, "triton", forward=lambda x: x, archs=["sm90"])
    with use_backend("triton"):
        with pytest.raises(BackendUnavailableError, match=r"supports archs \['sm90'\], the device is cpu"):
            backends.select(DUMMY, "cpu")


def test_cuda_default_prefers_priority_and_arch(dummy, monkeypatch):
    """The CUDA default path, simulated on CPU: highest-priority available backend for the arch."""
    backends.register(DUMMY, "triton", forward=lambda x: x)
    backends.register(DUMMY, "cuda", forward=lambda x: x, archs=["sm90"])
    available = {"reference", "triton", "cuda"}
    monkeypatch.setattr(backends, "backend_status", lambda b, d: (b in available, "test"))
    arch = {"value": "sm90"}
    monkeypatch.setattr(backends, "device_arch", lambda d: arch["value"])
    dev = torch.device("cuda")
    backends.clear_cache()
    assert backends.select(DUMMY, dev) == "cuda"
    arch["value"] = "sm80"  # cuda impl is Hopper-only -> generic triton
    backends.clear_cache()
    assert backends.select(DUMMY, dev) == "triton"
    available.discard("triton")  # nothing GPU-capable left -> reference
    backends.clear_cache()
    assert backends.select(DUMMY, dev) == "reference"
    backends.clear_cache()


def test_device_arch_cpu():
    assert backends.device_arch("cpu") == "cpu"
    assert backends.device_arch(torch.device("cpu")) == "cpu"


@pytest.mark.gpu
def test_device_arch_cuda():
    major, minor = torch.cuda.get_device_capability()
    assert backends.device_arch("cuda") == f"sm{major}{minor}"
    assert backends.select(OP, "cuda") == "triton"


def test_backend_status_reference_and_unknown():
    assert backends.backend_status("reference", "cpu") == (True, "pure PyTorch")
    ok, why = backends.backend_status("opencl", "cpu")
    assert not ok and "unknown backend 'opencl'" in why


def test_describe(monkeypatch):
    rows = {r["op"]: r for r in backends.describe("cpu")}
    assert rows[OP]["backend"] == "triton" and rows[OP]["registered"] == ["reference", "triton"]
    monkeypatch.setenv(backends.ENV_BACKEND, "cuda")
    rows = {r["op"]: r for r in backends.describe("cpu")}
    assert rows[OP]["backend"].startswith("error: clipped_swiglu: backend 'cuda'")


def test_top_level_exports():
    import mindspeed_ops

    assert mindspeed_ops.use_backend is backends.use_backend
    assert mindspeed_ops.BackendUnavailableError is backends.BackendUnavailableError


def test_inner_global_override_without_impl_does_not_raise(dummy):
    with use_backend("reference", ops=[DUMMY]):
        with use_backend("triton"):  # global, and DUMMY has no triton implementation
            assert backends.select(DUMMY, "cpu") == "reference"


def test_use_backend_rejects_unknown_op_names():
    """Regression: a typo in ops=[...] silently did nothing."""
    with pytest.raises(ValueError, match=r"unknown op name\(s\) \['l2normx'\]"):
        with use_backend("reference", ops=["l2normx"]):
            pass


def test_backward_keeps_the_forwards_backend_choices():
    """pin_backends: a backward runs with the use_backend choices of its forward, also when called after the
    ``with`` block or from another thread (as autograd does on CUDA); every hand-written Function has it."""
    import threading

    from mindspeed_ops.ops.common import pin_backends
    from mindspeed_ops.ops.conv.autograd import CausalConv1dFunction
    from mindspeed_ops.ops.loss.autograd import FusedCrossEntropyLossFunction
    from mindspeed_ops.ops.moe.autograd import _SortChunksEager, _SortChunksProbsEager
    from mindspeed_ops.ops.rope.autograd import InplaceRopeFunction

    seen = []

    @pin_backends
    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(backends.overrides())
            return g * 2

    x = torch.ones(3, requires_grad=True)
    with use_backend("reference"):
        y1, y2 = Probe.apply(x).sum(), Probe.apply(x).sum()
        expected = backends.overrides()
    y1.backward()
    t = threading.Thread(target=y2.backward)
    t.start()
    t.join()
    assert seen == [expected, expected] and expected
    for cls in (CausalConv1dFunction, FusedCrossEntropyLossFunction, _SortChunksEager, _SortChunksProbsEager,
                InplaceRopeFunction):
        assert hasattr(cls.backward, "__wrapped__") and hasattr(cls.forward, "__wrapped__"), cls.__name__
