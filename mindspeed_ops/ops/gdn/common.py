"""Host helpers shared by the GDN stage launchers: kernel-or-reference choice, chunk tables."""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ... import backends
from ... import triton_utils as tu
from ...validation import check_tensor, shape_str
from ...varlen import build_chunk_indices


def use_triton(device: torch.device) -> bool:
    """Stage kernels are plain functions (not registered ops): Triton where it can run (CUDA, or
    CPU under ``TRITON_INTERPRET=1``), the pure-PyTorch reference otherwise or when the reference
    is requested for every op (``use_backend('reference')`` or ``MINDSPEED_OPS_BACKEND=reference``)."""
    if backends._requested("")[0] == "reference":  # a global request ("" matches no op-specific one)
        return False
    return backends.backend_status("triton", device)[0]


def check_value_heads(op: str, HV: int, H: int, hv_from: str, h_from: str) -> None:
    """GVA head counts (SPEC 0.3): ``HV`` value heads a positive multiple of ``H`` key heads (value head ``i`` reads
    key head ``i // (HV // H)``). ``hv_from`` / ``h_from`` name where each count was read (``"v.shape[2]"``).
    Raises ``ValueError`` naming both."""
    if H == 0 or HV == 0 or HV % H:
        raise ValueError(f"{op}: the value heads HV = {HV} ({hv_from}) must be a positive multiple of the key heads "
                         f"H = {H} ({h_from})")


