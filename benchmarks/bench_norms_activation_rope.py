#!/usr/bin/env python
"""Speed and memory of the norm, activation and RoPE families against PyTorch and peer libraries.

Operators (SPEC 1.1-1.5): ``rms_norm``, ``rmsnorm_without_weight``, ``l2norm``, ``rms_norm_gated``,
``clipped_swiglu``, ``inplace_rope``. For each, forward and forward+backward of:

- ``ours``: ``mindspeed_ops.api.<name>`` (or ``mindspeed_ops.api.triton.<name>.<name>``);
- ``eager ref``: the operator's pure-PyTorch reference (``mindspeed_ops/ops/*/reference.py``), which
  upcasts to fp32, computes and rounds once (a bench-local fp32 formula of the SPEC if the reference
  is missing: labelled so);
- ``compile(ref)``: ``torch.compile`` of that same eager function (default mode, ``dynamic=False``);
- ``torch F.rms_norm``: PyTorch's own RMSNorm (``rms_norm`` only);
- peers where they have the operator: Liger-Kernel (``LigerRMSNormFunction``, ``LigerRopeFunction``)
  and flash-linear-attention (``fla.modules.l2norm.l2norm``, ``fla.modules.layernorm.rms_norm``,
  ``fla.modules.fused_norm_gate.rms_norm_gated``, ``fla.modules.rotary.rotary_embedding``).

Per row: median ms (``triton.testing.do_bench``, L2 flushed before each call), the minimum bytes
(formula per operator below), achieved GB/s, fraction of the device copy bandwidth measured at the
start of the run, extra peak memory of one call, ``base ms / ours ms`` and the relative RMS error of
the forward output against the eager reference (a sanity check, not a test).

In-place RoPE: the forward is timed on one buffer rotated again by every call (values stay finite;
nothing here autotunes over it, but fla's rotary kernel autotunes itself once, on a scratch copy);
fwd+bwd = that forward + a backward timed with ``retain_graph`` through ``base -> clone -> rope``.

Usage (GPU): ``python benchmarks/bench_norms_activation_rope.py [--quick] [--ops a,b] [--out DIR]``.
Plumbing check on any machine: ``python benchmarks/bench_norms_activation_rope.py --dry-run``
(tiny shapes, each function run once; on CPU under ``TRITON_INTERPRET=1`` in fp32).
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import pkgutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench as B  # noqa: E402

OPS = ("rms_norm", "rmsnorm_without_weight", "l2norm", "rms_norm_gated", "clipped_swiglu", "inplace_rope")
FAMILY = {"rms_norm": "norm", "rmsnorm_without_weight": "norm", "l2norm": "norm", "rms_norm_gated": "norm",
          "clipped_swiglu": "activation", "inplace_rope": "rope"}
PEER_DISTS = ("liger-kernel", "fla-core", "transformers")
EPS = 1e-6

# Minimum bytes per operator (e = element size of x, ew of weight, eg of the gate, er of rstd, ec of
# cos/sin; N rows of D; fwd+bwd = fwd + bwd):
FORMULAS = {
    "rms_norm": "fwd: x + w + y = 2NDe + D·ew; bwd: x + dy + w + dx + dw = 3NDe + 2D·ew",
    "rmsnorm_without_weight/rstd": "fwd: x + rstd = NDe + N·er; bwd: x + drstd + dx = 2NDe + N·er",
    "rmsnorm_without_weight/rstd+y": "fwd: x + y + rstd = 2NDe + N·er; bwd: x + dy + drstd + dx = 3NDe + N·er",
    "l2norm": "fwd: x + y = 2NDe; bwd: x (or y) + dy + dx = 3NDe",
    "rms_norm_gated": "fwd: x + g + w + y = ND(2e + eg) + D·ew; bwd: x + g + dy + w + dx + dg + dw = ND(3e + 2eg) + 2D·ew",
    "clipped_swiglu": "rows N, out width I: fwd: gate_up + out = 3NIe; bwd: gate_up + dout + dgate_up = 5NIe",
    "inplace_rope": "rotated elements M = B·T·H·R: fwd: read + write x[..., D-R:] + cos/sin = 2Me + T·R·ec; "
                    "bwd: the same on dy (in place) = 2Me + T·R·ec",
}


# --------------------------------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------------------------------

def shapes_for(op: str, quick: bool, dry: bool):
    """Variants and shapes per operator. Each entry: (variant, shape, extra)."""
    if dry:
        return {
            "rms_norm": [("weight", (64, 256), {})],
            "rmsnorm_without_weight": [("rstd", (64, 256), {}), ("rstd+y", (64, 256), {})],
            "l2norm": [("qk", (1, 16, 4, 32), {})],
            "rms_norm_gated": [("swish", (1, 16, 4, 32), {})],
            "clipped_swiglu": [("interleaved", (16, 2 * 40), {}), ("split", (16, 2 * 40), {})],
            "inplace_rope": [("R=D", (1, 8, 4, 16), {"R": 16}), ("R<D", (1, 8, 2, 32), {"R": 16})],
        }[op]
    norm_rows = [(8192, 4096), (16384, 4096)] if quick else [(8192, 4096), (65536, 4096)]
    heads = [(2, 4096, 64, 128)] if quick else [(1, 4096, 32, 128), (4, 4096, 64, 128)]
    swiglu = [(8192, 5760), (16384, 5760)] if quick else [(8192, 5760), (65536, 5760)]
    rope = ([((4, 4096, 32, 64), 64), ((8, 4096, 32, 64), 64)] if quick else
            [((4, 4096, 32, 64), 64), ((16, 4096, 32, 64), 64)])
    table = {
        "rms_norm": [("weight", s, {}) for s in norm_rows],
        "rmsnorm_without_weight": [(v, s, {}) for v in ("rstd", "rstd+y") for s in norm_rows],
        "l2norm": [("qk", s, {}) for s in heads],
        "rms_norm_gated": [("swish", s, {}) for s in heads],
        "clipped_swiglu": [(v, s, {}) for v in ("interleaved", "split") for s in swiglu],
        "inplace_rope": [("R=D", s, {"R": r}) for s, r in rope],
    }
    if not quick:  # DeepSeek-V4 layout: last 64 of 512 channels (only 1/8 of each head moves)
        table["inplace_rope"].append(("V4 R=64<D", (1, 4096, 64, 512), {"R": 64}))
    return table[op]


# --------------------------------------------------------------------------------------------------
# implementations
# --------------------------------------------------------------------------------------------------

def resolve_ours(name: str):
    """(callable, where) or (None, why)."""
    errors = []
    try:
        api = importlib.import_module("mindspeed_ops.api")
        fn = getattr(api, name, None)
        if fn is not None:
            return fn, f"mindspeed_ops.api.{name}"
        errors.append(f"mindspeed_ops.api has no {name}")
    except Exception as e:  # noqa: BLE001
        errors.append(f"import mindspeed_ops.api: {type(e).__name__}: {e}")
    mod, err = B.try_import(f"mindspeed_ops.api.triton.{name}")
    if mod is not None and hasattr(mod, name):
        return getattr(mod, name), f"mindspeed_ops.api.triton.{name}.{name}"
    errors.append(err or f"mindspeed_ops.api.triton.{name} has no {name}")
    return None, "; ".join(errors)


def find_references():
    """Functions of every ``mindspeed_ops.ops.**.reference`` module, by name."""
    refs, notes = {}, []
    ops_pkg, err = B.try_import("mindspeed_ops.ops")
    if ops_pkg is None:
        return refs, [f"mindspeed_ops.ops: {err}"]
    for info in pkgutil.walk_packages(ops_pkg.__path__, prefix="mindspeed_ops.ops."):
        if not info.name.endswith(".reference"):
            continue
        mod, err = B.try_import(info.name)
        if mod is None:
            notes.append(f"{info.name}: {err}")
            continue
        for k, v in vars(mod).items():
            if callable(v) and not k.startswith("_") and getattr(v, "__module__", "") == mod.__name__:
                refs.setdefault(k, []).append((v, info.name))
    # a name defined by several families (e.g. an l2norm inside gdn): take the operator's own family
    picked = {}
    for k, cands in refs.items():
        home = f"mindspeed_ops.ops.{FAMILY.get(k, '')}."
        picked[k] = next((c for c in cands if c[1].startswith(home)), cands[0])
    return picked, notes


# Bench-local fp32 formulas of the SPEC, used only when the package's reference is missing.

def _f_rms_norm(x, weight=None, eps=EPS):
    import torch

    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y if weight is None else y * weight.float()).to(x.dtype)


def _f_rmsnorm_without_weight(x, eps=EPS, return_normalized=False):
    import torch

    xf = x.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (r.to(x.dtype), (xf * r).to(x.dtype)) if return_normalized else r.to(x.dtype)


def _f_l2norm(x, eps=EPS):
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def _f_rms_norm_gated(x, g, weight=None, activation="swish", eps=EPS):
    import torch

    xf, gf = x.float(), g.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    act = gf * torch.sigmoid(gf) if activation in ("swish", "silu") else torch.sigmoid(gf)
    return (y * act).to(x.dtype)


def _f_clipped_swiglu(gate_up, swiglu_alpha=1.702, swiglu_limit=7.0, interleaved=False):
    import torch

    x = gate_up.float()
    gate, up = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)
    gate = torch.clamp(gate, max=swiglu_limit)
    up = torch.clamp(up, -swiglu_limit, swiglu_limit)
    return (gate * torch.sigmoid(swiglu_alpha * gate) * (up + 1)).to(gate_up.dtype)


def _f_inplace_rope(x, cos, sin):
    import torch

    D, R, T = x.shape[-1], 2 * cos.shape[-1], x.shape[-3]
    c = cos[:T].float().unsqueeze(-2)
    s = sin[:T].float().unsqueeze(-2)
    xr = x[..., D - R:].float()
    a, b = xr[..., 0::2], xr[..., 1::2]
    x[..., D - R:].copy_(torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2))
    return x


FALLBACK = {"rms_norm": _f_rms_norm, "rmsnorm_without_weight": _f_rmsnorm_without_weight, "l2norm": _f_l2norm,
            "rms_norm_gated": _f_rms_norm_gated, "clipped_swiglu": _f_clipped_swiglu,
            "inplace_rope": _f_inplace_rope}


class Peers:
    """Peer entry points, each ``None`` when the library (or the function) is missing."""

    def __init__(self, enabled: bool):
        self.notes = []
        self.liger_rms = self.liger_rope = None
        self.fla_rms = self.fla_l2 = self.fla_gated = self.fla_rope = None
        if not enabled:
            self.notes.append("peers disabled (--no-peers)")
            return
        m, e = B.try_import("liger_kernel.ops.rms_norm")
        self.liger_rms = getattr(m, "LigerRMSNormFunction", None) if m else None
        if m is None:
            self.notes.append(f"Liger rms_norm: {e}")
        m, e = B.try_import("liger_kernel.ops.rope")
        self.liger_rope = getattr(m, "LigerRopeFunction", None) if m else None
        if m is None:
            self.notes.append(f"Liger rope: {e}")
        for attr, mod, fn in (("fla_l2", "fla.modules.l2norm", "l2norm"),
                              ("fla_rms", "fla.modules.layernorm", "rms_norm"),
                              ("fla_gated", "fla.modules.fused_norm_gate", "rms_norm_gated"),
                              ("fla_rope", "fla.modules.rotary", "rotary_embedding")):
            m, e = B.try_import(mod)
            setattr(self, attr, getattr(m, fn, None) if m else None)
            if m is None:
                self.notes.append(f"fla {fn}: {e}")


# --------------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------------

def build_cases(op, variant, shape, extra, dtype, ours, refs, peers, use_compile):
    """One :class:`B.Case` for ``op`` at ``shape`` (inputs are made lazily on the device)."""
    import torch
    import torch.nn.functional as F

    e = torch.empty((), dtype=dtype).element_size()
    tname = str(dtype).replace("torch.", "")
    ours_fn, ours_where = ours
    ref_fn, ref_where = refs.get(op, (None, None))
    ref_label = "eager ref (fp32 math)"
    if ref_fn is None:
        ref_fn, ref_label, ref_where = FALLBACK[op], "eager (bench fp32 formula)", "bench-local formula (no package reference)"
    numel = math.prod(shape)

    def randn(*s, device, seed, scale=1.0, shift=0.0):
        gen = torch.Generator(device=device).manual_seed(seed)
        return (torch.randn(*s, generator=gen, device=device, dtype=torch.float32) * scale + shift).to(dtype)

    impls = []

    def add(name, kind, fn, **kw):
        impls.append(B.Impl(name, kind, fn, **kw))

    def add_std(call_ours, call_ref, mutates=()):
        """ours / eager ref / compile(ref), each called with the case's keyword inputs."""
        if ours_fn is not None:
            add("ours", "ours", call_ours, note=ours_where, mutates=mutates)
        add(ref_label, "eager", call_ref, note=ref_where, mutates=mutates)
        if use_compile:
            add("compile(ref)", "compile", torch.compile(call_ref, dynamic=False), note="torch.compile, default mode",
                mutates=mutates)

    if op == "rms_norm":
        N, D = shape
        def make(device):
            return {"x": randn(N, D, device=device, seed=1), "weight": randn(D, device=device, seed=2, scale=0.1, shift=1.0)}
        add_std(lambda x, weight: ours_fn(x, weight, eps=EPS), lambda x, weight: ref_fn(x, weight, eps=EPS))
        add("torch F.rms_norm", "eager", lambda x, weight: F.rms_norm(x, (D,), weight, eps=EPS),
            note="PyTorch's own RMSNorm (aten), eager")
        if peers.liger_rms is not None:
            add("liger", "peer", lambda x, weight: peers.liger_rms.apply(x, weight, EPS, 0.0, "gemma", False, None),
                note="LigerRMSNormFunction, casting_mode='gemma' (fp32), in_place=False")
        if peers.fla_rms is not None:
            add("fla", "peer", lambda x, weight: peers.fla_rms(x, weight, None, eps=EPS),
                note="fla.modules.layernorm.rms_norm")
        return B.Case(op, variant, f"[{N}, {D}]", tname, numel, make, ("x", "weight"),
                      2 * N * D * e + D * e, 3 * N * D * e + 2 * D * e, FORMULAS[op], impls)

    if op == "rmsnorm_without_weight":
        N, D = shape
        rn = variant == "rstd+y"
        def make(device):
            return {"x": randn(N, D, device=device, seed=3)}
        add_std(lambda x: ours_fn(x, eps=EPS, return_normalized=rn), lambda x: ref_fn(x, eps=EPS, return_normalized=rn))
        if rn and peers.liger_rms is not None:
            add("liger (y only)", "peer", lambda x: peers.liger_rms.apply(x, None, EPS, 0.0, "gemma", False, None),
                note="LigerRMSNormFunction(W=None): returns y only (rstd kept internally)", check=None)
        if rn and peers.fla_rms is not None:
            add("fla (y only)", "peer", lambda x: peers.fla_rms(x, None, None, eps=EPS),
                note="fla.modules.layernorm.rms_norm(weight=None): returns y only", check=None)
        fwd = (2 if rn else 1) * N * D * e + N * e
        bwd = (3 if rn else 2) * N * D * e + N * e
        return B.Case(op, variant, f"[{N}, {D}]", tname, numel, make, ("x",), fwd, bwd,
                      FORMULAS[f"{op}/{variant}"], impls)

    if op == "l2norm":
        N, D = math.prod(shape[:-1]), shape[-1]
        def make(device):
            return {"x": randn(*shape, device=device, seed=4)}
        add_std(lambda x: ours_fn(x, eps=EPS), lambda x: ref_fn(x, eps=EPS))
        if peers.fla_l2 is not None:
            add("fla", "peer", lambda x: peers.fla_l2(x, eps=EPS), note="fla.modules.l2norm.l2norm")
        return B.Case(op, variant, str(list(shape)), tname, numel, make, ("x",), 2 * N * D * e, 3 * N * D * e,
                      FORMULAS[op], impls)

    if op == "rms_norm_gated":
        N, D = math.prod(shape[:-1]), shape[-1]
        def make(device):
            return {"x": randn(N, D, device=device, seed=5), "g": randn(N, D, device=device, seed=6),
                    "weight": randn(D, device=device, seed=7, scale=0.1, shift=1.0)}
        add_std(lambda x, g, weight: ours_fn(x, g, weight, activation="swish", eps=EPS),
                lambda x, g, weight: ref_fn(x, g, weight, activation="swish", eps=EPS))
        if peers.fla_gated is not None:
            add("fla", "peer", lambda x, g, weight: peers.fla_gated(x, g, weight, None, activation="swish", eps=EPS),
                note="fla.modules.fused_norm_gate.rms_norm_gated")
        return B.Case(op, variant, f"[{N}, {D}] (= {list(shape)} rows of {D})", tname, numel, make,
                      ("x", "g", "weight"), 3 * N * D * e + D * e, 5 * N * D * e + 2 * D * e, FORMULAS[op], impls)

    if op == "clipped_swiglu":
        N, D2 = shape
        I = D2 // 2
        il = variant == "interleaved"
        def make(device):  # scale 4: about 8 % of the values lie past the clamp at ±7
            return {"gate_up": randn(N, D2, device=device, seed=8, scale=4.0)}
        add_std(lambda gate_up: ours_fn(gate_up, interleaved=il), lambda gate_up: ref_fn(gate_up, interleaved=il))
        return B.Case(op, variant, f"[{N}, {D2}]", tname, numel, make, ("gate_up",), 3 * N * I * e, 5 * N * I * e,
                      FORMULAS[op], impls)

    if op == "inplace_rope":
        Bsz, T, H, D = shape
        R = extra["R"]

        def make(device):
            inv = 1.0 / (10000.0 ** (torch.arange(0, R, 2, device=device, dtype=torch.float32) / R))
            ang = torch.arange(T, device=device, dtype=torch.float32)[:, None] * inv[None, :]
            return {"x": randn(*shape, device=device, seed=9), "cos": ang.cos(), "sin": ang.sin()}

        add_std(lambda x, cos, sin: ours_fn(x, cos, sin), lambda x, cos, sin: ref_fn(x, cos, sin), mutates=("x",))
        if R == D and peers.fla_rope is not None:
            add("fla", "peer", lambda x, cos, sin: peers.fla_rope(x, cos, sin, interleaved=True, inplace=True),
                note="fla rotary_embedding(interleaved=True, inplace=True), cos/sin in x.dtype",
                mutates=("x",), prepare=lambda inp: {**inp, "cos": inp["cos"].to(dtype), "sin": inp["sin"].to(dtype)})
        if R == D and H % 2 == 0 and peers.liger_rope is not None:
            def liger_prep(inp):
                x = inp["x"]
                return {"q": x[:, :, : H // 2].contiguous(), "k": x[:, :, H // 2:].contiguous(),
                        "cos": torch.cat([inp["cos"], inp["cos"]], -1).to(dtype),
                        "sin": torch.cat([inp["sin"], inp["sin"]], -1).to(dtype)}
            add("liger (non-interleaved)", "peer",
                lambda q, k, cos, sin: peers.liger_rope.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin),
                note="LigerRopeFunction: rotate-half layout (a different function; speed reference only), "
                     "q/k = H/2 heads each, in place", prepare=liger_prep, mutates=("q", "k"),
                grad_names=("q", "k"), check=None)
        M = Bsz * T * H * R
        cs = 2 * T * (R // 2) * 4
        return B.Case(op, variant, f"{list(shape)} R={R}", tname, M, make, ("x",),
                      2 * M * e + cs, 2 * M * e + cs, FORMULAS[op], impls)
    raise ValueError(op)


# --------------------------------------------------------------------------------------------------
# targets (issue): >= 85 % of copy at >= 64M elements and >= 1.3x torch.compile; RMSNorm
# [8192, 4096] fwd+bwd >= 70 % of copy
# --------------------------------------------------------------------------------------------------

def target_rows(rows):
    out = []
    by_key = {}
    for r in rows:
        by_key.setdefault((r["op"], r["variant"], r["shape"], r["direction"]), []).append(r)
    for (op, variant, shape, direction), group in by_key.items():
        ours = next((r for r in group if r["kind"] == "ours" and r["median_ms"] is not None), None)
        comp = next((r for r in group if r["kind"] == "compile" and r["median_ms"] is not None), None)
        if ours is None:
            continue
        goals = []
        if ours["numel"] >= 64 * 2**20:
            goals.append(("% copy >= 85", ours["frac_copy"] is not None and ours["frac_copy"] >= 0.85))
            if comp is not None:
                goals.append(("compile/ours >= 1.3", comp["median_ms"] / ours["median_ms"] >= 1.3))
        if op == "rms_norm" and shape == "[8192, 4096]" and direction == "fwd+bwd":
            goals.append(("% copy >= 70", ours["frac_copy"] is not None and ours["frac_copy"] >= 0.70))
        if goals:
            out.append(dict(op=op, variant=variant, shape=shape, direction=direction,
                            frac=ours["frac_copy"], vs_compile=(comp["median_ms"] / ours["median_ms"]) if comp else None,
                            goals="; ".join(f"{g}: {'met' if ok else 'MISSED'}" for g, ok in goals)))
    return out


TARGET_COLUMNS = [
    ("op", lambda r: r["op"]), ("case", lambda r: r["variant"]), ("shape", lambda r: r["shape"]),
    ("dir", lambda r: r["direction"]),
    ("ours % copy", lambda r: B._fmt(None if r["frac"] is None else 100 * r["frac"], ".1f")),
    ("compile/ours", lambda r: B._fmt(r["vs_compile"], ".2f")), ("targets", lambda r: r["goals"]),
]


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Minimum-bytes formulas:\n" + "\n".join(f"  {k}: {v}" for k, v in FORMULAS.items()))
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--quick", action="store_true", help="fewer, smaller shapes (each family keeps a >= 64M-element row)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes, every function run once (CPU: TRITON_INTERPRET=1, fp32): checks the plumbing")
    p.add_argument("--out", default=None, help="directory for norms_activation_rope.md and .json")
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                   help="input dtype (default bfloat16; float32 for a CPU dry run)")
    p.add_argument("--direction", default="fwd,fwd+bwd", help="fwd, fwd+bwd or both (default)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--no-peers", action="store_true", help="skip Liger / fla")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    p.add_argument("--copy-gib", type=float, default=2.0, help="buffer size of the copy-bandwidth measurement")
    p.add_argument("--device", default=None, choices=("cuda", "cpu"), help="default: cuda if available")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing rows")
    args = p.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        p.error(f"unknown op(s) {bad}; known: {', '.join(OPS)}")
    args.directions = tuple(d.strip() for d in args.direction.split(",") if d.strip())
    if any(d not in ("fwd", "fwd+bwd") for d in args.directions):
        p.error("--direction takes fwd, fwd+bwd or fwd,fwd+bwd")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = B.early_setup(args.dry_run, args.device)
    import torch

    dtype = getattr(torch, args.dtype or ("float32" if device == "cpu" else "bfloat16"))
    log = lambda s: print(s, flush=True)  # noqa: E731

    refs, ref_notes = find_references()
    peers = Peers(not args.no_peers)
    info = B.env_info(device, PEER_DISTS)
    log(f"# {info.get('gpu')} | torch {info['torch']} | triton {info['triton']} | liger {info['liger-kernel']} | "
        f"fla {info['fla-core']} | dtype {dtype}")

    copy_gbs = B.copy_bandwidth_gbs(device, int(args.copy_gib * 2**30)) if not args.dry_run else None
    log(f"# copy bandwidth: {B._fmt(copy_gbs, '.0f', 'n/a')} GB/s")

    notes = []
    rows = []

    def report(final: bool) -> str:
        md = render(args, info, copy_gbs, dtype, rows, notes, peers, ref_notes, final)
        if args.out:
            payload = dict(info=info, copy_gbs=copy_gbs, dtype=str(dtype), formulas=FORMULAS, notes=notes,
                           peer_notes=peers.notes, complete=final, rows=rows, targets=target_rows(rows))
            paths = B.write_report(args.out, "norms_activation_rope", md, payload)
            if final:
                for p in paths:
                    log(f"wrote {p}")
        return md

    for op in args.ops:
        ours = resolve_ours(op)
        if ours[0] is None:
            notes.append(f"- {op}: ours skipped ({ours[1]})")
            log(f"  {op}: ours not available: {ours[1]}")
        if op not in refs:
            notes.append(f"- {op}: no package reference found; eager baseline is a bench-local fp32 formula")
        for variant, shape, extra in shapes_for(op, args.quick, args.dry_run):
            B.reset_compile_caches()
            try:
                case = build_cases(op, variant, shape, extra, dtype, ours, refs, peers, not args.no_compile)
            except Exception as e:  # noqa: BLE001
                notes.append(f"- {op}/{variant} {shape}: case not built: {B._short_error(e)}")
                continue
            log(f"  {op}/{variant} {case.shape} ({len(case.impls)} implementations)")
            try:
                rows += B.measure_case(case, device, copy_gbs, args.directions, args.warmup, args.rep,
                                       verbose=args.verbose, log=log)
            except Exception as e:  # noqa: BLE001 - e.g. OOM while making inputs
                notes.append(f"- {op}/{variant} {case.shape}: case failed: {B._short_error(e)}")
            if device == "cuda":
                torch.cuda.empty_cache()
            report(final=False)  # a run cut short still leaves what it measured

    md = report(final=True)
    print()
    print(md)  # ends with the compact summary and the targets (a device run returns only the output's tail)
    failed = [r for r in rows if r["error"] and r["kind"] == "ours"]
    if args.dry_run and failed:
        log(f"DRY RUN: {len(failed)} 'ours' row(s) failed")
        return 1
    return 0


