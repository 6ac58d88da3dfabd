"""Triton kernels of the MoE family. Kernels only: launchers live in the op modules.

``sort_chunks_by_idx`` runs as two launches and never synchronises with the host:

1. ``sort_chunks_tables_kernel`` (one program): from ``split_sizes`` and ``sorted_idxs`` (read on the
   device) it writes the gather tables of the permutation and of its inverse. Forward, per output
   chunk k: ``out_end[k]`` (exclusive row end of chunk k in the output) and ``delta[k]`` (source row
   minus output row for every row of chunk k); inverse, per input chunk j: ``inv_end[j]`` (its row end
   in the input) and ``inv_delta[j]`` (row of that chunk in the output minus its row in the input).
   ``delta[num_splits] = inv_delta[num_splits] = 0`` cover the identity tail.
2. ``sort_chunks_copy_kernel``: each program owns ``BM`` destination rows, finds their chunks (one
   vector load of the end table and a compare-count, or a binary search for many splits), and gathers
   the rows as machine words (the launcher reinterprets any dtype as the widest integer that fits, so
   the copy is bitwise and the loads are wide). The backward (``d inp = Pᵀ d out``) is the same gather
   with the inverse tables, which the eager autograd path keeps from the forward.

Device inputs are trusted but clamped, so no access goes out of bounds whatever they hold.
"""
import triton
import triton.language as tl


@triton.jit
def sort_chunks_tables_kernel(sizes_ptr, idx_ptr, in_start_ptr, out_end_ptr, delta_ptr, inv_end_ptr, inv_delta_ptr,
                              NS, M, BLOCK: tl.constexpr):
    # pass 1: exclusive prefix sum of the (clamped) input chunk sizes -> in_start; inverse ends
    carry = tl.cast(0, tl.int64)
    for b in range(0, NS, BLOCK):
        k = b + tl.arange(0, BLOCK)
        m = k < NS
        s = tl.load(sizes_ptr + k, mask=m, other=0).to(tl.int64)
        s = tl.minimum(tl.maximum(s, 0), M)
        inc = tl.cumsum(s, 0) + carry
        tl.store(in_start_ptr + k, inc - s, mask=m)
        tl.store(inv_end_ptr + k, inc, mask=m)
        tl.store(inv_delta_ptr + k, inc * 0, mask=m)  # entries a non-permutation idx never sets stay 0
        carry += tl.sum(s, 0)
    tl.debug_barrier()  # in_start / inv_delta written by other threads of this program are used below
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
        tl.store(inv_delta_ptr + j, (end - s) - start, mask=m)
        carry += tl.sum(s, 0)
    tl.store(delta_ptr + NS, carry * 0)
    tl.store(inv_delta_ptr + NS, carry * 0)


@triton.jit
def sort_chunks_copy_kernel(x_ptr, y_ptr, p_ptr, q_ptr, out_end_ptr, delta_ptr, M, W, NS,
                            stride_x, stride_y, stride_p, stride_q,
                            HAS_PROBS: tl.constexpr, SEARCH: tl.constexpr,
                            NS_BLOCK: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                            BM: tl.constexpr, BW: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    row_ok = rows < M
    # chunk of each destination row: k = #{j : end[j] <= row} (the end table is non-decreasing)
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
    for w0 in range(0, W, BW):
        cols = w0 + tl.arange(0, BW)
        mask = row_ok[:, None] & (cols[None, :] < W)
        v = tl.load(x_ptr + src[:, None] * stride_x + cols[None, :], mask=mask)
        tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], v, mask=mask)
    if HAS_PROBS:
        pv = tl.load(p_ptr + src * stride_p, mask=row_ok)
        tl.store(q_ptr + rows * stride_q, pv, mask=row_ok)
