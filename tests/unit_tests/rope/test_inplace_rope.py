"""inplace_rope (SPEC 1.5): kernel vs float64 reference, in-place semantics, strides, backward modes,
errors, registration."""
import pytest
import torch

import mindspeed_ops
from mindspeed_ops.ops.rope import inplace_rope
from mindspeed_ops.ops.rope import reference as ref
from mindspeed_ops.ops.rope.inplace_rope import non_overlapping
from mindspeed_ops.testing import assert_close, assert_unchanged, randn, snapshot
from tests.conftest import DEVICE, DTYPES, ON_GPU


def _tables(t_max, R, dtype=torch.float32, device=DEVICE):
    return ref.rope_cos_sin(t_max, R, device=device, dtype=dtype)


def _packed_positions(lengths, device=DEVICE, dtype=torch.int64):
    return torch.cat([torch.arange(n) for n in lengths]).to(device=device, dtype=dtype)


def _check(w, cos, sin, pos=None, inverse=False, dy=None, inplace_backward=True, seed=7):
    """Forward and backward of ``inplace_rope(w.clone())`` against autograd of the float64 reference.

    Rope channels: E-fwd / E-bwd; nope channels of the output and of the gradient: EXACT. ``cos``,
    ``sin``, ``position_ids`` must be bitwise unchanged after forward and backward.
    """
    R, D = 2 * cos.shape[-1], w.shape[-1]
    w = w.detach().requires_grad_(True)
    tables = snapshot(cos, sin, pos)
    x = w.clone()
    y = inplace_rope(x, cos, sin, pos, inverse=inverse, inplace_backward=inplace_backward)
    assert y is x
    dy = randn(y.shape, y.dtype, DEVICE, seed=seed) if dy is None else dy
    dy_before = dy.detach().clone()
    out = y.detach().clone()
    y.backward(dy)
    assert_unchanged(tables, cos, sin, pos, names=["cos", "sin", "position_ids"])

    wr = w.detach().double().requires_grad_(True)
    yr = ref.inplace_rope(wr.clone(), cos.double(), sin.double(), pos, inverse=inverse)
    yr.backward(dy_before.double())
    assert_close("y rope", yr[..., D - R:], out[..., D - R:], "E-fwd")
    assert_close("y nope", w[..., : D - R], out[..., : D - R], "EXACT")
    assert_close("dx rope", wr.grad[..., D - R:], w.grad[..., D - R:], "E-bwd")
    assert_close("dx nope", dy_before[..., : D - R], w.grad[..., : D - R], "EXACT")
    return out, w.grad, dy


# (x shape, rope_dim); CPU shapes keep a launch to a handful of programs
SHAPES = [((2, 64, 4, 512), 64), ((2, 32, 4, 128), 128), ((1, 24, 1, 40), 16), ((3, 5, 3, 20), 12),
          ((2, 8, 5, 96), 48), ((2, 5, 2, 6), 2)]
