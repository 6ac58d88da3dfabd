"""``import mindspeed_ops`` alone registers every operator under ``torch.ops.mindspeed_ops`` (SPEC 2.1) and
loads no triton: ``@triton.jit`` fixes compiled or interpreted mode when a function is decorated, so the CLI
(and a user) must still be able to set TRITON_INTERPRET=1 after the import. Both failed before: the ops
needed ``mindspeed_ops.api`` imported first, and importing it loaded triton."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

# one trainable operator of each family (SPEC 2.1's table)
OPS = ["l2norm", "rms_norm", "rms_norm_gated", "clipped_swiglu", "inplace_rope", "fused_cross_entropy_loss",
       "chunk_loss", "causal_conv1d", "sort_chunks_by_idx", "chunk_gated_delta_rule", "chunk_kda", "sinkhorn",
       "mhc_pre_bmm", "mhc_post"]


def _run(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_import_registers_torch_ops_without_triton():
    out = _run("import sys, torch, mindspeed_ops\n"
               f"print('MISSING', [n for n in {OPS!r} if not hasattr(torch.ops.mindspeed_ops, n)])\n"
               "print('TRITON', 'triton' in sys.modules)\n")
    assert "MISSING []" in out and "TRITON False" in out, out


@pytest.mark.skipif(tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 4),
                    reason="the Triton interpreter mis-runs runtime-bounded loops on numpy >= 2.4 (as on the GPU image)")
def test_interpreter_switched_on_after_import():
    """The GDN chunk kernels call triton.language's own jit helpers (tl.cumsum); they run under the interpreter
    when the variable is set after ``import mindspeed_ops`` and before the first call."""
    out = _run("import os, torch, mindspeed_ops\n"
               "from mindspeed_ops import api\n"
               "os.environ['TRITON_INTERPRET'] = '1'\n"
               "q, k = (torch.nn.functional.normalize(torch.randn(1, 20, 1, 16), dim=-1) for _ in range(2))\n"
               "v, g, beta = torch.randn(1, 20, 1, 16), -torch.rand(1, 20, 1, 16), torch.rand(1, 20, 1)\n"
               "o, _ = api.chunk_kda(q, k, v, g, beta)\n"
               "print('FINITE', bool(torch.isfinite(o).all()))\n")
    assert "FINITE True" in out, out


def test_kernel_module_detection():
    from mindspeed_ops.check_runner import kernel_modules_loaded

    loaded = kernel_modules_loaded()
    assert "mindspeed_ops.triton_utils" not in loaded and not any(m.startswith("mindspeed_ops.api.") for m in loaded)
    # this test session has imported kernels: the detection sees them
    assert any(m.startswith("mindspeed_ops.ops.") for m in loaded) or "triton" in loaded
