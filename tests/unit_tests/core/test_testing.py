"""mindspeed_ops.testing: the SPEC 0.9 metric, thresholds and input helpers."""
import math

import pytest
import torch

from mindspeed_ops import testing as T

f32, f16, bf16, f64 = torch.float32, torch.float16, torch.bfloat16, torch.float64

# SPEC 0.9 table, transcribed independently of testing.THRESHOLDS (class -> fp32, fp16, bf16).
SPEC_TABLE = {
    "E-fwd": (1e-5, 1e-3, 4e-3),
    "E-bwd": (1e-4, 2e-3, 8e-3),
    "SINK-fwd": (1e-5, 1e-3, 4e-3),
    "SINK-bwd": (1e-4, 2e-3, 8e-3),
    "TRIL": (1e-4, 2e-3, 5e-3),
    "LA-o": (1e-4, 5e-3, 5e-3),
    "LA-d": (2e-4, 8e-3, 8e-3),
    "LA-g": (1e-3, 2e-2, 2e-2),
}


def _ref(n=1000, seed=0):
    return T.randn((n,), f64, seed=seed)


# ---------------------------------------------------------------------------------------------
# thresholds


@pytest.mark.parametrize("cls", sorted(SPEC_TABLE))
def test_threshold_table_matches_spec(cls):
    for dtype, want in zip((f32, f16, bf16), SPEC_TABLE[cls]):
        assert T.threshold(cls, dtype) == want
        assert T.THRESHOLDS[cls][dtype] == want


def test_threshold_exact_and_stat():
    assert all(T.threshold("EXACT", d) == 0.0 for d in (f32, f16, bf16))
    assert T.threshold("STAT", f32) == 1e-5  # fp32 statistics; SPEC lists fp32 only


def test_threshold_classes_complete():
    assert set(T.THRESHOLDS) == set(SPEC_TABLE) | {"EXACT", "STAT"}


def test_threshold_float64_keys_as_fp32_and_unknown():
    assert T.threshold("LA-d", f64) == T.threshold("LA-d", f32)
    with pytest.raises(KeyError, match="no threshold for class 'E-fwdd'"):
        T.threshold("E-fwdd", f32)


def test_err_atol_spec_values():
    assert T.err_atol(f32) == 1e-6 and T.err_atol(f16) == 1e-5 and T.err_atol(bf16) == 1e-4
    assert T.err_atol(f64) == 1e-6
    assert T.ERR_ATOL == {f32: 1e-6, f16: 1e-5, bf16: 1e-4}


# ---------------------------------------------------------------------------------------------
# rel_rms


def test_rel_rms_values():
    r = _ref()
    assert T.rel_rms(r, r) == 0.0
    assert T.rel_rms(r * (1 + 1e-3), r) == pytest.approx(1e-3, rel=1e-9)
    noise = T.randn((1000,), f64, seed=1)
    want = (noise * 1e-4).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()
    assert T.rel_rms(r + noise * 1e-4, r) == pytest.approx(want.item(), rel=1e-12)


def test_rel_rms_nan_zero_and_shape():
    r = _ref()
    out = r.clone()
    out[3] = float("nan")
    assert T.rel_rms(out, r) == math.inf
    z = torch.zeros(5, dtype=f64)
    assert T.rel_rms(z, z) == 0.0
    assert T.rel_rms(z + 1, z) == math.inf
    with pytest.raises(ValueError, match=r"shapes differ: out \[3\] vs ref \[4\]"):
        T.rel_rms(torch.zeros(3), torch.zeros(4))


def test_rel_rms_converts_low_precision_output():
    r = _ref()
    got = T.rel_rms(r.to(f16), r)
    assert 0 < got < 1e-3  # fp16 rounding error, measured in float64


# ---------------------------------------------------------------------------------------------
# compare / assert_close


def test_compare_pass_and_fail():
    r = _ref()
    c = T.compare("y", r, (r * (1 + 5e-6)).float(), 1e-5)
    assert c.passed and 0 < c.rel_rms < 1e-5 and c.reason == ""
    c = T.compare("y", r, (r * (1 + 5e-5)).float(), 1e-5)
    assert not c.passed and "rel_rms 5.0" in c.reason and "> 1.0e-05" in c.reason


def test_compare_nan_fails():
    r = _ref()
    out = r.float()
    out[10] = float("nan")
    c = T.compare("y", r, out, 1.0)
    assert not c.passed and c.reason == "1 NaN in output" and c.rel_rms == math.inf


