"""``import mindspeed_ops`` alone registers every operator under ``torch.ops.mindspeed_ops`` (SPEC 2.1):
a user calling ``torch.ops.mindspeed_ops.<name>`` (or a torch.compile'd graph that names it) must not
depend on having imported ``mindspeed_ops.api`` first."""
import subprocess
import sys

# one trainable operator of each family (SPEC 2.1's table)
OPS = ["l2norm", "rms_norm", "rms_norm_gated", "clipped_swiglu", "inplace_rope", "fused_cross_entropy_loss",
       "chunk_loss", "causal_conv1d", "sort_chunks_by_idx", "chunk_gated_delta_rule", "chunk_kda", "sinkhorn",
       "mhc_pre_bmm", "mhc_post"]


def test_import_registers_torch_ops():
    code = ("import torch, mindspeed_ops\n"
            f"missing = [n for n in {OPS!r} if not hasattr(torch.ops.mindspeed_ops, n)]\n"
            "print('MISSING', missing)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "MISSING []" in out.stdout, out.stdout
