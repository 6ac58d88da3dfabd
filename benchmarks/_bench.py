"""Shared helpers for the ``benchmarks/bench_*.py`` scripts: timing, memory, device ceilings, the
fwd / fwd+bwd harness and the report writer.

Conventions every benchmark script follows (DESIGN 6, METHOD):

- time with ``triton.testing.do_bench`` (CUDA events, L2 flushed before each call, warm-up first),
  report the **median** (and the 20th/80th percentiles as the spread);
- count the **minimum** bytes an operator must move (every input read once, every output written
  once; fwd+bwd = the fwd minimum plus the bwd minimum) and report achieved GB/s and its fraction
  of the device copy bandwidth measured at the start of the same run (a large device-to-device copy,
  bytes read + bytes written);
- peak memory = ``torch.cuda.max_memory_allocated()`` during one call, after a reset, minus what was
  allocated before the call (the inputs), so it is the extra memory the call needs (outputs included);
- every baseline is compared with ``ours`` measured in the same run (``base ms / ours ms``: > 1 means
  ours is faster).

Call :func:`early_setup` before anything imports Triton kernels: in ``--dry-run`` mode without a GPU it
sets ``TRITON_INTERPRET=1`` (kernels then run on CPU under Triton's interpreter).
"""
from __future__ import annotations

import datetime
import functools
import importlib
import importlib.metadata
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------------------------------
# set-up
# --------------------------------------------------------------------------------------------------

def early_setup(dry_run: bool, device: Optional[str] = None) -> str:
    """Put the repo on ``sys.path`` (the package need not be installed) and pick the device.

    Returns ``'cuda'`` or ``'cpu'``. Without CUDA only ``dry_run`` may proceed; it sets
    ``TRITON_INTERPRET=1`` before any Triton kernel is imported (torch itself may already be imported:
    ``@triton.jit`` reads the variable when a kernel is decorated).
    """
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        if not dry_run:
            raise SystemExit("no CUDA device: timings need a GPU; use --dry-run to check the plumbing on CPU")
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return device


def try_import(name: str):
    """``(module, None)`` or ``(None, 'ExcType: message')``."""
    try:
        return importlib.import_module(name), None
    except Exception as e:  # noqa: BLE001 - any import failure means "peer not available"
        return None, f"{type(e).__name__}: {e}".splitlines()[0][:200]


def dist_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def env_info(device: str, extra_versions: Sequence[str] = ()) -> dict:
    """The report header: command, date, host, GPU, library versions."""
    import torch
    import triton

    info = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": device,
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "0"),
    }
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=torch.cuda.get_device_name(0), sm=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    gpu_mem_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
    else:
        info["gpu"] = "none (CPU)"
    for d in extra_versions:
        info[d] = dist_version(d) or "not installed"
    return info


# --------------------------------------------------------------------------------------------------
# timing, memory, ceilings
# --------------------------------------------------------------------------------------------------

@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    n: int


def bench_ms(fn: Callable[[], Any], device: str, warmup: int = 25, rep: int = 100) -> Timing:
    """Median time of ``fn()`` in ms. CUDA: ``triton.testing.do_bench(fn, warmup, rep,
    return_mode='all')`` (warmup/rep in ms; L2 flushed before each timed call). CPU (dry runs): a few
    host-timed calls, only to exercise the plumbing."""
    if device == "cuda":
        from triton.testing import do_bench

        times = do_bench(fn, warmup=warmup, rep=rep, return_mode="all")
    else:
        fn()
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times = sorted(float(t) for t in times)
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else [times[0]] * 9
    return Timing(statistics.median(times), q[1], q[7], len(times))


def graph_ms(fn: Callable[[], Any], device: str, rep: int = 100, no_grad: bool = False) -> Optional[float]:
    """GPU time of ``fn`` without host overhead: median of CUDA-graph replays
    (``triton.testing.do_bench_cudagraph``). ``None`` where capture is not possible."""
    if device != "cuda":
        return None
    import contextlib

    import torch
    from triton.testing import do_bench_cudagraph

    try:
        with torch.no_grad() if no_grad else contextlib.nullcontext():
            return float(do_bench_cudagraph(fn, rep=rep, return_mode="median"))
    except Exception:  # noqa: BLE001 - some baselines cannot be captured (host syncs)
        return None


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def peak_extra_bytes(fn: Callable[[Any], Any], device: str, setup: Optional[Callable[[], Any]] = None) -> Optional[int]:
    """Extra device memory of one call: max allocated during ``fn(setup())`` minus allocated before it
    (after ``setup``, which is not counted). ``None`` on CPU."""
    if device != "cuda":
        return None
    import torch

    state = setup() if setup is not None else None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn(state)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out, state
    return peak - before


