"""``mindspeed-ops atk``: arguments and console output of the ATK harness (:mod:`.runner` does the work).

No kernel module is imported here: on CPU the runner switches ``TRITON_INTERPRET=1`` on first.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Optional

from .schema import SUITES


def _split(values: Optional[list]) -> Optional[list]:
    if values is None:
        return None
    return [v for item in values for v in str(item).split(",") if v.strip()]


def build_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``atk`` arguments to ``p`` (a sub-parser of ``mindspeed-ops``)."""
    p.description = ("Accuracy, performance, memory and determinism of every operator from the case files "
                     "tests/atk_tests/<op>.yaml. On CPU: accuracy (+ determinism) at the cpu-marked shapes, Triton "
                     "under the interpreter and the reference backend.")
    p.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (space or comma separated; default: all files)")
    p.add_argument("--families", nargs="+", metavar="FAMILY",
                   help="only the ops of these families (the case files' `family`: norm, gdn, kda, loss, ...; "
                        "space or comma separated; added to --ops)")
    p.add_argument("--suite", nargs="+", default=["all"], metavar="SUITE",
                   help=f"{'|'.join(SUITES)}|all (several allowed; default all: on CPU accuracy+determinism)")
    p.add_argument("--out", metavar="DIR", help="write report.md, report.json and plots/ here")
    p.add_argument("--summary-md", metavar="PATH",
                   help="also write the summary table (op, ours ms, best other ms, ratio, %% of ceiling) to PATH")
    mode = p.add_mutually_exclusive_group()  # the three ways to run nothing: one at a time
    mode.add_argument("--from-json", nargs="+", metavar="REPORT_JSON",
                   help="run nothing: re-render report.md/plots (into --out) and --summary-md from one or more "
                        "report.json (several are merged, e.g. per-family GPU jobs); --ops and --suite keep those ops' "
                        "and suites' rows")
    p.add_argument("--dtypes", help="comma-separated subset of fp32,fp16,bf16 (default: each case's own per suite)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available, else cpu")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--small", dest="small", action="store_true", default=None,
                      help="only the cpu-marked (small) shape points (default on CPU)")
    size.add_argument("--full", dest="small", action="store_false",
                      help="every shape point (default on GPU); with --from-json: check the merged report against "
                           "the full CUDA plan (see --quick)")
    p.add_argument("--quick", action="store_true",
                   help="per case only the quick-marked points (else the last one); with --from-json: check the "
                        "merged report against the quick CUDA plan (its not_run lists the planned runs no GPU "
                        "report holds; the report is complete when none are left, else the exit code is 1)")
    p.add_argument("--cases", nargs="+", metavar="TEXT", help="only cases whose name contains one of these")
    p.add_argument("--backends", help="accuracy backends, comma-separated (default: the dispatched one; on CPU "
                                      "also 'reference')")
    p.add_argument("--check-cases", action="store_true",
                   help="accuracy also runs the ops' check cases (the registry of `mindspeed-ops check`)")
    p.add_argument("--baselines", help="comma-separated baseline names to run (default: every one a case lists; "
                                       "'none': ours only)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines (slow to compile)")
    p.add_argument("--direction", default="fwd,fwd+bwd", help="fwd, fwd+bwd, or fwd,fwd+bwd for both (default)")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    p.add_argument("--copy-gib", type=float, default=2.0, help="buffer size of the copy-bandwidth ceiling")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="start no new run after this many seconds (the report lists what was left), e.g. to fit "
                        "a time-limited GPU job")
    p.add_argument("--skip-done", nargs="+", metavar="REPORT_JSON",
                   help="skip the runs these earlier reports already hold (accuracy, determinism, ours measured): "
                        "time-limited GPU jobs continue where the last one stopped; merge the reports with --from-json")
    p.add_argument("--no-plots", action="store_true", help="do not draw the PNG plots")
    p.add_argument("--atk-dir", metavar="DIR", help="case-file directory (default: tests/atk_tests of this checkout)")
    mode.add_argument("--list", action="store_true", help="list the ops, cases and shape points, run nothing")
    mode.add_argument("--validate", action="store_true",
                      help="validate the case files (and their callables), run nothing")
    p.add_argument("--verbose", action="store_true", help="log every measured row and print tracebacks")
    return p


