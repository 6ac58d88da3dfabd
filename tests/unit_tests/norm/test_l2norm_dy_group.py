"""``l2norm.backward(..., dy_group=G)`` (internal, GVA): ``dy [..., H·G, D]`` summed over each row's ``G``
consecutive heads as the kernel reads it, the fold the GDN and KDA backwards used to run as its own pass
(``gdn.common.fold_value_heads``). Against that fold followed by the plain backward: bitwise for ``G = 2``
(one fp32 add either way), rel-RMS 1e-6 for ``G = 3`` (torch's reduction may add in another order); the tile
and the looped (long-row) paths, both backends, non-contiguous ``dy``, inputs unchanged; and the GDN / KDA
backward with GVA and the in-kernel l2norm against the same op with the heads folded first."""
import importlib

import pytest
import torch

from mindspeed_ops import backends
from mindspeed_ops.ops.gdn.common import fold_value_heads
from mindspeed_ops.testing import assert_close, assert_unchanged, snapshot
from tests.conftest import DEVICE, DTYPES

l2 = importlib.import_module("mindspeed_ops.ops.norm.l2norm")  # the module (the package exports the function)


def _inputs(B, T, H, G, D, dtype, seed=0, noncontig=False):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, T, H, D, generator=gen) * 3).to(dtype).to(DEVICE)
    if noncontig:  # dy as a head-strided view of a wider buffer (the kernel takes any strides)
        dy = torch.randn(B, T, H * G, 2 * D, generator=gen).to(DEVICE)[..., ::2]
    else:
        dy = torch.randn(B, T, H * G, D, generator=gen).to(DEVICE)
    y, rstd = l2.forward(x, 1e-6, None)
    return x, y, rstd, dy


def _both(impl, x_or_y, rstd, dy, H, G, normalized, dx_dtype):
    grouped = impl.backward(x_or_y, rstd, dy, 1e-6, normalized, dx_dtype, dy_group=G)
    folded = impl.backward(x_or_y, rstd, fold_value_heads(dy.contiguous(), H), 1e-6, normalized, dx_dtype)
    return grouped, folded


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("G", [2, 3])
@pytest.mark.parametrize("D", [60, 128])
@pytest.mark.parametrize("normalized", [True, False])
def test_matches_fold_then_backward(D, G, dtype, normalized):
    B, T, H = 2, 7, 3
    x, y, rstd, dy = _inputs(B, T, H, G, D, dtype, seed=D + G, noncontig=G == 3)
    before = snapshot(x, y, rstd, dy)
    grouped, folded = _both(backends.implementation("l2norm", DEVICE), y if normalized else x, rstd, dy, H, G,
                            normalized, torch.float32)
    assert_unchanged(before, x, y, rstd, dy)
    assert grouped.shape == x.shape and grouped.dtype == torch.float32
    if G == 2:
        assert torch.equal(grouped, folded), "G = 2: the in-kernel fold must give the bits of fold_value_heads"
    else:
        assert_close("dx grouped vs folded", folded.double(), grouped, 1e-6, err_atol=0.0)


def test_looped_path_long_rows():
    """Rows past the tile limit take the looped kernels: the launcher sums the heads first (same result)."""
    D = importlib.import_module("mindspeed_ops.ops.norm.rms_norm").MAX_TILE + 24
    x, y, rstd, dy = _inputs(1, 1, 2, 2, D, torch.float32, seed=5)
    grouped, folded = _both(backends.implementation("l2norm", DEVICE), y, rstd, dy, 2, 2, True, torch.float32)
    assert torch.equal(grouped, folded)


def test_reference_backend_same_contract():
    with backends.use_backend("reference"):
        ref = backends.implementation("l2norm", DEVICE)
        x, y, rstd, dy = _inputs(1, 5, 2, 2, 40, torch.float32, seed=7)
        grouped, folded = _both(ref, y, rstd, dy, 2, 2, True, torch.float32)
    assert torch.equal(grouped, folded)
    tri = backends.implementation("l2norm", DEVICE).backward(y, rstd, dy, 1e-6, True, torch.float32, dy_group=2)
    assert_close("triton vs reference", grouped.double(), tri, 1e-6, err_atol=0.0)


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_op_backward_equals_folding_first(op, monkeypatch):
    """GVA (H = 1, HV = 2) with the in-kernel l2norm: the op's dq, dk are those of the previous pipeline (the heads
    summed by ``fold_value_heads``, then the plain l2norm backward), bit for bit, with fp32 inputs."""
    from mindspeed_ops import api

    gen = torch.Generator().manual_seed(3)
    T, K, V = 40, 32, 24
    q, k = torch.randn(1, T, 1, K, generator=gen) * 2, torch.randn(1, T, 1, K, generator=gen) * 2
    v = torch.randn(1, T, 2, V, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, 2, *([K] if op == "kda" else []), generator=gen))
    beta = torch.sigmoid(torch.randn(1, T, 2, generator=gen))
    ins = [t.to(DEVICE) for t in (q, k, v, g, beta)]
    fn = api.chunk_gated_delta_rule if op == "gdn" else api.chunk_kda

    def grads():
        leaves = [t.clone().requires_grad_(True) for t in ins]
        o = fn(*leaves, use_qk_l2norm_in_kernel=True, chunk_size=32)[0]
        (o * torch.cos(o)).sum().backward()
        return [t.grad for t in leaves]

    new = grads()
    impl = backends.implementation("l2norm", DEVICE)
    real = impl.backward

    grouped_calls = []

    def fold_first(x_or_y, rstd, dy, eps, normalized=False, dx_dtype=None, dy_group=1):
        if dy_group > 1:
            grouped_calls.append(dy_group)
            dy = fold_value_heads(dy.contiguous(), x_or_y.shape[-2])
        return real(x_or_y, rstd, dy, eps, normalized, dx_dtype)

    monkeypatch.setitem(impl.fns, "backward", fold_first)
    old = grads()
    assert grouped_calls == [2] * (2 if op == "kda" else 1), grouped_calls  # GDN's dq is per key head already
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), old, new):
        assert torch.equal(a, b), name
