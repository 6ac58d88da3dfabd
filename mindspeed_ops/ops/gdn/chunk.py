"""``chunk_gated_delta_rule`` (SPEC 1.10.10): the forward composed of the stage kernels.

Pipeline (SPEC 1.10.0 table): optional in-kernel l2norm of q/k -> ``G = chunk_local_cumsum(g)`` ->
``A = chunk_scaled_dot_kkt(k, G, beta)`` -> ``Ainv = solve_tril(A)`` -> ``w, u = recompute_w_u_fwd`` ->
``h, v_new, final_state = chunk_gated_delta_rule_fwd_h`` -> ``o = chunk_fwd_o``. The backward needs
only the inputs, ``G`` and ``Ainv`` (``w, u, h, v_new`` are recomputed; ``Ainv`` is saved, not recomputed);
with the in-kernel l2norm, where the op is asked to (:mod:`.qk_norm`), q and k as the forward normalized them
(``q̂, k̂`` and their fp32 rstd) instead of the raw q and k, so the backward does not normalize them again.
The kkt and solve_tril steps run as one fused kernel by default (``FUSED_KKT_SOLVE``).
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ... import triton_utils as tu
from .. import side_stream
from ..common import unit_last_stride
from . import bwd_dhu, bwd_dqkwg, bwd_dv, cumsum, fwd_h, fwd_o, kkt, kkt_solve, solve_tril, wy_fast
from . import qk_norm
from .common import device_tables, shared_v_tile, zero_tail_rows

OP = "chunk_gated_delta_rule"
L2_EPS = 1e-6  # SPEC 1.10.10: the in-kernel qk l2norm's eps


_env_switch = tu.env_switch


#: How the forward forms ``Ainv``. True (default): one fused launch, ``kkt_solve.forward`` (A formed in
#: registers, never written to global memory). False: the two stage launches ``kkt.forward`` (fp32 A to
#: global memory) then ``solve_tril.forward``. Same numerics contract; the switch keeps both paths testable
#: and timeable: set the attribute, or ``MINDSPEED_OPS_GDN_FUSED_KKT_SOLVE=0`` in the environment (read at
#: import, see ``_env_switch``).
FUSED_KKT_SOLVE = _env_switch("MINDSPEED_OPS_GDN_FUSED_KKT_SOLVE")


#: Apply the in-kernel l2norm's backward of dq inside ``chunk_bwd_dqkwg`` where it can (``folds_q_norm``: one
#: program holds a whole K row) instead of a separate l2norm backward launch over an fp32 dq. A module attribute
#: (no environment switch) so that tests can compare both paths.
FOLD_DQ_NORM = True


def _ainv(k, G, beta, HV: int, cu_host, cu, BT: int, idx, rk):
    """``Ainv = solve_tril(chunk_scaled_dot_kkt(k, G, beta))`` in k's dtype, by ``FUSED_KKT_SOLVE``'s path."""
    if FUSED_KKT_SOLVE:
        return kkt_solve.forward(k, G, beta, HV, cu_host, cu, BT, k.dtype, idx, rk=rk)
    A = kkt.forward(k, G, None, beta, HV, cu_host, cu, BT, torch.float32, idx, rk=rk)
    return solve_tril.forward(A, cu_host, cu, k.dtype, idx)


def _l2norm(x: torch.Tensor):
    """The l2norm implementation for ``x``'s device, called directly: inside this pipeline the
    torch.ops dispatch of the public op was ~40% of the forward's host time (no-op launch profile)."""
    return backends.implementation("l2norm", x.device)


def forward(q, k, v, g, beta, scale: float, initial_state, output_final_state: bool, use_qk_l2norm_in_kernel: bool,
            cu_seqlens: Optional[torch.Tensor], cu_host: Optional[list], chunk_size: int, return_qk_norm: bool = True):
    """Returns ``(o, final_state or None, G or None, Ainv, qn, kn, q_rstd, k_rstd)``; arguments already
    validated. With ``use_qk_l2norm_in_kernel`` and ``return_qk_norm``, ``qn, kn`` are q and k normalized in their
    dtype and ``q_rstd, k_rstd`` their fp32 rstd ``[B, T, H]``, for the backward; else the four are None.

    Calls the stages' launchers directly with the validated host offsets: no stage re-validates
    ``cu_seqlens`` (each check would be a device->host copy, i.e. a synchronisation)."""
    BT = chunk_size
    cu, idx = device_tables(cu_host, BT, q.device)
    # the l2norm is folded in: raw q, k and their rstd go to the stages, so q̂ = rstd·q is never rounded
    # to the input dtype (without decay, a rounded ‖k̂‖ != 1 compounds through the state). With return_qk_norm
    # the same launches also write the rounded q̂, k̂ for the backward (which runs on them): two launches fewer
    # there for one more write of q and k here.
    qn = kn = rq = rk = None
    if use_qk_l2norm_in_kernel:
        qn, kn, rq, rk = qk_norm.normalize(q, k, L2_EPS, write=return_qk_norm)
    G = None if g is None else cumsum.forward(g, BT, False, None, cu_host, cu, torch.float32, idx)
    HV = v.shape[2]
    Ainv = _ainv(k, G, beta, HV, cu_host, cu, BT, idx, rk)
    w, u = wy_fast.forward(k, v, beta, Ainv, G, None, cu_host, cu, idx, rk=rk)
    h, v_new, final = fwd_h.forward(k, w, u, G, None, initial_state, output_final_state, BT, True, cu_host, rk=rk)
    o = fwd_o.forward(q, k, v_new, h, G, scale, cu_host, cu, BT, idx, rq=rq, rk=rk)
    return o, final, G, Ainv, qn, kn, *((rq, rk) if qn is not None else (None, None))  # no rstd without q̂, k̂


