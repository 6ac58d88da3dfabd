"""Implementations ATK measures ``ours`` against: PyTorch eager, ``torch.compile`` and the peer libraries.

A case file lists baselines by name (``baselines: [eager, compile, liger_rms_norm]``). Each name in
:data:`REGISTRY` says which library it needs and how to call that library with the case's inputs (the
same keyword arguments our operator gets). A peer import is optional: when the library is missing, the
baseline is skipped and the report says why; when a peer does not support a case's options (e.g.
Liger's RoPE with a partial rotary dim), :class:`Skip` says so. A peer call that fails at run time is a
failed row in the report, never a crash.

- ``eager``: the operator's reference (``reference:`` in the case file) called on the case's inputs, in
  their dtype. References compute in fp32 and round once, like a careful PyTorch implementation.
- ``compile``: ``torch.compile(reference, dynamic=False)`` (default mode).
- peers: one adapter per (library, operator). ``check=None`` marks a peer computing a different function
  (a speed reference only: its output is not compared with the eager one).

Adding a baseline: write ``def _build(ctx) -> Impl`` (raise :class:`Skip` where it does not apply) and
register it with :func:`peer`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .measure import Impl, dist_version, try_import


class Skip(Exception):
    """This baseline does not apply to the case (the message says why)."""


@dataclass
class Context:
    """What a baseline adapter may look at: the case, its dims, the resolved kwargs, dtype, callables."""

    case: Any
    dims: dict
    kwargs: dict
    dtype: Any
    device: str
    reference: Callable
    call: Callable
    inputs: dict = field(default_factory=dict)

    def kw(self, name: str, default=None):
        return self.kwargs.get(name, default)


@dataclass
class Baseline:
    name: str
    kind: str  # eager | compile | peer
    library: str  # label in the report
    dist: Optional[str]  # pip distribution (for its version); None: part of torch
    module: Optional[str]  # import that must succeed
    build: Callable[[Context], Impl]
    note: str = ""

    def status(self) -> tuple[bool, str]:
        """(available, version or reason)."""
        return _status(self.module, self.dist)


@functools.lru_cache(maxsize=None)
def _status(module: Optional[str], dist: Optional[str]) -> tuple[bool, str]:
    if module is None:
        return True, "torch " + (dist_version("torch") or "?")
    mod, err = try_import(module)
    if mod is None:
        return False, f"not installed ({err})"
    return True, f"{dist or module} {dist_version(dist) if dist else ''}".strip()


REGISTRY: dict[str, Baseline] = {}


def peer(name: str, library: str, dist: Optional[str], module: Optional[str], note: str = "", kind: str = "peer"):
    """Decorator registering ``build(ctx) -> Impl`` as baseline ``name``."""
    def deco(build):
        REGISTRY[name] = Baseline(name, kind, library, dist, module, build, note)
        return build
    return deco


def _mod(name: str):
    mod, err = try_import(name)
    if mod is None:
        raise Skip(f"import {name}: {err}")
    return mod


def _t(inp: dict, *names):
    return [inp.get(n) for n in names]


# --------------------------------------------------------------------------------------------------
# PyTorch


@peer("eager", "PyTorch eager", None, None, "the operator's reference in the input dtype (fp32 math)", kind="eager")
def _eager(ctx: Context) -> Impl:
    return Impl("eager", "eager", ctx.reference, note=f"reference {ctx.case.reference}", mutates=tuple(ctx.case.mutates),
                library="PyTorch")


@peer("compile", "torch.compile", None, None, "torch.compile(reference, dynamic=False)", kind="compile")
def _compile(ctx: Context) -> Impl:
    import torch

    return Impl("compile", "compile", torch.compile(ctx.reference, dynamic=False),
                note="torch.compile of the reference, default mode", mutates=tuple(ctx.case.mutates),
                library="PyTorch")


@peer("torch_rms_norm", "PyTorch eager", None, None, "torch.nn.functional.rms_norm (aten)", kind="eager")
def _torch_rms_norm(ctx: Context) -> Impl:
    import torch.nn.functional as F

    if ctx.kw("offset", 0.0) != 0.0:
        raise Skip("F.rms_norm has no offset (Gemma 1+w) form")
    return Impl("torch F.rms_norm", "eager",
                lambda x, weight=None, eps=1e-6, **_: F.rms_norm(x, (x.shape[-1],), weight, eps=eps),
                note="PyTorch's own RMSNorm (aten), eager", library="PyTorch")


@peer("torch_cross_entropy", "PyTorch eager", None, None, "F.cross_entropy on fp32-upcast logits", kind="eager")
def _torch_ce(ctx: Context) -> Impl:
    import torch.nn.functional as F

    if ctx.kw("lse_square_scale", 0.0) or ctx.kw("softcap") is not None or "loss_weight" in ctx.inputs:
        raise Skip("F.cross_entropy has no z-loss, softcap or per-token weight")
    return Impl("torch F.cross_entropy", "eager",
                lambda logits, labels, ignore_index=-100, reduction="mean", label_smoothing=0.0, **_:
                F.cross_entropy(logits.float(), labels, ignore_index=ignore_index, reduction=reduction,
                                label_smoothing=label_smoothing),
                note="F.cross_entropy(logits.float(), ...) (fp32 upcast: materialises an fp32 copy)",
                library="PyTorch")


def _chunk_cumsum_torch(g, chunk_size=64, reverse=False, scale=None, cu_seqlens=None, output_dtype=None, **_):
    """Vectorised PyTorch chunk-local cumsum (fixed length): pad T to a multiple of the chunk, cumsum
    inside ``[B, NT, BT, ...]`` (a flip for the suffix form), fp32."""
    import torch

    B, T = g.shape[:2]
    nt = -(-T // chunk_size)
    x = g.float()
    if nt * chunk_size != T:
        x = torch.cat([x, x.new_zeros(B, nt * chunk_size - T, *g.shape[2:])], 1)
    x = x.view(B, nt, chunk_size, *g.shape[2:])
    x = x.flip(2).cumsum(2).flip(2) if reverse else x.cumsum(2)
    x = x.reshape(B, nt * chunk_size, *g.shape[2:])[:, :T]
    if scale is not None:
        x = x * scale
    return x.to(output_dtype or g.dtype)


@peer("torch_chunk_cumsum", "PyTorch eager", None, None, "vectorised PyTorch chunk cumsum (fixed length)",
      kind="eager")
def _torch_chunk_cumsum(ctx: Context) -> Impl:
    if ctx.inputs.get("cu_seqlens") is not None:
        raise Skip("the vectorised PyTorch formulation covers fixed-length inputs")
    return Impl("torch (vectorised)", "eager", _chunk_cumsum_torch,
                note="pad + view [B, NT, BT, ...] + cumsum, fp32 (a fairer eager baseline than the reference's "
                     "per-chunk loop)", library="PyTorch")


@peer("compile_chunk_cumsum", "torch.compile", None, None, "torch.compile of the vectorised chunk cumsum",
      kind="compile")
def _compile_chunk_cumsum(ctx: Context) -> Impl:
    import torch

    if ctx.inputs.get("cu_seqlens") is not None:
        raise Skip("the vectorised PyTorch formulation covers fixed-length inputs")
    return Impl("compile (vectorised)", "compile", torch.compile(_chunk_cumsum_torch, dynamic=False),
                note="torch.compile of the vectorised chunk cumsum", library="PyTorch")


# --------------------------------------------------------------------------------------------------
# Liger-Kernel


@peer("liger_rms_norm", "Liger-Kernel", "liger-kernel", "liger_kernel.ops.rms_norm")
def _liger_rms(ctx: Context) -> Impl:
    F = _mod("liger_kernel.ops.rms_norm").LigerRMSNormFunction
    if ctx.case.op == "rmsnorm_without_weight":
        if not ctx.kw("return_normalized", False):
            raise Skip("Liger RMSNorm returns y, not rstd")
        return Impl("liger (y only)", "peer", lambda x, eps=1e-6, **_: F.apply(x, None, eps, 0.0, "gemma", False, None),
                    note="LigerRMSNormFunction(W=None): returns y only (rstd kept internally)", check=None,
                    library="Liger-Kernel")
    return Impl("liger", "peer",
                lambda x, weight=None, eps=1e-6, offset=0.0, **_: F.apply(x, weight, eps, offset, "gemma", False, None),
                note="LigerRMSNormFunction, casting_mode='gemma' (fp32), in_place=False", library="Liger-Kernel")


@peer("liger_rope", "Liger-Kernel", "liger-kernel", "liger_kernel.ops.rope",
      "rotate-half layout: a different function, speed reference only")
def _liger_rope(ctx: Context) -> Impl:
    import torch

    F = _mod("liger_kernel.ops.rope").LigerRopeFunction
    x = ctx.inputs["x"]
    if x.dim() != 4 or ctx.inputs.get("position_ids") is not None:
        raise Skip("Liger RoPE needs [B, T, H, D] without position_ids")
    H, D, R = x.shape[2], x.shape[3], 2 * ctx.inputs["cos"].shape[-1]
    if R != D or H % 2:
        raise Skip("Liger RoPE rotates whole heads (needs R == D) and takes q and k: H must be even")

    def prep(inp):
        x, cos, sin = inp["x"], inp["cos"], inp["sin"]
        return {"q": x[:, :, : H // 2].contiguous(), "k": x[:, :, H // 2:].contiguous(),
                "cos": torch.cat([cos, cos], -1).to(x.dtype), "sin": torch.cat([sin, sin], -1).to(x.dtype)}

    return Impl("liger (rotate-half)", "peer",
                lambda q, k, cos, sin: F.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin),
                note="LigerRopeFunction: rotate-half layout (a different function; speed reference only), "
                     "q/k = H/2 heads each, in place", prepare=prep, mutates=("q", "k"), grad_names=("q", "k"),
                check=None, library="Liger-Kernel")


@peer("liger_cross_entropy", "Liger-Kernel", "liger-kernel", "liger_kernel.ops.cross_entropy")
def _liger_ce(ctx: Context) -> Impl:
    F = _mod("liger_kernel.ops.cross_entropy").LigerCrossEntropyFunction
    if "loss_weight" in ctx.inputs:
        raise Skip("Liger CE has class weights, not per-token weights")
    return Impl("liger", "peer",
                lambda logits, labels, ignore_index=-100, reduction="mean", label_smoothing=0.0, lse_square_scale=0.0,
                softcap=None, **_: F.apply(logits, labels, None, ignore_index, lse_square_scale, label_smoothing,
                                           reduction, softcap)[0],
                note="LigerCrossEntropyFunction (writes the gradient into the logits during forward)",
                mutates=("logits",), library="Liger-Kernel")


@peer("liger_fused_linear_cross_entropy", "Liger-Kernel", "liger-kernel", "liger_kernel.ops.fused_linear_cross_entropy")
def _liger_flce(ctx: Context) -> Impl:
    F = _mod("liger_kernel.ops.fused_linear_cross_entropy").LigerFusedLinearCrossEntropyFunction
    if "loss_weight" in ctx.inputs:
        raise Skip("Liger FLCE has class weights, not per-token weights")
    return Impl("liger flce", "peer",
                lambda hidden, weight, labels, bias=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                lse_square_scale=0.0, softcap=None, **_: F.apply(hidden, weight, labels, bias, None, ignore_index,
                                                                 lse_square_scale, label_smoothing, reduction,
                                                                 softcap)[0],
                note="LigerFusedLinearCrossEntropyFunction (gradients computed during forward)", library="Liger-Kernel")


@peer("liger_mhc_pre", "Liger-Kernel", "liger-kernel", "liger_kernel.ops.mhc")
def _liger_mhc_pre(ctx: Context) -> Impl:
    F = _mod("liger_kernel.ops.mhc").LigerMHCPreFunction
    if ctx.kw("out_dtype") is not None:
        raise Skip("Liger mHC pre returns x.dtype only")
    return Impl("liger", "peer", lambda pre, x, **_: F.apply(x, pre), note="LigerMHCPreFunction(x, h_pre)",
                library="Liger-Kernel")


@peer("liger_mhc_post", "Liger-Kernel", "liger-kernel", "liger_kernel.ops.mhc")
def _liger_mhc_post(ctx: Context) -> Impl:
    F = _mod("liger_kernel.ops.mhc").LigerMHCPostResFunction

    def prep(inp):  # Liger mixes with h_res[k, j]; ours (DeepSeek) with h_res[j, k]
        return {**inp, "h_res": inp["h_res"].transpose(-1, -2).contiguous()}

    return Impl("liger", "peer", lambda x, residual, h_post, h_res, **_: F.apply(residual, x, h_post, h_res),
                note="LigerMHCPostResFunction(x_streams, f_out, h_post, h_res^T)", prepare=prep,
                library="Liger-Kernel")


# --------------------------------------------------------------------------------------------------
# flash-linear-attention


@peer("fla_l2norm", "flash-linear-attention", "fla-core", "fla.modules.l2norm")
def _fla_l2(ctx: Context) -> Impl:
    f = _mod("fla.modules.l2norm").l2norm
    return Impl("fla", "peer", lambda x, eps=1e-6, output_dtype=None, **_: f(x, eps=eps, output_dtype=output_dtype),
                note="fla.modules.l2norm.l2norm", library="flash-linear-attention")


@peer("fla_rms_norm", "flash-linear-attention", "fla-core", "fla.modules.layernorm")
def _fla_rms(ctx: Context) -> Impl:
    f = _mod("fla.modules.layernorm").rms_norm
    if ctx.kw("offset", 0.0) != 0.0:
        raise Skip("fla rms_norm has no offset form")
    if ctx.case.op == "rmsnorm_without_weight":
        if not ctx.kw("return_normalized", False):
            raise Skip("fla rms_norm returns y, not rstd")
        return Impl("fla (y only)", "peer", lambda x, eps=1e-6, **_: f(x, None, None, eps=eps),
                    note="fla.modules.layernorm.rms_norm(weight=None): returns y only", check=None,
                    library="flash-linear-attention")
    return Impl("fla", "peer", lambda x, weight=None, eps=1e-6, **_: f(x, weight, None, eps=eps),
                note="fla.modules.layernorm.rms_norm", library="flash-linear-attention")


@peer("fla_rms_norm_gated", "flash-linear-attention", "fla-core", "fla.modules.fused_norm_gate")
def _fla_gated(ctx: Context) -> Impl:
    f = _mod("fla.modules.fused_norm_gate").rms_norm_gated
    if ctx.kw("group_size") is not None or not ctx.kw("norm_before_gate", True) or ctx.kw("casting", "fp32") != "fp32":
        raise Skip("fla rms_norm_gated: no groups, gate-first order or casting='input'")
    return Impl("fla", "peer",
                lambda x, g, weight=None, bias=None, activation="swish", residual=None, prenorm=False,
                residual_in_fp32=False, eps=1e-6, **_: f(x, g, weight, bias, activation, residual, prenorm,
                                                         residual_in_fp32, eps),
                note="fla.modules.fused_norm_gate.rms_norm_gated", library="flash-linear-attention")


@peer("fla_rotary", "flash-linear-attention", "fla-core", "fla.modules.rotary")
def _fla_rotary(ctx: Context) -> Impl:
    f = _mod("fla.modules.rotary").rotary_embedding
    x = ctx.inputs["x"]
    if x.dim() != 4 or ctx.inputs.get("position_ids") is not None or ctx.kw("inverse", False):
        raise Skip("fla rotary: [B, T, H, D] without position_ids, forward angle only")
    if 2 * ctx.inputs["cos"].shape[-1] != x.shape[-1]:
        raise Skip("fla rotates the first R channels, ours the last R: equal only when R == D")
    dt = ctx.dtype
    return Impl("fla", "peer", lambda x, cos, sin, **_: f(x, cos, sin, interleaved=True, inplace=True),
                note="fla rotary_embedding(interleaved=True, inplace=True), cos/sin in x.dtype", mutates=("x",),
                prepare=lambda inp: {**inp, "cos": inp["cos"].to(dt), "sin": inp["sin"].to(dt)},
                library="flash-linear-attention")


@peer("fla_cross_entropy", "flash-linear-attention", "fla-core", "fla.modules.fused_cross_entropy")
def _fla_ce(ctx: Context) -> Impl:
    f = _mod("fla.modules.fused_cross_entropy").cross_entropy_loss
    if "loss_weight" in ctx.inputs or ctx.kw("reduction", "mean") != "mean":
        raise Skip("adapter covers reduction='mean' without per-token weights")

    def run(logits, labels, ignore_index=-100, label_smoothing=0.0, lse_square_scale=0.0, softcap=None, **_):
        losses, _z = f(logits, labels, label_smoothing, 1.0, lse_square_scale, softcap, ignore_index)
        return losses.sum() / (labels != ignore_index).sum().clamp_min(1)

    return Impl("fla", "peer", run, note="fla cross_entropy_loss (unreduced) + mean over valid rows",
                library="flash-linear-attention")


@peer("fla_fused_linear_cross_entropy", "flash-linear-attention", "fla-core", "fla.modules.fused_linear_cross_entropy")
def _fla_flce(ctx: Context) -> Impl:
    f = _mod("fla.modules.fused_linear_cross_entropy").fused_linear_cross_entropy_loss
    if "loss_weight" in ctx.inputs or ctx.kw("lse_square_scale", 0.0):
        raise Skip("fla FLCE: no per-token weights, no z-loss")
    if ctx.kw("reduction", "mean") not in ("mean", "sum"):
        raise Skip("fla FLCE reduces to a scalar (mean or sum) only")
    return Impl("fla flce", "peer",
                lambda hidden, weight, labels, bias=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                softcap=None, **_: f(hidden, labels, weight, bias, ignore_index, label_smoothing, 1.0, softcap,
                                     reduction=reduction),
                note="fla fused_linear_cross_entropy_loss (num_chunks=8)", library="flash-linear-attention")


@peer("fla_causal_conv1d", "flash-linear-attention", "fla-core", "fla.modules.convolution")
def _fla_conv(ctx: Context) -> Impl:
    f = _mod("fla.modules.convolution").causal_conv1d
    return Impl("fla", "peer",
                lambda x, weight, bias=None, residual=None, initial_state=None, activation=None, cu_seqlens=None,
                output_final_state=False, **_: f(x, weight, bias, residual, initial_state, output_final_state,
                                                 activation, backend="triton", cu_seqlens=cu_seqlens),
                note="fla.modules.convolution.causal_conv1d (Triton backend), weight [D, W]",
                prepare=lambda inp: {**inp, "weight": inp["weight"].t().contiguous()},
                library="flash-linear-attention")


@peer("fla_chunk_local_cumsum", "flash-linear-attention", "fla-core", "fla.ops.utils.cumsum")
def _fla_cumsum(ctx: Context) -> Impl:
    f = _mod("fla.ops.utils.cumsum").chunk_local_cumsum
    return Impl("fla", "peer",
                lambda g, chunk_size=64, reverse=False, scale=None, cu_seqlens=None, output_dtype=None, **_:
                f(g, chunk_size, reverse=reverse, scale=scale, cu_seqlens=cu_seqlens, output_dtype=output_dtype),
                note="fla.ops.utils.cumsum.chunk_local_cumsum", library="flash-linear-attention")


@peer("fla_solve_tril", "flash-linear-attention", "fla-core", "fla.ops.utils.solve_tril")
def _fla_solve_tril(ctx: Context) -> Impl:
    import torch

    f = _mod("fla.ops.utils.solve_tril").solve_tril
    return Impl("fla", "peer",
                lambda A, cu_seqlens=None, output_dtype=torch.float32, **_: f(A, cu_seqlens,
                                                                              output_dtype=output_dtype),
                note="fla.ops.utils.solve_tril.solve_tril (A strictly lower)", library="flash-linear-attention")


@peer("fla_sinkhorn", "flash-linear-attention", "fla-core", "fla.ops.utils.sinkhorn",
      "log-domain Sinkhorn without eps: a different function, speed reference only")
def _fla_sinkhorn(ctx: Context) -> Impl:
    f = _mod("fla.ops.utils.sinkhorn").sinkhorn
    if ctx.inputs["logits"].shape[-1] > 8:
        raise Skip("fla sinkhorn supports n <= 8")
    return Impl("fla (log-domain)", "peer", lambda logits, iters=20, **_: f(logits, iters),
                note="fla.ops.utils.sinkhorn.sinkhorn (log-domain, no eps; speed reference only)", check=None,
                library="flash-linear-attention")


def _fla_chunked(ctx: Context, f, what: str, note: str) -> Impl:
    """fla's chunked GDN / KDA (one signature for both: ``g`` the log decay as ours, chunk size 64 only)."""
    if ctx.kw("chunk_size", 64) != 64:
        raise Skip(f"fla's chunked {what} uses chunk_size 64 only")
    return Impl("fla", "peer",
                lambda q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, cu_seqlens=None, **_:
                f(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens),
                note=note, library="flash-linear-attention")


