"""Tile sweep of the sort_chunks_by_idx row-gather kernel on the GPU (``sort_chunks._tiles``): times the
forward gather (tables + copy, device split tables) against ``torch`` copy of the same bytes, per (row
segment words, rows a tile, warps), and checks every configuration's output bitwise against the default's
(do_bench medians). At the default tiles it then times the backward gather (inverse tables) and the public
op's forward+backward (autograd, the backward reusing the forward's tables) against the same copy, each
also as GPU kernel time (torch.profiler).

    python3 benchmarks/tune_sort.py [--M 65536] [--D 4096] [--S 64] [--no-sweep]
"""
import argparse
import itertools
import os
import sys

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mindspeed_ops.api import sort_chunks_by_idx  # noqa: E402
from mindspeed_ops.atk.measure import bench_ms, copy_bandwidth_gbs  # noqa: E402  (the ATK's timing and ceiling)
from mindspeed_ops.ops.moe import sort_chunks as S  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--M", type=int, default=65536, help="rows (tokens)")
    p.add_argument("--D", type=int, default=4096, help="hidden size (bf16)")
    p.add_argument("--S", type=int, default=64, help="chunks")
    p.add_argument("--no-sweep", action="store_true", help="time the default tiles only")
    a = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(a.M, a.D, device="cuda", dtype=torch.bfloat16)
    sizes = torch.multinomial(torch.ones(a.S), a.M, replacement=True, generator=gen).bincount(minlength=a.S)
    sizes, idx = sizes.cuda(), torch.randperm(a.S, generator=gen).cuda()
    nbytes = x.numel() * x.element_size()
    copy_gbs = copy_bandwidth_gbs("cuda", nbytes=nbytes, rep=200)  # a copy of the same bytes
    copy_ms = 2 * nbytes / copy_gbs / 1e6
    print(f"[{a.M}, {a.D}] bf16, {a.S} chunks; torch {torch.__version__}; copy {copy_ms:.4f} ms "
          f"({copy_gbs:.0f} GB/s)", flush=True)
    orig = S._tiles
    word = S._word_view(x).element_size()  # the kernel copies rows as words of this many bytes
    print(f"default tiles {orig(x.shape[1] * 2 // word, word, a.S)} (rows, words, warps) of {word}-byte words")
    ref = S.forward(x, sizes, idx)
    results = []
    grid = itertools.product([256, 512, 1024], [1, 2, 4, 8, 16, 32], [4, 8, 16])
    try:
        for bw, bm, warps in ([] if a.no_sweep else grid):
            if bw * bm * word > 131072 or bw * bm < 32 * warps * 2:  # 128 KiB tiles at most; >= 2 words a thread
                continue
            S._tiles = lambda W, wb, NS, _t=(bm, bw, warps): _t
            out = S.forward(x, sizes, idx)
            assert torch.equal(out, ref), (bw, bm, warps)
            ms = bench_ms(lambda: S.forward(x, sizes, idx), "cuda", rep=200).median_ms
            results.append((ms, bw, bm, warps))
            print(f"  words {bw:4d} rows {bm:2d} warps {warps:2d}: {ms:.4f} ms {100 * copy_ms / ms:5.1f}% of copy",
                  flush=True)
    finally:
        S._tiles = orig
    if results:
        ms, bw, bm, warps = min(results)
        print(f"best: words {bw} rows {bm} warps {warps}: {ms:.4f} ms = {100 * copy_ms / ms:.1f}% of copy")
    time_default(x, sizes, idx, ref, copy_ms)


def time_default(x, sizes, idx, ref, copy_ms: float) -> None:
    """Default tiles: forward, backward gather, and the op's forward+backward (two copies' worth of bytes)."""
    assert torch.equal(S.backward(ref, sizes, idx), x), "the backward gather must undo the forward"
    rows = [("forward gather", lambda: S.forward(x, sizes, idx), copy_ms),
            ("backward gather", lambda: S.backward(ref, sizes, idx), copy_ms)]
    xg, dy = x.clone().requires_grad_(True), torch.randn_like(x)
    split, order = sizes.tolist(), idx.tolist()

    def step() -> None:
        xg.grad = None  # no gradient accumulation kernel in the timed step
        torch.autograd.backward(sort_chunks_by_idx(xg, split, order), dy)

    rows.append(("op fwd+bwd", step, 2 * copy_ms))
    for name, fn, floor in rows:
        ms = bench_ms(fn, "cuda", rep=200).median_ms
        gpu = kernel_ms(fn)
        gpu_pct = f"{100 * floor / gpu:.1f}%" if gpu > 0 else "n/a"
        print(f"default tiles, {name}: {ms:.4f} ms = {100 * floor / ms:.1f}% of copy; kernels {gpu:.4f} ms = "
              f"{gpu_pct} of copy", flush=True)


def kernel_ms(fn, steps: int = 20) -> float:
    """GPU kernel time per call (torch.profiler, summed over the CUDA kernels and copies): the op-level
    do_bench median includes its host work (argument checks, tables) when that exceeds the GPU time."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    cuda = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]  # kernels/copies, not host ops
    return sum(e.self_device_time_total for e in cuda) / steps / 1e3


if __name__ == "__main__":
    main()
