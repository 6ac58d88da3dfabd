"""benchmarks/profile_op.py at an ATK case's CPU point: it builds the inputs as the harness does and prints
a kernel table for the forward and the forward+backward step; unknown cases and points are clear errors."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _tool():
    spec = importlib.util.spec_from_file_location("profile_op", os.path.join(ROOT, "benchmarks", "profile_op.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cpu_point_forward_and_backward(capsys):
    assert _tool().main(["--op", "rms_norm", "--rows", "5"]) == 0
    out = capsys.readouterr().out
    assert "== forward\n" in out and "== forward+backward" in out and "host time per call" in out


def test_bad_case_and_point():
    tool = _tool()
    with pytest.raises(SystemExit, match="no case"):
        tool.main(["--op", "rms_norm", "--case", "nope"])
    with pytest.raises(SystemExit, match="no point"):
        tool.main(["--op", "causal_conv1d", "--shape", "B=3,T=5"])


def test_host_profile(capsys):
    assert _tool().main(["--op", "rms_norm", "--rows", "5", "--host-profile"]) == 0
    out = capsys.readouterr().out
    assert out.count("cProfile of 20 calls") == 2 and "cumulative" in out and "tottime" in out
