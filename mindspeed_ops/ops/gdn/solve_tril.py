"""``solve_tril`` (SPEC 1.10.3): checks and launch of the per-chunk unit-lower-triangular inverse."""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_cu_seqlens, check_tensor, reject_float64, shape_str
from . import reference as _ref
from .common import chunk_table, use_triton

OP = "solve_tril"
#: warps per chunk program by chunk size (module-level so benchmarks/tune_solve_tril.py can sweep it).
#: One warp is fastest at every chunk size on the H200 (2-7x faster than 4 or 8: the substitution's
#: reductions stay inside the warp), although it spills a little at BT = 64.
NUM_WARPS = {16: 1, 32: 1, 64: 1}


def check_args(A: torch.Tensor, cu_seqlens: Optional[torch.Tensor],
               output_dtype: Optional[torch.dtype]) -> Optional[list]:
    """Validate the arguments; returns the host copy of ``cu_seqlens`` (or None)."""
    reject_float64(OP, A=A)
    check_tensor(OP, "A", A, ndim=4)
    if A.shape[-1] not in (16, 32, 64):
        raise ValueError(f"{OP}: A's last dim (the chunk size BT) must be 16, 32 or 64, got shape "
                         f"{shape_str(A.shape)}")
    if output_dtype is not None and output_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{OP}: output_dtype must be float32/float16/bfloat16 or None, got {output_dtype}")
    return check_cu_seqlens(OP, cu_seqlens, batch=A.shape[0], total=A.shape[1], like=("A", A))


def solve_tril(A: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None,
               output_dtype: Optional[torch.dtype] = torch.float32,
               chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(I + A_c)^{-1}`` of every chunk's strictly-lower-triangular block (SPEC 1.10.3).
    Forward-only stage function (step 3 of the chunked gated delta rule).

    Args:
        A: ``[B, T, HV, BT]``, ``BT ∈ {16, 32, 64}``, fp32/fp16/bf16, any strides: row ``t`` holds the
            entries of token t's row of its chunk's matrix (e.g. from ``chunk_scaled_dot_kkt_fwd``). Only
            strictly-lower entries at valid positions are read: anything on/above the diagonal (even NaN)
            or past the sequence end is ignored.
        cu_seqlens: ``[N+1]`` int32/int64 packed offsets (then ``B == 1``).
        output_dtype: dtype of the result (default fp32; ``None`` = ``A.dtype``).
        chunk_indices: optional precomputed ``[NT, 2]`` table for ``BT``, trusted.

    Returns:
        ``Ainv`` in A's layout: unit lower triangular per chunk, exact zeros above the diagonal and in
        columns past the chunk's valid length; tail rows (``>= cu_seqlens[-1]``) are 0.

    Method: 16x16 diagonal blocks by forward substitution in fp32, merged into 32/64 blocks by block
    forward substitution (``X21 = −X22·A21·X11`` and its 4x4-block analogue) with IEEE fp32 dot
    products (no TF32).

    Raises:
        ValueError: rank not 4, ``BT`` not 16/32/64, bad ``cu_seqlens`` or ``chunk_indices``.
        TypeError: non-float ``A`` (float64 is reference-only) or bad ``output_dtype``.
    """
    cu_host = check_args(A, cu_seqlens, output_dtype)
    out_dtype = A.dtype if output_dtype is None else output_dtype
    if not use_triton(A.device):
        with torch.no_grad():  # stage functions are not differentiable (SPEC 1.10)
            return _ref.solve_tril_ref(A, cu_seqlens, out_dtype)
    return forward(A, cu_host, cu_seqlens, out_dtype, chunk_indices)


def forward(A: torch.Tensor, cu_host: Optional[list], cu_seqlens: Optional[torch.Tensor], out_dtype: torch.dtype,
            chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Triton launch (arguments already validated)."""
    from .triton_kernels import solve_tril_kernel

    B, T, HV, BT = A.shape
    x = tu.kernel_input(A)
    out = torch.empty(A.shape, dtype=tu.kernel_dtype(out_dtype), device=A.device)
    if cu_host is not None and cu_host[-1] < T:
        out[:, cu_host[-1]:].zero_()  # tail rows
    NT, cu, idx = chunk_table(OP, cu_host, cu_seqlens, B, T, BT, chunk_indices, A.device)
    if NT and B and HV:
        grid = (NT * B * HV,)
        solve_tril_kernel[grid](
            x, out, cu if cu is not None else x, idx if idx is not None else x, T, B * HV, HV,
            *x.stride(), *out.stride(), BT=BT, IS_VARLEN=idx is not None, num_warps=NUM_WARPS[BT])
    return tu.finish(out, out_dtype)
