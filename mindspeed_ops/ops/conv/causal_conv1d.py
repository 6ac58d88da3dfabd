"""Host launchers for ``causal_conv1d`` (SPEC 1.9.1): argument checks, the varlen token table, tiling, grids.

Kernel design (memory-bound; H200 target >= 85% of copy bandwidth forward, >= 70% forward+backward):
- forward: one program per [BT tokens, BD channels] tile of the packed rows; the W taps are W shifted
  loads of the same rows (the W-1 halo rows come from L1/L2), fp32 math, one rounding on store.
  Tiles ignore sequence boundaries: every row looks up its sequence (a per-token int32 table built with
  ``torch.searchsorted`` on device in varlen mode, ``g // T`` otherwise), so 2100 sequences of 1-3
  tokens cost the same as one long one, and masks keep every tap inside its own sequence.
- backward: each program owns BD channels and a run of TILES consecutive token tiles (a grid of about
  16 programs per SM, so the last wave is a small fraction); it recomputes ``a`` where ``act'`` needs
  it, forms ``dx`` by the transposed taps, and keeps fp32 ``dweight``/``dbias`` partials in registers,
  written once per program and summed by torch (deterministic, no atomics). No host read of
  ``cu_seqlens`` (the kernels read ``cu_seqlens[N]`` on device).
- state taps (rows within W-1 of a sequence start) sit behind a per-tile scalar branch, so tiles
  without a sequence start carry no state pointers (register pressure).
- state kernels: one program per (sequence, channel tile) for ``final_state`` and ``d initial_state``.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from ..common import unit_last_stride
from ...validation import (FLOAT_DTYPES, INDEX_DTYPES, check_choice, check_cu_seqlens, check_same_device,
                           check_tensor, reject_float64, shape_str)

OP = "causal_conv1d"
ACTIVATIONS = (None, "silu", "swish")
MAX_WIDTH = 8


def check_args(x, weight, bias, residual, initial_state, activation, cu_seqlens, output_final_state,
               op: str = OP) -> tuple[int, int, int, int, int]:
    """Validate the arguments without reading device values (also runs on fake tensors);
    returns ``(B, T, D, W, N)``."""
    reject_float64(op, x=x, weight=weight, bias=bias, residual=residual, initial_state=initial_state)
    check_tensor(op, "x", x, ndim=3)
    B, T, D = x.shape
    check_tensor(op, "weight", weight, dtypes=FLOAT_DTYPES, ndim=2)
    W = weight.shape[0]
    if weight.shape[1] != D:
        hint = (" (a [D, W] weight must be transposed to [W, D]: weight.t())"
                if weight.shape[0] == D and 1 <= weight.shape[1] <= MAX_WIDTH else "")
        raise ValueError(f"{op}: weight must have shape [W, D] = [W, {D}], got {shape_str(weight.shape)}{hint}")
    if not 1 <= W <= MAX_WIDTH:
        raise ValueError(f"{op}: the convolution width W = weight.shape[0] must be in [1, {MAX_WIDTH}], got {W}")
    if bias is not None:
        check_tensor(op, "bias", bias, dtypes=FLOAT_DTYPES, shape=(D,), shape_desc="[D]")
    if residual is not None:
        check_tensor(op, "residual", residual, dtypes=FLOAT_DTYPES, shape=(B, T, D), shape_desc="[B, T, D]")
    check_choice(op, "activation", activation, ACTIVATIONS)
    if cu_seqlens is not None:
        check_tensor(op, "cu_seqlens", cu_seqlens, dtypes=INDEX_DTYPES, ndim=1)
        if B != 1:
            raise ValueError(f"{op}: with cu_seqlens the batch size must be 1 (pack the batch into one row), got {B}")
        if cu_seqlens.shape[0] < 1:
            raise ValueError(f"{op}: cu_seqlens must have at least 1 entry, got shape {shape_str(cu_seqlens.shape)}")
        N = cu_seqlens.shape[0] - 1
    else:
        N = B
    if initial_state is not None:
        check_tensor(op, "initial_state", initial_state, dtypes=FLOAT_DTYPES, shape=(N, D, W),
                     shape_desc="[N, D, W]")
    check_same_device(op, x=x, weight=weight, bias=bias, residual=residual, initial_state=initial_state)
    return B, T, D, W, N


def _rows_unit(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Kernel view of a [B, T, D] tensor: unit stride on D (copied otherwise), bf16 widened under the interpreter."""
    return unit_last_stride(tu.kernel_input(t))


