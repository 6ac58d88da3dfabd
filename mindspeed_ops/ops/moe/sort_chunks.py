"""Host launchers for ``sort_chunks_by_idx`` / ``sort_chunks_by_idx_with_probs`` (SPEC 1.6):
argument checks, the word view that makes the copy bitwise and wide, tiling, grids."""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from ... import triton_utils as tu
from ..common import unit_last_stride
from ...validation import check_tensor, shape_str

OP = "sort_chunks_by_idx"
OP_PROBS = "sort_chunks_by_idx_with_probs"

INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: up to this many splits a program finds its rows' chunks with one vector load and a compare-count;
#: beyond it, with a binary search over ``out_end``
SEARCH_BLOCK_MAX = 1024
#: bytes of one row segment and of one [BM, BW] tile per loop step of the copy kernel. Up to FEW_CHUNKS splits,
#: 4 KiB tiles: one 16-byte word a thread of 8 warps (benchmarks/tune_sort.py on the H200, [65536, 4096] bf16,
#: 64 chunks: 99.0% of copy vs 95.5% for 32 KiB tiles; [16384, 4096]: 86.9 vs 76.3%). With more splits each
#: program reads a larger end table (or binary-searches it) before copying: 32 KiB tiles spread that over more
#: rows (not measured with the small tiles)
_SEGMENT_BYTES = 4096
_TILE_BYTES_FEW_CHUNKS = 4096
_TILE_BYTES = 32768
FEW_CHUNKS = 64
_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _is_real(t: torch.Tensor) -> bool:
    """A tensor with data on the host (not fake/meta): its values can be checked without a sync."""
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type == "cpu" and not is_fake(t)


def check_args(inp: torch.Tensor, probs: Optional[torch.Tensor], split_sizes: torch.Tensor,
               sorted_idxs: torch.Tensor, op: str = OP) -> None:
    """Validate the arguments (also on fake tensors under torch.compile). Values of ``split_sizes`` and
    ``sorted_idxs`` are checked when they live on the host (SPEC 1.6); device ones are trusted."""
    check_tensor(op, "inp", inp, dtypes=None, min_ndim=1)
    for name, t in (("split_sizes", split_sizes), ("sorted_idxs", sorted_idxs)):
        check_tensor(op, name, t, dtypes=INT_DTYPES, ndim=1)
        if t.device.type != "cpu" and t.device != inp.device:
            raise ValueError(f"{op}: {name} must be on the host or on {inp.device} (like inp), got {t.device}")
    if sorted_idxs.shape[0] != split_sizes.shape[0]:
        raise ValueError(f"{op}: sorted_idxs must have shape [num_splits] = [{split_sizes.shape[0]}] "
                         f"(like split_sizes), got {shape_str(sorted_idxs.shape)}")
    if probs is not None:
        check_tensor(op, "probs", probs, dtypes=PROB_DTYPES, shape=(inp.shape[0],), shape_desc="[num_tokens]",
                     device=inp.device)
    num_tokens = inp.shape[0]
    if _is_real(split_sizes):
        sizes = split_sizes.tolist()
        if any(s < 0 for s in sizes):
            raise ValueError(f"{op}: split_sizes must be >= 0, got {_head(sizes)}")
        if sum(sizes) > num_tokens:
            raise ValueError(f"{op}: sum(split_sizes) must be <= num_tokens = {num_tokens}, got {sum(sizes)}")
    if _is_real(sorted_idxs):
        idxs = sorted_idxs.tolist()
        if sorted(idxs) != list(range(len(idxs))):
            raise ValueError(f"{op}: sorted_idxs must be a permutation of 0..{len(idxs) - 1}, got {_head(idxs)}")


def _head(v: list) -> str:
    return f"{v[:16]}{'...' if len(v) > 16 else ''}"


def _word_view(x: torch.Tensor, max_word: int = 8) -> torch.Tensor:
    """``x`` as ``[rows, words]`` of the widest integer type dividing its row bytes, row stride and
    offset (a view when ``x`` can be one: any row stride, unit last stride; else a copy). Copying words
    is bitwise for every dtype and lets one kernel specialization serve every dtype of a size."""
    rows = x.shape[0]
    cols = math.prod(x.shape[1:])
    x2 = unit_last_stride(x.reshape(rows, cols))
    if cols == 1 and x2.stride(1) != 1:
        x2 = x2.as_strided((rows, 1), (x2.stride(0), 1))
    es = x2.element_size()
    row_bytes, stride_bytes, off_bytes = cols * es, x2.stride(0) * es, x2.storage_offset() * es
    w = next(w for w in (8, 4, 2, 1) if w <= max_word
             and row_bytes % w == 0 and stride_bytes % w == 0 and off_bytes % w == 0 and x2.data_ptr() % w == 0)
    return x2.view(torch.uint8).view(_WORDS[w])


