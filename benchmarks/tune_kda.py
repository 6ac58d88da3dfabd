"""Launch configurations of KDA's three largest kernels at one shape: the intra-chunk backward
(``kda_bwd_intra_kernel``, ``bwd.intra_bwd_config``) and the forward's Aqk + M kernel (``kda_aqk_fwd_kernel``,
``intra.aqk_config``; ``--only qgkg``: the same kernel as the backward's elementwise qg/kg pass): median us
(``triton.testing.do_bench``) per ``(BK, warps)`` (Aqk: ``(BK, warps, stages)``); the WY/state backward
(``kda_bwd_wy_dqkg_kernel``, ``bwd.wy_dqkg_config``) per ``(BK, BV, warps, stages)``; each checked against the
default configuration's output (rel-RMS). ``--only fwd_h dhu``: the state scans with per-channel gates, as KDA
launches them (``tune_gdn_bwd.sweep_scan``).

    python3 benchmarks/tune_kda.py [--T 8192] [--H 16] [--HV 32] [--K 128] [--only intra_bwd aqk qgkg wy_dqkg fwd_h dhu]
    python3 benchmarks/tune_kda.py --device cpu --T 128 --H 2 --HV 4 --K 32   # script check

Inputs: unit q/k, per-channel ``g = logsigmoid`` and its chunk-local cumsum ``G``, sigmoid beta, random
``dAq``/``dAm`` (only their valid triangles are read). The kernel adds to its dq/dk/dg/db buffers in
place, so each timed run starts from fresh copies; their copy time is printed first.
"""
import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_gdn_bwd import _sweep, _time, shape_args, sweep_scan  # noqa: E402

from mindspeed_ops.ops.gdn import cumsum  # noqa: E402
from mindspeed_ops.ops.kda import bwd, intra  # noqa: E402


def _config(text: str) -> tuple:
    """``"32,1,3"`` -> ``(32, 1, 3)``: one launch configuration on the command line."""
    return tuple(int(x) for x in text.split(","))


def main() -> None:
    ap = argparse.ArgumentParser()
    shape_args(ap, ("T", "H", "HV", "K"))
    ap.add_argument("--only", nargs="+", default=["intra_bwd", "aqk", "wy_dqkg"],
                    choices=["intra_bwd", "aqk", "qgkg", "wy_dqkg", "fwd_h", "dhu"])
    ap.add_argument("--wy-configs", nargs="+", type=_config, default=None, metavar="BK,BV,WARPS,STAGES",
                    help="wy_dqkg configurations to time (default: the whole grid); each is also run a second "
                         "time and compared with its own first output (a race shows there)")
    ap.add_argument("--intra-configs", nargs="+", type=_config, default=None, metavar="BK,WARPS",
                    help="only these intra-backward configurations (default: BK 16-64 x warps 2-8)")
    ap.add_argument("--aqk-configs", nargs="+", type=_config, default=None, metavar="BK,WARPS,STAGES",
                    help="only these Aqk / qg-kg configurations (default: BK 32-128 x warps 1-4 x stages 1, 3)")
    ap.add_argument("--gate-s", type=float, default=None,
                    help="gates g = logsigmoid(u) / s, u ~ U(0, 1) with 20%% zeros (the shared recipe: s = 0.1); "
                         "default g = logsigmoid(randn)")
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script itself (TRITON_INTERPRET=1)")
    a = ap.parse_args()
    dev, BT = a.device, 64
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    B, T, H, HV, K = 1, a.T, a.H, a.HV, a.K
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    if a.gate_s is None:
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, K, device=dev))
    else:
        g = torch.nn.functional.logsigmoid(torch.rand(B, T, HV, K, device=dev)) / a.gate_s
        g = g * (torch.rand(B, T, HV, K, device=dev) > 0.2)
    G = cumsum.forward(g, BT, False, None, None, None, torch.float32, None)
    beta = torch.rand(B, T, HV, device=dev).to(dt)
    dAq, dAm = (torch.randn(B, T, HV, BT, device=dev) for _ in range(2))
    bufs = [torch.randn(B, T, HV, K, device=dev) for _ in range(3)] + [torch.randn(B, T, HV, device=dev)]
    print(f"B=1 T={T} H={H} HV={HV} K={K} BT={BT} {dt}; gates "
          f"{'logsigmoid(randn)' if a.gate_s is None else f'logsigmoid(U) / {a.gate_s}'}; torch {torch.__version__}",
          flush=True)

    configs = a.intra_configs or list(itertools.product((32, 64, 16), (4, 8, 2)))

    def fresh():
        return [b.clone() for b in bufs]

    def run():
        return bwd.intra_bwd_forward(q, k, G, beta, dAq, dAm, *fresh(), None, None)

    if "intra_bwd" in a.only:
        print(f"copying dq/dk/dg/db (included below): {_time(fresh, dev):.1f} us", flush=True)
        _tune(bwd, "intra_bwd_config", run, dev, (K, dt), configs)
    # as the forward calls it: Aqk, M and kg, q/k l2norm rstd folded in
    rq, rk = (torch.rand(B, T, H, device=dev) + 0.5 for _ in range(2))

    def run_aqk():
        return intra.aqk_forward(q, k, G, K ** -0.5, None, None, BT, None, beta=beta, store_kg=True, rq=rq, rk=rk)

    def run_qgkg():  # the backward's elementwise pass (no Aqk): its own default
        return intra.aqk_forward(q, k, G, K ** -0.5, None, None, BT, None, store_a=False, store_qg=True,
                                 store_kg=True, rq=rq, rk=rk)

    aqk_configs = a.aqk_configs or list(itertools.product((64, 128, 32), (2, 4, 1), (3, 1)))
    if "aqk" in a.only:
        _tune(intra, "aqk_config", run_aqk, dev, (K, dt), aqk_configs)
    if "qgkg" in a.only:
        print("qg/kg pass (store_a=False):", flush=True)
        _tune(intra, "aqk_config", run_qgkg, dev, (K, dt, False), aqk_configs)
    if "wy_dqkg" in a.only:
        _tune_wy_dqkg(q, k, G, beta, dev, dt, BT, a.wy_configs)
    for which in ("fwd_h", "dhu"):
        if which in a.only:
            _tune_scan(which, q, k, G, dev, dt, BT)


