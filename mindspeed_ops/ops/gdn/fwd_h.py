"""``chunk_gated_delta_rule_fwd_h`` (SPEC 1.10.5): checks and launch of the inter-chunk state scan."""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import (check_cu_seqlens, check_same_device, check_tensor, reject_float64, shape_str)
from ..common import unit_last_stride
from . import reference_fwd as _ref
from .common import (check_value_heads, chunk_count, chunk_table, row_factor_args, scan_block_k, scan_stages_fit,
                     sequence_chunks, use_triton)

OP = "chunk_gated_delta_rule_fwd_h"
MAX_K = 256


def check_args(k, w, u, g, gk, initial_state, chunk_size, cu_seqlens) -> Optional[list]:
    """Validate the arguments; returns the host copy of ``cu_seqlens`` (or None)."""
    reject_float64(OP, k=k, w=w, u=u, g=g, gk=gk, initial_state=initial_state)
    check_tensor(OP, "k", k, ndim=4)
    B, T, H, K = k.shape
    check_tensor(OP, "w", w, ndim=4)
    HV = w.shape[2]
    check_tensor(OP, "w", w, shape=(B, T, HV, K), shape_desc="[B, T, HV, K]")
    check_value_heads(OP, HV, H, "w.shape[2]", "k.shape[2]")
    check_tensor(OP, "u", u, ndim=4)
    check_tensor(OP, "u", u, shape=(B, T, HV, None), shape_desc="[B, T, HV, V]")
    if K > MAX_K:
        raise ValueError(f"{OP}: the head dim K must be <= {MAX_K}, got k of shape {shape_str(k.shape)}")
    if g is not None and gk is not None:
        raise ValueError(f"{OP}: pass either g (scalar gates) or gk (per-channel gates), not both")
    if g is not None:
        check_tensor(OP, "g", g, shape=(B, T, HV), shape_desc="[B, T, HV]")
    if gk is not None:
        check_tensor(OP, "gk", gk, shape=(B, T, HV, K), shape_desc="[B, T, HV, K]")
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"{OP}: chunk_size must be 16, 32 or 64, got {chunk_size!r}")
    check_same_device(OP, k=k, w=w, u=u, g=g, gk=gk, initial_state=initial_state)
    cu_host = check_cu_seqlens(OP, cu_seqlens, batch=B, total=T, like=("k", k))
    N = B if cu_host is None else len(cu_host) - 1
    if initial_state is not None:
        check_tensor(OP, "initial_state", initial_state, shape=(N, HV, K, u.shape[-1]), shape_desc="[N, HV, K, V]")
    return cu_host


def chunk_gated_delta_rule_fwd_h(k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, g: Optional[torch.Tensor] = None,
                                 gk: Optional[torch.Tensor] = None, initial_state: Optional[torch.Tensor] = None,
                                 output_final_state: bool = False, chunk_size: int = 64, save_new_value: bool = True,
                                 cu_seqlens: Optional[torch.Tensor] = None,
                                 chunk_indices: Optional[torch.Tensor] = None):
    """Inter-chunk state scan of the chunked gated delta rule (SPEC 1.10.5, step 5 of the 1.10.0 table).
    Forward-only stage function (outputs never require grad).

    Per sequence, value head and chunk c (``S_0`` = ``initial_state`` or 0, carried in fp32):
    ``h[c] = S_c``; ``v_new_i = u_i − S_cᵀ w_i``;
    ``S_{c+1} = e^{Γ_c} S_c + Σ_i (e^{Γ_c − G_i} k_i) v_new_iᵀ``
    (``gk``: ``diag(e^{Γ_c})`` and ``e^{Γ_c − G_i} ⊙ k_i``; no gate: factors 1), ``Γ_c`` = ``G`` at the
    chunk's last valid position.

    Args:
        k: ``[B, T, H, K]`` raw keys (the decay is applied inside), ``K <= 256``; fp32/fp16/bf16.
        w: ``[B, T, HV, K]``, u: ``[B, T, HV, V]`` from ``recompute_w_u_fwd``; ``HV % H == 0`` (GVA:
            value head i reads key head ``i // (HV // H)``).
        g: ``[B, T, HV]`` chunk-local cumsum ``G`` of scalar log-decays (natural log), or None.
        gk: ``[B, T, HV, K]`` per-channel ``G`` (KDA), or None. Not both.
        initial_state: ``[N, HV, K, V]`` any float (used in fp32), or None (zeros).
        output_final_state: also return ``S`` after each sequence's last chunk.
        chunk_size: ``BT ∈ {16, 32, 64}``.
        save_new_value: return ``v_new`` (else None).
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``); tail tokens are never read
            and their ``v_new`` is 0.
        chunk_indices: optional precomputed ``[NT, 2]`` table (shape-checked, not needed by this kernel).

    Returns:
        ``(h [B, NT, HV, K, V] in k.dtype, v_new [B, T, HV, V] in u.dtype or None,
        final_state [N, HV, K, V] fp32 or None)``; in varlen mode ``h[0, c]`` is chunk c of the
        flattened chunk list.

    Raises:
        ValueError: ranks/shapes, ``HV % H != 0``, ``K > 256``, both ``g`` and ``gk``, ``chunk_size``,
            ``cu_seqlens`` (``B != 1``, malformed), ``initial_state`` shape, devices.
        TypeError: non-float tensors (float64 is reference-only).

    Source: Yang et al., Gated Delta Networks (ICLR 2025); WY/UT chunking from Yang et al.,
    Parallelizing Linear Transformers with the Delta Rule over Sequence Length (NeurIPS 2024).
    """
    cu_host = check_args(k, w, u, g, gk, initial_state, chunk_size, cu_seqlens)
    if chunk_indices is not None:
        chunk_table(OP, cu_host, cu_seqlens, k.shape[0], k.shape[1], chunk_size, chunk_indices)
    if not use_triton(k.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.chunk_gated_delta_rule_fwd_h_ref(k, w, u, g, gk, initial_state, output_final_state, chunk_size,
                                                         save_new_value, cu_seqlens)
    return forward(k, w, u, g, gk, initial_state, output_final_state, chunk_size, save_new_value, cu_host)


def _configs():
    import triton

    return [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)
            for bv, nw, ns in ((32, 4, 2), (64, 8, 2), (16, 4, 2), (32, 4, 3), (16, 4, 4), (32, 4, 4))]


