"""A/B timing of the causal_conv1d kernels against an older version of their module, on the GPU: the same
launchers (``causal_conv1d.TUNE`` as in this tree), B4 T4096 D8192 W4 silu bf16, rounds alternating the two
versions; forward and backward do_bench medians, % of a same-run copy, and whether outputs are bitwise equal.

    git show <rev>:mindspeed_ops/ops/conv/triton_kernels.py > /tmp/old_conv_kernels.py
    python3 benchmarks/ab_conv.py --old /tmp/old_conv_kernels.py
"""
import argparse
import importlib
import importlib.util
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_conv import inputs  # noqa: E402  (the same point as the tile sweep)
KERNELS = ("causal_conv1d_fwd_kernel", "causal_conv1d_bwd_kernel")


def _load_old(path: str):
    """The old module under a sibling name, so its relative imports resolve in this package."""
    spec = importlib.util.spec_from_file_location("mindspeed_ops.ops.conv.triton_kernels_old", path)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "mindspeed_ops.ops.conv"
    spec.loader.exec_module(mod)
    return mod


def main(old_path: str, rounds: int) -> None:
    launchers = importlib.import_module("mindspeed_ops.ops.conv.causal_conv1d")
    current = importlib.import_module("mindspeed_ops.ops.conv.triton_kernels")  # the launchers import from here
    versions = {"new": {k: getattr(current, k) for k in KERNELS}, "old": {k: getattr(_load_old(old_path), k)
                                                                           for k in KERNELS}}
    x, dy, w, b, _ = inputs()
    copy = do_bench(lambda: x.clone(), warmup=25, rep=200)
    print(f"copy {copy:.4f} ms")
    outs = {}
    for rnd in range(rounds):
        for name, kernels in versions.items():
            for k, fn in kernels.items():
                setattr(current, k, fn)
            fwd = lambda: launchers.forward(x, w, b, None, None, "silu", None, False)  # noqa: E731
            bwd = lambda: launchers.backward(dy, None, x, w, b, None, "silu", None)  # noqa: E731
            outs[name] = (fwd()[0], *bwd()[:3])
            f_ms, b_ms = do_bench(fwd, warmup=25, rep=300), do_bench(bwd, warmup=25, rep=300)
            # the forward moves one copy's bytes (x in, y out), the backward 1.5 (x, dy in, dx out)
            print(f"round {rnd} {name}: fwd {f_ms:.4f} ms ({100 * copy / f_ms:.1f}% of copy)  "
                  f"bwd {b_ms:.4f} ms ({150 * copy / b_ms:.1f}%)", flush=True)
    print("bitwise equal new vs old (y, dx, dweight, dbias):",
          [torch.equal(a, c) for a, c in zip(outs["new"], outs["old"])])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="path of the older triton_kernels.py")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    main(args.old, args.rounds)
