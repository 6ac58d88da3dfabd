"""Inputs of an ATK case at one shape point and dtype, built from the case file's tensor specs.

Every tensor is drawn from a seeded generator (the seed depends on the op, case and tensor name, so
two runs build bitwise the same inputs), in fp32 and then rounded to its dtype, like
:func:`mindspeed_ops.testing.randn`. Distributions (``dist``):

=============  ===========================================================================================
``normal``     ``scale * randn + shift`` (default; ``scale`` 1, ``shift`` 0)
``uniform``    ``U[low, high)``
``choice``     uniform draws from ``values`` (numbers; ``.nan``/``.inf`` allowed): boundary values
``gate``       GDN gates ``logsigmoid(U[0,1)) / s``, then zeroed with probability ``zero_frac`` (SPEC 1.10)
``sigmoid``    ``sigmoid(scale * randn)`` (beta)
``randint``    integers in ``[low, high)``
``labels``     class ids in ``[0, V)``; ``ignore_frac`` of them ``ignore_index`` (-100), ``invalid_frac``
               out of range (alternately ``V`` and ``-1``)
``cu_seqlens`` ``[0, cumsum(lens)]`` (int32)
``splits``     ``shape[0]`` MoE split sizes summing to ``total`` with at least ``zeros`` empty chunks
``permutation`` a random permutation of ``0 .. shape[0]-1``
``positions``  packed positions ``[T]``: ``segments`` equal sequences, each restarting at 0
``zeros``, ``ones``, ``full`` (``value``)
``tril_chunk`` ``[B, T, H, BT]`` chunk matrices, ``scale * randn`` strictly below the diagonal (entry
               ``(t, j)`` kept when ``j < t % BT``), ``upper`` (default 0; e.g. ``.nan`` garbage) elsewhere
=============  ===========================================================================================

Modifiers (applied in this order): ``fill`` (slices set to a value: ``{value, dim, start, stop}``),
``inject`` (random positions set to a value, e.g. ``{nan: 0.01}`` or ``{-1000: 0.05}``, with the given fraction), ``transpose: [a, b]`` (stored
with dims a and b swapped, passed as the transposed view), ``noncontig: pad|transpose``
(:func:`mindspeed_ops.testing.non_contiguous`), ``device: host`` (a CPU tensor even on CUDA), ``when``
(omit the tensor when the expression is false). ``builder: <name>`` with ``args`` calls a function of
:data:`BUILDERS` instead (inputs that need another operator's reference or a structured pattern).
"""
from __future__ import annotations

import zlib
from typing import Any, Callable

import torch

from .expr import evaluate, resolve
from .schema import DISTS, DTYPE_NAMES, INT_DISTS, CaseSpec, param

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64,
                "int32": torch.int32, "int64": torch.int64, "bool": torch.bool, "uint8": torch.uint8}
SHORT = {v: k for k, v in TORCH_DTYPES.items()}


def torch_dtype(name: str) -> torch.dtype:
    """``'bf16'`` (or any spelling of :data:`mindspeed_ops.atk.schema.DTYPE_NAMES`) -> ``torch.bfloat16``."""
    return TORCH_DTYPES[DTYPE_NAMES[name]]


def expr_names(case: CaseSpec, dims: dict, dtype: torch.dtype) -> dict:
    """Names for ``$expr`` values at a shape point: dims, ``let``, dtype constants, ``dtype``, ``e``."""
    names = case.names(dims, SHORT.get(dtype, str(dtype)))
    names.update(TORCH_DTYPES)
    names["dtype"] = dtype
    names["e"] = torch.empty((), dtype=dtype).element_size()
    return names


def _seed(op: str, case: str, tensor: str, base: int) -> int:
    return (zlib.crc32(f"{op}/{case}/{tensor}".encode()) + base) % (2**31 - 1)


def _gen(seed: int, device) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(seed)
    return g


def _rand(shape, seed, device):
    return torch.rand(tuple(shape), generator=_gen(seed, device), device=device, dtype=torch.float32)


def _randn(shape, seed, device):
    return torch.randn(tuple(shape), generator=_gen(seed, device), device=device, dtype=torch.float32)