def _prune(configs, named_args, min_bv: int = 0, **kwargs):
    """Keep configs whose fp32 state (``NK·BK x BV``) is at most 64 registers a thread (more spills
    at K = 256), whose V tile is not wider than V needs, and (per-channel gates at K > 128) that stage
    only two chunks of tiles in shared memory (three overflow it at K = 256 or in fp32); 4 stages only where
    their buffers fit (``common.scan_stages_fit``; 16-bit w and k). Deep pipelines hide each chunk step's loads:
    4 stages at BV 16 took 126 µs vs 177 µs at BV 32 / 3 stages (B1 T8192 H16 bf16 K = V = 128, H200,
    benchmarks/tune_gdn_bwd.py); all of them give the same bits there."""
    args = {**named_args, **kwargs}
    state = args["BK"] * args["NK"]
    vmax = max(32, tu.next_power_of_2(args["V"]))
    gk_tile = args["USE_GK"] and not args.get("KG", False)
    k_row = args["w_ptr"].element_size() + args["k_ptr"].element_size() + (4 if gk_tile else 0)
    half = max(args["w_ptr"].element_size(), args["k_ptr"].element_size()) <= 2
    kept = [c for c in configs if state * c.kwargs["BV"] <= 64 * 32 * c.num_warps and c.kwargs["BV"] <= vmax
            and not (args["USE_GK"] and c.num_stages > 2
                     and (state > 128 or args["k_ptr"].element_size() > 2))  # gk tiles at K=256 or fp32: smem
            and scan_stages_fit(c, args["BT"], state, k_row, args["u_ptr"].element_size(), half, free_stages=3)
            and c.kwargs["BV"] >= min(min_bv, vmax)]
    return kept or configs[:1]


_KERNELS: dict = {}


def _kernel(min_bv: int = 0):
    """The fwd_h kernel under a small autotuner over ``BV`` (16/32/64: few sequences x heads want
    narrow V tiles to fill the SMs, many want wide ones) and warps/stages. The key holds what changes
    the best choice except the number of sequences (varlen batches change it every step, and
    re-tuning costs seconds). ``min_bv``: V tiles narrower than this are left out (a scan that shares the
    GPU with another keeps to its half of the SMs, ``common.shared_v_tile``); its own autotuner (Triton's disk
    cache keys the kept configs, so the two never share a choice)."""
    tuner = _KERNELS.get(min_bv)
    if tuner is None:
        from .triton_fwd import chunk_fwd_h_kernel

        tuner = _KERNELS[min_bv] = tu.autotune(
            _configs(), key=["HV", "GQ", "K", "BK", "V", "BT", "USE_G", "USE_GK", "HAS_H0", "STORE_FINAL", "SAVE_VNEW",
                             "IS_VARLEN", "HAS_RK", "KG"],
            prune_configs_by={"early_config_prune": functools.partial(_prune, min_bv=min_bv)})(chunk_fwd_h_kernel)
    return tuner


