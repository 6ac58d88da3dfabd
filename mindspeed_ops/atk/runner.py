"""Plan and run ATK suites over the case files; collect one report dict (see :mod:`.report`).

Suites:

- ``accuracy``: every (case, shape point, dtype, backend) against the float64 reference
  (:func:`mindspeed_ops.atk.accuracy.verify`);
- ``determinism``: bitwise repeatability of forward and backward (:func:`.accuracy.determinism`);
- ``performance`` and ``memory``: ``ours`` and every baseline in the same run, forward and
  forward+backward (:func:`mindspeed_ops.atk.measure.measure_case`), with the copy-bandwidth and bf16
  GEMM ceilings measured once at the start.

On CPU, ``all`` means accuracy and determinism at the points marked ``cpu: true`` (Triton under the
interpreter plus the ``reference`` backend); performance and memory need CUDA and run on CPU only when
asked for by name (plumbing checks: host timings, no memory numbers).
"""
from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from .report import done_key as _done_key, done_runs, merge_reports
from .schema import SUITES, CaseSpec, OpSpec, ShapePoint, load_specs


@dataclass
class Options:
    """What to run (the ``mindspeed-ops atk`` arguments)."""

    ops: Optional[list] = None
    suites: Sequence[str] = ("all",)
    out: Optional[str] = None
    device: Optional[str] = None
    dtypes: Optional[list] = None  # short names; None: each case's own per suite
    backends: Optional[list] = None  # accuracy backends; None: default dispatch (+ 'reference' on CPU)
    baselines: Optional[list] = None  # only these baseline names; None: every one the case lists
    small: Optional[bool] = None  # only the cpu-marked shape points (default: on CPU)
    quick: bool = False  # per case, only points marked quick (else its last point)
    cases: Optional[list] = None  # substrings of case names
    directions: Sequence[str] = ("fwd", "fwd+bwd")
    warmup: int = 25
    rep: int = 100
    copy_gib: float = 2.0
    gemm_n: int = 8192
    plots: bool = True
    summary_md: Optional[str] = None
    atk_dir: Optional[str] = None
    verbose: bool = False
    command: Optional[str] = None  # for the report header (default: this process's command line)
    time_budget: Optional[float] = None  # seconds: start no new run after this (the report says what was left)
    check_cases: bool = False  # accuracy also runs the ops' CheckCases (``mindspeed-ops check``'s registry)
    skip_done: Optional[list] = None  # report.json paths: runs they already hold are not run again


def resolve_callable(path: str) -> Callable:
    """``'pkg.module:attr'`` (or ``'pkg.module.attr'``) -> the object."""
    if ":" in path:
        mod, attr = path.split(":", 1)
    else:
        mod, _, attr = path.rpartition(".")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{path} is not callable")
    return obj


def parse_suites(requested: Sequence[str]) -> list:
    """The suite names of ``--suite`` (space or comma separated, ``all`` included); ``ValueError`` for others."""
    req = [s.strip() for item in requested for s in str(item).split(",") if s.strip()]
    bad = [s for s in req if s not in SUITES + ("all",)]
    if bad:
        raise ValueError(f"unknown suite(s) {', '.join(bad)}; use {', '.join(SUITES)} or all")
    return req


def resolve_suites(requested: Sequence[str], device: torch.device) -> tuple[list, list]:
    """(suites to run, notes). ``all`` on CPU keeps accuracy and determinism."""
    notes = []
    req = parse_suites(requested)
    if "all" in req:
        if device.type == "cuda":
            return list(SUITES), notes
        notes.append("performance and memory suites skipped: they need a CUDA device (ask for them by name to "
                     "check the plumbing on CPU)")
        return ["accuracy", "determinism"], notes
    suites = [s for s in SUITES if s in req]
    if device.type != "cuda" and ("performance" in suites or "memory" in suites):
        notes.append("CPU run: timings are host wall-clock under the Triton interpreter (plumbing only, "
                     "meaningless as speed); memory needs CUDA (n/a)")
    return suites, notes


def shape_points(case: CaseSpec, small: bool, quick: bool) -> list[ShapePoint]:
    """The points of ``case`` to run: cpu-marked ones when ``small``; else all, or with ``quick`` the
    quick-marked ones (the last point when none is marked)."""
    if small:
        return [p for p in case.shapes if p.cpu]
    if quick:
        q = [p for p in case.shapes if p.quick]
        return q or case.shapes[-1:]
    return list(case.shapes)