def fold_value_heads(x: torch.Tensor, H: int) -> torch.Tensor:
    """``[B, T, HV, K]`` -> ``[B, T, H, K]``: the sum over the ``HV // H`` value heads sharing each q/k head
    (GVA; consecutive heads), deterministic. Two heads per key head (Qwen3-Next's layout) take one
    ``torch.add`` of the two strided halves: 64 vs 78 µs for torch's reduction over that middle dim at
    [1, 8192, 32, 128] fp32 on the H200 (docs/benchmarks/s20, call 3), and the same bits (one rounding). More
    heads keep torch's reduction (one pass; a chain of adds would re-read the output per head, not measured).
    ``x`` itself when ``HV == H``; needs a ``[B, T, HV, K]`` layout that ``view`` can split (the launchers'
    own buffers)."""
    B, T, HV, K = x.shape
    if HV == H:
        return x
    parts = x.view(B, T, H, HV // H, K)
    if HV // H == 2:
        return torch.add(parts[:, :, :, 0], parts[:, :, :, 1])
    return parts.sum(3)


def chunk_table(op: str, cu_host: Optional[list], cu_seqlens: Optional[torch.Tensor], B: int, T: int, BT: int,
                chunk_indices: Optional[torch.Tensor], device: Optional[torch.device] = None
                ) -> tuple[int, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(NT, cu_seqlens for the kernel, chunk_indices for the kernel)``: fixed length ``NT = ceil(T/BT)``
    per batch row; varlen ``NT = Σ ceil(L_n/BT)`` and the ``[NT, 2]`` table (built if not supplied;
    a supplied one is trusted, SPEC 0.3, after a shape check), both on ``device`` when given."""
    if cu_host is None:
        return (T + BT - 1) // BT, None, None
    nt = sum((b - a + BT - 1) // BT for a, b in zip(cu_host, cu_host[1:]))
    if chunk_indices is None:  # from the host copy (same table as api.triton.utils.prepare_chunk_indices)
        chunk_indices = build_chunk_indices(torch.tensor(cu_host, dtype=torch.int64), BT)
    else:
        check_tensor(op, "chunk_indices", chunk_indices, dtypes=(torch.int32, torch.int64), ndim=2)
        if tuple(chunk_indices.shape) != (nt, 2):
            raise ValueError(f"{op}: chunk_indices must have shape [NT, 2] = [{nt}, 2] for chunk_size {BT}, "
                             f"got {shape_str(chunk_indices.shape)}")
    # flat arrays of one dtype each (int64 offsets, int32 table, as device_tables makes them): Triton's
    # autotuner keys include argument dtypes, so a caller's int32 offsets or int64 table would get a tuning
    # of their own, possibly another config and another summation order: not bitwise the same (SPEC 0.6)
    cu, idx = cu_seqlens.to(torch.int64).contiguous(), chunk_indices.to(torch.int32).contiguous()
    if device is not None:  # for a launch: on the kernel's device, queued without draining the stream
        cu, idx = tu.host_to_device(cu, device), tu.host_to_device(idx, device)
    return nt, cu, idx


#: distinct (offsets, chunk size, device) whose device tables are kept: every linear-attention layer of a
#: training step sees the same packing, so its tables are built and copied once, not per layer and call
TABLE_CACHE_SIZE = 64


def _cached(build):
    """``build(cu, BT, device)`` kept per (offsets, chunk size, device, stream): a table is used on the
    stream its copy was queued on. Never while a CUDA graph is being captured: a copy captured there runs
    only at replay (a cached table would hold garbage for eager calls), and the graph must own what it reads
    (an evicted table's memory would be reused under it)."""
    cached = functools.lru_cache(maxsize=TABLE_CACHE_SIZE)(lambda cu, BT, device, stream: build(cu, BT, device))

    def get(cu_host: list, BT: int, device) -> tuple:
        device = torch.device(device)
        if device.type != "cuda":
            return cached(tuple(cu_host), BT, device, 0)
        if torch.cuda.is_current_stream_capturing():
            return build(tuple(cu_host), BT, device)
        return cached(tuple(cu_host), BT, device, torch.cuda.current_stream(device).stream_id)

    get.cache_clear = cached.cache_clear
    return get


@_cached
def _device_tables(cu: tuple, BT: int, device: torch.device):
    cu_cpu = torch.tensor(cu, dtype=torch.int64)
    return tu.host_to_device(cu_cpu, device), tu.host_to_device(build_chunk_indices(cu_cpu, BT), device)


def device_tables(cu_host: Optional[list], BT: int, device: torch.device):
    """``(cu_seqlens, chunk_indices)`` on ``device`` from the validated host offsets (``(None, None)``
    without varlen); copies queued without draining the stream, and kept (keyed by the offsets' values,
    see ``_cached``) for the next call with the same packing. Read-only: the kernels never write them."""
    if cu_host is None:
        return None, None
    return _device_tables(cu_host, BT, device)


@_cached
def _sequence_tables(cu: tuple, BT: int, device: torch.device):
    offs = [0]
    for a, b in zip(cu, cu[1:]):
        offs.append(offs[-1] + (b - a + BT - 1) // BT)
    return (offs[-1], tu.host_to_device(torch.tensor(cu, dtype=torch.int64), device),
            tu.host_to_device(torch.tensor(offs, dtype=torch.int64), device))


def chunk_count(cu_host: Optional[list], T: int, BT: int) -> int:
    """Chunks of ``BT`` tokens per batch row (fixed length, ``ceil(T/BT)``) or in all (varlen, ``Σ ceil(L_n/BT)``),
    from the host offsets alone (no device tables)."""
    if cu_host is None:
        return (T + BT - 1) // BT
    return sum((b - a + BT - 1) // BT for a, b in zip(cu_host, cu_host[1:]))


def sequence_chunks(cu_host: Optional[list], T: int, BT: int, device: torch.device
                    ) -> tuple[int, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """For the per-sequence state scans: ``(NT, cu_seqlens, chunk offsets)``. Fixed length: ``NT =
    ceil(T/BT)`` per batch row, no tables. Varlen: ``NT = Σ ceil(L_n/BT)``, the offsets and the index
    of each sequence's first chunk in the flattened chunk list (``[N+1]`` int64), on ``device`` (queued
    without draining the stream and kept for the next call with the same packing, like ``device_tables``)."""
    if cu_host is None:
        return chunk_count(None, T, BT), None, None
    return _sequence_tables(cu_host, BT, device)


SCAN_BK_MAX = 128  # widest K block of the state scans (64: the layout before the twenty-eighth session; A/B switch)


def scan_block_k(K: int, dtype: torch.dtype, one_block: bool = True) -> tuple[int, int]:
    """``(BK, NK)`` of the state scans (``fwd_h``, ``bwd_dhu``): the fp32 state ``[K, BV]`` held as ``NK``
    register blocks of ``BK`` rows (>= 16 for ``tl.dot``). fp16/bf16 with ``64 < K <= 128`` and ``one_block``: one
    block, so each chunk step stages the state in shared memory once and issues each product as one tensor-core
    group (two blocks serialize on one staging buffer); otherwise blocks of at most 64 rows (fp32 tiles are twice
    the bytes), up to four (``K <= 256``). The reverse scan with per-channel gates asks for 64-row blocks
    (``one_block=False``): KDA's dhu took 265 µs at BV 32 / 3 stages with two blocks vs 352 with one (B1 T8192 H16
    bf16 K = V = 128, H200, ``benchmarks/tune_kda.py --only dhu``), where GDN's scalar-gate scans gain from one."""
    b = max(16, tu.next_power_of_2(K))
    one = one_block and b == 128 and SCAN_BK_MAX >= 128 and dtype in (torch.float16, torch.bfloat16)
    bk = 128 if one else min(64, b)
    return bk, tu.cdiv(K, bk)


#: bound on a scan's estimated pipeline buffers (``num_stages`` x one chunk's tiles) for 3+ stages: the H200
#: compiles measured 5-15 KB above the estimate (sm_90: 177 KB for dhu at BV 32 / 3 stages, 157 KB for fwd_h at BV 32 /
#: 4 stages, bf16 K = 128), sm_80 less (128 and 116 KB); 4 stages of dhu at BV 32 (estimate 229 KB) overflow sm_90
SCAN_STAGE_BYTES = 200 * 1024


def scan_stages_fit(config, BT: int, K: int, k_row_bytes: int, v_row_bytes: int, half: bool,
                    free_stages: int = 2) -> bool:
    """Whether ``config`` may run: up to ``free_stages`` stages always (the configurations a scan had before the
    twenty-eighth session keep their own rules); more only with 16-bit inputs (``half``; fp32 tiles are twice the
    bytes and were never timed deeper) whose chunk tiles fit :data:`SCAN_STAGE_BYTES`: per stage ``BT`` rows of the
    K-wide tiles (``k_row_bytes`` per K column summed over them) and of the ``BV``-wide ones (``v_row_bytes`` per
    column)."""
    per_stage = BT * (K * k_row_bytes + config.kwargs["BV"] * v_row_bytes)
    return config.num_stages <= free_stages or (half and config.num_stages * per_stage <= SCAN_STAGE_BYTES)


def shared_v_tile(device: torch.device, programs_per_tile: int, V: int) -> int:
    """The V tile (16 or 32) two state scans side by side on a device use (``ops/side_stream.py``): the narrowest at
    which each scan's ``programs_per_tile · ceil(V / BV)`` programs fit in half the SMs, 32 when neither does. The
    scans' own autotuners prefer 16-wide tiles where a scan runs alone (more programs, deeper pipelines), which
    side by side would queue one scan's programs behind the other's (each takes an SM's shared memory)."""
    half = tu.num_sms(device) // 2
    return 16 if programs_per_tile * tu.cdiv(V, 16) <= half else 32


def prune_v_tiles(configs, named_args, **kwargs):
    """Autotune prune shared by the chunk launchers: drop V tiles (``BV``) wider than V needs (V rounded
    up to a power of two, at least 32); keep at least one config."""
    vmax = max(32, tu.next_power_of_2(named_args["V"]))
    kept = [c for c in configs if c.kwargs["BV"] <= vmax]
    return kept or configs[:1]


def row_factor_args(r: Optional[torch.Tensor], dummy: torch.Tensor) -> tuple:
    """``(pointer, s_b, s_t, s_h)`` of an optional per-token factor ``[B, T, H]`` (the fp32 l2norm rstd of
    q or k that the forward stages fold into their products); the dummy and zero strides without one."""
    if r is None:
        return dummy, 0, 0, 0
    if r.dtype != torch.float32 or r.dim() != 3:
        raise ValueError(f"row factor: expected a [B, T, H] float32 tensor, got {shape_str(r.shape)} {r.dtype}")
    return (r, *r.stride())


def row_factor_pair_args(op: str, rq: Optional[torch.Tensor], rk: Optional[torch.Tensor],
                         dummy: torch.Tensor) -> tuple:
    """``(rq pointer, rk pointer, s_b, s_t, s_h)`` of the q and k l2norm rstd (both or neither, one layout:
    the kernels index both with one set of strides), as :func:`row_factor_args`."""
    if (rq is None) != (rk is None) or (rq is not None and rq.stride() != rk.stride()):
        raise ValueError(f"{op}: rq and rk must both be given, with one layout")
    rq_ptr, *strides = row_factor_args(rq, dummy)
    return (rq_ptr, row_factor_args(rk, dummy)[0], *strides)


def zero_tail_rows(cu_host: Optional[list], *grads: torch.Tensor) -> None:
    """Gradients of the tail tokens (at or after ``cu_seqlens[-1]``) set to 0 in place: the l2norm backward
    runs over every row, and whatever q/k hold there (NaN included, SPEC 0.3) must not leak into them."""
    if cu_host is not None and cu_host[-1] < grads[0].shape[1]:
        for t in grads:
            t[:, cu_host[-1]:] = 0