#: the flags read by each mode that runs nothing; any other flag given with it is a usage error (it used to be
#: silently ignored, e.g. --dtypes fp8 with --from-json)
_MODE_FLAGS = {"list": {"ops", "families", "atk_dir"}, "validate": {"ops", "families", "atk_dir", "device"},
               "from_json": {"ops", "families", "atk_dir", "suite", "out", "summary_md", "no_plots", "quick", "small"}}


def _unused_flags(args, parser: argparse.ArgumentParser, mode: str) -> list:
    """The flags given (not at their default) that ``mode`` does not read."""
    defaults = vars(parser.parse_args([]))  # as argparse fills them (--small/--full share one dest)
    flags: dict = {}
    for a in parser._actions:
        if a.option_strings and a.dest not in _MODE_FLAGS[mode] | {mode, "help"}:
            flags.setdefault(a.dest, []).append(a.option_strings[0])
    return ["/".join(f) for dest, f in flags.items() if getattr(args, dest) != defaults[dest]]


def _family_ops(args, parser: argparse.ArgumentParser) -> list:
    """``--ops`` plus the ops whose case file names one of ``--families``."""
    from .schema import load_specs

    wanted = _split(args.families)
    if not wanted:
        parser.error("--families: no family names given")
    try:
        specs = load_specs(args.atk_dir)
    except Exception as e:  # noqa: BLE001 - an unreadable case directory is a usage error here
        parser.error(f"--families: cannot read the case files: {e}")
    known = sorted({s.family for s in specs})
    unknown = [f for f in wanted if f not in known]
    if unknown:
        parser.error(f"--families: unknown {', '.join(unknown)}; families: {', '.join(known)}")
    ops = _split(args.ops) if args.ops else []
    return ops + [s.op for s in specs if s.family in wanted and s.op not in ops]


def _console():
    from .runner import _console as c

    return c()


def _list(args, con) -> int:
    from .schema import load_specs

    for spec in load_specs(args.atk_dir, _split(args.ops)):
        con.print(f"[bold]{spec.op}[/bold] ({spec.family}, SPEC {spec.spec}) {spec.path}")
        for c in spec.cases:
            pts = ", ".join(p.text() + (" [cpu]" if p.cpu else "") + (" [quick]" if p.quick else "") for p in c.shapes)
            con.print(f"  {c.name} ({c.values}; {', '.join(c.suites)}; baselines "
                      f"{', '.join(b['name'] for b in c.baselines) or '-'}): {pts}", markup=False)
    return 0


