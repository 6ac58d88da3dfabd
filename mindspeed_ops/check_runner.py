"""Run :class:`~mindspeed_ops.checks.CheckCase` s against their float64 references.

This is the engine of ``mindspeed-ops check`` (and of ATK's accuracy suite). For one case and dtype,
:func:`run_case`:

1. builds inputs with ``case.make_inputs(device, dtype, small)``;
2. runs the library (``case.run``) on clones of them, ``requires_grad`` on ``case.grad_inputs``, and
   backpropagates seeded random upstream gradients (:func:`mindspeed_ops.testing.randn`) through
   every floating output whose threshold class is not ``None``;
3. runs ``case.reference`` on float64 copies (:func:`mindspeed_ops.testing.to_ref`, made before the
   library run) and backpropagates the same upstream gradients with autograd;
4. compares every output and gradient with :func:`mindspeed_ops.testing.compare` at
   ``threshold(class, dtype)`` (SPEC 0.9);
5. times forward+backward (median; ``triton.testing.do_bench`` on CUDA, wall clock on CPU).

Any exception becomes a failed :class:`CaseResult` carrying the exception text, never a crash.

Under ``TRITON_INTERPRET=1`` the Triton kernels run on CPU tensors. That variable is read when a
kernel module is imported, so a CPU run must call :func:`prepare_device` before anything imports
``mindspeed_ops.ops`` (or ``mindspeed_ops.triton_utils``).
"""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import torch

from . import backends
from .testing import Comparison, compare, randn, threshold, to_ref

#: accepted spellings of dtypes on the command line
DTYPE_ALIASES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}
SHORT_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}



def dtype_short(dtype: torch.dtype) -> str:
    """``'fp32'``, ``'fp16'``, ``'bf16'`` (``str(dtype)`` for anything else)."""
    return SHORT_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def parse_dtypes(spec: str | Iterable[str]) -> list[torch.dtype]:
    """``"fp32,fp16"`` (or a list of such strings) -> ``[torch.float32, torch.float16]``.

    Raises ``ValueError`` naming the unknown entry and the accepted spellings.
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    out: list[torch.dtype] = []
    for item in items:
        for name in item.split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name not in DTYPE_ALIASES:
                raise ValueError(f"unknown dtype {name!r}; use fp32, fp16 or bf16")
            if DTYPE_ALIASES[name] not in out:
                out.append(DTYPE_ALIASES[name])
    return out


def default_device() -> str:
    """``'cuda'`` when a CUDA device is present, else ``'cpu'``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def kernel_modules_loaded() -> list[str]:
    """Names of already-imported modules that hold ``@triton.jit`` functions: triton itself (its language
    helpers) and mindspeed_ops' kernel modules (``ops/**/triton_*.py``). ``import mindspeed_ops`` loads neither
    (the launchers import their kernels when first called)."""
    return sorted(m for m in sys.modules if m == "triton"
                  or (m.startswith("mindspeed_ops.ops.") and m.rsplit(".", 1)[-1].startswith("triton_")))


def prepare_device(device: torch.device | str) -> bool:
    """Get the process ready to check on ``device``; returns whether Triton runs under the interpreter.

    For a CPU run, sets ``TRITON_INTERPRET=1`` unless the variable is already set (an explicit
    ``TRITON_INTERPRET=0`` is respected: the ``reference`` backend then runs), so the real Triton
    kernels are checked on CPU. Call it before any kernel module is imported.

    Raises:
        RuntimeError: the interpreter has to be switched on but kernel modules were already imported
            (they would keep running in compiled mode), or numpy >= 2.4 is installed
            (:func:`mindspeed_ops.triton_utils.check_interpreter_env`).
    """
    device = torch.device(device)
    if device.type == "cpu" and "TRITON_INTERPRET" not in os.environ:
        loaded = kernel_modules_loaded()
        if loaded:
            raise RuntimeError("TRITON_INTERPRET=1 must be set before any mindspeed_ops kernel module is imported; "
                               f"already imported: {', '.join(loaded[:5])}{' ...' if len(loaded) > 5 else ''}")
        os.environ["TRITON_INTERPRET"] = "1"
    interpreting = backends.triton_interpreting()
    if interpreting:
        from . import interpreter_speedup
        from .triton_utils import check_interpreter_env

        check_interpreter_env()
        interpreter_speedup.install()
    return interpreting


