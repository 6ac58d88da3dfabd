"""Compile-only check: build every Triton kernel of the library for real GPUs on a CPU-only machine.

The interpreter (``TRITON_INTERPRET=1``) runs the kernels on CPU but lets through what only the GPU
compiler rejects: ``tl.dot`` with K < 16, layout conversions the backend cannot lower, more shared
memory than an SM has, an autotune config that is never run on CPU (the interpreter shim keeps only the
first one). This module closes that gap (DESIGN section 7) in two steps:

1. **Record** (:func:`record_launches`, in a process where ``TRITON_INTERPRET=1``): every operator's
   check cases (:func:`mindspeed_ops.checks.all_cases`) run forward and backward on CPU in fp32 and
   fp16 while a hook notes each kernel launch: the kernel, the Triton signature of its arguments
   (``'*fp16'``, ``'i32'``, ``'fp32'``, ...), its constexprs, the integer/pointer specialization Triton
   would apply on a GPU (ints equal to 1 become constexprs, multiples of 16 and 16-byte aligned
   pointers get ``tt.divisibility``; computed by Triton's own binder) and the launch options
   (``num_warps``, ``num_stages``, ...). Small shapes run for real; real (GPU-size) shapes run "dry"
   (the launch is recorded, the kernel is not executed), so the tile sizes chosen for GPU sizes are
   compiled too. For kernels wrapped by :func:`mindspeed_ops.triton_utils.autotune`, every config
   (after the kernel's ``early_config_prune``, if any) is recorded, not just the one the interpreter
   runs. bf16 launches are never seen by the interpreter (the shim widens bf16 to fp32), so each fp16
   launch is also recorded as a bf16 one (``'*fp16'`` pointers -> ``'*bf16'``) when the case lists bf16.
2. **Compile** (:func:`compile_launches`, in worker processes with ``TRITON_INTERPRET=0``, where
   ``@triton.jit`` gives real ``JITFunction`` s): ``triton.compile(ASTSource(fn, signature,
   constexprs, attrs), target=GPUTarget("cuda", arch, 32), options)`` for sm_80 and sm_90. No GPU or
   driver is needed. Each result reports success or the compiler's error, the shared memory
   (``metadata.shared``, checked against the SM limit: 163 KB on sm_80, 227 KB on sm_90), and
   registers / stack / spill bytes read from the cubin with the ``cuobjdump`` and ``ptxas`` that ship
   with Triton (the driver-only ``n_regs``/``n_spills`` are not available without a GPU).

Entry points: :func:`check_all` (both steps), :func:`main` (the ``mindspeed-ops compile-check``
command), :class:`CompileWorker` (one long-lived compiler process; the unit tests use it), and
:class:`Recorder` (record launches of any kernel run under the interpreter).

Limitations: kernels defined inside a function (``<locals>`` in their qualified name) cannot be
re-imported by the compiler process and are reported as errors; kernels launched only by code paths
that no check case reaches are not compiled; real-shape cases whose inputs would exceed
``real_input_budget`` bytes are skipped (noted in the report).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

#: GPU architectures checked by default (A100, H100/H200)
ARCHS = (80, 90)
#: largest dynamic shared memory one block may use, bytes (CUDA's "max shared memory per block, opt-in")
SHARED_LIMIT = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 120: 101376}
#: 32-bit registers per SM (the upper bound for one block), and the allocation unit (registers per warp)
REGISTER_FILE = 65536
_REG_ALLOC_UNIT = 256
MAX_THREADS = 1024
#: dtypes the recording runs in (bf16 is derived from fp16, see the module docstring)
RECORD_DTYPES = ("fp32", "fp16")
SHAPES = ("small", "real")
#: default limit of the input bytes of one real-shape case (larger ones are skipped, not recorded)
REAL_INPUT_BUDGET = 2 << 30
_DEFAULT_TIMEOUT = 600.0
_FORMAT_VERSION = 1


# ----------------------------------------------------------------------------------------------------
# Launch records and results
# ----------------------------------------------------------------------------------------------------

@dataclass
class Launch:
    """One kernel specialization to compile (a recorded launch, JSON-serializable).

    Attributes:
        module, qualname, file: where the ``@triton.jit`` function is defined (the compiler process
            imports ``module`` and looks up ``qualname``; ``file`` is the fallback when the module
            cannot be imported by name, e.g. a test file).
        arg_names: the kernel's parameter names.
        signature: ``{arg name: Triton type}`` (``'*fp16'``, ``'i32'``, ``'fp32'``, ``'constexpr'``...).
        constexprs: ``{path: encoded value}``; a path is the argument index (``"3"``; ``"3.1"`` inside a
            tuple argument); values are encoded by :func:`_encode`.
        attrs: ``{path: [[attribute, value], ...]}`` specialization (``tt.divisibility``).
        options: compile options (``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg``, ...).
        dtype: dtype of the check case that launched it (``fp32``/``fp16``/``bf16``).
        case: ``"<op> <case name>"`` of the first check case that launched it.
        shapes: ``small`` or ``real`` (the case's shape set).
        config: ``"i/n"`` for the i-th of n autotune configs, ``None`` for a kernel that is not autotuned.
        count: how many recorded launches collapsed into this one (same kernel and specialization).
    """

    module: str
    qualname: str
    file: str
    arg_names: list
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    dtype: str = "?"
    case: str = ""
    shapes: str = "small"
    config: Optional[str] = None
    count: int = 1

    def key(self) -> str:
        """Identity of the compiled binary: kernel, signature, constexprs, specialization, options."""
        return json.dumps([self.module, self.qualname, self.signature, self.constexprs, self.attrs, self.options],
                          sort_keys=True, default=str)

    def short_hash(self) -> str:
        return hashlib.sha1(self.key().encode()).hexdigest()[:8]

    @property
    def kernel(self) -> str:
        return self.qualname

    def constexpr_str(self) -> str:
        """``"BM=32 BN=128 HAS_LIMIT=True"`` (top-level constexprs by name)."""
        parts = []
        for path, val in sorted(self.constexprs.items(), key=lambda kv: [int(p) for p in kv[0].split(".")]):
            idx = [int(p) for p in path.split(".")]
            name = self.arg_names[idx[0]] if idx[0] < len(self.arg_names) else path
            if len(idx) > 1:
                name += "[" + "][".join(str(i) for i in idx[1:]) + "]"
            parts.append(f"{name}={_value_str(val)}")
        return " ".join(parts)

    def options_str(self) -> str:
        o = self.options
        s = f"w{o.get('num_warps', 4)} s{o.get('num_stages', 3)}"
        extra = {k: v for k, v in o.items()
                 if k not in ("num_warps", "num_stages") and not (k == "num_ctas" and v == 1)}
        if extra:
            s += " " + " ".join(f"{k}={v}" for k, v in sorted(extra.items()))
        return s

    def label(self) -> str:
        cfg = f" cfg {self.config}" if self.config else ""
        return f"{self.qualname} {self.dtype} {self.constexpr_str()} {self.options_str()}{cfg}"

    def test_id(self) -> str:
        """A short identifier usable as a pytest id."""
        cx = "_".join(f"{k}{_value_str(v)}" for k, v in sorted(
            ((self.arg_names[int(p.split('.')[0])] if int(p.split('.')[0]) < len(self.arg_names) else p, v)
             for p, v in self.constexprs.items())))
        cfg = f"-cfg{self.config.replace('/', 'of')}" if self.config else ""
        ws = f"w{self.options.get('num_warps', 4)}s{self.options.get('num_stages', 3)}"
        raw = f"{self.qualname}-{self.dtype}-{cx}-{ws}{cfg}-{self.short_hash()}"
        return re.sub(r"[^A-Za-z0-9_.=\-]", "", raw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Launch":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class RecordError:
    """A check case that failed while recording (its own tests should show the same failure)."""

    case: str
    dtype: str
    shapes: str
    error: str


@dataclass
class Recording:
    """Output of :func:`record_launches`."""

    launches: list = field(default_factory=list)     # list[Launch], unique
    errors: list = field(default_factory=list)       # list[RecordError]
    notes: list = field(default_factory=list)        # list[str]: skipped cases, cases without kernels
    cases: list = field(default_factory=list)        # list[str]: "<op> <case>" recorded

    def to_dict(self) -> dict:
        return {"version": _FORMAT_VERSION, "launches": [l.to_dict() for l in self.launches],
                "errors": [dataclasses.asdict(e) for e in self.errors], "notes": list(self.notes),
                "cases": list(self.cases)}

    @classmethod
    def from_dict(cls, d: dict) -> "Recording":
        return cls([Launch.from_dict(x) for x in d["launches"]], [RecordError(**e) for e in d["errors"]],
                   list(d.get("notes", [])), list(d.get("cases", [])))


@dataclass
class CompileResult:
    """Outcome of compiling one :class:`Launch` for one arch.

    ``shared`` is the dynamic shared memory in bytes (from the compiled metadata); ``regs`` registers
    per thread, ``stack`` the per-thread stack frame in bytes and ``spill_stores``/``spill_loads`` the
    spill bytes (from the cubin; ``None`` when the tools are missing). ``error`` holds the compiler's
    message (or the resource-limit violation) when ``ok`` is false.
    """

    launch: Launch
    arch: int
    ok: bool
    error: str = ""
    shared: Optional[int] = None
    regs: Optional[int] = None
    stack: Optional[int] = None
    spill_stores: Optional[int] = None
    spill_loads: Optional[int] = None
    seconds: float = 0.0

    @property
    def summary(self) -> str:
        """First meaningful line of the error ('' when ok)."""
        if self.ok:
            return ""
        return _error_summary(self.error)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["launch"] = self.launch.to_dict()
        d["summary"] = self.summary
        return d


@dataclass
class CompileReport:
    """Output of :func:`check_all`."""

    recording: Recording
    results: list  # list[CompileResult]

    @property
    def failures(self) -> list:
        return [r for r in self.results if not r.ok]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.recording.errors

    def to_dict(self) -> dict:
        return {"recording": self.recording.to_dict(), "results": [r.to_dict() for r in self.results]}


def _error_summary(text: str) -> str:
    """One line out of a compiler error: the reason (and source position) rather than the echoed source."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return "error"
    first = lines[0]
    if "CompilationError" in first.split(":", 1)[0]:  # "...CompilationError: at L:C:" + source + "^" + reason
        where = first.split(":", 1)[1].strip().rstrip(":")
        return f"CompilationError {where}: {lines[-1]}"[:400]
    if "PTXASError" in first.split(":", 1)[0]:
        detail = next((ln for ln in lines[1:] if "error" in ln.lower() and not ln.startswith("Repro")), "")
        return f"{first} {detail}".strip()[:400]
    if first.startswith("OutOfResources"):
        return "; ".join(ln for ln in lines if ln.startswith("OutOfResources"))[:400]
    return first[:400]


def _value_str(v) -> str:
    if isinstance(v, dict):
        if "__dtype__" in v:
            return "tl." + v["__dtype__"]
        if "__tuple__" in v:
            return "(" + ",".join(_value_str(x) for x in v["__tuple__"]) + ")"
        if "__jit__" in v:
            return v["__jit__"][1]
    return str(v)


# ----------------------------------------------------------------------------------------------------
# Value encoding (constexpr values cross the process boundary as JSON)
# ----------------------------------------------------------------------------------------------------

def _encode(v):
    """JSON-able form of a constexpr value; raises TypeError for values the compiler process cannot rebuild."""
    import triton.language as tl

    if isinstance(v, tl.constexpr):
        v = v.value
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if type(v) is tl.dtype:
        return {"__dtype__": v.name}
    if isinstance(v, tuple):
        return {"__tuple__": [_encode(x) for x in v]}
    fn = getattr(v, "fn", None)
    if fn is not None and callable(fn) and hasattr(fn, "__qualname__"):  # a jit function passed as constexpr
        import inspect

        return {"__jit__": [fn.__module__, fn.__qualname__, inspect.getsourcefile(fn) or ""]}
    raise TypeError(f"cannot record constexpr value {v!r} of type {type(v).__name__}")


def _decode(v):
    import triton.language as tl

    if isinstance(v, dict):
        if "__dtype__" in v:
            return tl.dtype(v["__dtype__"])
        if "__tuple__" in v:
            return tuple(_decode(x) for x in v["__tuple__"])
        if "__jit__" in v:
            return _resolve_kernel(*v["__jit__"], unwrap=False)
    return v


def _path_str(path: tuple) -> str:
    return ".".join(str(i) for i in path)


def _path_tuple(s: str) -> tuple:
    return tuple(int(i) for i in s.split("."))


def _swap_fp16_bf16(v):
    if isinstance(v, str):
        return v.replace("fp16", "bf16") if v.lstrip("*").startswith("fp16") else v
    if isinstance(v, list):
        return [_swap_fp16_bf16(x) for x in v]
    if isinstance(v, dict) and v.get("__dtype__") == "fp16":
        return {"__dtype__": "bf16"}
    if isinstance(v, dict) and "__tuple__" in v:
        return {"__tuple__": [_swap_fp16_bf16(x) for x in v["__tuple__"]]}
    return v


def as_bf16(launch: Launch) -> Launch:
    """The bf16 twin of an fp16 launch: ``'*fp16'`` pointers and ``tl.float16`` constexprs -> bf16."""
    sig = {k: _swap_fp16_bf16(v) for k, v in launch.signature.items()}
    cx = {k: _swap_fp16_bf16(v) for k, v in launch.constexprs.items()}
    return dataclasses.replace(launch, signature=sig, constexprs=cx, dtype="bf16")


# ----------------------------------------------------------------------------------------------------
# Recording (interpreter side)
# ----------------------------------------------------------------------------------------------------

_ACTIVE: Optional["Recorder"] = None


class Recorder:
    """Context manager that records every Triton kernel launch made under the interpreter.

    Inside ``with Recorder() as rec:``, each ``kernel[grid](...)`` is turned into a :class:`Launch`
    (appended to ``rec.launches``) before it runs. ``rec.dry = True`` records without executing.
    Launches through an autotuner record every config of it (see module docstring) and then run the
    interpreter's single config unrecorded. Requires ``TRITON_INTERPRET=1`` when the kernels were
    imported.

    ``rec.context`` (dict with ``dtype``, ``case``, ``shapes``) is copied onto each recorded launch.
    Launches that cannot be recorded raise from the launch site (the error names the kernel).
    """

    def __init__(self, dry: bool = False):
        self.launches: list[Launch] = []
        self.dry = dry
        self.context: dict = {}
        self._config: Optional[str] = None
        self._suppress = False
        self._jit_cache: dict = {}
        self._saved = None

    # -- patching --------------------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        global _ACTIVE
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.interpreter import InterpretedFunction

        if _ACTIVE is not None:
            raise RuntimeError("compile_check.Recorder: another Recorder is already active")
        self._saved = (InterpretedFunction.run, Autotuner.run)
        orig_interp, orig_tuner = self._saved

        def interp_run(fn_self, *args, grid, warmup, **kwargs):
            rec = _ACTIVE
            if rec is None or warmup or rec._suppress:
                return orig_interp(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
            rec._record(fn_self, args, kwargs)
            if rec.dry:
                return None
            return orig_interp(fn_self, *args, grid=grid, warmup=warmup, **kwargs)

        def tuner_run(tuner, *args, **kwargs):
            rec = _ACTIVE
            if rec is None or rec._suppress:
                return orig_tuner(tuner, *args, **kwargs)
            rec._record_tuner(tuner, args, kwargs)
            if rec.dry:
                return None
            rec._suppress = True
            try:
                return orig_tuner(tuner, *args, **kwargs)
            finally:
                rec._suppress = False

        InterpretedFunction.run = interp_run
        Autotuner.run = tuner_run
        _ACTIVE = self
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.interpreter import InterpretedFunction

        InterpretedFunction.run, Autotuner.run = self._saved
        _ACTIVE = None

    # -- recording -------------------------------------------------------------------------------
    def _record_tuner(self, tuner, args, kwargs) -> None:
        configs = list(getattr(tuner, "all_configs", None) or tuner.configs)
        prune = getattr(tuner, "all_prune_configs_by", None) or {}
        early = prune.get("early_config_prune")
        full = list(configs)
        if early is not None:
            configs = early(configs, dict(zip(tuner.arg_names, args)), **kwargs)
        saved = (self.dry, self._config)
        self.dry = True
        try:
            for cfg in configs:
                idx = next((i for i, c in enumerate(full) if c is cfg), None)
                if idx is None:
                    idx = next((i for i, c in enumerate(full) if c == cfg), -1)
                self._config = f"{idx + 1}/{len(full)}"
                tuner.fn.run(*args, **kwargs, **cfg.all_kwargs())
        finally:
            self.dry, self._config = saved

    def _jit_twin(self, interp_fn):
        """A real ``JITFunction`` over the same Python function (used only for Triton's binder)."""
        from triton.runtime.jit import JITFunction

        jf = self._jit_cache.get(id(interp_fn))
        if jf is None:
            jf = JITFunction(interp_fn.fn, **getattr(interp_fn, "kwargs", {}))
            self._jit_cache[id(interp_fn)] = jf
        return jf

    def _record(self, interp_fn, args, kwargs) -> None:
        import inspect

        from triton.runtime.jit import create_function_from_signature

        fn = interp_fn.fn
        name = f"{fn.__module__}.{fn.__qualname__}"
        try:
            jf = self._jit_twin(interp_fn)
            backend = _spec_backend()
            binder = self._jit_cache.get(("binder", id(interp_fn)))
            if binder is None:
                binder = create_function_from_signature(jf.signature, jf.params, backend)
                self._jit_cache[("binder", id(interp_fn))] = binder
            bound, spec, opts = binder(*args, **kwargs)
            _, signature, constexprs, attrs = jf._pack_args(backend, kwargs, bound, spec, opts)
            options = {k: v for k, v in opts.items() if k in _option_names() and v is not None}
            launch = Launch(
                module=fn.__module__, qualname=fn.__qualname__, file=inspect.getsourcefile(fn) or "",
                arg_names=list(jf.arg_names),
                signature={k: (list(v) if isinstance(v, tuple) else v) for k, v in signature.items()},
                constexprs={_path_str(p): _encode(v) for p, v in constexprs.items()},
                attrs={_path_str(p): v for p, v in attrs.items()},
                options=options, config=self._config, **self.context)
        except Exception as e:
            raise RuntimeError(f"compile_check: cannot record the launch of {name}: {type(e).__name__}: {e}") from e
        self.launches.append(launch)


def _spec_backend():
    """The CUDA compiler backend (specialization rules; needs no GPU)."""
    global _BACKEND
    if _BACKEND is None:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend

        _BACKEND = make_backend(GPUTarget("cuda", 90, 32))
    return _BACKEND


_BACKEND = None


def _option_names() -> set:
    from triton.backends.nvidia.compiler import CUDAOptions

    return set(CUDAOptions.__dataclass_fields__) - {"arch", "debug", "instrumentation_mode"}


def dedupe(launches: Iterable[Launch]) -> list[Launch]:
    """Unique launches (first occurrence kept, ``count`` accumulated), in first-seen order."""
    out: dict[str, Launch] = {}
    for l in launches:
        k = l.key()
        if k in out:
            out[k].count += l.count
        else:
            out[k] = dataclasses.replace(l)
    return list(out.values())


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _short(dtype) -> str:
    import torch

    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, str(dtype))


def _input_bytes(case, dtype) -> Optional[int]:
    """Bytes of a real-shape case's tensor inputs, measured on fake tensors (None if that fails)."""
    import torch

    try:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            inputs = case.make_inputs("cpu", dtype, False)
            return sum(v.numel() * v.element_size() for v in inputs.values() if isinstance(v, torch.Tensor))
    except Exception:
        return None


#: tensors at least this large get a constant fill instead of random numbers during dry (real-shape) runs
_CHEAP_RANDOM_NUMEL = 1 << 20


@contextlib.contextmanager
def _cheap_random():
    """During dry runs, large ``torch.randn``/``torch.rand`` results are filled with 0.5 instead of random
    numbers (the kernels do not run, only shapes/strides/dtypes matter; random generation of GiB-sized
    inputs would dominate the recording time). Small tensors stay random (indices, gates, ...)."""
    import torch

    saved = torch.randn, torch.rand

    def cheap(orig):
        def fn(*size, generator=None, out=None, dtype=None, layout=None, device=None, requires_grad=False,
               pin_memory=False, **kw):
            shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
            numel = 1
            for n in shape:
                numel *= int(n) if isinstance(n, int) else 0
            if out is not None or kw or not shape or numel < _CHEAP_RANDOM_NUMEL or not all(
                    isinstance(n, int) for n in shape):
                extra = {} if layout is None else {"layout": layout}
                return orig(*size, generator=generator, out=out, dtype=dtype, device=device,
                            requires_grad=requires_grad, pin_memory=pin_memory, **extra, **kw)
            t = torch.empty(shape, dtype=dtype or torch.get_default_dtype(), device=device).fill_(0.5)
            return t.requires_grad_(requires_grad)
        return fn

    torch.randn, torch.rand = cheap(saved[0]), cheap(saved[1])
    try:
        yield
    finally:
        torch.randn, torch.rand = saved


def _exercise(case, dtype, small: bool) -> None:
    """Run one case forward and backward (library side only, no reference)."""
    import torch

    inputs = case.make_inputs("cpu", dtype, small)
    grad_names = [n for n in case.grad_inputs if n in inputs]
    lib = {k: (v.detach().requires_grad_(k in grad_names) if isinstance(v, torch.Tensor) else v)
           for k, v in inputs.items()}
    outs = case.run(**lib)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    classes = list(case.out_classes) + [None] * max(0, len(outs) - len(case.out_classes))
    g = torch.Generator().manual_seed(0)  # the global RNG stays untouched
    pairs = [(o, (torch.randn(o.shape, generator=g).to(o.dtype) if small else torch.ones_like(o)))
             for o, cls in zip(outs, classes)
             if cls is not None and isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]
    if grad_names and pairs:
        torch.autograd.grad([o for o, _ in pairs], [lib[n] for n in grad_names], [c for _, c in pairs],
                            allow_unused=True)


def record_launches(ops: Optional[Sequence[str]] = None, *, dtypes: Sequence[str] = RECORD_DTYPES,
                    shapes: Sequence[str] = SHAPES, bf16: bool = True,
                    real_input_budget: int = REAL_INPUT_BUDGET, cases: Optional[Sequence] = None) -> Recording:
    """Record the kernel launches of every check case (see module docstring, step 1).

    Args:
        ops: restrict to these op names (default: every op with check cases).
        dtypes: case dtypes to run (``fp32``, ``fp16``); a case's own ``dtypes`` also filter.
        shapes: ``small`` (executed under the interpreter) and/or ``real`` (dry: recorded, not run).
        bf16: add the bf16 twin of each fp16 launch of cases that list bf16 (fp16 is then recorded
            for such cases even when ``dtypes`` lacks it).
        real_input_budget: skip a real-shape case whose inputs exceed this many bytes.
        cases: explicit :class:`~mindspeed_ops.checks.CheckCase` list (in-process only).

    Runs in this process when ``TRITON_INTERPRET=1`` (it must have been set before the kernels were
    imported), otherwise in a subprocess with it set. Case failures become ``Recording.errors``.
    """
    if not _interpreting():
        if cases is not None:
            raise RuntimeError("record_launches(cases=...) needs TRITON_INTERPRET=1 in this process")
        return _record_in_subprocess(ops, dtypes, shapes, bf16, real_input_budget)

    import torch

    from . import interpreter_speedup
    from .checks import all_cases
    from .triton_utils import check_interpreter_env

    check_interpreter_env()
    interpreter_speedup.install()
    if cases is None:
        cases = all_cases()
        if ops:
            known = {c.op for c in cases}
            unknown = [o for o in ops if o not in known]
            if unknown:
                raise ValueError(f"compile_check: no check cases for {', '.join(unknown)}; "
                                 f"ops with cases: {', '.join(sorted(known))}")
            cases = [c for c in cases if c.op in ops]
    rec_out = Recording()
    all_launches: list[Launch] = []
    for case in cases:
        label = f"{case.op} {case.name}"
        rec_out.cases.append(label)
        case_dtypes = [_short(d) for d in case.dtypes]
        want_bf16 = bf16 and "bf16" in case_dtypes
        run_dtypes = [d for d in dtypes if d in case_dtypes]
        if want_bf16 and "fp16" not in run_dtypes:
            run_dtypes.append("fp16")
        n_before = len(all_launches)
        for shape in shapes:
            small = shape == "small"
            for dt in run_dtypes:
                if not small:
                    nbytes = _input_bytes(case, _dtype(dt))
                    if nbytes is not None and nbytes > real_input_budget:
                        rec_out.notes.append(f"{label} {dt} real: skipped, inputs are {nbytes / 2**30:.1f} GiB "
                                             f"(> real_input_budget {real_input_budget / 2**30:.1f} GiB)")
                        continue
                with Recorder(dry=not small) as rec, (contextlib.nullcontext() if small else _cheap_random()):
                    rec.context = {"dtype": dt, "case": label, "shapes": shape}
                    try:
                        _exercise(case, _dtype(dt), small)
                    except Exception as e:
                        msg = "".join(traceback.format_exception_only(type(e), e)).strip()
                        rec_out.errors.append(RecordError(label, dt, shape, msg))
                got = rec.launches
                all_launches.extend(got)
                if want_bf16 and dt == "fp16":
                    all_launches.extend(as_bf16(l) for l in got)
        if len(all_launches) == n_before:
            rec_out.notes.append(f"{label}: no Triton kernel launch recorded")
    rec_out.launches = dedupe(all_launches)
    return rec_out


def _record_in_subprocess(ops, dtypes, shapes, bf16, real_input_budget) -> Recording:
    with tempfile.TemporaryDirectory(prefix="mindspeed_cc_") as d:
        out = os.path.join(d, "recording.json")
        args = [sys.executable, "-m", "mindspeed_ops.compile_check", "--record-only", out,
                "--dtypes", ",".join(dtypes), "--shapes", ",".join(shapes),
                "--real-input-budget", str(real_input_budget)]
        if ops:
            args += ["--ops", ",".join(ops)]
        if not bf16:
            args.append("--no-bf16")
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        proc = subprocess.run(args, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"compile_check: recording subprocess failed ({proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return Recording.from_dict(json.load(f))


def _source_fingerprint(extra: Iterable[str] = ()) -> str:
    """Hash of the package's Python sources and the tool versions (cache key of a recording)."""
    import torch
    import triton

    h = hashlib.sha256()
    root = os.path.dirname(os.path.abspath(__file__))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                p = os.path.join(dirpath, fn)
                h.update(os.path.relpath(p, root).encode())
                with open(p, "rb") as f:
                    h.update(f.read())
    h.update(f"{triton.__version__} {torch.__version__} {_FORMAT_VERSION}".encode())
    for e in extra:
        h.update(e.encode())
    return h.hexdigest()[:20]


def _default_cache_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"mindspeed_ops_compile_check_{os.getuid()}")


def record_launches_cached(cache_dir: Optional[str] = None, **kwargs) -> Recording:
    """:func:`record_launches` cached on disk, keyed by a hash of the package sources and arguments.

    Concurrent callers (pytest-xdist workers collecting the same tests) take a file lock, so one
    records and the others read its result.
    """
    cache_dir = cache_dir or _default_cache_dir()
    os.makedirs(cache_dir, exist_ok=True)
    key = _source_fingerprint([json.dumps(kwargs, sort_keys=True, default=str), str(_interpreting())])
    path = os.path.join(cache_dir, f"recording-{key}.json")
    lock = _FileLock(path + ".lock")
    with lock:
        if os.path.exists(path):
            try:
                with open(path) as f:
                    return Recording.from_dict(json.load(f))
            except (OSError, ValueError, KeyError):
                pass
        rec = record_launches(**kwargs)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(rec.to_dict(), f)
        os.replace(tmp, path)
        _prune_cache(cache_dir, keep=8)
        return rec


def _prune_cache(cache_dir: str, keep: int) -> None:
    """Delete all but the ``keep`` newest cached recordings."""
    with contextlib.suppress(OSError):
        files = sorted((os.path.join(cache_dir, f) for f in os.listdir(cache_dir)
                        if f.startswith("recording-") and f.endswith(".json")), key=os.path.getmtime, reverse=True)
        for f in files[keep:]:
            with contextlib.suppress(OSError):
                os.remove(f)
            with contextlib.suppress(OSError):
                os.remove(f + ".lock")


class _FileLock:
    def __init__(self, path: str):
        self.path = path
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - non-POSIX
            pass
        return self

    def __exit__(self, *exc):
        try:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_UN)
        except ImportError:  # pragma: no cover
            pass
        os.close(self.fd)