@peer("fla_chunk_gated_delta_rule", "flash-linear-attention", "fla-core", "fla.ops.gated_delta_rule")
def _fla_gdn(ctx: Context) -> Impl:
    return _fla_chunked(ctx, _mod("fla.ops.gated_delta_rule").chunk_gated_delta_rule, "GDN",
                        "fla.ops.gated_delta_rule.chunk_gated_delta_rule (fla 0.6.0 refuses its backward on Hopper "
                        "with triton 3.4-3.7.0: DESIGN 8)")


@peer("fla_chunk_kda", "flash-linear-attention", "fla-core", "fla.ops.kda")
def _fla_kda(ctx: Context) -> Impl:
    return _fla_chunked(ctx, _mod("fla.ops.kda").chunk_kda, "KDA", "fla.ops.kda.chunk_kda (per-channel log decay g)")


# --------------------------------------------------------------------------------------------------
# cut-cross-entropy, causal-conv1d, TransformerEngine (adapters written from their documented
# signatures; not run in CI: a mismatch shows up as a failed row)


@peer("cce", "cut-cross-entropy", "cut-cross-entropy", "cut_cross_entropy")
def _cce(ctx: Context) -> Impl:
    f = _mod("cut_cross_entropy").linear_cross_entropy
    if "loss_weight" in ctx.inputs or ctx.kw("lse_square_scale", 0.0) or ctx.kw("label_smoothing", 0.0):
        raise Skip("cut-cross-entropy: no per-token weights, z-loss or label smoothing")
    if ctx.inputs.get("bias") is not None:
        raise Skip("cut-cross-entropy 25.1: no bias argument")
    # its signature has no bias at all (passing bias=None is a TypeError: seen on the H200)
    return Impl("cce", "peer",
                lambda hidden, weight, labels, bias=None, ignore_index=-100, reduction="mean", softcap=None, **_:
                f(hidden, weight, labels, ignore_index=ignore_index, softcap=softcap, reduction=reduction),
                note="cut_cross_entropy.linear_cross_entropy", library="cut-cross-entropy")


