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


def main() -> None:
    # (kda, varlen, dtype, K = V): the cases of the twelfth session's failures, then one that passed
    for kda, varlen, dtype, K in ((False, False, torch.float32, 64), (False, True, torch.bfloat16, 64),
                                  (True, True, torch.float32, 64), (False, False, torch.bfloat16, 128)):
        print(f"== kda={kda} varlen={varlen} {dtype} K=V={K}", flush=True)
        ins = tb._inputs(kda, dtype, K=K, V=K)
        cu = torch.tensor([0, 130, 131, 700, 1000], dtype=torch.int32, device="cuda") if varlen else None
        tb._step(kda, ins, cu)
        tuners = tb._autotuners()
        cache_results = {n: t.cache_results for n, t in tuners.items()}
        kept = {}
        for n, t in tuners.items():
            t.__dict__.pop("prune_configs", None)
            def record(kwargs, _n=n, _orig=type(t).prune_configs.__get__(t)):
                ks = _orig(kwargs)
                kept.setdefault(_n, [])
                for c in ks:
                    if str(c) not in map(str, kept[_n]):
                        kept[_n].append(c)
                return ks[:1]
            t.prune_configs = record
            t.cache_results = False
            t.cache.clear()
        tb._step(kda, ins, cu)
        for n, cs in kept.items():
            print("  ", n, [str(c) for c in cs])

        def force(choice):  # choice: {name: config} else the first kept
            for n, t in tuners.items():
                if n not in kept:
                    continue
                def f(kwargs, _n=n, _orig=type(t).prune_configs.__get__(t)):
                    ks = _orig(kwargs)
                    want = choice.get(_n)
                    for c in ks:
                        if want is not None and str(c) == str(want):
                            return [c]
                    return ks[:1]
                t.prune_configs = f
                t.cache.clear()
            return tb._step(kda, ins, cu)
        ref = force({})
        for n, cs in kept.items():
            for c in cs[1:]:
                out = force({n: c})
                bad = [nm for nm, a, b in zip(NAMES, ref, out) if not torch.equal(a, b)]
                print(f"   {n.split('.')[-2]} {c}: {bad or 'same'}", flush=True)
        for n, t in tuners.items():  # the class's pruning and the on-disk cache again
            t.__dict__.pop("prune_configs", None)
            t.cache_results = cache_results[n]
            t.cache.clear()


if __name__ == "__main__":
    main()