def _validate(args, con) -> int:
    import torch

    from ..check_runner import prepare_device
    from .runner import resolve_callable
    from .schema import load_specs

    if args.device == "cuda" and not torch.cuda.is_available():  # as for a run: not "valid" on a missing device
        raise ValueError("--device cuda: no CUDA device is available")
    prepare_device(torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu")))
    specs = load_specs(args.atk_dir, _split(args.ops))
    bad = 0
    for spec in specs:
        for c in spec.cases:
            for path in (c.call, c.reference):
                try:
                    resolve_callable(path)
                except Exception as e:  # noqa: BLE001
                    bad += 1
                    con.print(f"{spec.path}: case {c.name!r}: cannot resolve {path}: {type(e).__name__}: {e}",
                              markup=False)
    n = sum(len(s.cases) for s in specs)
    con.print(f"{len(specs)} case file(s), {n} cases: " + ("valid" if not bad else f"{bad} problem(s)"), markup=False)
    return 1 if bad else 0


#: where a report keeps each suite's rows: performance and memory share the measured rows (and the
#: baselines not run); ``not_run`` labels start with the runner's item kind
_SUITE_KEYS = {"accuracy": ("accuracy",), "determinism": ("determinism",), "performance": ("performance", "skipped"),
               "memory": ("performance", "skipped")}
_ITEM_SUITES = {"accuracy": ("accuracy",), "check": ("accuracy",), "determinism": ("determinism",),
                "measure": ("performance", "memory")}


def _coverage(args, report: dict, parts: list, suites: list, con) -> bool:
    """``--from-json`` with ``--quick`` or ``--full``: check the merged ``report`` of ``parts`` against that CUDA
    plan of the selected ops and suites (:func:`mindspeed_ops.atk.runner.missing_runs`); its ``not_run``
    becomes the plan's runs that no part holds, and it is complete exactly when there are none (returned)."""
    from .runner import SUITES, missing_runs
    from .schema import load_specs

    specs = load_specs(args.atk_dir, _split(args.ops) or None)
    kept = list(SUITES) if "all" in suites else [s for s in SUITES if s in suites]
    planned, missing = missing_runs(parts, specs, quick=bool(args.quick), suites=kept)
    report["not_run"] = missing
    report["complete"] = not missing
    plan = "--quick" if args.quick else "--full"
    line = (f"coverage of the {plan} CUDA plan ({', '.join(kept)}): {planned - len(missing)} of {planned} runs "
            f"held" + (f", {len(missing)} not run" if missing else ": complete"))
    # a re-checked report keeps only this check's line (an input's own line would contradict it)
    report["notes"] = [line] + [n for n in report.get("notes", []) if not n.startswith("coverage of the ")]
    con.print(line, markup=False)
    for label in missing[:10]:
        con.print(f"  not run: {label}", markup=False)
    if len(missing) > 10:
        con.print(f"  ... and {len(missing) - 10} more (report.json `not_run`)", markup=False)
    return not missing


def _from_json(args, con) -> int:
    from .report import label_op, load_report, merge_reports, summary_markdown, write_all
    from .runner import parse_suites

    suites = parse_suites(args.suite)  # before reading anything: an unknown suite is a usage error
    parts = [load_report(p) for p in args.from_json]
    report = merge_reports(parts)
    ops = _split(args.ops)
    if ops:  # re-render only these ops' rows (e.g. one family's table out of a merged run)
        for key in ("accuracy", "determinism", "performance", "skipped", "load_errors"):
            report[key] = [r for r in report.get(key, []) if r.get("op") in ops]
        if "not_run" in report:
            report["not_run"] = [lbl for lbl in report["not_run"] if label_op(lbl) in ops]
    if "all" not in suites:  # only these suites' rows and report sections
        keep = {k for s in suites for k in _SUITE_KEYS[s]}
        for key in {k for ks in _SUITE_KEYS.values() for k in ks} - keep:
            report[key] = []
        meta = report.setdefault("meta", {})
        meta["suites"] = [s for s in meta.get("suites", []) if s in suites]
        if "not_run" in report:
            report["not_run"] = [lbl for lbl in report["not_run"]
                                 if set(_ITEM_SUITES.get(lbl.split(" ", 1)[0], ())) & set(suites)]
    covered = _coverage(args, report, parts, suites, con) if args.quick or args.small is False else True
    # the summary table is of timings: empty unless the performance suite is kept (memory shares its rows)
    summary = summary_markdown(report if {"all", "performance"} & set(suites) else {**report, "performance": []})
    if args.out:
        paths = write_all(args.out, report, plots=not args.no_plots)
        con.print(f"wrote {paths['md']}, {paths['json']}" + (f", {len(paths['plots'])} plot(s)" if paths["plots"]
                                                             else ""), markup=False)
    if args.summary_md:
        os.makedirs(os.path.dirname(os.path.abspath(args.summary_md)), exist_ok=True)
        with open(args.summary_md, "w") as f:
            f.write(summary)
        con.print(f"wrote {args.summary_md}", markup=False)
    if not args.out and not args.summary_md:
        con.print(summary, markup=False)
    return 0 if covered else 1


def run_cli(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Entry point of ``mindspeed-ops atk``; returns the exit code (0 ok, 1 failures, 2 usage errors)."""
    from ..check_runner import output_path_problem
    from .schema import AtkSpecError

    if args.ops is not None and not _split(args.ops):
        parser.error("--ops: no op names given")
    if args.families is not None:
        args.ops = _family_ops(args, parser)
    for flag, value in (("--dtypes", args.dtypes), ("--backends", args.backends), ("--baselines", args.baselines)):
        if value is not None and not _split([value]):  # e.g. --dtypes ",": not the default selection
            parser.error(f"{flag}: no names given")
    for mode in _MODE_FLAGS:
        unused = _unused_flags(args, parser, mode) if getattr(args, mode) else []
        if unused:
            parser.error(f"--{mode.replace('_', '-')} does not use {', '.join(unused)}")
    if args.from_json and args.small:
        parser.error("--from-json checks coverage against the --quick or --full CUDA plan, not --small")
    if args.from_json and args.quick and args.small is False:
        parser.error("--from-json checks coverage against one plan: --quick or --full, not both")
    for flag, path, is_dir in (("--out", args.out, True), ("--summary-md", args.summary_md, False)):
        if path is not None and (problem := output_path_problem(path, is_dir)):  # fail now, not after the run
            parser.error(f"{flag} {path}: {problem}")
    con = _console()
    try:
        if args.list:
            return _list(args, con)
        if args.validate:
            return _validate(args, con)
        if args.from_json:
            return _from_json(args, con)
        # many real-size cases in one process fragment the caching allocator (on the H200, 85 GB reserved
        # but unallocated made chunk_loss's fp64 oracle run out of memory); set before CUDA initializes
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        from .runner import Options, failures, run

        baselines = _split([args.baselines]) if args.baselines else None
        if baselines == ["none"]:
            baselines = []
        if args.no_compile:
            from .baselines import REGISTRY

            baselines = [b for b in (baselines if baselines is not None else REGISTRY)
                         if b in REGISTRY and REGISTRY[b].kind != "compile"]
        if args.time_budget is not None and not args.time_budget >= 0:
            parser.error(f"--time-budget must be >= 0 seconds, got {args.time_budget:g}")
        for flag, value, ok in (("--warmup", args.warmup, args.warmup >= 0), ("--rep", args.rep, args.rep > 0),
                                ("--copy-gib", args.copy_gib, 0 < args.copy_gib < float("inf"))):
            if not ok:
                parser.error(f"{flag} must be {'>= 0' if flag == '--warmup' else 'finite and > 0' if flag == '--copy-gib' else '> 0'}"
                             f", got {value:g}")
        directions = tuple(d.strip() for d in args.direction.split(",") if d.strip())
        if any(d not in ("fwd", "fwd+bwd") for d in directions) or not directions:
            parser.error("--direction takes fwd, fwd+bwd or fwd,fwd+bwd")
        argv = sys.argv[1:]
        command = ("mindspeed-ops " + " ".join(shlex.quote(a) for a in argv)) if "atk" in argv else None
        opts = Options(command=command, ops=_split(args.ops), suites=args.suite, out=args.out, device=args.device,
                       dtypes=_split([args.dtypes]) if args.dtypes else None,
                       backends=_split([args.backends]) if args.backends else None, baselines=baselines,
                       small=args.small, quick=args.quick, cases=args.cases, directions=directions,
                       warmup=args.warmup, rep=args.rep, copy_gib=args.copy_gib, plots=not args.no_plots,
                       summary_md=args.summary_md, atk_dir=args.atk_dir, verbose=args.verbose,
                       time_budget=args.time_budget, check_cases=args.check_cases, skip_done=args.skip_done)
        report = run(opts, console=con)
    except AtkSpecError as e:
        con.print(str(e), markup=False)
        return 2
    except (ValueError, RuntimeError) as e:
        parser.error(str(e))
    except BrokenPipeError:  # stdout closed by its reader (`| head`): not a usage error, main() ends quietly
        raise
    except OSError as e:  # e.g. --from-json naming a directory, an unwritable --out
        parser.error(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e))
    _print_summary(report, con)
    if args.out:
        con.print(f"wrote {os.path.join(args.out, 'report.md')}, report.json"
                  + (f", {len(report.get('plots', []))} plot(s)" if report.get("plots") else ""), markup=False)
    if args.summary_md:
        con.print(f"wrote {args.summary_md}", markup=False)
    bad = failures(report)
    for line in bad:
        con.print(f"FAIL {line}", markup=False)
    n_runs = len(report["accuracy"]) + len(report["determinism"])
    not_run = len(report.get("not_run", []))
    if not bad and not n_runs and not report["performance"] and not not_run:
        con.print("nothing to run: no case / shape point / dtype matches the selection (see --list)", markup=False)
        return 2
    for suite in _empty_suites(report):  # one suite ran nothing while others did: say so, not silence
        con.print(f"note: the {suite} suite ran nothing: no case / shape point / dtype of it matches the selection "
                  f"(each case file lists its {suite} dtypes; see --list)", markup=False)
    con.print((f"{len(bad)} failure(s)" if bad else f"all {n_runs} checks passed"
               + (f", {len(report['performance'])} measured rows" if report["performance"] else ""))
              + (f"; {not_run} run(s) not done (time budget)" if not_run else ""), markup=False)
    return 1 if bad else 0


def _empty_suites(report: dict) -> list[str]:
    """Requested suites with no row (and nothing left undone by the time budget) in ``report``."""
    rows = {"accuracy": report.get("accuracy"), "determinism": report.get("determinism"),
            "performance": report.get("performance"), "memory": report.get("performance")}
    if report.get("not_run"):
        return []
    return [s for s in report.get("meta", {}).get("suites", []) if s in rows and not rows[s]]


def _print_summary(report: dict, con) -> None:
    from rich.markup import escape
    from rich.table import Table

    acc = report.get("accuracy", [])
    if len(acc) > 80:  # a GPU run: the full table is in report.md
        acc = [r for r in acc if not r["passed"]]
        con.print(f"accuracy: {len(report['accuracy']) - len(acc)} of {len(report['accuracy'])} passed "
                  "(all rows in report.md)", markup=False)
    if acc:
        t = Table(title="atk accuracy")
        for col in ("op", "case", "shape", "dtype", "backend", "fwd rel_rms", "grad rel_rms", "result"):
            t.add_column(col)
        for r in acc:
            f = r["fwd_rel_rms"]
            g = r["grad_rel_rms"]
            t.add_row(*map(escape, (r["op"], r["case"], r["shape"], r["dtype"], r["backend"],
                                    "-" if f is None else (f if isinstance(f, str) else f"{f:.2e}"),
                                    "-" if g is None else (g if isinstance(g, str) else f"{g:.2e}"),
                                    "PASS" if r["passed"] else f"FAIL {r['reason']}")))
        con.print(t)
    if report.get("performance"):
        from .report import summary_rows

        t = Table(title="atk performance (main direction)")
        for col in ("op", "case", "shape", "dtype", "dir", "ours ms", "best other", "other/ours", "% ceiling",
                    "GPU other/ours", "GPU % ceiling"):
            t.add_column(col)
        for s in summary_rows(report):
            t.add_row(*map(escape, (s["op"], s["case"], s["shape"], s["dtype"], s["direction"],
                                    "x" if s["ours_ms"] is None else f"{s['ours_ms']:.4f}",
                                    "-" if s["best_impl"] is None else f"{s['best_impl']} {s['best_ms']:.4f}",
                                    "-" if s["ratio"] is None else f"{s['ratio']:.2f}",
                                    "-" if s["frac_ceiling"] is None else f"{100 * s['frac_ceiling']:.1f}",
                                    "-" if s["graph_ratio"] is None else f"{s['graph_ratio']:.2f}",
                                    "-" if s["frac_ceiling_graph"] is None
                                    else f"{100 * s['frac_ceiling_graph']:.1f}")))
        con.print(t)


__all__ = ["build_parser", "run_cli"]
