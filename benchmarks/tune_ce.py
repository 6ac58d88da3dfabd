"""Forward tile sweep of the fused cross-entropy row kernel on the GPU (the ``fwd_block`` tuning knob):
median ms (do_bench) and % of copy bandwidth of ``launch_fwd`` per (BLOCK, num_warps).

    python3 benchmarks/tune_ce.py [--rows 8192] [--vocab 151936]
"""
import argparse
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mindspeed_ops.ops.loss import cross_entropy as ce  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=151936)
    a = ap.parse_args()
    x = (torch.randn(a.rows, a.vocab, device="cuda") * 2).to(torch.bfloat16)
    y = torch.randint(0, a.vocab, (a.rows,), device="cuda")
    loss = torch.empty(a.rows, device="cuda")
    lse = torch.empty(a.rows, device="cuda")
    src = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6  # GB/s
    layout = (a.rows, 0, a.vocab)
    print(f"default fwd_block: {ce.fwd_block(a.vocab, x.dtype)}; copy {copy:.0f} GB/s")
    for block, nw in ((1024, 4), (2048, 4), (2048, 8), (4096, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16)):
        fn = lambda: ce.launch_fwd(x, layout, a.rows, a.vocab, y, None, None, loss, lse, -100, 0.0, 0.0, None,  # noqa
                                   block=(block, nw))
        fn()
        ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
        print(f"BLOCK={block:6d} warps={nw:2d}: {ms:.3f} ms  {100 * x.numel() * 2 / (ms * 1e-3) / 1e9 / copy:.0f}% of copy",
              flush=True)


if __name__ == "__main__":
    main()
