"""``recompute_w_u_fwd`` and ``prepare_wy_repr_bwd`` (SPEC 1.10.4): checks and launches of the WY
representation of a chunk (``w = Ainv·(β e^G k)``, ``u = Ainv·(β v)``) and of its backward."""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_cu_seqlens, check_same_device, check_tensor, reject_float64, shape_str
from . import reference_wy as _ref
from .common import check_value_heads, chunk_table, fold_value_heads, row_factor_args, use_triton
from .kkt import CHUNK_SIZES, MAX_K, key_tile

FWD = "recompute_w_u_fwd"
BWD = "prepare_wy_repr_bwd"


def value_tile(V: int) -> int:
    """Value-dim tile: a power of two in [16, 64]."""
    return max(16, min(64, tu.next_power_of_2(V)))


def fwd_config(BT: int, K: int, V: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """``(BK, BV, num_warps, num_stages)`` of the forward kernel."""
    if dtype == torch.float32:  # IEEE fp32 products run on the FMA units: smaller tiles, no pipelining (no spills)
        return min(32, key_tile(K)), min(32, value_tile(V)), 4, 1
    return _tensor_core_tiles(K, V) + (4, 3)  # H200 sweep (benchmarks/tune_gdn_bwd.py): 80 vs 90 µs at 2 stages


def bwd_config(BT: int, K: int, V: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """``(BK, BV, num_warps, num_stages)`` of the backward kernel."""
    if dtype == torch.float32:
        return min(32, key_tile(K)), min(32, value_tile(V)), 8, 1
    t = _tensor_core_tiles(K, V)
    # H200 sweep (tune_gdn_bwd.py, BT = 64): 4 warps 377 vs 537 µs at 8 with 64-wide tiles; with 32-wide
    # tiles 4 warps gave wrong dk (rel-RMS 3.5e-2 at K = 32, V = 24) or inf (triton 3.6): 8 there
    return t + (4 if BT < 64 or t[0] >= 64 else 8, 3)


def _tensor_core_tiles(K: int, V: int) -> tuple[int, int]:
    """``(BK, BV)`` for fp16/bf16: one width for both loops. The kernels feed the same register tile
    (``A``) to the key-loop and value-loop dots; on Hopper (wgmma, BT = 64) two different N widths
    for that shared operand gave wrong ``w``/``dk`` (H200, triton 3.6: rel-RMS ~1 with BK=32, BV=64)."""
    t = max(key_tile(K), value_tile(V))
    return t, t


def _check_common(op: str, k, v, beta, A, g, gk=None, **extra) -> tuple[int, int]:
    """Shapes/dtypes/devices shared by both functions; returns ``(HV, BT)``."""
    reject_float64(op, k=k, v=v, beta=beta, A=A, g=g, gk=gk, **extra)
    check_tensor(op, "k", k, ndim=4)
    check_tensor(op, "v", v, ndim=4)
    B, T, H, K = k.shape
    HV = v.shape[2]
    if K > MAX_K:
        raise ValueError(f"{op}: the key head dim K must be <= {MAX_K}, got k of shape {shape_str(k.shape)}")
    check_tensor(op, "v", v, shape=(B, T, None, None), shape_desc="[B, T, HV, V]")
    check_value_heads(op, HV, H, "v.shape[2]", "k.shape[2]")
    check_tensor(op, "beta", beta, shape=(B, T, HV), shape_desc="[B, T, HV]")
    check_tensor(op, "A", A, ndim=4)
    BT = A.shape[-1]
    if BT not in CHUNK_SIZES:
        raise ValueError(f"{op}: A's last dim (the chunk size BT) must be 16, 32 or 64, got shape {shape_str(A.shape)}")
    check_tensor(op, "A", A, shape=(B, T, HV, BT), shape_desc="[B, T, HV, BT]")
    if g is not None and gk is not None:
        raise ValueError(f"{op}: pass the scalar gate g or the per-channel gate gk, not both")
    if g is not None:
        check_tensor(op, "g", g, shape=(B, T, HV), shape_desc="[B, T, HV]")
    if gk is not None:
        check_tensor(op, "gk", gk, shape=(B, T, HV, K), shape_desc="[B, T, HV, K]")
    return HV, BT


def _check_cu(op, cu_seqlens, k):
    return check_cu_seqlens(op, cu_seqlens, batch=k.shape[0], total=k.shape[1], like=("k", k))


def check_fwd_args(k, v, beta, A, g, gk, cu_seqlens) -> Optional[list]:
    """Validate ``recompute_w_u_fwd``'s arguments; returns the host copy of ``cu_seqlens`` (or None)."""
    _check_common(FWD, k, v, beta, A, g, gk)
    check_same_device(FWD, k=k, v=v, beta=beta, A=A, g=g, gk=gk)
    return _check_cu(FWD, cu_seqlens, k)


def check_bwd_args(k, v, g, beta, A, dw, du, cu_seqlens, chunk_size) -> Optional[list]:
    """Validate ``prepare_wy_repr_bwd``'s arguments; returns the host copy of ``cu_seqlens`` (or None)."""
    HV, BT = _check_common(BWD, k, v, beta, A, g, dw=dw, du=du)
    B, T, _, K = k.shape
    if chunk_size != BT:
        raise ValueError(f"{BWD}: chunk_size = {chunk_size!r} conflicts with A's last dim (the chunk size) {BT}")
    check_tensor(BWD, "dw", dw, shape=(B, T, HV, K), shape_desc="[B, T, HV, K]")
    check_tensor(BWD, "du", du, shape=v.shape, shape_desc="[B, T, HV, V]")
    check_same_device(BWD, k=k, v=v, g=g, beta=beta, A=A, dw=dw, du=du)
    return _check_cu(BWD, cu_seqlens, k)


def _zero_tail(t: torch.Tensor, cu_host: Optional[list]) -> None:
    if cu_host is not None and cu_host[-1] < t.shape[1]:
        t[:, cu_host[-1]:].zero_()


# ------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------

def recompute_w_u_fwd(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, A: torch.Tensor,
                      g: Optional[torch.Tensor] = None, gk: Optional[torch.Tensor] = None,
                      cu_seqlens: Optional[torch.Tensor] = None,
                      chunk_indices: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """WY representation of every chunk (SPEC 1.10.4, step 4 of the chunked gated delta rule).
    Forward-only stage function.

    ``w = Ainv_c·(β ⊙ e^{G} ⊙ k)`` (per channel ``e^{G_{t,d}}`` with ``gk``; no factor without a gate)
    and ``u = Ainv_c·(β ⊙ v)``, the products over the chunk's valid positions only.

    Args:
        k: ``[B, T, H, K]`` keys (``K <= 256``); v: ``[B, T, HV, V]`` values (``HV % H == 0``, any V).
        beta: ``[B, T, HV]``.
        A: ``Ainv [B, T, HV, BT]`` from ``solve_tril`` (``BT`` in {16, 32, 64} is the chunk size). All
            its entries at valid rows/columns are used as given.
        g: ``[B, T, HV]`` chunk-local cumsum ``G`` (natural log) or None; gk: ``[B, T, HV, K]``
            per-channel ``G`` or None (not both).
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``).
        chunk_indices: optional precomputed ``[NT, 2]`` table for ``BT``, trusted.

    All float inputs may be fp32/fp16/bf16 independently (computed in fp32; the products use the
    tensor cores with 16-bit ``k`` (for ``w``) / ``v`` (for ``u``), IEEE fp32 otherwise).

    Returns:
        ``(w [B, T, HV, K] in k.dtype, u [B, T, HV, V] in v.dtype)``; tail rows are 0.

    Raises:
        ValueError: bad ranks/shapes, ``K > 256``, ``BT`` not 16/32/64, both gates, bad
            ``cu_seqlens``/``chunk_indices``, tensors on different devices.
        TypeError: non-float inputs (float64 is reference-only).

    Source: Yang et al., "Gated Delta Networks" (ICLR 2025); WY/UT form of the delta rule chunk.
    """
    cu_host = check_fwd_args(k, v, beta, A, g, gk, cu_seqlens)
    if not use_triton(k.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.recompute_w_u_fwd_ref(k, v, beta, A, g, gk, cu_seqlens)
    return forward(k, v, beta, A, g, gk, cu_host, cu_seqlens, chunk_indices)


def forward(k, v, beta, A, g, gk, cu_host, cu_seqlens, chunk_indices=None, rk=None):
    """Triton launch of ``recompute_w_u_fwd`` (arguments already validated); ``rk``: see ``kkt.forward``."""
    from .triton_wy import wy_fwd_kernel

    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BT = A.shape[-1]
    kx, vx, bx, ax = (tu.kernel_input(t) for t in (k, v, beta, A))
    gx = tu.kernel_input(g if gk is None else gk)
    w = torch.empty(B, T, HV, K, dtype=tu.kernel_dtype(k.dtype), device=k.device)
    u = torch.empty(B, T, HV, V, dtype=tu.kernel_dtype(v.dtype), device=k.device)
    _zero_tail(w, cu_host)
    _zero_tail(u, cu_host)
    NT, cu, idx = chunk_table(FWD, cu_host, cu_seqlens, B, T, BT, chunk_indices, k.device)
    if NT and B and HV and (K or V):
        BK, BV, nw, ns = fwd_config(BT, K, V, kx.dtype)
        sg = (0, 0, 0, 0) if gx is None else (tuple(gx.stride()) + ((0,) if gx.dim() == 3 else ()))
        r_ptr, *sr = row_factor_args(rk, kx)
        wy_fwd_kernel[(NT * B * HV,)](
            kx, vx, bx, ax, gx if gx is not None else kx, w, u, cu if cu is not None else kx,
            idx if idx is not None else kx, r_ptr, T, B * HV, HV, HV // H,
            *kx.stride(), *vx.stride(), *bx.stride(), *ax.stride(), *sg, *w.stride(), *u.stride(), *sr,
            K=K, V=V, BT=BT, BK=BK, BV=BV, GATE=0 if gx is None else (1 if gk is None else 2),
            IS_VARLEN=idx is not None, HAS_RK=rk is not None, num_warps=nw, num_stages=ns)
    return tu.finish(w, k.dtype), tu.finish(u, v.dtype)


# ------------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------------

def prepare_wy_repr_bwd(k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], beta: torch.Tensor,
                        A: torch.Tensor, dw: torch.Tensor, du: torch.Tensor,
                        cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                        chunk_indices: Optional[torch.Tensor] = None):
    """Backward of ``recompute_w_u_fwd`` through ``k, v, β, G`` (SPEC 1.10.4; step 4 of the GDN
    backward pipeline). Forward-only stage function. Positional order of the MindSpeed precursor
    ``(k, v, g, beta, A, dw, du)`` (fla orders it differently): prefer keywords.

    Per chunk with ``T = A`` (the supplied inverse), ``M`` the strictly-lower matrix of 1.10.2
    recomputed from ``k, β, G``, ``b_v = β⊙v``, ``b_k = β⊙e^{G}⊙k``: ``dT = du·b_vᵀ + dw·b_kᵀ``,
    ``dM = −Tᵀ·dT·Tᵀ`` on strictly-lower valid entries;
    ``dv_i = β_i (Tᵀdu)_i``;
    ``dβ_i = v_i·(Tᵀdu)_i + e^{G_i} k_i·(Tᵀdw)_i + Σ_{j<i} dM_ij (k_i·k_j) e^{G_i−G_j}``;
    ``dk_i = β_i e^{G_i} (Tᵀdw)_i + Σ_{j<i} dM_ij β_i e^{G_i−G_j} k_j + Σ_{l>i} dM_li β_l e^{G_l−G_i} k_l``;
    ``dG_i = β_i e^{G_i} k_i·(Tᵀdw)_i + Σ_{j<i} dM_ij M_ij − Σ_{l>i} dM_li M_li``.

    Args:
        k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g: ``[B, T, HV]`` chunk-local cumsum ``G`` or None
            (no decay, same as zeros); beta: ``[B, T, HV]``; A: ``Ainv [B, T, HV, BT]``;
            dw: ``[B, T, HV, K]``; du: ``[B, T, HV, V]``. Any mix of fp32/fp16/bf16.
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``).
        chunk_size: must equal ``A.shape[-1]`` (``ValueError`` otherwise).
        chunk_indices: optional precomputed ``[NT, 2]`` table, trusted.

    Returns:
        ``(dk [B, T, H, K] fp32 (summed over the value heads sharing a key head), dv [B, T, HV, V] in
        v.dtype, dbeta [B, T, HV] fp32, dg [B, T, HV] fp32 w.r.t. G (None when g is None))``; tail
        rows are 0. Deterministic (the key-head sum is a separate torch reduction).

    Raises:
        ValueError: bad shapes, ``chunk_size != A.shape[-1]``, bad ``cu_seqlens``, mixed devices.
        TypeError: non-float inputs (float64 is reference-only).
    """
    cu_host = check_bwd_args(k, v, g, beta, A, dw, du, cu_seqlens, chunk_size)
    if not use_triton(k.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.prepare_wy_repr_bwd_ref(k, v, g, beta, A, dw, du, cu_seqlens)
    return backward(k, v, g, beta, A, dw, du, cu_host, cu_seqlens, chunk_indices)


def backward(k, v, g, beta, A, dw, du, cu_host, cu_seqlens, chunk_indices=None, dk_acc=None, dg_acc=None,
             fold: bool = True, dg_cumsum: bool = False):
    """Triton launch of ``prepare_wy_repr_bwd`` (arguments already validated). ``dk_acc [B, T, H, K]`` and
    ``dg_acc [B, T, HV]`` (fp32, contiguous last dim; dg_acc only with g, and given whenever dk_acc is): the
    GDN pipeline's other parts of ``dk``/``dG``, added inside the kernel (the returned dk/dg include them).
    ``fold=False``: ``dk`` per value head, ``[B, T, HV, K]`` contiguous (its consumer sums the heads).
    ``dg_cumsum``: the returned dg is the reverse cumsum inside each chunk of the total ``dG`` (what the
    pipeline's reverse ``chunk_local_cumsum`` would make of it), formed in the kernel."""
    from .triton_wy import wy_bwd_kernel

    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BT = A.shape[-1]
    kx, vx, gx, bx, ax, dwx, dux = (tu.kernel_input(t) for t in (k, v, g, beta, A, dw, du))
    dk_v = torch.empty(B, T, HV, K, dtype=torch.float32, device=k.device)  # per value head
    dv = torch.empty(B, T, HV, V, dtype=tu.kernel_dtype(v.dtype), device=k.device)
    dbeta = torch.empty(B, T, HV, dtype=torch.float32, device=k.device)
    dg = torch.empty(B, T, HV, dtype=torch.float32, device=k.device) if g is not None else None
    for t in (dk_v, dv, dbeta, dg):
        if t is not None:
            _zero_tail(t, cu_host)
    NT, cu, idx = chunk_table(BWD, cu_host, cu_seqlens, B, T, BT, chunk_indices, k.device)
    if NT and B and HV:
        BK, BV, nw, ns = bwd_config(BT, K, V, kx.dtype)
        wy_bwd_kernel[(NT * B * HV,)](
            kx, vx, gx if gx is not None else kx, bx, ax, dwx, dux, dk_v, dv, dbeta, dg if dg is not None else dbeta,
            cu if cu is not None else kx, idx if idx is not None else kx, T, B * HV, HV, HV // H,
            *kx.stride(), *vx.stride(), *(gx.stride() if gx is not None else (0, 0, 0)), *bx.stride(),
            *ax.stride(), *dwx.stride(), *dux.stride(), *dk_v.stride(), *dv.stride(), *dbeta.stride(),
            K=K, V=V, BT=BT, BK=BK, BV=BV, HAS_G=gx is not None, IS_VARLEN=idx is not None,
            dkin_ptr=dk_acc if dk_acc is not None else kx, dgin_ptr=dg_acc if dg_acc is not None else kx,
            **dict(zip(("s_ib", "s_it", "s_ih"), dk_acc.stride()[:3] if dk_acc is not None else (0, 0, 0))),
            **dict(zip(("s_jb", "s_jt", "s_jh"), dg_acc.stride() if dg_acc is not None else (0, 0, 0))),
            HAS_ACC=dk_acc is not None, DG_CUMSUM=dg_cumsum, num_warps=nw, num_stages=ns)
    elif dk_acc is not None:  # no chunk to run: the other parts are the gradient
        dk_v[:, :, ::HV // H] = dk_acc
        if dg is not None:
            dg.copy_(dg_acc)
    dk = fold_value_heads(dk_v, H) if fold else dk_v
    return dk, tu.finish(dv, v.dtype), dbeta, dg