@dataclass
class Item:
    suite: str  # accuracy | determinism | measure (performance and/or memory) | check (a CheckCase)
    case: Any  # CaseSpec, or a mindspeed_ops.checks.CheckCase for suite 'check'
    shape: Optional[ShapePoint]
    dtype: str
    backend: Optional[str] = None

    def label(self) -> str:
        b = f" [{self.backend}]" if self.backend else ""
        where = "check case" if self.shape is None else self.shape.text()
        return f"{self.suite} {self.case.op} / {self.case.name} / {where} / {self.dtype}{b}"


def item_key(item: "Item") -> Optional[tuple]:
    if item.shape is None:  # a check case: always run
        return None
    return _done_key(item.suite, item.case.op, item.case.name, item.shape.text(), item.dtype,
                     item.backend if item.suite in ("accuracy", "determinism") else None)


@dataclass
class Plan:
    items: list = field(default_factory=list)
    callables: dict = field(default_factory=dict)  # (op, case) -> (call, reference)
    load_errors: list = field(default_factory=list)


def default_backends(device: torch.device) -> list:
    return [None, "reference"] if device.type == "cpu" else [None]


def make_plan(specs: Sequence[OpSpec], suites: Sequence[str], device: torch.device, opts: Options) -> Plan:
    from ..check_runner import _exc_text

    plan = Plan()
    small = opts.small if opts.small is not None else device.type == "cpu"
    want_dtypes = None if not opts.dtypes else [d for d in opts.dtypes]
    bks = opts.backends if opts.backends is not None else default_backends(device)
    measure_suites = [s for s in suites if s in ("performance", "memory")]
    for spec in specs:
        for case in spec.cases:
            if opts.cases and not any(c.lower() in case.name.lower() for c in opts.cases):
                continue
            try:
                plan.callables[(case.op, case.name)] = (resolve_callable(case.call), resolve_callable(case.reference))
            except Exception as e:  # noqa: BLE001 - reported, the other cases still run
                plan.load_errors.append({"op": case.op, "case": case.name, "error": _exc_text(e)})
                continue
            for point in shape_points(case, small, opts.quick):
                active = [s for s in suites if s in case.suites and (point.suites is None or s in point.suites)]

                def dts(suite):
                    out = [d for d in case.dtypes[suite] if want_dtypes is None or d in want_dtypes]
                    if device.type == "cpu":  # bf16 arithmetic is garbage under the interpreter (DESIGN 7)
                        out = [d for d in out if d != "bf16"] or (["fp32"] if want_dtypes is None else [])
                    return out

                if "accuracy" in active:
                    for d in dts("accuracy"):
                        for b in bks:
                            if b == "reference" and not _registered(case):
                                continue
                            plan.items.append(Item("accuracy", case, point, d, b))
                if "determinism" in active:
                    for d in dts("determinism"):
                        plan.items.append(Item("determinism", case, point, d, None))
                if any(s in active for s in measure_suites):
                    seen = []
                    for s in measure_suites:
                        if s in active:
                            seen += [d for d in dts(s) if d not in seen]
                    for d in seen:
                        plan.items.append(Item("measure", case, point, d, None))
    if opts.check_cases and "accuracy" in suites:
        _add_check_cases(plan, specs, device, want_dtypes, bks)
    return plan


