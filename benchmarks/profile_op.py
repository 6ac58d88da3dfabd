"""Where does an operator's time go? One ATK case point (tests/atk_tests/<op>.yaml), run under
``torch.profiler``: the device kernels of one forward (and forward+backward) step, with their share
of the step, plus the host time of the step. Inputs are built exactly as ``mindspeed-ops atk`` builds them.

    python benchmarks/profile_op.py --op causal_conv1d --case "qwen3-next conv" --shape B=4,T=4096,D=8192,W=4
    python benchmarks/profile_op.py --op chunk_kda --quick           # the case's quick point, bf16

On CPU it runs (reference or interpreter, tiny shapes advised) so the script itself is testable; the
kernel table is only meaningful on a GPU.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch


def _point(case, shape: str | None, quick: bool):
    from mindspeed_ops.atk.runner import shape_points

    if shape:
        dims = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (kv.split("=", 1) for kv in shape.split(","))}
        for p in case.shapes:
            if all(p.dims.get(k) == v for k, v in dims.items()):
                return p
        raise SystemExit(f"profile_op: no point {dims} in case {case.name!r}; points: "
                         + "; ".join(p.text() for p in case.shapes))
    return shape_points(case, small=not quick and not torch.cuda.is_available(), quick=True)[0]


def _step_fns(case, point, dtype, device):
    """(forward step, forward+backward step or None): the ATK harness's own runners for ``ours``."""
    from mindspeed_ops.atk.inputs import build_inputs, call_kwargs
    from mindspeed_ops.atk.measure import Impl, _fwd_runner, _fwdbwd_runner
    from mindspeed_ops.atk.runner import resolve_callable

    call = resolve_callable(case.call)
    extra = call_kwargs(case, point.dims, dtype)
    inputs = build_inputs(case, point.dims, dtype, device)
    grad_names = tuple(n for n in case.grads if isinstance(inputs.get(n), torch.Tensor))
    impl = Impl("ours", "ours", (lambda **kw: call(**kw, **extra)) if extra else call)
    fwd = _fwd_runner(impl, inputs)

    def fwd_no_grad():
        with torch.no_grad():
            return fwd()

    if not grad_names or case.mutates:  # in-place ops: the forward only
        return fwd_no_grad, None
    return fwd_no_grad, _fwdbwd_runner(impl, inputs, grad_names)


def profile(fn, device: str, rows: int, reps: int = 5) -> str:
    """A kernel table of ``reps`` calls of ``fn`` after warm-up (compiles and autotuning excluded)."""
    from torch.profiler import ProfilerActivity, profile as tprofile

    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host_ms = (time.perf_counter() - t0) / reps * 1e3  # launch-side time per call (no sync inside)
    if device == "cuda":
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with tprofile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=rows)
    return f"host time per call (no sync): {host_ms:.3f} ms; {reps} calls profiled\n{table}"


def host_profile(fn, device: str, rows: int, reps: int = 20) -> str:
    """Where the host time of ``fn`` goes: Python's cProfile over ``reps`` warmed calls (own time and
    cumulative time per function), so launch-bound steps show which wrappers cost what."""
    import cProfile
    import io
    import pstats

    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    prof.disable()
    if device == "cuda":
        torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    out.write(f"cProfile of {reps} calls (times are totals over the calls; cProfile adds its own overhead)\n")
    stats.sort_stats("tottime").print_stats(rows)
    stats.sort_stats("cumulative").print_stats(rows)
    return out.getvalue()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", required=True, help="operator = tests/atk_tests/<op>.yaml")
    p.add_argument("--case", help="case name (default: the file's first case)")
    p.add_argument("--shape", help="point as B=4,T=4096,... (default: the case's quick point; on CPU its cpu point)")
    p.add_argument("--quick", action="store_true", help="the quick point even on CPU")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--rows", type=int, default=20, help="rows of each kernel table")
    p.add_argument("--host-profile", action="store_true",
                   help="also a cProfile of the host side of each step (which Python functions cost what)")
    p.add_argument("--atk-dir", default=None, help="case-file directory (default: tests/atk_tests)")
    args = p.parse_args(argv)

    from mindspeed_ops.atk.inputs import torch_dtype
    from mindspeed_ops.atk.schema import load_specs

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch_dtype(args.dtype)
    if device == "cpu" and dtype == torch.bfloat16:
        dtype = torch.float32  # bf16 kernels are GPU-only (DESIGN 7)
    (spec,) = load_specs(args.atk_dir, [args.op])
    cases = [c for c in spec.cases if args.case in (None, c.name)]
    if not cases:
        raise SystemExit(f"profile_op: no case {args.case!r} in {spec.path}; cases: "
                         + ", ".join(repr(c.name) for c in spec.cases))
    case = cases[0]
    point = _point(case, args.shape, args.quick)
    print(f"{args.op} / {case.name} / {point.text()} / {dtype} on {device} (torch {torch.__version__})")
    fwd, fwd_bwd = _step_fns(case, point, dtype, device)
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
        if fn is not None:
            print(f"\n== {name}")
            print(profile(fn, device, args.rows))
            if args.host_profile:
                print(host_profile(fn, device, args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