# ----------------------------------------------------------------------------------------------------
# Compiling (compiler side: TRITON_INTERPRET=0)
# ----------------------------------------------------------------------------------------------------

def _resolve_kernel(module: str, qualname: str, file: str = "", unwrap: bool = True):
    """The ``JITFunction`` for ``module.qualname`` (unwrapping autotuners/heuristics)."""
    from triton.runtime.jit import JITFunction

    if "<locals>" in qualname:
        raise RuntimeError(f"{module}.{qualname} is defined inside a function; compile_check can only rebuild "
                           "module-level kernels (define it at module level)")
    try:
        mod = importlib.import_module(module)
    except ImportError:
        if not file or not os.path.exists(file):
            raise
        mod = sys.modules.get(f"_compile_check_{module}")
        if mod is None:
            spec = importlib.util.spec_from_file_location(f"_compile_check_{module}", file)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
    obj: Any = mod
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        obj = None
    candidates = [obj] if obj is not None else []
    if obj is None or not _base_matches(obj, qualname):
        candidates += [v for v in vars(mod).values() if _base_matches(v, qualname)]
    for cand in candidates:
        jf = cand
        while unwrap and not isinstance(jf, JITFunction) and hasattr(jf, "fn"):
            jf = jf.fn
        if not unwrap or isinstance(jf, JITFunction):
            if not unwrap:
                return cand
            if os.environ.get("TRITON_INTERPRET", "0") == "1":
                raise RuntimeError("the compiler process must run with TRITON_INTERPRET=0")
            return jf
    raise LookupError(f"no @triton.jit function {qualname!r} in module {module} ({file})")