def missing_runs(reports: Sequence[dict], specs: Sequence[OpSpec], quick: bool,
                 suites: Sequence[str] = SUITES) -> tuple:
    """``(planned, missing labels)``: the runs a CUDA run of ``specs`` (``quick`` or every shape point, each
    case's dtypes, default backend) would make for ``suites``, and those the CUDA reports of ``reports``, merged
    as ``--from-json`` merges them, do not hold.
    Lets a report merged from time-limited jobs say whether it covers the whole plan, whatever its parts'
    ``not_run`` lists recorded (a killed job's partial report does not list the runs it never reached).

    Stricter than ``--skip-done``: rows of CPU runs (interpreter, small shapes) do not count; a measured point
    counts for ``performance`` only with an ``ours`` time and for ``memory`` only with an ``ours`` peak; a
    case whose callables do not load is missing as a whole (``load error ...``)."""
    plan = make_plan(specs, list(suites), torch.device("cuda"), Options(small=False, quick=quick))
    gpu = [r for r in reports if r.get("meta", {}).get("device") != "cpu"]
    merged = merge_reports(gpu) if gpu else {}  # a later run of a point supersedes an earlier one, as in the report
    need = [k for k, s in (("median_ms", "performance"), ("peak_extra_mib", "memory")) if s in suites]
    done = done_runs([merged], need=need)
    keyed = [i for i in plan.items if item_key(i) is not None]
    missing = [i.label() for i in keyed if item_key(i) not in done]
    missing += [f"load error {e['op']} / {e['case']}: {e['error']}" for e in plan.load_errors]
    return len(keyed) + len(plan.load_errors), missing


def _add_check_cases(plan: Plan, specs: Sequence[OpSpec], device: torch.device, want_dtypes, bks) -> None:
    """The ops' :class:`mindspeed_ops.checks.CheckCase` s (what ``mindspeed-ops check`` runs), as accuracy
    items run by :func:`mindspeed_ops.check_runner.run_case` (small shapes on CPU, real ones on GPU)."""
    from ..check_runner import load_cases
    from ..check_runner import plan as check_plan
    from .inputs import torch_dtype

    ops = {s.op for s in specs}
    cases, errors = load_cases()
    for fam, err in errors.items():
        plan.load_errors.append({"op": f"family {fam}", "case": "check cases", "error": err})
    dts = None if want_dtypes is None else [torch_dtype(d) for d in want_dtypes]
    for case, dt in check_plan([c for c in cases if c.op in ops], device, dts):
        for b in bks:
            if b == "reference" and case.op not in _registered_ops():
                continue
            plan.items.append(Item("check", case, None, {torch.float32: "fp32", torch.float16: "fp16",
                                                         torch.bfloat16: "bf16"}[dt], b))


def _registered_ops() -> list:
    from .. import backends

    return backends.registered_ops()


def _registered(case: CaseSpec) -> bool:
    from .. import backends

    return bool(case.dispatch_op) and case.dispatch_op in backends.registered_ops()


# --------------------------------------------------------------------------------------------------
# measuring (performance / memory)