def backward(do, dht, q, k, v, g, beta, G, Ainv, initial_state, scale: float, use_qk_l2norm_in_kernel: bool,
             cu_seqlens: Optional[torch.Tensor], cu_host: Optional[list], chunk_size: int,
             q_rstd: Optional[torch.Tensor] = None, k_rstd: Optional[torch.Tensor] = None):
    """Backward pipeline of SPEC 1.10.0 from the saved inputs, ``G`` and ``Ainv`` (``w, u, h, v_new``
    recomputed; the forward scan on a side stream, :mod:`..side_stream`). Returns ``(dq, dk, dv, dg or None,
    dbeta, dh0 or None)``: dg/dbeta/dh0 in fp32, dq/dk in fp32 (in q's/k's dtype with the in-kernel l2norm,
    whose backward writes them). With the in-kernel l2norm and ``q_rstd``/``k_rstd`` given (the forward's),
    ``q``/``k`` are the forward's ``qn``/``kn``; without them the raw q/k, normalized here."""
    BT = chunk_size
    do = unit_last_stride(do)  # once (an expanded upstream gradient, e.g. of o.sum(), has last stride 0), not per stage
    cu, idx = device_tables(cu_host, BT, q.device)
    G = G if g is not None else None
    if use_qk_l2norm_in_kernel:
        qn, kn, q_rstd, k_rstd = qk_norm.normalize(q, k, L2_EPS, q_rstd, k_rstd)
    else:
        qn, kn = q, k
    w, u = wy_fast.forward(kn, v, beta, Ainv, G, None, cu_host, cu, idx)
    # the reverse scan (dh) does not read h: the recomputed forward scan runs beside dv_local and dhu where
    # both scans fit on the SMs side by side, each at a V tile that keeps it to half the SMs
    N, HV, V = (q.shape[0] if cu_host is None else len(cu_host) - 1), v.shape[2], v.shape[3]
    h, v_new = fwd_h.outputs(kn, u, BT, cu_host)  # on this stream, before the fork (side_stream's contract)
    bv = shared_v_tile(q.device, N * HV, V)
    side = side_stream.fork(q.device, programs=N * HV * tu.cdiv(V, bv))
    min_bv = 0 if side is None else bv
    side_stream.on_side(side, fwd_h.forward, kn, w, u, G, None, initial_state, False, BT, True, cu_host,
                        out=(h, v_new), min_bv=min_bv)
    dv_local = bwd_dv.forward(qn, kn, do, G, scale, cu_host, cu, BT, idx)
    dh, dh0, dv2 = bwd_dhu.forward(qn, kn, w, do, dv_local, G, None, initial_state, dht, scale, BT, cu_host,
                                   min_bv=min_bv)
    side_stream.join(side)  # before any input of the side branch (u) is freed
    del dv_local, u  # the recomputed intermediates go as soon as their last stage has run (peak memory)
    # the l2norm backward of dq inside dqkwg where one program holds a whole row (no fp32 dq pass of its own)
    fold_q = use_qk_l2norm_in_kernel and FOLD_DQ_NORM and bwd_dqkwg.folds_q_norm(qn)
    dq, dk, dw, dG = bwd_dqkwg.forward(qn, kn, v_new, do, h, dh, G, dv2, w, scale, cu_host, cu, BT, idx,
                                       dw_dtype=tu.kernel_dtype(kn.dtype), q_rstd=q_rstd if fold_q else None)
    del h, dh, v_new, w
    # wy's backward adds dqkwg's dk and dG on its way out (no separate elementwise passes); with the l2norm, the
    # GVA sum of dk over value heads happens as the l2norm backward reads it (no [B, T, H, K] pass of its own)
    # and it returns dg = the reverse chunk cumsum of the total dG (the gate's gradient; no launch of its own)
    dk, dv, dbeta, dg = wy_fast.backward(kn, v, G, beta, Ainv, dw, dv2, cu_host, cu, idx, dk_acc=dk, dg_acc=dG,
                                         fold=not use_qk_l2norm_in_kernel, dg_cumsum=True)
    del dw, dv2
    if use_qk_l2norm_in_kernel:  # straight to the input dtype: the caller's cast would be one more pass
        if not fold_q:
            dq = _l2norm(q).backward(qn, q_rstd, dq, L2_EPS, True, q.dtype)
        dk = _l2norm(k).backward(kn, k_rstd, dk, L2_EPS, True, k.dtype, dy_group=v.shape[2] // k.shape[2])
        zero_tail_rows(cu_host, dq, dk)
    return dq, dk, dv, dg, dbeta, dh0
