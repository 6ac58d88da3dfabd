"""Triton kernels of the GDN family (SPEC 1.10). Kernels only: launchers live in the stage modules.

Conventions: token-major tensors addressed through their strides with int64 offsets; varlen chunks
come from ``chunk_indices`` (rows ``(sequence, chunk inside the sequence)``) and ``cu_seqlens``;
fixed-length chunks from the program id. All math in fp32, rounded once on store.
"""
import triton
import triton.language as tl


@triton.jit
def _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(first token, end of the sequence) of chunk ``i_c`` (int64): varlen through chunk_indices."""
    if IS_VARLEN:
        i_n = tl.load(idx_ptr + i_c * 2).to(tl.int64)
        i_t = tl.load(idx_ptr + i_c * 2 + 1).to(tl.int64)
        bos = tl.load(cu_ptr + i_n).to(tl.int64)
        eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
    else:
        i_t = i_c
        bos = i_c * 0
        eos = bos + T
    return bos + i_t * BT, eos


@triton.jit
def _row_factor(base, rows, mask, s_t):
    """A per-token fp32 factor (``[rows]``; 0 where masked): the l2norm ``rstd`` of q or k, folded into a
    forward stage's products instead of rounding ``q̂ = rstd·q`` to the input dtype (SPEC 1.10.0)."""
    return tl.load(base + rows * s_t, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _gate_row(base, row, s_t, i_kb, K, ok, BK: tl.constexpr):
    """Key columns ``[i_kb·BK, (i_kb+1)·BK)`` of the per-channel gate cumsum's row ``row`` (fp32; 0 where masked or
    ``not ok``): the state scans' per-chunk decay ``e^{Γ}``. The scans load it one chunk step ahead: the software
    pipeline does not stage such a row (a plain global load in the sm_90 loop, ``benchmarks/sass_loops.py``), so
    loaded where it is used, every step of the scan's chain waited out its latency."""
    d = i_kb * BK + tl.arange(0, BK)
    return tl.load(base + row * s_t + d, mask=(d < K) & ok, other=0.0).to(tl.float32)


@triton.jit
def _chunk_v_tile(T, B, HV, V, cu_ptr, idx_ptr, BT: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Program of a chunk kernel flattened as ``((chunk · B + batch) · HV + head) · NV + V-tile``:
    ``(chunk, batch, head, first token, sequence end, first V column, token offsets, token mask,
    column offsets, column mask)`` of this program's ``[BT, BV]`` tile."""
    pid = tl.program_id(0).to(tl.int64)
    NV = tl.cdiv(V, BV)
    i_v = pid % NV
    rest = pid // NV
    i_h = rest % HV
    rest = rest // HV
    i_b = rest % B
    i_c = rest // B
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    v0 = i_v * BV
    o_t = tl.arange(0, BT)
    cols = tl.arange(0, BV)
    return i_c, i_b, i_h, start, eos, v0, o_t, o_t < eos - start, cols, cols < V - v0


# ------------------------------------------------------------------------------------------------
# chunk_local_cumsum (SPEC 1.10.1)
# ------------------------------------------------------------------------------------------------

@triton.jit
def chunk_local_cumsum_kernel(g_ptr, o_ptr, cu_ptr, idx_ptr, T, B, C, KD,
                              s_gb, s_gt, s_gh, s_gk, s_ob, s_ot, s_oh, s_ok, scale,
                              BT: tl.constexpr, BC: tl.constexpr, REVERSE: tl.constexpr,
                              IS_VARLEN: tl.constexpr):
    """One chunk of ``BT`` tokens x ``BC`` gate columns. Columns flatten (head, channel): column
    ``c`` is head ``c // KD``, channel ``c % KD`` (``KD = 1`` for scalar gates). Inclusive scan down
    the tokens (``REVERSE``: a true suffix scan), times ``scale``; rows past the sequence end are
    neither read nor written."""
    pid = tl.program_id(0).to(tl.int64)
    i_c = pid // B
    i_b = pid % B
    cols = tl.program_id(1).to(tl.int64) * BC + tl.arange(0, BC)
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    rows = start + tl.arange(0, BT)
    mask = (rows[:, None] < eos) & (cols[None, :] < C)
    h = cols // KD
    d = cols % KD
    x = tl.load(g_ptr + i_b * s_gb + rows[:, None] * s_gt + (h * s_gh + d * s_gk)[None, :],
                mask=mask, other=0.0).to(tl.float32)
    y = tl.cumsum(x, axis=0, reverse=REVERSE) * scale
    tl.store(o_ptr + i_b * s_ob + rows[:, None] * s_ot + (h * s_oh + d * s_ok)[None, :],
             y.to(o_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------------
# solve_tril (SPEC 1.10.3)
# ------------------------------------------------------------------------------------------------

@triton.jit
def _load_block16(a_base, start, eos, di, dj, s_at, s_ac):
    """16x16 block (di, dj) (di > dj) of a chunk's A in fp32; rows past the sequence end read 0."""
    o = tl.arange(0, 16)
    rows = start + di * 16 + o
    return tl.load(a_base + rows[:, None] * s_at + (dj * 16 + o)[None, :] * s_ac,
                   mask=(rows < eos)[:, None], other=0.0).to(tl.float32)


@triton.jit
def _load_diag16_all(a_base, start, eos, NB: tl.constexpr, s_at, s_ac):
    """``[NB, 16, 16]``: the strictly-lower parts of the chunk's ``NB`` diagonal 16x16 blocks of A in
    fp32 (rows past the sequence end, the diagonal and above read 0)."""
    b = tl.arange(0, NB)[:, None, None]
    r = tl.arange(0, 16)[None, :, None]
    c = tl.arange(0, 16)[None, None, :]
    rows = start + b * 16 + r
    return tl.load(a_base + rows * s_at + (b * 16 + c) * s_ac, mask=(rows < eos) & (c < r),
                   other=0.0).to(tl.float32)


@triton.jit
def _inv_diag16_all(A, NB: tl.constexpr):
    """``[NB, 16, 16]``: ``(I + A_dd)^{-1}`` of ``NB`` diagonal 16x16 blocks ``A`` (fp32, strictly lower:
    zeros on and above the diagonal), by forward substitution in fp32 (elementwise IEEE arithmetic):
    ``X_i = e_i − Σ_{j<i} A_ij X_j``. All blocks advance together, so the dependent chain is 15 steps,
    not 15·NB. H200, [1, 8192, 32, 64], one warp (benchmarks/tune_solve_tril.py): 87 us; one global row
    load per step and block took 320 us (40% of GDN's forward), blocks one after the other in registers
    130 us."""
    r = tl.arange(0, 16)[None, :, None]
    c = tl.arange(0, 16)[None, None, :]
    X = tl.where(r == c, 1.0, tl.zeros([NB, 16, 16], dtype=tl.float32))
    e = tl.arange(0, 16)[None, :]
    for i in range(1, 16):
        a = tl.sum(tl.where(r == i, A, 0.0), 1)  # [NB, 16]: row i of every block (zero from column i on)
        new = (e == i).to(tl.float32) - tl.sum(a[:, :, None] * X, 1)
        X = tl.where(r == i, new[:, None, :], X)
    return X


@triton.jit
def _place16(X, d, NB: tl.constexpr):
    """A ``[16, 16]`` tile as block ``d`` of an otherwise zero ``[NB, 16, 16]`` stack (inverse of ``_pick16``)."""
    b = tl.arange(0, NB)[:, None, None]
    return tl.where(b == d, X[None, :, :], 0.0)


@triton.jit
def _pick16(X, d, NB: tl.constexpr):
    """Block ``d`` of a ``[NB, 16, 16]`` stack as a ``[16, 16]`` tile."""
    b = tl.arange(0, NB)[:, None, None]
    return tl.sum(tl.where(b == d, X, 0.0), 0)


@triton.jit
def _store_block16(o_base, start, eos, di, dj, X, s_ot, s_oc):
    o = tl.arange(0, 16)
    rows = start + di * 16 + o
    tl.store(o_base + rows[:, None] * s_ot + (dj * 16 + o)[None, :] * s_oc, X.to(o_base.dtype.element_ty),
             mask=(rows < eos)[:, None])


@triton.jit
def _mm(a, b):
    """fp32 product with IEEE fp32 multiplies (no TF32, SPEC 0.5)."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _merge_store16(o_base, start, eos, Xd, A21, A31, A32, A41, A42, A43, s_ot, s_oc, BT: tl.constexpr):
    """Finish ``(I + A_c)^{-1}`` of one chunk from its inverted diagonal blocks ``Xd`` (``[BT // 16, 16, 16]``)
    and strictly-lower off-diagonal 16x16 blocks of A (``Aij``, block row i, block column j, 1-based; only
    those inside ``BT`` are read): block forward substitution ``X_ij = −X_ii Σ_{j≤m<i} A_im X_mj`` with
    IEEE fp32 dots, then every row of the chunk inside the sequence is written (all ``BT`` columns: zeros
    above the diagonal). Shared by ``solve_tril_kernel`` (A from memory) and the fused
    ``kkt_solve_fwd_kernel`` (A formed in registers)."""
    zero = tl.zeros([16, 16], dtype=tl.float32)
    X11 = _pick16(Xd, 0, BT // 16)
    if BT == 16:
        _store_block16(o_base, start, eos, 0, 0, X11, s_ot, s_oc)
    elif BT == 32:
        X22 = _pick16(Xd, 1, BT // 16)
        X21 = -_mm(X22, _mm(A21, X11))
        _store_block16(o_base, start, eos, 0, 0, X11, s_ot, s_oc)
        _store_block16(o_base, start, eos, 0, 1, zero, s_ot, s_oc)
        _store_block16(o_base, start, eos, 1, 0, X21, s_ot, s_oc)
        _store_block16(o_base, start, eos, 1, 1, X22, s_ot, s_oc)
    else:
        X22 = _pick16(Xd, 1, BT // 16)
        X33 = _pick16(Xd, 2, BT // 16)
        X44 = _pick16(Xd, 3, BT // 16)
        X21 = -_mm(X22, _mm(A21, X11))
        X32 = -_mm(X33, _mm(A32, X22))
        X43 = -_mm(X44, _mm(A43, X33))
        X31 = -_mm(X33, _mm(A31, X11) + _mm(A32, X21))
        X42 = -_mm(X44, _mm(A42, X22) + _mm(A43, X32))
        X41 = -_mm(X44, _mm(A41, X11) + _mm(A42, X21) + _mm(A43, X31))
        _store_block16(o_base, start, eos, 0, 0, X11, s_ot, s_oc)
        _store_block16(o_base, start, eos, 0, 1, zero, s_ot, s_oc)
        _store_block16(o_base, start, eos, 0, 2, zero, s_ot, s_oc)
        _store_block16(o_base, start, eos, 0, 3, zero, s_ot, s_oc)
        _store_block16(o_base, start, eos, 1, 0, X21, s_ot, s_oc)
        _store_block16(o_base, start, eos, 1, 1, X22, s_ot, s_oc)
        _store_block16(o_base, start, eos, 1, 2, zero, s_ot, s_oc)
        _store_block16(o_base, start, eos, 1, 3, zero, s_ot, s_oc)
        _store_block16(o_base, start, eos, 2, 0, X31, s_ot, s_oc)
        _store_block16(o_base, start, eos, 2, 1, X32, s_ot, s_oc)
        _store_block16(o_base, start, eos, 2, 2, X33, s_ot, s_oc)
        _store_block16(o_base, start, eos, 2, 3, zero, s_ot, s_oc)
        _store_block16(o_base, start, eos, 3, 0, X41, s_ot, s_oc)
        _store_block16(o_base, start, eos, 3, 1, X42, s_ot, s_oc)
        _store_block16(o_base, start, eos, 3, 2, X43, s_ot, s_oc)
        _store_block16(o_base, start, eos, 3, 3, X44, s_ot, s_oc)


@triton.jit
def solve_tril_kernel(a_ptr, o_ptr, cu_ptr, idx_ptr, T, BHV, HV,
                      s_ab, s_at, s_ah, s_ac, s_ob, s_ot, s_oh, s_oc,
                      BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """``(I + A_c)^{-1}`` of one chunk and value head: 16x16 diagonal blocks by forward substitution,
    merged by block forward substitution with IEEE fp32 dots (``_merge_store16``). Writes every row of
    the chunk inside the sequence (all BT columns: zeros above the diagonal)."""
    pid = tl.program_id(0).to(tl.int64)
    i_c = pid // BHV
    i_bh = pid % BHV
    i_b = i_bh // HV
    i_h = i_bh % HV
    start, eos = _chunk_bounds(i_c, cu_ptr, idx_ptr, T, BT, IS_VARLEN)
    a_base = a_ptr + i_b * s_ab + i_h * s_ah
    o_base = o_ptr + i_b * s_ob + i_h * s_oh
    Xd = _inv_diag16_all(_load_diag16_all(a_base, start, eos, BT // 16, s_at, s_ac), BT // 16)
    z = tl.zeros([16, 16], dtype=tl.float32)  # blocks outside BT: never read
    A21, A31, A32, A41, A42, A43 = z, z, z, z, z, z
    if BT >= 32:
        A21 = _load_block16(a_base, start, eos, 1, 0, s_at, s_ac)
    if BT == 64:
        A31 = _load_block16(a_base, start, eos, 2, 0, s_at, s_ac)
        A32 = _load_block16(a_base, start, eos, 2, 1, s_at, s_ac)
        A41 = _load_block16(a_base, start, eos, 3, 0, s_at, s_ac)
        A42 = _load_block16(a_base, start, eos, 3, 1, s_at, s_ac)
        A43 = _load_block16(a_base, start, eos, 3, 2, s_at, s_ac)
    _merge_store16(o_base, start, eos, Xd, A21, A31, A32, A41, A42, A43, s_ot, s_oc, BT)
