"""Command-line review regressions: an output path that cannot be written (``--json`` naming a
directory or under a file), an empty ``--ops`` and nonsensical ``compile-check`` settings are usage
errors (exit code 2, no traceback) before anything runs, not a traceback after the run."""
import json

import pytest

from mindspeed_ops import cli
from mindspeed_ops.check_runner import output_path_problem


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2, argv
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and "runs" not in cap.out  # refused before running anything
    return cap.err


def test_output_path_problem(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert output_path_problem(str(tmp_path / "new" / "deeper" / "r.json")) is None
    assert output_path_problem(str(tmp_path / "new"), directory=True) is None
    assert output_path_problem(str(tmp_path)) == "is a directory"
    assert output_path_problem(str(f), directory=True) == "exists and is not a directory"
    assert "is not a directory" in output_path_problem(str(f / "r.json"))


@pytest.mark.parametrize("where", ["dir", "under_file"])
def test_check_json_path_is_checked_first(where, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    path = tmp_path if where == "dir" else blocker / "r.json"
    err = _usage_error(["check", "--ops", "l2norm", "--json", str(path)], capsys)
    assert "--json" in err and "usage: mindspeed-ops check" in err


def test_check_json_creates_parent_dirs(tmp_path, capsys):
    path = tmp_path / "a" / "b" / "r.json"
    assert cli.main(["check", "--ops", "clipped_swiglu", "--dtypes", "fp32", "--repeats", "0",
                     "--json", str(path)]) == 0
    assert json.loads(path.read_text())["passed"] is True


@pytest.mark.parametrize("command", ["check", "compile-check"])
def test_empty_ops_is_a_usage_error(command, capsys):
    # e.g. --ops "$OPS" with an empty variable: not "every op" (a 10-minute run)
    assert "--ops: no op names given" in _usage_error([command, "--ops", ","], capsys)


@pytest.mark.parametrize("argv, words", [
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--timeout", "0"], "--timeout must be > 0"),
    (["--arch", "abc"], "compute capabilities such as 80,90"),
    (["--arch", ","], "--arch accepts"),
    (["--shapes", ","], "--shapes accepts small, real, got none"),  # compiled nothing and said "0/0 ok"
    (["--dtypes", ","], "--dtypes: none given"),
    (["--real-input-budget", "-5"], "--real-input-budget must be >= 0"),
])
def test_compile_check_bad_settings(argv, words, capsys):
    assert words in _usage_error(["compile-check", *argv], capsys)


def test_compile_check_json_path_is_checked_first(tmp_path, capsys):
    err = _usage_error(["compile-check", "--ops", "l2norm", "--json", str(tmp_path)], capsys)
    assert "--json" in err and "is a directory" in err


@pytest.mark.parametrize("argv", [["check", "--json", ""], ["compile-check", "--json", ""], ["atk", "--out", ""],
                                  ["atk", "--summary-md", ""]])
def test_empty_output_path_is_a_usage_error(argv, capsys):
    # e.g. --json "$REPORT" with an empty variable: it used to run everything and write nothing
    assert "empty path" in _usage_error(argv, capsys)
