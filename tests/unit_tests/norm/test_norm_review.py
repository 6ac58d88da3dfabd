"""Review regressions for the norm family (SPEC 1.1-1.3): odd hidden sizes on both sides of the tile
limits, mixed dtypes, strided gradients, residual rounding, argument checks, dynamic-shape compile."""
import functools

import pytest
import torch

from mindspeed_ops import api
from mindspeed_ops.ops.norm import reference as ref
from mindspeed_ops.ops.norm.gated import reference as gref
from mindspeed_ops import testing
from mindspeed_ops.testing import assert_close, assert_unchanged, snapshot
from tests.conftest import DEVICE

randn = functools.partial(testing.randn, device=DEVICE)  # the kernels, not the CPU path, on a GPU machine


# rms_norm tile limits: MAX_TILE 16,384 (forward), MAX_TILE_DW 8,192 (backward with dweight)
@pytest.mark.parametrize("D", [1, 3, 127, 129, 8193, 16385])
def test_rms_norm_odd_D_fp16_x_fp32_weight_gemma(D):
    x = randn((3, D), torch.float16, seed=1, scale=2.0)
    w = randn((D,), torch.float32, seed=2, scale=0.1)
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
    y = api.rms_norm(xs, ws, eps=1e-5, offset=1.0)
    yr = ref.rms_norm(xr, wr, 1e-5, 1.0)
    assert y.dtype == torch.float16
    assert_close("y", yr, y, "E-fwd")
    y.sum().backward()  # stride-0 upstream gradient
    yr.sum().backward()
    assert ws.grad.dtype == torch.float32
    assert_close("dx", xr.grad, xs.grad, "E-bwd")
    assert_close("dw", wr.grad, ws.grad, "E-bwd")


@pytest.mark.parametrize("D", [3, 129, 16385])
def test_rmsnorm_without_weight_both_outputs_transposed_grads(D):
    x = randn((4, D), seed=1)
    xs, xr = x.clone().requires_grad_(True), x.double().requires_grad_(True)
    r, y = api.rmsnorm_without_weight(xs, return_normalized=True, rstd_dtype=torch.float32)
    rr, yr = ref.rmsnorm_without_weight(xr, return_normalized=True, rstd_dtype=torch.float64)
    assert r.shape == (4, 1)
    assert_close("rstd", rr, r, "E-fwd")
    assert_close("y", yr, y, "E-fwd")
    dy = randn((D, 4), seed=3).t()
    dr = randn((1, 4), seed=4).t()
    before = snapshot(dy, dr)
    torch.autograd.backward([r, y], [dr, dy])
    torch.autograd.backward([rr, yr], [dr.double(), dy.double()])
    assert_unchanged(before, dy, dr, names=["dy", "drstd"])
    assert_close("dx", xr.grad, xs.grad, "E-bwd")


def test_gated_rejects_bool_group_size():
    # Used to fail: operator.index(True) == 1 turned group_size=True into groups of one channel.
    x, g = randn((3, 8)), randn((3, 8), seed=1)
    with pytest.raises(ValueError, match="group_size"):
        api.rms_norm_gated(x, g, group_size=True)
    with pytest.raises(ValueError, match="group_size"):
        api.FusedRMSNormGated(8, group_size=True)


def test_gated_fp16_x_fp32_residual_and_gate_rounds_residual_stream():
    # residual_out is fp16 (residual_in_fp32=False): the norm sees x' rounded to fp16, so the float64
    # oracle must start from that rounded x' (the float64 reference alone would not round it).
    x = randn((4, 32), torch.float16, seed=0)
    g, r = randn((4, 32), seed=1), randn((4, 32), seed=2)
    xs, gs, rs = (t.clone().requires_grad_(True) for t in (x, g, r))
    y, ro = api.rms_norm_gated(xs, gs, residual=rs, prenorm=True)
    assert ro.dtype == torch.float16
    xp = (x.double() + r.double()).half().double().requires_grad_(True)
    gr = g.double().requires_grad_(True)
    yr = gref.rms_norm_gated(xp, gr)
    assert_close("y", yr, y, "E-fwd")
    assert torch.equal(ro, xp.detach().half())
    dy, dro = randn((4, 32), torch.float16, seed=3), randn((4, 32), torch.float16, seed=4)
    torch.autograd.backward([y, ro], [dy, dro])
    yr.backward(dy.double())
    assert_close("dg", gr.grad, gs.grad, "E-bwd")
    assert_close("dx", xp.grad + dro.double(), xs.grad, "E-bwd")
    assert_close("dresidual", xp.grad + dro.double(), rs.grad, "E-bwd")


def test_compile_dynamic_changing_shapes_and_eps():
    torch._dynamo.reset()
    fns = [
        lambda x, w, e: api.rms_norm(x, w, e, 0.5),
        lambda x, w, e: api.l2norm(x, e) * w,
        lambda x, w, e: api.rmsnorm_without_weight(x, norm_eps=e, return_normalized=True)[1] * w,
        lambda x, w, e: api.rms_norm_gated(x, x * 0.5, w, eps=e, group_size=x.shape[-1] // 2,
                                           norm_before_gate=False),
    ]
    for f in fns:
        torch._dynamo.reset()
        cf = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
        for shape, e in [((3, 16), 1e-6), ((5, 24), 1e-5), ((2, 3, 32), 1e-4)]:
            x0, w0 = randn(shape, seed=1), randn(shape[-1:], seed=2)
            a = [t.clone().requires_grad_(True) for t in (x0, w0)]
            b = [t.clone().requires_grad_(True) for t in (x0, w0)]
            y1, y2 = cf(*a, e), f(*b, e)
            assert_close("y", y2, y1, "E-fwd")
            y1.square().sum().backward()
            y2.square().sum().backward()
            assert_close("dx", b[0].grad, a[0].grad, "E-bwd")
            assert_close("dw", b[1].grad, a[1].grad, "E-bwd")
