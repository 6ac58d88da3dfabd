"""Pure-PyTorch references of the GDN stages 1.10.2 (per-channel form) and 1.10.4 (SPEC):
``chunk_scaled_dot_kkt_fwd_ref``, ``recompute_w_u_fwd_ref`` and ``prepare_wy_repr_bwd_ref``.

They are the CPU path of the stage functions and the test oracles. float64 inputs compute in
float64, anything else in fp32 (SPEC 0.8); every ``exp`` is of a masked argument; varlen inputs
(``cu_seqlens``, ``B == 1``) are handled by looping over sequences, so tail tokens are never read.

``prepare_wy_repr_bwd_ref`` is autograd of the forward with the supplied inverse ``A = T`` held
fixed to first order: ``T_lin = T − T·(M − M.detach())·T`` has the value ``T`` and the derivative
``dM = −Tᵀ·dT·Tᵀ`` of SPEC 1.10.4, where ``M`` is the strictly-lower matrix of 1.10.2 recomputed
from ``k, β, G``. So it differentiates exactly the math the kernel implements, for any ``A``.

Source: Yang et al., "Gated Delta Networks" (ICLR 2025) and "Parallelizing Linear Transformers with
the Delta Rule over Sequence Length" (NeurIPS 2024): the WY/UT representation of the chunk.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..common import autograd_recording
from .reference import _cdtype, _chunked, _expand_heads, _sequences, chunk_scaled_dot_kkt_ref


def _mats(rows: torch.Tensor, BT: int) -> torch.Tensor:
    """Row layout ``[L, HV, BT]`` of one sequence -> per-chunk matrices ``[NC, HV, BT(row), BT(col)]``
    (zero rows past L)."""
    return _chunked(rows, BT).permute(0, 2, 1, 3)


def _valid(L: int, BT: int, device) -> torch.Tensor:
    """``[NC, 1, BT]`` mask of the positions of each chunk inside the sequence."""
    NC = -(-L // BT)
    return (torch.arange(NC * BT, device=device) < L).reshape(NC, 1, BT)


def _heads(x: torch.Tensor, L: int, BT: int) -> torch.Tensor:
    """``[L, HV, D]`` -> ``[NC, HV, BT, D]`` (zero-padded)."""
    return _chunked(x, BT).transpose(1, 2)


def _unchunk(x: torch.Tensor, L: int) -> torch.Tensor:
    """``[NC, HV, BT, D]`` -> ``[L, HV, D]``."""
    NC, HV, BT, D = x.shape
    return x.transpose(1, 2).reshape(NC * BT, HV, D)[:L]


# ------------------------------------------------------------------------------------------------
# 1.10.2 with per-channel gates
# ------------------------------------------------------------------------------------------------

def chunk_scaled_dot_kkt_fwd_ref(k: torch.Tensor, g: Optional[torch.Tensor] = None, gk: Optional[torch.Tensor] = None,
                                 beta: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None,
                                 chunk_size: int = 64,
                                 output_dtype: Optional[torch.dtype] = torch.float32) -> torch.Tensor:
    """Reference of ``chunk_scaled_dot_kkt_fwd`` (SPEC 1.10.2).

    Scalar ``g`` (or none) delegates to :func:`reference.chunk_scaled_dot_kkt_ref`. With per-channel
    ``gk [B,T,HV,K]``: ``A[t, j] = β_t Σ_d k_{t,d} k_{s_j,d} e^{G_{t,d} − G_{s_j,d}}`` for ``j < i``
    in one chunk, else 0, the difference masked before the ``exp``.

    Returns ``A [B,T,HV,BT]``: float64 for float64 inputs, else ``output_dtype`` (None = ``k.dtype``).
    """
    if gk is None:
        return chunk_scaled_dot_kkt_ref(k, g, beta, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
                                        output_dtype=output_dtype)
    if g is not None:
        raise ValueError("chunk_scaled_dot_kkt_fwd_ref: pass g or gk, not both")
    B, T, H, K = k.shape
    HV = gk.shape[2]
    BT = chunk_size
    cd = _cdtype(k, gk, beta)
    kk = _expand_heads(k.to(cd), HV)
    A = torch.zeros(B, T, HV, BT, dtype=cd, device=k.device)
    idx = torch.arange(BT, device=k.device)
    strict = idx[None, :] < idx[:, None]                                  # [i, j]: j < i
    for b, bos, eos in _sequences(B, T, cu_seqlens):
        L = eos - bos
        if L == 0:
            continue
        kc = _heads(kk[b, bos:eos], L, BT)                                 # [NC,HV,BT,K]
        Gc = _heads(gk[b, bos:eos].to(cd), L, BT)
        valid = _valid(L, BT, k.device)
        mask = (strict & valid[..., :, None] & valid[..., None, :])[..., None]  # [NC,1,BT,BT,1]
        diff = Gc[:, :, :, None, :] - Gc[:, :, None, :, :]                    # [NC,HV,BT,BT,K]
        dec = torch.exp(torch.where(mask, diff, torch.full((), float("-inf"), dtype=cd, device=k.device)))
        Ac = (kc[:, :, :, None, :] * kc[:, :, None, :, :] * dec).sum(-1)      # [NC,HV,BT,BT]
        if beta is not None:
            Ac = Ac * _heads(beta[b, bos:eos].to(cd)[..., None], L, BT)
        A[b, bos:eos] = _unchunk(Ac, L)
    return A.to(torch.float64 if cd == torch.float64 else (output_dtype or k.dtype))


# ------------------------------------------------------------------------------------------------
# 1.10.4
# ------------------------------------------------------------------------------------------------

def _w_u(k, v, beta, A, g, gk, cu_seqlens, M=None):
    """``(w, u)`` in the compute dtype of the (already converted) inputs; ``k`` has HV heads.
    With ``M`` (the 1.10.2 matrix, row layout), the inverse is linearised around ``A`` (see module
    docstring) so autograd yields the SPEC 1.10.4 backward."""
    B, T, HV, K = k.shape
    BT = A.shape[-1]
    w = torch.zeros(B, T, HV, K, dtype=k.dtype, device=k.device)
    u = torch.zeros(B, T, HV, v.shape[-1], dtype=k.dtype, device=k.device)
    zero = torch.zeros((), dtype=k.dtype, device=k.device)
    for b, bos, eos in _sequences(B, T, cu_seqlens):
        L = eos - bos
        if L == 0:
            continue
        valid = _valid(L, BT, k.device)
        Tc = torch.where(valid[..., :, None] & valid[..., None, :], _mats(A[b, bos:eos], BT), zero)
        if M is not None:
            dM = _mats(M[b, bos:eos], BT)
            Tc = Tc - Tc @ (dM - dM.detach()) @ Tc
        bc = _heads(beta[b, bos:eos][..., None], L, BT)                   # [NC,HV,BT,1]
        kc = _heads(k[b, bos:eos], L, BT) * bc
        if g is not None:
            kc = kc * torch.exp(_heads(g[b, bos:eos][..., None], L, BT))
        if gk is not None:
            kc = kc * torch.exp(_heads(gk[b, bos:eos], L, BT))
        w[b, bos:eos] = _unchunk(Tc @ kc, L)
        u[b, bos:eos] = _unchunk(Tc @ (_heads(v[b, bos:eos], L, BT) * bc), L)
    return w, u


def recompute_w_u_fwd_ref(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, A: torch.Tensor,
                          g: Optional[torch.Tensor] = None, gk: Optional[torch.Tensor] = None,
                          cu_seqlens: Optional[torch.Tensor] = None):
    """Reference of ``recompute_w_u_fwd`` (SPEC 1.10.4): per chunk ``w = A_c·(β ⊙ e^{G} ⊙ k)``
    (per channel with ``gk``; no factor without a gate) and ``u = A_c·(β ⊙ v)``, the products over
    the chunk's valid positions only (the chunk size is ``A.shape[-1]``).

    Shapes: ``k [B,T,H,K]``, ``v [B,T,HV,V]``, ``beta, g [B,T,HV]``, ``gk [B,T,HV,K]``,
    ``A [B,T,HV,BT]``. Returns ``(w [B,T,HV,K] in k.dtype, u [B,T,HV,V] in v.dtype)`` (float64 for
    float64 inputs); tail tokens give 0. Differentiable by autograd (w.r.t. every input, ``A`` as given).
    """
    if g is not None and gk is not None:
        raise ValueError("recompute_w_u_fwd_ref: pass g or gk, not both")
    cd = _cdtype(k, v, beta, A, g, gk)
    HV = v.shape[2]
    conv = [None if t is None else t.to(cd) for t in (v, beta, A, g, gk)]
    w, u = _w_u(_expand_heads(k.to(cd), HV), *conv[:3], conv[3], conv[4], cu_seqlens)
    f64 = cd == torch.float64
    return w.to(torch.float64 if f64 else k.dtype), u.to(torch.float64 if f64 else v.dtype)


def prepare_wy_repr_bwd_ref(k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], beta: torch.Tensor,
                            A: torch.Tensor, dw: torch.Tensor, du: torch.Tensor,
                            cu_seqlens: Optional[torch.Tensor] = None):
    """Reference of ``prepare_wy_repr_bwd`` (SPEC 1.10.4): gradients of ``Σ w·dw + Σ u·du`` w.r.t.
    ``k, v, β, G`` where ``w, u`` come from ``A = T`` (the supplied inverse, chunk size
    ``A.shape[-1]``) and ``T``'s dependence on the recomputed ``M(k, β, G)`` is ``dM = −Tᵀ·dT·Tᵀ``
    restricted to strictly-lower valid entries.

    Returns ``(dk [B,T,H,K] fp32 (summed over each q/k head's value heads), dv [B,T,HV,V] in
    v.dtype, dbeta [B,T,HV] fp32, dg [B,T,HV] fp32 or None when g is None)``; float64 throughout for
    float64 inputs. Tail tokens give 0 and are never read.
    """
    cd = _cdtype(k, v, g, beta, A, dw, du)
    BT = A.shape[-1]
    HV = v.shape[2]
    with autograd_recording():
        leaves = [t.detach().to(cd).requires_grad_(True) for t in (k, v, beta)]
        gl = None if g is None else g.detach().to(cd).requires_grad_(True)
        kk, vv, bb = leaves
        M = chunk_scaled_dot_kkt_ref(kk, gl, bb, cu_seqlens=cu_seqlens, chunk_size=BT, output_dtype=cd)
        w, u = _w_u(_expand_heads(kk, HV), vv, bb, A.detach().to(cd), gl, None, cu_seqlens, M=M)
        # cotangents: only positions inside sequences matter (w, u are 0 elsewhere); NaN/Inf in the
        # tail of dw/du must not reach the sum
        end = w.shape[1] if cu_seqlens is None else int(cu_seqlens[-1])
        loss = (w[:, :end] * dw[:, :end].detach().to(cd)).sum() + (u[:, :end] * du[:, :end].detach().to(cd)).sum()
        wrt = leaves + ([gl] if gl is not None else [])
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    grads = [torch.zeros_like(p) if gr is None else gr for p, gr in zip(wrt, grads)]
    f32 = torch.float64 if cd == torch.float64 else torch.float32
    dk, dv, dbeta = grads[0].to(f32), grads[1].to(torch.float64 if cd == torch.float64 else v.dtype), grads[2].to(f32)
    dg = grads[3].to(f32) if g is not None else None
    return dk, dv, dbeta, dg


__all__ = ["chunk_scaled_dot_kkt_fwd_ref", "recompute_w_u_fwd_ref", "prepare_wy_repr_bwd_ref"]
