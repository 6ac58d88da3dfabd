"""Pure-PyTorch references of the GDN backward stages (SPEC 1.10.6 ``chunk_gated_delta_rule_bwd_dhu``,
1.10.8 ``chunk_bwd_dv_local``, 1.10.9 ``chunk_bwd_dqkwg``), written straight from the formulas of
those sections (they are the CPU path of the stage functions and the oracles of their kernels).

Conventions (SPEC 1.10.0): per sequence, value head and chunk ``c`` (positions ``i, j`` inside the
chunk, ``G`` the chunk-local gate cumsum, ``Γ_c`` its value at the chunk's last valid position),
``h[c] = S_c`` is the state **entering** chunk c and ``dh[c]`` the gradient w.r.t. the state
**leaving** it (``S_{c+1}``). Value head ``i`` reads q/k head ``i // (HV // H)``; ``dq``/``dk`` are
summed over the value heads sharing a q/k head.

float64 inputs compute in float64, anything else in fp32 (SPEC 0.8); every ``exp`` is of a masked
difference (arguments ``<= 0`` for non-positive gates); varlen inputs (``cu_seqlens``, ``B == 1``)
loop over sequences, so tail tokens are never read and their gradients are 0.

Source: Yang, Kautz, Hatamizadeh, "Gated Delta Networks" (ICLR 2025); the WY/UT chunked form from
Yang et al., "Parallelizing Linear Transformers with the Delta Rule over Sequence Length" (NeurIPS 2024).
"""
from __future__ import annotations

from typing import Optional

import torch

from .reference import _cdtype, _chunked, _decay_matrix, _expand_heads, _sequences