def test_compare_inf_where_ref_finite_fails():
    r = _ref()
    out = r.float()
    out[0] = float("inf")
    out[1] = -float("inf")
    c = T.compare("y", r, out, 1.0)
    assert not c.passed and c.reason == "2 Inf where the reference is finite"


def test_compare_matching_inf_passes_wrong_sign_fails():
    r = _ref()
    r[0] = float("inf")
    out = r.float()
    assert T.compare("y", r, out, 1e-5).passed
    out[0] = -float("inf")
    c = T.compare("y", r, out, 1e-5)
    assert not c.passed and c.reason == "Inf of the wrong sign"


def test_compare_nan_in_reference_fails():
    r = _ref()
    r[5] = float("nan")
    c = T.compare("y", r, torch.zeros_like(r, dtype=f32), 1.0)
    assert not c.passed and "reference has NaN/Inf" in c.reason


def test_err_atol_floor():
    # near-zero reference: relative error is huge but max|d| is under the fp32 floor (1e-6)
    r = torch.full((100,), 1e-9, dtype=f64)
    out = torch.full((100,), 5e-7, dtype=f32)
    c = T.compare("y", r, out, 1e-5)
    assert c.passed and c.rel_rms == 0.0 and c.max_abs == pytest.approx(5e-7 - 1e-9, rel=1e-6)
    # just above the floor it fails
    out2 = torch.full((100,), 3e-6, dtype=f32)
    assert not T.compare("y", r, out2, 1e-5).passed
    # the floor follows out's dtype (fp16: 1e-5) and can be overridden
    assert T.compare("y", r, out2.half(), 1e-3).passed
    assert not T.compare("y", r, out, 1e-5, err_atol=1e-8).passed


def test_all_zero_reference():
    z = torch.zeros(10, dtype=f64)
    assert T.compare("y", z, torch.zeros(10), 1e-5).passed
    c = T.compare("y", z, torch.full((10,), 1e-3), 1e-5)
    assert not c.passed and "reference is all zero" in c.reason


def test_shape_mismatch():
    c = T.compare("y", torch.zeros(3, dtype=f64), torch.zeros(4), 1.0)
    assert not c.passed and c.reason == "shape [4] != reference [3]"


@pytest.mark.parametrize("dtype", [f32, f16, torch.int64])
def test_exact_is_bitwise(dtype):
    x = T.randn((64,), f32, seed=2).mul(100).to(dtype)
    ref64 = x.to(f64)
    assert T.compare("y", ref64, x.clone(), 0.0).passed
    y = x.clone()
    if dtype.is_floating_point:
        y.view(torch.int16 if dtype == f16 else torch.int32)[7] += 1  # one ulp
    else:
        y[7] += 1
    c = T.compare("y", ref64, y, 0.0)
    assert not c.passed and c.reason == "not bitwise equal"
    # threshold 0 ignores err_atol: a tiny difference still fails
    assert not T.compare("y", ref64, y, 0.0, err_atol=1.0).passed


def test_exact_distinguishes_signed_zero_and_accepts_equal_nan():
    assert not T.compare("y", torch.tensor([0.0], dtype=f64), torch.tensor([-0.0]), 0.0).passed
    nan = torch.tensor([float("nan"), 1.0])
    assert T.compare("y", nan.clone(), nan.clone(), 0.0).passed


def test_nan_mask_mode():
    r = _ref(200)
    r[[3, 50]] = float("nan")
    r[7] = float("inf")
    out = r.float()
    c = T.compare("y", r, out, 1e-5, nan_mask=True)
    assert c.passed
    # the metric still applies to the finite rest
    bad = out.clone()
    bad[100] += 10.0
    assert not T.compare("y", r, bad, 1e-5, nan_mask=True).passed
    # NaN at another position fails
    moved = out.clone()
    moved[3], moved[4] = 0.0, float("nan")
    c = T.compare("y", r, moved, 1e-5, nan_mask=True)
    assert not c.passed and c.reason == "NaN/Inf positions differ from the reference"
    # Inf of the wrong sign fails
    flipped = out.clone()
    flipped[7] = -float("inf")
    assert not T.compare("y", r, flipped, 1e-5, nan_mask=True).passed
    # without nan_mask the same input fails on NaN
    assert not T.compare("y", r, out, 1e-5).passed


