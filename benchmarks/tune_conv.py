"""Tile sweep of the streaming causal_conv1d kernels on the GPU (``causal_conv1d.TUNE``): times the
launchers directly and checks y is bitwise identical across forward configs.

    python3 benchmarks/tune_conv.py [--quick]

``--quick``: the forward and backward grids at 4 and 8 warps around the defaults only, and the backward at
8 channels per thread (~2 min).
"""
import argparse
import importlib
import itertools
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
L = importlib.import_module("mindspeed_ops.ops.conv.causal_conv1d")


def inputs():
    """``x, dy, weight, bias`` of issue 7's point (B4 T4096 D8192 W4, bf16, on the GPU) and x's size in GB."""
    B, T, D, W = 4, 4096, 8192, 4
    x = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(W, D, device="cuda") * .5).bfloat16()
    return x, torch.randn_like(x), w, torch.randn(D, device="cuda", dtype=torch.bfloat16), B * T * D * 2 / 1e6


def main(quick: bool = False) -> None:
    x, dy, w, b, gb = inputs()
    base = {k: dict(v) for k, v in L.TUNE.items()}
    copy_ms = do_bench(lambda: x.clone(), warmup=25, rep=200)
    print(f"copy: {copy_ms:.4f} ms {2 * gb / copy_ms:.0f} GB/s", flush=True)
    if quick:
        fwd_grid = itertools.product([8], [4, 8], [4, 8, 16], [4, 8])
        bwd_grid = itertools.chain(itertools.product([4], [2, 4], [128, None], [4, 8], [4, 8]),
                                   itertools.product([8], [2, 4], [168, None], [2, 4], [4]))
    else:
        fwd_grid = itertools.product([8, 4], [4, 8, 16], [4, 8, 16, 48], [4, 8])
        bwd_grid = itertools.product([4, 2, 8], [2, 4, 8], [128, 168, None], [4, 8, 16], [4, 8])
    ref = None
    for vec, r, pps, warps in fwd_grid:
        L.TUNE = {k: dict(v) for k, v in base.items()}
        L.TUNE["fwd"].update(vec=vec, r=r, programs_per_sm=pps, warps=warps)
        f = lambda: L.forward(x, w, b, None, None, "silu", None, False)  # noqa: E731
        y = f()[0]
        ref = y if ref is None else ref
        assert torch.equal(y, ref)
        ms = do_bench(f, warmup=25, rep=200)
        print(f"fwd vec{vec} r{r} pps{pps} warps{warps}: {ms:.4f} ms {2 * gb / ms:.0f} GB/s "
              f"{100 * copy_ms / ms:.1f}% of copy", flush=True)
    for vec, r, mx, pps, warps in bwd_grid:
        L.TUNE = {k: dict(v) for k, v in base.items()}
        L.TUNE["bwd"].update(vec=vec, r=r, maxnreg=mx, programs_per_sm=pps, warps=warps)
        ms = do_bench(lambda: L.backward(dy, None, x, w, b, None, "silu", None), warmup=25, rep=200)
        print(f"bwd vec{vec} r{r} maxnreg{mx} pps{pps} warps{warps}: {ms:.4f} ms {3 * gb / ms:.0f} GB/s "
              f"{100 * 1.5 * copy_ms / ms:.1f}% of copy", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the grids around the defaults only (~2 min)")
    main(parser.parse_args().quick)
