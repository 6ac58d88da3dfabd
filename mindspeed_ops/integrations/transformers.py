"""Swap ``mindspeed_ops`` operators into Hugging Face ``transformers`` models.

``apply(model)`` walks a model built by the installed ``transformers`` and replaces, per module
instance (other models in the process are untouched; :func:`revert` undoes it):

=================  ===========================================================================
family             what is swapped
=================  ===========================================================================
Qwen3-Next,        Gated DeltaNet: ``torch_chunk_gated_delta_rule`` -> ``chunk_gated_delta_rule``,
Qwen3.5,           ``causal_conv1d_fn`` -> ours; gated output norm -> ``rms_norm_gated``
Qwen3.5-MoE        (``casting='input'``: HF's rounding order); ``(1 + w)`` RMSNorm -> ``rms_norm``
                   (``offset=1``)
Kimi-Linear        KDA: ``chunk_kimi_delta_attention`` -> ``chunk_kda`` (when this build has it),
                   ``causal_conv1d_fn``; sigmoid-gated norm -> ``rms_norm_gated``
                   (``casting='fp32'``); RMSNorm -> ``rms_norm``
GPT-OSS            experts' clipped SwiGLU (``_apply_gate``) -> ``clipped_swiglu(interleaved=True)``
                   on every experts implementation; RMSNorm -> ``rms_norm``
DeepSeek-V4        mHC: hyper-connection (``rmsnorm_without_weight`` + ``sinkhorn`` +
                   ``mhc_pre_bmm``), the decoder layer's stream write-back (``mhc_post``), the final
                   hyper head; interleaved RoPE -> ``inplace_rope`` (on a copy: HF's function is
                   out of place); RMSNorms -> ``rms_norm``
the ``*ForCausalLM``  with ``labels`` in training mode: the loss comes from ``chunk_loss`` (fused
of these families  LM head + cross-entropy; ``logits`` is then ``None``), MoE auxiliary loss kept
=================  ===========================================================================

Module-level HF functions (``torch_chunk_gated_delta_rule`` etc.) are replaced once by a dispatcher
that calls ours only inside a layer that ``apply`` patched (a context variable marks it), so an
unpatched model in the same process keeps HF's code. Decode paths (single-token conv update,
recurrent GDN/KDA) stay HF's. A call our operator cannot take (an activation it does not implement,
``weight``/input dtypes HF would promote differently) falls back to HF's function.

:func:`install_fla_shim` (module :mod:`mindspeed_ops.integrations.fla_compat`) additionally makes our
``chunk_gated_delta_rule`` / ``chunk_kda`` importable where transformers probes for
flash-linear-attention, for models whose modeling code is imported afterwards; it never shadows a
real fla installation.

Tested with transformers 5.24. ``torch.compile`` over a patched layer may graph-break at the
dispatcher (it reads a context variable).
"""
from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.util
import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import api
from .fla_compat import install as install_fla_shim  # noqa: F401  (re-exported)

#: model families -> modeling module (only those the installed transformers has are used)
FAMILIES: dict[str, str] = {
    "qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
    "qwen3_5": "transformers.models.qwen3_5.modeling_qwen3_5",
    "qwen3_5_moe": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "kimi_linear": "transformers.models.kimi_linear.modeling_kimi_linear",
    "gpt_oss": "transformers.models.gpt_oss.modeling_gpt_oss",
    "deepseek_v4": "transformers.models.deepseek_v4.modeling_deepseek_v4",
}
_MODULE_TO_FAMILY = {v: k for k, v in FAMILIES.items()}
_GDN_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")

#: options of :func:`apply` (all on by default)
OPTIONS = ("gdn", "kda", "conv", "gated_norm", "rms_norm", "swiglu", "mhc", "rope", "loss")

_PATCHED_ATTR = "_mindspeed_ops_patched"  # instance attributes we set (deleted by revert)
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("mindspeed_ops_hf_active", default=frozenset())


def available_families() -> dict[str, bool]:
    """Which of :data:`FAMILIES` the installed transformers has (``{}`` without transformers)."""
    if importlib.util.find_spec("transformers") is None:
        return {}
    out = {}
    for fam, mod in FAMILIES.items():
        try:
            out[fam] = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            out[fam] = False
    return out