def _base_matches(obj, qualname: str) -> bool:
    fn = obj
    for _ in range(8):
        inner = getattr(fn, "fn", None)
        if inner is None:
            break
        fn = inner
    return getattr(fn, "__qualname__", None) == qualname and obj is not fn


def _tool(name: str) -> Optional[str]:
    try:
        from triton import knobs

        t = getattr(knobs.nvidia, name)
        if t is not None and t.path:
            return t.path
    except Exception:
        pass
    try:
        import triton.backends.nvidia as nv

        p = os.path.join(os.path.dirname(nv.__file__), "bin", name)
        return p if os.path.exists(p) else None
    except Exception:
        return None


_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def _parse_ptxas_log(log: str, name: Optional[str] = None) -> Optional[dict]:
    """regs/stack/spills of entry function ``name`` (default: the first function) from a ``ptxas -v``
    log (None if the log has none)."""
    m = r = None
    if name:
        n = re.escape(name)
        m = re.search(rf"Function properties for {n}\s*\n\s*" + _PTXAS_STACK.pattern, log)
        r = re.search(rf"Compiling entry function '{n}'[^\n]*\n(?:(?!Compiling entry)[\s\S])*?"
                      + _PTXAS_REGS.pattern, log)
    if not (m and r):
        m, r = _PTXAS_STACK.search(log), _PTXAS_REGS.search(log)
    if not (m and r):
        return None
    return {"regs": int(r.group(1)), "stack": int(m.group(1)), "spill_stores": int(m.group(2)),
            "spill_loads": int(m.group(3))}


