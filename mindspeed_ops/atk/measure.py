"""Timing, memory and device ceilings, and the fwd / fwd+bwd measuring harness shared by ATK and the
``benchmarks/bench_*.py`` scripts (``benchmarks/_bench.py`` re-exports this module).

Conventions (DESIGN 6):

- time with ``triton.testing.do_bench`` (CUDA events, L2 flushed before each call, warm-up first) and
  report the **median** (20th/80th percentiles as the spread); ``graph_ms`` is the median of CUDA-graph
  replays (GPU time without host overhead) where the call can be captured;
- count the **minimum** bytes an operator must move (every input read once, every output written once;
  fwd+bwd = the fwd minimum plus the bwd minimum) and report GB/s and its fraction of the device copy
  bandwidth measured at the start of the same run; compute-bound operators give FLOPs instead and are
  judged against the bf16 GEMM rate measured the same way;
- peak memory = ``torch.cuda.max_memory_allocated()`` during one call, after a reset, minus what was
  allocated before the call (the inputs): the extra memory the call needs, outputs and saved tensors
  included;
- every baseline is measured in the same run as ``ours``; ratios are ``base / ours`` (> 1: ours is
  faster / leaner).

Nothing here imports a kernel module.
"""
from __future__ import annotations

import datetime
import functools
import importlib
import importlib.metadata
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

# --------------------------------------------------------------------------------------------------
# environment
# --------------------------------------------------------------------------------------------------


def try_import(name: str):
    """``(module, None)`` or ``(None, 'ExcType: message')``."""
    try:
        return importlib.import_module(name), None
    except Exception as e:  # noqa: BLE001 - any import failure means "peer not available"
        return None, f"{type(e).__name__}: {e}".splitlines()[0][:200]


def dist_version(name: str) -> Optional[str]:
    """Installed version of the distribution ``name`` (``None`` when absent)."""
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


def bench_ms(fn: Callable[[], Any], device: str, warmup: int = 25, rep: int = 100, min_calls: int = 1) -> Timing:
    """Median time of ``fn()`` in ms. CUDA: ``triton.testing.do_bench(fn, warmup, rep,
    return_mode='all')`` (warmup/rep in ms; L2 flushed before each timed call); ``min_calls > 1`` widens ``rep``
    to about that many calls of ``fn`` (timed once first), since a ``rep`` in ms times a slow ``fn`` only once or
    twice. CPU: a few host-timed calls after one warm-up call, only to exercise the plumbing."""
    if device == "cuda":
        from triton.testing import do_bench

        if min_calls > 1:
            import torch

            fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            rep = max(rep, min_calls * start.elapsed_time(end))
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
        _reset_cuda_rng()
        return None


def _reset_cuda_rng() -> None:
    """A capture that failed midway leaves the CUDA generators marked as capturing, and every later random
    draw on the device raises "Offset increment outside graph capture" (seen on the H200: the next case's
    inputs could not be built). A cloned state carries seed and offset but not that mark."""
    import torch

    for gen in torch.cuda.default_generators:
        try:
            gen.graphsafe_set_state(gen.clone_state())
        except Exception:  # noqa: BLE001 - older torch without graph-safe states: nothing to reset
            pass


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


def gemm_tflops(device: str, n: int = 8192, warmup: int = 25, rep: int = 200) -> Optional[float]:
    """Dense bf16 GEMM rate in TFLOP/s (``2·n³`` FLOPs per ``[n, n] @ [n, n]`` on random normal data,
    cuBLAS through ``torch.mm`` into a preallocated output). ``None`` on CPU."""
    if device != "cuda":
        return None
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    t = bench_ms(lambda: torch.mm(a, b, out=c), device, warmup, rep)
    del a, b, c
    torch.cuda.empty_cache()
    return 2 * n**3 / (t.median_ms * 1e-3) / 1e12


def measure_ceilings(device: str, copy_gib: float = 2.0, gemm_n: int = 8192) -> dict:
    """``{'copy_gbs': ..., 'gemm_tflops': ...}`` measured now (``None`` values on CPU)."""
    return {"copy_gbs": copy_bandwidth_gbs(device, int(copy_gib * 2**30)), "gemm_tflops": gemm_tflops(device, gemm_n)}


