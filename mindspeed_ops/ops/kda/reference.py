"""Pure-PyTorch references of the Kimi Delta Attention family (SPEC 1.11): the spec in code.

- :func:`recurrent_kda_ref`: the token-by-token recurrence (SPEC 1.10.0 with the per-channel decay
  ``S ← diag(e^{g_t}) S``), the test oracle.
- :func:`chunk_kda_ref`: the chunked (WY/UT) algorithm of SPEC 1.11 with per-channel decay tensors
  ``[HV, BT, BT, K]`` masked to ``−inf`` before the exponential; differentiable by autograd (its
  gradients are the backward oracle of the kernels and the ``reference`` backend's backward).
- stage references: :func:`chunk_kda_fwd_intra_ref` (1.11.1), :func:`kda_aqk_ref` (its ``Aqk`` part),
  :func:`chunk_kda_fwd_o_ref` (output stage), :func:`chunk_kda_bwd_dav_ref` (``dAqk`` and the local
  ``dv``), :func:`chunk_kda_bwd_wy_dqkg_fused_ref` (1.11.2, the formulas of the SPEC) and
  :func:`chunk_kda_bwd_intra_ref` (the intra-chunk paths through ``Aqk`` and ``M``).

The GDN pieces the two families share are reused from ``ops/gdn`` (sequence walking, head expansion,
the cumsum, ``kkt`` with per-channel gates, ``solve_tril``, ``w/u``, the state scan with ``gk``).
float64 inputs compute in float64, anything else in fp32 (SPEC 0.8); varlen inputs loop over sequences.

Source: Kimi Team, "Kimi Linear: An Expressive, Efficient Attention Architecture" (2025), Kimi Delta
Attention (fine-grained, channel-wise gated delta rule); WY/UT chunking from Yang et al.,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length" (NeurIPS 2024).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..common import autograd_recording, without_autocast
from ..gdn.reference import _cdtype, _expand_heads, _finish, _recurrent, _sequences, _setup, _state0, solve_tril_ref
from ..gdn.reference_bwd import _fold_heads, _heads, _last, _out, _seq_chunks, _unheads
from ..gdn.reference_wy import chunk_scaled_dot_kkt_fwd_ref, recompute_w_u_fwd_ref


def _gate(g: Optional[torch.Tensor], v: torch.Tensor, K: int) -> torch.Tensor:
    """``g`` or, for ``None``, per-channel zeros ``[B, T, HV, K]`` (no decay)."""
    if g is not None:
        return g
    return torch.zeros(*v.shape[:3], K, dtype=torch.float32, device=v.device)


def _neg_inf(cd, device) -> torch.Tensor:
    return torch.full((), float("-inf"), dtype=cd, device=device)


def _decay(G: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``e^{G_i − G_j}`` per channel, ``[..., BT, BT, K]`` (``G [..., BT, K]``), with the difference
    replaced by ``−inf`` where ``mask [BT, BT]`` (or broadcastable) is False: masked before the exp."""
    diff = G[..., :, None, :] - G[..., None, :, :]
    return torch.exp(torch.where(mask[..., None], diff, _neg_inf(G.dtype, G.device)))


def _pair_masks(BT: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.arange(BT, device=device)
    return idx[None, :] < idx[:, None], idx[None, :] <= idx[:, None]        # strict, inclusive ([i, j])


# ------------------------------------------------------------------------------------------------
# Oracle: the recurrence (tests only)
# ------------------------------------------------------------------------------------------------

def recurrent_kda_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                      beta: torch.Tensor, scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                      output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                      cu_seqlens: Optional[torch.Tensor] = None):
    """Token-by-token Kimi Delta Attention (SPEC 1.11 intro, 1.10.0), the oracle of the family. Tests only.

    Per sequence and value head, ``S ∈ R^{K×V}``: ``S ← diag(e^{g_t}) S``; ``e = v_t − Sᵀk_t``;
    ``S ← S + β_t k_t eᵀ``; ``o_t = scale·Sᵀq_t``.

    Args:
        q, k: ``[B,T,H,K]``; v: ``[B,T,HV,V]``; g: ``[B,T,HV,K]`` natural-log per-channel decay or None
        (= 0); beta: ``[B,T,HV]`` (used as given); initial_state ``[N,HV,K,V]`` or None; scale: None
        means ``K ** -0.5``; use_qk_l2norm_in_kernel: ``x / sqrt(Σx² + 1e-6)`` on q, k; cu_seqlens:
        ``[N+1]`` packed offsets (``B == 1``) or None.

    Returns:
        ``(o [B,T,HV,V] in q.dtype, final_state [N,HV,K,V] fp32 or None)``; float64 for float64
        inputs. Tail tokens (positions >= cu_seqlens[-1]) give 0.
    """
    return _recurrent(q, k, v, _gate(g, v, q.shape[3]), beta, scale, initial_state, output_final_state,
                      use_qk_l2norm_in_kernel, cu_seqlens)


