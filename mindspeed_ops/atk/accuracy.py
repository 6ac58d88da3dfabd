"""ATK accuracy and determinism of one (case, shape point, dtype, backend).

Accuracy follows SPEC 0.9 exactly as ``mindspeed-ops check`` does (:mod:`mindspeed_ops.check_runner`,
whose gradient helpers it uses): the library runs on the case's inputs, the reference on float64 copies
of the same (already rounded) inputs, seeded random upstream gradients flow back through both, and every
output and gradient is compared with :func:`mindspeed_ops.testing.compare` at the case's threshold
(NaN never passes; with ``nan_mask: true`` the NaN/Inf positions must match the reference's exactly).
On top of ``check`` it supports in-place operators (``mutates``: both sides work on clones; the
upstream gradients are cloned per backward, since an in-place backward may rotate them), numeric
thresholds and ``err_atol`` overrides, and it counts non-finite values in every result.

Determinism runs the library's forward+backward twice on the same inputs and compares every output and
gradient bitwise (SPEC 0.6).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .. import backends
from ..check_runner import _as_tuple, _backward, _exc_text
from ..testing import _bits, compare, randn, threshold, to_ref


@dataclass
class Point:
    """A fully resolved run target: case, shape point, dtype and the callables."""

    case: Any  # schema.CaseSpec
    shape: Any  # schema.ShapePoint
    dtype: torch.dtype
    call: Any
    reference: Any

    @property
    def dims(self) -> dict:
        return self.shape.dims


def _dtype_short(dtype: torch.dtype) -> str:
    from .inputs import SHORT

    return SHORT.get(dtype, str(dtype))


def backend_for(case, device: torch.device, requested: Optional[str]) -> tuple[str, contextlib.AbstractContextManager]:
    """(backend label, context manager that selects it) for ``case`` on ``device``.

    ``requested=None`` keeps the default dispatch. Ops that are not registered (GDN stage functions,
    wrappers) run Triton where it can run (CUDA, or CPU under ``TRITON_INTERPRET=1``) and cannot be
    forced: asking for another backend raises ``ValueError``.
    """
    op = case.dispatch_op
    registered = op in backends.registered_ops() if op else False
    if not registered:
        label = "triton" if backends.backend_status("triton", device)[0] else "reference"
        if requested not in (None, label):
            raise ValueError(f"{case.op} is not a registered op: its backend cannot be forced to {requested!r}")
        return label, contextlib.nullcontext()
    if requested is None:
        return backends.select(op, device), contextlib.nullcontext()
    return requested, backends.use_backend(requested, ops=[op])


def grad_class(case, name: str):
    """Threshold class of the gradient of input ``name`` (``grad_class`` may be one class or a mapping
    input -> class with an optional ``default``)."""
    gc = case.grad_class
    return gc.get(name, gc.get("default")) if isinstance(gc, dict) else gc


def _cmp_threshold(cls, dtype: torch.dtype) -> float:
    return float(cls) if isinstance(cls, (int, float)) else threshold(cls, dtype)


def _nonfinite(t) -> int:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return 0
    return int((~torch.isfinite(t)).sum())


@dataclass
class AccuracyRow:
    op: str
    family: str
    case: str
    values: str
    shape: str
    dims: dict
    dtype: str
    backend: str
    passed: bool = False
    fwd_rel_rms: Optional[float] = None
    grad_rel_rms: Optional[float] = None
    nonfinite: int = 0
    seconds: float = 0.0
    reason: str = ""
    comparisons: list = field(default_factory=list)

    def to_dict(self) -> dict:
        from .measure import finite_or_none

        d = dict(self.__dict__)
        d["fwd_rel_rms"] = finite_or_none(self.fwd_rel_rms)
        d["grad_rel_rms"] = finite_or_none(self.grad_rel_rms)
        d["comparisons"] = [{k: finite_or_none(v) for k, v in c.items()} for c in self.comparisons]
        return d


def _prepare(point: Point, device):
    from .inputs import build_inputs

    case = point.case
    inputs = build_inputs(case, point.dims, point.dtype, device)
    grad_names = [n for n in case.grads if isinstance(inputs.get(n), torch.Tensor)]
    return inputs, grad_names


def _lib_call(point: Point, lib_in: dict):
    from .inputs import call_kwargs

    kw = {k: (v.clone() if k in point.case.mutates else v) for k, v in lib_in.items()}
    return _as_tuple(point.call(**kw, **call_kwargs(point.case, point.dims, point.dtype)))


def verify(point: Point, device, *, backend: Optional[str] = None, seed: int = 1000) -> AccuracyRow:
    """Accuracy of one point (see module docstring); never raises for a failing case."""
    case = point.case
    device = torch.device(device)
    row = AccuracyRow(case.op, case.family, case.name, case.values, point.shape.text(), dict(point.dims),
                      _dtype_short(point.dtype), backend or "default")
    t0 = time.perf_counter()
    try:
        row.backend, ctx = backend_for(case, device, backend)
        with ctx:
            inputs, grad_names = _prepare(point, device)
            ref_in = {k: (to_ref(v, requires_grad=k in grad_names)[0] if isinstance(v, torch.Tensor) else v)
                      for k, v in inputs.items()}
            lib_in = {k: (v.detach().clone().requires_grad_(k in grad_names) if isinstance(v, torch.Tensor) else v)
                      for k, v in inputs.items()}
            outs = _lib_call(point, lib_in)
            classes = list(case.outputs)
            if len(classes) != len(outs):
                raise ValueError(f"the case lists {len(classes)} output classes but the op returned {len(outs)}")
            cots = [randn(o.shape, o.dtype, o.device, seed=seed + 1 + i)
                    if c is not None and isinstance(o, torch.Tensor) and o.is_floating_point() else None
                    for i, (o, c) in enumerate(zip(outs, classes))]
            lib_grads = _backward(outs, [None if c is None else c.clone() for c in cots],
                                  [lib_in[n] for n in grad_names])
            ref_kw = {k: (v.clone() if k in case.mutates and isinstance(v, torch.Tensor) else v)
                      for k, v in ref_in.items()}
            ref_outs = _as_tuple(point.reference(**ref_kw))
            if len(ref_outs) != len(outs):
                raise ValueError(f"the reference returned {len(ref_outs)} outputs, the op {len(outs)}")
            ref_grads = _backward(ref_outs, cots, [ref_in[n] for n in grad_names])

        names = case.output_names or ([f"out[{i}]" for i in range(len(outs))] if len(outs) > 1 else ["out"])
        comps, fwd, grd = [], [], []
        for name, o, r, cls in zip(names, outs, ref_outs, classes):
            if cls is None or (o is None and r is None):
                continue
            row.nonfinite += _nonfinite(o)
            if not isinstance(o, torch.Tensor) or not isinstance(r, torch.Tensor):
                comps.append({"name": name, "class": cls, "threshold": None, "rel_rms": math.inf, "max_abs": None,
                              "passed": False, "reason": f"output is {type(o).__name__}, reference {type(r).__name__}"})
                continue
            thr = _cmp_threshold(cls, point.dtype)
            c = compare(name, r, o, thr, case.err_atol, nan_mask=case.nan_mask)
            fwd.append(c.rel_rms)
            comps.append({"name": name, "class": cls, "threshold": thr, "rel_rms": c.rel_rms, "max_abs": c.max_abs,
                          "passed": c.passed, "reason": c.reason})
        for n, g, r in zip(grad_names, lib_grads, ref_grads):
            row.nonfinite += _nonfinite(g)
            cls = grad_class(case, n)
            thr = _cmp_threshold(cls, point.dtype)
            c = compare(f"d{n}", r, g, thr, case.err_atol, nan_mask=case.nan_mask)
            grd.append(c.rel_rms)
            comps.append({"name": f"d{n}", "class": cls, "threshold": thr, "rel_rms": c.rel_rms,
                          "max_abs": c.max_abs, "passed": c.passed, "reason": c.reason})
        row.comparisons = comps
        row.fwd_rel_rms = max(fwd) if fwd else None
        row.grad_rel_rms = max(grd) if grd else None
        failed = [c for c in comps if not c["passed"]]
        row.passed = not failed and bool(comps)
        row.reason = "; ".join(f"{c['name']}: {c['reason']}" for c in failed) or ("" if comps else "nothing compared")
    except Exception as e:  # a broken case is a FAIL row, not a crash
        row.passed = False
        row.reason = _exc_text(e)
    finally:
        row.seconds = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


@dataclass
class DeterminismRow:
    op: str
    family: str
    case: str
    shape: str
    dims: dict
    dtype: str
    backend: str
    fwd_bitwise: Optional[bool] = None
    bwd_bitwise: Optional[bool] = None
    passed: bool = False
    reason: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _run_once(point: Point, inputs: dict, grad_names: list, cots: Optional[list]):
    lib_in = {k: (v.detach().clone().requires_grad_(k in grad_names) if isinstance(v, torch.Tensor) else v)
              for k, v in inputs.items()}
    outs = _lib_call(point, lib_in)
    if cots is None:
        cots = [randn(o.shape, o.dtype, o.device, seed=2000 + i)
                if c is not None and isinstance(o, torch.Tensor) and o.is_floating_point() else None
                for i, (o, c) in enumerate(zip(outs, point.case.outputs))]
    grads = _backward(outs, [None if c is None else c.clone() for c in cots], [lib_in[n] for n in grad_names]) \
        if grad_names else []
    outs = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]
    return outs, grads, cots


def _same(a: list, b: list) -> tuple[bool, str]:
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or not torch.equal(_bits(x), _bits(y)):
                return False, f"#{i} differs"
        elif (x is None) != (y is None):
            return False, f"#{i}: None vs tensor"
    return True, ""


def determinism(point: Point, device, *, backend: Optional[str] = None) -> DeterminismRow:
    """Bitwise repeatability of forward and backward (two runs, same inputs and upstream gradients)."""
    case = point.case
    device = torch.device(device)
    row = DeterminismRow(case.op, case.family, case.name, point.shape.text(), dict(point.dims),
                         _dtype_short(point.dtype), backend or "default")
    t0 = time.perf_counter()
    try:
        row.backend, ctx = backend_for(case, device, backend)
        with ctx:
            inputs, grad_names = _prepare(point, device)
            o1, g1, cots = _run_once(point, inputs, grad_names, None)
            o2, g2, _ = _run_once(point, inputs, grad_names, cots)
        row.fwd_bitwise, why_f = _same(o1, o2)
        row.bwd_bitwise, why_b = _same(g1, g2) if grad_names else (None, "")
        row.passed = row.fwd_bitwise and row.bwd_bitwise is not False
        row.reason = "; ".join(s for s in (why_f and f"output {why_f}", why_b and f"gradient {why_b}") if s)
    except Exception as e:
        row.passed = False
        row.reason = _exc_text(e)
    finally:
        row.seconds = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


__all__ = ["Point", "backend_for", "AccuracyRow", "verify", "DeterminismRow", "determinism"]
