"""Review regressions (seventh session) for ``merge_reports``: a later run of a point supersedes only the
figures it measured again."""
from mindspeed_ops.atk.report import FORMAT, merge_reports


def _report(suites, rows, command):
    return {"format": FORMAT, "complete": True, "meta": {"command": command, "suites": suites},
            "ceilings": {"copy_gbs": None, "gemm_tflops": None}, "baselines": {}, "notes": [], "skipped": [],
            "load_errors": [], "accuracy": [], "determinism": [], "performance": rows}


def _row(impl, median_ms=None, peak_extra_mib=None):
    return {"op": "rms_norm", "variant": "default", "shape": "T=4096", "dtype": "bf16", "direction": "fwd",
            "impl": impl, "kind": "ours" if impl == "ours" else "eager", "median_ms": median_ms,
            "peak_extra_mib": peak_extra_mib, "error": None}


def test_memory_only_rerun_keeps_the_timings():
    """Performance and memory rows share the ``performance`` key, one row per (point, impl) whichever of the
    two suites ran. A later ``--suite memory`` run of a point (rows with ``median_ms = None``) superseded an
    earlier ``--suite performance`` run's rows of that point: the merged report lost every timing of it."""
    timed = _report(["performance"], [_row("ours", median_ms=1.0), _row("eager", median_ms=2.0)], "perf")
    mem = _report(["memory"], [_row("ours", peak_extra_mib=10.0), _row("eager", peak_extra_mib=20.0)], "mem")
    merged = merge_reports([timed, mem])
    assert sorted(r["median_ms"] for r in merged["performance"] if r["median_ms"] is not None) == [1.0, 2.0]
    assert sorted(r["peak_extra_mib"] for r in merged["performance"] if r["peak_extra_mib"] is not None) == [10, 20]
    # a later run measuring (at least) the same suites still supersedes
    again = _report(["memory", "performance"], [_row("ours", median_ms=0.5, peak_extra_mib=5.0)], "again")
    merged = merge_reports([timed, mem, again])
    assert [(r["median_ms"], r["peak_extra_mib"]) for r in merged["performance"]] == [(0.5, 5.0)]
    assert merged["notes"][0] == "merged from 3 runs (4 rows superseded by a later run of the same point):"


def test_merged_not_run_drops_what_another_run_did():
    """Eleventh session: ``not_run`` was the concatenation of every run's list, so a point one run did not
    reach stayed listed after a later run (``--skip-done``) measured it, and labels repeated (846 listed, 190
    really not run in docs/benchmarks/atk)."""
    acc = {"op": "rms_norm", "case": "default", "shape": "T=4096", "dtype": "fp32", "backend": "triton"}
    left = ["measure rms_norm / default / T=4096 / bf16", "accuracy rms_norm / default / T=4096 / fp32",
            "accuracy rms_norm / default / T=4096 / fp32 [reference]", "determinism rms_norm / other / T=8 / bf16",
            "accuracy rms_norm / a check / check case / fp32"]
    first = dict(_report(["performance"], [], "first"), not_run=left)
    second = dict(_report(["accuracy", "performance"], [_row("ours", median_ms=1.0)], "second"), accuracy=[acc],
                  not_run=left[3:])
    merged = merge_reports([first, second])
    assert merged["not_run"] == left[2:]  # once each; the reference-backend check was not run by either
