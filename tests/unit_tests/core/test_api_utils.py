"""api.triton.utils and mindspeed_ops.utils (SPEC 2.1)."""
import pytest
import torch

from mindspeed_ops.api.triton.utils import get_available_device, prepare_chunk_indices
from mindspeed_ops.utils import is_arch35


def test_prepare_chunk_indices_varlen_with_empty_sequence():
    cu = torch.tensor([0, 3, 3, 130, 200], dtype=torch.int32)
    got = prepare_chunk_indices(cu, 64)
    assert got.dtype == torch.int32
    assert got.tolist() == [[0, 0], [2, 0], [2, 1], [3, 0], [3, 1]]


def test_prepare_chunk_indices_errors():
    with pytest.raises(ValueError, match="chunk_size must be > 0"):
        prepare_chunk_indices(torch.tensor([0, 4]), 0)
    with pytest.raises(ValueError, match=r"cu_seqlens\[0\] must be 0"):
        prepare_chunk_indices(torch.tensor([1, 4]), 16)
    with pytest.raises(ValueError, match="non-decreasing"):
        prepare_chunk_indices(torch.tensor([0, 4, 2]), 16)
    with pytest.raises(TypeError, match="cu_seqlens must have dtype int32/int64"):
        prepare_chunk_indices(torch.tensor([0.0, 4.0]), 16)


def test_small_helpers():
    assert get_available_device() in ("cuda", "cpu")
    assert is_arch35() is False