def test_assert_close_class_names_pick_by_dtype():
    r = _ref()
    err = 5e-4  # between the fp32 (1e-5) and fp16 (1e-3) E-fwd thresholds
    noisy = r * (1 + err)
    assert T.assert_close("y16", r, noisy.half(), "E-fwd") < 1e-3
    with pytest.raises(AssertionError, match=r"y32: rel_rms .* > 1.0e-05 .*threshold=1.0e-05, shape=\[1000\], "
                       r"dtype=torch.float32"):
        T.assert_close("y32", r, noisy.float(), "E-fwd")
    assert T.assert_close("y32", r, noisy.float(), "LA-g") == pytest.approx(err, rel=1e-3)
    with pytest.raises(KeyError):
        T.assert_close("y", r, r.float(), "nope")


def test_assert_close_numeric_threshold_and_nan_message():
    r = _ref()
    assert T.assert_close("y", r, r.float(), 1e-6) < 1e-6
    out = r.float()
    out[0] = float("nan")
    with pytest.raises(AssertionError, match="y: 1 NaN in output"):
        T.assert_close("y", r, out, 1.0)


# ---------------------------------------------------------------------------------------------
# inputs


def test_randn_seeded_and_rounded():
    a = T.randn((4, 5), f16, seed=3, scale=2.0, shift=1.0)
    b = T.randn((4, 5), f16, seed=3, scale=2.0, shift=1.0)
    assert a.dtype == f16 and torch.equal(a, b)
    assert not torch.equal(a, T.randn((4, 5), f16, seed=4, scale=2.0, shift=1.0))
    assert (a != 0).any()
    assert torch.equal(T.randn((8,), bf16, seed=5), T.randn((8,), f32, seed=5).to(bf16))
    assert T.randn((3,), requires_grad=True).requires_grad


def test_uniform_range():
    u = T.uniform((1000,), -2.0, -1.0, seed=6)
    assert u.min() >= -2.0 and u.max() <= -1.0


@pytest.mark.parametrize("kind", ["pad", "transpose"])
def test_non_contiguous(kind):
    x = T.randn((6, 5), seed=7, requires_grad=True)
    v = T.non_contiguous(x, kind)
    assert not v.is_contiguous() and torch.equal(v, x) and v.requires_grad
    with pytest.raises(ValueError, match="kind must be 'pad' or 'transpose'"):
        T.non_contiguous(x, "shuffle")


def test_poison():
    assert torch.isnan(T.poison(torch.zeros(3))).all()
    assert (T.poison(torch.zeros(3, dtype=torch.int32)) == -1).all()


def test_snapshot_assert_unchanged():
    a, b = T.randn((4,), seed=8), T.randn((4,), seed=9)
    before = T.snapshot(a, None, b)
    T.assert_unchanged(before, a, None, b)
    b[0] += 1
    with pytest.raises(AssertionError, match="dy was modified by the operator"):
        T.assert_unchanged(before, a, None, b, names=["x", "unused", "dy"])


def test_snapshot_bitwise_nan_and_signed_zero():
    a = torch.tensor([float("nan"), 0.0])
    before = T.snapshot(a)
    T.assert_unchanged(before, a)  # NaN == NaN bitwise
    a[1] = -0.0
    with pytest.raises(AssertionError):
        T.assert_unchanged(before, a)


def test_to_ref():
    x = T.randn((3,), f16, seed=10)
    i = torch.arange(3, dtype=torch.int32)
    xr, ir, nr = T.to_ref(x, i, None, requires_grad=True)
    assert xr.dtype == f64 and xr.requires_grad and xr.is_leaf and torch.equal(xr, x.to(f64))
    assert ir.dtype == torch.int32 and not ir.requires_grad and ir.data_ptr() != i.data_ptr()
    assert nr is None


def test_snapshot_of_views_with_odd_strides():
    """Views whose size-1 last dim has a stride != 1 (e.g. D = 1 sliced from a wider tensor) and
    0-dim/1-element views: snapshot/assert_unchanged handle them (found by the conv review)."""
    base = torch.randn(4, 6, 3)
    views = [base[..., :1], base[:, ::2, 1:2], base[0, 0, 2], base.transpose(0, 2)[:1], base[0, :1, ::2][:, :1]]
    before = T.snapshot(*views)
    T.assert_unchanged(before, *views)
    base[0, 0, 0] += 1.0
    with pytest.raises(AssertionError):
        T.assert_unchanged(before, *views)