@peer("causal_conv1d_cuda", "causal-conv1d", "causal-conv1d", "causal_conv1d")
def _dao_conv(ctx: Context) -> Impl:
    f = _mod("causal_conv1d").causal_conv1d_fn
    if ctx.case.op == "causal_conv1d_fn":
        return Impl("causal-conv1d", "peer",
                    lambda x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                    final_states_out=None, activation=None, **_: f(x, weight, bias, seq_idx, initial_states,
                                                                   return_final_states, final_states_out, activation),
                    note="causal_conv1d.causal_conv1d_fn (CUDA)", library="causal-conv1d")
    if any(ctx.inputs.get(k) is not None for k in ("cu_seqlens", "residual", "initial_state")) \
            or ctx.kw("output_final_state", False):
        raise Skip("adapter covers fixed-length calls without residual or states")
    return Impl("causal-conv1d", "peer",
                lambda x, weight, bias=None, activation=None, **_: f(x, weight, bias, activation=activation),
                note="causal_conv1d.causal_conv1d_fn (CUDA) on the channel-last view x.transpose(1, 2)",
                prepare=lambda inp: {**inp, "x": inp["x"].transpose(1, 2), "weight": inp["weight"].t().contiguous()},
                check=lambda out: out.transpose(1, 2), library="causal-conv1d")


