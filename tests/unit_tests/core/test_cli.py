"""The ``mindspeed-ops`` command line (``python -m mindspeed_ops``)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mindspeed_ops import __version__, cli
from tests.conftest import ON_GPU

ROOT = Path(__file__).resolve().parents[3]


def _run(*args, timeout=300):
    """Run the CLI in a fresh interpreter. TRITON_INTERPRET is removed from the environment: on a CPU
    machine ``check`` must switch the interpreter on by itself."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MINDSPEED_OPS_BACKEND")}
    env["OMP_NUM_THREADS"] = "1"
    env["COLUMNS"] = "200"  # a wide table, whatever terminal (or pytest-xdist) this runs under
    return subprocess.run([sys.executable, "-m", "mindspeed_ops", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_info():
    p = _run("info")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for text in ("mindspeed-ops " + __version__, "arch:", "versions", "torch", "triton", "numpy",
                 "TRITON_INTERPRET", "backends on", "reference", "pure PyTorch", "dispatch on", "clipped_swiglu"):
        assert text in out, f"{text!r} missing from:\n{out}"
    if not ON_GPU:
        assert "arch: cpu" in out
        assert re.search(r"TRITON_INTERPRET\W+off", out)  # info reports the environment as it is


def test_check_clipped_swiglu(tmp_path):
    report = tmp_path / "check.json"
    p = _run("check", "--ops", "clipped_swiglu", "--json", str(report))
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for text in ("check results", "op", "case", "dtype", "backend", "fwd rel_rms", "grad rel_rms", "ms", "result",
                 "clipped_swiglu", "triton", "PASS", "passed"):
        assert text in out, f"{text!r} missing from:\n{out}"
    assert "FAIL" not in out
    data = json.loads(report.read_text())
    assert data["passed"] is True and data["results"]
    assert {r["op"] for r in data["results"]} == {"clipped_swiglu"}
    assert all(r["passed"] and r["backend"] == "triton" for r in data["results"])
    if not ON_GPU:
        assert "Triton kernels under the CPU interpreter (TRITON_INTERPRET=1); bf16 skipped" in out
        assert data["interpreter"] is True and data["small"] is True
        assert {r["dtype"] for r in data["results"]} == {"fp32", "fp16"}


def test_check_failure_exit_code():
    # forcing a backend that cannot run here turns every row into a FAIL with the reason, exit code 1
    p = _run("check", "--ops", "clipped_swiglu", "--dtypes", "fp32", "--backend", "cutlass", "--repeats", "0")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL" in p.stdout and "BackendUnavailableError" in p.stdout and "FAILED" in p.stdout


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and f"mindspeed-ops {__version__}" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [
    (["check", "--ops", "no_such_op"], "no check cases for no_such_op"),
    (["check", "--dtypes", "fp8"], "--dtypes: unknown dtype 'fp8'"),
    (["check", "--backend", "opencl"], "invalid choice"),
    (["check", "--small", "--full"], "not allowed with argument"),
])
def test_bad_arguments(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "usage: mindspeed-ops" in capsys.readouterr().out


@pytest.mark.skipif(ON_GPU, reason="bf16 runs on the GPU")
def test_nothing_to_run_on_cpu(capsys):
    assert cli.main(["check", "--ops", "clipped_swiglu", "--dtypes", "bf16"]) == 2
    assert "nothing to run" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["atk", "--list"], ["info"], ["atk", "--help"], ["train", "--help"]])
def test_closed_stdout_pipe_ends_quietly(args):
    """``mindspeed-ops atk --list | head -3``: a reader that closes the pipe early is no error (status 0, no
    traceback). The read end is closed before the interpreter has started, so every write hits the closed pipe."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MINDSPEED_OPS_BACKEND")}
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.Popen([sys.executable, "-m", "mindspeed_ops", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0 and err == "", err


def test_versions_dict():
    v = cli.versions()
    assert v["mindspeed_ops"] == __version__ and v["TRITON_INTERPRET"] in ("on", "off")


def test_broken_family_is_a_fail_row(monkeypatch, capsys):
    from mindspeed_ops import backends

    backends.registered_ops()  # the real families load first (as in a real run): only the bad one fails
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(backends, "_FAMILIES", ("activation", "_no_such_family"))
    assert cli.main(["check", "--dtypes", "fp32", "--repeats", "0"]) == 1
    out = capsys.readouterr().out
    assert "family _no_such_family" in out and "ModuleNotFoundError" in out and "PASS" in out
