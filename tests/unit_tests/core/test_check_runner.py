"""mindspeed_ops.check_runner: the generic engine behind ``mindspeed-ops check`` (and ATK)."""
import json
import math

import pytest
import torch

from mindspeed_ops import backends
from mindspeed_ops import check_runner as cr
from mindspeed_ops.checks import CheckCase
from mindspeed_ops.testing import randn
from tests.conftest import DEVICE, ON_GPU

OP = "_test_runner_op"


@pytest.fixture(autouse=True)
def _registered():
    """A throw-away op (reference only) so backends.select works for the synthetic cases below."""
    backends.registered_ops()
    backends.register(OP, "reference", forward=lambda x: x)
    yield
    backends.unregister(OP)


def _inputs(device, dtype, small):
    n = 16 if small else 256
    return {"x": randn((n, 8), dtype, device, seed=1), "y": randn((n, 8), dtype, device, seed=2), "alpha": 0.5}


def _good(x, y, alpha):
    """Two outputs: an elementwise one and a row reduction, each rounded once from fp32 math."""
    o = x.float() * torch.sigmoid(y.float()) + alpha * y.float()
    return o.to(x.dtype), (x.float() * y.float()).sum(-1)


def _ref(x, y, alpha):
    o = x * torch.sigmoid(y) + alpha * y
    return o, (x * y).sum(-1)


def _case(run=_good, reference=_ref, **kw):
    kw.setdefault("out_classes", ("E-fwd", "E-bwd"))
    kw.setdefault("grad_inputs", ("x", "y"))
    return CheckCase(OP, "synthetic", _inputs, run, reference, **kw)


class _WrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2.01


def test_passing_case():
    r = cr.run_case(_case(), DEVICE, torch.float32, small=True, repeats=2)
    assert r.passed, r.reason
    assert r.backend == "reference" and r.dtype == "fp32" and r.op == OP and r.case == "synthetic"
    assert [c.name for c in r.comparisons] == ["out[0]", "out[1]", "dx", "dy"]
    assert 0 <= r.fwd_rel_rms < 1e-5 and 0 <= r.grad_rel_rms < 1e-4
    assert r.time_ms is not None and r.time_ms > 0


def test_fp16_case_passes():
    r = cr.run_case(_case(), DEVICE, torch.float16, small=True, repeats=0)
    assert r.passed, r.reason
    assert r.fwd_rel_rms > 0 and r.time_ms is None  # fp16 rounding is visible; repeats=0: no timing


def test_wrong_forward_fails_with_reason():
    def bad(x, y, alpha):
        o, s = _good(x, y, alpha)
        return o * 1.001, s
    r = cr.run_case(_case(run=bad), DEVICE, torch.float32, small=True, repeats=0)
    assert not r.passed and r.reason.startswith("out[0]: rel_rms 1.0") and "> 1.0e-05" in r.reason
    assert r.fwd_rel_rms == pytest.approx(1e-3, rel=1e-2)


def test_wrong_gradient_fails_with_reason():
    case = CheckCase(OP, "wrong grad", _inputs, lambda x, y, alpha: _WrongGrad.apply(x),
                     lambda x, y, alpha: x * 2, grad_inputs=("x",))
    r = cr.run_case(case, DEVICE, torch.float32, small=True, repeats=0)
    assert not r.passed and r.fwd_rel_rms == 0.0
    assert r.reason.startswith("dx: rel_rms 5.0") and r.grad_rel_rms == pytest.approx(5e-3, rel=1e-4)


def test_raising_case_is_a_fail_row_not_a_crash():
    def boom(**kw):
        raise RuntimeError("kaboom\nsecond line")
    r = cr.run_case(_case(run=boom), DEVICE, torch.float32, small=True)
    assert not r.passed and r.reason == "RuntimeError: kaboom" and r.comparisons == []
    r = cr.run_case(_case(reference=boom), DEVICE, torch.float32, small=True)
    assert not r.passed and r.reason == "RuntimeError: kaboom"


def test_unregistered_op_is_a_fail_row():
    case = CheckCase("_nobody_registered_this", "x", _inputs, _good, _ref, out_classes=("E-fwd", "E-bwd"))
    r = cr.run_case(case, DEVICE, torch.float32, small=True)
    assert not r.passed and r.reason.startswith("KeyError") and r.backend == "?"


def test_unavailable_backend_is_a_fail_row():
    r = cr.run_case(_case(), DEVICE, torch.float32, small=True, backend="cutlass")
    assert not r.passed and r.reason.startswith("BackendUnavailableError: _test_runner_op: backend 'cutlass'")


def test_none_class_skips_output():
    def half_bad(x, y, alpha):
        o, s = _good(x, y, alpha)
        return o, s * 7  # wrong, but not compared
    r = cr.run_case(_case(run=half_bad, out_classes=("E-fwd", None), grad_inputs=("x",)), DEVICE,
                    torch.float32, small=True, repeats=0)
    assert r.passed, r.reason
    assert [c.name for c in r.comparisons] == ["out[0]", "dx"]


def test_output_count_mismatch():
    r = cr.run_case(_case(out_classes=("E-fwd",)), DEVICE, torch.float32, small=True)
    assert not r.passed and "lists 1 output classes but the op returned 2 outputs" in r.reason