def kernel_view(t: Optional[torch.Tensor], BT: int) -> Optional[torch.Tensor]:
    """A ``[B, T, ...]`` tensor as the chunk kernels read it: bf16 widened under the interpreter, unit
    stride on the last dim, and a token stride small enough that offsets inside a ``BT``-token tile fit
    in int32 (the kernels add int64 chunk bases to int32 tile offsets); copied only when needed."""
    t = unit_last_stride(tu.kernel_input(t))
    if t is not None and t.dim() > 1 and abs(t.stride(1)) * BT >= 2 ** 31:
        t = t.contiguous()
    return t


def outputs(k, u, chunk_size: int, cu_host, save_new_value: bool = True):
    """``(h [B, NT, HV, K, V], v_new [B, T, HV, V] or None)`` as :func:`forward` makes them (kernel dtypes of k and
    u; tail tokens of ``v_new`` zeroed), for a caller that makes them on its own stream before running the scan on
    another (``ops/side_stream.py``: no cross-stream frees)."""
    B, T, _, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    h = torch.empty(B, chunk_count(cu_host, T, chunk_size), HV, K, V, dtype=tu.kernel_dtype(k.dtype), device=k.device)
    vn = torch.empty(B, T, HV, V, dtype=tu.kernel_dtype(u.dtype), device=k.device) if save_new_value else None
    if vn is not None and cu_host is not None and cu_host[-1] < T:
        vn[:, cu_host[-1]:].zero_()  # tail tokens take part in nothing
    return h, vn


def forward(k, w, u, g, gk, initial_state, output_final_state, chunk_size, save_new_value, cu_host, rk=None,
            k_gated: bool = False, out=None, min_bv: int = 0):
    """Triton launch (arguments already validated); ``rk``: see ``kkt.forward``. ``k_gated`` (with ``gk``, no
    ``rk``): ``k`` is ``[B, T, HV, K]`` and already holds ``k ⊙ e^{Γ − G}`` (KDA's kg), so the scan reads only
    each chunk's last gate row. ``out``: ``(h, v_new)`` from :func:`outputs` (made here when None). ``min_bv``: the
    narrowest V tile the autotuner may pick (see :func:`_kernel`; 0: any)."""
    assert not k_gated or (gk is not None and rk is None and k.shape[2] == u.shape[2])
    B, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    BT = chunk_size
    dev = k.device
    N = B if cu_host is None else len(cu_host) - 1
    NT, cu, off = sequence_chunks(cu_host, T, BT, dev)
    kk, ww, uu, gg, gkk = (kernel_view(t, BT) for t in (k, w, u, g, gk))
    h0 = unit_last_stride(tu.kernel_input(initial_state))
    h, vn = outputs(k, u, BT, cu_host, save_new_value) if out is None else out
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev) if output_final_state else None
    if N and HV and V and K:
        BK, NK = scan_block_k(K, kk.dtype)
        dummy = kk
        z3 = (0, 0, 0)
        r_ptr, *sr = row_factor_args(rk, dummy)
        grid = lambda meta: (N * HV * tu.cdiv(V, meta["BV"]),)  # noqa: E731
        _kernel(min_bv)[grid](
            kk, ww, uu, dummy if gg is None else gg, dummy if gkk is None else gkk, dummy if h0 is None else h0,
            h, dummy if vn is None else vn, dummy if ht is None else ht, dummy if cu is None else cu,
            dummy if off is None else off, r_ptr,
            T, HV, HV // H, K, V,
            *kk.stride()[:3], *ww.stride()[:3], *uu.stride()[:3],
            *(gg.stride() if gg is not None else z3), *(gkk.stride()[:3] if gkk is not None else z3),
            *(h0.stride()[:3] if h0 is not None else z3), *h.stride()[:4],
            *(vn.stride()[:3] if vn is not None else z3), *(ht.stride()[:3] if ht is not None else z3), *sr,
            BT=BT, BK=BK, NK=NK, USE_G=g is not None, USE_GK=gk is not None, HAS_H0=h0 is not None,
            STORE_FINAL=ht is not None, SAVE_VNEW=vn is not None, IS_VARLEN=cu is not None, HAS_RK=rk is not None,
            KG=k_gated)
    else:  # no heads / empty dims: the state passes through
        if ht is not None:
            ht.copy_(initial_state) if initial_state is not None else ht.zero_()
        if vn is not None and K == 0:  # no key dims: w S = 0, so v_new = u (was left unwritten)
            valid = T if cu_host is None else cu_host[-1]
            vn[:, :valid].copy_(u[:, :valid])
    return tu.finish(h, k.dtype), (None if vn is None else tu.finish(vn, u.dtype)), ht