def resource_usage(cubin: bytes, ptx: Optional[str], arch: int) -> dict:
    """Registers, stack and spill bytes of a compiled kernel (``cuobjdump``; ``ptxas -v`` for spills)."""
    out: dict = {"regs": None, "stack": None, "spill_stores": None, "spill_loads": None}
    cuobjdump = _tool("cuobjdump")
    if not cuobjdump:
        return out
    with tempfile.TemporaryDirectory(prefix="mindspeed_cc_") as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        try:
            txt = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True,
                                 timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return out
        m = re.search(r"REG:(\d+)\s+STACK:(\d+)", txt)
        if not m:
            return out
        out["regs"], out["stack"] = int(m.group(1)), int(m.group(2))
        out["spill_stores"] = out["spill_loads"] = 0 if out["stack"] == 0 else None
        ptxas = _tool("ptxas")
        if out["stack"] and ptx and ptxas:  # only ptxas -v tells spills apart from other stack use
            from triton.backends.nvidia.compiler import sm_arch_from_capability

            pfile = os.path.join(d, "k.ptx")
            with open(pfile, "w") as f:
                f.write(ptx)
            try:
                log = subprocess.run([ptxas, "-v", f"--gpu-name={sm_arch_from_capability(arch)}", pfile, "-o",
                                      os.path.join(d, "k.o")], capture_output=True, text=True, timeout=300).stderr
                parsed = _parse_ptxas_log(log)
                if parsed:
                    out["spill_stores"], out["spill_loads"] = parsed["spill_stores"], parsed["spill_loads"]
            except (OSError, subprocess.SubprocessError):
                pass
    return out


