"""ATK: the accuracy / performance / memory / determinism harness (``mindspeed-ops atk``, DESIGN 6).

Case files ``tests/atk_tests/<op>.yaml`` (:mod:`.schema`) describe, per operator, the shape sweeps
(small CPU points up to the real training shapes of the SPEC), dtypes, value ranges (normal, boundary,
special), SPEC 0.9 tolerances and the baselines to compare against. :func:`run` plans and runs the
suites and writes ``report.md``, ``report.json`` and one plot per op family.

Modules: :mod:`.schema` (case files), :mod:`.expr` (their safe expressions), :mod:`.inputs` (tensors from
tensor specs), :mod:`.accuracy` (SPEC 0.9 accuracy, bitwise determinism), :mod:`.measure` (do_bench
timing, peak memory, ceilings; shared with ``benchmarks/``), :mod:`.baselines` (eager, torch.compile and
peer adapters), :mod:`.runner`, :mod:`.report`, :mod:`.cli`.

Adding an operator = adding ``tests/atk_tests/<op>.yaml`` (plus, when a peer library has the op, an
adapter in :mod:`.baselines`; when an input needs structure the distributions cannot express, a builder
in :mod:`.inputs`).

Nothing here imports a kernel module at import time (the CPU run must set ``TRITON_INTERPRET=1`` first).
"""
from .schema import AtkSpecError, load_spec, load_specs, parse_spec


def run(opts):
    """Run ATK with :class:`mindspeed_ops.atk.runner.Options`; returns the report dict."""
    from .runner import run as _run

    return _run(opts)


__all__ = ["AtkSpecError", "load_spec", "load_specs", "parse_spec", "run"]