def _measure(item: Item, call, reference, device: str, suites: list, ceilings: dict, opts: Options, report: dict,
             log) -> list:
    import math

    from . import baselines as bl
    from .expr import evaluate
    from .inputs import build_inputs, call_kwargs, cost_names, torch_dtype
    from .measure import Case, Impl, measure_case, reset_compile_caches

    case, point = item.case, item.shape
    dtype = torch_dtype(item.dtype)
    inputs = build_inputs(case, point.dims, dtype, device)
    names = cost_names(case, point.dims, dtype, inputs)

    def cost(key):
        return int(evaluate(case.cost[key], names)) if key in case.cost else 0

    tensors = [v for k, v in inputs.items() if isinstance(v, torch.Tensor) and k in case.inputs]
    size = int(evaluate(case.cost["size"], names)) if "size" in case.cost else (tensors[0].numel() if tensors else 0)
    grad_names = tuple(n for n in case.grads if isinstance(inputs.get(n), torch.Tensor))
    from .accuracy import backend_for

    backend, _ = backend_for(case, torch.device(device), None)
    extra = call_kwargs(case, point.dims, dtype)
    ours = (lambda **kw: call(**kw, **extra)) if extra else call
    impls = [Impl("ours", "ours", ours, note=f"{case.call} [{backend}]", mutates=tuple(case.mutates),
                  library="mindspeed_ops")]
    kwargs = {k: v for k, v in inputs.items() if k not in case.inputs}
    ctx = bl.Context(case, dict(point.dims), kwargs, dtype, device, reference, call, inputs)
    for entry in case.baselines:
        name = entry["name"]
        if opts.baselines is not None and name not in opts.baselines:
            continue
        if "when" in entry and not evaluate(entry["when"], names):
            continue
        try:
            impls.append(bl.build(name, ctx))
        except bl.Skip as e:
            report["skipped"].append({"op": case.op, "case": case.name, "shape": point.text(), "baseline": name,
                                      "reason": str(e)})
        except Exception as e:  # noqa: BLE001 - an adapter bug is reported, not fatal
            report["skipped"].append({"op": case.op, "case": case.name, "shape": point.text(), "baseline": name,
                                      "reason": f"adapter failed: {type(e).__name__}: {e}"})
    directions = tuple(d for d in opts.directions if d == "fwd" or grad_names)
    formula = "; ".join(f"{k}: {case.cost[k]}" for k in ("bytes_fwd", "bytes_bwd", "flops_fwd", "flops_bwd")
                        if k in case.cost)
    meta = {"family": case.family, "values": case.values, "dims": dict(point.dims), "size": size, "backend": backend}
    mcase = Case(case.op, case.name, point.text(), item.dtype, size, lambda _dev: inputs, grad_names,
                 cost("bytes_fwd"), cost("bytes_bwd"), formula, impls, flops_fwd=cost("flops_fwd"),
                 flops_bwd=cost("flops_bwd"), bound=case.cost.get("bound", "memory" if "bytes_fwd" in case.cost
                                                                   else "compute"), meta=meta)
    reset_compile_caches()
    rows = measure_case(mcase, device, ceilings.get("copy_gbs"), directions, opts.warmup, opts.rep,
                        verbose=opts.verbose, log=log, timing="performance" in suites, memory="memory" in suites,
                        gemm_tflops=ceilings.get("gemm_tflops"), fwd_memory_with_grad=True)
    for r in rows:  # SPEC memory bounds (ours only)
        key = "bound_fwd" if r["direction"] == "fwd" else "bound_fwd_bwd"
        if r["kind"] == "ours" and key in case.memory:
            bound = evaluate(case.memory[key], names) / 2**20
            r["mem_bound_mib"] = bound
            r["mem_within_bound"] = None if r["peak_extra_mib"] is None else r["peak_extra_mib"] <= bound
        for k, v in list(r.items()):
            if isinstance(v, float) and math.isnan(v):
                r[k] = None
    return rows


# --------------------------------------------------------------------------------------------------
# run


def _console():
    from ..cli import _console as console  # the CLI's console: main() handles a closed stdout pipe

    return console()


def new_report(device: torch.device, suites: list, opts: Options, notes: list) -> dict:
    from .. import backends
    from . import baselines as bl
    from .measure import env_info
    from .report import FORMAT

    dists = sorted({b.dist for b in bl.REGISTRY.values() if b.dist})
    meta = env_info(device.type, dists)
    if opts.command:
        meta["command"] = opts.command
    meta.update(arch=backends.device_arch(device), suites=suites, ops=opts.ops or "all",
                shapes="cpu-marked (small)" if (opts.small if opts.small is not None else device.type == "cpu")
                else ("quick" if opts.quick else "all"),
                dtypes=opts.dtypes or "per case", backends=[b or "default" for b in
                                                            (opts.backends or default_backends(device))])
    return {"format": FORMAT, "complete": False, "meta": meta, "ceilings": {"copy_gbs": None, "gemm_tflops": None},
            "baselines": bl.installed(), "notes": list(notes), "skipped": [], "load_errors": [],
            "accuracy": [], "determinism": [], "performance": []}


