"""Triton kernels of the MoE family. Kernels only: launchers live in the op modules.

``sort_chunks_by_idx`` runs as two launches and never synchronises with the host:

1. ``sort_chunks_tables_kernel`` (one program): from ``split_sizes`` and ``sorted_idxs`` (read on the
   device) it writes, per output chunk k, ``out_end[k]`` (inclusive row end of chunk k in the output)
   and ``delta[k]`` (source row minus output row for every row of chunk k); ``delta[num_splits] = 0``
   covers the identity tail.
2. ``sort_chunks_copy_kernel``: each program owns ``BM`` output rows, finds their chunks (one vector
   load of ``out_end`` and a compare-count, or a binary search for many splits), and copies the rows
   as machine words (the launcher reinterprets any dtype as the widest integer that fits, so the copy
   is bitwise and the loads are wide). ``REVERSE`` scatters instead of gathering (the backward).

Device inputs are trusted but clamped, so no access goes out of bounds whatever they hold.
"""
import triton
import triton.language as tl


@triton.jit
def sort_chunks_tables_kernel(sizes_ptr, idx_ptr, in_start_ptr, out_end_ptr, delta_ptr, NS, M,
                              BLOCK: tl.constexpr):
    # pass 1: exclusive prefix sum of the (clamped) input chunk sizes -> in_start
    carry = tl.cast(0, tl.int64)
    for b in range(0, NS, BLOCK):
        k = b + tl.arange(0, BLOCK)
        m = k < NS
        s = tl.load(sizes_ptr + k, mask=m, other=0).to(tl.int64)
        s = tl.minimum(tl.maximum(s, 0), M)
        inc = tl.cumsum(s, 0) + carry
        tl.store(in_start_ptr + k, inc - s, mask=m)
        carry += tl.sum(s, 0)
    tl.debug_barrier()  # in_start written by other threads of this program is read below
    # pass 2: output chunk k is input chunk idx[k]
    carry = tl.cast(0, tl.int64)
    for b in range(0, NS, BLOCK):
        k = b + tl.arange(0, BLOCK)
        m = k < NS
        j = tl.load(idx_ptr + k, mask=m, other=0).to(tl.int64)
        j = tl.minimum(tl.maximum(j, 0), NS - 1)
        s = tl.load(sizes_ptr + j, mask=m, other=0).to(tl.int64)
        s = tl.minimum(tl.maximum(s, 0), M)
        start = tl.load(in_start_ptr + j, mask=m, other=0)
        end = tl.cumsum(s, 0) + carry
        tl.store(out_end_ptr + k, end, mask=m)
        tl.store(delta_ptr + k, start - (end - s), mask=m)
        carry += tl.sum(s, 0)
    tl.store(delta_ptr + NS, carry * 0)


@triton.jit
def sort_chunks_copy_kernel(x_ptr, y_ptr, p_ptr, q_ptr, out_end_ptr, delta_ptr, M, W, NS,
                            stride_x, stride_y, stride_p, stride_q,
                            HAS_PROBS: tl.constexpr, REVERSE: tl.constexpr, SEARCH: tl.constexpr,
                            NS_BLOCK: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                            BM: tl.constexpr, BW: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    row_ok = rows < M
    # chunk of each output row: k = #{j : out_end[j] <= row} (out_end is non-decreasing)
    if SEARCH:
        lo = tl.zeros([BM], dtype=tl.int64)
        hi = tl.zeros([BM], dtype=tl.int64) + NS
        for _ in range(SEARCH_STEPS):
            active = lo < hi
            mid = (lo + hi) // 2
            e = tl.load(out_end_ptr + mid, mask=active & row_ok, other=0)
            right = active & (e <= rows)
            lo = tl.where(right, mid + 1, lo)
            hi = tl.where(active & (e > rows), mid, hi)
        k = lo
    else:
        ks = tl.arange(0, NS_BLOCK)
        ends = tl.load(out_end_ptr + ks, mask=ks < NS, other=0)
        hit = (ends[None, :] <= rows[:, None]) & (ks[None, :] < NS)
        k = tl.sum(hit.to(tl.int32), 1).to(tl.int64)
    delta = tl.load(delta_ptr + k, mask=row_ok, other=0)
    src = tl.minimum(tl.maximum(rows + delta, 0), M - 1)
    if REVERSE:
        rd = rows
        wr = src
    else:
        rd = src
        wr = rows
    for w0 in range(0, W, BW):
        cols = w0 + tl.arange(0, BW)
        mask = row_ok[:, None] & (cols[None, :] < W)
        v = tl.load(x_ptr + rd[:, None] * stride_x + cols[None, :], mask=mask)
        tl.store(y_ptr + wr[:, None] * stride_y + cols[None, :], v, mask=mask)
    if HAS_PROBS:
        pv = tl.load(p_ptr + rd * stride_p, mask=row_ok)
        tl.store(q_ptr + wr * stride_q, pv, mask=row_ok)
