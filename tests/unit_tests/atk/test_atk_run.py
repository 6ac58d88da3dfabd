"""``mindspeed-ops atk`` end to end on CPU: the accuracy suite over shipped case files (what CI runs), a
failing case, determinism, the performance/memory plumbing with a report, plots and the summary table."""
import json
import os

import pytest

from mindspeed_ops import cli
from tests.conftest import ON_GPU

pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU plumbing (the GPU runs ATK itself)")


def _atk(*args, capsys=None):
    code = cli.main(["atk", *args])
    out = capsys.readouterr().out if capsys is not None else ""
    return code, out


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter exp of masked huge logits
def test_cpu_accuracy_suite_on_shipped_cases(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out_dir = tmp_path / "report"
    code, out = _atk("--ops", "rms_norm", "clipped_swiglu", "fused_cross_entropy_loss", "solve_tril",
                     "--suite", "accuracy", "--dtypes", "fp32", "--out", str(out_dir), capsys=capsys)
    assert code == 0, out
    assert "atk accuracy" in out and "PASS" in out and "FAIL" not in out and "checks passed" in out
    rep = json.loads((out_dir / "report.json").read_text())
    assert rep["format"] == "mindspeed-ops-atk/1" and rep["complete"] is True
    assert rep["meta"]["suites"] == ["accuracy"] and rep["meta"]["device"] == "cpu"
    acc = rep["accuracy"]
    assert acc and all(r["passed"] for r in acc)
    assert {r["op"] for r in acc} == {"rms_norm", "clipped_swiglu", "fused_cross_entropy_loss", "solve_tril"}
    assert {r["dtype"] for r in acc} == {"fp32"}
    # CPU: Triton under the interpreter and the reference backend (registered ops only)
    assert {r["backend"] for r in acc if r["op"] == "rms_norm"} == {"triton", "reference"}
    assert {r["backend"] for r in acc if r["op"] == "solve_tril"} == {"triton"}
    assert {r["values"] for r in acc} == {"normal", "boundary", "special"}
    nan_case = [r for r in acc if r["case"] == "NaN propagation"]
    assert nan_case and all(r["nonfinite"] > 0 for r in nan_case)  # NaN where the SPEC mandates it, masks equal
    grads = {c["name"] for r in acc if r["op"] == "rms_norm" for c in r["comparisons"]}
    assert grads == {"out", "dx", "dweight"}
    assert not rep["performance"] and not rep["determinism"]
    md = (out_dir / "report.md").read_text()
    assert "# mindspeed-ops ATK report" in md and "## Accuracy" in md and f"{len(acc)} of {len(acc)} passed" in md
    assert "Triton kernels under the interpreter" in md


def test_failing_case_and_determinism(tmp_path, capsys):
    d = tmp_path / "cases"
    d.mkdir()
    # the rms_norm kernel checked against the l2norm reference: a clear FAIL row, exit code 1
    (d / "rms_norm.yaml").write_text(
        "op: rms_norm\nfamily: norm\nreference: mindspeed_ops.ops.norm.reference:l2norm\n"
        "inputs:\n  x: {shape: [N, D]}\ngrads: [x]\n"
        "cases:\n  - name: wrong reference\n    suites: [accuracy, determinism]\n"
        "    shapes: [{N: 4, D: 32, cpu: true}]\n")
    code, out = _atk("--atk-dir", str(d), "--suite", "accuracy", "determinism", "--dtypes", "fp32",
                     "--backends", "triton", "--out", str(tmp_path / "r"), capsys=capsys)
    assert code == 1
    assert "FAIL accuracy rms_norm / wrong reference" in out and "rel_rms" in out
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    (acc,) = rep["accuracy"]
    assert not acc["passed"] and acc["backend"] == "triton" and acc["fwd_rel_rms"] > 1e-3
    (det,) = rep["determinism"]
    assert det["passed"] and det["fwd_bitwise"] is True and det["bwd_bitwise"] is True
    assert "## Determinism" in (tmp_path / "r" / "report.md").read_text()


def test_check_cases_join_the_accuracy_suite(tmp_path, capsys):
    # --check-cases reuses the ops' CheckCases (mindspeed-ops check's registry) through check_runner
    code, out = _atk("--ops", "clipped_swiglu", "--suite", "accuracy", "--check-cases", "--dtypes", "fp32",
                     "--backends", "triton", "--cases", "NaN", "--out", str(tmp_path), capsys=capsys)
    assert code == 0, out
    acc = json.loads((tmp_path / "report.json").read_text())["accuracy"]
    checks = [r for r in acc if r["case"].startswith("check: ")]
    assert len(checks) == 3 and all(r["passed"] and r["backend"] == "triton" for r in checks)
    assert {r["case"] for r in acc} - {r["case"] for r in checks} == {"NaN propagation"}


def test_bad_case_file_exit_code(tmp_path, capsys):
    (tmp_path / "rms_norm.yaml").write_text("op: rms_norm\nfamily: norm\nreference: x:y\ncases: []\n")
    code, out = _atk("--atk-dir", str(tmp_path), "--suite", "accuracy", capsys=capsys)
    assert code == 2
    assert "problem(s) in ATK case file" in out and "cases: missing or empty" in out


@pytest.mark.parametrize("argv,msg", [
    (["--ops", "no_such_op"], "no ATK case file for no_such_op"),
    (["--suite", "speed"], "unknown suite(s) speed"),
    (["--dtypes", "fp8"], "unknown dtype(s) fp8"),
    (["--baselines", "eagre"], "unknown baseline(s) eagre"),
    (["--direction", "bwd"], "--direction takes"),
    (["--rep", "0"], "--rep must be > 0"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--copy-gib", "0"], "--copy-gib must be finite and > 0"),
    (["--copy-gib", "inf"], "--copy-gib must be finite and > 0"),
])
def test_bad_arguments(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["atk", *argv])
    assert e.value.code == 2 and msg in capsys.readouterr().err


PERF_CASE = """\
op: clipped_swiglu
family: activation
reference: mindspeed_ops.ops.activation.reference:clipped_swiglu
inputs:
  gate_up: {shape: [N, 2*I], scale: 4.0}
grads: [gate_up]
cost: {bytes_fwd: 3*N*I*e, bytes_bwd: 5*N*I*e}
memory: {bound_fwd_bwd: 10 * 2**30}
dtypes: [fp32]
baselines: [eager, fake_peer, liger_rms_norm]
cases:
  - name: split
    shapes: [{N: 4, I: 8, cpu: true}, {N: 8, I: 8, cpu: true}]
"""


def test_performance_memory_plumbing_report_plots_summary(tmp_path, capsys, monkeypatch):
    from mindspeed_ops.atk import baselines as bl
    from mindspeed_ops.atk.measure import Impl

    # a peer registered the documented way (here: the reference under another name)
    monkeypatch.setitem(bl.REGISTRY, "fake_peer", bl.Baseline(
        "fake_peer", "peer", "FakeLib", None, None,
        lambda ctx: Impl("fake", "peer", ctx.reference, note="the reference again", library="FakeLib")))
    monkeypatch.setattr(bl, "_status", lambda module, dist: (True, "test") if module is None else (False, "not here"))
    d = tmp_path / "cases"
    d.mkdir()
    (d / "clipped_swiglu.yaml").write_text(PERF_CASE)
    out_dir, summary = tmp_path / "r", tmp_path / "docs" / "summary.md"
    code, out = _atk("--atk-dir", str(d), "--suite", "performance", "memory", "--out", str(out_dir),
                     "--summary-md", str(summary), "--warmup", "1", "--rep", "1", capsys=capsys)
    assert code == 0, out
    rep = json.loads((out_dir / "report.json").read_text())
    rows = rep["performance"]
    assert {r["impl"] for r in rows} == {"ours", "eager", "fake"}
    assert {r["direction"] for r in rows} == {"fwd", "fwd+bwd"} and len(rows) == 2 * 2 * 3
    for r in rows:
        assert r["error"] is None and r["median_ms"] > 0 and r["gbs"] > 0
        assert r["bytes"] == (3 if r["direction"] == "fwd" else 8) * r["dims"]["N"] * 8 * 4
        assert r["family"] == "activation" and r["size"] == r["dims"]["N"] * 16
        assert r["vs_ours"] is not None and r["peak_extra_mib"] is None  # no CUDA allocator on CPU
        if r["direction"] == "fwd":
            assert r["relerr"] is not None and r["relerr"] < 1e-6  # sanity check against the eager output
        if r["kind"] == "ours":
            assert r["vs_ours"] == 1.0
            if r["direction"] == "fwd+bwd":
                assert r["mem_bound_mib"] == 10 * 1024 and r["mem_within_bound"] is None
    assert [s["baseline"] for s in rep["skipped"]] == ["liger_rms_norm"] * 2
    assert "not here" in rep["skipped"][0]["reason"]
    md = (out_dir / "report.md").read_text()
    for section in ("## Baselines", "## Summary", "## Performance", "## Memory", "## Baselines not run",
                    "## Plots", "![activation](plots/activation.png)", "CPU run: timings are host wall-clock"):
        assert section in md, section
    assert (out_dir / "plots" / "activation.png").stat().st_size > 1000
    text = summary.read_text()
    assert ("| op | case | shape | dtype | dir | ours ms | best other (ms) | other/ours | ours % of ceiling | "
            "ours GPU ms | best other GPU (ms) | GPU other/ours | GPU % of ceiling |") in text
    assert text.count("| clipped_swiglu | split |") == 2
    # re-render from the JSON without running anything
    code, out = _atk("--from-json", str(out_dir / "report.json"), "--summary-md", str(tmp_path / "s2.md"),
                     "--out", str(tmp_path / "r2"), "--no-plots", capsys=capsys)
    assert code == 0 and (tmp_path / "s2.md").read_text() == text
    assert os.path.exists(tmp_path / "r2" / "report.md")
    # several runs (e.g. per-family GPU jobs) merge into one report
    code, out = _atk("--from-json", str(out_dir / "report.json"), str(out_dir / "report.json"),
                     "--out", str(tmp_path / "r3"), "--no-plots", capsys=capsys)
    merged = json.loads((tmp_path / "r3" / "report.json").read_text())
    # the second run measured the same points again: its rows supersede the first run's
    assert code == 0 and len(merged["performance"]) == len(rows)
    assert f"merged from 2 runs ({len(rows)} rows superseded by a later run of the same point):" in merged["notes"]
    # --ops filters the rows of a re-rendered report (it used to be ignored with --from-json)
    code, out = _atk("--from-json", str(out_dir / "report.json"), "--ops", "rms_norm", "--out", str(tmp_path / "r4"),
                     "--no-plots", capsys=capsys)
    assert code == 0 and json.loads((tmp_path / "r4" / "report.json").read_text())["performance"] == []


def test_from_json_suite_keeps_those_suites_rows(tmp_path, capsys):
    """``--from-json --suite X`` re-renders only suite X (it used to be ignored): a report keeps each suite's
    rows under its own key, performance and memory sharing the measured rows."""
    d = tmp_path / "cases"
    d.mkdir()
    (d / "clipped_swiglu.yaml").write_text(PERF_CASE.replace("eager, fake_peer, liger_rms_norm", "eager"))
    src = tmp_path / "r" / "report.json"
    code, out = _atk("--atk-dir", str(d), "--suite", "accuracy", "determinism", "performance", "memory", "--warmup",
                     "0", "--rep", "1", "--no-plots", "--out", str(src.parent), capsys=capsys)
    assert code == 0, out
    full = json.loads(src.read_text())
    assert full["accuracy"] and full["determinism"] and full["performance"]

    def rerender(*suite):
        code, out = _atk("--from-json", str(src), "--suite", *suite, "--no-plots", "--out", str(tmp_path / "x"),
                         "--summary-md", str(tmp_path / "s.md"), capsys=capsys)
        assert code == 0, out
        rep = json.loads((tmp_path / "x" / "report.json").read_text())
        md = (tmp_path / "x" / "report.md").read_text()
        return rep, [line for line in md.splitlines() if line.startswith("## ")], (tmp_path / "s.md").read_text()

    rep, sections, summary = rerender("accuracy")
    assert rep["accuracy"] == full["accuracy"] and not rep["determinism"] and not rep["performance"]
    assert rep["meta"]["suites"] == ["accuracy"] and sections == ["## Accuracy"] and "| clipped_swiglu" not in summary
    rep, sections, _ = rerender("determinism")
    assert rep["determinism"] == full["determinism"] and not rep["accuracy"] and not rep["performance"]
    assert sections == ["## Determinism"]
    rep, sections, summary = rerender("performance")
    assert rep["performance"] == full["performance"] and not rep["accuracy"] and not rep["determinism"]
    assert "## Performance" in sections and "## Memory" not in sections and "| clipped_swiglu" in summary
    rep, sections, summary = rerender("memory")
    assert rep["performance"] == full["performance"] and not rep["accuracy"]
    assert "## Memory" in sections and "## Performance" not in sections and "| clipped_swiglu" not in summary
    rep, sections, _ = rerender("accuracy,determinism")
    assert rep["accuracy"] and rep["determinism"] and not rep["performance"]
    rep, sections, _ = rerender("all")
    assert all(rep[k] == full[k] for k in ("accuracy", "determinism", "performance"))
    assert {"## Accuracy", "## Determinism", "## Performance", "## Memory"} <= set(sections)
    assert "unknown suite(s) speed" in _atk_usage_error(capsys, "--from-json", str(src), "--suite", "speed")


def test_skip_done_continues_where_a_report_stopped(tmp_path, capsys):
    """``--skip-done`` runs only what earlier reports lack: a time-limited GPU job continues where the last
    one stopped instead of repeating the first ops (every run starts from the same end of the plan)."""
    code, out = _atk("--ops", "rms_norm", "--suite", "accuracy", "--dtypes", "fp32", "--out", str(tmp_path / "a"),
                     "--no-plots", capsys=capsys)
    first = json.loads((tmp_path / "a" / "report.json").read_text())
    assert code == 0 and first["accuracy"]
    # half of the runs "done": the second run does the other half only
    half = dict(first, accuracy=first["accuracy"][: len(first["accuracy"]) // 2])
    (tmp_path / "half.json").write_text(json.dumps(half))
    code, out = _atk("--ops", "rms_norm", "--suite", "accuracy", "--dtypes", "fp32", "--out", str(tmp_path / "b"),
                     "--no-plots", "--skip-done", str(tmp_path / "half.json"), capsys=capsys)
    second = json.loads((tmp_path / "b" / "report.json").read_text())
    key = lambda r: (r["case"], r["shape"], r["backend"])  # noqa: E731
    assert code == 0 and sorted(map(key, second["accuracy"])) == sorted(map(key, first["accuracy"][len(half["accuracy"]):]))
    assert any("--skip-done:" in n for n in second["notes"])
    assert "--skip-done: cannot read" in _atk_usage_error(capsys, "--ops", "rms_norm", "--skip-done",
                                                          str(tmp_path / "missing.json"))


def test_time_budget_stops_early(tmp_path, capsys):
    code, out = _atk("--ops", "rms_norm", "--suite", "accuracy", "--time-budget", "0", "--out", str(tmp_path),
                     capsys=capsys)
    assert code == 0 and "time budget of 0 s reached" in out
    rep = json.loads((tmp_path / "report.json").read_text())
    assert not rep["accuracy"] and rep["not_run"] and "time budget" in (tmp_path / "report.md").read_text()


def test_list_and_validate(capsys):
    code, out = _atk("--list", "--ops", "rms_norm,solve_tril", capsys=capsys)
    assert code == 0 and "rms_norm (norm, SPEC 1.2)" in out and "kkt A" in out and "[cpu]" in out
    code, out = _atk("--validate", capsys=capsys)
    assert code == 0 and "valid" in out


def _atk_usage_error(capsys, *args) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(["atk", *args])
    assert e.value.code == 2, args
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and "runs on" not in cap.out  # refused before running anything
    return cap.err


def test_unwritable_outputs_are_usage_errors_before_the_run(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    run = ["--ops", "rms_norm", "--suite", "accuracy"]
    assert "--out" in _atk_usage_error(capsys, *run, "--out", str(blocker))
    assert "is not a directory" in _atk_usage_error(capsys, *run, "--out", str(blocker / "sub"))
    assert "--summary-md" in _atk_usage_error(capsys, *run, "--summary-md", str(tmp_path))


def test_from_json_bad_inputs(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not json")
    err = _atk_usage_error(capsys, "--from-json", str(tmp_path / "notes.txt"))
    assert "notes.txt is not an ATK report.json" in err
    assert "Is a directory" in _atk_usage_error(capsys, "--from-json", str(tmp_path))
    assert "No such file" in _atk_usage_error(capsys, "--from-json", str(tmp_path / "missing.json"))
    # a good report re-rendered into a new nested directory / summary path
    code, _ = _atk("--ops", "rms_norm", "--suite", "accuracy", "--cases", "long row", "--dtypes", "fp32",
                   "--out", str(tmp_path / "r"), capsys=capsys)
    assert code == 0
    code, _ = _atk("--from-json", str(tmp_path / "r" / "report.json"), "--summary-md", str(tmp_path / "a" / "s.md"),
                   capsys=capsys)
    assert code == 0 and (tmp_path / "a" / "s.md").is_file()
    assert "--out" in _atk_usage_error(capsys, "--from-json", str(tmp_path / "r" / "report.json"), "--out",
                                       str(tmp_path / "notes.txt"))


def test_atk_dir_that_is_a_file_or_empty(tmp_path, capsys):
    (tmp_path / "f.yaml").write_text("op: x\n")
    assert "is not a directory" in _atk_usage_error(capsys, "--atk-dir", str(tmp_path / "f.yaml"), "--list")
    empty = tmp_path / "empty"
    empty.mkdir()
    for flag in ("--list", "--validate"):  # used to list nothing / say "valid" with exit code 0
        assert "has no *.yaml case files" in _atk_usage_error(capsys, "--atk-dir", str(empty), flag)
    assert "no op names given" in _atk_usage_error(capsys, "--ops", ",", "--list")


def test_flags_a_mode_does_not_use_are_usage_errors(tmp_path, capsys):
    """--list, --validate and --from-json run nothing: one at a time, and a run flag given with them is refused
    (it used to be ignored, e.g. --dtypes fp8 with --from-json or --validate after --list)."""
    assert "not allowed with argument --list" in _atk_usage_error(capsys, "--list", "--validate")
    assert "not allowed with argument --list" in _atk_usage_error(capsys, "--list", "--from-json", "r.json")
    assert "--list does not use --suite" in _atk_usage_error(capsys, "--list", "--suite", "accuracy")
    err = _atk_usage_error(capsys, "--from-json", "r.json", "--dtypes", "fp8", "--full", "--cases", "x")
    assert "--from-json does not use --dtypes, --cases" in err
    assert "not --small" in _atk_usage_error(capsys, "--from-json", "r.json", "--small")
    assert "--validate does not use --quick" in _atk_usage_error(capsys, "--validate", "--quick")
    for flag in ("--dtypes", "--backends", "--baselines"):  # an empty list is not the default selection
        assert f"{flag}: no names given" in _atk_usage_error(capsys, "--ops", "rms_norm", flag, ",")
    if not ON_GPU:  # "valid" on a device that is not there
        assert "no CUDA device" in _atk_usage_error(capsys, "--validate", "--device", "cuda")


def test_summary_gpu_time_columns():
    """The summary's GPU columns come from the CUDA-graph medians (a host-bound do_bench column can
    rank implementations differently than their kernels do)."""
    from mindspeed_ops.atk.report import summary_markdown, summary_rows

    def row(impl, kind, ms, graph):
        return dict(op="causal_conv1d", variant="v", shape="B=4", dtype="bf16", direction="fwd+bwd", impl=impl,
                    kind=kind, median_ms=ms, graph_ms=graph, frac_ceiling=0.34 if kind == "ours" else None,
                    ceiling="copy", error=None)

    rep = {"performance": [row("ours", "ours", 0.931, 0.464), row("fla", "peer", 1.603, 1.589),
                           row("compile", "compile", 3.76, None)]}
    (s,) = summary_rows(rep)
    assert s["best_impl"] == "fla" and abs(s["ratio"] - 1.603 / 0.931) < 1e-12
    assert s["best_graph_impl"] == "fla" and abs(s["graph_ratio"] - 1.589 / 0.464) < 1e-12
    assert abs(s["frac_ceiling_graph"] - 0.34 * 0.931 / 0.464) < 1e-12
    assert "| 0.4640 | fla (1.5890) | 3.42 | 68.2 |" in summary_markdown(rep)


def test_a_suite_that_runs_nothing_is_named(tmp_path, capsys):
    """--dtypes fp32 with the (bf16-only) performance suite: the accuracy checks run and the performance suite
    is reported as having run nothing (it used to vanish without a word)."""
    code, out = _atk("--ops", "rms_norm", "--suite", "accuracy,performance", "--dtypes", "fp32", "--cases",
                     "odd D", "--out", str(tmp_path / "r"), capsys=capsys)
    assert code == 0, out
    assert "note: the performance suite ran nothing" in out
    assert "note: the accuracy suite" not in out


def test_cce_adapter_matches_its_signature(monkeypatch):
    """cut-cross-entropy 25.1's ``linear_cross_entropy`` has no ``bias``: the adapter must not pass one
    (on the H200 every cce row failed with a TypeError) and must skip cases that have a bias."""
    import types

    import torch

    from mindspeed_ops.atk import baselines as bl

    calls = []

    def linear_cross_entropy(e, c, targets, ignore_index=-100, softcap=None, reduction="mean", shift=False):
        calls.append((e.shape, c.shape, ignore_index, softcap, reduction))
        return e.sum() * 0

    monkeypatch.setattr(bl, "_mod", lambda name: types.SimpleNamespace(linear_cross_entropy=linear_cross_entropy))
    h, w, y = torch.randn(4, 8), torch.randn(16, 8), torch.randint(0, 16, (4,))

    def ctx(**inputs):
        return bl.Context(None, {}, {}, torch.float32, "cpu", None, None, dict(hidden=h, weight=w, labels=y, **inputs))

    impl = bl._cce(ctx())
    impl.fn(hidden=h, weight=w, labels=y, bias=None, ignore_index=-1, reduction="sum")
    assert calls == [((4, 8), (16, 8), -1, None, "sum")]
    with pytest.raises(bl.Skip, match="bias"):
        bl._cce(ctx(bias=torch.zeros(16)))


def test_families_select_ops(capsys):
    """``--families`` picks the ops whose case file names that family, added to ``--ops``; an unknown or
    empty family is a usage error that lists the known ones."""
    code, out = _atk("--list", "--families", "kda", "--ops", "rms_norm", capsys=capsys)
    import re

    heads = re.findall(r"^(\w+) \(\w+, SPEC", out, re.M)
    assert code == 0 and heads == ["rms_norm", "chunk_kda", "chunk_kda_bwd_wy_dqkg_fused", "chunk_kda_fwd_intra"]
    code, out = _atk("--list", "--families", "loss,moe", capsys=capsys)
    assert code == 0 and "chunk_loss (loss" in out and "sort_chunks_by_idx (moe" in out and "rms_norm" not in out
    err = _atk_usage_error(capsys, "--list", "--families", "nope")
    assert "--families: unknown nope" in err and "gdn" in err
    err = _atk_usage_error(capsys, "--list", "--families", ",")
    assert "no family names" in err


def test_a_killed_run_leaves_a_report_of_what_it_did_not_reach(tmp_path, capsys, monkeypatch):
    """Eleventh session: the report a run writes as it goes had no ``not_run``, so a run killed by an outer
    timeout left a partial report from which a merge could not tell what it never reached."""
    import itertools
    import types

    from mindspeed_ops.atk import accuracy, runner

    clock = itertools.count(0, 31)  # every check is "31 s" after the last: each one saves the report
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    real, calls = accuracy.verify, []

    def verify(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the outer timeout's kill, as far as the report is concerned
        return real(*a, **k)

    monkeypatch.setattr(accuracy, "verify", verify)
    with pytest.raises(KeyboardInterrupt):
        _atk("--ops", "rms_norm", "--suite", "accuracy", "--dtypes", "fp32", "--out", str(tmp_path), "--no-plots",
             capsys=capsys)
    rep = json.loads((tmp_path / "report.json").read_text())
    assert not rep["complete"] and len(rep["accuracy"]) == 2
    done = {(r["case"], r["shape"]) for r in rep["accuracy"]}
    assert rep["not_run"] and all(lbl.split(" / ")[1:3] not in [list(d) for d in done] for lbl in rep["not_run"])
    assert rep["not_run"][0].startswith("accuracy rms_norm / ")


def test_from_json_coverage_of_the_quick_and_full_plans(tmp_path, capsys):
    """``--from-json --quick`` (``--full``) checks a merged report against that CUDA plan: ``not_run`` lists
    exactly the planned runs no report holds (a killed job's partial report does not list what it never
    reached), and the report is complete (no PARTIAL banner) only when none is left."""
    d = tmp_path / "cases"
    d.mkdir()
    (d / "rms_norm.yaml").write_text(
        "op: rms_norm\nfamily: norm\nreference: mindspeed_ops.ops.norm.reference:rms_norm\n"
        "inputs:\n  x: {shape: [N, D]}\n  weight: {shape: [D]}\ngrads: [x, weight]\n"
        "cases:\n  - name: plain\n    suites: [accuracy, determinism]\n    dtypes: [fp32, bf16]\n"
        "    shapes: [{N: 4, D: 32, cpu: true}, {N: 64, D: 128, quick: true}, {N: 128, D: 256}]\n")
    atk = ("--atk-dir", str(d))

    def acc(shape, dtype):
        return {"op": "rms_norm", "case": "plain", "values": "normal", "shape": shape, "dtype": dtype,
                "backend": "triton", "passed": True, "fwd_rel_rms": 0.0, "grad_rel_rms": 0.0, "nonfinite": 0,
                "reason": None, "comparisons": []}

    def det(shape, dtype):
        return {"op": "rms_norm", "case": "plain", "shape": shape, "dtype": dtype, "backend": "triton",
                "fwd_bitwise": True, "bwd_bitwise": True, "passed": True, "reason": None}

    # a partial report (killed: complete False, nothing listed in not_run) holding half of the quick plan
    part = {"format": "mindspeed-ops-atk/1", "complete": False, "meta": {"command": "a", "suites": ["accuracy"]},
            "accuracy": [acc("N=64 D=128", "fp32")], "determinism": [], "performance": [], "not_run": []}
    (tmp_path / "part.json").write_text(json.dumps(part))
    code, out = _atk("--from-json", str(tmp_path / "part.json"), "--quick", *atk, "--suite", "accuracy",
                     "--out", str(tmp_path / "m1"), "--no-plots", capsys=capsys)
    rep = json.loads((tmp_path / "m1" / "report.json").read_text())
    assert code == 1 and "1 of 2 runs held, 1 not run" in rep["notes"][0]  # exit code 1: runs missing
    assert "not run: accuracy rms_norm / plain / N=64 D=128 / bf16" in " ".join(out.split())  # wrapped or not
    assert rep["complete"] is False and rep["not_run"] == ["accuracy rms_norm / plain / N=64 D=128 / bf16"]
    # the rest of the quick plan in a second report: complete, the banner gone
    rest = dict(part, complete=True, accuracy=[acc("N=64 D=128", "bf16")],
                determinism=[det("N=64 D=128", "fp32"), det("N=64 D=128", "bf16")])
    (tmp_path / "rest.json").write_text(json.dumps(rest))
    both = (str(tmp_path / "part.json"), str(tmp_path / "rest.json"))
    code, out = _atk("--from-json", *both, "--quick", *atk, "--out", str(tmp_path / "m2"), "--no-plots",
                     capsys=capsys)
    rep = json.loads((tmp_path / "m2" / "report.json").read_text())
    assert code == 0 and "4 of 4 runs held: complete" in rep["notes"][0]
    assert rep["complete"] is True and not rep["not_run"]
    md = (tmp_path / "m2" / "report.md").read_text()
    assert "PARTIAL" not in md and "coverage of the --quick CUDA plan" in md
    code, out = _atk("--from-json", *both, "--quick", *atk, "--summary-md", str(tmp_path / "s.md"), capsys=capsys)
    assert code == 0 and "4 of 4 runs held: complete." in (tmp_path / "s.md").read_text()
    # the full plan has every shape point (the cpu-marked one included, as a GPU run with --full makes it)
    code, out = _atk("--from-json", *both, "--full", *atk, "--out", str(tmp_path / "m3"), "--no-plots",
                     capsys=capsys)
    rep = json.loads((tmp_path / "m3" / "report.json").read_text())
    assert code == 1 and rep["complete"] is False and "4 of 12 runs held" in rep["notes"][0]
    assert "accuracy rms_norm / plain / N=128 D=256 / fp32" in rep["not_run"]
    # without --quick/--full the merge keeps its parts' not_run lists (and their completeness)
    code, out = _atk("--from-json", *both, *atk, "--out", str(tmp_path / "m4"), "--no-plots", capsys=capsys)
    rep = json.loads((tmp_path / "m4" / "report.json").read_text())
    assert code == 0 and rep["complete"] is False and not any("CUDA plan" in n for n in rep["notes"])
    # re-checking a checked report keeps only the new coverage line (the input's would contradict it)
    code, out = _atk("--from-json", str(tmp_path / "m3" / "report.json"), "--quick", *atk, "--out",
                     str(tmp_path / "m5"), "--no-plots", capsys=capsys)
    rep = json.loads((tmp_path / "m5" / "report.json").read_text())
    assert code == 0 and [n for n in rep["notes"] if n.startswith("coverage")] == [
        "coverage of the --quick CUDA plan (accuracy, performance, memory, determinism): 4 of 4 runs held: complete"]
    # rows of a CPU run (interpreter, small shapes) are not CUDA runs
    cpu = dict(rest, meta={"command": "c", "suites": ["accuracy"], "device": "cpu"})
    (tmp_path / "cpu.json").write_text(json.dumps(cpu))
    code, out = _atk("--from-json", str(tmp_path / "part.json"), str(tmp_path / "cpu.json"), "--quick", *atk,
                     "--out", str(tmp_path / "m6"), "--no-plots", capsys=capsys)
    assert code == 1 and "1 of 4 runs held" in json.loads((tmp_path / "m6" / "report.json").read_text())["notes"][0]
    # a case whose callables do not load is missing, not silently out of the plan
    (d / "rms_norm.yaml").write_text((d / "rms_norm.yaml").read_text().replace("reference:rms_norm",
                                                                             "reference:no_such_function"))
    code, out = _atk("--from-json", *both, "--quick", *atk, "--out", str(tmp_path / "m7"), "--no-plots",
                     capsys=capsys)
    rep = json.loads((tmp_path / "m7" / "report.json").read_text())
    assert code == 1 and rep["complete"] is False and rep["not_run"][0].startswith("load error rms_norm / plain")
    assert "one plan" in _atk_usage_error(capsys, "--from-json", *both, "--quick", "--full")


def test_coverage_counts_memory_and_time_apart():
    """A measured point counts for the performance suite with an ``ours`` time and for memory with an ``ours``
    peak (``--skip-done`` takes either: a re-run measures both anyway)."""
    from mindspeed_ops.atk.runner import missing_runs
    from mindspeed_ops.atk.schema import load_specs

    specs = load_specs(None, ["rms_norm"])
    planned, missing = missing_runs([], specs, quick=True, suites=["memory"])
    assert planned and len(missing) == planned
    rows = [dict(op="rms_norm", variant=lbl.split(" / ")[1], shape=lbl.split(" / ")[2], dtype=lbl.split(" / ")[3],
                 kind="ours", median_ms=1.0, peak_extra_mib=None, error=None) for lbl in missing]
    timed = {"meta": {"device": "cuda"}, "performance": rows}
    assert missing_runs([timed], specs, quick=True, suites=["performance"])[1] == []
    assert len(missing_runs([timed], specs, quick=True, suites=["memory"])[1]) == planned
