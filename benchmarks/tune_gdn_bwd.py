"""Launch configurations of the GDN backward's largest kernels (and wy's forward and the forward state scan, run
twice per training step) at one shape: median us (``triton.testing.do_bench``) per configuration, each checked
against the current default configuration's output (rel-RMS; products in bf16 round the same operands,
only the accumulation order may differ).

    python3 benchmarks/tune_gdn_bwd.py [--T 8192] [--H 16] [--HV 32] [--K 128] [--V 128]
    python3 benchmarks/tune_gdn_bwd.py --device cpu --T 128 --H 2 --HV 4 --K 32 --V 32   # script check

- ``chunk_bwd_dqkwg``: K-block ``BK`` x V tile ``BV`` x warps x stages (the launcher's autotuner picks
  BV/warps/stages among its list; BK is fixed by ``block_k``). A configuration whose rel-RMS against the
  default is far above the others' is a miscompile (one was: BK=128, BV=32, 4 warps, 3 stages);
- ``prepare_wy_repr_bwd`` and ``recompute_w_u_fwd``: ``(BK = BV, warps, stages)`` (``wy_fast.*_config``);
- the state scans ``chunk_fwd_h`` and ``chunk_bwd_dhu``: the state's K block ``BK`` (``common.scan_block_k``: 64, or
  128 in one block) x ``BV`` x warps x stages.

Inputs are a real pipeline state: unit q/k, ``g = logsigmoid``, sigmoid beta, then the forward stages and
the backward stages up to each tuned one.
"""
import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import importlib  # noqa: E402

from mindspeed_ops.testing import rel_rms  # noqa: E402

_m = {n: importlib.import_module(f"mindspeed_ops.ops.gdn.{n}")
      for n in ("bwd_dhu", "bwd_dqkwg", "bwd_dv", "cumsum", "fwd_h", "kkt", "solve_tril", "wy_fast")}


def _state(a, dev):
    """Every tensor the tuned kernels read, made by the pipeline's own stages."""
    torch.manual_seed(0)
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    B, T, H, HV, K, V, BT = 1, a.T, a.H, a.HV, a.K, a.V, 64
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(B, T, HV, V, device=dev).to(dt)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device=dev))
    beta = torch.rand(B, T, HV, device=dev).to(dt)
    do = torch.randn(B, T, HV, V, device=dev).to(dt)
    scale = K ** -0.5
    G = _m["cumsum"].forward(g, BT, False, None, None, None, torch.float32, None)
    A = _m["kkt"].forward(k, G, None, beta, HV, None, None, BT, torch.float32, None)
    Ainv = _m["solve_tril"].forward(A, None, None, k.dtype, None)
    w, u = _m["wy_fast"].forward(k, v, beta, Ainv, G, None, None, None, None)
    h, v_new, _ = _m["fwd_h"].forward(k, w, u, G, None, None, False, BT, True, None)
    dv_local = _m["bwd_dv"].forward(q, k, do, G, scale, None, None, BT, None)
    dh, _, dv2 = _m["bwd_dhu"].forward(q, k, w, do, dv_local, G, None, None, None, scale, BT, None)
    return dict(q=q, k=k, v=v, beta=beta, G=G, Ainv=Ainv, w=w, u=u, h=h, v_new=v_new, do=do, dh=dh, dv2=dv2,
                dv_local=dv_local, scale=scale, BT=BT, dt=dt)


def _time(fn, dev):
    if dev != "cuda":
        return float("nan")
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def _errs(out, ref):
    return max(rel_rms(o.float(), r.float()) for o, r in zip(out, ref) if o is not None)


def _sweep(run, ref, dev, names, apply, configs):
    """Each configuration: ``apply(*config)``, run, check against ``ref``, time; a failing one is reported
    and skipped (a CUDA fault poisons the context: later ones then fail too, so order the likely-safe first)."""
    rows = []
    for cfg in configs:
        label = " ".join(f"{n}={v}" for n, v in zip(names, cfg))
        apply(*cfg)
        try:
            err = _errs(run(), ref)
            us = _time(run, dev)
        except Exception as e:  # out of resources, illegal access, ...: report and go on
            print(f"  {label}: failed ({type(e).__name__}: {str(e)[:80]})")
            continue
        rows.append((us, cfg))
        print(f"  {label}: {us:8.1f} us  rel_rms vs default {err:.1e}", flush=True)
    if rows:
        print("  best:", min(rows))


def tune_dqkwg(s, dev):
    import triton

    mod = _m["bwd_dqkwg"]
    orig_block_k, orig_configs = mod.block_k, mod._configs

    def run():
        return mod.forward(s["q"], s["k"], s["v_new"], s["do"], s["h"], s["dh"], s["G"], s["dv2"], s["w"], s["scale"],
                           None, None, s["BT"], None, dw_dtype=s["dt"])

    ref = run()
    print(f"chunk_bwd_dqkwg: default (BK={orig_block_k(s['k'].shape[-1], s['dt'])}, autotuned): {_time(run, dev):8.1f} us",
          flush=True)

    def apply(bk, bv, nw, ns):
        mod.block_k = lambda K, dtype, bk=bk: bk  # noqa: E731
        mod._configs = lambda: [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)]
        mod._KERNEL = None

    kmax = max(16, triton.next_power_of_2(s["k"].shape[-1]))
    try:
        _sweep(run, ref, dev, ("BK", "BV", "warps", "stages"), apply,
               [c for c in itertools.product((64, 128), (32, 64), (4, 8), (2, 3)) if c[0] <= kmax])
    finally:
        mod.block_k, mod._configs, mod._KERNEL = orig_block_k, orig_configs, None


