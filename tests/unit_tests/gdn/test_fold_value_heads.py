"""``gdn.common.fold_value_heads``: the GVA sum of dq/dk over the value heads sharing a q/k head (GDN's WY
backward, KDA's backward): for two heads per key head one elementwise add of strided views instead of a torch
reduction over the middle dim (faster on the GPU). Same bits as ``view(...).sum(3)``, a fresh contiguous output."""
import pytest
import torch

from mindspeed_ops.ops.gdn.common import fold_value_heads
from mindspeed_ops.testing import assert_close
from tests.conftest import DEVICE


@pytest.mark.parametrize("G", [1, 2, 3, 4])
def test_matches_torch_sum(G):
    gen = torch.Generator().manual_seed(G)
    x = torch.randn(2, 37, 3 * G, 100, generator=gen).to(DEVICE)
    ref = x.double().view(2, 37, 3, G, 100).sum(3)
    out = fold_value_heads(x, 3)
    assert out.shape == (2, 37, 3, 100) and out.dtype == x.dtype and out.is_contiguous()
    assert_close("fold", ref, out, 1e-6, err_atol=0.0)
    if G == 1:
        assert out is x
    else:
        assert out.data_ptr() != x.data_ptr()
    assert torch.equal(out, x.view(2, 37, 3, G, 100).sum(3))  # torch's own bits (two heads: one rounding)


def test_determinism():
    """Run to run bitwise equal, for two and for four heads per key head."""
    y = torch.randn(1, 64, 8, 128, device=DEVICE)
    for H in (4, 2):
        assert torch.equal(fold_value_heads(y, H), fold_value_heads(y, H))