def run(opts: Options, *, console=None) -> dict:
    """Run the requested suites and write the report (when ``opts.out``); returns the report dict.

    Raises ``ValueError`` for bad options (unknown op, suite, dtype, backend or baseline) and
    :class:`mindspeed_ops.atk.schema.AtkSpecError` for an invalid case file.
    """
    from ..check_runner import prepare_device
    from . import baselines as bl
    from .report import summary_markdown, write_all

    device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    suites, notes = resolve_suites(opts.suites, device)
    if opts.baselines is not None:
        unknown = [b for b in opts.baselines if b not in bl.REGISTRY]
        if unknown:
            raise ValueError(f"unknown baseline(s) {', '.join(unknown)}; known: {', '.join(sorted(bl.REGISTRY))}")
    if opts.dtypes:
        from .schema import DTYPE_NAMES

        bad = [d for d in opts.dtypes if DTYPE_NAMES.get(d) not in ("fp32", "fp16", "bf16")]
        if bad:
            raise ValueError(f"unknown dtype(s) {', '.join(bad)}; use fp32, fp16, bf16")
        opts.dtypes = [DTYPE_NAMES[d] for d in opts.dtypes]
    if opts.backends:
        from ..backends import BACKENDS

        bad = [b for b in opts.backends if b not in BACKENDS]
        if bad:
            raise ValueError(f"unknown backend(s) {', '.join(bad)}; known: {', '.join(BACKENDS)}")
    interpreting = prepare_device(device)  # before any kernel module is imported
    if device.type == "cpu":
        notes.insert(0, "CPU: " + ("Triton kernels under the interpreter (TRITON_INTERPRET=1)" if interpreting
                                   else "reference backend (TRITON_INTERPRET=0)") + "; bf16 skipped")
    specs = load_specs(opts.atk_dir, opts.ops)
    plan = make_plan(specs, suites, device, opts)
    if opts.skip_done:
        from .report import load_report

        try:
            done = done_runs([load_report(p) for p in opts.skip_done])
        except OSError as e:
            raise ValueError(f"--skip-done: cannot read {e.filename}: {e.strerror}") from None
        kept = [i for i in plan.items if item_key(i) not in done]
        if len(kept) < len(plan.items):
            notes.append(f"--skip-done: {len(plan.items) - len(kept)} run(s) already in "
                         f"{', '.join(opts.skip_done)} not run again")
        plan.items = kept
    report = new_report(device, suites, opts, notes)
    report["load_errors"] = plan.load_errors
    con = console or _console()
    live = con.is_terminal

    def log(msg: str) -> None:
        if opts.verbose or not live:
            con.print(msg, markup=False, highlight=False)

    last_save = [time.perf_counter()]

    finished = [0]  # plan.items[:finished] have run

    def save(final: bool) -> None:
        report["complete"] = final
        # every save lists what is left, so a report written before a kill still says what it did not reach
        left = plan.items[finished[0]:]
        if left:
            report["not_run"] = [i.label() for i in left]
        else:
            report.pop("not_run", None)
        last_save[0] = time.perf_counter()
        if opts.out:
            write_all(opts.out, report, plots=final and opts.plots)

    con.print(f"mindspeed-ops atk: {len(plan.items)} runs on {device.type} ({', '.join(suites)}), "
              f"{len(specs)} case file(s)", markup=False)
    measure_items = [i for i in plan.items if i.suite == "measure"]
    if measure_items and "performance" in suites and device.type == "cuda":
        from .measure import measure_ceilings

        con.print("measuring ceilings (device copy, bf16 GEMM) ...", markup=False)
        report["ceilings"] = measure_ceilings("cuda", opts.copy_gib, opts.gemm_n)
        con.print(f"copy {report['ceilings']['copy_gbs']:.0f} GB/s, bf16 GEMM "
                  f"{report['ceilings']['gemm_tflops']:.0f} TFLOP/s", markup=False)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .accuracy import Point, determinism, verify
    from .inputs import torch_dtype

    small = opts.small if opts.small is not None else device.type == "cpu"
    families = {s.op: s.family for s in specs}
    t_start = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con, transient=True, disable=not live) as progress:
        task = progress.add_task("atk", total=len(plan.items))
        for n, item in enumerate(plan.items, 1):
            if opts.time_budget is not None and time.perf_counter() - t_start > opts.time_budget:
                left = plan.items[n - 1:]
                report["notes"].append(f"time budget of {opts.time_budget:.0f} s reached: {len(left)} of "
                                       f"{len(plan.items)} runs not done (from: {left[0].label()})")
                con.print(report["notes"][-1], markup=False)
                break
            progress.update(task, description=item.label()[:100])
            if item.suite == "check":
                row = _run_check(item, device, small, families)
                report["accuracy"].append(row)
                status = "PASS" if row["passed"] else f"FAIL {row['reason']}"
            else:
                call, reference = plan.callables[(item.case.op, item.case.name)]
                point = Point(item.case, item.shape, torch_dtype(item.dtype), call, reference)
                if item.suite == "accuracy":
                    r = verify(point, device, backend=item.backend)
                    report["accuracy"].append(dict(r.to_dict(), requested_backend=item.backend))
                    status = "PASS" if r.passed else f"FAIL {r.reason}"
                elif item.suite == "determinism":
                    r = determinism(point, device, backend=item.backend)
                    report["determinism"].append(dict(r.to_dict(), requested_backend=item.backend))
                    status = "PASS" if r.passed else f"FAIL {r.reason}"
                else:
                    try:
                        rows = _measure(item, call, reference, device.type, suites, report["ceilings"], opts,
                                        report, log)
                    except Exception as e:  # noqa: BLE001 - e.g. out of memory while building inputs
                        from ..check_runner import _exc_text

                        rows = []
                        report["load_errors"].append({"op": item.case.op, "case": f"{item.case.name} "
                                                      f"{item.shape.text()} {item.dtype}", "error": _exc_text(e)})
                    report["performance"].extend(rows)
                    ours = [r for r in rows if r["kind"] == "ours"]
                    status = "; ".join(f"{r['direction']} " + (r["error"] or (f"{r['median_ms']:.4f} ms"
                                                                               if r["median_ms"] is not None else "ok"))
                                       for r in ours) or "no rows"
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            finished[0] = n
            # a run cut short (time limit, kill) keeps what it did: after every measurement, else every 30 s
            if item.suite == "measure" or time.perf_counter() - last_save[0] > 30:
                save(False)
            log(f"[{n}/{len(plan.items)}] {item.label()}: {status}")
            progress.advance(task)
    report["meta"]["seconds"] = round(time.perf_counter() - t_start, 1)
    save(True)
    if opts.summary_md:
        os.makedirs(os.path.dirname(os.path.abspath(opts.summary_md)), exist_ok=True)
        with open(opts.summary_md, "w") as f:
            f.write(summary_markdown(report))
    return report


