"""A small hybrid decoder-only language model built from ``mindspeed_ops`` operators, used where
real models use them:

- **Gated DeltaNet** mixers (Qwen3-Next / Qwen3.5): ``causal_conv1d`` (SiLU) on the q/k/v projection,
  ``l2norm`` on q and k, ``chunk_gated_delta_rule`` with grouped value heads, ``rms_norm_gated``
  (swish gate) on the output.
- a **KDA** mixer (Kimi-Linear): per-channel decay, ``chunk_kda`` with the in-kernel q/k l2norm,
  sigmoid-gated output norm. When ``mindspeed_ops.api.chunk_kda`` is not part of the installed build,
  ``kda="auto"`` builds a Gated DeltaNet mixer in its place (with a message; ``kda="on"`` raises).
- a **full-attention** mixer with DeepSeek-V4-style interleaved RoPE (``inplace_rope``) on the last
  ``rope_dim`` channels of each q/k head, and PyTorch's causal SDPA.
- a **GPT-OSS-style MoE MLP** after every mixer: top-k softmax router, experts with biases and the
  clipped SwiGLU on interleaved gate/up columns (``clipped_swiglu``), and the expert-parallel token
  dispatch of Megatron (tokens grouped by "virtual rank" then by expert, regrouped expert-major and
  back with ``sort_chunks_by_idx_with_probs`` / ``sort_chunks_by_idx``).
- **mHC residual streams** (DeepSeek-V4): ``hc_mult`` residual streams; every sublayer reads them
  through ``rmsnorm_without_weight`` -> projection -> ``sinkhorn`` -> ``mhc_pre_bmm`` and writes back
  with ``mhc_post``; pre-norm ``rms_norm`` inside each sublayer.
- the **head**: a final stream collapse, ``rms_norm`` and ``chunk_loss`` (fused LM head +
  cross-entropy, never materialising ``[tokens, vocab]`` logits).

Every operator is called through :mod:`mindspeed_ops.api`, so the device and
``mindspeed_ops.use_backend`` decide between the Triton kernels and the pure-PyTorch reference; the
model code does not change.

Shapes: tokens ``[B, T]`` int64 (byte values for the byte-level corpus), residual streams
``[B, T, hc_mult, d_model]``.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import api

LAYER_KINDS = ("gdn", "kda", "attn")


def kda_available() -> bool:
    """Whether this build of mindspeed_ops has ``api.chunk_kda`` (SPEC 1.11.3)."""
    return callable(getattr(api, "chunk_kda", None))


@dataclass
class HybridConfig:
    """Sizes of :class:`HybridLM`. ``layers`` is a comma-separated pattern of mixer kinds
    (``gdn``, ``kda``, ``attn``); every mixer is followed by an MoE MLP."""

    vocab_size: int = 256
    d_model: int = 128
    layers: str = "gdn,kda,gdn,attn"
    # linear attention (GDN / KDA): H q/k heads, HV value heads (GDN: grouped, HV = G*H), head dim
    lin_heads: int = 2
    lin_v_heads: int = 4
    lin_head_dim: int = 32
    conv_width: int = 4
    chunk_size: int = 64
    # full attention
    attn_heads: int = 4
    attn_head_dim: int = 32
    rope_dim: int = 16
    rope_theta: float = 10000.0
    max_seq_len: int = 4096
    # MoE MLP (GPT-OSS style)
    experts: int = 4
    top_k: int = 2
    expert_ffn: int = 128
    moe_groups: int = 2  # "virtual expert-parallel ranks" for the sort_chunks_by_idx dispatch
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    aux_loss_coef: float = 0.01
    # mHC
    hc_mult: int = 4
    sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    norm_eps: float = 1e-6
    # "auto": KDA when api.chunk_kda exists, else a GDN mixer in its place; "on": require it; "off": GDN
    kda: str = "auto"
    init_std: float = 0.02

    def layer_kinds(self) -> list[str]:
        kinds = [s.strip() for s in self.layers.split(",") if s.strip()]
        bad = [k for k in kinds if k not in LAYER_KINDS]
        if not kinds or bad:
            raise ValueError(f"HybridConfig.layers: expected a comma-separated list of {LAYER_KINDS}, "
                             f"got {self.layers!r}")
        return kinds

    def resolved_kinds(self) -> list[str]:
        """The mixers that are actually built (``kda`` resolved against this build)."""
        if self.kda not in ("auto", "on", "off"):
            raise ValueError(f"HybridConfig.kda must be 'auto', 'on' or 'off', got {self.kda!r}")
        kinds = self.layer_kinds()
        if "kda" not in kinds or self.kda == "auto" and kda_available():
            return kinds
        if self.kda == "on":
            if not kda_available():
                raise RuntimeError("HybridConfig.kda='on' but mindspeed_ops.api.chunk_kda is not available in this "
                                   "build (use kda='auto' to run a Gated DeltaNet mixer in its place)")
            return kinds
        return ["gdn" if k == "kda" else k for k in kinds]

    def to_dict(self) -> dict:
        return asdict(self)


def kda_substitution_message(cfg: HybridConfig) -> Optional[str]:
    """A one-line notice when KDA layers of ``cfg.layers`` run as GDN mixers (else ``None``)."""
    kinds, built = cfg.layer_kinds(), cfg.resolved_kinds()
    swapped = [i for i, (a, b) in enumerate(zip(kinds, built)) if a != b]
    if not swapped:
        return None
    why = ("mindspeed_ops.api.chunk_kda is not available in this build" if cfg.kda == "auto"
           else "kda='off'")
    return (f"KDA layer(s) {swapped} run as Gated DeltaNet mixers: {why}; they switch to KDA automatically once "
            f"api.chunk_kda exists (kda='on' requires it)")


def _inv_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


class RMSNorm(nn.Module):
    """Weighted RMSNorm through ``api.rms_norm`` (fp32 weight, any activation dtype)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return api.rms_norm(x, self.weight, eps=self.eps)


