"""Accuracy metric, thresholds and input generators shared by the unit tests, ``check`` and ATK.

The metric is SPEC 0.9: compare ``out`` (as float64) with a float64 reference computed from the same
(already rounded) inputs; NaN never passes; ±Inf only where the reference has it; pass when
``max|out - ref| <= err_atol``; otherwise ``rms(out - ref) / rms(ref) <= threshold``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

#: SPEC 0.9 threshold classes: class -> {dtype: threshold}. ``EXACT`` means bitwise.
THRESHOLDS: dict[str, dict[torch.dtype, float]] = {
    "EXACT": {torch.float32: 0.0, torch.float16: 0.0, torch.bfloat16: 0.0},
    "E-fwd": {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 4e-3},
    "E-bwd": {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 8e-3},
    "STAT": {torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5},
    "SINK-fwd": {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 4e-3},
    "SINK-bwd": {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 8e-3},
    "TRIL": {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 5e-3},
    "LA-o": {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 5e-3},
    "LA-d": {torch.float32: 2e-4, torch.float16: 8e-3, torch.bfloat16: 8e-3},
    "LA-g": {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 2e-2},
}

#: SPEC 0.9 default absolute floor by the dtype that keys the threshold.
ERR_ATOL: dict[torch.dtype, float] = {torch.float32: 1e-6, torch.float16: 1e-5, torch.bfloat16: 1e-4}


def threshold(cls: str, dtype: torch.dtype) -> float:
    """Threshold of class ``cls`` (a key of :data:`THRESHOLDS`) for ``dtype`` (float64 keys as fp32)."""
    if cls == "EXACT":
        return 0.0  # bitwise, for every dtype (integers and data movement included)
    if dtype == torch.float64:
        dtype = torch.float32
    try:
        return THRESHOLDS[cls][dtype]
    except KeyError:
        raise KeyError(f"no threshold for class {cls!r} and dtype {dtype}; classes: {sorted(THRESHOLDS)}") from None


def err_atol(dtype: torch.dtype) -> float:
    return ERR_ATOL.get(torch.float32 if dtype == torch.float64 else dtype, 1e-6)


@dataclass
class Comparison:
    """Result of comparing one output with its reference."""

    name: str
    rel_rms: float  # 0.0 when within err_atol; inf for NaN/Inf failures
    max_abs: float
    passed: bool
    reason: str = ""


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bytes of a tensor (so NaNs with equal bits compare equal). Copied into a fresh buffer:
    ``contiguous()`` keeps a view whose size-1 dims have odd strides, which ``view(uint8)`` rejects."""
    flat = torch.empty(t.numel(), dtype=t.dtype)
    flat.copy_(t.detach().reshape(-1))
    return flat.view(torch.uint8)


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``rms(out - ref) / rms(ref)`` in float64 (``inf`` on NaN in ``out`` or an all-zero ``ref`` with
    ``out != ref``). The bare metric; :func:`compare` adds the NaN/Inf and ``err_atol`` rules. Computed on
    ``out``'s device in chunks (:func:`_diff_stats`), like :func:`compare`."""
    if out.shape != ref.shape:
        raise ValueError(f"rel_rms: shapes differ: out {list(out.shape)} vs ref {list(ref.shape)}")
    o = out.detach().reshape(-1)
    if torch.isnan(o).any():
        return math.inf
    _, sum_d2, sum_r2 = _diff_stats(o, ref.detach().to(o.device).reshape(-1))
    if sum_r2 == 0.0:
        return 0.0 if sum_d2 == 0.0 else math.inf
    return math.sqrt(sum_d2 / sum_r2)