def _run_check(item: Item, device: torch.device, small: bool, families: dict) -> dict:
    """One CheckCase through :func:`mindspeed_ops.check_runner.run_case`, as an accuracy row."""
    from ..check_runner import run_case
    from .inputs import torch_dtype
    from .measure import finite_or_none

    t0 = time.perf_counter()
    r = run_case(item.case, device, torch_dtype(item.dtype), small=small, backend=item.backend, repeats=0)
    comps = [{"name": c.name, "class": None, "threshold": None, "rel_rms": finite_or_none(c.rel_rms),
              "max_abs": finite_or_none(c.max_abs), "passed": c.passed, "reason": c.reason} for c in r.comparisons]
    return {"op": r.op, "family": families.get(r.op, "?"), "case": f"check: {r.case}", "values": "normal",
            "shape": "small" if small else "real", "dims": {}, "dtype": r.dtype, "backend": r.backend,
            "passed": r.passed, "fwd_rel_rms": finite_or_none(r.fwd_rel_rms),
            "grad_rel_rms": finite_or_none(r.grad_rel_rms), "nonfinite": 0, "seconds": time.perf_counter() - t0,
            "reason": r.reason, "comparisons": comps}


def failures(report: dict) -> list[str]:
    """Lines describing what failed: accuracy/determinism rows, ours' measuring errors, setup errors."""
    out = [f"accuracy {r['op']} / {r['case']} / {r['shape']} / {r['dtype']} / {r['backend']}: {r['reason']}"
           for r in report.get("accuracy", []) if not r["passed"]]
    out += [f"determinism {r['op']} / {r['case']} / {r['shape']} / {r['dtype']}: {r['reason']}"
            for r in report.get("determinism", []) if not r["passed"]]
    out += [f"measure {r['op']} / {r['variant']} / {r['shape']} / {r['direction']}: ours failed: {r['error']}"
            for r in report.get("performance", []) if r["kind"] == "ours" and r.get("error")]
    out += [f"setup {e['op']} / {e['case']}: {e['error']}" for e in report.get("load_errors", [])]
    out += [f"memory {r['op']} / {r['variant']} / {r['shape']} / {r['direction']}: {r['peak_extra_mib']:.1f} MiB "
            f"exceeds the SPEC bound {r['mem_bound_mib']:.1f} MiB"
            for r in report.get("performance", []) if r.get("mem_within_bound") is False]
    return out


__all__ = ["Options", "resolve_callable", "parse_suites", "resolve_suites", "shape_points", "Item", "Plan", "make_plan", "run",
           "failures", "new_report"]
