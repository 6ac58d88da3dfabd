"""Which autotuner and which of its configurations changes which output bits of the GDN / KDA training step.

tests/unit_tests/core/test_autotune_bits.py says *that* some configuration an autotuner may pick changes the
bits (SPEC 0.6); this says *which*: every autotuner runs its first kept configuration, then each one in turn
runs each of its other kept configurations alone, and the outputs and gradients that differ bitwise are
printed. GPU only (the interpreter keeps one configuration)::

    python3 benchmarks/autotune_bits_diag.py     # from the repository root
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.unit_tests.core import test_autotune_bits as tb  # noqa: E402  (its inputs, step and autotuner list)

NAMES = ["o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"]


def _case(kda: bool, varlen: bool, dtype: torch.dtype, K: int) -> None:
    print(f"== kda={kda} varlen={varlen} {dtype} K=V={K}", flush=True)
    ins = tb._inputs(kda, dtype, K=K, V=K)
    cu = torch.tensor([0, 130, 131, 700, 1000], dtype=torch.int32, device="cuda") if varlen else None
    tb._step(kda, ins, cu)  # builds the lazily made autotuners
    tuners = tb._autotuners()
    saved = {n: (t.cache_results, dict(t.cache)) for n, t in tuners.items()}
    kept: dict = {}  # per autotuner, every configuration any of its calls kept (first seen first)
    used = set()

    def prune(t, n, choice):
        def f(kwargs):
            ks = type(t).prune_configs(t, kwargs)
            if choice is None:  # recording
                kept.setdefault(n, []).extend(c for c in ks if str(c) not in map(str, kept.get(n, [])))
            for c in ks:
                if choice is not None and str(c) == str(choice):
                    used.add(n)
                    return [c]
            return ks[:1]
        return f

    try:
        for n, t in tuners.items():
            t.prune_configs, t.cache_results = prune(t, n, None), False
            t.cache.clear()
        tb._step(kda, ins, cu)
        for n, cs in kept.items():
            print("  ", n, [str(c) for c in cs])

        def run(name=None, choice=None):  # every autotuner at its first kept configuration, `name` at `choice`
            for n, t in tuners.items():
                t.prune_configs = prune(t, n, choice if n == name else None)
                t.cache.clear()
            used.clear()
            return tb._step(kda, ins, cu)

        ref = run()
        for n, cs in kept.items():
            for c in cs[1:]:
                out = run(n, c)
                bad = [nm for nm, a, b in zip(NAMES, ref, out) if not torch.equal(a, b)]
                verdict = (bad or "same") if n in used else "not run (no call kept it this time)"
                print(f"   {n.split('.')[-2]} {c}: {verdict}", flush=True)
    finally:
        for n, t in tuners.items():  # the class's pruning, the on-disk cache and the earlier choices again
            t.__dict__.pop("prune_configs", None)
            t.cache_results = saved[n][0]
            t.cache.clear()
            t.cache.update(saved[n][1])


def main() -> None:
    # (kda, varlen, dtype, K = V): the cases that failed on the H200 before the prune fixes, then one that passed
    for case in ((False, False, torch.float32, 64), (False, True, torch.bfloat16, 64),
                 (True, True, torch.float32, 64), (False, False, torch.bfloat16, 128)):
        _case(*case)


if __name__ == "__main__":
    main()