def compare(name: str, ref: torch.Tensor, out: torch.Tensor, threshold: float,
            err_atol: Optional[float] = None, *, nan_mask: bool = False) -> Comparison:
    """SPEC 0.9 comparison of ``out`` against ``ref``.

    ``threshold == 0`` means bitwise equality (EXACT). ``err_atol`` defaults to the floor of ``out``'s
    dtype. ``nan_mask=True`` is for cases where the spec mandates NaN/Inf: the non-finite masks must
    match exactly and the metric applies to the rest.
    """
    if out.shape != ref.shape:
        return Comparison(name, math.inf, math.inf, False, f"shape {list(out.shape)} != reference {list(ref.shape)}")
    if threshold == 0.0:
        same = _bits(out).shape == _bits(ref.to(out.dtype)).shape and torch.equal(_bits(out), _bits(ref.to(out.dtype)))
        return Comparison(name, 0.0 if same else math.inf, 0.0, same, "" if same else "not bitwise equal")
    if err_atol is None:
        err_atol = globals()["err_atol"](out.dtype)
    # on out's device, in chunks: real-size GPU cases compare 10^9 elements (fp64 copies on the host took minutes)
    o = out.detach().reshape(-1)
    r = ref.detach().to(o.device).reshape(-1)
    if nan_mask:
        on, rn = ~torch.isfinite(o), ~torch.isfinite(r)
        if not torch.equal(on, rn) or not torch.equal(torch.isnan(o), torch.isnan(r)) or \
                not torch.equal(o[on & ~torch.isnan(o)].double(), r[rn & ~torch.isnan(r)].double()):
            return Comparison(name, math.inf, math.inf, False, "NaN/Inf positions differ from the reference")
        if on.any():
            o, r = o[~on], r[~rn]
    else:
        if torch.isnan(o).any():
            n = int(torch.isnan(o).sum())
            return Comparison(name, math.inf, math.inf, False, f"{n} NaN in output")
        bad_inf = torch.isinf(o) & torch.isfinite(r)
        if bad_inf.any():
            return Comparison(name, math.inf, math.inf, False, f"{int(bad_inf.sum())} Inf where the reference is finite")
        both_inf = torch.isinf(o) & torch.isinf(r)
        if both_inf.any():
            if not torch.equal(o[both_inf].double(), r[both_inf].double()):
                return Comparison(name, math.inf, math.inf, False, "Inf of the wrong sign")
            o, r = o[~both_inf], r[~both_inf]
        if torch.isnan(r).any() or torch.isinf(r).any():
            return Comparison(name, math.inf, math.inf, False, "reference has NaN/Inf where the output is finite")
    max_abs, sum_d2, sum_r2 = _diff_stats(o, r)
    if max_abs <= err_atol:
        return Comparison(name, 0.0, max_abs, True)
    if sum_r2 == 0.0:
        return Comparison(name, math.inf, max_abs, False, "reference is all zero and max|d| > err_atol")
    val = math.sqrt(sum_d2 / sum_r2)  # = rms(d) / rms(ref)
    ok = val <= threshold
    return Comparison(name, val, max_abs, ok, "" if ok else f"rel_rms {val:.3e} > {threshold:.1e}")


def _diff_stats(o: torch.Tensor, r: torch.Tensor, chunk: int = 1 << 24) -> tuple[float, float, float]:
    """max|o - r|, Σ(o - r)², Σr² in float64 over flat tensors, ``chunk`` elements at a time."""
    zero = torch.zeros((), dtype=torch.float64, device=o.device)
    max_abs, sum_d2, sum_r2 = zero, zero.clone(), zero.clone()
    for i in range(0, o.numel(), chunk):
        oc, rc = o[i:i + chunk].double(), r[i:i + chunk].double()
        d = oc - rc
        max_abs = torch.maximum(max_abs, d.abs().max())
        sum_d2 = sum_d2 + d.square().sum()
        sum_r2 = sum_r2 + rc.square().sum()
    return max_abs.item(), sum_d2.item(), sum_r2.item()


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, threshold: float,
                 err_atol: Optional[float] = None, *, nan_mask: bool = False) -> float:
    """Assert the SPEC 0.9 metric; returns the rel_rms. ``threshold`` is a number or a class name
    (``"E-fwd"``), in which case the dtype of ``out`` picks the value."""
    if isinstance(threshold, str):
        threshold = globals()["threshold"](threshold, out.dtype)
    c = compare(name, ref, out, threshold, err_atol, nan_mask=nan_mask)
    if not c.passed:
        raise AssertionError(f"{name}: {c.reason} (rel_rms={c.rel_rms:.3e}, max|d|={c.max_abs:.3e}, "
                             f"threshold={threshold:.1e}, shape={list(out.shape)}, dtype={out.dtype})")
    return c.rel_rms


# ---------------------------------------------------------------------------------------------
# Inputs


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(seed)
    return g


def randn(shape: Sequence[int], dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", *,
          seed: int = 0, scale: float = 1.0, shift: float = 0.0, requires_grad: bool = False) -> torch.Tensor:
    """Seeded normal tensor (drawn in fp32, then rounded to ``dtype``), never all zeros."""
    g = generator(seed, device)
    t = torch.randn(tuple(shape), generator=g, device=device, dtype=torch.float32) * scale + shift
    return t.to(dtype).requires_grad_(requires_grad)


def uniform(shape: Sequence[int], low: float, high: float, dtype: torch.dtype = torch.float32,
            device: torch.device | str = "cpu", *, seed: int = 0) -> torch.Tensor:
    g = generator(seed, device)
    t = torch.rand(tuple(shape), generator=g, device=device, dtype=torch.float32) * (high - low) + low
    return t.to(dtype)


