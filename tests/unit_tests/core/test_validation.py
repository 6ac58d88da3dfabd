"""mindspeed_ops.validation: every message names the op and the argument and gives expected vs actual."""
import re

import pytest
import torch

from mindspeed_ops import validation as V

OP = "my_op"


def _raises(exc, msg):
    return pytest.raises(exc, match=re.escape(msg))


def test_names():
    assert V.dtype_name(torch.bfloat16) == "bfloat16" and V.dtype_name(torch.float64) == "float64"
    assert V.dtype_name(torch.uint8) == "uint8"
    assert V.shape_str((2, 75, 4)) == "[2, 75, 4]" and V.shape_str(torch.Size([])) == "[]"


def test_check_tensor_accepts_good_input():
    x = torch.randn(2, 3, 4, dtype=torch.float16)
    V.check_tensor(OP, "x", x, ndim=3, min_ndim=2, shape=(2, None, 4), device=torch.device("cpu"))
    V.check_tensor(OP, "x", x, ndim=(3, 4))
    V.check_tensor(OP, "i", torch.zeros(3, dtype=torch.int64), dtypes=None)


def test_check_tensor_not_a_tensor():
    with _raises(TypeError, "my_op: x must be a torch.Tensor, got list"):
        V.check_tensor(OP, "x", [1.0, 2.0])


@pytest.mark.parametrize("dtype,name", [(torch.float64, "float64"), (torch.int32, "int32")])
def test_check_tensor_dtype(dtype, name):
    with _raises(TypeError, f"my_op: x must have dtype float32/float16/bfloat16, got {name}"):
        V.check_tensor(OP, "x", torch.zeros(2, dtype=dtype))
    with _raises(TypeError, "my_op: idx must have dtype int32/int64, got float32"):
        V.check_tensor(OP, "idx", torch.zeros(2), dtypes=V.INDEX_DTYPES)


def test_check_tensor_rank():
    x = torch.zeros(2, 3)
    with _raises(ValueError, "my_op: x must be 3-D, got 2-D with shape [2, 3]"):
        V.check_tensor(OP, "x", x, ndim=3)
    with _raises(ValueError, "my_op: x must be 3 or 4-D, got 2-D with shape [2, 3]"):
        V.check_tensor(OP, "x", x, ndim=(3, 4))
    with _raises(ValueError, "my_op: x must have at least 3 dims, got shape [2, 3]"):
        V.check_tensor(OP, "x", x, min_ndim=3)


def test_check_tensor_shape():
    beta = torch.zeros(2, 75, 4, 1)
    with _raises(ValueError, "chunk_gated_delta_rule: beta must have shape [B, T, HV] = [2, 75, 4], "
                             "got [2, 75, 4, 1]"):
        V.check_tensor("chunk_gated_delta_rule", "beta", beta, shape=(2, 75, 4), shape_desc="[B, T, HV]")
    with _raises(ValueError, "rms_norm: weight must have shape [4096], got [4095]"):
        V.check_tensor("rms_norm", "weight", torch.zeros(4095), shape=(4096,))
    with _raises(ValueError, "my_op: x must have shape [*, 5], got [2, 4]"):
        V.check_tensor(OP, "x", torch.zeros(2, 4), shape=(None, 5))


def test_check_tensor_device():
    with _raises(ValueError, "my_op: x must be on meta (like the other inputs), got cpu"):
        V.check_tensor(OP, "x", torch.zeros(2), device=torch.device("meta"))


def test_check_order_dtype_before_shape():
    # a float64 tensor of the wrong shape reports the dtype first (TypeError)
    with pytest.raises(TypeError):
        V.check_tensor(OP, "x", torch.zeros(3, dtype=torch.float64), shape=(4,))


def test_check_same_device():
    a, b = torch.zeros(2), torch.zeros(2, device="meta")
    assert V.check_same_device(OP, a=a, skip=None, c=torch.zeros(1)) == torch.device("cpu")
    with _raises(ValueError, "my_op: b is on meta but a is on cpu; all tensors must be on one device"):
        V.check_same_device(OP, a=a, b=b)