# ------------------------------------------------------------------------------------------------
# Chunked reference of the full operator
# ------------------------------------------------------------------------------------------------

@without_autocast
def chunk_kda_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], beta: torch.Tensor,
                  scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                  output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                  cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64):
    """Chunked Kimi Delta Attention (SPEC 1.11): the reference of ``chunk_kda`` and, by autograd, of its
    backward. Same arguments and results as :func:`recurrent_kda_ref`, plus ``chunk_size`` (``BT``).

    Chunks of ``BT`` tokens start at every sequence start (the last one may be shorter; it is not
    padded). Per chunk (``G`` = per-channel cumsum of ``g``, ``Γ`` its last row):
    ``M_ij = β_i Σ_d k_id k_jd e^{G_id − G_jd}`` (``j < i``), ``Aqk_ij = scale Σ_d q_id k_jd e^{G_id − G_jd}``
    (``j ≤ i``), the decay tensor ``[HV, BT, BT, K]`` built with the difference masked to ``−inf`` before
    the exp; ``w, u = (I + M)^{-1}(β e^G k), (I + M)^{-1}(β v)``; then the scan
    ``v_new = u − w S``, ``o = scale (q e^G) S + Aqk v_new``, ``S ← diag(e^Γ) S + (k e^{Γ−G})ᵀ v_new``.
    One chunk at a time, so memory stays at one decay tensor (without autograd); with autograd every
    chunk's ``[HV, BT, BT, K]`` tensors are kept (slice heads for very large calls).
    """
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    g = _gate(g, v, K)
    out_dtype, cd, q, k, v, g, beta, scale, o = _setup(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel,
                                                       initial_state, cu_seqlens)
    dev = v.device
    finals = []
    for n, (b, bos, eos) in enumerate(_sequences(B, T, cu_seqlens)):
        S = _state0(initial_state, n, HV, K, V, cd, dev)
        outs = []
        for s in range(bos, eos, BT):                                            # chunks of the sequence
            e = min(s + BT, eos)
            L = e - s
            strict, incl = _pair_masks(L, dev)
            qc, kc, vc = (x[b, s:e].transpose(0, 1) for x in (q, k, v))          # [HV, L, D]
            bc = beta[b, s:e].transpose(0, 1)                                     # [HV, L]
            G = g[b, s:e].transpose(0, 1).cumsum(-2)                              # [HV, L, K]
            Gam = G[:, -1:, :]
            kk = kc[:, :, None, :] * kc[:, None, :, :]                            # [HV, L, L, K]
            M = (kk * _decay(G, strict)).sum(-1) * bc[..., None]
            Aqk = scale * (qc[:, :, None, :] * kc[:, None, :, :] * _decay(G, incl)).sum(-1)
            rhs = torch.cat([bc[..., None] * torch.exp(G) * kc, bc[..., None] * vc], -1)
            eye = torch.eye(L, dtype=cd, device=dev)
            wu = torch.linalg.solve_triangular(eye + M, rhs, upper=False, unitriangular=True)
            w, u = wu[..., :K], wu[..., K:]
            v_new = u - w @ S
            outs.append((scale * (qc * torch.exp(G)) @ S + Aqk @ v_new).transpose(0, 1))
            S = torch.exp(Gam).transpose(-1, -2) * S + (kc * torch.exp(Gam - G)).transpose(-1, -2) @ v_new
        if outs:
            rows = (torch.tensor([b], device=dev), torch.arange(bos, eos, device=dev))
            o = o.index_put(rows, torch.cat(outs))
        finals.append(S)
    return _finish(o, finals, cd, out_dtype, output_final_state)


# ------------------------------------------------------------------------------------------------
# Stage references
# ------------------------------------------------------------------------------------------------