def copy_bandwidth_gbs(device: str, nbytes: int = 2 << 30, warmup: int = 25, rep: int = 200) -> Optional[float]:
    """Device-to-device copy rate in GB/s (1e9 B/s), counting bytes read + bytes written, of an
    ``nbytes`` buffer (default 2 GiB: far past the 60 MB L2). ``None`` on CPU."""
    if device != "cuda":
        return None
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    t = bench_ms(functools.partial(dst.copy_, src), device, warmup, rep)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (t.median_ms * 1e-3) / 1e9


def rel_rms(out, ref) -> float:
    """``rms(out - ref) / rms(ref)`` in float64 (NaN when a NaN/Inf appears where ref is finite)."""
    import torch

    o, r = out.detach().double(), ref.detach().double()
    if o.shape != r.shape:
        return float("nan")
    if not torch.isfinite(o).all():
        return float("nan")
    d = (o - r).pow(2).mean().sqrt().item()
    n = r.pow(2).mean().sqrt().item()
    return d / n if n > 0 else (0.0 if d == 0 else float("inf"))


# --------------------------------------------------------------------------------------------------
# the fwd / fwd+bwd harness
# --------------------------------------------------------------------------------------------------

def as_tensors(out) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    return [o for o in out if isinstance(o, torch.Tensor)]


@dataclass
class Impl:
    """One implementation of a benchmark case.

    ``fn(**inputs)`` computes the operator. ``kind``: ``ours`` | ``eager`` | ``compile`` | ``peer``.
    ``prepare`` maps the case's inputs to this implementation's (e.g. another layout or dtype).
    ``grad_names`` overrides the case's differentiable inputs. ``mutates`` names inputs written in
    place: the forward is then timed on a persistent buffer (rotated again each call) and fwd+bwd is
    fwd + a backward timed with ``retain_graph`` through a graph ``base -> clone -> fn`` (so the
    mutated tensor is not a leaf). ``check``: maps the output to the tensor compared with the eager
    reference's (``None``: no comparison, e.g. a different layout).
    """

    name: str
    kind: str
    fn: Callable[..., Any]
    note: str = ""
    prepare: Optional[Callable[[dict], dict]] = None
    grad_names: Optional[tuple] = None
    mutates: tuple = ()
    check: Optional[Callable[[Any], Any]] = lambda out: as_tensors(out)[0]


@dataclass
class Case:
    """One operator at one shape. ``make_inputs(device) -> dict``; ``bytes_fwd`` / ``bytes_bwd`` are
    the minimum bytes (formula in ``formula``); ``numel`` the element count of the main input (the
    ">= 64M elements" targets use it)."""

    op: str
    variant: str
    shape: str
    dtype: str
    numel: int
    make_inputs: Callable[[str], dict]
    grad_names: tuple
    bytes_fwd: int
    bytes_bwd: int
    formula: str
    impls: list = field(default_factory=list)
    ref_check: Callable[[Any], Any] = lambda out: as_tensors(out)[0]


def _random_cotangents(outs):
    import torch

    return [torch.randn_like(o) for o in outs]


def _fwd_runner(impl: Impl, inputs: dict):
    return lambda: impl.fn(**inputs)


def _fwdbwd_runner(impl: Impl, inputs: dict, grad_names: tuple):
    """A callable doing one forward + backward through a fresh graph (no ``.grad`` accumulation)."""
    import torch

    leaves = {k: (v.detach().requires_grad_(True) if k in grad_names else v) for k, v in inputs.items()}
    wrt = [leaves[k] for k in grad_names]
    outs = [o for o in as_tensors(impl.fn(**leaves)) if o.requires_grad]
    dys = _random_cotangents(outs)
    del outs

    def step():
        o = [t for t in as_tensors(impl.fn(**leaves)) if t.requires_grad]
        return torch.autograd.grad(o, wrt, dys)

    return step


def _inplace_graph(impl: Impl, inputs: dict, grad_names: tuple):
    """For in-place ops: (backward-only callable with retain_graph, memory setup, memory fn)."""
    import torch

    bases = {k: inputs[k].detach().clone().requires_grad_(True) for k in grad_names}

    def forward_graph():
        leaves = dict(inputs)
        for k in grad_names:
            leaves[k] = bases[k].clone()  # not a leaf: in-place ops are allowed on it
        return [o for o in as_tensors(impl.fn(**leaves)) if o.requires_grad]

    outs = forward_graph()
    dys = _random_cotangents(outs)
    wrt = [bases[k] for k in grad_names]

    def bwd():
        return torch.autograd.grad(outs, wrt, dys, retain_graph=True)

    def mem_setup():
        return {k: bases[k].clone() for k in grad_names}

    def mem_fn(clones):
        leaves = dict(inputs)
        leaves.update(clones)
        o = [t for t in as_tensors(impl.fn(**leaves)) if t.requires_grad]
        return torch.autograd.grad(o, wrt, dys)

    return bwd, mem_setup, mem_fn


