"""ATK reports: ``report.json`` (everything measured), ``report.md`` (tables), ``plots/<family>.png``
(ms and GB/s or TFLOP/s vs size, one line per implementation) and the short summary table for
``docs/benchmarks/README.md`` (``--summary-md``).

The generic markdown helpers at the bottom (``markdown_table``, ``header_markdown``, ``write_report``,
``summary_table``) are also what the ``benchmarks/bench_*.py`` scripts use (through ``_bench.py``).
"""
from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

FORMAT = "mindspeed-ops-atk/1"


def _fmt(v, spec: str, none: str = "-") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none if v is None else "nan"
    if isinstance(v, str):
        return v
    return format(v, spec)


def _err(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return "0" if x == 0 else f"{x:.2e}"


def _md_escape(s) -> str:
    return str(s).replace("|", "/").replace("\n", " ")


def _table(head: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md_escape(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# summary (docs/benchmarks/README.md)


def main_direction(rows: list, key) -> str:
    dirs = {r["direction"] for r in rows if key(r)}
    return "fwd+bwd" if "fwd+bwd" in dirs else "fwd"


def summary_rows(report: dict) -> list[dict]:
    """One row per measured (op, case, shape, dtype) in its main direction (fwd+bwd, else fwd): ours ms,
    the fastest other implementation, ``other / ours`` and ours' fraction of the ceiling."""
    groups: dict = {}
    for r in report.get("performance", []):
        groups.setdefault((r["op"], r["variant"], r["shape"], r["dtype"]), []).append(r)
    out = []
    for (op, variant, shape, dtype), grp in groups.items():
        d = "fwd+bwd" if any(r["direction"] == "fwd+bwd" for r in grp) else "fwd"
        grp = [r for r in grp if r["direction"] == d]
        ours = next((r for r in grp if r["kind"] == "ours"), None)
        others = [r for r in grp if r["kind"] != "ours" and r.get("median_ms") is not None]
        best = min(others, key=lambda r: r["median_ms"]) if others else None
        ours_ms = ours.get("median_ms") if ours else None
        # GPU time alone (CUDA-graph replay): on a slow host the do_bench median of a small or fwd+bwd call is
        # host-bound for every implementation, and only graph times compare the kernels
        ours_g = ours.get("graph_ms") if ours else None
        g_others = [r for r in others if r.get("graph_ms") is not None]
        best_g = min(g_others, key=lambda r: r["graph_ms"]) if g_others else None
        frac = ours.get("frac_ceiling") if ours else None
        out.append(dict(op=op, case=variant, shape=shape, dtype=dtype, direction=d, ours_ms=ours_ms,
                        ours_error=ours.get("error") if ours else "not measured",
                        best_impl=best["impl"] if best else None, best_ms=best["median_ms"] if best else None,
                        ratio=(best["median_ms"] / ours_ms) if best and ours_ms else None,
                        frac_ceiling=frac, ceiling=ours.get("ceiling") if ours else None,
                        ours_graph_ms=ours_g, best_graph_impl=best_g["impl"] if best_g else None,
                        best_graph_ms=best_g["graph_ms"] if best_g else None,
                        graph_ratio=(best_g["graph_ms"] / ours_g) if best_g and ours_g else None,
                        frac_ceiling_graph=(frac * ours_ms / ours_g) if frac is not None and ours_ms and ours_g
                        else None))
    return out


def summary_markdown(report: dict) -> str:
    """The summary table: op, case, shape, dtype, dir, ours ms, best other (ms), other/ours, % of ceiling."""
    meta = report.get("meta", {})
    ceil = report.get("ceilings", {})
    lines = [f"ATK `{meta.get('command', '')}` on {meta.get('gpu', meta.get('device', '?'))}, {meta.get('date', '')}; "
             f"torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}. Ceilings measured in the same run: "
             f"copy {_fmt(ceil.get('copy_gbs'), '.0f', 'n/a')} GB/s, bf16 GEMM "
             f"{_fmt(ceil.get('gemm_tflops'), '.0f', 'n/a')} TFLOP/s. `best other` is the fastest of PyTorch eager, "
             "torch.compile and the installed peers; `other/ours` > 1 means ours is faster. `GPU` columns: CUDA-graph "
             "replay medians (kernel time without the host; `do_bench` times of small or fwd+bwd calls can be "
             "host-bound).", ""]
    # a merged report checked against a plan (``--from-json --quick``/``--full``) says how much of it it holds
    coverage = [n + "." for n in report.get("notes", []) if n.startswith("coverage of the ")]
    if coverage:
        lines += coverage + [""]
    if not report.get("complete", True):
        lines += ["**PARTIAL**: not every planned run is in this report (see its not_run list).", ""]
    rows = []
    for s in summary_rows(report):
        ours = _fmt(s["ours_ms"], ".4f") if s["ours_ms"] is not None else f"x ({s['ours_error']})"
        pct = None if s["frac_ceiling"] is None else 100 * s["frac_ceiling"]
        pct_g = None if s["frac_ceiling_graph"] is None else 100 * s["frac_ceiling_graph"]
        rows.append([s["op"], s["case"], s["shape"], s["dtype"], s["direction"], ours,
                     "-" if s["best_impl"] is None else f"{s['best_impl']} ({s['best_ms']:.4f})",
                     _fmt(s["ratio"], ".2f"), "-" if pct is None else f"{pct:.1f} ({s['ceiling']})",
                     _fmt(s["ours_graph_ms"], ".4f"),
                     "-" if s["best_graph_impl"] is None else f"{s['best_graph_impl']} ({s['best_graph_ms']:.4f})",
                     _fmt(s["graph_ratio"], ".2f"), "-" if pct_g is None else f"{pct_g:.1f}"])
    lines.append(_table(["op", "case", "shape", "dtype", "dir", "ours ms", "best other (ms)", "other/ours",
                         "ours % of ceiling", "ours GPU ms", "best other GPU (ms)", "GPU other/ours",
                         "GPU % of ceiling"], rows))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# report.md


def _acc_table(rows: list) -> str:
    body = [[r["op"], r["case"], r["values"], r["shape"], r["dtype"], r["backend"], _err(r["fwd_rel_rms"]),
             _err(r["grad_rel_rms"]), r["nonfinite"], "PASS" if r["passed"] else f"FAIL: {r['reason']}"]
            for r in rows]
    return _table(["op", "case", "values", "shape", "dtype", "backend", "fwd rel_rms", "grad rel_rms", "non-finite",
                   "result"], body)


def _det_table(rows: list) -> str:
    def b(x):
        return "-" if x is None else ("bitwise" if x else "DIFFERS")

    body = [[r["op"], r["case"], r["shape"], r["dtype"], r["backend"], b(r["fwd_bitwise"]), b(r["bwd_bitwise"]),
             "PASS" if r["passed"] else f"FAIL: {r['reason']}"] for r in rows]
    return _table(["op", "case", "shape", "dtype", "backend", "forward", "backward", "result"], body)


def _perf_table(rows: list) -> str:
    body = []
    for r in rows:
        pct = None if r.get("frac_ceiling") is None else 100 * r["frac_ceiling"]
        body.append([r["op"], r["variant"], r["shape"], r["dtype"], r["direction"], r["impl"],
                     _fmt(r["median_ms"], ".4f"),
                     "-" if r["p20_ms"] is None else f"{r['p20_ms']:.4f}-{r['p80_ms']:.4f}",
                     _fmt(r.get("gbs"), ".0f"), _fmt(r.get("tflops"), ".1f"),
                     "-" if pct is None else f"{pct:.1f} ({r.get('ceiling')})", _fmt(r.get("graph_ms"), ".4f"),
                     _fmt(r.get("vs_ours"), ".2f"), _fmt(r.get("relerr"), ".1e"),
                     (r["error"] and f"FAILED: {r['error']}") or r.get("note", "")])
    return _table(["op", "case", "shape", "dtype", "dir", "impl", "median ms", "p20-p80 ms", "GB/s", "TFLOP/s",
                   "% ceiling", "graph ms", "base/ours", "rel err vs eager", "note"], body)


def _mem_table(rows: list) -> str:
    body = []
    for r in rows:
        bound = r.get("mem_bound_mib")
        within = r.get("mem_within_bound")
        body.append([r["op"], r["variant"], r["shape"], r["dtype"], r["direction"], r["impl"],
                     _fmt(r.get("peak_extra_mib"), ".1f"), _fmt(r.get("mem_vs_ours"), ".2f"),
                     "-" if bound is None else f"{bound:.1f} ({'ok' if within else 'EXCEEDED'})",
                     (r["error"] and f"FAILED: {r['error']}") or ""])
    return _table(["op", "case", "shape", "dtype", "dir", "impl", "peak extra MiB", "base/ours", "SPEC bound MiB",
                   "note"], body)


def render_markdown(report: dict) -> str:
    meta = report.get("meta", {})
    ceil = report.get("ceilings", {})
    suites = meta.get("suites", [])
    lines = ["# mindspeed-ops ATK report", ""]
    if not report.get("complete", True):
        lines += ["**PARTIAL**: the run had not finished when this was written.", ""]
    lines += [f"Command: `{meta.get('command', '')}`", ""]
    for k in ("date", "host", "device", "gpu", "arch", "torch", "triton", "python", "TRITON_INTERPRET", "suites",
              "ops", "shapes", "dtypes", "backends"):
        if k in meta:
            v = meta[k]
            lines.append(f"- {k}: {', '.join(map(str, v)) if isinstance(v, (list, tuple)) else v}")
    lines.append(f"- ceilings (measured at the start of this run): device copy "
                 f"{_fmt(ceil.get('copy_gbs'), '.0f', 'n/a')} GB/s (read + write), bf16 GEMM "
                 f"{_fmt(ceil.get('gemm_tflops'), '.0f', 'n/a')} TFLOP/s")
    for n in report.get("notes", []):
        lines.append(f"- {n}")
    lines.append("")
    if report.get("load_errors"):
        lines += ["## Cases that could not be set up", ""]
        lines += [f"- {e['op']} / {e['case']}: {e['error']}" for e in report["load_errors"]]
        lines.append("")
    bl = report.get("baselines", {})
    if bl and ("performance" in suites or "memory" in suites):
        lines += ["## Baselines", "", _table(["baseline", "library", "installed", "version / reason", "note"],
                                             [[k, v["library"], "yes" if v["available"] else "no", v["detail"],
                                               v.get("note", "")] for k, v in bl.items()]), ""]
    perf = report.get("performance", [])
    if perf and "performance" in suites:
        lines += ["## Summary", "", summary_markdown(report)]
    acc = report.get("accuracy", [])
    if "accuracy" in suites:
        n_ok = sum(r["passed"] for r in acc)
        lines += ["## Accuracy", "",
                  f"{n_ok} of {len(acc)} passed. rel_rms of every output and gradient against autograd of the float64 "
                  "reference on the same rounded inputs (SPEC 0.9; the largest per row; 0 = within err_atol); "
                  "non-finite = NaN/Inf count in outputs and gradients (only allowed where the case expects them).", "",
                  _acc_table(acc), ""]
        bad = [r for r in acc if not r["passed"]]
        if bad:
            lines += ["Failures:", ""]
            for r in bad:
                lines.append(f"- {r['op']} / {r['case']} / {r['shape']} / {r['dtype']} / {r['backend']}: {r['reason']}")
            lines.append("")
    det = report.get("determinism", [])
    if "determinism" in suites:
        n_ok = sum(r["passed"] for r in det)
        lines += ["## Determinism", "", f"{n_ok} of {len(det)} bitwise repeatable (two forward+backward runs, same "
                  "inputs and upstream gradients).", "", _det_table(det), ""]
    if perf and "performance" in suites:
        lines += ["## Performance", "",
                  "median ms of `triton.testing.do_bench` (L2 flushed before each call), p20-p80 spread, achieved GB/s "
                  "from the minimum bytes of the case file's formula (TFLOP/s from its FLOPs), % of the ceiling above "
                  "(copy for memory-bound ops, bf16 GEMM for compute-bound ones), `graph ms` = CUDA-graph replay "
                  "median (no host overhead), base/ours > 1: ours faster, rel err vs eager = sanity only.", "",
                  _perf_table(perf), ""]
    if perf and "memory" in suites:
        lines += ["## Memory", "",
                  "Peak extra memory of one call: `max_memory_allocated` during the call minus allocated before it "
                  "(outputs and saved tensors included; the forward is a training forward, inputs requiring grad). "
                  "base/ours > 1: ours leaner.", "", _mem_table(perf), ""]
    skipped = report.get("skipped", [])
    if skipped:
        seen, items = set(), []
        for s in skipped:
            key = (s["op"], s["baseline"], s["reason"])
            if key not in seen:
                seen.add(key)
                items.append(f"- {s['op']}: {s['baseline']}: {s['reason']}")
        lines += ["## Baselines not run", "", *items, ""]
    plots = report.get("plots", [])
    if plots:
        lines += ["## Plots", ""] + [f"![{os.path.splitext(os.path.basename(p))[0]}]({p})" for p in plots] + [""]
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------------------------------
# plots


def plot_families(report: dict, out_dir: str) -> list[str]:
    """One PNG per op family under ``out_dir/plots``: per (op, case, dtype), median ms and GB/s (or
    TFLOP/s for compute-bound cases) against size, one line per implementation, in the main direction.
    Returns the paths relative to ``out_dir``."""
    perf = [r for r in report.get("performance", []) if r.get("median_ms") is not None]
    if not perf:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams: dict = {}
    for r in perf:
        fams.setdefault(r.get("family", r["op"]), []).append(r)
    os.makedirs(os.path.join(out_dir, "plots"), exist_ok=True)
    paths = []
    for fam, rows in sorted(fams.items()):
        groups: dict = {}
        for r in rows:
            groups.setdefault((r["op"], r["variant"], r["dtype"]), []).append(r)
        fig, axes = plt.subplots(len(groups), 2, figsize=(12, 3.2 * len(groups)), squeeze=False)
        for ax_row, ((op, variant, dtype), grp) in zip(axes, sorted(groups.items())):
            d = "fwd+bwd" if any(r["direction"] == "fwd+bwd" for r in grp) else "fwd"
            grp = [r for r in grp if r["direction"] == d]
            compute = any(r.get("ceiling") == "gemm" for r in grp)
            for impl in dict.fromkeys(r["impl"] for r in grp):
                pts = sorted((r.get("size") or r["numel"], r) for r in grp if r["impl"] == impl)
                xs = [p[0] for p in pts]
                style = dict(marker="o", linewidth=2.2 if impl == "ours" else 1.2)
                ax_row[0].plot(xs, [p[1]["median_ms"] for p in pts], label=impl, **style)
                ys = [p[1].get("tflops") if compute else p[1].get("gbs") for p in pts]
                if any(y is not None for y in ys):
                    ax_row[1].plot(xs, [math.nan if y is None else y for y in ys], label=impl, **style)
            ceil = report.get("ceilings", {}).get("gemm_tflops" if compute else "copy_gbs")
            if ceil:
                ax_row[1].axhline(ceil, color="gray", linestyle="--", linewidth=1, label="ceiling")
            for ax, ylabel in zip(ax_row, ("median ms", "TFLOP/s" if compute else "GB/s")):
                ax.set_xscale("log")
                ax.set_xlabel("size (cost.size; default: elements of the first input)")
                ax.set_ylabel(ylabel)
                ax.set_title(f"{op} / {variant} / {dtype} / {d}", fontsize=9)
                ax.grid(True, alpha=0.3)
            ax_row[0].set_yscale("log")
            ax_row[1].legend(fontsize=7)
        fig.tight_layout()
        rel = os.path.join("plots", f"{fam}.png")
        fig.savefig(os.path.join(out_dir, rel), dpi=100)
        plt.close(fig)
        paths.append(rel)
    return paths


def write_all(out_dir: str, report: dict, *, plots: bool = True) -> dict:
    """Write ``report.json`` and ``report.md`` (and the plots when ``plots``) into ``out_dir``; returns
    ``{'json': path, 'md': path, 'plots': [paths]}``."""
    os.makedirs(out_dir, exist_ok=True)
    if plots:
        try:
            report["plots"] = plot_families(report, out_dir)
        except Exception as e:  # noqa: BLE001 - a plotting problem must not lose the measurements
            report.setdefault("notes", []).append(f"plots not written: {type(e).__name__}: {e}")
    js = os.path.join(out_dir, "report.json")
    md = os.path.join(out_dir, "report.md")
    with open(js, "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(md, "w") as f:
        f.write(render_markdown(report))
    return {"json": js, "md": md, "plots": [os.path.join(out_dir, p) for p in report.get("plots", [])]}


def load_report(path: str) -> dict:
    """A ``report.json`` written by :func:`write_all` (``ValueError`` for another file)."""
    with open(path) as f:
        try:
            data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not an ATK report.json (not JSON: {e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not an ATK report.json (format {FORMAT!r})")
    return data


def _point(row: dict, key: str) -> tuple:
    """The measured point a row belongs to: (op, case, shape, dtype, direction) for timings (every
    implementation of a point comes from one run, so its ratios stay within one run), plus the values
    and backend for accuracy/determinism checks."""
    case = row.get("case", row.get("variant"))
    if key == "performance":
        return row.get("op"), case, row.get("shape"), row.get("dtype"), row.get("direction")
    return row.get("op"), case, row.get("values"), row.get("shape"), row.get("dtype"), row.get("backend")


_MEASURE_SUITES = frozenset(("performance", "memory"))


def done_key(suite: str, op: str, case: str, shape: str, dtype: str, backend: Optional[str] = None) -> tuple:
    """What identifies one run of the harness: an accuracy/determinism check (with the backend asked for) or a
    measured point (``suite`` "measure")."""
    return suite, op, case, shape, dtype, backend


def _requested_backend(row: dict) -> Optional[str]:
    """The ``--backends`` entry a check row answered (None: the default dispatch); reports written before
    rows carried it: the reference backend was only ever run when requested."""
    if "requested_backend" in row:
        return row["requested_backend"]
    return "reference" if row.get("backend") == "reference" else None


def done_runs(reports: Sequence[dict], need: Optional[Sequence[str]] = None) -> set:
    """Keys of the runs earlier reports hold: accuracy and determinism rows, and measured points whose
    ``ours`` row has a result (a failed measurement is run again). A measured point counts as done whichever
    of the performance/memory suites and directions its run measured (e.g. a memory-only run); with ``need``
    (row fields, e.g. ``("median_ms", "peak_extra_mib")``) only if its ``ours`` row has every one of them."""
    def measured(x):
        fields = [x.get(k) is not None for k in (need if need is not None else ("median_ms", "peak_extra_mib"))]
        return all(fields) if need is not None else any(fields)

    done = set()
    for r in reports:
        for suite in ("accuracy", "determinism"):
            done.update(done_key(suite, x.get("op"), x.get("case"), x.get("shape"), x.get("dtype"),
                                  _requested_backend(x)) for x in r.get(suite, []))
        done.update(done_key("measure", x.get("op"), x.get("variant"), x.get("shape"), x.get("dtype"))
                    for x in r.get("performance", [])
                    if x.get("kind") == "ours" and not x.get("error") and measured(x))
    return done


def label_op(label: str) -> str:
    """The op of a ``not_run`` label."""
    return label.partition(" ")[2].split(" / ")[0]


def label_key(label: str) -> Optional[tuple]:
    """:func:`done_key` of a ``not_run`` label (``"{suite} {op} / {case} / {shape} / {dtype}[ [backend]]"``,
    as the runner writes them); None for a check case's label (always run again) or one it cannot read."""
    suite, _, rest = label.partition(" ")
    parts = rest.split(" / ")
    if len(parts) != 4 or parts[2] == "check case":
        return None
    op, case, shape, dtype = parts
    backend = None
    if dtype.endswith("]") and " [" in dtype:
        dtype, backend = dtype[:-1].split(" [", 1)
    return done_key(suite, op, case, shape, dtype, None if suite == "measure" else backend)


def merge_reports(reports: Sequence[dict]) -> dict:
    """One report from several runs (e.g. per-family GPU jobs): rows concatenated, except that a point
    measured again by a later run keeps only the later run's rows (a re-run after a kernel change
    supersedes the old figures; timings/memory only by a run of at least the earlier run's suites); header,
    ceilings and baselines from the first run; every run's command, date and ceilings listed in ``notes``."""
    if len(reports) == 1:
        return reports[0]
    out = json.loads(json.dumps(reports[0]))
    out["meta"]["command"] = " ; ".join(r["meta"].get("command", "?") for r in reports)
    out["meta"]["suites"] = sorted({s for r in reports for s in r["meta"].get("suites", [])})
    out["complete"] = all(r.get("complete", True) for r in reports)
    superseded = 0
    # performance and memory share the measured rows: a later run supersedes a point only if it measured
    # (at least) what the earlier run did (a --suite memory re-run must not drop the earlier timings)
    measured = [frozenset(r["meta"].get("suites") or _MEASURE_SUITES) & _MEASURE_SUITES for r in reports]
    for key in ("accuracy", "determinism", "performance"):
        points = [{_point(x, key) for x in r.get(key, [])} for r in reports]
        rows = [(i, x) for i, r in enumerate(reports) for x in r.get(key, [])]
        out[key] = [x for i, x in rows if not any(
            _point(x, key) in points[j] and (key != "performance" or measured[j] >= measured[i])
            for j in range(i + 1, len(reports)))]
        superseded += len(rows) - len(out[key])
    for key in ("skipped", "load_errors"):
        out[key] = [x for r in reports for x in r.get(key, [])]
    # a run one report did not reach may have been done by another: listed once, and only if no report holds it
    done = done_runs(reports)
    out["not_run"] = [x for x in dict.fromkeys(x for r in reports for x in r.get("not_run", []))
                      if label_key(x) not in done]
    out["notes"] = [f"merged from {len(reports)} runs" + (
        f" ({superseded} rows superseded by a later run of the same point)" if superseded else "") + ":"] + [
        f"run {i + 1}: `{r['meta'].get('command', '?')}` at {r['meta'].get('date', '?')}, copy "
        f"{_fmt(r.get('ceilings', {}).get('copy_gbs'), '.0f', 'n/a')} GB/s, GEMM "
        f"{_fmt(r.get('ceilings', {}).get('gemm_tflops'), '.0f', 'n/a')} TFLOP/s" for i, r in enumerate(reports)
    ] + [n for r in reports for n in r.get("notes", [])]
    out.pop("plots", None)
    return out


# --------------------------------------------------------------------------------------------------
# generic markdown helpers shared with benchmarks/_bench.py


COLUMNS = [
    ("op", lambda r: r["op"]),
    ("case", lambda r: r["variant"]),
    ("shape", lambda r: r["shape"]),
    ("dir", lambda r: r["direction"]),
    ("impl", lambda r: r["impl"]),
    ("median ms", lambda r: _fmt(r["median_ms"], ".4f")),
    ("p20-p80 ms", lambda r: "-" if r["p20_ms"] is None else f"{r['p20_ms']:.4f}-{r['p80_ms']:.4f}"),
    ("MB moved", lambda r: _fmt(r["bytes"] / 1e6, ".1f")),
    ("GB/s", lambda r: _fmt(r["gbs"], ".0f")),
    ("% copy", lambda r: _fmt(None if r["frac_copy"] is None else 100 * r["frac_copy"], ".1f")),
    ("graph ms", lambda r: _fmt(r.get("graph_ms"), ".4f")),
    ("peak extra MiB", lambda r: _fmt(r["peak_extra_mib"], ".1f")),
    ("base/ours", lambda r: _fmt(r.get("vs_ours"), ".2f")),
    ("rel err vs eager", lambda r: _fmt(r["relerr"], ".1e")),
    ("note", lambda r: (r["error"] and f"FAILED: {r['error']}") or r["note"]),
]


def markdown_table(rows: list, columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(c for c, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(str(f(r)) for _, f in columns) + " |")
    return "\n".join(lines)


def header_markdown(title: str, info: dict, copy_gbs: Optional[float], notes: Sequence[str] = ()) -> str:
    lines = [f"# {title}", "", f"Command: `{info['command']}`", ""]
    for k, v in info.items():
        if k != "command":
            lines.append(f"- {k}: {v}")
    lines.append(f"- device copy bandwidth (read + write, measured at the start of this run): "
                 f"{_fmt(copy_gbs, '.0f', 'n/a')} GB/s")
    lines.append("")
    lines += list(notes)
    return "\n".join(lines)


def write_report(out_dir: str, stem: str, markdown: str, payload: dict) -> tuple:
    os.makedirs(out_dir, exist_ok=True)
    md_path = os.path.join(out_dir, stem + ".md")
    js_path = os.path.join(out_dir, stem + ".json")
    with open(md_path, "w") as f:
        f.write(markdown.rstrip() + "\n")
    with open(js_path, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    return md_path, js_path


def summary_table(rows: list) -> str:
    """Benchmark-script summary: one line per (op, case, shape, direction): ours ms and % of copy, then
    ``base ms / ours ms`` for every other implementation (``x`` = that row failed)."""
    keys, impls = [], []
    for r in rows:
        k = (r["op"], r["variant"], r["shape"], r["direction"])
        if k not in keys:
            keys.append(k)
        if r["kind"] != "ours" and r["impl"] not in impls:
            impls.append(r["impl"])
    head = ["op", "case", "shape", "dir", "ours ms", "ours % copy", "ours graph ms", "graph % copy"] + \
        [f"{i} / ours" for i in impls]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in keys:
        group = {r["impl"]: r for r in rows if (r["op"], r["variant"], r["shape"], r["direction"]) == k}
        ours = next((r for r in group.values() if r["kind"] == "ours"), None)
        cells = list(k)
        if ours is None:
            cells += ["n/a", "-", "-", "-"]
        elif ours["median_ms"] is None:
            cells += ["x", "-", "-", "-"]
        else:
            g = ours.get("graph_ms")
            gfrac = None if not (g and ours["frac_copy"]) else 100 * ours["frac_copy"] * ours["median_ms"] / g
            cells += [f"{ours['median_ms']:.4f}",
                      _fmt(None if ours["frac_copy"] is None else 100 * ours["frac_copy"], ".1f"),
                      _fmt(g, ".4f"), _fmt(gfrac, ".1f")]
        for i in impls:
            r = group.get(i)
            cells.append("" if r is None else ("x" if r["error"] else _fmt(r.get("vs_ours"), ".2f")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["FORMAT", "done_key", "done_runs", "label_key", "label_op", "summary_rows", "summary_markdown", "render_markdown",
           "plot_families", "write_all", "load_report", "merge_reports", "COLUMNS", "markdown_table", "header_markdown",
           "write_report", "summary_table"]
