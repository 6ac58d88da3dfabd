"""First H200 timing of the loss family (a smoke benchmark, not the issue-3 report): forward+backward
median ms (do_bench) and extra peak memory of ours vs PyTorch eager and torch.compile.
Usage: python3 benchmarks/quick_losses.py"""
import torch
import torch.nn.functional as F
from triton.testing import do_bench

from mindspeed_ops import api


def measure(name, fn, nbytes=None):
    fn()
    torch.cuda.synchronize()
    ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - base) / 2**20
    bw = f"  {nbytes / (ms * 1e-3) / 1e9:7.0f} GB/s" if nbytes else ""
    print(f"{name:58s} {ms:9.3f} ms  peak extra {extra:9.1f} MiB{bw}", flush=True)


def ce_case(N, V):
    x = (torch.randn(N, V, device="cuda") * 2).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, V, (N,), device="cuda")
    nbytes = 3 * N * V * 2  # read logits twice (fwd, bwd), write the gradient once
    measure(f"fused_cross_entropy_loss [{N}, {V}] fwd+bwd", lambda: torch.autograd.grad(
        api.fused_cross_entropy_loss(x, y), x), nbytes)
    measure(f"F.cross_entropy (fp32 upcast) [{N}, {V}] fwd+bwd", lambda: torch.autograd.grad(
        F.cross_entropy(x.float(), y), x))
    comp = torch.compile(lambda a, b: F.cross_entropy(a.float(), b))
    measure(f"torch.compile(F.cross_entropy) [{N}, {V}] fwd+bwd", lambda: torch.autograd.grad(comp(x, y), x))


def chunk_case(N, H, V):
    h = (torch.randn(N, H, device="cuda")).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(V, H, device="cuda") * H ** -0.5).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, V, (N,), device="cuda")
    flops = 3 * 2 * N * H * V
    measure(f"chunk_loss [{N}, {H}] x [{V}, {H}] fwd+bwd", lambda: torch.autograd.grad(api.chunk_loss(h, w, y), (h, w)))
    print(f"{'':58s} (three GEMMs: {flops / 1e12:.1f} TFLOP)")
    comp = torch.compile(lambda a, b, c: F.cross_entropy((a @ b.t()).float(), c))
    measure(f"torch.compile(linear + CE) [{N}, {H}] x [{V}, {H}] fwd+bwd",
            lambda: torch.autograd.grad(comp(h, w, y), (h, w)))


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    ce_case(8192, 151936)
    chunk_case(8192, 4096, 151936)
    chunk_case(4096, 2880, 201088)