@dataclass
class CaseResult:
    """Outcome of one (case, dtype) run.

    ``fwd_rel_rms`` / ``grad_rel_rms`` are the largest rel_rms over outputs / gradients (``None`` when
    there were none or the run failed before comparing); ``time_ms`` is the median forward+backward
    time in milliseconds (``None`` when not timed). ``reason`` explains a failure.
    """

    op: str
    case: str
    dtype: str
    backend: str = "?"
    fwd_rel_rms: Optional[float] = None
    grad_rel_rms: Optional[float] = None
    time_ms: Optional[float] = None
    passed: bool = False
    reason: str = ""
    comparisons: list[Comparison] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready dict (``inf`` becomes the string ``"inf"``)."""
        def num(x):
            return None if x is None else (x if math.isfinite(x) else str(x))

        return {
            "op": self.op, "case": self.case, "dtype": self.dtype, "backend": self.backend,
            "fwd_rel_rms": num(self.fwd_rel_rms), "grad_rel_rms": num(self.grad_rel_rms),
            "time_ms": num(self.time_ms), "passed": self.passed, "reason": self.reason,
            "comparisons": [{"name": c.name, "rel_rms": num(c.rel_rms), "max_abs": num(c.max_abs),
                             "passed": c.passed, "reason": c.reason} for c in self.comparisons],
        }


def output_path_problem(path: str, directory: bool = False) -> Optional[str]:
    """Why ``path`` cannot be written as an output file (a directory when ``directory``), or ``None``.
    Checked before a long run, so that a bad ``--json``/``--out`` fails at once, not after the run."""
    if not path:  # "" would otherwise mean the current directory, or no output at all
        return "empty path"
    p = os.path.abspath(path)
    if os.path.exists(p):
        if directory and not os.path.isdir(p):
            return "exists and is not a directory"
        if not directory and os.path.isdir(p):
            return "is a directory"
        return None
    parent = os.path.dirname(p)
    while not os.path.exists(parent):  # missing parents are created when writing
        parent = os.path.dirname(parent)
    return None if os.path.isdir(parent) else f"{parent} is not a directory"


def _exc_text(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def load_cases(families: Optional[Sequence[str]] = None) -> tuple[list, dict[str, str]]:
    """Every family's ``CASES`` (like :func:`mindspeed_ops.checks.all_cases`), but a family that fails
    to import is reported instead of aborting the run.

    Returns ``(cases, errors)`` with ``errors`` mapping family name -> exception text. A family without
    a ``checks`` module has no cases and is not an error.
    """
    import importlib

    cases: list = []
    errors: dict[str, str] = {}
    for fam in backends._FAMILIES if families is None else families:
        name = f"mindspeed_ops.ops.{fam}.checks"
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                errors[fam] = _exc_text(e)
            continue
        except Exception as e:
            errors[fam] = _exc_text(e)
            continue
        cases.extend(getattr(mod, "CASES", ()))
    if errors:
        try:  # let backends finish loading the healthy families now (the failure is already reported)
            backends.registered_ops()
        except Exception:
            pass
    return cases, errors


def select_cases(ops: Optional[Sequence[str]] = None, *, errors: Optional[dict] = None) -> list:
    """The registered :class:`~mindspeed_ops.checks.CheckCase` s, restricted to ``ops`` when given.

    Families that fail to import are skipped and recorded in ``errors`` (family -> exception text)
    when a dict is passed. Raises ``ValueError`` for an op name without cases, listing the ops that
    have some.
    """
    cases, errs = load_cases()
    if errors is not None:
        errors.update(errs)
    if not ops:
        return cases
    known = sorted({c.op for c in cases})
    unknown = [o for o in ops if o not in known]
    if unknown:
        broken = f"; families that failed to import: {', '.join(errs)}" if errs else ""
        raise ValueError(f"no check cases for {', '.join(unknown)}; ops with cases: {', '.join(known)}{broken}")
    return [c for c in cases if c.op in ops]


def plan(cases: Sequence, device: torch.device | str,
         dtypes: Optional[Sequence[torch.dtype]] = None) -> list[tuple[object, torch.dtype]]:
    """(case, dtype) pairs to run: each case's ``dtypes`` filtered by ``dtypes``; bf16 is dropped on
    CPU (the interpreter cannot do bf16 arithmetic, DESIGN 7 trap 1)."""
    device = torch.device(device)
    out = []
    for case in cases:
        for dt in case.dtypes:
            if dtypes is not None and dt not in dtypes:
                continue
            if device.type == "cpu" and dt == torch.bfloat16:
                continue
            out.append((case, dt))
    return out


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _differentiable(o) -> bool:
    return isinstance(o, torch.Tensor) and o.requires_grad


def _backward(outs: Sequence, cots: Sequence, leaves: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients of ``Σ <out_i, cot_i>`` w.r.t. ``leaves`` (zeros where unused)."""
    pairs = [(o, c.to(o.dtype)) for o, c in zip(outs, cots) if c is not None and _differentiable(o)]
    if not leaves:
        return []
    if not pairs:
        return [torch.zeros_like(x) for x in leaves]
    grads = torch.autograd.grad([o for o, _ in pairs], list(leaves), [c for _, c in pairs], allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]


