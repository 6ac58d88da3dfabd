"""Where does the host time of a launch-bound step go? For one ATK case point (as profile_op.py builds it):

- host time per call of the forward and the forward+backward step (no sync inside the timed loop);
- the same with every Triton launch replaced by a no-op (what our wrappers, torch and autograd cost alone),
  so the difference is Triton's launch path;
- with ``--sync-debug``, the synchronizing CUDA calls of one step (``torch.cuda.set_sync_debug_mode``);
- the host cost of one launch of a 40-argument kernel through ``kernel[grid]`` and through an autotuned
  kernel with its choice cached.

    python benchmarks/host_overhead.py --op chunk_gated_delta_rule             # the case's quick point
    python benchmarks/host_overhead.py --op chunk_gated_delta_rule --case "varlen GVA" --sync-debug

GPU only (on CPU the kernels run in the interpreter: nothing to learn about launch costs).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_op import _point, _step_fns  # noqa: E402  (the inputs exactly as profile_op / the ATK build them)


@triton.jit
def many_args_kernel(x_ptr, y_ptr, p0, p1, p2, p3, p4, p5, p6, p7, n, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12,
                     s13, s14, s15, s16, s17, s18, s19, s20, s21, s22, s23, s24, s25, s26, s27, s28, s29, s30, s31,
                     BV: tl.constexpr):
    """A copy kernel with 10 pointer and 31 integer arguments (a typical chunk-kernel argument list)."""
    o = tl.arange(0, BV)
    tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n), mask=o < n)


def host_ms(fn, reps: int = 30) -> float:
    """Median host time of ``fn`` (ms), the GPU drained before each call so a full queue never blocks."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2] * 1e3


@contextlib.contextmanager
def triton_launches_stubbed():
    """Every ``kernel[grid](...)`` (jit or autotuned) returns at once: nothing runs on the GPU."""
    from triton.runtime.jit import KernelInterface

    orig = KernelInterface.__getitem__
    KernelInterface.__getitem__ = lambda self, grid: (lambda *a, **k: None)
    try:
        yield
    finally:
        KernelInterface.__getitem__ = orig


@contextlib.contextmanager
def launches_timed(acc: dict):
    """Every ``kernel[grid](...)`` runs as usual; its host time (s) is appended to ``acc[kernel name]``."""
    from triton.runtime.jit import KernelInterface

    orig = KernelInterface.__getitem__

    def timed_getitem(self, grid):
        launch = orig(self, grid)
        name = getattr(getattr(self, "fn", self), "__name__", type(self).__name__)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return launch(*a, **k)
            finally:
                acc.setdefault(name, []).append(time.perf_counter() - t0)
        return timed

    KernelInterface.__getitem__ = timed_getitem
    try:
        yield
    finally:
        KernelInterface.__getitem__ = orig