def tune_wy(s, dev, which):
    mod = _m["wy_fast"]
    name = "bwd_config" if which == "bwd" else "fwd_config"
    orig = getattr(mod, name)
    if which == "bwd":
        dq_unused, dk_acc, dw, dG = _m["bwd_dqkwg"].forward(
            s["q"], s["k"], s["v_new"], s["do"], s["h"], s["dh"], s["G"], s["dv2"], s["w"], s["scale"], None, None,
            s["BT"], None, dw_dtype=s["dt"])

        def run():
            return mod.backward(s["k"], s["v"], s["G"], s["beta"], s["Ainv"], dw, s["dv2"], None, None, None,
                                dk_acc=dk_acc, dg_acc=dG)
    else:
        def run():
            return mod.forward(s["k"], s["v"], s["beta"], s["Ainv"], s["G"], None, None, None, None)
    d = orig(s["BT"], s["k"].shape[-1], s["v"].shape[-1], s["dt"])
    ref = run()
    print(f"wy {which}: default {d}: {_time(run, dev):8.1f} us", flush=True)
    try:
        _sweep(run, ref, dev, ("BK=BV", "warps", "stages"),
               lambda t, nw, ns: setattr(mod, name, lambda *_: (t, t, nw, ns)),
               list(itertools.product((64, 32), (8, 4), (3, 2, 1))))
    finally:
        setattr(mod, name, orig)


def tune_scan(s, dev, which):
    """GDN's state scans on the pipeline's own tensors (scalar gates)."""
    def run():
        if which == "fwd_h":
            return _m["fwd_h"].forward(s["k"], s["w"], s["u"], s["G"], None, None, False, s["BT"], True, None)
        return _m["bwd_dhu"].forward(s["q"], s["k"], s["w"], s["do"], s["dv_local"], s["G"], None, None, None,
                                     s["scale"], s["BT"], None)

    sweep_scan(which, run, s["k"].shape[-1], s["dt"], dev)


def sweep_scan(which, run, K, dt, dev, one_block=True):
    """``run`` (one launch of the scan ``which``: fwd_h or dhu) per state block ``BKmax`` x ``(BV, warps, stages)``;
    shared with tune_kda.py (per-channel gates). ``one_block``: as the launcher asks ``common.scan_block_k`` (False:
    the state is always in 64-row blocks, so only ``BKmax`` 64 is swept)."""
    import triton

    from mindspeed_ops.ops.gdn import common
    mod = _m["fwd_h" if which == "fwd_h" else "bwd_dhu"]
    orig_cap, orig_configs = common.SCAN_BK_MAX, mod._configs
    ref = run()
    bk = common.scan_block_k(K, dt, one_block)
    print(f"{which}: default (BK, NK = {bk}, autotuned): {_time(run, dev):8.1f} us", flush=True)

    def apply(bk, bv, nw, ns):
        common.SCAN_BK_MAX = bk
        mod._configs = lambda: [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)]
        mod._KERNELS.clear()

    tiles = [(16, 4, 2), (16, 4, 3), (16, 4, 4), (32, 4, 2), (32, 4, 3), (32, 4, 4), (16, 2, 3), (16, 8, 3), (64, 8, 3)]
    try:
        _sweep(run, ref, dev, ("BKmax", "BV", "warps", "stages"), apply,
               [(bk, *t) for bk in ((128, 64) if one_block else (64,)) for t in tiles])
    finally:
        common.SCAN_BK_MAX, mod._configs = orig_cap, orig_configs
        mod._KERNELS.clear()


def shape_args(ap: argparse.ArgumentParser, dims=("T", "H", "HV", "K", "V")) -> None:
    """The tuned point's dims (defaults: Qwen3-Next's B1 T8192 H16 HV32 K=V=128), shared by the tune scripts."""
    defaults = {"T": 8192, "H": 16, "HV": 32, "K": 128, "V": 128}
    for d in dims:
        ap.add_argument(f"--{d}", type=int, default=defaults[d])


def main() -> None:
    ap = argparse.ArgumentParser()
    shape_args(ap)
    ap.add_argument("--only", nargs="+", default=["dqkwg", "wy_bwd", "wy_fwd"],
                    choices=["dqkwg", "wy_bwd", "wy_fwd", "fwd_h", "dhu"])
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script itself (TRITON_INTERPRET=1, "
                    "small shapes), no timing")
    a = ap.parse_args()
    s = _state(a, a.device)
    print(f"B=1 T={a.T} H={a.H} HV={a.HV} K={a.K} V={a.V} BT=64 {s['dt']}; torch {torch.__version__}", flush=True)
    if "dqkwg" in a.only:
        tune_dqkwg(s, a.device)
    if "wy_bwd" in a.only:
        tune_wy(s, a.device, "bwd")
    if "wy_fwd" in a.only:
        tune_wy(s, a.device, "fwd")
    for which in ("fwd_h", "dhu"):
        if which in a.only:
            tune_scan(s, a.device, which)


if __name__ == "__main__":
    main()