def test_check_same_dtype():
    V.check_same_dtype(OP, q=torch.zeros(1), k=None, v=torch.zeros(1))
    with _raises(TypeError, "my_op: v must have the dtype of q (float32), got bfloat16"):
        V.check_same_dtype(OP, q=torch.zeros(1), v=torch.zeros(1, dtype=torch.bfloat16))


def test_check_positive_and_choice():
    V.check_positive(OP, "chunk_size", 64)
    V.check_positive(OP, "eps", 0, allow_zero=True)
    with _raises(ValueError, "my_op: chunk_size must be > 0, got 0"):
        V.check_positive(OP, "chunk_size", 0)
    with _raises(ValueError, "my_op: eps must be >= 0, got -1e-06"):
        V.check_positive(OP, "eps", -1e-6, allow_zero=True)
    with _raises(ValueError, "my_op: chunk_size must be > 0, got None"):
        V.check_positive(OP, "chunk_size", None)
    V.check_choice(OP, "mode", "a", ("a", "b"))
    with _raises(ValueError, "my_op: mode must be one of ('a', 'b'), got 'c'"):
        V.check_choice(OP, "mode", "c", ("a", "b"))


def test_reject_float64():
    V.reject_float64(OP, x=torch.zeros(1), y=None, scale=1.0)
    with _raises(TypeError, "my_op: k must have dtype float32/float16/bfloat16, got float64 "
                            "(float64 is accepted by the reference implementations only)"):
        V.reject_float64(OP, q=torch.zeros(1), k=torch.zeros(1, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------
# cu_seqlens (SPEC 0.3)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_cu_seqlens_valid(dtype):
    cu = torch.tensor([0, 3, 3, 10], dtype=dtype)  # a zero-length sequence is allowed
    assert V.check_cu_seqlens(OP, cu, batch=1, total=10) == [0, 3, 3, 10]
    assert V.check_cu_seqlens(OP, cu, batch=1, total=12) == [0, 3, 3, 10]  # tail tokens allowed
    assert V.check_cu_seqlens(OP, torch.tensor([0], dtype=dtype), batch=1, total=0) == [0]
    assert V.check_cu_seqlens(OP, None, batch=4, total=10) is None


def test_cu_seqlens_errors():
    ok = torch.tensor([0, 4, 8])
    with _raises(TypeError, "my_op: cu_seqlens must have dtype int32/int64, got float32"):
        V.check_cu_seqlens(OP, ok.float(), batch=1, total=8)
    with _raises(ValueError, "my_op: cu_seqlens must be 1-D, got 2-D with shape [1, 3]"):
        V.check_cu_seqlens(OP, ok[None], batch=1, total=8)
    with _raises(ValueError, "my_op: with cu_seqlens the batch size must be 1 (pack the batch into one row), got 2"):
        V.check_cu_seqlens(OP, ok, batch=2, total=8)
    with _raises(ValueError, "my_op: cu_seqlens must have at least 1 entry, got shape [0]"):
        V.check_cu_seqlens(OP, torch.zeros(0, dtype=torch.int64), batch=1, total=8)
    with _raises(ValueError, "my_op: cu_seqlens[0] must be 0, got 1"):
        V.check_cu_seqlens(OP, torch.tensor([1, 4, 8]), batch=1, total=8)
    with _raises(ValueError, "my_op: cu_seqlens must be non-decreasing, got [0, 5, 4]"):
        V.check_cu_seqlens(OP, torch.tensor([0, 5, 4]), batch=1, total=8)
    with _raises(ValueError, "my_op: cu_seqlens[-1] must be <= T = 8, got 9"):
        V.check_cu_seqlens(OP, torch.tensor([0, 4, 9]), batch=1, total=8)


def test_cu_seqlens_long_list_is_abbreviated():
    cu = torch.tensor(list(range(20)) + [3])
    with pytest.raises(ValueError, match=r"non-decreasing, got \[0, 1, .*, 15\]\.\.\.$"):
        V.check_cu_seqlens(OP, cu, batch=1, total=100)