def _draw(dist: str, shape: list, p: dict, seed: int, device) -> torch.Tensor:
    """The raw values (fp32 for float distributions, int64 for integer ones)."""
    if dist == "normal":
        return _randn(shape, seed, device) * float(p.get("scale", 1.0)) + float(p.get("shift", 0.0))
    if dist == "uniform":
        lo, hi = float(p.get("low", 0.0)), float(p.get("high", 1.0))
        return _rand(shape, seed, device) * (hi - lo) + lo
    if dist == "choice":
        vals = torch.tensor([float(v) for v in p["values"]], dtype=torch.float32, device=device)
        idx = torch.randint(0, len(vals), tuple(shape), generator=_gen(seed, device), device=device)
        return vals[idx]
    if dist == "gate":
        g = torch.nn.functional.logsigmoid(_rand(shape, seed, device)) / float(p.get("s", 1.0))
        zf = float(p.get("zero_frac", 0.0))
        return g * (_rand(shape, seed + 1, device) >= zf) if zf > 0 else g
    if dist == "sigmoid":
        return torch.sigmoid(_randn(shape, seed, device) * float(p.get("scale", 1.0)))
    if dist == "randint":
        return torch.randint(int(p.get("low", 0)), int(p["high"]), tuple(shape), generator=_gen(seed, device),
                             device=device)
    if dist == "labels":
        V = int(p["V"])
        y = torch.randint(0, V, tuple(shape), generator=_gen(seed, device), device=device)
        u = _rand(shape, seed + 1, device)
        ign, inv = float(p.get("ignore_frac", 0.0)), float(p.get("invalid_frac", 0.0))
        y = torch.where(u < ign, torch.full_like(y, int(p.get("ignore_index", -100))), y)
        bad = (u >= ign) & (u < ign + inv)
        alt = torch.where(torch.arange(y.numel(), device=device).reshape(y.shape) % 2 == 0,
                          torch.full_like(y, V), torch.full_like(y, -1))
        return torch.where(bad, alt, y)
    if dist == "cu_seqlens":
        lens = [int(n) for n in p["lens"]]
        return torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], dtype=torch.int64, device=device)
    if dist == "splits":
        from ..ops.moe.checks import random_splits

        sizes, _ = random_splits(int(shape[0]), int(p["total"]), seed, zeros=int(p.get("zeros", 2)))
        return sizes.to(device)
    if dist == "permutation":
        return torch.randperm(int(shape[0]), generator=_gen(seed, "cpu")).to(device)
    if dist == "positions":
        T = int(shape[-1])
        n = max(1, int(p.get("segments", 1)))
        cuts = [T * i // n for i in range(n + 1)]
        pos = torch.cat([torch.arange(b - a) for a, b in zip(cuts, cuts[1:])])
        return pos.expand(*shape).contiguous().to(device)
    if dist == "zeros":
        return torch.zeros(tuple(shape), device=device)
    if dist == "ones":
        return torch.ones(tuple(shape), device=device)
    if dist == "full":
        return torch.full(tuple(shape), float(p["value"]), device=device)
    if dist == "tril_chunk":
        if len(shape) != 4:
            raise ValueError(f"dist tril_chunk needs a [B, T, H, BT] shape, got {shape}")
        B, T, H, BT = shape
        a = _randn(shape, seed, device) * float(p.get("scale", 0.1))
        keep = torch.arange(BT, device=device)[None, :] < (torch.arange(T, device=device) % BT)[:, None]
        return torch.where(keep[None, :, None, :], a, torch.full_like(a, float(p.get("upper", 0.0))))
    raise ValueError(f"unknown dist {dist!r}")


def _modify(t: torch.Tensor, spec: dict, names: dict, seed: int) -> torch.Tensor:
    for f in spec.get("fill") or []:
        dim = int(evaluate(f.get("dim", 0), names))
        start = int(evaluate(f.get("start", 0), names))
        stop = None if f.get("stop") is None else int(evaluate(f["stop"], names))
        idx = [slice(None)] * t.dim()
        idx[dim] = slice(start, stop)
        t[tuple(idx)] = float(f["value"])
    for k, frac in (spec.get("inject") or {}).items():
        frac = float(param(frac, names))
        if frac > 0:
            mask = _rand(t.shape, seed + 7 + len(str(k)), t.device) < frac
            t[mask] = float(str(k))
    return t


def build_tensor(spec: dict, name: str, case: CaseSpec, names: dict, dtype: torch.dtype, device, seed: int):
    """One input tensor (see module docstring); ``None`` when its ``when`` is false."""
    if "when" in spec and not evaluate(spec["when"], names):
        return None
    dev = torch.device("cpu") if spec.get("device") == "host" else torch.device(device)
    seed = int(spec.get("seed", seed))
    want = spec.get("dtype", "case")
    if "builder" in spec:
        t_dtype = dtype if want == "case" else torch_dtype(want)
        return BUILDERS[spec["builder"]](device=dev, dtype=t_dtype, seed=seed, **resolve(spec.get("args", {}), names))
    dist = spec.get("dist", "normal")
    shape = [int(x) for x in evaluate(spec["shape"], names)]
    p = {k: param(v, names) for k, v in spec.items() if k in DISTS.get(dist, ())}
    if want == "case":
        t_dtype = (torch.int32 if dist == "cu_seqlens" else torch.int64) if dist in INT_DISTS else dtype
    else:
        t_dtype = torch_dtype(want)
    stored = list(shape)
    tr = spec.get("transpose")
    if tr is not None:
        a, b = (int(evaluate(x, names)) for x in tr)
        stored[a], stored[b] = stored[b], stored[a]
    raw = _draw(dist, stored, p, seed, dev)
    t = raw.to(t_dtype)
    if tr is not None:
        t = t.transpose(a, b)
    t = _modify(t, spec, names, seed)
    if spec.get("noncontig"):
        from ..testing import non_contiguous

        t = non_contiguous(t, spec["noncontig"])
    return t


def build_inputs(case: CaseSpec, dims: dict, dtype: torch.dtype, device, *, seed: int = 0) -> dict:
    """Keyword arguments of the operator call at ``dims``/``dtype``: the tensors (omitted ones
    dropped) followed by the resolved ``kwargs``."""
    names = expr_names(case, dims, dtype)
    out: dict[str, Any] = {}
    for name, spec in case.inputs.items():
        t = build_tensor(spec, name, case, names, dtype, device, _seed(case.op, case.name, name, seed))
        if t is not None:
            out[name] = t
    out.update(resolve(case.kwargs, names))
    return out


def call_kwargs(case: CaseSpec, dims: dict, dtype: torch.dtype) -> dict:
    """The resolved ``call_kwargs``: arguments only our operator gets (e.g. ``chunk_size`` where the
    reference reads it from a tensor's shape)."""
    return resolve(case.call_kwargs, expr_names(case, dims, dtype)) if case.call_kwargs else {}


def cost_names(case: CaseSpec, dims: dict, dtype: torch.dtype, inputs: dict) -> dict:
    """Names for the ``cost``/``memory`` formulas: :func:`expr_names` plus ``n_<input>`` (numel) and
    ``e_<input>`` (element size) of every tensor input (0 for an omitted one)."""
    names = expr_names(case, dims, dtype)
    for name in case.inputs:
        v = inputs.get(name)
        names[f"n_{name}"] = v.numel() if isinstance(v, torch.Tensor) else 0
        names[f"e_{name}"] = v.element_size() if isinstance(v, torch.Tensor) else 0
    return names


# ---------------------------------------------------------------------------------------------------
# builders: structured inputs (each returns one tensor)

def _rope_cos(*, device, dtype, seed, t_max, rope_dim, base=10000.0):
    from ..ops.rope.reference import rope_cos_sin

    return rope_cos_sin(int(t_max), int(rope_dim), float(base), device=device)[0].to(dtype)


def _rope_sin(*, device, dtype, seed, t_max, rope_dim, base=10000.0):
    from ..ops.rope.reference import rope_cos_sin

    return rope_cos_sin(int(t_max), int(rope_dim), float(base), device=device)[1].to(dtype)


def _kkt_A(*, device, dtype, seed, B, T, H, BT, HV=None, K=64, lens=None, gate_s=1.0):
    """``A`` of SPEC 1.10.2 (the real input of ``solve_tril``): from L2-normalised k, sigmoid beta and
    logsigmoid gates, computed with the GDN references in fp32."""
    from ..ops.gdn import reference as ref

    HV = HV or H
    g = _gen(seed, device)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g, device=device), dim=-1)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=g, device=device))
    gate = torch.nn.functional.logsigmoid(torch.rand(B, T, HV, generator=g, device=device)) / float(gate_s)
    cu = _cu(lens, device)
    G = ref.chunk_local_cumsum_ref(gate, BT, cu_seqlens=cu)
    return ref.chunk_scaled_dot_kkt_ref(k, G, beta, cu_seqlens=cu, chunk_size=BT).to(dtype)


