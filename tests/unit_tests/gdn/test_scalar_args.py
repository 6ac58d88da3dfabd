"""Scalar arguments of the full GDN / KDA ops (SPEC 1.10.10, 1.11.3): ``chunk_size`` must be an integer (a str,
float or bool is a ``TypeError`` naming it, not silently cast), ``scale`` a finite real number (NumPy scalars
included, bools not); the ``torch.ops`` form of chunk_kda, whose schema has a tensor ``g``, names ``g`` when given
None (the public chunk_kda turns None into zero gates). From a fresh-eyes trial (twenty-fifth session)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mindspeed_ops  # noqa: F401  (registers torch.ops.mindspeed_ops)
from mindspeed_ops import api
from tests.conftest import DEVICE


def _inputs(kda: bool, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 20, 2, 8, generator=gen) for _ in range(3))
    g = F.logsigmoid(torch.randn(1, 20, 2, *((8,) if kda else ()), generator=gen))
    beta = torch.rand(1, 20, 2, generator=gen)
    return [t.to(DEVICE) for t in (q, k, v, g, beta)]


OPS = [pytest.param(api.chunk_gated_delta_rule, False, id="gdn"), pytest.param(api.chunk_kda, True, id="kda")]


@pytest.mark.parametrize("op, kda", OPS)
@pytest.mark.parametrize("bad", ["64", 64.0, True])
def test_chunk_size_must_be_an_int(op, kda, bad):
    with pytest.raises(TypeError, match=r"chunk_size must be an int .*got " + repr(bad).replace(".", r"\.")):
        op(*_inputs(kda), chunk_size=bad)


@pytest.mark.parametrize("op, kda", OPS)
def test_numpy_scalars_are_accepted(op, kda):
    ins = _inputs(kda)
    want, _ = op(*ins, scale=0.5, chunk_size=32)
    for scale in (np.float32(0.5), np.float64(0.5)):
        got, _ = op(*ins, scale=scale, chunk_size=np.int64(32))
        assert torch.equal(got, want)


@pytest.mark.parametrize("op, kda", OPS)
@pytest.mark.parametrize("bad, exc", [(True, TypeError), ("0.5", TypeError), (float("nan"), ValueError),
                                      (np.float32("inf"), ValueError)])
def test_scale_must_be_a_finite_real(op, kda, bad, exc):
    with pytest.raises(exc, match="scale must be a"):
        op(*_inputs(kda), scale=bad)


def test_kda_custom_op_names_g_when_none():
    q, k, v, _, beta = _inputs(True)
    with pytest.raises(ValueError, match=r"g must be a \[B, T, HV, K\] tensor"):
        torch.ops.mindspeed_ops.chunk_kda(q, k, v, None, beta, 0.25, None, False, False, None, 64)
