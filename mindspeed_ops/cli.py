"""``mindspeed-ops`` command line: ``info`` (device, versions, backends, per-op dispatch), ``check``
(every operator against its float64 reference on this machine) and ``atk`` (the accuracy / performance /
memory / determinism harness, :mod:`mindspeed_ops.atk`). The checking itself lives in
:mod:`mindspeed_ops.check_runner`; this module parses arguments and prints.

No mindspeed_ops kernel module may be imported at the top of this file: ``check`` on a CPU must set
``TRITON_INTERPRET=1`` first.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Callable, Optional, Sequence

import torch

from . import __version__, backends
from . import check_runner as cr


def _console(piped_width: int = 160):
    """The rich console of every sub-command (``piped_width`` columns when stdout is not a terminal)."""
    from rich.console import Console

    class _PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich would exit 1 itself; let main() end every sub-command the same way (quietly, status 0)
            raise BrokenPipeError

    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return _PipeConsole(width=piped_width if wide else None, highlight=False)


def _driver_version() -> Optional[str]:
    try:
        import pynvml  # type: ignore

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except Exception:
            pass
    return None


def versions() -> dict[str, str]:
    """Versions of the software stack (``'-'`` where absent)."""
    from importlib.metadata import PackageNotFoundError, version

    def pkg(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    v = {"python": platform.python_version(), "torch": torch.__version__, "triton": pkg("triton"),
         "numpy": pkg("numpy"), "mindspeed_ops": __version__}
    if torch.version.cuda:
        v["CUDA (torch build)"] = torch.version.cuda
    if torch.cuda.is_available():
        v["CUDA driver"] = _driver_version() or "?"
    v["TRITON_INTERPRET"] = "on" if backends.triton_interpreting() else "off"
    return v


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({torch.cuda.device_count()} visible)"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU {name} ({os.cpu_count()} cores)"


# ---------------------------------------------------------------------------------------------
# info


def cmd_info(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    con = _console()
    device = torch.device(cr.default_device())
    con.print(f"[bold]mindspeed-ops {__version__}[/bold]")
    con.print(f"device: {_device_name(device)}   arch: {backends.device_arch(device)}")

    t = Table(title="versions")
    t.add_column("package")
    t.add_column("version")
    for k, val in versions().items():
        t.add_row(escape(k), escape(val))
    con.print(t)

    t = Table(title=f"backends on {device.type}")
    t.add_column("backend")
    t.add_column("available")
    t.add_column("reason")
    for b in backends.BACKENDS:
        ok, why = backends.backend_status(b, device)
        t.add_row(b, "[green]yes[/green]" if ok else "[red]no[/red]", escape(why))
    con.print(t)

    env = os.environ.get(backends.ENV_BACKEND, "").strip()
    t = Table(title=f"dispatch on {device.type}" + (f" ({backends.ENV_BACKEND}={escape(env)})" if env else ""))
    t.add_column("op")
    t.add_column("runs")
    t.add_column("registered")
    for row in backends.describe(device):
        chosen = row["backend"]
        chosen = escape(chosen)
        t.add_row(escape(row["op"]), f"[red]{chosen}[/red]" if chosen.startswith("error") else chosen,
                  ", ".join(row["registered"]))
    con.print(t)
    return 0


# ---------------------------------------------------------------------------------------------
# check


def _fmt_err(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.2e}"


def _fmt_ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f}"


def cmd_check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    device = torch.device(args.device or cr.default_device())
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    small = args.small if args.small is not None else device.type == "cpu"
    if args.repeats < 0:
        parser.error(f"--repeats must be >= 0, got {args.repeats}")
    try:
        dtypes = cr.parse_dtypes(args.dtypes) if args.dtypes else None
    except ValueError as e:
        parser.error(f"--dtypes: {e}")
    ops = [o.strip() for item in (args.ops or []) for o in item.split(",") if o.strip()]
    if args.ops is not None and not ops:
        parser.error("--ops: no op names given")
    if args.json is not None and (problem := cr.output_path_problem(args.json)):
        parser.error(f"--json {args.json}: {problem}")
    try:
        interpreting = cr.prepare_device(device)  # before any kernel module is imported
        load_errors: dict[str, str] = {}
        cases = cr.select_cases(ops, errors=load_errors)
    except (ValueError, RuntimeError) as e:
        parser.error(str(e))
    pairs = cr.plan(cases, device, dtypes)

    con = _console()
    env = os.environ.get(backends.ENV_BACKEND, "").strip()
    if device.type == "cpu":
        mode = ("Triton kernels under the CPU interpreter (TRITON_INTERPRET=1); bf16 skipped"
                if interpreting else "CPU without the Triton interpreter (TRITON_INTERPRET=0): reference backend; "
                                     "bf16 skipped")
    else:
        mode = f"{torch.cuda.get_device_name(device)} ({backends.device_arch(device)})"
    con.print(f"[bold]mindspeed-ops check[/bold] on {device.type}: {escape(mode)}")
    con.print(f"{len(pairs)} runs, {'small' if small else 'full'} shapes"
              + (f", backend forced to {args.backend}" if args.backend else "")
              + (f", {backends.ENV_BACKEND}={escape(env)}" if env else "")
              + "; fwd/grad = max rel_rms vs float64 reference (SPEC 0.9); ms = forward+backward, median")
    # a family that does not import is a FAIL row (only reported when no --ops filter is given)
    results = [] if ops else [cr.CaseResult(f"family {fam}", "import", "-", "-", reason=err)
                              for fam, err in load_errors.items()]
    if not pairs and not results:
        con.print("[red]nothing to run[/red] (no case matches the requested ops/dtypes on this device)")
        return 2

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con, transient=True) as progress:
        task = progress.add_task("checking", total=len(pairs))
        for case, dt in pairs:
            progress.update(task, description=f"{case.op} {case.name} {cr.dtype_short(dt)}")
            results.append(cr.run_case(case, device, dt, small=small, backend=args.backend, repeats=args.repeats))
            progress.advance(task)

    t = Table(title="check results")
    for col, just in [("op", "left"), ("case", "left"), ("dtype", "left"), ("backend", "left"),
                      ("fwd rel_rms", "right"), ("grad rel_rms", "right"), ("ms", "right"), ("result", "left")]:
        t.add_column(col, justify=just)
    for r in results:
        verdict = "[green]PASS[/green]" if r.passed else f"[red]FAIL[/red] {escape(r.reason)}"
        t.add_row(escape(r.op), escape(r.case), r.dtype, r.backend, _fmt_err(r.fwd_rel_rms), _fmt_err(r.grad_rel_rms),
                  _fmt_ms(r.time_ms), verdict)
    con.print(t)
    n_fail = sum(not r.passed for r in results)
    con.print(f"[red]{n_fail} of {len(results)} FAILED[/red]" if n_fail
              else f"[green]all {len(results)} passed[/green]")

    if args.json:
        report = {"device": str(device), "arch": backends.device_arch(device), "interpreter": interpreting,
                  "small": small, "backend": args.backend, "versions": versions(),
                  "passed": n_fail == 0, "results": [r.to_dict() for r in results]}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        con.print(f"wrote {args.json}")
    return 1 if n_fail else 0


# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mindspeed-ops", description="Fused forward+backward LLM training operators.")
    p.add_argument("--version", action="version", version=f"mindspeed-ops {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("info", help="device, arch, versions, backends and the backend each op would use")
    c = sub.add_parser("check", help="check every operator against its float64 reference on this machine")
    c.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (space or comma separated)")
    c.add_argument("--dtypes", help="comma-separated subset of fp32,fp16,bf16 (bf16 is skipped on CPU)")
    size = c.add_mutually_exclusive_group()
    size.add_argument("--small", dest="small", action="store_true", default=None,
                      help="small shapes (default on CPU)")
    size.add_argument("--full", dest="small", action="store_false", help="real shapes (default on GPU)")
    c.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available, else cpu")
    c.add_argument("--backend", choices=list(backends.BACKENDS), help="force a backend (use_backend)")
    c.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="timed repetitions on CPU (0: no timing; CUDA uses do_bench)")
    c.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    c.set_defaults(command_parser=c)  # usage errors print this sub-command's usage
    from . import compile_check  # no kernel imports at its top: safe before TRITON_INTERPRET is decided

    cc = sub.add_parser("compile-check", help="compile every Triton kernel/config for sm_80/sm_90 without a GPU")
    compile_check.build_parser(cc)
    cc.set_defaults(command_parser=cc)
    from .atk import cli as atk_cli  # no kernel imports at its top either

    a = atk_cli.build_parser(sub.add_parser("atk", help="accuracy/performance/memory/determinism harness "
                                                        "(tests/atk_tests/*.yaml)"))
    a.set_defaults(command_parser=a)
    from . import train  # no kernel imports at its top either

    t = train.build_parser(sub.add_parser("train", help="train a small hybrid LM built from these operators on the "
                                                        "Python standard library's source (examples/train_hybrid.py)"))
    t.set_defaults(command_parser=t)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``mindspeed-ops`` console script; returns the exit code."""
    return quiet_on_closed_pipe(lambda: _main(argv))


def quiet_on_closed_pipe(command: Callable[[], int]) -> int:
    """``command()``'s exit code, or 0 when the reader of stdout closed the pipe (``| head``)."""
    try:
        try:
            return command()
        finally:
            sys.stdout.flush()  # a closed pipe surfaces here, not in the interpreter's final flush
    except BrokenPipeError:
        # the reader (e.g. ``| head``) closed the pipe: it has what it wanted, so end quietly with status 0;
        # stdout goes to devnull so that the interpreter's own flush at exit does not fail again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout replaced by an object without a file descriptor
            pass
        return 0


def _main(argv: Optional[Sequence[str]]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    sub_parser = getattr(args, "command_parser", None) or parser  # for the sub-command's usage in errors
    if args.command == "info":
        return cmd_info(args)
    if args.command == "check":
        return cmd_check(args, sub_parser)
    if args.command == "compile-check":
        from . import compile_check

        return compile_check.run_cli(args, sub_parser)
    if args.command == "atk":
        from .atk import cli as atk_cli

        return atk_cli.run_cli(args, sub_parser)
    if args.command == "train":
        from . import train

        return train.run_cli(args, sub_parser)
    parser.print_help()
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