_USAGE_FORMAT = 1  # bump when resource_usage/_parse_ptxas_log change what they report (old entries are not read)


def _usage_path(kernel_hash: str) -> str:
    return os.path.join(_default_cache_dir(), f"usage-v{_USAGE_FORMAT}", f"{kernel_hash}.json")


def _usage_complete(usage) -> bool:
    """Registers and stack known, and the spill bytes too wherever there is a stack (ptxas -v ran)."""
    keys = ("regs", "stack", "spill_stores", "spill_loads")
    return (isinstance(usage, dict) and all(k in usage for k in keys) and usage["regs"] is not None
            and usage["stack"] is not None and (usage["stack"] == 0 or usage["spill_stores"] is not None))


def cached_resource_usage(kernel_hash: str, cubin: bytes, ptx: Optional[str], arch: int) -> dict:
    """:func:`resource_usage`, kept on disk by Triton's kernel hash (which covers the source, constexprs,
    options, target and Triton version, so the same hash is the same cubin). On a Triton cache hit ptxas does
    not run, and a spilling kernel's ``ptxas -v`` rebuild took seconds per launch in every test run."""
    with contextlib.suppress(OSError, ValueError):
        with open(_usage_path(kernel_hash)) as f:
            kept = json.load(f)
        if _usage_complete(kept):  # anything else (a damaged file) is a miss
            return kept
    usage = resource_usage(cubin, ptx, arch)
    store_resource_usage(kernel_hash, usage)
    return usage