def _cu(lens, device):
    return None if lens is None else torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))],
                                                  dtype=torch.int64, device=device)


def _gdn_G(*, device, dtype, seed, B, T, HV, BT=64, s=1.0, zero_frac=0.2, lens=None, K=None, reset_frac=0.0):
    """Chunk-local cumsum ``G`` (fp32) of recipe gates ``logsigmoid(U)/s`` with ``zero_frac`` exact zeros:
    the ``g`` input of the GDN stage functions (SPEC 0.4). ``K``: per-channel gates ``[B, T, HV, K]`` (the
    ``gk`` input of the KDA stages); ``reset_frac``: that fraction of the raw gates set to -1000 (hard reset,
    SPEC 1.10.10 / 1.11) before the cumsum."""
    from ..ops.gdn import reference as ref

    shape = [B, T, HV] if K is None else [B, T, HV, K]
    gate = torch.nn.functional.logsigmoid(_rand(shape, seed, device)) / float(s)
    gate = gate * (_rand(shape, seed + 1, device) >= float(zero_frac))
    if float(reset_frac) > 0:
        gate = torch.where(_rand(shape, seed + 2, device) < float(reset_frac), torch.full_like(gate, -1000.0), gate)
    return ref.chunk_local_cumsum_ref(gate, int(BT), cu_seqlens=_cu(lens, device)).float()