@peer("te_rmsnorm", "TransformerEngine", "transformer-engine", "transformer_engine.pytorch")
def _te_rmsnorm(ctx: Context) -> Impl:
    te = _mod("transformer_engine.pytorch")
    if ctx.kw("offset", 0.0) not in (0.0, 1.0) or ctx.inputs.get("weight") is None:
        raise Skip("TE RMSNorm needs a weight (offset 0, or 1 via zero_centered_gamma)")
    D = ctx.inputs["x"].shape[-1]
    w = ctx.inputs["weight"]
    mod = te.RMSNorm(D, eps=ctx.kw("eps", 1e-6), zero_centered_gamma=ctx.kw("offset", 0.0) == 1.0,
                     params_dtype=w.dtype, device=ctx.device)
    with __import__("torch").no_grad():
        mod.weight.copy_(w)
    return Impl("te", "peer", lambda x, **_: mod(x), note="transformer_engine.pytorch.RMSNorm (weight as a parameter)",
                grad_names=("x",), library="TransformerEngine")


@peer("te_cross_entropy", "TransformerEngine", "transformer-engine", "transformer_engine.pytorch.cross_entropy")
def _te_ce(ctx: Context) -> Impl:
    f = _mod("transformer_engine.pytorch.cross_entropy").parallel_cross_entropy
    if "loss_weight" in ctx.inputs or ctx.kw("lse_square_scale", 0.0) or ctx.kw("softcap") is not None \
            or ctx.kw("reduction", "mean") != "mean":
        raise Skip("adapter covers reduction='mean' without weights, z-loss or softcap")

    def run(logits, labels, ignore_index=-100, label_smoothing=0.0, **_):
        rows = f(logits.unsqueeze(0), labels.unsqueeze(0), label_smoothing, False, None, ignore_index)
        return rows.sum() / (labels != ignore_index).sum().clamp_min(1)

    return Impl("te", "peer", run, note="transformer_engine parallel_cross_entropy (unreduced) + mean",
                library="TransformerEngine")