def store_resource_usage(kernel_hash: str, usage: dict) -> None:
    """Keep ``usage`` if complete (a failed or partial tool run is not remembered)."""
    if not _usage_complete(usage):
        return
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(_usage_path(kernel_hash)), exist_ok=True)
        tmp = f"{_usage_path(kernel_hash)}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(usage, f)
        os.replace(tmp, _usage_path(kernel_hash))


def limit_violations(arch: int, shared: Optional[int], regs: Optional[int], num_warps: int) -> list[str]:
    """Reasons a compiled kernel could not launch on ``arch`` (shared memory, registers, threads)."""
    problems = []
    lim = SHARED_LIMIT.get(arch)
    if shared is not None and lim is not None and shared > lim:
        problems.append(f"OutOfResources: needs {shared} B of shared memory ({shared / 1024:.1f} KB); "
                        f"sm_{arch} allows {lim} B ({lim / 1024:.0f} KB) per block")
    threads = num_warps * 32
    if threads > MAX_THREADS:
        problems.append(f"OutOfResources: num_warps={num_warps} gives {threads} threads > {MAX_THREADS}")
    if regs is not None:
        per_warp = -(-regs * 32 // _REG_ALLOC_UNIT) * _REG_ALLOC_UNIT
        if per_warp * num_warps > REGISTER_FILE:
            problems.append(f"OutOfResources: {regs} registers x {threads} threads exceed the "
                            f"{REGISTER_FILE}-register file")
    return problems


@contextlib.contextmanager
def _captured_output():
    """Redirect fds 1 and 2 (C-level output included) to a temp file; yields a function reading it."""
    with tempfile.TemporaryFile() as cap:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(cap.fileno(), 1)
        os.dup2(cap.fileno(), 2)

        def read() -> str:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            cap.seek(0)
            return cap.read().decode(errors="replace")

        try:
            yield read
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def compile_kernel(launch: Launch, arch: int):
    """Triton's compiled kernel (``.asm["cubin"]``, ``["ptx"]``, ``.metadata``) of ``launch`` for ``sm_<arch>``,
    built in this process (needs ``TRITON_INTERPRET=0`` at import). Raises what the compiler raises."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import convert_to_tuple_if_list

    fn = _resolve_kernel(launch.module, launch.qualname, launch.file)
    signature = {k: convert_to_tuple_if_list(json.loads(json.dumps(v))) for k, v in launch.signature.items()}
    constexprs = {_path_tuple(p): _decode(v) for p, v in launch.constexprs.items()}
    attrs = {_path_tuple(p): v for p, v in launch.attrs.items()}
    src = ASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(launch.options))


def compile_one(launch: Launch, arch: int) -> CompileResult:
    """Compile ``launch`` for ``sm_<arch>`` in this process (needs ``TRITON_INTERPRET=0`` at import).

    Never raises: a compiler error, or shared memory / registers over the arch's limits, gives
    ``ok=False`` with the message in ``error``.
    """
    from triton import knobs

    t0 = time.perf_counter()
    res = CompileResult(launch, arch, ok=False)
    log = ""
    try:
        saved_dump = knobs.nvidia.dump_ptxas_log
        knobs.nvidia.dump_ptxas_log = True  # ptxas -v output: registers and spills at no extra cost
        try:
            with _captured_output() as read:
                try:
                    kernel = compile_kernel(launch, arch)
                finally:
                    log = read()
        finally:
            knobs.nvidia.dump_ptxas_log = saved_dump
        md = kernel.metadata
        res.shared = int(md.shared)
        usage = _parse_ptxas_log(log, md.name)  # None on a Triton cache hit (ptxas did not run)
        if usage is None:
            usage = cached_resource_usage(md.hash, kernel.asm["cubin"], kernel.asm.get("ptx"), arch)
        else:
            store_resource_usage(md.hash, usage)
        res.regs, res.stack = usage["regs"], usage["stack"]
        res.spill_stores, res.spill_loads = usage["spill_stores"], usage["spill_loads"]
        problems = limit_violations(arch, res.shared, res.regs, int(md.num_warps))
        res.ok = not problems
        res.error = "\n".join(problems)
    except Exception as e:
        res.error = "".join(traceback.format_exception_only(type(e), e)).strip() or type(e).__name__
        first = res.error.split(":", 1)[0]
        if log.strip() and not first.endswith(("CompilationError", "PTXASError")):
            # e.g. an MLIR pass failure: the diagnostics went to stderr, not into the exception
            res.error += "\n--- compiler output (tail) ---\n" + log.strip()[-4000:]
    res.seconds = time.perf_counter() - t0
    return res


def _worker_main() -> None:
    """Compiler process loop: one JSON request per stdin line, one JSON reply per line on the protocol fd."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the compiler prints (ptxas dumps whole PTX files) must not reach the protocol
    sys.stdout = sys.stderr
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        res = compile_one(Launch.from_dict(req["launch"]), int(req["arch"]))
        reply = res.to_dict()
        proto.write(json.dumps(reply, default=str) + "\n")


class CompileWorker:
    """A long-lived compiler subprocess (``TRITON_INTERPRET=0``).

    ``worker.compile(launch, arch)`` returns a :class:`CompileResult`. A crash (the MLIR pipeline can
    abort the process) or a timeout becomes a failed result and the process is restarted.
    """

    def __init__(self, timeout: float = _DEFAULT_TIMEOUT, env: Optional[dict] = None):
        self.timeout = timeout
        self._env = env
        self._proc = None
        self._log = None
        self._replies: "queue.Queue[Optional[str]]" = queue.Queue()

    def _start(self) -> None:
        env = dict(os.environ if self._env is None else self._env)
        env["TRITON_INTERPRET"] = "0"
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).strip(os.pathsep)
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from mindspeed_ops.compile_check import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env, text=True, bufsize=1)
        self._replies = queue.Queue()
        proc, replies = self._proc, self._replies

        def pump():
            for line in proc.stdout:
                replies.put(line)
            replies.put(None)

        threading.Thread(target=pump, daemon=True).start()
        first = self._get(max(self.timeout, 120.0))
        if first is None or not json.loads(first).get("ready"):
            msg = self._log_tail()
            self.close()
            raise RuntimeError(f"compile_check: the compiler process did not start:\n{msg}")

    def _get(self, timeout: float) -> Optional[str]:
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            return "__timeout__"

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        try:
            self._log.seek(0)
            return self._log.read().decode(errors="replace")[-3000:]
        except (OSError, ValueError):
            return ""

    def compile(self, launch: Launch, arch: int) -> CompileResult:
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        t0 = time.perf_counter()
        try:
            self._proc.stdin.write(json.dumps({"launch": launch.to_dict(), "arch": arch}) + "\n")
            self._proc.stdin.flush()
            line = self._get(self.timeout)
        except (BrokenPipeError, OSError):
            line = None
        if line is None or line == "__timeout__":
            if line is None:
                with contextlib.suppress(Exception):
                    self._proc.wait(timeout=10)
            what = (f"timed out after {self.timeout:.0f} s" if line == "__timeout__"
                    else f"crashed (exit code {self._proc.poll()})")
            tail = self._log_tail()
            self.close(kill=True)
            return CompileResult(launch, arch, ok=False, seconds=time.perf_counter() - t0,
                                 error=f"CompilerCrash: the compiler process {what}\n{tail}")
        d = json.loads(line)
        d.pop("summary", None)
        d["launch"] = launch
        return CompileResult(**d)

    def close(self, kill: bool = False) -> None:
        """Stop the compiler process (``kill``: at once, e.g. after a timeout)."""
        if self._proc is not None:
            with contextlib.suppress(Exception):
                self._proc.stdin.close()
            if self._proc.poll() is None and not kill:
                with contextlib.suppress(Exception):
                    self._proc.wait(timeout=5)
            if self._proc.poll() is None:
                self._proc.kill()
                with contextlib.suppress(Exception):
                    self._proc.wait(timeout=5)
            self._proc = None
        if self._log is not None:
            with contextlib.suppress(Exception):
                self._log.close()
            self._log = None

    def __enter__(self) -> "CompileWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.close()