GPU_SHAPES = [((2, 1024, 16, 512), 64), ((2, 1024, 16, 128), 128), ((4, 4096, 32, 64), 64)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,R", SHAPES)
@pytest.mark.parametrize("inverse", [False, True])
def test_matches_reference(shape, R, dtype, inverse):
    cos, sin = _tables(shape[1], R)
    _check(randn(shape, dtype, DEVICE, seed=1), cos, sin, inverse=inverse)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,R", GPU_SHAPES)
def test_v4_shapes_gpu(shape, R, dtype):
    cos, sin = _tables(shape[1], R)
    _check(randn(shape, dtype, DEVICE, seed=2), cos, sin)
    _check(randn(shape, dtype, DEVICE, seed=3), cos, sin, inverse=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_packed_positions_restart(dtype, pos_dtype):
    lengths = [1365, 1366, 1365] if ON_GPU else [40, 31, 25]
    T = sum(lengths)
    shape = (T, 8, 192) if ON_GPU else (T, 2, 192)
    pos = _packed_positions(lengths, dtype=pos_dtype)
    cos, sin = _tables(max(lengths), 64)
    out, _, _ = _check(randn(shape, dtype, DEVICE, seed=4), cos, sin, pos)
    # each sequence is rotated as if it were alone (positions restart at 0)
    x = randn(shape, dtype, DEVICE, seed=4)
    start = 0
    for n in lengths:
        alone = inplace_rope(x[start:start + n].clone(), cos, sin)
        assert torch.equal(alone, out[start:start + n])
        start += n


@pytest.mark.parametrize("pos_shape", ["BT", "T"])
def test_position_ids_4d(pos_shape):
    B, T, H, D, R = 3, 20, 2, 32, 16
    g = torch.Generator().manual_seed(5)
    pos = torch.randint(0, 50, (B, T) if pos_shape == "BT" else (T,), generator=g).to(DEVICE)
    cos, sin = _tables(50, R)
    _check(randn((B, T, H, D), torch.float32, DEVICE, seed=6), cos, sin, pos)
    if pos_shape == "T":  # [T] broadcasts over the batch: same as the expanded [B, T]
        x = randn((B, T, H, D), torch.float32, DEVICE, seed=6)
        a = inplace_rope(x.clone(), cos, sin, pos)
        b = inplace_rope(x.clone(), cos, sin, pos.expand(B, T))
        assert torch.equal(a, b)


def test_non_contiguous_position_ids_and_tables():
    B, T, H, D, R = 2, 12, 3, 24, 16
    g = torch.Generator().manual_seed(8)
    pos = torch.randint(0, 30, (T, B), generator=g).to(DEVICE).t()  # transposed
    cos, sin = _tables(30, R)
    cos_t = cos.t().contiguous().t()  # column-major table
    sin_p = torch.cat([sin, sin], dim=1)[:, : R // 2]  # padded rows
    _check(randn((B, T, H, D), torch.float32, DEVICE, seed=9), cos_t, sin_p, pos)


@pytest.mark.parametrize("table_dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_table_dtypes_used_as_fp32(table_dtype):
    cos, sin = _tables(16, 32, dtype=table_dtype)
    _check(randn((2, 16, 3, 48), torch.float32, DEVICE, seed=10), cos, sin)


@pytest.mark.parametrize("dtype", DTYPES)
def test_single_head(dtype):
    # H = 1 (DeepSeek-V4 shared K=V head)
    cos, sin = _tables(64 if not ON_GPU else 4096, 64)
    shape = (2, 64, 1, 512) if not ON_GPU else (2, 4096, 1, 512)
    _check(randn(shape, dtype, DEVICE, seed=11), cos, sin)


@pytest.mark.parametrize("dtype", DTYPES)
def test_slice_of_larger_tensor(dtype):
    """``x = big[..., :512]`` of ``[2, 128, 16, 640]``: only x's rope channels change; the rest of big is
    bitwise unchanged; the gradient flows through the view to big's base."""
    base = randn((2, 128, 16, 640), dtype, DEVICE, seed=12).requires_grad_(True)
    cos, sin = _tables(128, 64)
    big = base.clone()
    x = big[..., :512]
    y = inplace_rope(x, cos, sin)
    assert y is x
    assert_close("outside the view", base[..., 512:], big[..., 512:], "EXACT")
    assert_close("nope", base[..., :448], big[..., :448], "EXACT")
    want = ref.inplace_rope(base.detach().double()[..., :512].clone(), cos.double(), sin.double())
    assert_close("rope", want[..., 448:], big[..., 448:512], "E-fwd")
    dbig = randn(big.shape, dtype, DEVICE, seed=13)
    big.backward(dbig)
    br = base.detach().double().requires_grad_(True)
    bigr = br.clone()
    ref.inplace_rope(bigr[..., :512], cos.double(), sin.double())
    bigr.backward(dbig.double())
    assert_close("dbase rope", br.grad[..., 448:512], base.grad[..., 448:512], "E-bwd")
    assert_close("dbase rest", dbig[..., :448], base.grad[..., :448], "EXACT")
    assert_close("dbase outside", dbig[..., 512:], base.grad[..., 512:], "EXACT")


@pytest.mark.parametrize("H", [1, 3])
def test_transposed_view(H):
    """``[B, H, T, D].transpose(1, 2)``: contiguous for H = 1, strided for H > 1."""
    B, T, D, R = 2, 24, 40, 32
    store = randn((B, H, T, D), torch.float32, DEVICE, seed=14)
    before = store.clone()
    x = store.transpose(1, 2)
    assert x.is_contiguous() == (H == 1)
    cos, sin = _tables(T, R)
    y = inplace_rope(x, cos, sin)
    assert y is x
    want = ref.inplace_rope(before.transpose(1, 2).double(), cos.double(), sin.double())
    assert_close("rope", want[..., D - R:], store.transpose(1, 2)[..., D - R:], "E-fwd")
    assert_close("nope", before[..., : D - R], store[..., : D - R], "EXACT")
    _check(before.transpose(1, 2), cos, sin)


def test_channel_stride_not_one():
    """Channels strided in memory (``[B, T, D, H]`` storage seen as ``[B, T, H, D]``)."""
    cos, sin = _tables(12, 16)
    store = randn((2, 12, 24, 3), torch.float32, DEVICE, seed=42)
    _check(store.transpose(-1, -2), cos, sin)
    _check(store.transpose(-1, -2), cos, sin, dy=randn((2, 12, 24, 3), torch.float32, DEVICE, seed=43).mT)


def test_bf16():
    """bf16 (on CPU through the interpreter shim: an fp32 working copy, rounded once on copy back)."""
    cos, sin = _tables(32, 64)
    _check(randn((2, 32, 3, 96), torch.bfloat16, DEVICE, seed=44), cos, sin)
    _check(randn((2, 32, 3, 96), torch.bfloat16, DEVICE, seed=45), cos, sin, inverse=True, inplace_backward=False)
    big = randn((2, 32, 3, 128), torch.bfloat16, DEVICE, seed=46)
    before = big.clone()
    inplace_rope(big[..., :96], cos, sin)
    assert torch.equal(big[..., 96:], before[..., 96:]) and torch.equal(big[..., :32], before[..., :32])


def test_inverse_undoes_forward():
    cos, sin = _tables(64, 64)
    for dtype in DTYPES:
        x = randn((2, 64, 4, 128), dtype, DEVICE, seed=15)
        y = inplace_rope(inplace_rope(x.clone(), cos, sin), cos, sin, inverse=True)
        assert_close(f"inverse(rope(x)) {dtype}", x.double(), y, "E-fwd")
        assert torch.equal(y[..., :64], x[..., :64])


def test_gradient_is_opposite_rotation():
    # backward of rope = inverse rope of dy, and backward of inverse rope = rope of dy (same kernel)
    cos, sin = _tables(32, 32)
    dy = randn((2, 32, 3, 48), torch.float32, DEVICE, seed=16)
    for inverse in (False, True):
        w = randn((2, 32, 3, 48), torch.float32, DEVICE, seed=17).requires_grad_(True)
        inplace_rope(w.clone(), cos, sin, inverse=inverse).backward(dy.clone())
        want = inplace_rope(dy.clone(), cos, sin, inverse=not inverse)
        assert torch.equal(w.grad, want)


def test_stride0_gradient_not_written():
    """``dy`` with stride 0 (as from ``.sum()``): correct gradient, the expanded buffer untouched."""
    cos, sin = _tables(16, 32)
    shape = (2, 16, 3, 48)
    src = randn((48,), torch.float32, DEVICE, seed=18)
    src_before = src.clone()
    dy = src.expand(shape)
    _check(randn(shape, torch.float32, DEVICE, seed=19), cos, sin, dy=dy)
    assert torch.equal(src, src_before)
    w = randn(shape, torch.float16, DEVICE, seed=20).requires_grad_(True)
    inplace_rope(w.clone(), cos, sin).sum().backward()
    wr = w.detach().double().requires_grad_(True)
    ref.inplace_rope(wr.clone(), cos.double(), sin.double()).sum().backward()
    assert_close("dx from .sum()", wr.grad, w.grad, "E-bwd")


def test_transposed_gradient():
    cos, sin = _tables(16, 32)
    dy = randn((2, 3, 16, 48), torch.float32, DEVICE, seed=21).transpose(1, 2)  # non-contiguous
    _, _, dy_after = _check(randn((2, 16, 3, 48), torch.float32, DEVICE, seed=22), cos, sin, dy=dy)
    assert dy_after is dy


def test_inplace_backward_modes():
    """``inplace_backward=True`` rotates the caller's gradient buffer (documented); ``False`` leaves it."""
    cos, sin = _tables(16, 32)
    shape = (2, 16, 3, 48)
    for inplace_backward in (True, False):
        dy = randn(shape, torch.float32, DEVICE, seed=23)
        dy_before = dy.clone()
        w = randn(shape, torch.float32, DEVICE, seed=24).requires_grad_(True)
        inplace_rope(w.clone(), cos, sin, inplace_backward=inplace_backward).backward(dy)
        if inplace_backward:
            assert torch.equal(dy, w.grad) and not torch.equal(dy, dy_before)
        else:
            assert torch.equal(dy, dy_before)
        _check(w, cos, sin, inplace_backward=inplace_backward)


def test_shared_gradient_needs_out_of_place_backward():
    """``y = inplace_rope(x) + v``: both branches receive the same gradient tensor."""
    cos, sin = _tables(16, 32)
    shape = (2, 16, 3, 48)
    w = randn(shape, torch.float32, DEVICE, seed=25).requires_grad_(True)
    v = randn(shape, torch.float32, DEVICE, seed=26).requires_grad_(True)
    dy = randn(shape, torch.float32, DEVICE, seed=27)
    (inplace_rope(w.clone(), cos, sin, inplace_backward=False) + v).backward(dy)
    wr = w.detach().double().requires_grad_(True)
    ref.inplace_rope(wr.clone(), cos.double(), sin.double()).backward(dy.double())
    assert_close("dx", wr.grad, w.grad, "E-bwd")
    assert torch.equal(v.grad, dy)


def test_no_grad_and_return_identity():
    cos, sin = _tables(8, 16)
    x = randn((1, 8, 2, 16), torch.float16, DEVICE, seed=28)
    with torch.no_grad():
        assert inplace_rope(x, cos, sin) is x
    assert inplace_rope(x, cos, sin) is x


def test_leaf_requiring_grad_is_rejected():
    cos, sin = _tables(8, 16)
    x = randn((1, 8, 2, 16), torch.float32, DEVICE, seed=29).requires_grad_(True)
    with pytest.raises(RuntimeError, match="leaf"):
        inplace_rope(x, cos, sin)


def test_empty():
    cos, sin = _tables(8, 16)
    for shape in [(2, 0, 3, 16), (0, 8, 3, 16), (2, 8, 0, 16), (0, 3, 16)]:
        w = torch.empty(shape, device=DEVICE).requires_grad_(True)
        y = inplace_rope(w.clone(), cos, sin)
        assert y.shape == shape
        y.sum().backward()
        assert w.grad.shape == shape


def test_reference_backend_matches():
    cos, sin = _tables(16, 32)
    w = randn((2, 16, 3, 48), torch.float32, DEVICE, seed=30)
    _check(w, cos, sin)
    with mindspeed_ops.use_backend("reference", ops=["inplace_rope"]):
        _check(w, cos, sin)
        _check(w, cos, sin, inplace_backward=False, inverse=True)


def test_positions_out_of_range():
    cos, sin = _tables(16, 32)
    x = randn((2, 16, 3, 48), torch.float32, "cpu", seed=31)
    for bad in (16, -1):
        pos = torch.arange(16).repeat(2, 1)
        pos[1, 5] = bad
        with pytest.raises(IndexError, match=r"position_ids must lie in \[0, T_max\)"):
            ref.inplace_rope(x.clone(), cos.cpu(), sin.cpu(), pos)
        with pytest.raises(IndexError, match=r"position_ids must lie in \[0, T_max\)"):
            inplace_rope(x.clone(), cos.cpu(), sin.cpu(), pos)  # CPU tensors are checked
    with pytest.raises(IndexError, match="T = 20"):
        inplace_rope(randn((1, 20, 2, 48), torch.float32, DEVICE), cos, sin)
    with pytest.raises(IndexError, match="T = 20"):
        ref.inplace_rope(randn((1, 20, 2, 48), torch.float64, "cpu"), cos.cpu(), sin.cpu())


def test_bad_input():
    cos, sin = _tables(16, 32)
    x = randn((2, 16, 3, 48), torch.float32, DEVICE, seed=32)
    with pytest.raises(ValueError, match=r"R = 2\*cos.shape\[-1\] = 32 must be <= the head dim D = 24"):
        inplace_rope(x[..., :24], cos, sin)
    with pytest.raises(ValueError, match="x must be 3 or 4-D"):
        inplace_rope(x[0, 0], cos, sin)
    with pytest.raises(TypeError, match="float64"):
        inplace_rope(x.double(), cos, sin)
    with pytest.raises(TypeError, match="x must have dtype"):
        inplace_rope(x.to(torch.int32), cos, sin)
    with pytest.raises(TypeError, match="cos must have dtype"):
        inplace_rope(x, cos.to(torch.int32), sin)
    with pytest.raises(ValueError, match=r"sin must have the shape of cos \[16, 16\], got \[16, 8\]"):
        inplace_rope(x, cos, sin[:, :8])
    with pytest.raises(ValueError, match="cos must be 2-D"):
        inplace_rope(x, cos[None], sin[None])
    with pytest.raises(TypeError, match="position_ids must have dtype int32/int64"):
        inplace_rope(x, cos, sin, torch.zeros(2, 16, device=DEVICE))
    with pytest.raises(ValueError, match=r"position_ids must have shape \[B, T\] = \[2, 16\], got \[3, 16\]"):
        inplace_rope(x, cos, sin, torch.zeros(3, 16, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match=r"position_ids must have shape \[T\] = \[16\], got \[15\]"):
        inplace_rope(x, cos, sin, torch.zeros(15, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="position_ids must be 1-D"):
        inplace_rope(x[0], cos, sin, torch.zeros(1, 16, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="must not have overlapping elements"):
        inplace_rope(x[:1].expand(2, 16, 3, 48), cos, sin)
    with pytest.raises(ValueError, match="R/2 >= 1"):
        inplace_rope(x, cos[:, :0], sin[:, :0])
    if ON_GPU:
        with pytest.raises(ValueError, match="cos is on cpu"):
            inplace_rope(x, cos.cpu(), sin.cpu())


def test_deterministic():
    cos, sin = _tables(32, 64)
    w = randn((2, 32, 4, 128), torch.float16, DEVICE, seed=33)
    outs = []
    for _ in range(2):
        x = w.clone().requires_grad_(True)
        y = inplace_rope(x * 1, cos, sin)
        y.backward(torch.ones_like(y))
        outs.append((y.detach(), x.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_non_overlapping_helper():
    t = torch.empty(2, 3, 4)
    assert non_overlapping(t) and non_overlapping(t.transpose(0, 2)) and non_overlapping(t[..., ::2])
    assert not non_overlapping(t[:1].expand(2, 3, 4))
    assert not non_overlapping(torch.empty(8).as_strided((3, 3), (2, 1)))


def test_opcheck():
    cos, sin = _tables(16, 32)
    x = randn((2, 16, 3, 48), torch.float32, DEVICE, seed=34)
    pos = torch.arange(16, device=DEVICE, dtype=torch.int32).flip(0).contiguous()
    torch.library.opcheck(torch.ops.mindspeed_ops.inplace_rope, (x.clone(), cos, sin, None, False))
    torch.library.opcheck(torch.ops.mindspeed_ops.inplace_rope, (x.clone(), cos, sin, pos, True))
    torch.library.opcheck(torch.ops.mindspeed_ops.inplace_rope, (x[:, :, :2].clone()[0], cos, sin, pos, False))
    torch.library.opcheck(torch.ops.mindspeed_ops.inplace_rope_bwd, (x, cos, sin, pos, False))
    torch.library.opcheck(torch.ops.mindspeed_ops.inplace_rope_bwd, (x[..., 8:], cos, sin, None, True))
    torch.library.opcheck(torch.ops.mindspeed_ops.inplace_rope_bwd,
                          (x.clone().requires_grad_(True), cos, sin, pos, False))


@pytest.mark.parametrize("inplace_backward", [True, False])
def test_compile_fullgraph(inplace_backward):
    cos, sin = _tables(16, 32)
    pos = torch.arange(16, device=DEVICE)

    def f(w, v):
        q = w * 2.0
        y = inplace_rope(q, cos, sin, pos, inplace_backward=inplace_backward)
        y = inplace_rope(y * v, cos, sin, inverse=True, inplace_backward=inplace_backward)
        return y if inplace_backward else y + v

    w = randn((2, 16, 3, 48), torch.float32, DEVICE, seed=35).requires_grad_(True)
    v = randn((2, 16, 3, 48), torch.float32, DEVICE, seed=36)
    dy = randn((2, 16, 3, 48), torch.float32, DEVICE, seed=37)
    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True)(w, v)
    out.backward(dy.clone())
    w2 = w.detach().clone().requires_grad_(True)
    out2 = f(w2, v)
    out2.backward(dy.clone())
    assert_close("compiled out", out2.detach(), out.detach(), "E-fwd")
    assert_close("compiled grad", w2.grad, w.grad, "E-bwd")


def test_compile_without_grad():
    """No autograd recorded: the op alone (in place on a graph input, a view of a larger tensor)."""
    cos, sin = _tables(16, 32)
    f = torch.compile(lambda t: inplace_rope(t, cos, sin, inverse=True), fullgraph=True)
    big = randn((2, 16, 3, 64), torch.float32, DEVICE, seed=41)
    before = big.clone()
    x = big[..., 8:56]
    torch._dynamo.reset()
    y = f(x)
    assert y is x
    want = ref.inplace_rope(before[..., 8:56].double(), cos.double(), sin.double(), inverse=True)
    assert_close("rope", want[..., 16:], big[..., 24:56], "E-fwd")
    assert torch.equal(big[..., :24], before[..., :24]) and torch.equal(big[..., 56:], before[..., 56:])


@pytest.mark.large
def test_large_int64_offsets():
    H, D = 16, 128
    T = 2**31 // (H * D) + 3
    cos, sin = _tables(T, 64)
    x = torch.empty(1, T, H, D, dtype=torch.bfloat16, device=DEVICE)
    x.normal_(generator=torch.Generator(DEVICE).manual_seed(37))
    tail = x[:, -5:].clone()
    y = inplace_rope(x, cos, sin)
    want = ref.inplace_rope(tail.double(), cos[-5:].double(), sin[-5:].double())
    assert_close("last tokens", want, y[:, -5:], "E-fwd")


def test_double_backward():
    # create_graph=True: the gradient is itself differentiable w.r.t. the upstream gradient
    cos, sin = _tables(16, 32)
    w = randn((2, 16, 3, 48), torch.float32, DEVICE, seed=38).requires_grad_(True)
    dy = randn((2, 16, 3, 48), torch.float32, DEVICE, seed=39).requires_grad_(True)
    v = randn((2, 16, 3, 48), torch.float32, DEVICE, seed=40)
    (dx,) = torch.autograd.grad(inplace_rope(w * 1, cos, sin), w, dy, create_graph=True)
    (ddy,) = torch.autograd.grad(dx, dy, v)
    wr, dyr = w.detach().double().requires_grad_(True), dy.detach().double().requires_grad_(True)
    (dxr,) = torch.autograd.grad(ref.inplace_rope(wr * 1, cos.double(), sin.double()), wr, dyr, create_graph=True)
    (ddyr,) = torch.autograd.grad(dxr, dyr, v.double())
    assert_close("dx", dxr, dx, "E-bwd")
    assert_close("d(dx)/d(dy)", ddyr, ddy, "E-bwd")
