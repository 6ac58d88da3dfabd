"""Where does fwd+bwd time go for small memory-bound ops? GPU time (CUDA graph replay) vs
do_bench wall time vs host time per call. Usage: python benchmarks/diag_overhead.py"""
import time

import torch
import triton.testing as tt

from mindspeed_ops import api


def host_us(fn, n=200):
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def report(name, fn):
    db = tt.do_bench(fn, warmup=25, rep=100, return_mode="median")
    try:
        g = tt.do_bench_cudagraph(fn, rep=100, return_mode="median")
    except Exception as e:  # noqa: BLE001
        g = float("nan"); print("  cudagraph failed:", type(e).__name__, str(e)[:200])
    h_issue, h_total = host_us(fn)
    print(f"{name:55s} do_bench {db*1e3:8.1f} us  graph {g*1e3:8.1f} us  host-issue {h_issue:8.1f} us  host-total {h_total:8.1f} us")


x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
dy = torch.randn_like(x)
xg = x.clone().requires_grad_()
wg = w.clone().requires_grad_()
report("rms_norm fwd", lambda: api.rms_norm(x, w))
report("rms_norm bwd op direct", lambda: torch.ops.mindspeed_ops.rms_norm_bwd(dy, x, w, 1e-6, 0.0, True))
report("rms_norm fwd+bwd autograd", lambda: torch.autograd.grad(api.rms_norm(xg, wg), (xg, wg), dy))
report("F.rms_norm fwd+bwd autograd", lambda: torch.autograd.grad(torch.nn.functional.rms_norm(xg, (4096,), wg, 1e-6), (xg, wg), dy))
report("x*2 fwd+bwd autograd (floor)", lambda: torch.autograd.grad(xg * 2, (xg,), dy))
g = torch.randn(8192, 2 * 2880, device="cuda", dtype=torch.bfloat16).requires_grad_()
dg = torch.randn(8192, 2880, device="cuda", dtype=torch.bfloat16)
report("clipped_swiglu fwd", lambda: api.clipped_swiglu(g))
report("clipped_swiglu fwd+bwd", lambda: torch.autograd.grad(api.clipped_swiglu(g), (g,), dg))
import cProfile
import pstats

for name, fn in [("rms_norm fwd+bwd", lambda: torch.autograd.grad(api.rms_norm(xg, wg), (xg, wg), dy)),
                 ("clipped_swiglu fwd+bwd", lambda: torch.autograd.grad(api.clipped_swiglu(g), (g,), dg))]:
    fn(); torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    print("=====", name)
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)
