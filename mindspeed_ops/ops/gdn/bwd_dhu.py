"""``chunk_gated_delta_rule_bwd_dhu`` (SPEC 1.10.6): checks and launch of the reverse state-gradient scan."""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_same_device, check_tensor, reject_float64
from ..common import unit_last_stride
from . import reference_bwd as _ref
from .bwd_dv import check_qk_do
from .common import chunk_table, scan_block_k, scan_stages_fit, sequence_chunks, use_triton

OP = "chunk_gated_delta_rule_bwd_dhu"


def check_args(q, k, w, do, dv, g, gk, h0, dht, scale, chunk_size, cu_seqlens) -> Optional[list]:
    """Validate the arguments; returns the host copy of ``cu_seqlens`` (or None)."""
    reject_float64(OP, q=q, k=k, w=w, do=do, dv=dv, g=g, gk=gk, h0=h0, dht=dht)
    cu_host = check_qk_do(OP, q, k, do, g, scale, chunk_size, cu_seqlens)
    B, T, H, K = q.shape
    HV, V = do.shape[2], do.shape[3]
    check_tensor(OP, "w", w, shape=(B, T, HV, K), shape_desc="[B, T, HV, K]")
    check_tensor(OP, "dv", dv, shape=(B, T, HV, V), shape_desc="[B, T, HV, V]")
    if g is not None and gk is not None:
        raise ValueError(f"{OP}: pass either g (scalar gates) or gk (per-channel gates), not both")
    if gk is not None:
        check_tensor(OP, "gk", gk, shape=(B, T, HV, K), shape_desc="[B, T, HV, K]")
    N = B if cu_host is None else len(cu_host) - 1
    if h0 is not None:
        check_tensor(OP, "h0", h0, shape=(N, HV, K, V), shape_desc="[N, HV, K, V]")
    if dht is not None:
        check_tensor(OP, "dht", dht, shape=(N, HV, K, V), shape_desc="[N, HV, K, V]")
    check_same_device(OP, q=q, k=k, w=w, do=do, dv=dv, g=g, gk=gk, h0=h0, dht=dht)
    return cu_host


