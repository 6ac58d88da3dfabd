"""The GDN/KDA oracles under autocast (found by a fresh-user review: ``mindspeed-ops train --dtype bf16`` on CPU
with a KDA layer failed inside chunk_kda_ref with an index_put dtype mismatch): they compute in fp32 whatever
autocast says, so the result equals the one without autocast, bitwise."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops.ops.gdn import reference as gref
from mindspeed_ops.ops.kda import reference as kref


@pytest.mark.parametrize("fn,per_channel", [(kref.chunk_kda_ref, True), (kref.recurrent_kda_ref, True),
                                            (gref.chunk_gated_delta_rule_ref, False),
                                            (gref.recurrent_gated_delta_rule_ref, False)])
def test_oracles_ignore_cpu_autocast(fn, per_channel):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 70, 2, 16, generator=gen) for _ in range(3))
    g = F.logsigmoid(torch.randn(1, 70, 2, 16, generator=gen))
    g = g if per_channel else g[..., 0]
    beta = torch.rand(1, 70, 2, generator=gen)
    want = fn(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fn(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