def rel_rms(out, ref) -> float:
    """Sanity metric of a baseline's output against the eager one: ``rms(out - ref) / rms(ref)`` in
    float64 on the tensors' device (NaN on a shape mismatch or a NaN/Inf in ``out``). The SPEC 0.9
    accuracy check is :func:`mindspeed_ops.testing.compare` (ATK accuracy suite)."""
    import torch

    o, r = out.detach().double(), ref.detach().double()
    if o.shape != r.shape or not torch.isfinite(o).all():
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
    if out is None:
        return []
    return [o for o in out if isinstance(o, torch.Tensor)]


@dataclass
class Impl:
    """One implementation of a measured case.

    ``fn(**inputs)`` computes the operator. ``kind``: ``ours`` | ``eager`` | ``compile`` | ``peer``.
    ``prepare`` maps the case's inputs to this implementation's (e.g. another layout or dtype).
    ``grad_names`` overrides the case's differentiable inputs. ``mutates`` names inputs written in
    place: the forward is then timed on a persistent buffer (rotated again each call) and fwd+bwd is
    fwd + a backward timed with ``retain_graph`` through a graph ``base -> clone -> fn`` (so the
    mutated tensor is not a leaf). ``check``: maps the output to the tensor compared with the eager
    reference's (``None``: no comparison, e.g. a different function or layout).
    """

    name: str
    kind: str
    fn: Callable[..., Any]
    note: str = ""
    prepare: Optional[Callable[[dict], dict]] = None
    grad_names: Optional[tuple] = None
    mutates: tuple = ()
    check: Optional[Callable[[Any], Any]] = lambda out: as_tensors(out)[0]
    library: str = ""


@dataclass
class Case:
    """One operator at one shape. ``make_inputs(device) -> dict``; ``bytes_fwd`` / ``bytes_bwd`` are
    the minimum bytes (formula in ``formula``); ``numel`` the element count of the main input.
    ``flops_fwd``/``flops_bwd`` (optional) give TFLOP/s; ``bound`` picks the ceiling a row is judged
    against (``memory``: copy bandwidth, ``compute``: bf16 GEMM). ``meta`` is copied into every row."""

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
    flops_fwd: int = 0
    flops_bwd: int = 0
    bound: str = "memory"
    meta: dict = field(default_factory=dict)


def _random_cotangents(outs):
    import torch

    return [torch.randn_like(o) for o in outs]


def _fwd_runner(impl: Impl, inputs: dict):
    return lambda: impl.fn(**inputs)