def _short_error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    return msg[:240]


def measure_case(case: Case, device: str, copy_gbs: Optional[float], directions=("fwd", "fwd+bwd"),
                 warmup: int = 25, rep: int = 100, verbose: bool = False, log=print) -> list:
    """Run every implementation of ``case`` in each direction; return one row (dict) per
    (impl, direction). Failures become rows with an ``error`` and never stop the run."""
    import torch

    rows = []
    inputs = case.make_inputs(device)
    # correctness sanity check against the eager reference (first output), on fresh copies
    ref_out = None
    eager = next((i for i in case.impls if i.kind == "eager"), None)

    def fresh(impl):
        inp = impl.prepare(inputs) if impl.prepare else dict(inputs)
        for k in impl.mutates:
            inp[k] = inp[k].clone()
        return inp

    if eager is not None:
        try:
            with torch.no_grad():
                ref_out = case.ref_check(eager.fn(**fresh(eager)))
        except Exception as e:  # noqa: BLE001
            ref_out = None
            log(f"    [{case.op}] eager reference failed: {_short_error(e)}")

    for direction in directions:
        ours_ms = None
        drows = []
        for impl in case.impls:
            row = dict(op=case.op, variant=case.variant, shape=case.shape, dtype=case.dtype, numel=case.numel,
                       direction=direction, impl=impl.name, kind=impl.kind, note=impl.note,
                       bytes=case.bytes_fwd if direction == "fwd" else case.bytes_fwd + case.bytes_bwd,
                       median_ms=None, p20_ms=None, p80_ms=None, gbs=None, frac_copy=None,
                       peak_extra_mib=None, relerr=None, error=None)
            try:
                inp = impl.prepare(inputs) if impl.prepare else dict(inputs)
                grad_names = impl.grad_names if impl.grad_names is not None else case.grad_names
                if direction == "fwd" and impl.check is not None and ref_out is not None:
                    with torch.no_grad():
                        if impl.mutates:  # a self-autotuning in-place kernel rotates its input many times
                            impl.fn(**fresh(impl))  # on the first call: spend that call on a scratch copy
                        row["relerr"] = rel_rms(impl.check(impl.fn(**fresh(impl))), ref_out)
                if impl.mutates:
                    inp = dict(inp)
                    for k in impl.mutates:  # persistent buffer, rotated by every call
                        inp[k] = inp[k].clone()
                    fwd = _fwd_runner(impl, inp)
                    t = bench_ms(fwd, device, warmup, rep)
                    if direction == "fwd":
                        mem = peak_extra_bytes(lambda _: fwd(), device)
                    else:
                        bwd, mem_setup, mem_fn = _inplace_graph(impl, inp, grad_names)
                        tb = bench_ms(bwd, device, warmup, rep)
                        t = Timing(t.median_ms + tb.median_ms, t.p20_ms + tb.p20_ms, t.p80_ms + tb.p80_ms,
                                   min(t.n, tb.n))
                        mem = peak_extra_bytes(mem_fn, device, setup=mem_setup)
                        del bwd, mem_setup, mem_fn
                else:
                    run = _fwd_runner(impl, inp) if direction == "fwd" else _fwdbwd_runner(impl, inp, grad_names)
                    if direction == "fwd":
                        with torch.no_grad():
                            t = bench_ms(run, device, warmup, rep)
                            mem = peak_extra_bytes(lambda _: run(), device)
                    else:
                        t = bench_ms(run, device, warmup, rep)
                        mem = peak_extra_bytes(lambda _: run(), device)
                    row["graph_ms"] = graph_ms(run, device, rep, no_grad=direction == "fwd")
                    del run
                row.update(median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms)
                row["gbs"] = row["bytes"] / (t.median_ms * 1e-3) / 1e9
                if copy_gbs:
                    row["frac_copy"] = row["gbs"] / copy_gbs
                row["peak_extra_mib"] = None if mem is None else mem / 2**20
            except Exception as e:  # noqa: BLE001 - a failing baseline is a row, not a crash
                row["error"] = _short_error(e)
                if verbose:
                    traceback.print_exc()
            if impl.kind == "ours" and row["median_ms"] is not None:
                ours_ms = row["median_ms"]
            drows.append(row)
            if device == "cuda":
                torch.cuda.empty_cache()
            status = row["error"] or f"{row['median_ms']:.4f} ms"
            log(f"    {case.op}/{case.variant} {case.shape} {direction:7s} {impl.name:28s} {status}")
        for row in drows:
            if ours_ms is not None and row["median_ms"] is not None:
                row["vs_ours"] = row["median_ms"] / ours_ms
            else:
                row["vs_ours"] = None
        rows.extend(drows)
    return rows