def non_contiguous(t: torch.Tensor, kind: str = "pad") -> torch.Tensor:
    """A non-contiguous view with the same values: ``pad`` (a slice of a wider last dim) or
    ``transpose`` (stored transposed in the last two dims). Requires ``t.dim() >= 1`` / ``>= 2``."""
    if kind == "pad":
        big = torch.empty(*t.shape[:-1], t.shape[-1] + 3, dtype=t.dtype, device=t.device)
        big.fill_(float("nan") if t.is_floating_point() else -1)
        big[..., : t.shape[-1]] = t
        v = big[..., : t.shape[-1]]
    elif kind == "transpose":
        v = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    else:
        raise ValueError(f"non_contiguous: kind must be 'pad' or 'transpose', got {kind!r}")
    return v.requires_grad_(t.requires_grad) if t.is_leaf else v


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN (floats) or -1 (ints) so unwritten elements are caught."""
    return t.fill_(float("nan") if t.is_floating_point() else -1)


def snapshot(*tensors: Optional[torch.Tensor]) -> list[Optional[torch.Tensor]]:
    """Bitwise copies of inputs, to check later with :func:`assert_unchanged`."""
    return [None if t is None else t.detach().clone() for t in tensors]


def assert_unchanged(before: list, *tensors: Optional[torch.Tensor], names: Optional[Sequence[str]] = None) -> None:
    """Inputs bitwise equal to their :func:`snapshot` (no input mutation, SPEC 0.6)."""
    for i, (b, t) in enumerate(zip(before, tensors)):
        if b is None:
            continue
        n = names[i] if names else f"input {i}"
        same = b.shape == t.shape and torch.equal(_bits(b), _bits(t))
        if not same:
            raise AssertionError(f"{n} was modified by the operator")


def to_ref(*tensors: Optional[torch.Tensor], requires_grad: bool = False) -> list[Optional[torch.Tensor]]:
    """Detached float64 copies of the (already rounded) inputs, for the reference oracle."""
    out = []
    for t in tensors:
        if t is None:
            out.append(None)
            continue
        r = t.detach().to(torch.float64) if t.is_floating_point() else t.detach().clone()
        if requires_grad and r.is_floating_point():
            r.requires_grad_(True)
        out.append(r)
    return out


__all__ = ["THRESHOLDS", "ERR_ATOL", "threshold", "err_atol", "Comparison", "rel_rms", "compare", "assert_close",
           "generator", "randn", "uniform", "non_contiguous", "poison", "snapshot", "assert_unchanged", "to_ref"]


def assert_compiled_matches_eager(fn, compiled, calls, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """For each ``(tensors, *extra)`` in ``calls``: the scalar loss ``fn(*leaves, *extra)`` and the
    gradients of every tensor leaf agree between ``compiled`` (e.g. ``torch.compile(fn)``) and eager
    ``fn`` (fresh leaf copies for each run)."""
    for tensors, *extra in calls:
        res = []
        for f in (compiled, fn):
            leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
            loss = f(*leaves, *extra)
            loss.backward()
            res.append([loss.detach()] + [t.grad for t in leaves])
        for a, b in zip(*res):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def assert_linear_attention_compiles(op, make_inputs, chunk_size: int, T_varlen: int, dynamic) -> None:
    """``torch.compile(fullgraph=True, dynamic=dynamic)`` of a chunked linear-attention op (``chunk_kda``,
    ``chunk_gated_delta_rule``) with B/T changing between calls and then varlen with a zero-length sequence:
    the loss ``Σo² + Σfinal_state`` and every gradient match eager. ``make_inputs(B=, T=, N=, V=)`` returns
    ``(q, k, v, g, beta, initial_state)`` on the test device."""
    torch._dynamo.reset()

    def fn(q, k, v, g, beta, h0, cu):
        o, fs = op(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                   cu_seqlens=cu, chunk_size=chunk_size)
        return o.pow(2).sum() + fs.sum()

    calls = [(dict(B=1, T=20), None), (dict(B=2, T=27), None), (dict(B=1, T=T_varlen, N=3), [0, 7, 7, T_varlen])]
    args = []
    for shape, cu in calls:
        ins = make_inputs(**shape, V=8)
        args.append((ins, None if cu is None else torch.tensor(cu, device=ins[0].device)))
    assert_compiled_matches_eager(fn, torch.compile(fn, fullgraph=True, dynamic=dynamic), args)


def dirty_tail(t: Optional[torch.Tensor], end: int) -> Optional[torch.Tensor]:
    """A copy of ``t`` (``[B, T, ...]``) with NaN and huge finite values at token positions ``>= end``
    (the tail past ``cu_seqlens[-1]``, which a varlen kernel must never read); None stays None."""
    if t is None:
        return None
    t = t.clone()
    t[:, end:] = float("nan")
    t[:, end::2] = 3e4 if t.dtype == torch.float16 else 1e30
    return t
