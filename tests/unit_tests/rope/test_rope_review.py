"""Review regressions for ``inplace_rope`` (SPEC 1.5): autograd version counters, shared gradients,
partial rotary at odd sizes, odd cos/sin layouts, dynamic-shape torch.compile."""
import functools

import pytest
import torch

from mindspeed_ops import api
from mindspeed_ops.ops.rope import reference as ref
from mindspeed_ops import testing
from mindspeed_ops.testing import assert_close, snapshot, assert_unchanged
from tests.conftest import DEVICE

randn = functools.partial(testing.randn, device=DEVICE)  # the kernels, not the CPU path, on a GPU machine


def test_no_grad_call_bumps_version_counter():
    # Used to fail: the eager path ran the op body (a Triton kernel) directly, so x._version did not
    # change and a tensor saved for backward by another op (y = w * x saves x) was rotated behind
    # autograd's back: silently wrong w.grad instead of PyTorch's in-place error.
    cos, sin = ref.rope_cos_sin(8, 8, device=DEVICE)
    x = randn((1, 8, 2, 16))
    w = randn((1, 8, 2, 16), seed=1, requires_grad=True)
    y = w * x
    v0 = x._version
    assert api.inplace_rope(x, cos, sin) is x
    assert x._version > v0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_grad_call_detects_saved_tensor_modification():
    cos, sin = ref.rope_cos_sin(8, 8, device=DEVICE)
    a = randn((1, 8, 2, 16), requires_grad=True)
    w = randn((1, 8, 2, 16), seed=1, requires_grad=True)
    h = a * 1
    y = w * h
    api.inplace_rope(h, cos, sin)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_shared_gradient_two_ropes_added():
    # AddBackward hands the same gradient buffer to both branches: with the default in-place backward
    # the second branch would see an already rotated gradient (documented); inplace_backward=False is right.
    cos, sin = ref.rope_cos_sin(8, 32, device=DEVICE)
    a = randn((1, 8, 2, 64), requires_grad=True)
    b = randn((1, 8, 2, 64), seed=3, requires_grad=True)
    ar, br = (t.detach().double().requires_grad_(True) for t in (a, b))
    y = api.inplace_rope(a * 1, cos, sin, inplace_backward=False) + api.inplace_rope(b * 1, cos, sin,
                                                                                     inplace_backward=False)
    yr = ref.inplace_rope(ar * 1, cos, sin) + ref.inplace_rope(br * 1, cos, sin)
    dy = randn(y.shape, seed=5)
    before = snapshot(dy)
    y.backward(dy)
    yr.backward(dy.double())
    assert_unchanged(before, dy, names=["dy"])
    assert_close("da", ar.grad, a.grad, "E-bwd")
    assert_close("db", br.grad, b.grad, "E-bwd")


@pytest.mark.parametrize("D,R", [(2, 2), (3, 2), (17, 6), (64, 34), (130, 2), (1025, 1024)])
def test_partial_rotary_odd_sizes_fwd_bwd(D, R):
    cos, sin = ref.rope_cos_sin(5, R, device=DEVICE)
    x0 = randn((1, 3, 2, D))
    leaf = x0.clone().requires_grad_(True)
    leafr = x0.double().requires_grad_(True)
    h, hr = leaf * 1, leafr * 1
    out = api.inplace_rope(h, cos, sin, torch.tensor([4, 0, 2], device=DEVICE))
    ref.inplace_rope(hr, cos, sin, torch.tensor([4, 0, 2], device=DEVICE))
    assert out is h
    assert_close("rot", hr[..., D - R:], h[..., D - R:], "E-fwd")
    assert torch.equal(h[..., : D - R], x0[..., : D - R])
    dy = randn(h.shape, seed=4)
    h.backward(dy.clone())
    hr.backward(dy.double())
    assert_close("dx", leafr.grad, leaf.grad, "E-bwd")


def test_odd_cos_sin_layouts_and_channel_stride():
    cos, sin = ref.rope_cos_sin(8, 16, device=DEVICE)
    tables = [
        (torch.cat([cos, cos], -1)[:, ::2], torch.cat([sin, sin], -1)[:, ::2]),  # column stride 2
        (cos[:1].expand(8, 8), sin[:1].expand(8, 8)),                            # stride-0 rows
        (cos.t().contiguous().t(), sin.t().contiguous().t()),                    # transposed storage
        (cos.half(), sin.bfloat16()),                                            # mixed table dtypes
    ]
    for c, s in tables:
        before = snapshot(c, s)
        x = randn((2, 8, 2, 20))
        xr = x.double()
        api.inplace_rope(x, c, s)
        ref.inplace_rope(xr, c, s)
        assert_close("x", xr, x, "E-fwd")
        assert_unchanged(before, c, s, names=["cos", "sin"])
    # channel stride != 1: [1, 8, 2, 16] view of a [16, 1, 8, 2] buffer
    xb = randn((16, 1, 8, 2))
    xv = xb.permute(1, 2, 3, 0)
    xr = xv.double().clone()
    api.inplace_rope(xv, cos, sin)
    ref.inplace_rope(xr, cos, sin)
    assert_close("strided", xr, xv, "E-fwd")


def test_compile_dynamic_changing_shapes():
    cos, sin = ref.rope_cos_sin(16, 8, device=DEVICE)

    def f(x, pos):
        h = x * 1
        return api.inplace_rope(h[..., 2:], cos, sin, pos, inplace_backward=False) * 1

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for shape, pos in [((1, 4, 2, 16), None), ((2, 6, 3, 18), None), ((2, 5, 3, 24), torch.tensor([0, 3, 5, 2, 1], device=DEVICE))]:
        x0 = randn(shape)
        x1, x2 = (x0.clone().requires_grad_(True) for _ in range(2))
        y1, y2 = cf(x1, pos), f(x2, pos)
        assert_close("y", y2, y1, "E-fwd")
        y1.square().sum().backward()
        y2.square().sum().backward()
        assert_close("dx", x2.grad, x1.grad, "E-bwd")
