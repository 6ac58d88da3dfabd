"""solve_tril on the GPU at the GDN shape: median us (do_bench) per chunk size and ``num_warps``, each
checked against the float64 reference.

    python3 benchmarks/tune_solve_tril.py [--T 8192] [--HV 32] [--BT 16 32 64]

A = the strictly-lower ``beta · k kᵀ`` of unit-norm keys (as chunk_scaled_dot_kkt makes it), fp32; output bf16.
"""
import argparse
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import importlib  # noqa: E402

from mindspeed_ops.ops.gdn import kkt  # noqa: E402
from mindspeed_ops.ops.gdn.reference import solve_tril_ref  # noqa: E402
from mindspeed_ops.testing import rel_rms  # noqa: E402


st = importlib.import_module("mindspeed_ops.ops.gdn.solve_tril")  # the module (the package exports the function)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--HV", type=int, default=32)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--BT", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script itself (TRITON_INTERPRET=1, "
                    "small --T), no timing")
    a = ap.parse_args()
    dev = a.device
    k = torch.nn.functional.normalize(torch.randn(1, a.T, a.HV, a.K, device=dev), dim=-1).to(torch.bfloat16)
    beta = torch.rand(1, a.T, a.HV, device=dev).to(torch.bfloat16)
    default = dict(st.NUM_WARPS)
    try:
        for BT in a.BT:
            A = kkt.chunk_scaled_dot_kkt_fwd(k, beta=beta, chunk_size=BT)
            ref = solve_tril_ref(A.double())
            print(f"BT={BT}: A {tuple(A.shape)} {A.dtype}; default num_warps {default[BT]}", flush=True)
            for nw in (1, 2, 4, 8):
                st.NUM_WARPS[BT] = nw
                fn = lambda: st.forward(A, None, None, torch.bfloat16)  # noqa: E731
                err = rel_rms(fn(), ref)
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median") if dev == "cuda" else float("nan")
                print(f"  BT={BT} num_warps={nw}: {ms * 1e3:8.1f} us  rel_rms vs fp64 {err:.2e}", flush=True)
    finally:
        st.NUM_WARPS.update(default)

if __name__ == "__main__":
    main()