# --------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------

def _fmt(v, spec: str, none: str = "-") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none if v is None else "nan"
    return format(v, spec)


COLUMNS = [
    ("op", lambda r: r["op"]),
    ("case", lambda r: r["variant"]),
    ("shape", lambda r: r["shape"]),
    ("dir", lambda r: r["direction"]),
    ("impl", lambda r: r["impl"]),
    ("median ms", lambda r: _fmt(r["median_ms"], ".4f")),
    ("p20-p80 ms", lambda r: "-" if r["p20_ms"] is None else f"{r['p20_ms']:.4f}-{r['p80_ms']:.4f}"),
    ("MB moved", lambda r: _fmt(r["bytes"] / 1e6, ".1f")),
    ("GB/s", lambda r: _fmt(r["gbs"], ".0f")),
    ("% copy", lambda r: _fmt(None if r["frac_copy"] is None else 100 * r["frac_copy"], ".1f")),
    ("graph ms", lambda r: _fmt(r.get("graph_ms"), ".4f")),
    ("peak extra MiB", lambda r: _fmt(r["peak_extra_mib"], ".1f")),
    ("base/ours", lambda r: _fmt(r.get("vs_ours"), ".2f")),
    ("rel err vs eager", lambda r: _fmt(r["relerr"], ".1e")),
    ("note", lambda r: (r["error"] and f"FAILED: {r['error']}") or r["note"]),
]


def markdown_table(rows: list, columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(c for c, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(str(f(r)) for _, f in columns) + " |")
    return "\n".join(lines)


def header_markdown(title: str, info: dict, copy_gbs: Optional[float], notes: Sequence[str] = ()) -> str:
    lines = [f"# {title}", "", f"Command: `{info['command']}`", ""]
    for k, v in info.items():
        if k != "command":
            lines.append(f"- {k}: {v}")
    lines.append(f"- device copy bandwidth (read + write, measured at the start of this run): "
                 f"{_fmt(copy_gbs, '.0f', 'n/a')} GB/s")
    lines.append("")
    lines += list(notes)
    return "\n".join(lines)


def write_report(out_dir: str, stem: str, markdown: str, payload: dict) -> tuple:
    os.makedirs(out_dir, exist_ok=True)
    md_path = os.path.join(out_dir, stem + ".md")
    js_path = os.path.join(out_dir, stem + ".json")
    with open(md_path, "w") as f:
        f.write(markdown.rstrip() + "\n")
    with open(js_path, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    return md_path, js_path


def reset_compile_caches() -> None:
    """Drop torch.compile caches (call between cases) and lift the recompile limits, so a compiled
    baseline never silently falls back to eager after too many shapes."""
    import torch

    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 64))
    for name in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 1024))
    torch._dynamo.reset()


def summary_table(rows: list) -> str:
    """One line per (op, case, shape, direction): ours ms and % of copy, then ``base ms / ours ms``
    for every other implementation (``x`` = that row failed)."""
    keys, impls = [], []
    for r in rows:
        k = (r["op"], r["variant"], r["shape"], r["direction"])
        if k not in keys:
            keys.append(k)
        if r["kind"] != "ours" and r["impl"] not in impls:
            impls.append(r["impl"])
    head = ["op", "case", "shape", "dir", "ours ms", "ours % copy", "ours graph ms", "graph % copy"] + \
        [f"{i} / ours" for i in impls]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in keys:
        group = {r["impl"]: r for r in rows if (r["op"], r["variant"], r["shape"], r["direction"]) == k}
        ours = next((r for r in group.values() if r["kind"] == "ours"), None)
        cells = list(k)
        if ours is None:
            cells += ["n/a", "-", "-", "-"]
        elif ours["median_ms"] is None:
            cells += ["x", "-", "-", "-"]
        else:
            g = ours.get("graph_ms")
            gfrac = None if not (g and ours["frac_copy"]) else 100 * ours["frac_copy"] * ours["median_ms"] / g
            cells += [f"{ours['median_ms']:.4f}",
                      _fmt(None if ours["frac_copy"] is None else 100 * ours["frac_copy"], ".1f"),
                      _fmt(g, ".4f"), _fmt(gfrac, ".1f")]
        for i in impls:
            r = group.get(i)
            cells.append("" if r is None else ("x" if r["error"] else _fmt(r.get("vs_ours"), ".2f")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