def compile_launches(launches: Sequence[Launch], archs: Sequence[int] = ARCHS, *, jobs: int = 1,
                     timeout: float = _DEFAULT_TIMEOUT,
                     on_result: Optional[Callable[[CompileResult], None]] = None) -> list[CompileResult]:
    """Compile every launch for every arch in ``jobs`` worker processes; results in input order."""
    work = [(l, a) for l in launches for a in archs]
    results: list[Optional[CompileResult]] = [None] * len(work)
    q: "queue.Queue[int]" = queue.Queue()
    for i in range(len(work)):
        q.put(i)
    lock = threading.Lock()

    def run():
        with CompileWorker(timeout=timeout) as w:
            while True:
                try:
                    i = q.get_nowait()
                except queue.Empty:
                    return
                r = w.compile(*work[i])
                results[i] = r
                if on_result is not None:
                    with lock:
                        on_result(r)

    n = max(1, min(int(jobs), len(work)))
    threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:
        raise RuntimeError(f"compile_check: {len(missing)} compilations produced no result")
    return results  # type: ignore[return-value]


def check_all(ops: Optional[Sequence[str]] = None, archs: Sequence[int] = ARCHS, *,
              dtypes: Sequence[str] = RECORD_DTYPES, shapes: Sequence[str] = SHAPES, bf16: bool = True,
              jobs: int = 1, timeout: float = _DEFAULT_TIMEOUT, real_input_budget: int = REAL_INPUT_BUDGET,
              on_result: Optional[Callable[[CompileResult], None]] = None) -> CompileReport:
    """Record every kernel launch of the check cases, then compile each one for each arch.

    Returns a :class:`CompileReport`; ``report.ok`` is false if any compilation failed (compiler
    error, or shared memory / registers / threads over the arch's limit) or a case failed to run.
    """
    rec = record_launches(ops, dtypes=dtypes, shapes=shapes, bf16=bf16, real_input_budget=real_input_budget)
    results = compile_launches(rec.launches, archs, jobs=jobs, timeout=timeout, on_result=on_result)
    return CompileReport(rec, results)


# ----------------------------------------------------------------------------------------------------
# Reporting
# ----------------------------------------------------------------------------------------------------

def _kb(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / 1024:.1f}"


def _num(n: Optional[int]) -> str:
    return "-" if n is None else str(n)


def _spills(r: CompileResult) -> str:
    if r.stack is None:
        return "-"
    if r.stack == 0:
        return "0"
    if r.spill_stores is None:
        return f"stack {r.stack} B"
    return f"{r.spill_stores}/{r.spill_loads} B"


def format_table(results: Sequence[CompileResult]) -> str:
    """One row per (launch, arch): kernel, dtype, constexprs, options, arch, status, shared KB, regs, spills."""
    header = ["kernel", "dtype", "constexprs", "opts", "cfg", "arch", "status", "smem KB", "regs", "spills st/ld"]
    rows = [header]
    for r in results:
        l = r.launch
        rows.append([l.qualname, l.dtype, l.constexpr_str(), l.options_str(), l.config or "-", f"sm_{r.arch}",
                     "ok" if r.ok else "FAIL", _kb(r.shared), _num(r.regs), _spills(r)])
    return _render(rows) + _failure_details(results)


def summary_table(results: Sequence[CompileResult]) -> str:
    """Per kernel and arch: specializations compiled, failures, max shared memory, register range,
    specializations that spill (and the most spill-store bytes), largest ``num_warps``."""
    groups: dict = {}
    for r in results:
        groups.setdefault((r.launch.module, r.launch.qualname, r.arch), []).append(r)
    rows = [["kernel", "arch", "variants", "failed", "max smem KB", "regs min-max", "spilling", "max spill B",
             "max warps"]]
    for (mod, name, arch), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        built = [r for r in rs if r.shared is not None]
        regs = [r.regs for r in built if r.regs is not None]
        spill = [r.spill_stores if r.spill_stores is not None else r.stack for r in built if r.stack]
        rows.append([name, f"sm_{arch}", str(len(rs)), str(sum(not r.ok for r in rs)),
                     _kb(max((r.shared for r in built), default=None)),
                     f"{min(regs)}-{max(regs)}" if regs else "-", str(len(spill)), _num(max(spill, default=None)),
                     str(max(r.launch.options.get("num_warps", 4) for r in rs))])
    return _render(rows)