def _clone_input(v, requires_grad: bool):
    if not isinstance(v, torch.Tensor):
        return v
    return v.detach().clone().requires_grad_(requires_grad)


def _verify(case, device: torch.device, dtype: torch.dtype, small: bool, seed: int):
    """Run library and reference once; returns (output comparisons, gradient comparisons, step fn)."""
    inputs = case.make_inputs(device, dtype, small)
    missing = [n for n in case.grad_inputs if n not in inputs]
    if missing:
        raise KeyError(f"grad_inputs {missing} are not among the inputs {sorted(inputs)}")
    grad_names = list(case.grad_inputs)
    # float64 copies first, so an operator that (wrongly) mutates its inputs cannot affect the oracle
    ref_in = {k: (to_ref(v, requires_grad=k in grad_names)[0] if isinstance(v, torch.Tensor) else v)
              for k, v in inputs.items()}
    lib_in = {k: _clone_input(v, k in grad_names) for k, v in inputs.items()}

    outs = _as_tuple(case.run(**lib_in))
    classes = tuple(case.out_classes)
    if len(classes) != len(outs):
        raise ValueError(f"the case lists {len(classes)} output classes but the op returned {len(outs)} outputs")
    cots = [randn(o.shape, o.dtype, o.device, seed=seed + 1 + i)
            if cls is not None and isinstance(o, torch.Tensor) and o.is_floating_point() else None
            for i, (o, cls) in enumerate(zip(outs, classes))]
    if grad_names and not any(c is not None and _differentiable(o) for o, c in zip(outs, cots)):
        raise RuntimeError(f"no compared output is differentiable w.r.t. {grad_names}")
    lib_grads = _backward(outs, cots, [lib_in[n] for n in grad_names])

    ref_outs = _as_tuple(case.reference(**ref_in))
    if len(ref_outs) != len(outs):
        raise ValueError(f"the reference returned {len(ref_outs)} outputs, the op {len(outs)}")
    ref_grads = _backward(ref_outs, cots, [ref_in[n] for n in grad_names])

    many = len(outs) > 1
    fwd: list[Comparison] = []
    for i, (o, r, cls) in enumerate(zip(outs, ref_outs, classes)):
        if cls is None:
            continue
        name = f"out[{i}]" if many else "out"
        if o is None and r is None:
            continue
        if not isinstance(o, torch.Tensor) or not isinstance(r, torch.Tensor):
            fwd.append(Comparison(name, math.inf, math.inf, False,
                                  f"output is {type(o).__name__}, reference is {type(r).__name__}"))
            continue
        fwd.append(compare(name, r, o, threshold(cls, dtype)))
    grads = [compare(f"d{n}", r, g, threshold(case.grad_class, dtype))
             for n, g, r in zip(grad_names, lib_grads, ref_grads)]

    def step():
        o = _as_tuple(case.run(**lib_in))
        _backward(o, cots, [lib_in[n] for n in grad_names])

    return fwd, grads, step