def _fwd_grad_runner(impl: Impl, inputs: dict, grad_names: tuple):
    """A training forward (inputs in ``grad_names`` require grad): what it keeps alive is what counts."""
    leaves = {k: (v.detach().requires_grad_(True) if k in grad_names else v) for k, v in inputs.items()}
    return lambda: impl.fn(**leaves)


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
                 warmup: int = 25, rep: int = 100, verbose: bool = False, log=print, *, timing: bool = True,
                 memory: bool = True, graph: bool = True, gemm_tflops: Optional[float] = None,
                 fwd_memory_with_grad: bool = False) -> list:
    """Run every implementation of ``case`` in each direction; return one row (dict) per
    (impl, direction). Failures become rows with an ``error`` and never stop the run.

    ``timing``/``memory``/``graph`` switch the measurements off (the keys stay, as ``None``);
    ``fwd_memory_with_grad`` measures the forward's memory as a training forward (inputs requiring
    grad, so saved tensors count) instead of under ``torch.no_grad()``.
    """
    import torch

    rows = []
    inputs = case.make_inputs(device)
    ref_out = None
    eager = next((i for i in case.impls if i.kind == "eager"), None)

    def fresh(impl):
        inp = impl.prepare(inputs) if impl.prepare else dict(inputs)
        for k in impl.mutates:
            inp[k] = inp[k].clone()
        return inp

    if eager is not None:  # sanity reference for every implementation's first output (fresh copies)
        try:
            with torch.no_grad():
                ref_out = case.ref_check(eager.fn(**fresh(eager)))
        except Exception as e:  # noqa: BLE001
            ref_out = None
            log(f"    [{case.op}] eager reference failed: {_short_error(e)}")

    for direction in directions:
        ours_ms = ours_mem = None
        drows = []
        for impl in case.impls:
            row = dict(op=case.op, variant=case.variant, shape=case.shape, dtype=case.dtype, numel=case.numel,
                       direction=direction, impl=impl.name, kind=impl.kind, note=impl.note,
                       bytes=case.bytes_fwd if direction == "fwd" else case.bytes_fwd + case.bytes_bwd,
                       flops=case.flops_fwd if direction == "fwd" else case.flops_fwd + case.flops_bwd,
                       median_ms=None, p20_ms=None, p80_ms=None, gbs=None, frac_copy=None, tflops=None,
                       frac_ceiling=None, ceiling=None, graph_ms=None, peak_extra_mib=None, relerr=None, error=None)
            row.update(case.meta)
            t = mem = None
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
                    if timing:
                        t = bench_ms(fwd, device, warmup, rep)
                    if direction == "fwd":
                        if memory:
                            mem = peak_extra_bytes(lambda _: fwd(), device)
                    else:
                        bwd, mem_setup, mem_fn = _inplace_graph(impl, inp, grad_names)
                        if timing:
                            tb = bench_ms(bwd, device, warmup, rep)
                            t = Timing(t.median_ms + tb.median_ms, t.p20_ms + tb.p20_ms, t.p80_ms + tb.p80_ms,
                                       min(t.n, tb.n))
                        if memory:
                            mem = peak_extra_bytes(mem_fn, device, setup=mem_setup)
                        del bwd, mem_setup, mem_fn
                else:
                    run = _fwd_runner(impl, inp) if direction == "fwd" else _fwdbwd_runner(impl, inp, grad_names)
                    if direction == "fwd":
                        if timing:
                            with torch.no_grad():
                                t = bench_ms(run, device, warmup, rep)
                        if memory:
                            if fwd_memory_with_grad and grad_names:
                                mrun = _fwd_grad_runner(impl, inp, grad_names)
                                mem = peak_extra_bytes(lambda _: mrun(), device)
                                del mrun
                            else:
                                with torch.no_grad():
                                    mem = peak_extra_bytes(lambda _: run(), device)
                    else:
                        if timing:
                            t = bench_ms(run, device, warmup, rep)
                        if memory:
                            mem = peak_extra_bytes(lambda _: run(), device)
                    if timing and graph:
                        row["graph_ms"] = graph_ms(run, device, rep, no_grad=direction == "fwd")
                    del run
                if t is not None:
                    row.update(median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms)
                    row["gbs"] = row["bytes"] / (t.median_ms * 1e-3) / 1e9 if row["bytes"] else None
                    row["tflops"] = row["flops"] / (t.median_ms * 1e-3) / 1e12 if row["flops"] else None
                    if copy_gbs and row["gbs"]:
                        row["frac_copy"] = row["gbs"] / copy_gbs
                    if case.bound == "compute":
                        row["ceiling"] = "gemm"
                        if gemm_tflops and row["tflops"]:
                            row["frac_ceiling"] = row["tflops"] / gemm_tflops
                    else:
                        row["ceiling"] = "copy"
                        row["frac_ceiling"] = row["frac_copy"]
                row["peak_extra_mib"] = None if mem is None else mem / 2**20
            except Exception as e:  # noqa: BLE001 - a failing baseline is a row, not a crash
                row["error"] = _short_error(e)
                if verbose:
                    traceback.print_exc()
            if impl.kind == "ours":
                ours_ms, ours_mem = row["median_ms"], row["peak_extra_mib"]
            drows.append(row)
            if device == "cuda":
                torch.cuda.empty_cache()
            if row["error"]:
                status = row["error"]
            else:
                status = " ".join(s for s in (
                    None if row["median_ms"] is None else f"{row['median_ms']:.4f} ms",
                    None if row["peak_extra_mib"] is None else f"{row['peak_extra_mib']:.1f} MiB") if s) or "ok"
            log(f"    {case.op}/{case.variant} {case.shape} {direction:7s} {impl.name:28s} {status}")
        for row in drows:
            row["vs_ours"] = row["median_ms"] / ours_ms if ours_ms and row["median_ms"] is not None else None
            row["mem_vs_ours"] = (row["peak_extra_mib"] / ours_mem
                                  if ours_mem and row["peak_extra_mib"] is not None else None)
        rows.extend(drows)
    return rows


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


def finite_or_none(x):
    """JSON-friendly number: ``None`` for None/NaN, the string ``'inf'`` for infinities."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


__all__ = ["try_import", "dist_version", "env_info", "Timing", "bench_ms", "graph_ms", "sync", "peak_extra_bytes",
           "copy_bandwidth_gbs", "gemm_tflops", "measure_ceilings", "rel_rms", "as_tensors", "Impl", "Case",
           "measure_case", "reset_compile_caches", "finite_or_none"]