def _render(rows: list) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def _failure_details(results: Sequence[CompileResult]) -> str:
    bad = [r for r in results if not r.ok]
    if not bad:
        return ""
    out = ["", f"{len(bad)} failure(s):"]
    for r in bad:
        out.append(f"- {r.launch.label()} sm_{r.arch} (case {r.launch.case}, {r.launch.shapes} shapes): {r.summary}")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------

def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _archs(s: str) -> list[int]:
    try:
        return [int(x) for x in _csv(s)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated compute capabilities such as 80,90, got {s!r}")


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    """Arguments of ``mindspeed-ops compile-check`` (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(
        prog="mindspeed-ops compile-check",
        description="Compile every Triton kernel (and autotune config) of the library for sm_80/sm_90 "
                    "without a GPU; report errors, shared memory, registers and spills.")
    p.add_argument("--ops", type=_csv, default=None, help="comma-separated op names (default: all)")
    p.add_argument("--arch", type=_archs, default=list(ARCHS),
                   help="comma-separated compute capabilities, e.g. 80,90 (default)")
    p.add_argument("--dtypes", type=_csv, default=list(RECORD_DTYPES), help="case dtypes to record: fp32,fp16")
    p.add_argument("--shapes", type=_csv, default=list(SHAPES), help="small,real (real shapes are recorded dry)")
    p.add_argument("--no-real", action="store_true", help="record small shapes only")
    p.add_argument("--no-bf16", action="store_true", help="do not derive bf16 launches from fp16 ones")
    p.add_argument("--jobs", "-j", type=int, default=min(4, os.cpu_count() or 1), help="compiler processes")
    p.add_argument("--timeout", type=float, default=_DEFAULT_TIMEOUT, help="seconds per compilation")
    p.add_argument("--real-input-budget", type=int, default=REAL_INPUT_BUDGET,
                   help="skip real-shape cases whose inputs exceed this many bytes")
    p.add_argument("--json", dest="json_out", default=None, help="also write the full report as JSON here")
    p.add_argument("--full", action="store_true",
                   help="print one row per kernel specialization and arch (default: per-kernel summary and failures)")
    p.add_argument("--record-only", default=None, help=argparse.SUPPRESS)  # internal: write a Recording as JSON
    return p


def run_cli(args: argparse.Namespace, parser: Optional[argparse.ArgumentParser] = None) -> int:
    """Run ``compile-check`` from parsed arguments; returns the exit code (1 if anything failed). Bad
    arguments are usage errors (``parser.error``: exit code 2) when ``parser`` is given."""
    def usage(msg: str):
        if parser is not None:
            parser.error(msg)
        raise SystemExit(f"compile-check: {msg}")

    shapes = ["small"] if args.no_real else args.shapes
    bad = [d for d in args.dtypes if d not in RECORD_DTYPES]
    if bad:
        usage(f"--dtypes accepts {', '.join(RECORD_DTYPES)} (bf16 launches are derived from fp16 ones), "
              f"got {', '.join(bad)}")
    if not args.dtypes:  # e.g. --dtypes ",": an empty selection is not the default one
        usage(f"--dtypes: none given; accepts {', '.join(RECORD_DTYPES)}")
    bad = [s for s in shapes if s not in SHAPES]
    if bad or not shapes:  # no shapes compiled nothing and reported 0/0 ok
        usage(f"--shapes accepts {', '.join(SHAPES)}, got {', '.join(bad) or 'none'}")
    bad = [a for a in args.arch if a not in SHARED_LIMIT]
    if bad or not args.arch:
        usage(f"--arch accepts {', '.join(map(str, sorted(SHARED_LIMIT)))}, got {', '.join(map(str, bad)) or 'none'}")
    if args.jobs < 1:
        usage(f"--jobs must be >= 1, got {args.jobs}")
    if not args.timeout > 0:
        usage(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if args.real_input_budget < 0:
        usage(f"--real-input-budget must be >= 0 bytes, got {args.real_input_budget}")
    if args.ops is not None and not args.ops:
        usage("--ops: no op names given")
    if args.json_out is not None:
        from .check_runner import output_path_problem

        if problem := output_path_problem(args.json_out):  # fail now, not after minutes of compiling
            usage(f"--json {args.json_out}: {problem}")
    if args.ops:
        from .checks import all_cases

        known = {c.op for c in all_cases()}
        unknown = [o for o in args.ops if o not in known]
        if unknown:
            usage(f"--ops: no check cases for {', '.join(unknown)}; ops with cases: {', '.join(sorted(known))}")
    if args.record_only:
        rec = record_launches(args.ops, dtypes=args.dtypes, shapes=shapes, bf16=not args.no_bf16,
                              real_input_budget=args.real_input_budget)
        with open(args.record_only, "w") as f:
            json.dump(rec.to_dict(), f)
        return 0
    t0 = time.perf_counter()
    rec = record_launches(args.ops, dtypes=args.dtypes, shapes=shapes, bf16=not args.no_bf16,
                          real_input_budget=args.real_input_budget)
    t1 = time.perf_counter()
    print(f"recorded {len(rec.launches)} kernel specializations from {len(rec.cases)} check cases "
          f"in {t1 - t0:.1f} s; compiling for {', '.join(f'sm_{a}' for a in args.arch)} ...", flush=True)
    results = compile_launches(rec.launches, args.arch, jobs=args.jobs, timeout=args.timeout)
    t2 = time.perf_counter()
    if args.full:
        print(format_table(results))
    else:
        print(summary_table(results) + _failure_details(results))
    for note in rec.notes:
        print(f"note: {note}")
    for e in rec.errors:
        print(f"RECORD ERROR: {e.case} {e.dtype} {e.shapes}: {e.error}")
    n_bad = sum(not r.ok for r in results)
    print(f"{len(results) - n_bad}/{len(results)} compilations ok, {len(rec.errors)} recording error(s); "
          f"compile time {t2 - t1:.1f} s ({args.jobs} process(es))")
    if args.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
        with open(args.json_out, "w") as f:
            json.dump(CompileReport(rec, results).to_dict(), f, indent=1, default=str)
    return 0 if (n_bad == 0 and not rec.errors) else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``mindspeed-ops compile-check`` (also ``python -m mindspeed_ops.compile_check``)."""
    args = build_parser().parse_args(argv)
    return run_cli(args)


if __name__ == "__main__":
    sys.exit(main())