def chunk_gated_delta_rule_bwd_dhu(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, do: torch.Tensor,
                                   dv: torch.Tensor, g: Optional[torch.Tensor] = None,
                                   gk: Optional[torch.Tensor] = None, h0: Optional[torch.Tensor] = None,
                                   dht: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                                   cu_seqlens: Optional[torch.Tensor] = None, chunk_size: int = 64,
                                   chunk_indices: Optional[torch.Tensor] = None):
    """Reverse scan of the state gradient of the chunked gated delta rule (SPEC 1.10.6, step 2 of the
    backward pipeline of 1.10.0). Forward-only stage function (no autograd).

    Per sequence and value head, ``dS ← dht`` (fp32) or 0; for each chunk c from last to first:
    ``dh[c] = dS``; ``dv2_i = dv_i + dSᵀ (e^{Γ_c − G_i} k_i)``;
    ``dS ← e^{Γ_c} dS + scale·Σ_i (e^{G_i} q_i) do_iᵀ − Σ_i w_i dv2_iᵀ`` (with ``gk``: ``diag(e^{Γ_c})``,
    ``e^{Γ_c − G_i} ⊙ k_i``, ``e^{G_i} ⊙ q_i``); after chunk 0, ``dh0 = dS``. ``dh[c]`` is the gradient
    w.r.t. the state **leaving** chunk c; ``Γ_c`` is ``G`` at the chunk's last valid position.

    Args:
        q, k: ``[B, T, H, K]`` (raw: decays are applied inside), ``K <= 256``; fp32/fp16/bf16, any strides.
        w: ``[B, T, HV, K]`` from ``recompute_w_u_fwd``; ``HV % H == 0`` (GVA: value head i reads q/k
            head ``i // (HV // H)``).
        do: ``[B, T, HV, V]`` gradient of ``o``; dv: ``[B, T, HV, V]`` = ``chunk_bwd_dv_local`` output.
        g: ``[B, T, HV]`` chunk-local cumsum ``G`` (natural log), or None (no decay).
        gk: ``[B, T, HV, K]`` per-channel ``G``, or None. Not both.
        h0: initial state ``[N, HV, K, V]`` or None: only its presence matters (``dh0`` is returned
            iff it is given).
        dht: ``[N, HV, K, V]`` gradient of the final state (any float, used in fp32), or None (= 0).
        scale: None means ``K ** -0.5``.
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``); tail tokens of ``dv2`` are 0.
        chunk_size: ``BT ∈ {16, 32, 64}``.
        chunk_indices: optional precomputed ``[NT, 2]`` table (shape-checked; this kernel walks each
            sequence's chunks itself).

    Returns:
        ``(dh [B, NT, HV, K, V] in q.dtype, dh0 [N, HV, K, V] fp32 or None, dv2 [B, T, HV, V] in
        dv.dtype)``; in varlen mode ``dh[0, c]`` is chunk c of the flattened chunk list. The scan
        carries ``dS`` in fp32; with 16-bit inputs it is staged in k's dtype for the ``k·dS`` product.

    Raises:
        ValueError: ranks/shapes, ``HV % H != 0``, ``K > 256``, both ``g`` and ``gk``, ``chunk_size``,
            ``scale``, ``cu_seqlens``, ``h0``/``dht`` shapes, ``chunk_indices`` shape, devices.
        TypeError: non-float tensors (float64 is reference-only).

    Source: Yang et al., Gated Delta Networks (ICLR 2025); WY/UT chunking from Yang et al.,
    Parallelizing Linear Transformers with the Delta Rule over Sequence Length (NeurIPS 2024).
    """
    cu_host = check_args(q, k, w, do, dv, g, gk, h0, dht, scale, chunk_size, cu_seqlens)
    if chunk_indices is not None:
        chunk_table(OP, cu_host, cu_seqlens, q.shape[0], q.shape[1], chunk_size, chunk_indices)
    if not use_triton(q.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.chunk_gated_delta_rule_bwd_dhu_ref(q, k, w, do, dv, g, gk, h0, dht, scale, cu_seqlens, chunk_size)
    return forward(q, k, w, do, dv, g, gk, h0, dht, scale, chunk_size, cu_host)


def _configs():
    import triton

    return [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)
            for bv, nw, ns in ((32, 4, 2), (16, 4, 2), (64, 8, 2), (16, 4, 3), (32, 4, 3), (32, 4, 1))]  # last: fallback


def _prune(configs, named_args, min_bv: int = 0, **kwargs):
    """Keep configs whose fp32 gradient state (``NK·BK x BV``) is at most 64 registers a thread and whose
    V tile is not wider than V needs. Software pipelining (``num_stages >= 2``) stages every tile load of
    a chunk in shared memory, which fits sm_80/sm_90 only for rows of at most 256 bytes (16-bit
    ``K <= 128``, fp32 ``K <= 64``); wider rows run unpipelined, and only they: the pipelined and unpipelined
    builds round dv/dh differently (H200, fp32 K = V = 64: tests/unit_tests/core/test_autotune_bits.py), so a
    shape keeps one of the two (SPEC 0.6: a timing-based choice must not change the bits). 3 stages only where
    their buffers fit (``common.scan_stages_fit``; 16-bit q, k, w): they hide each chunk step's loads (B1 T8192
    H16 bf16 K = V = 128 on the H200: 181 µs at BV 16 vs 257 at 2 stages; T32768 H32: 811 µs at BV 32 vs 1133;
    the same bits, benchmarks/tune_gdn_bwd.py)."""
    args = {**named_args, **kwargs}
    state = args["BK"] * args["NK"]
    row_bytes = state * args["q_ptr"].element_size()
    vmax = max(16, tu.next_power_of_2(args["V"]))
    pipelined = row_bytes <= 256
    gk_tile = args["USE_GK"] and not args.get("QKG", False)
    sizes = [args[n].element_size() for n in ("q_ptr", "k_ptr", "w_ptr")]
    k_row = sum(sizes) + (4 if gk_tile else 0)
    v_row = args["do_ptr"].element_size() + args["dv_ptr"].element_size()
    kept = [c for c in configs if state * c.kwargs["BV"] <= 64 * 32 * c.num_warps and c.kwargs["BV"] <= vmax
            and (c.num_stages > 1) == pipelined
            and scan_stages_fit(c, args["BT"], state, k_row, v_row, max(sizes) <= 2)
            and c.kwargs["BV"] >= min(min_bv, vmax)]
    return kept or configs[-1:]


