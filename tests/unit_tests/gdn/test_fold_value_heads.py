"""``gdn.common.fold_value_heads``: the GVA sum of dq/dk over the value heads sharing a q/k head (GDN's WY
backward, KDA's backward), done with elementwise adds of strided views instead of a torch reduction over the
middle dim (faster on the GPU). Same values as ``view(...).sum(3)``, head order fixed, a fresh contiguous output."""
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
    if G == 2:  # two heads: one rounding, exactly torch's own result
        assert torch.equal(out, x.view(2, 37, 3, 2, 100).sum(3))


def test_head_order_and_determinism():
    """The value heads are added in order ((h0 + h1) + h2) + ...: run to run bitwise equal."""
    x = torch.tensor([1e8, 1.0, -1e8, 1.0], device=DEVICE).view(1, 1, 4, 1)
    assert fold_value_heads(x, 1).item() == 1.0  # fp32: 1e8 + 1 rounds to 1e8, then -1e8, then +1 (any other order: 0 or 2)
    y = torch.randn(1, 64, 8, 128, device=DEVICE)
    assert torch.equal(fold_value_heads(y, 2), fold_value_heads(y, 2))