def test_missing_grad_input_and_non_differentiable_output():
    r = cr.run_case(_case(grad_inputs=("z",)), DEVICE, torch.float32, small=True)
    assert not r.passed and "grad_inputs ['z'] are not among the inputs" in r.reason
    detached = _case(run=lambda x, y, alpha: tuple(t.detach() for t in _good(x, y, alpha)))
    r = cr.run_case(detached, DEVICE, torch.float32, small=True)
    assert not r.passed and "no compared output is differentiable" in r.reason


def test_forward_only_and_exact_class():
    case = CheckCase(OP, "copy", _inputs, lambda x, y, alpha: x.clone(), lambda x, y, alpha: x.clone(),
                     out_classes=("EXACT",))
    r = cr.run_case(case, DEVICE, torch.float16, small=True, repeats=1)
    assert r.passed and r.grad_rel_rms is None and r.fwd_rel_rms == 0.0


def test_inputs_not_mutated_and_reference_sees_originals():
    seen = {}

    def mutating(x, y, alpha):
        out = _good(x, y, alpha)
        x.add_(1.0)  # a (broken) op that writes into its input
        return out

    def ref(x, y, alpha):
        seen["x"] = x.detach().clone()
        return _ref(x, y, alpha)
    r = cr.run_case(_case(run=mutating, reference=ref, grad_inputs=()), DEVICE, torch.float32, small=True,
                    repeats=0)
    assert r.passed, r.reason
    assert torch.equal(seen["x"], _inputs(DEVICE, torch.float32, True)["x"].double())


def test_upstream_gradients_are_seeded():
    a = cr.run_case(_case(), DEVICE, torch.float16, small=True, repeats=0)
    b = cr.run_case(_case(), DEVICE, torch.float16, small=True, repeats=0)
    assert [c.rel_rms for c in a.comparisons] == [c.rel_rms for c in b.comparisons]


def test_result_to_dict_is_json():
    def bad(x, y, alpha):
        o, s = _good(x, y, alpha)
        o = o.clone()
        o[0, 0] = float("nan")
        return o, s
    r = cr.run_case(_case(run=bad), DEVICE, torch.float32, small=True, repeats=0)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["passed"] is False and d["fwd_rel_rms"] == "inf" and d["comparisons"][0]["reason"] == "1 NaN in output"
    assert math.isinf(r.fwd_rel_rms)


def test_run_all_calls_back():
    seen = []
    res = cr.run_all([(_case(), torch.float32), (_case(), torch.float16)], DEVICE, small=True, repeats=0,
                     on_result=seen.append)
    assert len(res) == 2 and seen == res and all(r.passed for r in res)


# ---------------------------------------------------------------------------------------------
# planning and setup


def test_parse_dtypes():
    assert cr.parse_dtypes("fp32,fp16,bf16") == [torch.float32, torch.float16, torch.bfloat16]
    assert cr.parse_dtypes(["bfloat16", "float32, fp32"]) == [torch.bfloat16, torch.float32]
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        cr.parse_dtypes("fp32,fp8")
    assert cr.dtype_short(torch.bfloat16) == "bf16"


def test_plan_drops_bf16_on_cpu_and_filters():
    c = _case()
    assert [dt for _, dt in cr.plan([c], "cpu")] == [torch.float32, torch.float16]
    assert [dt for _, dt in cr.plan([c], "cpu", [torch.float16, torch.bfloat16])] == [torch.float16]
    assert [dt for _, dt in cr.plan([c], "cuda")] == [torch.float32, torch.float16, torch.bfloat16]


def test_select_cases():
    cases = cr.select_cases()
    assert any(c.op == "clipped_swiglu" for c in cases)
    assert all(c.op == "clipped_swiglu" for c in cr.select_cases(["clipped_swiglu"]))
    with pytest.raises(ValueError, match=r"no check cases for nope; ops with cases: .*clipped_swiglu"):
        cr.select_cases(["nope"])


def test_prepare_device(monkeypatch):
    import numpy as np

    assert cr.default_device() == DEVICE
    # prepare_device refuses the interpreter on numpy >= 2.4 (trap 5); pretend to have a good numpy
    monkeypatch.setattr(np, "__version__", "2.3.5")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert cr.prepare_device("cpu") is True
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # an explicit 0 is respected
    assert cr.prepare_device("cpu") is False
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert cr.kernel_modules_loaded()  # this test session already imported kernels
    with pytest.raises(RuntimeError, match="must be set before any mindspeed_ops kernel module is imported"):
        cr.prepare_device("cpu")


def test_real_registered_case():
    case = next(c for c in cr.select_cases(["clipped_swiglu"]))
    r = cr.run_case(case, DEVICE, torch.float32, small=not ON_GPU, repeats=1)
    assert r.passed, r.reason
    assert r.backend == "triton" and [c.name for c in r.comparisons] == ["out", "dgate_up"]


def test_broken_family_is_reported_not_fatal(monkeypatch):
    cases, errors = cr.load_cases(("activation", "_no_such_family"))
    assert any(c.op == "clipped_swiglu" for c in cases)
    assert list(errors) == ["_no_such_family"] and errors["_no_such_family"].startswith("ModuleNotFoundError")
    monkeypatch.setattr(backends, "_FAMILIES", ("activation", "_no_such_family"))
    errs = {}
    with pytest.raises(ValueError, match="families that failed to import: _no_such_family"):
        cr.select_cases(["nope"], errors=errs)
    assert "_no_such_family" in errs