def per_launch_table(fn, reps: int = 20) -> str:
    """Median host µs of each kernel's launches over ``reps`` calls of ``fn`` (GPU drained before each), and
    their sum against the whole call's host time: what is left is our wrappers, torch and autograd."""
    for _ in range(3):
        fn()
    per_call, whole = [], []
    for _ in range(reps):
        acc: dict = {}
        torch.cuda.synchronize()
        with launches_timed(acc):
            t0 = time.perf_counter()
            fn()
            whole.append(time.perf_counter() - t0)
        per_call.append(acc)
    torch.cuda.synchronize()
    lines, total = [], 0.0
    for name in per_call[0]:
        sums = sorted(sum(c.get(name, [0.0])) for c in per_call)
        n = len(per_call[0][name])
        med = sums[len(sums) // 2] * 1e6
        total += med
        lines.append(f"    {name:36s} x{n}  {med:8.1f} µs ({med / n:6.1f} per launch)")
    whole.sort()
    w = whole[len(whole) // 2] * 1e6
    lines.append(f"    launches {total:8.1f} µs of the call's {w:8.1f} µs host (rest: wrappers, torch, autograd)")
    return "\n".join(lines)


def sync_probe_ms(fn, cycles: int = 100_000_000) -> tuple:
    """(host ms of ``fn`` queued behind a GPU sleep of ``cycles`` clocks, ms of that sleep alone): a hidden
    host-device sync inside ``fn`` shows as a host time near the sleep's (torch's sync-debug mode sees only
    torch's own syncs, not a stream or event synchronize)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    sleep = time.perf_counter() - t0
    torch.cuda._sleep(cycles)
    t0 = time.perf_counter()
    fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host * 1e3, sleep * 1e3


def launch_costs(reps: int = 2000) -> dict:
    """Host µs per launch of a 40-argument kernel: plain jit, and autotuned (two configs, choice cached) by
    Triton's autotuner and by ours (:func:`mindspeed_ops.triton_utils.autotune`)."""
    from mindspeed_ops import triton_utils as tu

    plain = many_args_kernel
    configs = [triton.Config({"BV": 32}, num_warps=4), triton.Config({"BV": 64}, num_warps=4)]
    stock = triton.autotune(configs, key=["n"])(plain)
    tuned = tu.autotune(configs, key=["n"], cache_results=False)(plain)
    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    ints = list(range(2, 32))
    out = {}
    fast = _trimmed(plain)
    for name, launch in (("jit", lambda: plain[(1,)](x, y, *[x] * 8, 1024, *ints, BV=64)),
                         ("jit, trimmed path (prototype)", lambda: fast((1, 1, 1), x, y, *[x] * 8, 1024, *ints, BV=64)),
                         ("triton.autotune", lambda: stock[(1,)](x, y, *[x] * 8, 1024, *ints)),
                         ("triton_utils.autotune", lambda: tuned[(1,)](x, y, *[x] * 8, 1024, *ints))):
        for _ in range(20):
            launch()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            launch()
        out[name] = (time.perf_counter() - t0) / reps * 1e6
        torch.cuda.synchronize()
    return out


def _trimmed(fn):
    """Prototype of a lean launch of an already-compiled jit kernel: Triton's binder and cache key, without
    the per-launch hooks, knob reads and global checks of ``JITFunction.run``."""
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.jit import compute_cache_key

    opts = {"debug": fn.debug or knobs.runtime.debug, "instrumentation_mode": knobs.compilation.instrumentation_mode}
    get_stream = driver.active.get_current_stream

    def launch(grid, *args, **kwargs):
        dev = torch.cuda.current_device()
        kernel_cache, kernel_key_cache, _, _, binder = fn.device_caches[dev]
        bound, spec, options = binder(*args, **kwargs, **opts)
        kernel = kernel_cache.get(compute_cache_key(kernel_key_cache, spec, options))
        if kernel is None:
            return fn.run(*args, grid=grid, warmup=False, **kwargs)
        kernel.run(grid[0], grid[1], grid[2], get_stream(dev), kernel.function, kernel.packed_metadata, None,
                   None, None, *bound.values())

    return launch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", required=True)
    p.add_argument("--case")
    p.add_argument("--shape")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--sync-debug", action="store_true", help="list the synchronizing calls of one step")
    p.add_argument("--per-launch", action="store_true", help="host µs of each kernel's launches in one step")
    p.add_argument("--sync-probe", action="store_true",
                   help="host time of one step queued behind a GPU sleep (a hidden sync shows as the sleep's time)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("host_overhead: needs a GPU")
    from mindspeed_ops.atk.inputs import torch_dtype
    from mindspeed_ops.atk.schema import load_specs

    (spec,) = load_specs(None, [args.op])
    case = next(c for c in spec.cases if args.case in (None, c.name))
    point = _point(case, args.shape, True)
    print(f"{args.op} / {case.name} / {point.text()} / {args.dtype} (torch {torch.__version__})")
    fwd, fwd_bwd = _step_fns(case, point, torch_dtype(args.dtype), "cuda")
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
        if fn is None:
            continue
        full = host_ms(fn)
        with triton_launches_stubbed():
            stub = host_ms(fn)
        print(f"{name:17s} host {full:7.3f} ms; with Triton launches stubbed {stub:7.3f} ms "
              f"(Triton's launch path {full - stub:6.3f} ms)")
        if args.per_launch:
            print(per_launch_table(fn))
        if args.sync_probe:
            for host, sleep in (sync_probe_ms(fn) for _ in range(3)):
                print(f"  one {name} step queued behind a {sleep:.1f} ms GPU sleep: {host:.3f} ms host")
        if args.sync_debug:
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    fn()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0][:100]}" for w in caught
                     if "synchroniz" in str(w.message)]
            print(f"  synchronizing calls in one {name} step: {len(syncs)}")
            for line in syncs:
                print("   ", line)
    for name, us in launch_costs().items():
        print(f"one launch of a 40-argument kernel, {name}: {us:6.1f} µs host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