def _layout(x: torch.Tensor, cu_seqlens: Optional[torch.Tensor], validate: bool):
    """(varlen, kernel ``total`` argument, cu on device, per-token sequence table, N).

    ``total`` is ``B*T`` in fixed-length mode and ``N`` in varlen mode (the kernels read
    ``cu_seqlens[N]`` themselves). ``validate`` reads ``cu_seqlens`` on the host (the forward's one
    allowed synchronisation); the backward trusts the values the forward checked."""
    B, T, _ = x.shape
    if cu_seqlens is None:
        return False, B * T, None, None, B
    if validate:
        check_cu_seqlens(OP, cu_seqlens, batch=B, total=T)
    N = cu_seqlens.shape[0] - 1
    cu = cu_seqlens.to(x.device)
    seq = (torch.searchsorted(cu.to(torch.int64), torch.arange(T, device=x.device), right=True) - 1).to(torch.int32)
    return True, N, cu, seq, N


def _tiles(D: int, rows_per_program: int = 4096, max_bd: int = 128) -> tuple[int, int]:
    bd = max(16, min(tu.next_power_of_2(D), max_bd))
    return bd, max(1, min(64, rows_per_program // bd))


def _dummy(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(1)


def forward(x, weight, bias=None, residual=None, initial_state=None, activation=None, cu_seqlens=None,
            output_final_state=False):
    """Returns ``(y, final_state)`` (``final_state`` None unless ``output_final_state``)."""
    from .triton_kernels import causal_conv1d_final_state_kernel, causal_conv1d_fwd_kernel

    B, T, D, W, N = check_args(x, weight, bias, residual, initial_state, activation, cu_seqlens, output_final_state)
    varlen, total, cu, seq, N = _layout(x, cu_seqlens, True)
    silu = activation in ("silu", "swish")
    xk, rk = _rows_unit(x), _rows_unit(residual)
    wk, sk = tu.kernel_input(weight), tu.kernel_input(initial_state)
    bk = None if bias is None else tu.kernel_input(bias).contiguous()
    rows = B * T
    y = torch.empty(B, T, D, dtype=tu.kernel_dtype(x.dtype), device=x.device)
    dummy = _dummy(y)
    sstr = sk.stride() if sk is not None else (0, 0, 0)
    if rows and D:
        bd, bt = _tiles(D, 2048 if sk is not None else 4096)  # state taps cost registers: smaller tiles
        grid = (tu.cdiv(rows, bt), tu.cdiv(D, bd))
        causal_conv1d_fwd_kernel[grid](
            xk, wk, dummy if bk is None else bk, dummy if rk is None else rk, dummy if sk is None else sk, y,
            dummy if cu is None else cu, dummy if seq is None else seq, T, total, rows, D,
            xk.stride(0), xk.stride(1), wk.stride(0), wk.stride(1),
            rk.stride(0) if rk is not None else 0, rk.stride(1) if rk is not None else 0, *sstr,
            W=W, SILU=silu, HAS_BIAS=bk is not None, HAS_RES=rk is not None, HAS_STATE=sk is not None,
            VARLEN=varlen, BT=bt, BD=bd, num_warps=8)
    y = tu.finish(y, x.dtype)
    if not output_final_state:
        return y, None
    fs_dtype = initial_state.dtype if initial_state is not None else x.dtype
    fs = torch.empty(N, D, W, dtype=tu.kernel_dtype(fs_dtype), device=x.device)
    if N and D:
        bd = max(16, min(tu.next_power_of_2(D), 256))
        causal_conv1d_final_state_kernel[(N, tu.cdiv(D, bd))](
            xk, dummy if sk is None else sk, fs, dummy if cu is None else cu, T, D, xk.stride(0), xk.stride(1), *sstr,
            W=W, WP=tu.next_power_of_2(W), HAS_STATE=sk is not None, VARLEN=varlen, BD=bd, num_warps=4)
    return y, tu.finish(fs, fs_dtype)


def backward(dy, dfinal, x, weight, bias=None, initial_state=None, activation=None, cu_seqlens=None):
    """Returns ``(dx, dweight, dbias or None, d initial_state or None)``; ``dresidual`` is ``dy`` itself."""
    from .triton_kernels import causal_conv1d_bwd_kernel, causal_conv1d_bwd_state_kernel

    B, T, D = x.shape
    W = weight.shape[0]
    varlen, total, cu, seq, N = _layout(x, cu_seqlens, False)
    silu = activation in ("silu", "swish")
    xk = _rows_unit(x)
    wk, sk = tu.kernel_input(weight), tu.kernel_input(initial_state)
    bk = None if bias is None else tu.kernel_input(bias).contiguous()
    dyk, dfk = tu.kernel_input(dy), tu.kernel_input(dfinal)  # any strides (stride-0 from .sum() included)
    rows = B * T
    dx = torch.empty(B, T, D, dtype=tu.kernel_dtype(x.dtype), device=x.device)
    dummy = _dummy(dx)
    sstr = sk.stride() if sk is not None else (0, 0, 0)
    fstr = dfk.stride() if dfk is not None else (0, 0, 0)
    common = dict(W=W, WP=tu.next_power_of_2(W), SILU=silu, HAS_BIAS=bk is not None, HAS_DF=dfk is not None,
                  VARLEN=varlen)
    bias_arg, state_arg = dummy if bk is None else bk, dummy if sk is None else sk
    df_arg, cu_arg = dummy if dfk is None else dfk, dummy if cu is None else cu
    dw = torch.zeros(W, D, dtype=torch.float32, device=x.device)
    db = torch.zeros(D, dtype=torch.float32, device=x.device)
    if rows and D:
        bd, bt = _tiles(D, rows_per_program=1024)
        n_tiles, n_d = tu.cdiv(rows, bt), tu.cdiv(D, bd)
        chunks = max(1, min(n_tiles, tu.cdiv(16 * tu.num_sms(x.device), n_d)))  # ~8 waves: small tail
        tiles = tu.cdiv(n_tiles, chunks)
        chunks = tu.cdiv(n_tiles, tiles)
        dw_part = torch.empty(chunks, W, D, dtype=torch.float32, device=x.device)
        db_part = torch.empty(chunks, D, dtype=torch.float32, device=x.device)
        causal_conv1d_bwd_kernel[(n_d, chunks)](
            xk, wk, bias_arg, state_arg, dyk, df_arg, dx, dw_part, db_part, cu_arg, dummy if seq is None else seq,
            T, total, rows, D, tiles, xk.stride(0), xk.stride(1), wk.stride(0), wk.stride(1), *sstr,
            *dyk.stride(), *fstr, HAS_STATE=sk is not None, BT=bt, BD=bd, num_warps=8, **common)
        dw, db = dw_part.sum(0), db_part.sum(0)
    elif rows:
        dx.zero_()
    dinit = None
    if initial_state is not None:
        dinit = torch.empty(N, D, W, dtype=tu.kernel_dtype(initial_state.dtype), device=x.device)
        if N and D:
            bd = max(16, min(tu.next_power_of_2(D), 128))
            causal_conv1d_bwd_state_kernel[(N, tu.cdiv(D, bd))](
                xk, wk, bias_arg, state_arg, dyk, df_arg, dinit, cu_arg, T, D, xk.stride(0), xk.stride(1),
                wk.stride(0), wk.stride(1), *sstr, *dyk.stride(), *fstr, BD=bd, num_warps=4, **common)
        dinit = tu.finish(dinit, initial_state.dtype)
    return (tu.finish(dx, x.dtype), dw.to(weight.dtype), None if bias is None else db.to(bias.dtype), dinit)