NOT_MEASURED = {
    "clipped_swiglu": "no peer: Liger has only the plain SwiGLU (LigerSiLUMulFunction: no clamp, no alpha, "
                      "no +1; its GPT-OSS patch leaves the experts' activation alone) and fla has none",
    "inplace_rope": "fla's rotary kernel rotates the first R channels, Liger's is rotate-half: both are "
                    "run only where R = D (fla then computes exactly this function; Liger is a different "
                    "function, a speed reference only)",
    "rmsnorm_without_weight": "no peer returns rstd; Liger/fla rows (rstd+y only) compute y and keep rstd",
}


def render(args, info, copy_gbs, dtype, rows, notes, peers, ref_notes, final: bool) -> str:
    header_notes = [
        f"dtype: {str(dtype).replace('torch.', '')}; eps {EPS}.",
        "",
        "Columns: median ms of `triton.testing.do_bench` (L2 flushed before each call), p20-p80 spread, the "
        "minimum bytes (formulas below), achieved GB/s and % of the copy bandwidth above, extra peak memory "
        "of one call (max allocated minus allocated before it: outputs and temporaries), base ms / ours ms "
        "(> 1: ours faster), rel RMS error of the forward output vs the eager reference (sanity only). "
        "`graph ms` is the median of CUDA-graph replays of the same call (`triton.testing.do_bench_cudagraph`): "
        "GPU time without host overhead; `ms` includes the host time of the Python call when that is longer "
        "than the GPU work (small shapes).",
        "fwd+bwd runs one forward and one `torch.autograd.grad` through a fresh graph (no .grad "
        "accumulation); for the in-place RoPE it is the in-place forward plus a backward timed with "
        "retain_graph (base -> clone -> rope, so x is not a leaf).",
        "",
        "Minimum bytes:",
        *[f"- {k}: {v}" for k, v in FORMULAS.items() if k.split("/")[0] in args.ops],
        "",
        "Peers:",
        *[f"- {k}: {v}" for k, v in NOT_MEASURED.items() if k in args.ops],
        *[f"- {n}" for n in peers.notes],
        "",
    ]
    if ref_notes:
        header_notes += ["Reference modules that failed to import:", *[f"- {n}" for n in ref_notes], ""]
    if notes:
        header_notes += ["Skipped:", *notes, ""]
    if args.dry_run:
        header_notes.insert(0, "**DRY RUN**: tiny shapes, timings meaningless (plumbing check only).\n")
    if not final:
        header_notes.insert(0, "**PARTIAL**: the run had not finished when this was written.\n")
    md = B.header_markdown("Norms, clipped SwiGLU, in-place RoPE: speed and memory", info, copy_gbs, header_notes)
    md += "\n## Results\n\n" + B.markdown_table(rows) + "\n"
    md += "\n## Summary (base ms / ours ms; > 1: ours faster)\n\n" + B.summary_table(rows) + "\n"
    targets = target_rows(rows)
    if targets:
        md += "\n## Issue targets (ours)\n\n" + B.markdown_table(targets, TARGET_COLUMNS) + "\n"
    return md


if __name__ == "__main__":
    sys.exit(main())