class GatedDeltaNet(nn.Module):
    """Qwen3-Next-style Gated DeltaNet mixer (``[B, T, d_model] -> [B, T, d_model]``).

    One input projection gives q, k (``H`` heads), v and the output gate z (``HV`` heads), and the
    per-value-head ``b`` (beta = sigmoid(b)) and ``a`` (decay ``g = -exp(A_log)·softplus(a + dt_bias)``).
    q/k/v pass a depthwise causal conv (width ``conv_width``, SiLU), q and k are L2-normalised, the
    chunked gated delta rule mixes over time, and a swish-gated RMSNorm precedes the output projection.
    """

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        H, HV, K = cfg.lin_heads, cfg.lin_v_heads, cfg.lin_head_dim
        if HV % H:
            raise ValueError(f"HybridConfig: lin_v_heads ({HV}) must be a multiple of lin_heads ({H})")
        self.H, self.HV, self.K, self.V = H, HV, K, K
        self.chunk_size, self.eps = cfg.chunk_size, cfg.norm_eps
        self.conv_dim = 2 * H * K + HV * K
        self.splits = [self.conv_dim, HV * K, HV, HV]
        self.in_proj = nn.Linear(cfg.d_model, sum(self.splits), bias=False)
        # depthwise conv weight, width-major [W, D] (an nn.Conv1d weight [D, 1, W] transposed)
        bound = 1.0 / math.sqrt(cfg.conv_width)
        self.conv_weight = nn.Parameter(torch.empty(cfg.conv_width, self.conv_dim).uniform_(-bound, bound))
        self.A_log = nn.Parameter(torch.empty(HV).uniform_(1.0, 16.0).log())
        dt = torch.exp(torch.empty(HV).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(_inv_softplus(dt))
        self.norm_weight = nn.Parameter(torch.ones(self.V))
        self.out_proj = nn.Linear(HV * self.V, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        H, HV, K, V = self.H, self.HV, self.K, self.V
        qkv, z, b, a = self.in_proj(x).split(self.splits, dim=-1)
        qkv, _ = api.causal_conv1d(qkv, self.conv_weight, activation="silu")
        q, k, v = qkv.split([H * K, H * K, HV * V], dim=-1)
        q = api.l2norm(q.reshape(B, T, H, K))
        k = api.l2norm(k.reshape(B, T, H, K))
        v = v.reshape(B, T, HV, V)
        beta = torch.sigmoid(b)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        o, _ = api.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=self.chunk_size)
        o = api.rms_norm_gated(o, z.reshape(B, T, HV, V), self.norm_weight, activation="swish", eps=self.eps)
        return self.out_proj(o.reshape(B, T, HV * V))


class KimiDeltaAttention(nn.Module):
    """Kimi-Linear-style KDA mixer: like :class:`GatedDeltaNet` with a per-channel decay
    ``g [B, T, H, K] = -exp(A_log_h)·softplus(f_b(f_a(x)) + dt_bias)`` (low-rank gate projection),
    q/k L2-normalised inside ``chunk_kda``, and a sigmoid-gated output norm (fp32 casting)."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        if not kda_available():
            raise RuntimeError("KimiDeltaAttention needs mindspeed_ops.api.chunk_kda, which this build lacks")
        H, K = cfg.lin_v_heads, cfg.lin_head_dim  # KDA: H == HV
        self.H, self.K = H, K
        self.chunk_size = cfg.chunk_size if cfg.chunk_size in (32, 64) else 64  # chunk_kda: 32 or 64
        self.eps = cfg.norm_eps
        self.conv_dim = 3 * H * K
        self.in_proj = nn.Linear(cfg.d_model, self.conv_dim + H, bias=False)  # q, k, v | b
        bound = 1.0 / math.sqrt(cfg.conv_width)
        self.conv_weight = nn.Parameter(torch.empty(cfg.conv_width, self.conv_dim).uniform_(-bound, bound))
        self.f_a = nn.Linear(cfg.d_model, K, bias=False)
        self.f_b = nn.Linear(K, H * K, bias=False)
        self.g_a = nn.Linear(cfg.d_model, K, bias=False)
        self.g_b = nn.Linear(K, H * K, bias=False)
        self.A_log = nn.Parameter(torch.empty(H).uniform_(1.0, 16.0).log())
        dt = torch.exp(torch.empty(H * K).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(_inv_softplus(dt))
        self.norm_weight = nn.Parameter(torch.ones(K))
        self.out_proj = nn.Linear(H * K, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        H, K = self.H, self.K
        qkv, b = self.in_proj(x).split([self.conv_dim, H], dim=-1)
        qkv, _ = api.causal_conv1d(qkv, self.conv_weight, activation="silu")
        q, k, v = (t.reshape(B, T, H, K) for t in qkv.split(H * K, dim=-1))
        gate = self.f_b(self.f_a(x)).float() + self.dt_bias.float()
        g = (-self.A_log.float().exp()[:, None] * F.softplus(gate.view(B, T, H, K)))
        beta = torch.sigmoid(b)
        o, _ = api.chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, chunk_size=self.chunk_size)
        z = self.g_b(self.g_a(x)).view(B, T, H, K)
        o = api.rms_norm_gated(o, z, self.norm_weight, activation="sigmoid", eps=self.eps)
        return self.out_proj(o.reshape(B, T, H * K))


class Attention(nn.Module):
    """Causal multi-head attention with DeepSeek-V4-style interleaved RoPE on the last ``rope_dim``
    channels of each q/k head (``api.inplace_rope``, in place on the projection outputs)."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.attn_heads, cfg.attn_head_dim
        if cfg.rope_dim % 2 or cfg.rope_dim > cfg.attn_head_dim:
            raise ValueError(f"HybridConfig: rope_dim must be even and <= attn_head_dim, got {cfg.rope_dim}")
        self.qkv = nn.Linear(cfg.d_model, 3 * self.heads * self.head_dim, bias=False)
        self.out_proj = nn.Linear(self.heads * self.head_dim, cfg.d_model, bias=False)
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.rope_dim, 2, dtype=torch.float64) / cfg.rope_dim))
        freqs = torch.arange(cfg.max_seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", freqs.cos().float(), persistent=False)
        self.register_buffer("sin", freqs.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # single views (unbind's cannot be modified in place)
        api.inplace_rope(q, self.cos, self.sin)  # rotates the views of the projection output in place
        api.inplace_rope(k, self.cos, self.sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out_proj(o.transpose(1, 2).reshape(B, T, -1))


class MoE(nn.Module):
    """GPT-OSS-style mixture of experts with Megatron's expert-parallel token dispatch, on one device.

    Router: linear -> top-k -> softmax over the k chosen logits. Token copies are grouped by "virtual
    rank" (``moe_groups`` contiguous slices of the batch, as if each came from a different
    expert-parallel rank) and by expert inside a rank; ``sort_chunks_by_idx_with_probs`` regroups the
    (rank, expert) chunks expert-major, exactly what follows the all-to-all in Megatron; experts run
    ``x @ W_gu + b`` -> ``clipped_swiglu`` (interleaved gate/up columns, alpha 1.702, limit 7) ->
    ``@ W_down + b``; ``sort_chunks_by_idx`` restores rank-major order; outputs are scattered back,
    weighted by the routing probabilities. A Switch-style load-balancing loss is left in ``aux_loss``.
    """

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        E, D, Fh = cfg.experts, cfg.d_model, cfg.expert_ffn
        if not 1 <= cfg.top_k <= E:
            raise ValueError(f"HybridConfig: top_k must be in [1, experts={E}], got {cfg.top_k}")
        self.E, self.top_k, self.groups = E, cfg.top_k, max(1, cfg.moe_groups)
        self.alpha, self.limit = cfg.swiglu_alpha, cfg.swiglu_limit
        self.router = nn.Linear(D, E, bias=False)
        std = cfg.init_std
        self.gate_up = nn.Parameter(torch.randn(E, D, 2 * Fh) * std)  # interleaved gate/up columns
        self.gate_up_bias = nn.Parameter(torch.zeros(E, 2 * Fh))
        self.down = nn.Parameter(torch.randn(E, Fh, D) * std)
        self.down_bias = nn.Parameter(torch.zeros(E, D))
        self.aux_loss: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        E, k = self.E, self.top_k
        G = self.groups if B % self.groups == 0 else 1
        tokens = x.reshape(-1, D)
        N = tokens.shape[0]
        logits = self.router(tokens).float()
        top_logits, top_idx = logits.topk(k, dim=-1)
        probs = torch.softmax(top_logits, dim=-1)

        with torch.no_grad():
            token_of_copy = torch.arange(N, device=x.device).repeat_interleave(k)
            rank_of_copy = token_of_copy // (N // G)
            key = rank_of_copy * E + top_idx.reshape(-1)  # (rank, expert), rank-major
            order = torch.sort(key, stable=True).indices
            counts = torch.bincount(key, minlength=G * E)  # [G*E] rank-major chunk sizes
            rank_major_to_expert = [r * E + e for e in range(E) for r in range(G)]
            expert_major_to_rank = [e * G + r for r in range(G) for e in range(E)]
            counts_em = counts.view(G, E).t().reshape(-1)  # chunk sizes in expert-major order
            per_expert = counts.view(G, E).sum(0).tolist()  # one host sync: the expert GEMM sizes
            src = token_of_copy[order]

        xs = tokens[src]
        ps = probs.reshape(-1)[order]
        xs, ps = api.sort_chunks_by_idx_with_probs(xs, ps, counts, rank_major_to_expert)
        outs = []
        for e, chunk in enumerate(xs.split(per_expert)):
            if chunk.shape[0] == 0:
                continue
            h = torch.addmm(self.gate_up_bias[e].to(chunk.dtype), chunk, self.gate_up[e].to(chunk.dtype))
            h = api.clipped_swiglu(h, swiglu_alpha=self.alpha, swiglu_limit=self.limit, interleaved=True)
            outs.append(torch.addmm(self.down_bias[e].to(h.dtype), h, self.down[e].to(h.dtype)))
        ys = torch.cat(outs) * ps[:, None].to(outs[0].dtype)
        ys = api.sort_chunks_by_idx(ys, counts_em, expert_major_to_rank)
        out = torch.zeros(N, D, dtype=ys.dtype, device=x.device).index_add(0, src, ys)

        # Switch-Transformer load balancing: E * sum_e (fraction of copies to e) * (mean router prob of e)
        frac = counts.view(G, E).sum(0).float() / (N * k)
        self.aux_loss = E * (frac * torch.softmax(logits, dim=-1).mean(0)).sum()
        return out.view(B, T, D).to(x.dtype)


class HyperConnection(nn.Module):
    """One mHC sublayer wrapper (DeepSeek-V4): streams ``X [B, T, n, D]`` -> ``X' [B, T, n, D]``.

    ``mixes = (X.flatten(-2) @ fnᵀ) · rstd`` with ``rstd = rmsnorm_without_weight(X.flatten(-2))``;
    ``pre, post, comb = sinkhorn(mixes, scale, base)``; the sublayer reads ``mhc_pre_bmm(pre, X)`` and
    its output is written back by ``mhc_post(f, X, post, comb)``. Initialised so that ``comb`` is near
    the identity (each stream mostly keeps itself) and ``pre`` averages the streams.
    """

    def __init__(self, cfg: HybridConfig, sublayer: nn.Module):
        super().__init__()
        n, D = cfg.hc_mult, cfg.d_model
        self.n, self.iters, self.eps, self.norm_eps = n, cfg.sinkhorn_iters, cfg.hc_eps, cfg.norm_eps
        self.fn = nn.Parameter(torch.randn((2 + n) * n, n * D) * (cfg.init_std / math.sqrt(n)))
        pre_b = torch.full((n,), -math.log(n - 1.0) if n > 1 else 4.0)  # sigmoid(pre_b) = 1/n
        post_b = torch.zeros(n)  # post = 2·sigmoid(0) = 1
        comb_b = 4.0 * torch.eye(n)
        self.base = nn.Parameter(torch.cat([pre_b, post_b, comb_b.flatten()]))
        self.scale = nn.Parameter(torch.ones(3))
        self.norm = RMSNorm(D, cfg.norm_eps)
        self.sublayer = sublayer

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        flat = X.flatten(-2)
        with torch.autocast(X.device.type, enabled=False):
            rstd = api.rmsnorm_without_weight(flat.float(), eps=self.norm_eps)
            mixes = F.linear(flat.float(), self.fn.float()) * rstd
            pre, post, comb = api.sinkhorn(mixes, self.scale, self.base, hc_mult=self.n,
                                           sinkhorn_iters=self.iters, eps=self.eps)
        y = api.mhc_pre_bmm(pre, X)
        f = self.sublayer(self.norm(y))
        return api.mhc_post(f.to(X.dtype), X, post, comb)


class Block(nn.Module):
    """Mixer sublayer then MoE sublayer, each inside its own mHC connection."""

    def __init__(self, cfg: HybridConfig, kind: str):
        super().__init__()
        self.kind = kind
        mixer = {"gdn": GatedDeltaNet, "kda": KimiDeltaAttention, "attn": Attention}[kind](cfg)
        self.mixer = HyperConnection(cfg, mixer)
        self.moe = HyperConnection(cfg, MoE(cfg))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.moe(self.mixer(X))


class HybridLM(nn.Module):
    """The hybrid language model; ``forward(tokens, labels)`` returns ``(loss, aux_loss)``.

    ``tokens`` and ``labels`` are ``[B, T]`` int64 (``labels`` already shifted: the next byte;
    ``-100`` entries are ignored); ``loss`` is the mean next-token cross-entropy in nats (fp32) from
    ``api.chunk_loss``; ``aux_loss`` is the summed MoE load-balancing loss (scaled by
    ``aux_loss_coef``), to be added for training.
    """

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.cfg = cfg
        self.kinds = cfg.resolved_kinds()
        if cfg.hc_mult < 1:
            raise ValueError(f"HybridConfig: hc_mult must be >= 1, got {cfg.hc_mult}")
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, kind) for kind in self.kinds)
        n, D = cfg.hc_mult, cfg.d_model
        # final stream collapse (DeepSeek-V4 "hyper head"): pre weights only
        self.head_fn = nn.Parameter(torch.randn(n, n * D) * (cfg.init_std / math.sqrt(n)))
        self.head_base = nn.Parameter(torch.zeros(n))
        self.head_scale = nn.Parameter(torch.ones(1))
        self.final_norm = RMSNorm(D, cfg.norm_eps)
        self.lm_head = nn.Linear(D, cfg.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                scale = 1.0 / math.sqrt(2 * len(self.kinds)) if name.endswith("out_proj") else 1.0
                nn.init.normal_(m.weight, std=std * scale)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=1.0)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final normalised hidden states ``[B, T, d_model]``."""
        n = self.cfg.hc_mult
        x = self.embed(tokens)
        X = x.unsqueeze(2).expand(*x.shape[:2], n, x.shape[-1]).contiguous()
        for block in self.blocks:
            X = block(X)
        flat = X.flatten(-2)
        with torch.autocast(X.device.type, enabled=False):
            rstd = api.rmsnorm_without_weight(flat.float(), eps=self.cfg.norm_eps)
            mixes = F.linear(flat.float(), self.head_fn.float()) * rstd
            pre = torch.sigmoid(mixes * self.head_scale.float() + self.head_base.float()) + self.cfg.hc_eps
        return self.final_norm(api.mhc_pre_bmm(pre, X))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.hidden(tokens)
        loss = api.chunk_loss(h, self.lm_head.weight, labels)
        aux = sum(b.moe.sublayer.aux_loss for b in self.blocks) * self.cfg.aux_loss_coef
        return loss, aux

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def build_model(cfg: HybridConfig, *, warn: bool = True) -> HybridLM:
    """:class:`HybridLM` for ``cfg``; warns (``UserWarning``) when KDA layers are substituted."""
    msg = kda_substitution_message(cfg)
    if msg and warn:
        warnings.warn(msg, UserWarning, stacklevel=2)
    return HybridLM(cfg)


__all__ = ["HybridConfig", "HybridLM", "GatedDeltaNet", "KimiDeltaAttention", "Attention", "MoE", "HyperConnection",
           "Block", "build_model", "kda_available", "kda_substitution_message"]