def _tune_scan(which, q, k, G, dev, dt, BT):
    """KDA's state scans as its backward launches them: the per-value-head ``qg``/``kg`` of the Aqk kernel
    (per-channel gates folded in, so the scans read each chunk's last gate row only); random unit-scale
    ``w``, ``u``, ``do``, ``dv`` (timing and agreement between configurations only)."""
    from mindspeed_ops.ops.gdn import bwd_dhu, fwd_h
    B, T, H, K = q.shape
    HV = G.shape[2]
    _, qg, kg, _ = intra.aqk_forward(q, k, G, K ** -0.5, None, None, BT, None, store_a=False, store_qg=True,
                                     store_kg=True)
    w, u, do, dv = ((torch.randn(B, T, HV, K, device=dev) * 0.1).to(dt) for _ in range(4))

    def run():
        if which == "fwd_h":
            return fwd_h.forward(kg, w, u, None, G, None, False, BT, True, None, k_gated=True)
        return bwd_dhu.forward(qg, kg, w, do, dv, None, G, None, None, K ** -0.5, BT, None, qk_gated=True)

    sweep_scan(which, run, K, dt, dev, one_block=which == "fwd_h")  # dhu: 64-row blocks with per-channel gates


def _tune_wy_dqkg(q, k, G, beta, dev, dt, BT, picked=None):
    """Random (unit-scale) v, v_new, do, dv, states and a random dense A (the kernel reads whole tiles): timing and
    agreement between configurations only."""
    B, T, H, K = q.shape
    HV, V, NT = G.shape[2], K, -(-T // BT)
    v, vn, do, dv = (torch.randn(B, T, HV, V, device=dev).to(dt) for _ in range(4))
    h, dh = (torch.randn(B, NT, HV, K, V, device=dev).to(dt) * 0.1 for _ in range(2))
    A = (torch.randn(B, T, HV, BT, device=dev) * 0.1).to(dt)

    def run():
        return bwd.wy_dqkg_forward(q, k, v, vn, G, beta, A, h, do, dh, dv, K ** -0.5, None, None)

    orig = bwd.wy_dqkg_config
    print(f"wy_dqkg_config: default {orig(K, V, BT, dt)}: {_time(run, dev):8.1f} us", flush=True)
    ref = run()
    configs = [c for c in itertools.product((32, 64), (32, 64, 128), (4, 8), (1, 2, 3)) if c[:2] != (64, 128)]
    if picked:
        configs = picked

    def apply(bk, bv, nw, ns):
        bwd.wy_dqkg_config = lambda *_: (bk, bv, nw, ns)

    try:
        if picked:  # a configuration whose two runs differ has a race: its output and timing mean nothing
            for cfg in configs:
                apply(*cfg)
                first, again = run(), run()
                diff = max(float((x.float() - y.float()).abs().max()) for x, y in zip(first, again))
                print(f"  {cfg}: two runs differ by up to {diff:.3e}", flush=True)
        _sweep(run, ref, dev, ("BK", "BV", "warps", "stages"), apply, configs)
    finally:
        bwd.wy_dqkg_config = orig


def _tune(mod, name, run, dev, default_args, configs):
    """Sweep ``mod.name``'s configurations; ``default_args``: the config function's arguments for the default."""
    orig = getattr(mod, name)
    print(f"{name}: default {orig(*default_args)}: {_time(run, dev):8.1f} us", flush=True)
    ref = run()
    try:
        _sweep(run, ref, dev, ("BK", "warps", "stages")[:len(configs[0])],
               lambda *cfg: setattr(mod, name, lambda *_: cfg), configs)
    finally:
        setattr(mod, name, orig)


if __name__ == "__main__":
    main()