def _out(cd: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    """Output dtype: float64 when computing in float64, else ``dtype``."""
    return torch.float64 if cd == torch.float64 else dtype


def _fold_heads(x: torch.Tensor, H: int) -> torch.Tensor:
    """``[..., HV, D]`` -> ``[..., H, D]``: sum over the value heads that share a q/k head (GVA)."""
    HV = x.shape[-2]
    return x if HV == H else x.reshape(*x.shape[:-2], H, HV // H, x.shape[-1]).sum(-2)


def _seq_chunks(B: int, T: int, BT: int, cu_seqlens: Optional[torch.Tensor]):
    """``(n, b, bos, eos, index of the sequence's first chunk in h/dh)`` of every sequence."""
    off = 0
    for n, (b, bos, eos) in enumerate(_sequences(B, T, cu_seqlens)):
        yield n, b, bos, eos, (0 if cu_seqlens is None else off)
        off += -(-(eos - bos) // BT)


def _num_chunks(B: int, T: int, BT: int, cu_seqlens: Optional[torch.Tensor]) -> int:
    if cu_seqlens is None:
        return -(-T // BT)
    return sum(-(-(e - s) // BT) for _, s, e in _sequences(B, T, cu_seqlens))


def _heads(x: torch.Tensor, BT: int) -> torch.Tensor:
    """``[L, HV, D]`` -> ``[NC, HV, BT, D]`` (zero-padded at the end)."""
    return _chunked(x, BT).transpose(1, 2)


def _unheads(x: torch.Tensor, L: int) -> torch.Tensor:
    """``[NC, HV, BT, D]`` -> ``[L, HV, D]``."""
    NC, HV, BT, D = x.shape
    return x.transpose(1, 2).reshape(NC * BT, HV, D)[:L]


def _gates(g: Optional[torch.Tensor], b: int, bos: int, eos: int, HV: int, BT: int, cd, device) -> torch.Tensor:
    """Chunked scalar ``G`` of one sequence, ``[NC, HV, BT]`` (zeros without a gate). The padding past
    the sequence end repeats the last value, so a decay factor that pairs a padded position with a
    valid one is ``e^{Γ − G_j} <= 1`` (never ``e^{0 − G_j}``, which overflows under strong decay)."""
    L = eos - bos
    NC = -(-L // BT)
    if g is None:
        return torch.zeros(NC, HV, BT, dtype=cd, device=device)
    x = g[b, bos:eos].to(cd)
    x = torch.cat([x, x[-1:].expand(NC * BT - L, HV)], 0)
    return x.reshape(NC, BT, HV).transpose(1, 2)


def _last(L: int, BT: int, NC: int) -> torch.Tensor:
    """Index of the last valid position of each chunk, ``[NC]``."""
    return torch.tensor([min(BT, L - c * BT) - 1 for c in range(NC)], dtype=torch.long)


# ------------------------------------------------------------------------------------------------
# 1.10.8 chunk_bwd_dv_local
# ------------------------------------------------------------------------------------------------

def chunk_bwd_dv_local_ref(q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, g: Optional[torch.Tensor] = None,
                           scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None,
                           chunk_size: int = 64) -> torch.Tensor:
    """Reference of ``chunk_bwd_dv_local`` (SPEC 1.10.8):
    ``dv_j = scale·Σ_{i ≥ j, same chunk} (q_i·k_j) e^{G_i − G_j} do_i``.

    ``q, k [B,T,H,K]``, ``do [B,T,HV,V]``, ``g = G [B,T,HV]`` or None. Returns ``dv [B,T,HV,V]`` in
    ``do.dtype`` (float64 for float64 inputs); tail tokens give 0.
    """
    B, T, _, K = q.shape
    HV = do.shape[2]
    BT = chunk_size
    cd = _cdtype(q, k, do, g)
    scale = K ** -0.5 if scale is None else scale
    qq, kk = _expand_heads(q.to(cd), HV), _expand_heads(k.to(cd), HV)
    dv = torch.zeros(do.shape, dtype=cd, device=do.device)
    for _, b, bos, eos, _ in _seq_chunks(B, T, BT, cu_seqlens):
        L = eos - bos
        if L == 0:
            continue
        qc, kc, doc = _heads(qq[b, bos:eos], BT), _heads(kk[b, bos:eos], BT), _heads(do[b, bos:eos].to(cd), BT)
        Gc = _gates(g, b, bos, eos, HV, BT, cd, do.device)
        A = (qc @ kc.transpose(-1, -2)) * _decay_matrix(Gc, strict=False)      # [NC,HV,i,j], j <= i
        dv[b, bos:eos] = _unheads(scale * A.transpose(-1, -2) @ doc, L)
    return dv.to(_out(cd, do.dtype))


# ------------------------------------------------------------------------------------------------
# 1.10.6 chunk_gated_delta_rule_bwd_dhu
# ------------------------------------------------------------------------------------------------

def chunk_gated_delta_rule_bwd_dhu_ref(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, do: torch.Tensor,
                                       dv: torch.Tensor, g: Optional[torch.Tensor] = None,
                                       gk: Optional[torch.Tensor] = None, h0: Optional[torch.Tensor] = None,
                                       dht: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                                       cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64):
    """Reference of ``chunk_gated_delta_rule_bwd_dhu`` (SPEC 1.10.6): the reverse scan
    ``dS ← dht`` (or 0); for each chunk from last to first: ``dh[c] = dS``;
    ``dv2_i = dv_i + dSᵀ (e^{Γ_c − G_i} k_i)``;
    ``dS ← e^{Γ_c} dS + scale·Σ_i (e^{G_i} q_i) do_iᵀ − Σ_i w_i dv2_iᵀ`` (``gk``: per channel); after the
    sequence's first chunk ``dh0 = dS``.

    Returns ``(dh [B,NT,HV,K,V] in q.dtype, dh0 [N,HV,K,V] fp32 or None when h0 is None,
    dv2 [B,T,HV,V] in dv.dtype)``; float64 throughout for float64 inputs. Varlen ``dh[0, c]`` is
    chunk c of the flattened chunk list; tail tokens of ``dv2`` are 0.
    """
    if g is not None and gk is not None:
        raise ValueError("chunk_gated_delta_rule_bwd_dhu_ref: pass g or gk, not both")
    B, T, _, K = q.shape
    HV, V = do.shape[2], do.shape[3]
    BT = chunk_size
    cd = _cdtype(q, k, w, do, dv, g, gk, dht)
    scale = K ** -0.5 if scale is None else scale
    dev = do.device
    qq, kk = _expand_heads(q.to(cd), HV), _expand_heads(k.to(cd), HV)
    NT = _num_chunks(B, T, BT, cu_seqlens)
    dh = torch.zeros(B, NT, HV, K, V, dtype=cd, device=dev)
    dv2 = torch.zeros(B, T, HV, V, dtype=cd, device=dev)
    dh0 = []
    for n, b, bos, eos, off in _seq_chunks(B, T, BT, cu_seqlens):
        dS = torch.zeros(HV, K, V, dtype=cd, device=dev) if dht is None else dht[n].to(cd)
        starts = list(range(bos, eos, BT))
        for c in reversed(range(len(starts))):
            s = starts[c]
            e = min(s + BT, eos)
            dh[b, off + c] = dS
            qc, kc, wc = qq[b, s:e], kk[b, s:e], w[b, s:e].to(cd)           # [L, HV, K]
            doc, dvc = do[b, s:e].to(cd), dv[b, s:e].to(cd)                 # [L, HV, V]
            if g is not None:
                Gc = g[b, s:e].to(cd)                                        # [L, HV]
                kdec = kc * torch.exp(Gc[-1] - Gc)[..., None]
                qdec = qc * torch.exp(Gc)[..., None]
                decay = torch.exp(Gc[-1])[:, None, None]
            elif gk is not None:
                Gc = gk[b, s:e].to(cd)                                       # [L, HV, K]
                kdec = kc * torch.exp(Gc[-1] - Gc)
                qdec = qc * torch.exp(Gc)
                decay = torch.exp(Gc[-1])[..., None]
            else:
                kdec, qdec, decay = kc, qc, 1.0
            d2 = dvc + torch.einsum("lhk,hkv->lhv", kdec, dS)
            dv2[b, s:e] = d2
            dS = decay * dS + scale * torch.einsum("lhk,lhv->hkv", qdec, doc) - torch.einsum("lhk,lhv->hkv", wc, d2)
        dh0.append(dS)
    dh0_out = None
    if h0 is not None:
        dh0_out = torch.stack(dh0).to(_out(cd, torch.float32)) if dh0 else \
            torch.zeros(0, HV, K, V, dtype=_out(cd, torch.float32), device=dev)
    return dh.to(_out(cd, q.dtype)), dh0_out, dv2.to(_out(cd, dv.dtype))


# ------------------------------------------------------------------------------------------------
# 1.10.9 chunk_bwd_dqkwg
# ------------------------------------------------------------------------------------------------

def chunk_bwd_dqkwg_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, h: torch.Tensor,
                        dh: torch.Tensor, g: Optional[torch.Tensor] = None, dv: Optional[torch.Tensor] = None,
                        w: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None,
                        chunk_size: int = 64, scale: Optional[float] = None):
    """Reference of ``chunk_bwd_dqkwg`` (SPEC 1.10.9), per chunk c with ``S_c = h[c]``,
    ``dS_c = dh[c]``, ``v = v_new``:

    - ``dq_i = scale·e^{G_i} S_c do_i + scale·Σ_{j≤i} (do_i·v_j) e^{G_i−G_j} k_j``;
    - ``dk_j = scale·Σ_{i≥j} (do_i·v_j) e^{G_i−G_j} q_i + e^{Γ_c−G_j} dS_c v_j``;
    - ``dw_i = −S_c dv_i``;
    - ``dG_i = q_i·dq_i − k_i·dk_i``, plus at the chunk's last valid position
      ``e^{Γ_c}·⟨S_c, dS_c⟩ + Σ_j k_j·(e^{Γ_c−G_j} dS_c v_j)``,

    all per value head; the returned ``dq``, ``dk`` are then summed over the value heads sharing a
    q/k head. Returns ``(dq, dk [B,T,H,K], dw [B,T,HV,K] or None (unless w and dv are given),
    dg [B,T,HV] or None (g None))``, fp32 (float64 for float64 inputs); tail tokens give 0.
    """
    B, T, H, K = q.shape
    HV = v.shape[2]
    BT = chunk_size
    cd = _cdtype(q, k, v, do, h, dh, g, dv, w)
    scale = K ** -0.5 if scale is None else scale
    dev = v.device
    qq, kk = _expand_heads(q.to(cd), HV), _expand_heads(k.to(cd), HV)
    want_dw = w is not None and dv is not None
    dq = torch.zeros(B, T, HV, K, dtype=cd, device=dev)
    dk = torch.zeros(B, T, HV, K, dtype=cd, device=dev)
    dw = torch.zeros(B, T, HV, K, dtype=cd, device=dev) if want_dw else None
    dg = torch.zeros(B, T, HV, dtype=cd, device=dev) if g is not None else None
    for _, b, bos, eos, off in _seq_chunks(B, T, BT, cu_seqlens):
        L = eos - bos
        if L == 0:
            continue
        NC = -(-L // BT)
        qc, kc = _heads(qq[b, bos:eos], BT), _heads(kk[b, bos:eos], BT)          # [NC,HV,BT,K]
        vc, doc = _heads(v[b, bos:eos].to(cd), BT), _heads(do[b, bos:eos].to(cd), BT)
        S = h[b, off:off + NC].to(cd)                                            # [NC,HV,K,V]
        dS = dh[b, off:off + NC].to(cd)
        Gc = _gates(g, b, bos, eos, HV, BT, cd, dev)                             # [NC,HV,BT]
        last = _last(L, BT, NC).to(dev)
        Gam = Gc.gather(-1, last[:, None, None].expand(NC, HV, 1))               # [NC,HV,1]
        valid = (torch.arange(NC * BT, device=dev) < L).reshape(NC, 1, BT)
        # exp(Γ − G_j) only at valid positions (padding would give exp(Γ − 0))
        kdec = torch.exp(torch.where(valid, Gam - Gc, torch.full((), float("-inf"), dtype=cd, device=dev)))
        dA = (doc @ vc.transpose(-1, -2)) * _decay_matrix(Gc, strict=False) * scale   # [i, j], j <= i
        dqc = scale * torch.exp(Gc)[..., None] * (doc @ S.transpose(-1, -2)) + dA @ kc
        dk_state = kdec[..., None] * (vc @ dS.transpose(-1, -2))
        dkc = dA.transpose(-1, -2) @ qc + dk_state
        dq[b, bos:eos] = _unheads(dqc, L)
        dk[b, bos:eos] = _unheads(dkc, L)
        if want_dw:
            dw[b, bos:eos] = _unheads(-(_heads(dv[b, bos:eos].to(cd), BT) @ S.transpose(-1, -2)), L)
        if g is not None:
            dgc = (qc * dqc).sum(-1) - (kc * dkc).sum(-1)                        # [NC,HV,BT]
            extra = torch.exp(Gam[..., 0]) * (S * dS).sum((-1, -2)) + (kc * dk_state).sum((-1, -2))
            dgc = dgc.scatter_add(-1, last[:, None, None].expand(NC, HV, 1), extra[..., None])
            dg[b, bos:eos] = dgc.transpose(1, 2).reshape(NC * BT, HV)[:L]
    f32 = _out(cd, torch.float32)
    return (_fold_heads(dq, H).to(f32), _fold_heads(dk, H).to(f32), None if dw is None else dw.to(f32),
            None if dg is None else dg.to(f32))


__all__ = ["chunk_bwd_dv_local_ref", "chunk_gated_delta_rule_bwd_dhu_ref", "chunk_bwd_dqkwg_ref"]
