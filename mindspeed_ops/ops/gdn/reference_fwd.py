"""Pure-PyTorch references of the GDN forward stages (SPEC 1.10.5 ``chunk_gated_delta_rule_fwd_h``,
1.10.7 ``chunk_fwd_o``), written from the chunked-algorithm table of SPEC 1.10.0, plus
:func:`stage_inputs` (the shared test recipe carried through steps 1-4 with the stage references) to
build realistic, mutually consistent inputs for the later stages.

Float64 inputs compute in float64, others in fp32 (SPEC 0.8); every ``exp`` is of a masked
difference; varlen inputs loop over sequences (tail tokens are never read and give 0).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .reference import (_cdtype, _decay_matrix, _expand_heads, _sequences, _state0, chunk_local_cumsum_ref,
                        solve_tril_ref)
from .reference_wy import chunk_scaled_dot_kkt_fwd_ref, recompute_w_u_fwd_ref


def _num_chunks(B: int, T: int, BT: int, cu_seqlens: Optional[torch.Tensor]) -> int:
    if cu_seqlens is None:
        return -(-T // BT)
    return sum(-(-(e - s) // BT) for _, s, e in _sequences(B, T, cu_seqlens))


def _chunk_starts(B: int, T: int, BT: int, cu_seqlens: Optional[torch.Tensor]):
    """``(n, b, bos, eos, first chunk index in h)`` of every sequence."""
    off = 0
    for n, (b, bos, eos) in enumerate(_sequences(B, T, cu_seqlens)):
        yield n, b, bos, eos, (0 if cu_seqlens is None else off)
        off += -(-(eos - bos) // BT)


def _out(cd: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if cd == torch.float64 else dtype


def chunk_gated_delta_rule_fwd_h_ref(k: torch.Tensor, w: torch.Tensor, u: torch.Tensor,
                                     g: Optional[torch.Tensor] = None, gk: Optional[torch.Tensor] = None,
                                     initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                                     chunk_size: int = 64, save_new_value: bool = True,
                                     cu_seqlens: Optional[torch.Tensor] = None):
    """Reference of ``chunk_gated_delta_rule_fwd_h`` (SPEC 1.10.5), same arguments and results.

    Per sequence, value head and chunk: ``h[c] = S``; ``v_new = u − w S``;
    ``S ← e^{Γ} S + (e^{Γ − G} k)ᵀ v_new`` (``gk``: per channel). ``h`` in k.dtype, ``v_new`` in
    u.dtype, ``final_state`` fp32 (all float64 for float64 inputs).
    """
    B, T, _, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    BT = chunk_size
    cd = _cdtype(k, w, u, g, gk, initial_state)
    kk = _expand_heads(k.to(cd), HV)
    NT = _num_chunks(B, T, BT, cu_seqlens)
    h = torch.zeros(B, NT, HV, K, V, dtype=cd, device=k.device)
    v_new = torch.zeros(B, T, HV, V, dtype=cd, device=k.device)
    finals = []
    for n, b, bos, eos, off in _chunk_starts(B, T, BT, cu_seqlens):
        S = _state0(initial_state, n, HV, K, V, cd, k.device)
        for c, s in enumerate(range(bos, eos, BT)):
            e = min(s + BT, eos)
            h[b, off + c] = S
            kc, wc, uc = kk[b, s:e], w[b, s:e].to(cd), u[b, s:e].to(cd)      # [L, HV, K|V]
            vn = uc - torch.einsum("lhk,hkv->lhv", wc, S)
            v_new[b, s:e] = vn
            if g is not None:
                Gc = g[b, s:e].to(cd)                                        # [L, HV]
                S = torch.exp(Gc[-1])[:, None, None] * S + torch.einsum(
                    "lhk,lhv->hkv", kc * torch.exp(Gc[-1] - Gc)[..., None], vn)
            elif gk is not None:
                Gc = gk[b, s:e].to(cd)                                       # [L, HV, K]
                S = torch.exp(Gc[-1])[..., None] * S + torch.einsum("lhk,lhv->hkv", kc * torch.exp(Gc[-1] - Gc), vn)
            else:
                S = S + torch.einsum("lhk,lhv->hkv", kc, vn)
        finals.append(S)
    final = torch.stack(finals).to(_out(cd, torch.float32)) if output_final_state and finals else (
        torch.zeros(0, HV, K, V, dtype=_out(cd, torch.float32), device=k.device) if output_final_state else None)
    return (h.to(_out(cd, k.dtype)), v_new.to(_out(cd, u.dtype)) if save_new_value else None, final)


def chunk_fwd_o_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, h: torch.Tensor,
                    g: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                    cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64) -> torch.Tensor:
    """Reference of ``chunk_fwd_o`` (SPEC 1.10.7): ``o_i = scale·e^{G_i} S_cᵀ q_i +
    scale·Σ_{j ≤ i, same chunk} (q_i·k_j) e^{G_i − G_j} v_j`` with ``v = v_new``, ``S_c = h[c]``;
    ``o`` in v.dtype (float64 for float64 inputs), tail tokens 0."""
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    cd = _cdtype(q, k, v, h, g)
    scale = K ** -0.5 if scale is None else scale
    qq, kk = _expand_heads(q.to(cd), HV), _expand_heads(k.to(cd), HV)
    o = torch.zeros(B, T, HV, V, dtype=cd, device=v.device)
    for _, b, bos, eos, off in _chunk_starts(B, T, BT, cu_seqlens):
        for c, s in enumerate(range(bos, eos, BT)):
            e = min(s + BT, eos)
            qc, kc, vc = qq[b, s:e], kk[b, s:e], v[b, s:e].to(cd)
            S = h[b, off + c].to(cd)                                           # [HV, K, V]
            Gc = g[b, s:e].to(cd).transpose(0, 1) if g is not None else torch.zeros(HV, e - s, dtype=cd,
                                                                                     device=v.device)
            A = torch.einsum("ihk,jhk->hij", qc, kc) * _decay_matrix(Gc, strict=False)
            inter = torch.exp(Gc).transpose(0, 1)[..., None] * torch.einsum("lhk,hkv->lhv", qc, S)
            o[b, s:e] = scale * (inter + torch.einsum("hij,jhv->ihv", A, vc))
    return o.to(_out(cd, v.dtype))


def stage_inputs(B: int, T: int, H: int, HV: int, K: int, V: int, *, chunk_size: int = 64, gate_scale: float = 1.0,
                 gate: str = "g", h0: bool = True, cu_seqlens: Optional[torch.Tensor] = None, seed: int = 0):
    """The shared recipe of SPEC 1.10.0 carried through steps 1-4 in float64, for testing the later
    stages on realistic values: ``q``, L2-normalised ``k``, ``v``, ``β = σ(randn)``,
    ``g = logsigmoid(rand)/gate_scale`` with ~20% exact zeros, ``G`` its chunk-local cumsum (per channel
    ``[B,T,HV,K]`` when ``gate="gk"``; none when ``gate=None``), then ``A`` (1.10.2), ``Ainv`` (1.10.3)
    and ``w``, ``u`` (1.10.4) from their references.

    Returns a dict of float64 CPU tensors: ``q, k, v, beta, g`` (raw gates or None), ``G`` (or None),
    ``gk`` (or None), ``w, u, h0`` (or None); the cumsum lands in ``G`` for ``gate="g"`` and in ``gk`` for
    ``gate="gk"``.
    """
    gen = torch.Generator().manual_seed(seed)
    f = dict(dtype=torch.float64, generator=gen)
    q = F.normalize(torch.randn(B, T, H, K, **f), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, **f), dim=-1)
    v = torch.randn(B, T, HV, V, **f)
    beta = torch.sigmoid(torch.randn(B, T, HV, **f))
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    init = torch.randn(N, HV, K, V, **f) if h0 else None
    G = gk = g = None
    if gate == "g":
        g = F.logsigmoid(torch.rand(B, T, HV, **f)) / gate_scale
        g = g * (torch.rand(B, T, HV, **f) > 0.2)
        G = chunk_local_cumsum_ref(g, chunk_size, cu_seqlens=cu_seqlens)
    elif gate == "gk":
        g = F.logsigmoid(torch.rand(B, T, HV, K, **f)) / gate_scale
        g = g * (torch.rand(B, T, HV, K, **f) > 0.2)
        gk = chunk_local_cumsum_ref(g, chunk_size, cu_seqlens=cu_seqlens)
    elif gate is not None:
        raise ValueError(f"stage_inputs: gate must be 'g', 'gk' or None, got {gate!r}")
    A = chunk_scaled_dot_kkt_fwd_ref(k, G, gk, beta, cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    Ainv = solve_tril_ref(A, cu_seqlens)
    w, u = recompute_w_u_fwd_ref(k, v, beta, Ainv, G, gk, cu_seqlens)
    return {"q": q, "k": k, "v": v, "beta": beta, "g": g, "G": G, "gk": gk, "w": w, "u": u, "h0": init}