def _kkt_Ainv(*, device, dtype, seed, B, T, H, BT, HV=None, K=64, lens=None, gate_s=1.0):
    """``Ainv = (I + A)^-1`` per chunk of a realistic ``A`` (:func:`_kkt_A`): the ``A`` input of
    ``recompute_w_u_fwd`` / ``prepare_wy_repr_bwd``."""
    from ..ops.gdn import reference as ref

    A = _kkt_A(device=device, dtype=torch.float32, seed=seed, B=B, T=T, H=H, BT=BT, HV=HV, K=K, lens=lens,
               gate_s=gate_s)
    return ref.solve_tril_ref(A, cu_seqlens=_cu(lens, device)).to(dtype)


def _suffix_exact(*, device, dtype, seed, B, T, HV, BT=64, big=1e8):
    """SPEC 1.10.1 exact case: in every chunk, the first half ``big``, the second half ones (a reverse
    cumsum must give ``BT/2, ..., 1`` exactly on the second half)."""
    pos = torch.arange(T, device=device) % BT
    col = torch.where(pos < BT // 2, torch.full((T,), float(big), device=device), torch.ones(T, device=device))
    return col[None, :, None].expand(B, T, HV).contiguous().to(dtype)


def _l2norm_x(shape, x_seed, device):
    return _randn([int(s) for s in shape], int(x_seed), device)


def _l2norm_y(*, device, dtype, seed, shape, x_seed=1, eps=1e-6):
    """``y`` of ``l2norm_fwd`` for the x drawn with ``x_seed`` (input of ``l2norm_bwd``)."""
    from ..ops.norm.reference import l2norm_fwd

    return l2norm_fwd(_l2norm_x(shape, x_seed, device).to(dtype), eps)[0].to(dtype)


def _l2norm_rstd(*, device, dtype, seed, shape, x_seed=1, eps=1e-6):
    """fp32 ``rstd`` of ``l2norm_fwd`` for the x drawn with ``x_seed`` (input of ``l2norm_bwd``)."""
    from ..ops.norm.reference import l2norm_fwd

    return l2norm_fwd(_l2norm_x(shape, x_seed, device).to(dtype), eps)[1].float()


BUILDERS: dict[str, Callable[..., torch.Tensor]] = {
    "l2norm_y": _l2norm_y,
    "l2norm_rstd": _l2norm_rstd,
    "rope_cos": _rope_cos,
    "rope_sin": _rope_sin,
    "kkt_A": _kkt_A,
    "kkt_Ainv": _kkt_Ainv,
    "gdn_G": _gdn_G,
    "suffix_exact": _suffix_exact,
}

__all__ = ["TORCH_DTYPES", "SHORT", "torch_dtype", "expr_names", "build_tensor", "build_inputs", "call_kwargs",
           "cost_names",
           "BUILDERS"]
