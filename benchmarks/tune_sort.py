"""Tile sweep of the sort_chunks_by_idx row-gather kernel on the GPU (``sort_chunks._tiles``): times the
forward gather (tables + copy, device split tables) against ``torch`` copy of the same bytes, per (row
segment words, rows a tile, warps), and checks every configuration's output bitwise against the default's
(do_bench medians).

    python3 benchmarks/tune_sort.py [--M 65536] [--D 4096] [--S 64]
"""
import argparse
import itertools
import os
import sys

import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mindspeed_ops.atk.measure import bench_ms, copy_bandwidth_gbs  # noqa: E402  (the ATK's timing and ceiling)
from mindspeed_ops.ops.moe import sort_chunks as S  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--M", type=int, default=65536, help="rows (tokens)")
    p.add_argument("--D", type=int, default=4096, help="hidden size (bf16)")
    p.add_argument("--S", type=int, default=64, help="chunks")
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
    try:
        for bw, bm, warps in itertools.product([256, 512, 1024], [1, 2, 4, 8, 16, 32], [4, 8, 16]):
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
    ms, bw, bm, warps = min(results)
    print(f"best: words {bw} rows {bm} warps {warps}: {ms:.4f} ms = {100 * copy_ms / ms:.1f}% of copy")


if __name__ == "__main__":
    main()
