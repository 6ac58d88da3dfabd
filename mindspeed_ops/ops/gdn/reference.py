"""Pure-PyTorch references of the Gated DeltaNet family (SPEC 1.10): the spec in code.

- :func:`recurrent_gated_delta_rule_ref`: the token-by-token recurrence of SPEC 1.10.0 (the test
  oracle; slow, one step per token).
- :func:`chunk_gated_delta_rule_ref`: the chunked (WY/UT) algorithm of SPEC 1.10.0, differentiable
  by autograd (its gradients are the backward oracle of the chunked kernels).
- stage references: :func:`chunk_local_cumsum_ref` (1.10.1), :func:`chunk_scaled_dot_kkt_ref`
  (1.10.2), :func:`solve_tril_ref` (1.10.3).

All compute in float64 for float64 inputs and in fp32 otherwise (SPEC 0.8), mask before every
``exp`` and treat varlen inputs (``cu_seqlens``, ``B == 1``) by looping over sequences.
Layouts are token-major (SPEC 0.2): q/k ``[B,T,H,K]``, v ``[B,T,HV,V]``, g/beta ``[B,T,HV]``,
states ``[N,HV,K,V]``; value head ``i`` reads q/k head ``i // (HV // H)``.

Source: Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule"
(ICLR 2025); the WY/UT chunked form follows Yang et al., "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length" (NeurIPS 2024).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..common import without_autocast

L2NORM_EPS = 1e-6


def _cdtype(*tensors: Optional[torch.Tensor]) -> torch.dtype:
    """float64 if any input is float64, else float32 (SPEC 0.8)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _sequences(B: int, T: int, cu_seqlens: Optional[torch.Tensor]) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of every sequence: one per row, or the packed ones of row 0."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    if B != 1:
        raise ValueError(f"with cu_seqlens the batch size must be 1 (pack the batch into one row), got {B}")
    cu = [int(c) for c in cu_seqlens.tolist()]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _expand_heads(x: torch.Tensor, HV: int) -> torch.Tensor:
    """``[..., H, D]`` -> ``[..., HV, D]`` (value head i reads head i // (HV // H))."""
    H = x.shape[-2]
    if HV % H:
        raise ValueError(f"HV % H must be 0 (GVA), got HV={HV}, H={H}")
    return x if HV == H else x.repeat_interleave(HV // H, dim=-2)


def _drop_tail(x: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Tail tokens (``>= cu_seqlens[-1]``) replaced by 0 with a ``where`` (not a multiply), so NaN/Inf
    there never reaches a value or a gradient."""
    if x is None or cu_seqlens is None:
        return x
    end = int(cu_seqlens[-1])
    if end >= x.shape[1]:
        return x
    keep = (torch.arange(x.shape[1], device=x.device) < end).reshape(1, -1, *([1] * (x.dim() - 2)))
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _prep(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, initial_state, cu_seqlens):
    cd = _cdtype(q, k, v, g, beta, initial_state)
    HV = v.shape[2]
    q, k, v, g, beta = (_drop_tail(t, cu_seqlens) for t in (q, k, v, g, beta))
    q, k = q.to(cd), k.to(cd)
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q, k = _expand_heads(q, HV), _expand_heads(k, HV)
    g = torch.zeros(v.shape[:3], dtype=cd, device=v.device) if g is None else g.to(cd)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return cd, q, k, v.to(cd), g, beta.to(cd), scale


# ------------------------------------------------------------------------------------------------
# Oracle: the recurrence (tests only)
# ------------------------------------------------------------------------------------------------

def _setup(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, initial_state, cu_seqlens):
    """Shared start of both references: ``(out dtype, compute dtype, prepared q, k, v, g, beta,
    scale, zero output [B, T, HV, V])``."""
    cd, q_dtype = _cdtype(q, k, v, g, beta, initial_state), q.dtype
    out_dtype = cd if cd == torch.float64 else q_dtype
    cd, q, k, v, g, beta, scale = _prep(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, initial_state,
                                        cu_seqlens)
    o = torch.zeros(*q.shape[:2], v.shape[2], v.shape[3], dtype=cd, device=v.device)
    return out_dtype, cd, q, k, v, g, beta, scale, o


def _state0(initial_state, n, HV, K, V, cd, device):
    """State at the start of sequence ``n`` in the compute dtype (zeros without an initial state)."""
    return torch.zeros(HV, K, V, dtype=cd, device=device) if initial_state is None else initial_state[n].to(cd)


def _finish(o, finals, cd, out_dtype, output_final_state):
    """``(o in its output dtype, stacked final states in fp32/float64 or None)``."""
    final = torch.stack(finals).to(torch.float64 if cd == torch.float64 else torch.float32) \
        if output_final_state else None
    return o.to(out_dtype), final


def recurrent_gated_delta_rule_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                                   beta: torch.Tensor, scale: Optional[float] = None,
                                   initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                                   use_qk_l2norm_in_kernel: bool = False,
                                   cu_seqlens: Optional[torch.Tensor] = None):
    """Token-by-token gated delta rule (SPEC 1.10.0), the oracle of the family. Tests only.

    Args:
        q, k: ``[B,T,H,K]``; v: ``[B,T,HV,V]``; g: ``[B,T,HV]`` natural-log decay or None (= 0);
        beta: ``[B,T,HV]`` (used as given); initial_state: ``[N,HV,K,V]`` or None (= 0);
        scale: None means ``K ** -0.5``; use_qk_l2norm_in_kernel: ``x / sqrt(Σx² + 1e-6)`` on q, k;
        cu_seqlens: ``[N+1]`` packed offsets (``B == 1``) or None (``N = B``).

    Returns:
        ``(o [B,T,HV,V] in q.dtype, final_state [N,HV,K,V] or None)``. The state is carried in float64
        for float64 inputs, fp32 otherwise; ``final_state`` is fp32 (float64 for float64 inputs).
        Tail tokens (positions >= cu_seqlens[-1]) give 0.
    """
    return _recurrent(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                      cu_seqlens)


@without_autocast
def _recurrent(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens):
    """The token loop of both oracles: ``g[b, t]`` is ``[HV]`` (GDN, one decay per head) or ``[HV, K]``
    (KDA, one per key channel: row ``d`` of ``S`` scaled by ``e^{g_t,d}``)."""
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    out_dtype, cd, q, k, v, g, beta, scale, o = _setup(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel,
                                                       initial_state, cu_seqlens)
    finals = []
    for n, (b, bos, eos) in enumerate(_sequences(B, T, cu_seqlens)):
        S = _state0(initial_state, n, HV, K, V, cd, v.device)
        outs = []
        for t in range(bos, eos):
            S = torch.exp(g[b, t]).reshape(HV, -1, 1) * S
            e = v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t])
            S = S + beta[b, t][:, None, None] * k[b, t][:, :, None] * e[:, None, :]
            outs.append(scale * torch.einsum("hkv,hk->hv", S, q[b, t]))
        if outs:
            rows = (torch.tensor([b], device=v.device), torch.arange(bos, eos, device=v.device))
            o = o.index_put(rows, torch.stack(outs))
        finals.append(S)
    return _finish(o, finals, cd, out_dtype, output_final_state)


# ------------------------------------------------------------------------------------------------
# Stage references
# ------------------------------------------------------------------------------------------------

def chunk_local_cumsum_ref(g: torch.Tensor, chunk_size: int = 64, reverse: bool = False,
                           scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None,
                           output_dtype: Optional[torch.dtype] = torch.float32) -> torch.Tensor:
    """Chunk-local inclusive (``reverse``: suffix) cumsum of gates (SPEC 1.10.1).

    ``g``: ``[B,T,HV]`` or ``[B,T,HV,K]``; returns the same shape in ``output_dtype`` (None = g.dtype;
    float64 for float64 input). ``G_t = scale · Σ_{s in chunk(t), s <= t} g_s`` (``reverse``: ``s >= t``),
    chunks restart at every sequence start; tail tokens give 0. Computed as a true suffix sum.
    """
    cd = _cdtype(g)
    B, T = g.shape[:2]
    x = g.to(cd)
    out = torch.zeros_like(x)
    for b, bos, eos in _sequences(B, T, cu_seqlens):
        for s in range(bos, eos, chunk_size):
            e = min(s + chunk_size, eos)
            c = x[b, s:e]
            c = c.flip(0).cumsum(0).flip(0) if reverse else c.cumsum(0)
            out[b, s:e] = c
    if scale is not None:
        out = out * scale
    dt = g.dtype if output_dtype is None else output_dtype
    return out.to(torch.float64 if g.dtype == torch.float64 else dt)


def _decay_matrix(Gc: torch.Tensor, strict: bool) -> torch.Tensor:
    """``exp(G_i - G_j)`` for ``j < i`` (``strict``) or ``j <= i``, else 0; masked before the exp.
    ``Gc``: ``[..., BT]`` -> ``[..., BT, BT]``."""
    BT = Gc.shape[-1]
    idx = torch.arange(BT, device=Gc.device)
    mask = (idx[None, :] < idx[:, None]) if strict else (idx[None, :] <= idx[:, None])
    diff = Gc[..., :, None] - Gc[..., None, :]
    return torch.exp(torch.where(mask, diff, torch.full_like(diff, float("-inf"))))


def _chunked(x: torch.Tensor, BT: int) -> torch.Tensor:
    """``[L, ...]`` -> ``[NC, BT, ...]``, zero-padded at the end."""
    L = x.shape[0]
    NC = -(-L // BT)
    pad = NC * BT - L
    if pad:
        x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])], 0)
    return x.reshape(NC, BT, *x.shape[1:])


def chunk_scaled_dot_kkt_ref(k: torch.Tensor, g: Optional[torch.Tensor] = None, beta: Optional[torch.Tensor] = None,
                             cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                             output_dtype: Optional[torch.dtype] = torch.float32) -> torch.Tensor:
    """``A [B,T,HV,BT]``: ``A[t, j] = β_t (k_t · k_{s_j}) e^{G_t − G_{s_j}}`` for ``j < i`` inside one
    chunk, else 0 (SPEC 1.10.2, scalar gates ``g = G``). ``HV`` from ``beta``/``g`` or ``H``."""
    B, T, H, K = k.shape
    HV = beta.shape[2] if beta is not None else (g.shape[2] if g is not None else H)
    cd = _cdtype(k, g, beta)
    kk = _expand_heads(k.to(cd), HV)
    A = torch.zeros(B, T, HV, chunk_size, dtype=cd, device=k.device)
    for b, bos, eos in _sequences(B, T, cu_seqlens):
        if eos == bos:
            continue
        L = eos - bos
        kc = _chunked(kk[b, bos:eos], chunk_size)                       # [NC,BT,HV,K]
        ones = torch.ones(kc.shape[:3], dtype=cd, device=k.device)
        Gc = _chunked(g[b, bos:eos].to(cd), chunk_size) if g is not None else torch.zeros_like(ones)
        bc = _chunked(beta[b, bos:eos].to(cd), chunk_size) if beta is not None else ones
        Ac = torch.einsum("cihd,cjhd->chij", kc, kc) * _decay_matrix(Gc.transpose(1, 2), strict=True)
        Ac = Ac * bc.transpose(1, 2)[..., None]                           # [NC,HV,BT,BT]
        A[b, bos:eos] = Ac.permute(0, 2, 1, 3).reshape(-1, HV, chunk_size)[:L]
    return A.to(torch.float64 if cd == torch.float64 else (output_dtype or k.dtype))


def solve_tril_ref(A: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None,
                   output_dtype: Optional[torch.dtype] = torch.float32) -> torch.Tensor:
    """``(I + A_c)^{-1}`` per chunk (SPEC 1.10.3), same ``[B,T,HV,BT]`` layout.

    Reads only strictly-lower entries at valid positions of ``A``; the result is unit lower
    triangular with exact zeros above the diagonal and in columns past the chunk's valid length;
    tail rows are 0. float64 for float64 input, ``output_dtype`` otherwise (None = A.dtype).
    """
    B, T, HV, BT = A.shape
    cd = _cdtype(A)
    out = torch.zeros(B, T, HV, BT, dtype=cd, device=A.device)
    idx = torch.arange(BT, device=A.device)
    strict = idx[None, :] < idx[:, None]
    eye = torch.eye(BT, dtype=cd, device=A.device)
    for b, bos, eos in _sequences(B, T, cu_seqlens):
        L = eos - bos
        if L == 0:
            continue
        Ac = _chunked(A[b, bos:eos].to(cd), BT).permute(0, 2, 1, 3)     # [NC,HV,BT(row),BT(col)]
        NC = Ac.shape[0]
        valid = (torch.arange(NC * BT, device=A.device) < L).reshape(NC, 1, BT)
        mask = strict & valid[..., :, None] & valid[..., None, :]
        Ac = torch.where(mask, Ac, torch.zeros((), dtype=cd, device=A.device))
        inv = torch.linalg.solve_triangular(eye + Ac, eye.expand_as(Ac), upper=False, unitriangular=True)
        inv = torch.where(valid[..., None, :], inv, torch.zeros((), dtype=cd, device=A.device))
        out[b, bos:eos] = inv.permute(0, 2, 1, 3).reshape(-1, HV, BT)[:L]
    return out.to(torch.float64 if cd == torch.float64 else (output_dtype or A.dtype))


# ------------------------------------------------------------------------------------------------
# Chunked reference of the full operator
# ------------------------------------------------------------------------------------------------

@without_autocast
def chunk_gated_delta_rule_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                               beta: torch.Tensor, scale: Optional[float] = None,
                               initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                               use_qk_l2norm_in_kernel: bool = False, cu_seqlens: Optional[torch.Tensor] = None,
                               chunk_size: int = 64):
    """Chunked (WY/UT) gated delta rule (SPEC 1.10.0 table, 1.10.10): the reference of
    ``chunk_gated_delta_rule`` and, through autograd, of its backward.

    Same arguments and results as :func:`recurrent_gated_delta_rule_ref`, plus ``chunk_size``
    (``BT``). Each sequence is padded to a multiple of ``BT`` with ``k = v = 0, β = 0, g = 0`` tokens
    (they change nothing); per chunk: ``G`` = cumsum of ``g``; ``A_ij = β_i (k_i·k_j) e^{G_i−G_j}``
    (``j < i``); ``Ainv = (I + A)^{-1}``; ``w = Ainv (β e^G k)``, ``u = Ainv (β v)``; then the scan
    ``v_new = u − w S``, ``o = scale (e^G q S + (q kᵀ ⊙ e^{G_i−G_j})_{j≤i} v_new)``,
    ``S ← e^Γ S + (e^{Γ−G} k)ᵀ v_new``. Every ``exp`` is of a masked difference (non-positive for
    non-positive gates): no overflow under strong decay. Computes in float64 for float64 inputs,
    fp32 otherwise; ``o`` in ``q.dtype`` (float64 for float64), ``final_state`` fp32/float64.
    """
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    out_dtype, cd, q, k, v, g, beta, scale, o = _setup(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel,
                                                       initial_state, cu_seqlens)
    finals = []
    for n, (b, bos, eos) in enumerate(_sequences(B, T, cu_seqlens)):
        S = _state0(initial_state, n, HV, K, V, cd, v.device)
        L = eos - bos
        if L == 0:
            finals.append(S)
            continue
        # [NC, HV, BT, D] per chunk and head
        qc, kc, vc = (_chunked(x[b, bos:eos], BT).transpose(1, 2) for x in (q, k, v))
        gc, bc = (_chunked(x[b, bos:eos], BT).transpose(1, 2) for x in (g, beta))   # [NC,HV,BT]
        G = gc.cumsum(-1)
        Gamma = G[..., -1:]                                              # [NC,HV,1]
        A = (kc @ kc.transpose(-1, -2)) * _decay_matrix(G, strict=True) * bc[..., None]
        eye = torch.eye(BT, dtype=cd, device=v.device)
        rhs = torch.cat([bc[..., None] * torch.exp(G)[..., None] * kc, bc[..., None] * vc], -1)
        wu = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        w, u = wu[..., :K], wu[..., K:]
        Aqk = (qc @ kc.transpose(-1, -2)) * _decay_matrix(G, strict=False)
        kdec = torch.exp(Gamma - G)[..., None] * kc                       # e^{Γ−G_i} k_i, exponent <= 0
        outs = []
        for c in range(qc.shape[0]):
            v_new = u[c] - w[c] @ S
            outs.append(scale * (torch.exp(G[c])[..., None] * (qc[c] @ S) + Aqk[c] @ v_new))
            S = torch.exp(Gamma[c])[..., None] * S + kdec[c].transpose(-1, -2) @ v_new
        oc = torch.stack(outs).transpose(1, 2).reshape(-1, HV, V)[:L]     # [L,HV,V]
        rows = (torch.tensor([b], device=v.device), torch.arange(bos, eos, device=v.device))
        o = o.index_put(rows, oc)
        finals.append(S)
    return _finish(o, finals, cd, out_dtype, output_final_state)


def no_token_grads(q, k, v, g, beta, initial_state, dht, cu_seqlens):
    """Gradients of a GDN/KDA call that processes no token (``T = 0`` or only empty sequences), where
    autograd through the references records nothing: zeros, and ``dh0 = dht`` (the final state is the
    initial state). ``None`` when some token is processed."""
    tokens = q.shape[0] * q.shape[1] if cu_seqlens is None else int(cu_seqlens[-1]) - int(cu_seqlens[0])
    if tokens > 0:
        return None
    zeros = [None if t is None else torch.zeros_like(t) for t in (q, k, v, g, beta)]
    dh0 = None
    if initial_state is not None:
        dh0 = torch.zeros_like(initial_state) if dht is None else dht.to(initial_state.dtype).clone()
    return (*zeros, dh0)