@peer("te_moe_sort_chunks", "TransformerEngine", "transformer-engine", "transformer_engine.pytorch")
def _te_sort(ctx: Context) -> Impl:
    te = _mod("transformer_engine.pytorch")
    import torch

    dev = ctx.device

    def prep(inp):
        return {**inp, "split_sizes": torch.as_tensor(inp["split_sizes"], device=dev),
                "sorted_idxs": torch.as_tensor(inp["sorted_idxs"], device=dev)}

    if "probs" in ctx.inputs:
        f = te.moe_sort_chunks_by_index_with_probs
        return Impl("te", "peer", lambda inp, probs, split_sizes, sorted_idxs, **_: f(inp, probs, split_sizes,
                                                                                        sorted_idxs),
                    note="transformer_engine.pytorch.moe_sort_chunks_by_index_with_probs", prepare=prep,
                    library="TransformerEngine")
    f = te.moe_sort_chunks_by_index
    return Impl("te", "peer", lambda inp, split_sizes, sorted_idxs, **_: f(inp, split_sizes, sorted_idxs),
                note="transformer_engine.pytorch.moe_sort_chunks_by_index", prepare=prep, library="TransformerEngine")


def build(name: str, ctx: Context) -> Impl:
    """The :class:`Impl` of baseline ``name`` for ``ctx``. Raises :class:`Skip` (with the reason) when
    its library is missing or it does not apply."""
    b = REGISTRY[name]
    ok, why = b.status()
    if not ok:
        raise Skip(why)
    impl = b.build(ctx)
    if not impl.library:
        impl.library = b.library
    return impl


def installed() -> dict[str, dict]:
    """``{baseline: {library, available, detail}}`` for the report header."""
    out = {}
    for name, b in REGISTRY.items():
        ok, why = b.status()
        out[name] = {"library": b.library, "available": ok, "detail": why, "note": b.note}
    return out


__all__ = ["Skip", "Context", "Baseline", "REGISTRY", "peer", "build", "installed"]