class Tables(NamedTuple):
    """Device gather tables of one ``(split_sizes, sorted_idxs)`` pair (see triton_kernels): ``fwd`` =
    ``(out_end, delta)`` of the permutation, ``inv`` = ``(inv_end, inv_delta)`` of its inverse."""

    fwd: tuple
    inv: tuple
    num_splits: int


def _tables(split_sizes: torch.Tensor, sorted_idxs: torch.Tensor, M: int, device: torch.device) -> Tables:
    """Both gather tables on ``device``, computed there without a host sync (one small host->device
    copy when the indices are on the host)."""
    from .triton_kernels import sort_chunks_tables_kernel

    def idx(t):  # the tables kernel reads them as dense 1-D arrays (a slice or an expand is copied)
        return (t if t.dtype in (torch.int32, torch.int64) else t.long()).contiguous()

    sizes, order = idx(split_sizes), idx(sorted_idxs)
    if sizes.device != device or order.device != device:
        if sizes.device.type == "cpu" and order.device.type == "cpu":  # one host->device copy
            packed = tu.host_to_device(torch.stack([sizes.long(), order.long()]), device)
            sizes, order = packed[0], packed[1]
        else:
            sizes, order = tu.host_to_device(sizes, device), tu.host_to_device(order, device)
    NS = sizes.shape[0]
    S = (NS + 2) & ~1  # every table starts 16-byte aligned: both gathers are one kernel specialization
    buf = torch.empty(5 * S, dtype=torch.int64, device=device)
    in_start, out_end, delta, inv_end, inv_delta = (buf[i * S:i * S + NS + (i in (2, 4))] for i in range(5))
    block = min(tu.next_power_of_2(max(NS, 1)), 1024)
    sort_chunks_tables_kernel[(1,)](sizes, order, in_start, out_end, delta, inv_end, inv_delta, NS, M, BLOCK=block,
                                    num_warps=4 if block <= 256 else 8)
    return Tables((out_end, delta), (inv_end, inv_delta), NS)


