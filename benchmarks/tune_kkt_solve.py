"""The fused kkt + solve_tril kernel of the GDN forward (``kkt_solve_fwd_kernel``, ``kkt_solve.CONFIG``) at
one shape: median us (``triton.testing.do_bench``) per chunk size and ``(BK, warps, stages)``, each checked
against the unfused pipeline it replaces (``kkt.forward`` fp32 A -> ``solve_tril.forward``), which is timed
first (its two launches together, as the forward ran them before).

    python3 benchmarks/tune_kkt_solve.py [--T 8192] [--H 16] [--HV 32] [--K 128] [--BT 64 32 16]
    python3 benchmarks/tune_kkt_solve.py --device cpu --T 80 --H 1 --HV 2 --K 32 --BT 64 16   # script check

Inputs as the forward passes them: raw bf16 keys with their fp32 l2norm rstd (``rk``), the chunk-local
cumsum ``G`` of ``logsigmoid(randn)`` gates, sigmoid beta; output in k's dtype.
"""
import argparse
import importlib
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_gdn_bwd import _sweep, _time, shape_args  # noqa: E402

from mindspeed_ops.ops.gdn import cumsum, kkt, kkt_solve  # noqa: E402
from mindspeed_ops.testing import rel_rms  # noqa: E402

st = importlib.import_module("mindspeed_ops.ops.gdn.solve_tril")  # the module (the package exports the function)


def main() -> None:
    ap = argparse.ArgumentParser()
    shape_args(ap, ("T", "H", "HV", "K"))
    ap.add_argument("--BT", type=int, nargs="+", default=[64, 32, 16])
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script itself (TRITON_INTERPRET=1)")
    a = ap.parse_args()
    dev = a.device
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    B, T, H, HV, K = 1, a.T, a.H, a.HV, a.K
    k = torch.randn(B, T, H, K, device=dev).to(dt)
    rk = torch.rsqrt(k.float().pow(2).sum(-1) + 1e-6)
    beta = torch.sigmoid(torch.randn(B, T, HV, device=dev)).to(dt)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device=dev))
    print(f"B=1 T={T} H={H} HV={HV} K={K} {dt}; torch {torch.__version__}", flush=True)
    default = dict(kkt_solve.CONFIG)
    try:
        for BT in a.BT:
            G = cumsum.forward(g, BT, False, None, None, None, torch.float32, None)

            def unfused():
                A = kkt.forward(k, G, None, beta, HV, None, None, BT, torch.float32, None, rk=rk)
                return st.forward(A, None, None, dt)

            def fused():
                return kkt_solve.forward(k, G, beta, HV, None, None, BT, dt, None, rk=rk)

            ref = unfused()
            print(f"BT={BT}: unfused kkt + solve_tril {_time(unfused, dev):8.1f} us; default fused config "
                  f"{default[BT]}", flush=True)

            def apply(BK, nw, ns):
                kkt_solve.CONFIG[BT] = (BK, nw, ns)

            configs = [default[BT]] + [c for c in itertools.product((64, 32), (1, 2, 4), (1, 2)) if c != default[BT]]
            _sweep(lambda: [fused()], [ref], dev, ("BK", "warps", "stages"), apply, configs)
            kkt_solve.CONFIG[BT] = default[BT]
            print(f"  default vs unfused rel_rms {rel_rms(fused().float(), ref.float().double()):.1e}", flush=True)
    finally:
        kkt_solve.CONFIG.update(default)


if __name__ == "__main__":
    main()