_KERNELS: dict = {}


def _kernel(min_bv: int = 0):
    """The dhu kernel under a small autotuner over ``BV`` (16/32/64: few sequences x heads want narrow
    tiles for more programs) and warps, pipelined or not by the row width (``_prune``); the key leaves out the
    number of sequences (varlen batches change it every step). ``min_bv``: as ``fwd_h._kernel``."""
    tuner = _KERNELS.get(min_bv)
    if tuner is None:
        from .triton_bwd import chunk_bwd_dhu_kernel

        tuner = _KERNELS[min_bv] = tu.autotune(
            _configs(), key=["HV", "GQ", "K", "BK", "V", "BT", "USE_G", "USE_GK", "HAS_DHT", "STORE_DH0", "IS_VARLEN",
                             "QKG"],
            prune_configs_by={"early_config_prune": functools.partial(_prune, min_bv=min_bv)})(chunk_bwd_dhu_kernel)
    return tuner


def forward(q, k, w, do, dv, g, gk, h0, dht, scale, chunk_size, cu_host, qk_gated: bool = False, min_bv: int = 0):
    """Triton launch (arguments already validated). ``qk_gated`` (with ``gk``): ``q``, ``k`` are ``[B, T, HV, K]``
    and already hold ``q ⊙ e^{G}``, ``k ⊙ e^{Γ − G}`` (KDA's qg, kg), so the scan reads only each chunk's last
    gate row. ``min_bv``: the narrowest V tile the autotuner may pick (see :func:`_kernel`; 0: any)."""
    assert not qk_gated or (gk is not None and q.shape[2] == k.shape[2] == do.shape[2])
    B, T, H, K = q.shape
    HV, V = do.shape[2], do.shape[3]
    BT = chunk_size
    dev = q.device
    N = B if cu_host is None else len(cu_host) - 1
    NT, cu, off = sequence_chunks(cu_host, T, BT, dev)
    qq, kk, ww, oo, vv = (unit_last_stride(tu.kernel_input(t)) for t in (q, k, w, do, dv))
    gg, gkk, tt = (unit_last_stride(tu.kernel_input(t)) for t in (g, gk, dht))
    dh = torch.empty(B, NT, HV, K, V, dtype=tu.kernel_dtype(q.dtype), device=dev)
    dh0 = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev) if h0 is not None else None
    dv2 = torch.empty(B, T, HV, V, dtype=tu.kernel_dtype(dv.dtype), device=dev)
    if cu_host is not None and cu_host[-1] < T:
        dv2[:, cu_host[-1]:].zero_()  # tail tokens take part in nothing
    if N and HV and V:
        BK, NK = scan_block_k(K, qq.dtype, one_block=gk is None)  # per-channel gates: 64-row blocks (faster)
        NK = max(1, NK)  # K = 0: one empty block (dS stays 0)
        dummy = qq
        z3 = (0, 0, 0)
        grid = lambda meta: (N * HV * tu.cdiv(V, meta["BV"]),)  # noqa: E731
        _kernel(min_bv)[grid](
            qq, kk, ww, oo, vv, dummy if gg is None else gg, dummy if gkk is None else gkk,
            dummy if tt is None else tt, dh, dummy if dh0 is None else dh0, dv2,
            dummy if cu is None else cu, dummy if off is None else off,
            T, HV, HV // H, K, V, float(K ** -0.5 if scale is None else scale),
            *qq.stride()[:3], *kk.stride()[:3], *ww.stride()[:3], *oo.stride()[:3], *vv.stride()[:3],
            *(gg.stride() if gg is not None else z3), *(gkk.stride()[:3] if gkk is not None else z3),
            *(tt.stride()[:3] if tt is not None else z3), *dh.stride()[:4],
            *(dh0.stride()[:3] if dh0 is not None else z3), *dv2.stride()[:3],
            BT=BT, BK=BK, NK=NK, USE_G=g is not None, USE_GK=gk is not None, HAS_DHT=tt is not None,
            STORE_DH0=dh0 is not None, IS_VARLEN=cu is not None, QKG=qk_gated)
    return tu.finish(dh, q.dtype), dh0, tu.finish(dv2, dv.dtype)