def time_ms(fn: Callable[[], None], device: torch.device | str, repeats: int = 3) -> float:
    """Median milliseconds of ``fn`` (forward+backward). CUDA: ``triton.testing.do_bench`` (it warms
    up and synchronises itself); CPU: wall clock over ``repeats`` calls after one warm-up call."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            from triton.testing import do_bench
        except ImportError:  # pragma: no cover - triton ships with CUDA torch on Linux
            do_bench = None
        if do_bench is not None:
            return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    times = []
    for _ in range(max(1, repeats)):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _max(values: Iterable[float]) -> Optional[float]:
    values = list(values)
    return max(values) if values else None


def run_case(case, device: torch.device | str, dtype: torch.dtype, *, small: bool,
             backend: Optional[str] = None, repeats: int = 3, seed: int = 1000) -> CaseResult:
    """Check one case in one dtype (see module docstring); never raises for a failing case.

    Args:
        case: a :class:`mindspeed_ops.checks.CheckCase`.
        device: where the inputs live (``'cpu'`` runs Triton under the interpreter when
            ``TRITON_INTERPRET=1``, see :func:`prepare_device`).
        dtype: fp32/fp16/bf16.
        small: small (CPU) shapes instead of real ones.
        backend: force a backend with :func:`mindspeed_ops.use_backend` (``None``: the default choice).
        repeats: timed repetitions (CPU); ``0`` skips timing.
        seed: base seed of the upstream gradients (output ``i`` uses ``seed + 1 + i``).
    """
    device = torch.device(device)
    res = CaseResult(case.op, case.name, dtype_short(dtype))
    ctx = backends.use_backend(backend) if backend else contextlib.nullcontext()
    try:
        with ctx:
            res.backend = backends.select(case.op, device)
            fwd, grads, step = _verify(case, device, dtype, small, seed)
            res.comparisons = fwd + grads
            res.fwd_rel_rms = _max(c.rel_rms for c in fwd)
            res.grad_rel_rms = _max(c.rel_rms for c in grads)
            failed = [c for c in res.comparisons if not c.passed]
            res.passed = not failed
            res.reason = "; ".join(f"{c.name}: {c.reason}" for c in failed)
            if repeats > 0:
                res.time_ms = time_ms(step, device, repeats)
    except Exception as e:  # a broken case is a FAIL row, not a crash
        res.passed = False
        res.reason = _exc_text(e)
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return res


def run_all(pairs: Sequence[tuple[object, torch.dtype]], device: torch.device | str, *, small: bool,
            backend: Optional[str] = None, repeats: int = 3,
            on_result: Optional[Callable[[CaseResult], None]] = None) -> list[CaseResult]:
    """:func:`run_case` over ``pairs`` (from :func:`plan`), calling ``on_result`` after each."""
    results = []
    for case, dt in pairs:
        r = run_case(case, device, dt, small=small, backend=backend, repeats=repeats)
        results.append(r)
        if on_result is not None:
            on_result(r)
    return results


__all__ = ["CaseResult", "DTYPE_ALIASES", "dtype_short", "parse_dtypes", "default_device", "kernel_modules_loaded",
           "output_path_problem", "prepare_device", "load_cases", "select_cases", "plan", "time_ms", "run_case",
           "run_all"]