def _tiles(W: int, word_bytes: int, NS: int) -> tuple[int, int, int]:
    """(rows, words, warps) of one copy step over ``NS`` splits: row segments up to 4 KiB; tiles up to 4 KiB
    (``NS <= FEW_CHUNKS``) or 32 KiB, at most 64 rows; 8 warps for a full tile (at least 16 KiB of the 32)."""
    tile = _TILE_BYTES_FEW_CHUNKS if NS <= FEW_CHUNKS else _TILE_BYTES
    bw = min(tu.next_power_of_2(max(W, 1)), max(1, _SEGMENT_BYTES // word_bytes))
    bm = max(1, min(64, tile // (bw * word_bytes)))
    bm = 1 << (bm.bit_length() - 1)
    return bm, bw, 8 if bm * bw * word_bytes >= min(tile, 16384) else 4


def _needs_copy(x: torch.Tensor, p: Optional[torch.Tensor]) -> bool:
    return x.shape[0] > 0 and (math.prod(x.shape[1:]) > 0 or p is not None)


def _gather(x: torch.Tensor, p: Optional[torch.Tensor], table: tuple,
            NS: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rows of ``x`` (and of ``p``, ``[rows]``) gathered with one gather table ``(end, delta)`` of
    ``NS`` chunks. Returns fresh contiguous tensors."""
    from .triton_kernels import sort_chunks_copy_kernel

    M = x.shape[0]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    q = None if p is None else torch.empty(p.shape, dtype=p.dtype, device=p.device)
    if not _needs_copy(x, p):
        return y, q
    if math.prod(x.shape[1:]):
        xw = _word_view(x)
        yw = _word_view(y, xw.element_size())  # the same word size (y is contiguous: any x's one fits)
    else:  # nothing to copy per row (the probs still move): dummy word buffers
        xw = yw = torch.empty(M, 0, dtype=torch.uint8, device=x.device)
    if p is not None:
        pw, qw = p.view(_WORDS[p.element_size()]), q.view(_WORDS[q.element_size()])
    else:
        pw = qw = xw
    W = xw.shape[1]
    search = NS > SEARCH_BLOCK_MAX
    bm, bw, warps = _tiles(W, xw.element_size(), NS)
    end, delta = table
    sort_chunks_copy_kernel[(tu.cdiv(M, bm),)](
        xw, yw, pw, qw, end, delta, M, W, NS, xw.stride(0), yw.stride(0),
        pw.stride(0) if p is not None else 0, qw.stride(0) if p is not None else 0,
        HAS_PROBS=p is not None, SEARCH=search,
        NS_BLOCK=1 if search else tu.next_power_of_2(max(NS, 1)), SEARCH_STEPS=max(NS, 1).bit_length() + 1,
        BM=bm, BW=bw, num_warps=warps)
    return y, q


def _run(x: torch.Tensor, p: Optional[torch.Tensor], split_sizes: torch.Tensor, sorted_idxs: torch.Tensor,
         reverse: bool, tables: Optional[Tables] = None):
    """:func:`_permute` that also takes and returns the tables (``None`` when nothing was launched)."""
    if not _needs_copy(x, p):
        return _gather(x, p, (None, None), 0) + (tables,)
    if tables is None:
        tables = _tables(split_sizes, sorted_idxs, x.shape[0], x.device)
    return _gather(x, p, tables.inv if reverse else tables.fwd, tables.num_splits) + (tables,)


def _permute(x: torch.Tensor, p: Optional[torch.Tensor], split_sizes: torch.Tensor, sorted_idxs: torch.Tensor,
             reverse: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Forward (``reverse=False``) or inverse (``reverse=True``) chunk permutation of the rows of ``x``
    (and of ``p``, ``[rows]``): a gather with the forward or the inverse table. Returns fresh
    contiguous tensors."""
    return _run(x, p, split_sizes, sorted_idxs, reverse)[:2]


def forward(inp: torch.Tensor, split_sizes: torch.Tensor, sorted_idxs: torch.Tensor) -> torch.Tensor:
    """The permuted rows of ``inp`` (arguments already checked by the op: :func:`check_args`)."""
    return _permute(inp, None, split_sizes, sorted_idxs, False)[0]


def forward_with_probs(inp: torch.Tensor, probs: torch.Tensor, split_sizes: torch.Tensor,
                       sorted_idxs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _permute(inp, probs, split_sizes, sorted_idxs, False)


def backward(dout: torch.Tensor, split_sizes: torch.Tensor, sorted_idxs: torch.Tensor) -> torch.Tensor:
    """``d inp = Pᵀ dout``: the rows of ``dout`` gathered back to their source rows."""
    return _permute(dout, None, split_sizes, sorted_idxs, True)[0]


def backward_with_probs(dout: torch.Tensor, dprobs: torch.Tensor, split_sizes: torch.Tensor,
                        sorted_idxs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _permute(dout, dprobs, split_sizes, sorted_idxs, True)


# -- the eager autograd path: the forward's device tables are kept for the backward ------------------
# (no second host->device copy or tables launch, and the backward is the forward's gather kernel)

def forward_saving(inp, split_sizes, sorted_idxs) -> tuple[torch.Tensor, Optional[Tables]]:
    out, _, tables = _run(inp, None, split_sizes, sorted_idxs, False)
    return out, tables


def forward_with_probs_saving(inp, probs, split_sizes, sorted_idxs) -> tuple[tuple, Optional[Tables]]:
    out, pp, tables = _run(inp, probs, split_sizes, sorted_idxs, False)
    return (out, pp), tables


def backward_saved(dout: torch.Tensor, split_sizes: torch.Tensor, sorted_idxs: torch.Tensor,
                   tables: Optional[Tables]) -> torch.Tensor:
    """:func:`backward` reusing the forward's ``tables`` (computed here if ``None`` and needed)."""
    return _run(dout, None, split_sizes, sorted_idxs, True, tables)[0]


def backward_with_probs_saved(dout, dprobs, split_sizes, sorted_idxs, tables: Optional[Tables]):
    return _run(dout, dprobs, split_sizes, sorted_idxs, True, tables)[:2]


__all__ = ["check_args", "forward", "forward_with_probs", "backward", "backward_with_probs", "forward_saving",
           "forward_with_probs_saving", "backward_saved", "backward_with_probs_saved", "Tables"]