def _aqk_chunks(qc: torch.Tensor, kc: torch.Tensor, Gc: torch.Tensor, valid: torch.Tensor, scale: float):
    """``Aqk`` of chunked ``[NC,HV,BT,K]`` tensors: ``scale Σ_d q_i k_j e^{G_i − G_j}``, ``j ≤ i`` valid."""
    BT = qc.shape[-2]
    _, incl = _pair_masks(BT, qc.device)
    mask = incl & valid[..., :, None] & valid[..., None, :]                      # [NC,1,BT,BT]
    return scale * (qc[..., :, None, :] * kc[..., None, :, :] * _decay(Gc, mask)).sum(-1)


def kda_aqk_ref(q: torch.Tensor, k: torch.Tensor, gk: torch.Tensor, scale: Optional[float] = None,
                cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``Aqk [B,T,HV,BT]`` of SPEC 1.11: ``Aqk[t, j] = scale Σ_d q_{t,d} k_{s_j,d} e^{G_{t,d} − G_{s_j,d}}``
    for chunk positions ``j ≤ i`` (diagonal included) inside the sequence, else 0. ``q, k [B,T,H,K]``,
    ``gk = G [B,T,HV,K]``. float64 for float64 inputs, else ``output_dtype`` (None = ``k.dtype``)."""
    B, T, _, K = q.shape
    HV, BT = gk.shape[2], chunk_size
    cd = _cdtype(q, k, gk)
    scale = K ** -0.5 if scale is None else scale
    qq, kk = _expand_heads(q.to(cd), HV), _expand_heads(k.to(cd), HV)
    A = torch.zeros(B, T, HV, BT, dtype=cd, device=q.device)
    for b, bos, eos in _sequences(B, T, cu_seqlens):
        L = eos - bos
        if L == 0:
            continue
        NC = -(-L // BT)
        valid = (torch.arange(NC * BT, device=q.device) < L).reshape(NC, 1, BT)
        Ac = _aqk_chunks(_heads(qq[b, bos:eos], BT), _heads(kk[b, bos:eos], BT), _heads(gk[b, bos:eos].to(cd), BT),
                         valid, scale)
        A[b, bos:eos] = _unheads(Ac, L)
    return A.to(_out(cd, output_dtype or k.dtype))


def chunk_kda_fwd_intra_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, beta: torch.Tensor,
                            scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None,
                            chunk_size: int = 64, output_qg: bool = False):
    """Reference of ``chunk_kda_fwd_intra`` (SPEC 1.11.1): ``(w, u, qg, kg, Aqk, Akk)``.

    ``M`` from the per-channel ``kkt`` reference (1.10.2), ``Akk = (I + M)^{-1}`` (1.10.3), ``w, u``
    (1.10.4 with ``gk``), ``Aqk`` (:func:`kda_aqk_ref`), ``qg = q ⊙ e^G`` (None unless ``output_qg``),
    ``kg = k ⊙ e^{Γ_c − G}`` (``Γ_c`` = ``G`` at the chunk's last valid position). Dtypes as SPEC 1.11.1
    (float64 throughout for float64 inputs).
    """
    B, T, H, K = q.shape
    HV = v.shape[2]
    BT = chunk_size
    cd = _cdtype(q, k, v, gk, beta)
    f64 = cd == torch.float64
    M = chunk_scaled_dot_kkt_fwd_ref(k, gk=gk, beta=beta, cu_seqlens=cu_seqlens, chunk_size=BT, output_dtype=cd)
    Akk = solve_tril_ref(M, cu_seqlens, output_dtype=k.dtype)
    w, u = recompute_w_u_fwd_ref(k, v, beta, Akk, gk=gk, cu_seqlens=cu_seqlens)
    Aqk = kda_aqk_ref(q, k, gk, scale, cu_seqlens, BT, output_dtype=k.dtype)
    qq, kk, G = _expand_heads(q.to(cd), HV), _expand_heads(k.to(cd), HV), gk.to(cd)
    qg = torch.zeros_like(qq) if output_qg else None
    kg = torch.zeros_like(kk)
    for b, bos, eos in _sequences(B, T, cu_seqlens):
        L = eos - bos
        if L == 0:
            continue
        NC = -(-L // BT)
        last = _last(L, BT, NC).to(q.device)
        Gc = _heads(G[b, bos:eos], BT)                                            # [NC,HV,BT,K]
        Gam = Gc.gather(2, last[:, None, None, None].expand(NC, HV, 1, K))
        valid = (torch.arange(NC * BT, device=q.device) < L).reshape(NC, 1, BT, 1)
        dec = torch.exp(torch.where(valid, Gam - Gc, _neg_inf(cd, q.device)))
        kg[b, bos:eos] = _unheads(_heads(kk[b, bos:eos], BT) * dec, L)
        if output_qg:
            qg[b, bos:eos] = qq[b, bos:eos] * torch.exp(G[b, bos:eos])
    cast = (lambda t, dt: t.to(torch.float64 if f64 else dt))
    return (w, u, None if qg is None else cast(qg, q.dtype), cast(kg, k.dtype), Aqk, Akk)


def chunk_kda_fwd_o_ref(q: torch.Tensor, v: torch.Tensor, h: torch.Tensor, gk: torch.Tensor, Aqk: torch.Tensor,
                        scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None,
                        chunk_size: int = 64) -> torch.Tensor:
    """Output stage of SPEC 1.11: ``o_i = scale·S_cᵀ(q_i ⊙ e^{G_i}) + Σ_{j≤i} Aqk_ij v_j`` with ``v = v_new``,
    ``S_c = h[c]``. ``q [B,T,H,K]``, ``v [B,T,HV,V]``, ``h [B,NT,HV,K,V]``, ``gk = G [B,T,HV,K]``,
    ``Aqk [B,T,HV,BT]`` (scale included). ``o`` in ``v.dtype`` (float64 for float64), tail tokens 0."""
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    cd = _cdtype(q, v, h, gk, Aqk)
    scale = K ** -0.5 if scale is None else scale
    qq = _expand_heads(q.to(cd), HV)
    o = torch.zeros(B, T, HV, V, dtype=cd, device=v.device)
    _, incl = _pair_masks(BT, v.device)
    for _, b, bos, eos, off in _seq_chunks(B, T, BT, cu_seqlens):
        L = eos - bos
        if L == 0:
            continue
        NC = -(-L // BT)
        qg = _heads(qq[b, bos:eos] * torch.exp(gk[b, bos:eos].to(cd)), BT)        # [NC,HV,BT,K]
        A = _heads(Aqk[b, bos:eos].to(cd), BT)                                    # [NC,HV,BT(i),BT(j)]
        valid = (torch.arange(NC * BT, device=v.device) < L).reshape(NC, 1, BT)
        A = torch.where(incl & valid[..., :, None] & valid[..., None, :], A, torch.zeros((), dtype=cd, device=v.device))
        S = h[b, off:off + NC].to(cd)                                             # [NC,HV,K,V]
        o[b, bos:eos] = _unheads(scale * qg @ S + A @ _heads(v[b, bos:eos].to(cd), BT), L)
    return o.to(_out(cd, v.dtype))


def chunk_kda_bwd_dav_ref(v_new: torch.Tensor, do: torch.Tensor, Aqk: torch.Tensor, scale: float,
                          cu_seqlens: Optional[torch.Tensor] = None):
    """``(dAqk, dv)`` of the intra-chunk output term ``o_i += Σ_{j≤i} Aqk_ij v_new_j``: ``dAqk_ij =
    scale·(do_i·v_new_j)`` (``j ≤ i``, valid; the ``scale`` of ``Aqk`` folded in, so this is the
    gradient w.r.t. ``Aqk / scale``) ``[B,T,HV,BT]`` fp32, and ``dv_j = Σ_{i≥j} Aqk_ij do_i`` in
    ``do.dtype`` (float64 for float64 inputs)."""
    B, T, HV, V = do.shape
    BT = Aqk.shape[-1]
    cd = _cdtype(v_new, do, Aqk)
    dA = torch.zeros(B, T, HV, BT, dtype=cd, device=do.device)
    dv = torch.zeros(B, T, HV, V, dtype=cd, device=do.device)
    _, incl = _pair_masks(BT, do.device)
    zero = torch.zeros((), dtype=cd, device=do.device)
    for b, bos, eos in _sequences(B, T, cu_seqlens):
        L = eos - bos
        if L == 0:
            continue
        NC = -(-L // BT)
        valid = (torch.arange(NC * BT, device=do.device) < L).reshape(NC, 1, BT)
        mask = incl & valid[..., :, None] & valid[..., None, :]
        doc, vc = _heads(do[b, bos:eos].to(cd), BT), _heads(v_new[b, bos:eos].to(cd), BT)
        A = torch.where(mask, _heads(Aqk[b, bos:eos].to(cd), BT), zero)
        dA[b, bos:eos] = _unheads(torch.where(mask, scale * doc @ vc.transpose(-1, -2), zero), L)
        dv[b, bos:eos] = _unheads(A.transpose(-1, -2) @ doc, L)
    return dA.to(_out(cd, torch.float32)), dv.to(_out(cd, do.dtype))


def chunk_kda_bwd_wy_dqkg_fused_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, v_new: torch.Tensor,
                                    g: torch.Tensor, beta: torch.Tensor, A: torch.Tensor, h: torch.Tensor,
                                    do: torch.Tensor, dh: torch.Tensor, dv: torch.Tensor,
                                    scale: Optional[float] = None, cu_seqlens: Optional[torch.Tensor] = None,
                                    chunk_size: int = 64, fold_heads: bool = True):
    """Reference of ``chunk_kda_bwd_wy_dqkg_fused`` (SPEC 1.11.2), the formulas of the SPEC per chunk
    (``T = A``, ``S_c = h[c]``, ``dS_c = dh[c]``, ``dV = dv``):

    ``dq_i = scale e^{G_i} ⊙ S_c do_i``; ``dks_j = e^{Γ−G_j} ⊙ dS_c v_new_j``; ``dw_i = −S_c dV_i``;
    ``dT = dV (β v)ᵀ + dw (β e^G k)ᵀ``; ``dA = −Tᵀ dT Tᵀ`` (strictly lower, valid); ``dv_i = β_i (TᵀdV)_i``;
    ``dk_j = dks_j + β_j e^{G_j} ⊙ (Tᵀdw)_j``; ``db_i = v_i·(TᵀdV)_i + (e^{G_i} ⊙ k_i)·(Tᵀdw)_i``;
    ``dg_i = q_i ⊙ dq_i − k_i ⊙ dks_i + k_i ⊙ β_i e^{G_i} ⊙ (Tᵀdw)_i`` plus, at the chunk's last valid
    position, ``e^{Γ} ⊙ Σ_v (S_c ⊙ dS_c) + Σ_j k_j ⊙ dks_j``.

    Returns ``(dq, dk, dv, db, dg, dA)``: ``dq, dk [B,T,H,K]`` fp32 summed over shared value heads
    (``[B,T,HV,K]`` per value head when ``fold_heads=False``), ``dv`` in ``v.dtype``, ``db``, ``dg``,
    ``dA`` fp32; float64 throughout for float64 inputs; tail tokens give 0.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    cd = _cdtype(q, k, v, v_new, g, beta, A, h, do, dh, dv)
    scale = K ** -0.5 if scale is None else scale
    dev = v.device
    qq, kk = _expand_heads(q.to(cd), HV), _expand_heads(k.to(cd), HV)
    z = {n: torch.zeros(B, T, HV, K, dtype=cd, device=dev) for n in ("dq", "dk", "dg")}
    dv_out = torch.zeros(B, T, HV, V, dtype=cd, device=dev)
    db = torch.zeros(B, T, HV, dtype=cd, device=dev)
    dA = torch.zeros(B, T, HV, BT, dtype=cd, device=dev)
    strict, _ = _pair_masks(BT, dev)
    zero = torch.zeros((), dtype=cd, device=dev)
    for _, b, bos, eos, off in _seq_chunks(B, T, BT, cu_seqlens):
        L = eos - bos
        if L == 0:
            continue
        NC = -(-L // BT)
        valid = (torch.arange(NC * BT, device=dev) < L).reshape(NC, 1, BT)
        vk = valid[..., None]
        qc, kc = _heads(qq[b, bos:eos], BT), _heads(kk[b, bos:eos], BT)            # [NC,HV,BT,K]
        vc, vnc, doc, dVc = (_heads(x[b, bos:eos].to(cd), BT) for x in (v, v_new, do, dv))
        Gc = _heads(g[b, bos:eos].to(cd), BT)
        bc = _heads(beta[b, bos:eos].to(cd)[..., None], BT)                           # [NC,HV,BT,1]
        Tm = torch.where(valid[..., :, None] & valid[..., None, :], _heads(A[b, bos:eos].to(cd), BT), zero)
        S, dS = h[b, off:off + NC].to(cd), dh[b, off:off + NC].to(cd)                 # [NC,HV,K,V]
        last = _last(L, BT, NC).to(dev)
        Gam = Gc.gather(2, last[:, None, None, None].expand(NC, HV, 1, K))             # [NC,HV,1,K]
        eG = torch.where(vk, torch.exp(torch.where(vk, Gc, zero)), zero)
        kdec = torch.where(vk, torch.exp(torch.where(vk, Gam - Gc, zero)), zero)
        dq = scale * eG * (doc @ S.transpose(-1, -2))
        dks = kdec * (vnc @ dS.transpose(-1, -2))
        dw = -(dVc @ S.transpose(-1, -2))
        dT = dVc @ (bc * vc).transpose(-1, -2) + dw @ (bc * eG * kc).transpose(-1, -2)
        Tt = Tm.transpose(-1, -2)
        dM = torch.where(strict & valid[..., :, None] & valid[..., None, :], -(Tt @ dT @ Tt), zero)
        TdV, Tdw = Tt @ dVc, Tt @ dw
        dk = dks + bc * eG * Tdw
        dg = qc * dq - kc * dks + kc * bc * eG * Tdw
        extra = torch.exp(Gam[:, :, 0]) * (S * dS).sum(-1) + (kc * dks).sum(-2)        # [NC,HV,K]
        dg = dg.scatter_add(2, last[:, None, None, None].expand(NC, HV, 1, K), extra[:, :, None])
        for name, x in (("dq", dq), ("dk", dk), ("dg", dg)):
            z[name][b, bos:eos] = _unheads(x, L)
        dv_out[b, bos:eos] = _unheads(bc * TdV, L)
        db[b, bos:eos] = _unheads(((vc * TdV).sum(-1) + (eG * kc * Tdw).sum(-1))[..., None], L)[..., 0]
        dA[b, bos:eos] = _unheads(dM, L)
    f32 = _out(cd, torch.float32)
    dq, dk = (z[n] if not fold_heads else _fold_heads(z[n], H) for n in ("dq", "dk"))
    return dq.to(f32), dk.to(f32), dv_out.to(_out(cd, v.dtype)), db.to(f32), z["dg"].to(f32), dA.to(f32)


def chunk_kda_bwd_intra_ref(q: torch.Tensor, k: torch.Tensor, gk: torch.Tensor, beta: torch.Tensor,
                            dAqk: torch.Tensor, dM: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None):
    """Intra-chunk gradients of SPEC 1.11 through ``Aqk/scale`` (cotangent ``dAqk``, ``j ≤ i``) and through
    ``M`` (cotangent ``dM``, ``j < i``), by autograd of the per-channel formulas:
    ``Aqk/scale = Σ_d q_i k_j e^{G_i − G_j}``, ``M_ij = β_i Σ_d k_i k_j e^{G_i − G_j}``.

    Returns per value head ``(dq, dk [B,T,HV,K], db [B,T,HV], dG [B,T,HV,K])`` (w.r.t. ``G``), fp32
    (float64 for float64 inputs). Chunk size ``dAqk.shape[-1]``. Tests only.
    """
    HV, BT = gk.shape[2], dAqk.shape[-1]
    cd = _cdtype(q, k, gk, beta, dAqk, dM)
    with autograd_recording():
        ql, kl = (_expand_heads(t.detach().to(cd), HV).requires_grad_(True) for t in (q, k))
        gl, bl = gk.detach().to(cd).requires_grad_(True), beta.detach().to(cd).requires_grad_(True)
        Aqk = kda_aqk_ref(ql, kl, gl, 1.0, cu_seqlens, BT, output_dtype=cd)
        M = chunk_scaled_dot_kkt_fwd_ref(kl, gk=gl, beta=bl, cu_seqlens=cu_seqlens, chunk_size=BT, output_dtype=cd)
        end = Aqk.shape[1] if cu_seqlens is None else int(cu_seqlens[-1])
        loss = (Aqk[:, :end] * dAqk[:, :end].to(cd)).sum() + (M[:, :end] * dM[:, :end].to(cd)).sum()
        grads = torch.autograd.grad(loss, (ql, kl, bl, gl), allow_unused=True)
    f32 = _out(cd, torch.float32)
    return tuple((torch.zeros_like(p) if gr is None else gr).to(f32) for p, gr in zip((ql, kl, bl, gl), grads))


__all__ = ["recurrent_kda_ref", "chunk_kda_ref", "kda_aqk_ref", "chunk_kda_fwd_intra_ref", "chunk_kda_fwd_o_ref",
           "chunk_kda_bwd_dav_ref", "chunk_kda_bwd_wy_dqkg_fused_ref", "chunk_kda_bwd_intra_ref"]
