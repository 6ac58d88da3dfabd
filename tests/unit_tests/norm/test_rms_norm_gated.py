"""rms_norm_gated / FusedRMSNormGated (SPEC 1.3): kernel vs float64 reference, model formulas
(Qwen3-Next, Kimi-Linear), edges, layouts, errors, registration."""
import importlib

import pytest
import torch
import torch.nn.functional as F

import mindspeed_ops
from mindspeed_ops.api.triton.rms_norm_gated import FusedRMSNormGated, rms_norm_gated
from mindspeed_ops.ops.norm.gated import reference as ref
from mindspeed_ops.testing import (assert_close, assert_unchanged, non_contiguous, randn, snapshot, to_ref)
from tests.conftest import DEVICE, DTYPES, ON_GPU

# the launcher module (the package attribute of the same name is the public function)
launch = importlib.import_module("mindspeed_ops.ops.norm.gated.rms_norm_gated")


# ------------------------------------------------------------------------------------------------
# Model formulas, re-implemented literally in plain PyTorch (independent of the library)


def qwen3_next_gated_norm(hidden_states, gate, weight, eps=1e-6):
    """Qwen3-Next / Qwen3.5 GatedDeltaNet output norm (HF ``Qwen3NextRMSNormGated.forward``)."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    hidden_states = weight * hidden_states.to(input_dtype)
    hidden_states = hidden_states * F.silu(gate.to(torch.float32))
    return hidden_states.to(input_dtype)


def kimi_linear_gated_norm(x, gate, weight, eps=1e-5):
    """Kimi-Linear KDA output norm: fp32 RMSNorm, fp32 weight, sigmoid gate, one rounding."""
    xf = x.to(torch.float32)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = y * weight.to(torch.float32)
    y = y * torch.sigmoid(gate.to(torch.float32))
    return y.to(x.dtype)


# ------------------------------------------------------------------------------------------------
# Helpers


def _inputs(rows, D, dtype, *, weight=True, bias=False, residual=False, seed=0, gdtype=None, wdtype=None,
            rdtype=None):
    t = {"x": randn((rows, D), dtype, DEVICE, seed=seed),
         "g": randn((rows, D), gdtype or dtype, DEVICE, seed=seed + 1, scale=2.0)}
    t["weight"] = randn((D,), wdtype or dtype, DEVICE, seed=seed + 2, scale=0.5, shift=1.0) if weight else None
    t["bias"] = randn((D,), wdtype or dtype, DEVICE, seed=seed + 3, scale=0.3) if bias else None
    t["residual"] = randn((rows, D), rdtype or dtype, DEVICE, seed=seed + 4) if residual else None
    return t


def _check(t, dy=None, dres=None, fwd_class="E-fwd", **kw):
    """Forward and backward of the op against autograd of the float64 reference; checks that no
    input (nor the upstream gradients) is modified. Returns (outputs, grads dict)."""
    names = [n for n in ("x", "g", "weight", "bias", "residual") if t.get(n) is not None]
    leaves = {n: t[n].detach().requires_grad_(True) if t[n].is_leaf else t[n] for n in names}
    for n in names:
        if not leaves[n].is_leaf:
            leaves[n].retain_grad()
    before = snapshot(*[leaves[n] for n in names])
    args = {n: leaves.get(n) for n in ("x", "g", "weight", "bias", "residual")}
    out = rms_norm_gated(**args, **kw)
    outs = out if isinstance(out, tuple) else (out,)
    dy = randn(outs[0].shape, outs[0].dtype, DEVICE, seed=101) if dy is None else dy
    cots = [dy]
    if len(outs) == 2:
        dres = randn(outs[1].shape, outs[1].dtype, DEVICE, seed=102) if dres is None else dres
        cots.append(dres)
    cot_before = snapshot(*cots)
    torch.autograd.backward(list(outs), cots)
    assert_unchanged(before + cot_before, *[leaves[n] for n in names], *cots, names=names + ["dy", "dres"][:len(cots)])

    refs = dict(zip(names, to_ref(*[leaves[n] for n in names], requires_grad=True)))
    rout = ref.rms_norm_gated(**{n: refs.get(n) for n in ("x", "g", "weight", "bias", "residual")}, **kw)
    routs = rout if isinstance(rout, tuple) else (rout,)
    torch.autograd.backward(list(routs), [c.double() for c in cots])
    assert outs[0].dtype == t["x"].dtype and outs[0].shape == t["x"].shape
    for i, (o, r) in enumerate(zip(outs, routs)):
        assert_close(f"out[{i}]", r, o, fwd_class)
    grads = {}
    for n in names:
        g = leaves[n].grad
        assert g is not None and g.dtype == leaves[n].dtype and g.shape == leaves[n].shape, n
        assert_close(f"d{n}", refs[n].grad, g, "E-bwd")
        grads[n] = g
    return outs, grads


def _group(D):
    return D // 4 if D % 4 == 0 else D // 2


# Must-test (B, H, T, D) row sets, flattened to [B*H*T, D]; CPU uses fewer T (interpreter budget).
ROWS = ([(2, 2, 1, 64), (2, 2, 50, 50), (2, 2, 512, 128), (2, 2, 2048, 1200), (2, 32, 1024, 128)] if ON_GPU else
        [(2, 2, 1, 64), (2, 2, 50, 50), (2, 2, 40, 128), (2, 2, 6, 1200)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("activation", ["swish", "sigmoid"])
@pytest.mark.parametrize("bhtd", ROWS, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(bhtd, activation, norm_before_gate, grouped, dtype):
    B, H, T, D = bhtd
    t = _inputs(B * H * T, D, dtype, bias=norm_before_gate != grouped, seed=sum(bhtd))
    _check(t, activation=activation, norm_before_gate=norm_before_gate, group_size=_group(D) if grouped else None)


def test_silu_is_swish():
    t = _inputs(9, 48, torch.float32, seed=3)
    a = rms_norm_gated(t["x"], t["g"], t["weight"], activation="silu")
    b = rms_norm_gated(t["x"], t["g"], t["weight"], activation="swish")
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", ["none", "bias_only", "weight_only"])
def test_optional_weight_and_bias(affine, dtype):
    t = _inputs(40, 96, dtype, weight=affine == "weight_only", bias=affine == "bias_only", seed=4)
    _check(t, activation="sigmoid")
    _check(t, norm_before_gate=False, group_size=32)


@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_gate_zero_swish(norm_before_gate):
    t = _inputs(33, 64, torch.float32, seed=5)
    t["g"] = torch.zeros_like(t["g"])
    outs, grads = _check(t, norm_before_gate=norm_before_gate)
    assert (outs[0] == 0).all()
    assert (grads["weight"] == 0).all()
    assert (grads["x"] == 0).all()
    assert grads["g"].abs().sum() > 0
    if norm_before_gate:  # dg = dy ⊙ y0 / 2 with y0 = x̂ ⊙ w
        x64, w64 = t["x"].double(), t["weight"].double()
        y0 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
        dy = randn((33, 64), torch.float32, DEVICE, seed=101).double()
        assert_close("dg at g=0", dy * y0 / 2, grads["g"], "E-bwd")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual_in_fp32", [False, True])
@pytest.mark.parametrize("prenorm", [False, True])
def test_residual(prenorm, residual_in_fp32, dtype):
    t = _inputs(50, 80, dtype, residual=True, bias=True, seed=6)
    outs, grads = _check(t, prenorm=prenorm, residual_in_fp32=residual_in_fp32)
    assert torch.equal(grads["x"], grads["residual"])
    if prenorm:
        y, ro = outs
        assert ro.dtype == (torch.float32 if residual_in_fp32 else dtype)
        assert_close("residual_out", t["x"].double() + t["residual"].double(), ro, "E-fwd")
        # dx = d(norm path) + d(residual_out): the residual_out gradient is added, not multiplied
        dres = randn(ro.shape, ro.dtype, DEVICE, seed=102)
        x, r = t["x"].detach().requires_grad_(), t["residual"].detach().requires_grad_()
        y2, ro2 = rms_norm_gated(x, t["g"], t["weight"], t["bias"], residual=r, prenorm=True,
                                 residual_in_fp32=residual_in_fp32)
        torch.autograd.backward([y2, ro2], [randn(y2.shape, y2.dtype, DEVICE, seed=101), torch.zeros_like(ro2)])
        assert_close("dx = dnorm + dres", x.grad.double() + dres.double(), grads["x"], "E-bwd")


@pytest.mark.parametrize("residual_in_fp32", [False, True])
def test_prenorm_without_residual(residual_in_fp32):
    t = _inputs(20, 64, torch.float16, seed=7)
    (y, ro), grads = _check(t, prenorm=True, residual_in_fp32=residual_in_fp32)
    assert torch.equal(ro.to(torch.float16), t["x"]) and ro.data_ptr() != t["x"].data_ptr()


def test_residual_mixed_dtypes():
    t = _inputs(24, 64, torch.float16, residual=True, seed=8, rdtype=torch.float32, gdtype=torch.float32,
                wdtype=torch.float32)
    _check(t, prenorm=True, residual_in_fp32=True)


# ------------------------------------------------------------------------------------------------
# Model formulas (hot shape [B*T*32, 128])

QWEN_ROWS = 4 * 4096 * 32 if ON_GPU else 2 * 8 * 32
MODEL_DTYPES = [torch.bfloat16, torch.float16]  # the launcher's shim runs bf16 exactly under the interpreter


@pytest.mark.parametrize("dtype", MODEL_DTYPES)
@pytest.mark.parametrize("wdtype", ["same", torch.float32])
def test_qwen3_next_formula(wdtype, dtype):
    wdtype = dtype if wdtype == "same" else wdtype
    t = _inputs(QWEN_ROWS, 128, dtype, wdtype=wdtype, seed=9)
    want = qwen3_next_gated_norm(t["x"], t["g"], t["weight"], eps=1e-6)
    y = rms_norm_gated(t["x"], t["g"], t["weight"], activation="swish", eps=1e-6, casting="input")
    assert y.dtype == dtype
    assert_close("qwen3-next formula", want, y, "E-fwd")
    # the kernel reproduces the rounding order: nearly every element is bitwise equal
    assert (y == want).float().mean() > 0.99
    # and the reference backend is the formula itself
    with mindspeed_ops.use_backend("reference"):
        yr = rms_norm_gated(t["x"], t["g"], t["weight"], eps=1e-6, casting="input")
    assert_close("reference vs formula", want, yr, "E-fwd")
    # gradients: the rounding-free math, against the float64 oracle
    _check(dict(t, x=t["x"][:256], g=t["g"][:256]), eps=1e-6, casting="input")


@pytest.mark.parametrize("dtype", MODEL_DTYPES)
def test_kimi_linear_formula(dtype):
    t = _inputs(QWEN_ROWS, 128, dtype, wdtype=torch.float32, seed=10)
    norm = FusedRMSNormGated(128, eps=1e-5, activation="sigmoid", device=DEVICE, dtype=torch.float32)
    with torch.no_grad():
        norm.weight.copy_(t["weight"])
    want = kimi_linear_gated_norm(t["x"], t["g"], norm.weight, eps=1e-5)
    y = norm(t["x"], t["g"])
    assert y.dtype == dtype
    assert_close("kimi-linear formula", want, y, "E-fwd")
    _check(dict(t, x=t["x"][:256], g=t["g"][:256]), activation="sigmoid", eps=1e-5)


def test_casting_input_fp32_equals_fp32_casting():
    t = _inputs(30, 64, torch.float32, seed=11)
    a = rms_norm_gated(t["x"], t["g"], t["weight"], casting="input")
    b = rms_norm_gated(t["x"], t["g"], t["weight"], casting="fp32")
    assert_close("fp32 input casting", b, a, 1e-6)


def test_casting_input_rounds_intermediates():
    """fp16 x with an fp32 weight: h is rounded to fp16 before the weight multiply (Qwen3-Next order)."""
    t = _inputs(64, 128, torch.float16, wdtype=torch.float32, seed=12)
    y_in = rms_norm_gated(t["x"], t["g"], t["weight"], casting="input")
    want = qwen3_next_gated_norm(t["x"], t["g"], t["weight"])
    assert (y_in == want).float().mean() > 0.99


# ------------------------------------------------------------------------------------------------
# Long rows (looped path)


@pytest.mark.parametrize("D, rows", [(8192, 3), (65536, 1)])
def test_long_rows(D, rows):
    t = _inputs(rows, D, torch.float32, bias=True, seed=13)
    _check(t)
    _check(t, activation="sigmoid", norm_before_gate=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("group_size", [None, 48])
def test_looped_path_small_tiles(monkeypatch, group_size, norm_before_gate, dtype):
    """The looped kernels with tiny chunks: partial last chunk, programs owning several rows, groups,
    residual + prenorm, casting='input'."""
    monkeypatch.setattr(launch, "MAX_TILE_N", 32)
    monkeypatch.setattr(launch, "LOOP_BN", 32)
    monkeypatch.setattr(launch, "BWD_PROGRAMS_PER_SM", 1)  # 4 (or 2) programs of 2 (or 4) rows each
    t = _inputs(7, 80 if group_size is None else 96, dtype, bias=True, residual=True, seed=14)
    _check(t, prenorm=True, norm_before_gate=norm_before_gate, group_size=group_size)
    if norm_before_gate and group_size is None:
        _check(dict(t, bias=None, residual=None), casting="input")


@pytest.mark.parametrize("looped", [False, True])
def test_outputs_fully_written(monkeypatch, looped):
    """Every output, partial and scratch buffer is NaN-poisoned before the kernels run: nothing unwritten."""
    real_empty = launch._empty
    monkeypatch.setattr(launch, "_empty", lambda *shape, dtype, device: real_empty(*shape, dtype=dtype,
                                                                                 device=device).fill_(float("nan")))
    if looped:
        monkeypatch.setattr(launch, "MAX_TILE_N", 32)
        monkeypatch.setattr(launch, "LOOP_BN", 32)
    t = _inputs(45, 96, torch.float16, bias=True, residual=True, seed=40)
    _check(t, prenorm=True, group_size=48)
    _check(dict(t, residual=None), norm_before_gate=False)


# ------------------------------------------------------------------------------------------------
# Layouts, invariances, determinism


def test_non_contiguous_inputs_and_grads():
    t = _inputs(33, 96, torch.float32, bias=True, residual=True, seed=16)
    nc = {n: (non_contiguous(v) if v is not None and v.dim() == 2 else v) for n, v in t.items()}
    wide = randn((2 * 96,), torch.float32, DEVICE, seed=17)
    nc["weight"] = wide[::2]  # strided weight
    _check(nc, prenorm=True)
    tr = dict(t, x=non_contiguous(t["x"], "transpose"), g=non_contiguous(t["g"], "transpose"))
    _check(tr, group_size=32)
    # 3-D input, stride-0 upstream gradient from .sum()
    x = randn((3, 11, 64), torch.float32, DEVICE, seed=18).requires_grad_()
    g = randn((3, 11, 64), torch.float32, DEVICE, seed=19).requires_grad_()
    w = randn((64,), torch.float32, DEVICE, seed=20).requires_grad_()
    rms_norm_gated(x, g, w).sum().backward()
    xr, gr, wr = to_ref(x, g, w, requires_grad=True)
    ref.rms_norm_gated(xr, gr, wr).sum().backward()
    for n, a, b in [("dx", xr.grad, x.grad), ("dg", gr.grad, g.grad), ("dw", wr.grad, w.grad)]:
        assert_close(f"{n} from .sum()", a, b, "E-bwd")
    # transposed upstream gradients (dy and d residual_out)
    t = _inputs(40, 64, torch.float32, residual=True, seed=21)
    _check(t, dy=randn((64, 40), torch.float32, DEVICE, seed=22).t(),
           dres=randn((64, 40), torch.float32, DEVICE, seed=23).t(), prenorm=True)


def test_batch_size_invariance():
    t = _inputs(300, 128, torch.float16, seed=24)
    y = rms_norm_gated(t["x"], t["g"], t["weight"])
    for r in (0, 137, 299):
        y1 = rms_norm_gated(t["x"][r:r + 1], t["g"][r:r + 1], t["weight"])
        assert torch.equal(y[r:r + 1], y1)


def test_deterministic():
    t = _inputs(300, 128, torch.float16, bias=True, residual=True, seed=25)
    runs = []
    for _ in range(2):
        leaves = {n: v.detach().requires_grad_() for n, v in t.items()}
        y, ro = rms_norm_gated(**leaves, prenorm=True)
        torch.autograd.backward([y, ro], [torch.ones_like(y), torch.ones_like(ro)])
        runs.append([y, ro] + [leaves[n].grad for n in ("x", "g", "weight", "bias", "residual")])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_empty():
    x = torch.empty(0, 64, device=DEVICE, requires_grad=True)
    g = torch.empty(0, 64, device=DEVICE, requires_grad=True)
    w = torch.ones(64, device=DEVICE, requires_grad=True)
    y = rms_norm_gated(x, g, w)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert x.grad.shape == (0, 64) and g.grad.shape == (0, 64)
    assert torch.equal(w.grad, torch.zeros(64, device=DEVICE))


# ------------------------------------------------------------------------------------------------
# Module, errors, registration


def test_module():
    norm = FusedRMSNormGated(64, device=DEVICE)
    assert norm.eps == 1e-5 and torch.equal(norm.weight.detach(), torch.ones(64, device=DEVICE))
    assert norm.bias is None and "64" in repr(norm)
    with torch.no_grad():
        norm.weight.mul_(randn((64,), torch.float32, DEVICE, seed=26))
    t = _inputs(16, 64, torch.float32, seed=27)
    x = t["x"].requires_grad_()
    y = norm(x, t["g"])
    y.backward(randn(y.shape, y.dtype, DEVICE, seed=28))
    assert norm.weight.grad is not None and norm.weight.grad.shape == (64,)
    assert_close("module", ref.rms_norm_gated(x.double(), t["g"].double(), norm.weight.double(), eps=1e-5), y, "E-fwd")
    plain = FusedRMSNormGated(64, elementwise_affine=False, group_size=16, norm_before_gate=False, device=DEVICE)
    assert plain.weight is None and len(list(plain.parameters())) == 0
    y, ro = plain(t["x"], t["g"], residual=t["x"], prenorm=True, residual_in_fp32=True)
    assert ro.dtype == torch.float32
    with pytest.raises(ValueError, match="activation"):
        FusedRMSNormGated(64, activation="relu")
    with pytest.raises(ValueError, match="group_size must divide"):
        FusedRMSNormGated(64, group_size=48)
    with pytest.raises(ValueError, match="casting='input'"):
        FusedRMSNormGated(64, casting="input", norm_before_gate=False)


def test_bad_input():
    t = _inputs(4, 64, torch.float32, bias=True, residual=True, seed=29)
    x, g, w, b, r = t["x"], t["g"], t["weight"], t["bias"], t["residual"]
    with pytest.raises(ValueError, match="activation must be one of"):
        rms_norm_gated(x, g, w, activation="relu")
    with pytest.raises(ValueError, match="casting must be one of"):
        rms_norm_gated(x, g, w, casting="bf16")
    with pytest.raises(ValueError, match="group_size must divide D = 64, got 48"):
        rms_norm_gated(x, g, w, group_size=48)
    with pytest.raises(ValueError, match="group_size must be None or a positive int"):
        rms_norm_gated(x, g, w, group_size=0)
    for kw in [dict(bias=b), dict(residual=r), dict(group_size=16), dict(norm_before_gate=False)]:
        with pytest.raises(ValueError, match="casting='input'"):
            rms_norm_gated(x, g, w, casting="input", **kw)
    with pytest.raises(ValueError, match=r"g must have shape x.shape = \[4, 64\], got \[4, 32\]"):
        rms_norm_gated(x, g[:, :32], w)
    with pytest.raises(ValueError, match=r"residual must have shape"):
        rms_norm_gated(x, g, w, residual=r[:2])
    with pytest.raises(ValueError, match=r"weight must have shape \[D\] = \[64\], got \[63\]"):
        rms_norm_gated(x, g, w[:63])
    with pytest.raises(ValueError, match=r"bias must have shape"):
        rms_norm_gated(x, g, w, b[:10])
    with pytest.raises(ValueError, match="eps must be"):
        rms_norm_gated(x, g, w, eps=-1.0)
    with pytest.raises(ValueError, match="last dim D must be >= 1"):
        rms_norm_gated(x[:, :0], g[:, :0])
    with pytest.raises(TypeError, match="float64"):
        rms_norm_gated(x.double(), g, w)
    with pytest.raises(TypeError, match="float64"):
        rms_norm_gated(x, g, w.double())
    with pytest.raises(TypeError, match="x must have dtype"):
        rms_norm_gated(x.to(torch.int32), g, w)
    with pytest.raises(ValueError, match="one device"):
        rms_norm_gated(x, g, torch.ones(64, device="meta"))


@pytest.mark.parametrize("kw", [dict(), dict(prenorm=True, residual_in_fp32=True, residual=True, bias=True),
                                dict(group_size=16, norm_before_gate=False, activation="sigmoid", weight=False),
                                dict(casting="input", prenorm=True)], ids=["plain", "residual", "grouped", "input"])
def test_registration_and_compile(kw):
    kw = dict(kw)
    t = _inputs(6, 64, torch.float32, weight=kw.pop("weight", True), bias=kw.pop("bias", False),
                residual=kw.pop("residual", False), seed=30)
    opts = dict(eps=1e-6, activation=kw.get("activation", "swish"), group_size=kw.get("group_size"),
                norm_before_gate=kw.get("norm_before_gate", True), casting=kw.get("casting", "fp32"),
                prenorm=kw.get("prenorm", False), residual_in_fp32=kw.get("residual_in_fp32", False))
    args = [v.detach().requires_grad_() if v is not None else None
            for v in (t["x"], t["g"], t["weight"], t["bias"], t["residual"])]
    torch.library.opcheck(torch.ops.mindspeed_ops.rms_norm_gated, (*args, *opts.values()))
    f = torch.compile(lambda x, g, w, b, r: rms_norm_gated(x, g, w, b, residual=r, **kw), fullgraph=True)
    out = f(*args)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.float().sum() for o in outs).backward()
    want = ref.rms_norm_gated(*[None if a is None else a.detach().double() for a in args[:4]],
                              residual=None if args[4] is None else args[4].detach().double(), **kw)
    want = want if isinstance(want, tuple) else (want,)
    for o, w in zip(outs, want):
        assert_close("compiled", w, o, "E-fwd")
    assert args[0].grad is not None


def test_module_compiles():
    norm = FusedRMSNormGated(64, activation="sigmoid", device=DEVICE)
    t = _inputs(8, 64, torch.float32, seed=31)
    y = torch.compile(norm, fullgraph=True)(t["x"], t["g"])
    assert_close("compiled module", ref.rms_norm_gated(t["x"].double(), t["g"].double(), norm.weight.double(),
                                                       activation="sigmoid", eps=1e-5), y, "E-fwd")


@pytest.mark.parametrize("kw", [dict(), dict(norm_before_gate=False, group_size=16, activation="sigmoid"),
                                dict(prenorm=True, residual=True, bias=True),
                                dict(prenorm=True, residual_in_fp32=True, residual=True),
                                dict(casting="input"), dict(weight=False, bias=True, group_size=32)],
                         ids=["plain", "gate_first", "residual", "residual_fp32", "input", "bias_only"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_backend(kw, dtype):
    """The CPU reference backend (literal forward, closed-form backward) through the registered op."""
    kw = dict(kw)
    t = _inputs(20, 64, dtype, weight=kw.pop("weight", True), bias=kw.pop("bias", False),
                residual=kw.pop("residual", False), seed=32)
    with mindspeed_ops.use_backend("reference", ops=["rms_norm_gated"]):
        _check(t, **kw)
        if kw.get("prenorm"):
            args = [None if t[n] is None else t[n].detach().requires_grad_()
                    for n in ("x", "g", "weight", "bias", "residual")]
            torch.library.opcheck(torch.ops.mindspeed_ops.rms_norm_gated,
                                  (*args, 1e-6, "swish", None, True, "fp32", True, kw.get("residual_in_fp32", False)))


@pytest.mark.parametrize("kw", [dict(), dict(norm_before_gate=False, group_size=8, activation="sigmoid"),
                                dict(prenorm=True, residual=True, bias=True, group_size=16),
                                dict(prenorm=True, residual_in_fp32=True), dict(casting="input"),
                                dict(weight=False, bias=True, norm_before_gate=False)])
def test_reference_closed_form_backward(kw):
    """The reference backend's closed-form backward equals autograd through the reference (float64)."""
    kw = dict(kw)
    t = _inputs(6, 32, torch.float32, weight=kw.pop("weight", True), bias=kw.pop("bias", False),
                residual=kw.pop("residual", False), seed=41)
    names = ("x", "g", "weight", "bias", "residual")
    leaves = dict(zip(names, to_ref(*[t[n] for n in names], requires_grad=True)))
    out = ref.rms_norm_gated(**leaves, **kw)
    outs = out if isinstance(out, tuple) else (out,)
    cots = [randn(o.shape, torch.float64, DEVICE, seed=42 + i) for i, o in enumerate(outs)]
    torch.autograd.backward(list(outs), cots)
    opts = {k: v for k, v in kw.items()}
    got = ref.rms_norm_gated_bwd(cots[0], cots[1] if len(cots) > 1 else None, leaves["x"].detach(),
                                 leaves["g"].detach(), *[None if leaves[n] is None else leaves[n].detach()
                                                         for n in ("weight", "bias")],
                                 residual=None if leaves["residual"] is None else leaves["residual"].detach(), **opts)
    for n, gr in zip(names, got):
        if leaves[n] is None:
            assert gr is None
        else:
            assert_close(f"closed-form d{n}", leaves[n].grad, gr, 1e-12, 1e-14)


# ------------------------------------------------------------------------------------------------
# GPU: real sizes


@pytest.mark.gpu
@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float32])
def test_many_rows_dweight_bf16(wdtype):
    t = _inputs(4 * 4096 * 32, 128, torch.bfloat16, wdtype=wdtype, seed=33)
    _check(t)


@pytest.mark.large
def test_large_int64_offsets():
    rows = 2 ** 31 // 128 + 7
    x = torch.empty(rows, 128, dtype=torch.bfloat16, device=DEVICE).normal_()
    g = torch.empty(rows, 128, dtype=torch.bfloat16, device=DEVICE).normal_()
    w = randn((128,), torch.bfloat16, DEVICE, seed=34)
    y = rms_norm_gated(x, g, w)
    want = ref.rms_norm_gated(x[-5:].double(), g[-5:].double(), w.double())
    assert_close("last rows", want, y[-5:], "E-fwd")
