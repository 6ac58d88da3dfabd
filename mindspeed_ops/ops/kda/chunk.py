"""``chunk_kda`` (SPEC 1.11.3): the Triton forward and backward composed of stage kernels.

Forward: optional l2norm of q/k -> ``G = chunk_local_cumsum(g)`` (GDN) -> ``chunk_kda_fwd_intra``
(``Aqk``, ``M`` and ``kg = k ⊙ e^{Γ−G}`` by the KDA kernel, ``Akk`` by GDN's ``solve_tril``, ``w, u`` by
GDN's ``recompute_w_u_fwd`` with ``gk``) -> ``h, v_new, final_state`` by GDN's state scan with ``gk`` on
``kg`` -> ``o`` by the KDA output stage. Saved for the backward: the inputs, ``G``, ``Akk``, ``Aqk``; with the
in-kernel l2norm, q and k as the forward normalized them, with their rstd (:mod:`..gdn.qk_norm`).

Backward: ``w, u``, ``qg = q ⊙ e^G``, ``kg``, ``h, v_new`` recomputed -> ``dAqk, dv_local`` (KDA) ->
``dh, dh0, dv2`` by GDN's reverse state scan with ``gk`` on ``qg, kg`` (it reads neither ``h, v_new`` nor
``dAqk``, which a side stream makes meanwhile, :mod:`..side_stream`) -> ``chunk_kda_bwd_wy_dqkg_fused``
(KDA, SPEC 1.11.2) -> the intra-chunk paths through ``Aqk`` and ``M`` (KDA) -> ``dg`` = reverse chunk-local
cumsum of ``dG`` (GDN) -> l2norm backward, which sums dq/dk over the value heads of each key head as it
reads them (``dy_group``; without the in-kernel l2norm, ``fold_value_heads`` does the sum).

The stage launchers are called directly (their arguments are validated once, by the operator), so
varlen offsets are read on the host once per call (not at all when the operator got ``cu_seqlens_cpu``).
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from .. import side_stream
from ..common import unit_last_stride
from ..gdn.bwd_dhu import forward as _dhu_forward
from ..gdn.common import device_tables, fold_value_heads, shared_v_tile, zero_tail_rows
from ..gdn.cumsum import forward as _cumsum_forward
from ..gdn.fwd_h import forward as _fwd_h_forward
from ..gdn.fwd_h import outputs as _fwd_h_outputs
from ..gdn import qk_norm
from ..gdn.wy_fast import forward as _wy_forward
from . import bwd as _bwd
from . import fwd_o as _fwd_o
from . import intra as _intra

OP = "chunk_kda"
L2_EPS = 1e-6


def forward(q, k, v, g, beta, scale: float, initial_state, output_final_state: bool, use_qk_l2norm_in_kernel: bool,
            cu_seqlens: Optional[torch.Tensor], cu_host: Optional[list], chunk_size: int, return_qk_norm: bool = True):
    """Returns ``(o, final_state or None, G, Akk, Aqk, qn, kn, q_rstd, k_rstd)``; arguments already validated. The
    last four (for the backward, :mod:`..gdn.qk_norm`) are None unless ``use_qk_l2norm_in_kernel`` and
    ``return_qk_norm``."""
    BT = chunk_size
    cu, idx = device_tables(cu_host, BT, q.device)
    # the l2norm is folded in: raw q, k and their rstd go to the stages, so q̂ = rstd·q is never rounded
    # to the input dtype (without decay, a rounded ‖k̂‖ != 1 compounds through the state); the same launches
    # write the rounded q̂, k̂ the backward runs on
    qn = kn = rq = rk = None
    if use_qk_l2norm_in_kernel:
        qn, kn, rq, rk = qk_norm.normalize(q, k, L2_EPS, write=return_qk_norm)
    G = _cumsum_forward(g, BT, False, None, cu_host, cu, torch.float32, idx)
    w, u, _, kg, Aqk, Akk = _intra.forward(q, k, v, G, beta, scale, cu_host, cu, BT, idx, output_qg=False,
                                           output_kg=True, rq=rq, rk=rk)
    # the state scan takes kg = k ⊙ e^{Γ−G} (rk folded in) from the intra kernel: no gate tiles per V-tile
    h, v_new, final = _fwd_h_forward(kg, w, u, None, G, initial_state, output_final_state, BT, True, cu_host,
                                     k_gated=True)
    del kg
    o = _fwd_o.forward(q, v_new, h, G, Aqk, scale, cu_host, cu, BT, idx, rq=rq)
    return o, final, G, Akk, Aqk, qn, kn, *((rq, rk) if qn is not None else (None, None))  # no rstd without q̂, k̂


def backward(do, dht, q, k, v, beta, G, Akk, Aqk, initial_state, scale: float, use_qk_l2norm_in_kernel: bool,
             cu_seqlens: Optional[torch.Tensor], cu_host: Optional[list], chunk_size: int,
             q_rstd: Optional[torch.Tensor] = None, k_rstd: Optional[torch.Tensor] = None):
    """Returns ``(dq, dk [B,T,H,K] (fp32; in q's/k's dtype with the in-kernel l2norm), dv, dg [B,T,HV,K] fp32,
    dbeta fp32, dh0 fp32 or None)``. With the in-kernel l2norm and ``q_rstd``/``k_rstd`` given (the forward's),
    ``q``/``k`` are the forward's ``qn``/``kn``; without them the raw q/k, normalized here."""
    BT = chunk_size
    H = q.shape[2]
    do = unit_last_stride(do)  # once (an expanded upstream gradient has last stride 0), not in every stage
    cu, idx = device_tables(cu_host, BT, q.device)
    if use_qk_l2norm_in_kernel:
        qn, kn, rq, rk = qk_norm.normalize(q, k, L2_EPS, q_rstd, k_rstd)
    else:
        qn, kn = q, k
    w, u = _wy_forward(kn, v, beta, Akk, None, G, cu_host, cu, idx)
    # qg = q ⊙ e^G and kg = k ⊙ e^{Γ−G} once (per value head), for both state scans
    _, qg, kg, _ = _intra.aqk_forward(qn, kn, G, scale, cu_host, cu, BT, idx, store_a=False, store_qg=True,
                                      store_kg=True)
    # the reverse scan (dh) reads neither h nor v_new: the recomputed forward scan and dAq (which reads v_new)
    # run on a side stream beside the local dv and the reverse scan (faster at every point measured, 128
    # programs a scan included: docs/benchmarks/kda.md); on one stream one launch makes dAq and dv_local
    h, v_new = _fwd_h_outputs(kg, u, BT, cu_host)  # on this stream, before the fork (side_stream's contract)
    side = side_stream.fork(q.device)
    # side by side, each scan at a V tile that keeps it to half the SMs where it can (see gdn.common.shared_v_tile)
    N = q.shape[0] if cu_host is None else len(cu_host) - 1
    min_bv = 0 if side is None else shared_v_tile(q.device, N * v.shape[2], v.shape[3])
    side_stream.on_side(side, _fwd_h_forward, kg, w, u, None, G, initial_state, False, BT, True, cu_host,
                        k_gated=True, out=(h, v_new), min_bv=min_bv)
    if side is None:
        dAq, dv_local = _bwd.dav_forward(v_new, do, Aqk, scale, cu_host, cu, idx)
    else:
        dAq = torch.empty(Aqk.shape, dtype=torch.float32, device=Aqk.device)
        side_stream.on_side(side, _bwd.dav_forward, v_new, do, Aqk, scale, cu_host, cu, idx, dv=False, dA_out=dAq)
        _, dv_local = _bwd.dav_forward(None, do, Aqk, scale, cu_host, cu, idx, dA=False)
    dh, dh0, dv2 = _dhu_forward(qg, kg, w, do, dv_local, None, G, initial_state, dht, scale, BT, cu_host,
                                qk_gated=True, min_bv=min_bv)
    side_stream.join(side)  # before any input of the side branch (u, kg) is freed
    del dv_local, w, u, qg, kg  # the recomputed intermediates go as soon as their last stage has run (peak memory)
    dq, dk, dv, db, dG, dAm = _bwd.wy_dqkg_forward(qn, kn, v, v_new, G, beta, Akk, h, do, dh, dv2, scale, cu_host,
                                                   cu, idx, fold_heads=False)
    del h, dh, dv2, v_new
    _bwd.intra_bwd_forward(qn, kn, G, beta, dAq, dAm, dq, dk, dG, db, cu_host, cu, idx)
    del dAq, dAm
    dg = _cumsum_forward(dG, BT, True, None, cu_host, cu, torch.float32, idx)
    del dG
    if use_qk_l2norm_in_kernel:  # the GVA head sums happen as the l2norm backward reads dq/dk (dy_group); it
        # writes them in the input dtype (one rounding, as the caller's cast would do, without that pass)
        l2, G_v = backends.implementation("l2norm", q.device), v.shape[2] // H
        dq = l2.backward(qn, rq, dq, L2_EPS, True, q.dtype, dy_group=G_v)
        dk = l2.backward(kn, rk, dk, L2_EPS, True, k.dtype, dy_group=G_v)
        zero_tail_rows(cu_host, dq, dk)
    else:
        dq, dk = fold_value_heads(dq, H), fold_value_heads(dk, H)
    return dq, dk, dv, dg, db, dh0