@dataclass
class ApplyReport:
    """What :func:`apply` swapped: ``swapped`` maps ``"<Class>: <what>"`` to the number of module
    instances; ``skipped`` lists what was left to HF and why."""

    swapped: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)

    def add(self, key: str, n: int = 1) -> None:
        self.swapped[key] = self.swapped.get(key, 0) + n

    def skip(self, why: str) -> None:
        if why not in self.skipped:
            self.skipped.append(why)

    def __bool__(self) -> bool:
        return bool(self.swapped)

    def __str__(self) -> str:
        lines = [f"{k} x{v}" for k, v in sorted(self.swapped.items())] or ["nothing swapped"]
        lines += [f"kept HF: {s}" for s in self.skipped]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# adapters: HF call signatures -> our operators


def _hf_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """HF/fla call of the chunked gated delta rule (SPEC 2.2) -> ``api.chunk_gated_delta_rule``."""
    if chunk_size not in (16, 32, 64):
        chunk_size = 64
    return api.chunk_gated_delta_rule(query, key, value, g=g, beta=beta, initial_state=initial_state,
                                      output_final_state=output_final_state,
                                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                                      chunk_size=chunk_size)


def _hf_chunk_kda(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """HF Kimi-Linear call of chunked KDA (SPEC 2.2) -> ``api.chunk_kda`` (fp32 initial state). HF's layer
    passes a packed batch's offsets as ``cu_seq_lens_q`` (not ``cu_seqlens``): they keep the sequences
    apart here as they do in the conv adapter (``B == 1``)."""
    if cu_seqlens is None and kwargs.get("cu_seq_lens_q") is not None and query.shape[0] == 1:
        cu_seqlens = kwargs["cu_seq_lens_q"].to(query.device)
    if initial_state is not None and initial_state.dtype != torch.float32:
        initial_state = initial_state.float()
    return api.chunk_kda(query, key, value, g=g, beta=beta, initial_state=initial_state,
                         output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                         cu_seqlens=cu_seqlens, chunk_size=chunk_size if chunk_size in (32, 64) else 64)


def _seq_idx(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """``[1, T]`` int32 sequence index of each packed position (``-1`` past ``cu_seqlens[-1]``)."""
    cu = cu_seqlens.to(torch.int64)
    pos = torch.arange(T, device=cu.device)
    idx = torch.searchsorted(cu[1:], pos, right=True)
    return torch.where(pos < cu[-1], idx, -1).to(torch.int32).unsqueeze(0)


def _hf_causal_conv1d_fn(original: Callable):
    def conv(hidden_states, weight, bias=None, activation=None, seq_idx=None, **kwargs):
        """HF ``causal_conv1d_fn(x [B, D, T], weight [D, W], bias, activation, **kwargs)`` ->
        ``api.causal_conv1d_fn``. Packed batches (``cu_seq_lens_q`` among HF's kwargs, ``B == 1``) get a
        ``seq_idx`` so that no tap crosses a sequence boundary."""
        if activation not in (None, "silu", "swish") or weight.dim() != 2:
            return original(hidden_states, weight, bias, activation=activation, seq_idx=seq_idx, **kwargs)
        cu = kwargs.get("cu_seq_lens_q")
        if seq_idx is None and cu is not None and hidden_states.shape[0] == 1:
            seq_idx = _seq_idx(cu.to(hidden_states.device), hidden_states.shape[-1])
        return api.causal_conv1d_fn(hidden_states, weight, bias, seq_idx=seq_idx, activation=activation)
    return conv


def _hf_interleaved_rope(original: Callable):
    def rope(x, cos, sin, unsqueeze_dim: int = 1):
        """DeepSeek-V4 ``apply_rotary_pos_emb(x [B, H, S, D], cos/sin [B, S, R/2])`` -> ``inplace_rope`` on a
        copy of ``x`` (HF's function returns a new tensor; ``x`` may be saved for another backward)."""
        if not (x.dim() == 4 and unsqueeze_dim == 1 and cos.dim() == 3 and cos.shape == sin.shape
                and cos.shape[0] in (1, x.shape[0]) and cos.shape[1] == x.shape[2]
                and 2 * cos.shape[-1] <= x.shape[-1]):
            return original(x, cos, sin, unsqueeze_dim)
        y = x.clone()
        if cos.shape[0] == 1:  # positions shared by the batch: row t of cos/sin is token t
            api.inplace_rope(y.transpose(1, 2), cos[0], sin[0])
        else:  # per-row positions: row (b, t) of the flattened tables
            B, S = cos.shape[:2]
            positions = torch.arange(B * S, device=x.device).view(B, S)
            api.inplace_rope(y.transpose(1, 2), cos.reshape(B * S, -1), sin.reshape(B * S, -1),
                             position_ids=positions)
        return y
    return rope


# ---------------------------------------------------------------------------------------------
# module-global dispatchers (installed once per modeling module and name)


def _dispatcher(module: types.ModuleType, name: str, option: str, make: Callable[[Callable], Callable]) -> bool:
    """Replace ``module.name`` by a function that runs ``make(original)`` while ``option`` is active
    (inside a patched layer) and the original otherwise. Idempotent; ``False`` if the name is absent."""
    current = getattr(module, name, None)
    if current is None:
        return False
    if getattr(current, "_mindspeed_ops_dispatch", False):
        return True
    ours = make(current)

    @functools.wraps(current)
    def dispatch(*args, **kwargs):
        if option in _ACTIVE.get():
            return ours(*args, **kwargs)
        return current(*args, **kwargs)

    dispatch._mindspeed_ops_dispatch = True
    dispatch._mindspeed_ops_original = current
    setattr(module, name, dispatch)
    return True


def _set(module: nn.Module, name: str, value) -> None:
    setattr(module, name, value)
    patched = module.__dict__.setdefault(_PATCHED_ATTR, [])
    if name not in patched:
        patched.append(name)


def _activate(module: nn.Module, options: frozenset) -> None:
    """Make ``module.forward`` run its class forward with ``options`` active for the dispatchers."""
    cls_forward = type(module).forward

    def forward(self, *args, **kwargs):
        token = _ACTIVE.set(_ACTIVE.get() | options)
        try:
            return cls_forward(self, *args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    _set(module, "forward", types.MethodType(forward, module))


# ---------------------------------------------------------------------------------------------
# replacement forwards


def _norm_eps(norm) -> float:
    """A transformers norm module's epsilon: ``variance_epsilon`` or ``eps`` (the name varies by model and
    version, e.g. DeepseekV4UnweightedRMSNorm has ``eps`` in 5.24 and ``variance_epsilon`` in 5.25)."""
    for name in ("variance_epsilon", "eps"):
        if hasattr(norm, name):
            return getattr(norm, name)
    raise AttributeError(f"{type(norm).__name__} has neither variance_epsilon nor eps")


def _rms_norm_forward(offset: float, same_dtype_only: bool = False):
    def forward(self, hidden_states):
        w = self.weight
        if same_dtype_only and w.dtype != hidden_states.dtype:
            return type(self).forward(self, hidden_states)
        return api.rms_norm(hidden_states, w, eps=_norm_eps(self), offset=offset)
    return forward


def _unweighted_rms_norm_forward(self, x):
    return api.rms_norm(x, None, eps=_norm_eps(self))


def _gated_norm_forward(casting: str):
    def forward(self, hidden_states, gate=None):
        act = getattr(self, "activation", "silu")
        if gate is None or act not in ("silu", "swish", "sigmoid"):
            return type(self).forward(self, hidden_states, gate)
        return api.rms_norm_gated(hidden_states, gate, self.weight, activation=act, eps=_norm_eps(self),
                                  casting=casting)
    return forward


def _gpt_oss_apply_gate(self, gate_up):
    return api.clipped_swiglu(gate_up, swiglu_alpha=self.alpha, swiglu_limit=self.limit, interleaved=True)


def _dsv4_hc_weights(flat: torch.Tensor, fn: torch.Tensor, eps: float) -> torch.Tensor:
    """``input_norm(flat) @ fnᵀ`` computed as ``(flat @ fnᵀ)·rstd`` (SPEC 1.12), fp32."""
    rstd = api.rmsnorm_without_weight(flat, eps=eps, rstd_dtype=torch.float32)
    return F.linear(flat, fn.float()) * rstd


def _dsv4_hyper_connection_forward(self, hidden_streams):
    B, S = hidden_streams.shape[:2]
    flat = hidden_streams.reshape(B, S, -1).float()
    mixes = _dsv4_hc_weights(flat, self.fn, _norm_eps(self.input_norm))
    pre, post, comb = api.sinkhorn(mixes, self.scale, self.base, hc_mult=self.hc_mult,
                                   sinkhorn_iters=self.hc_sinkhorn_iters, eps=self.hc_eps)
    return post, comb, api.mhc_pre_bmm(pre, hidden_streams)


def _dsv4_hyper_head_forward(self, x):
    flat = x.flatten(2).float()
    mixes = _dsv4_hc_weights(flat, self.hc_fn, _norm_eps(self.input_norm))
    pre = torch.sigmoid(mixes * self.hc_scale.float() + self.hc_base.float()) + self.eps
    return api.mhc_pre_bmm(pre, x)


def _dsv4_decoder_layer_forward(self, hidden_states, input_ids=None, **kwargs):
    """DeepSeek-V4 decoder layer with the stream write-back ``post·f + combᵀ·X`` as ``mhc_post``."""
    dtype = hidden_states.dtype
    post, comb, collapsed = self.attn_hc(hidden_states)
    attn_output, _ = self.self_attn(self.input_layernorm(collapsed), **kwargs)
    hidden_states = api.mhc_post(attn_output.to(dtype), hidden_states, post, comb)
    post, comb, collapsed = self.ffn_hc(hidden_states)
    mlp_output = self.mlp(self.post_attention_layernorm(collapsed), input_ids=input_ids)
    return api.mhc_post(mlp_output.to(dtype), hidden_states, post, comb)


def _causal_lm_forward(self, *args, **kwargs):
    """``*ForCausalLM.forward`` whose training loss is ``chunk_loss`` over the decoder's last hidden
    state (HF's ``ForCausalLMLoss`` semantics: labels shifted inside unless ``shift_labels`` is given,
    ``ignore_index=-100``, sum / ``num_items_in_batch`` when given, else mean)."""
    cls_forward = type(self).forward
    labels = kwargs.get("labels")
    decoder = getattr(self, getattr(self, "base_model_prefix", "model"), None)
    if labels is None or not self.training or len(args) > 1 or not isinstance(decoder, nn.Module) \
            or not isinstance(getattr(self, "lm_head", None), nn.Linear):
        return cls_forward(self, *args, **kwargs)
    captured = {}

    def hook(_module, _inputs, output):
        captured["h"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    handle = decoder.register_forward_hook(hook)
    try:
        out = cls_forward(self, *args, **{**kwargs, "labels": None, "logits_to_keep": 1, "return_dict": True})
    finally:
        handle.remove()
    hidden = captured["h"]
    shift = kwargs.get("shift_labels")
    if shift is None:
        shift = F.pad(labels, (0, 1), value=-100)[..., 1:]
    num_items = kwargs.get("num_items_in_batch")
    loss = api.chunk_loss(hidden, self.lm_head.weight, shift.to(hidden.device), bias=self.lm_head.bias,
                          ignore_index=-100, reduction="mean" if num_items is None else "sum",
                          softcap=getattr(self.config, "final_logit_softcapping", None))
    if num_items is not None:
        loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    aux = out.get("aux_loss") if hasattr(out, "get") else None
    if aux is not None and hasattr(self, "router_aux_loss_coef"):
        loss = loss + self.router_aux_loss_coef * aux.to(loss.device)
    fields = {k: v for k, v in out.items() if k not in ("loss", "logits")}
    result = type(out)(loss=loss, **fields)
    want_dict = kwargs.get("return_dict")
    if want_dict is None:
        want_dict = getattr(self.config, "return_dict", True)
    return result if want_dict else result.to_tuple()


def _with_signature_of(cls_forward: Callable, fn: Callable) -> Callable:
    """``fn`` with ``cls_forward``'s name, docstring and signature. ``generate`` reads
    ``inspect.signature(model.forward)``: without ``position_ids`` it passes none (left-padded rows got
    positions counted from the padding), without ``logits_to_keep`` the prefill builds [B, T, vocab] logits."""
    @functools.wraps(cls_forward)
    def forward(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    return forward


# ---------------------------------------------------------------------------------------------
# apply / revert


def _family_of(module: nn.Module) -> Optional[str]:
    return _MODULE_TO_FAMILY.get(type(module).__module__)


def _patch_module(m: nn.Module, fam: str, opts: set, report: ApplyReport) -> None:
    name = type(m).__name__
    mod = sys.modules[type(m).__module__]
    key = lambda what: f"{name}: {what}"  # noqa: E731

    if fam in _GDN_FAMILIES and name.endswith("GatedDeltaNet"):
        active = set()
        if "gdn" in opts and _dispatcher(mod, "torch_chunk_gated_delta_rule", "gdn",
                                         lambda orig: _hf_chunk_gated_delta_rule):
            active.add("gdn")
            report.add(key("chunk_gated_delta_rule"))
        if "conv" in opts and _dispatcher(mod, "causal_conv1d_fn", "conv", _hf_causal_conv1d_fn):
            active.add("conv")
            report.add(key("causal_conv1d_fn"))
        if active:
            _activate(m, frozenset(active))
    elif fam == "kimi_linear" and name == "KimiLinearDeltaAttention":
        active = set()
        if "kda" in opts:
            if callable(getattr(api, "chunk_kda", None)):
                if _dispatcher(mod, "chunk_kimi_delta_attention", "kda", lambda orig: _hf_chunk_kda):
                    active.add("kda")
                    report.add(key("chunk_kda"))
            else:
                report.skip("chunk_kimi_delta_attention (mindspeed_ops.api.chunk_kda is not in this build)")
        if "conv" in opts and _dispatcher(mod, "causal_conv1d_fn", "conv", _hf_causal_conv1d_fn):
            active.add("conv")
            report.add(key("causal_conv1d_fn"))
        if active:
            _activate(m, frozenset(active))
    elif name.endswith("RMSNormGated") and "gated_norm" in opts:
        _set(m, "forward", types.MethodType(_gated_norm_forward("fp32" if fam == "kimi_linear" else "input"), m))
        report.add(key("rms_norm_gated"))
    elif name.endswith("RMSNorm") and not name.endswith("UnweightedRMSNorm") and "rms_norm" in opts \
            and isinstance(getattr(m, "weight", None), torch.Tensor):
        offset = 1.0 if fam in _GDN_FAMILIES else 0.0
        _set(m, "forward", types.MethodType(_rms_norm_forward(offset, same_dtype_only=fam == "kimi_linear"), m))
        report.add(key("rms_norm"))
    elif name == "DeepseekV4UnweightedRMSNorm" and "rms_norm" in opts:
        _set(m, "forward", types.MethodType(_unweighted_rms_norm_forward, m))
        report.add(key("rms_norm"))
    elif name == "GptOssExperts" and "swiglu" in opts:
        _set(m, "_apply_gate", types.MethodType(_gpt_oss_apply_gate, m))
        report.add(key("clipped_swiglu"))
    elif fam == "deepseek_v4" and "mhc" in opts and name == "DeepseekV4HyperConnection":
        _set(m, "forward", types.MethodType(_dsv4_hyper_connection_forward, m))
        report.add(key("rmsnorm_without_weight + sinkhorn + mhc_pre_bmm"))
    elif fam == "deepseek_v4" and "mhc" in opts and name == "DeepseekV4HyperHead":
        _set(m, "forward", types.MethodType(_dsv4_hyper_head_forward, m))
        report.add(key("rmsnorm_without_weight + mhc_pre_bmm"))
    elif fam == "deepseek_v4" and "mhc" in opts and name == "DeepseekV4DecoderLayer":
        if all(hasattr(m, a) for a in ("attn_hc", "ffn_hc", "self_attn", "mlp", "input_layernorm",
                                       "post_attention_layernorm")):
            _set(m, "forward", types.MethodType(_dsv4_decoder_layer_forward, m))
            report.add(key("mhc_post"))
        else:
            report.skip("DeepseekV4DecoderLayer (unexpected attributes in this transformers version)")
    elif fam == "deepseek_v4" and "rope" in opts and name == "DeepseekV4Attention":
        if _dispatcher(mod, "apply_rotary_pos_emb", "rope", _hf_interleaved_rope):
            _activate(m, frozenset({"rope"}))
            report.add(key("inplace_rope"))
    elif name.endswith("ForCausalLM") and "loss" in opts:
        _set(m, "forward", types.MethodType(_with_signature_of(type(m).forward, _causal_lm_forward), m))
        report.add(key("chunk_loss"))


def apply(model: nn.Module, *, families: Optional[Iterable[str]] = None, **options: bool) -> ApplyReport:
    """Swap our operators into the supported modules of ``model`` (a transformers model), in place.

    Args:
        model: any ``nn.Module``; submodules of the families in :data:`FAMILIES` are patched.
        families: restrict to these family names (a name or a list of names; default: all).
        **options: turn pieces off, each ``True`` by default: ``gdn``, ``kda``, ``conv``, ``gated_norm``,
            ``rms_norm``, ``swiglu``, ``mhc``, ``rope``, ``loss`` (the ``chunk_loss`` head).

    Returns:
        an :class:`ApplyReport` (what was swapped, what stays HF's and why; falsy, with a
        ``UserWarning``, when the model has no module of these families). Applying twice is harmless.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: an unknown option or family name.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"apply: model must be a torch.nn.Module (a transformers model), got {type(model).__name__}")
    if isinstance(families, str):
        families = [families]
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"apply: unknown option(s) {unknown}; known: {', '.join(OPTIONS)}")
    fams = set(FAMILIES) if families is None else set(families)
    if fams - set(FAMILIES):
        raise ValueError(f"apply: unknown family {sorted(fams - set(FAMILIES))}; known: {', '.join(FAMILIES)}")
    opts = {o for o in OPTIONS if options.get(o, True)}
    report = ApplyReport()
    found = False
    for m in model.modules():
        fam = _family_of(m)
        if fam in fams:
            found = True
            _patch_module(m, fam, opts, report)
    if not found:
        report.skip(f"no module of the families {sorted(fams)} found in {type(model).__name__}")
        warnings.warn(f"mindspeed_ops apply: nothing swapped in {type(model).__name__}: it has no module of the "
                      f"supported families ({', '.join(sorted(fams))}) of the installed transformers",
                      UserWarning, stacklevel=2)
    return report


def revert(model: nn.Module) -> int:
    """Undo :func:`apply` on ``model``; returns the number of modules restored (0 when nothing was patched)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"revert: model must be a torch.nn.Module, got {type(model).__name__}")
    n = 0
    for m in model.modules():
        names = m.__dict__.pop(_PATCHED_ATTR, None)
        if names:
            for name in names:
                m.__dict__.pop(name, None)
            n += 1
    return n


def _family_apply(family: str):
    def fn(model: nn.Module, **options: bool) -> ApplyReport:
        return apply(model, families=[family], **options)
    fn.__name__ = f"apply_{family}"
    fn.__doc__ = f""":func:`apply` restricted to the {family} family (``{FAMILIES[family]}``)."""
    return fn


apply_qwen3_next = _family_apply("qwen3_next")
apply_qwen3_5 = _family_apply("qwen3_5")
apply_qwen3_5_moe = _family_apply("qwen3_5_moe")
apply_kimi_linear = _family_apply("kimi_linear")
apply_gpt_oss = _family_apply("gpt_oss")
apply_deepseek_v4 = _family_apply("deepseek_v4")

__all__ = ["apply", "revert", "ApplyReport", "FAMILIES", "OPTIONS", "available_families", "install_fla_shim",
           "apply_qwen3_next", "apply_qwen3_5", "apply_qwen3_5_moe", "apply_kimi_linear", "apply_gpt_oss",
           "apply_deepseek_v4"]
