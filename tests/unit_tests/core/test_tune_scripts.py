"""The GPU tuning scripts run end to end on CPU (``--device cpu``: the interpreter, tiny shapes, no
timing), so a device call never finds them broken: every configuration of their sweeps is launched and
checked against the default's output."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.parametrize("args", [
    ["benchmarks/tune_kda.py", "--T", "64", "--H", "1", "--HV", "2", "--K", "16"],
    ["benchmarks/tune_kda.py", "--T", "64", "--H", "1", "--HV", "2", "--K", "16", "--only", "fwd_h", "dhu", "qgkg"],
    ["benchmarks/tune_gdn_bwd.py", "--T", "64", "--H", "1", "--HV", "2", "--K", "16", "--V", "16", "--only", "wy_bwd"],
    ["benchmarks/tune_gdn_bwd.py", "--T", "64", "--H", "1", "--HV", "2", "--K", "16", "--V", "16", "--only", "fwd_h",
     "dhu"],
    ["benchmarks/tune_kkt_solve.py", "--T", "40", "--H", "1", "--HV", "2", "--K", "16", "--BT", "32"],
    ["benchmarks/tune_chunk_loss.py", "--N", "48", "--Hd", "32", "--V", "100", "--chunk-sizes", "0", "16", "7"],
])
def test_tune_script_runs_on_cpu(args):
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, *args, "--device", "cpu"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "failed" not in out.stdout and "best:" in out.stdout, out.stdout[-3000:]


def test_sass_loops_counts_the_conv_loops():
    """benchmarks/sass_loops.py (no GPU: interpreter recording, sm_90 compile, nvdisasm): the conv forward's loop
    is found and carries no exp or division fix-ups (sigmoid_fast_f32)."""
    out = subprocess.run([sys.executable, "benchmarks/sass_loops.py", "--op", "causal_conv1d"], cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    fwd = out.stdout.split("causal_conv1d_bwd_kernel")[0]
    assert "causal_conv1d_fwd_kernel" in fwd and "loop .L_x_" in fwd, out.stdout
    assert "'exp fix-ups': 0, 'div fix-ups': 0" in fwd, out.stdout
