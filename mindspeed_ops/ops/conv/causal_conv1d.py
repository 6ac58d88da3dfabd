"""Host launchers for ``causal_conv1d`` (SPEC 1.9.1): argument checks, the varlen token table, tiling, grids.

Kernel design (memory-bound; H200 target >= 85% of copy bandwidth forward, >= 70% forward+backward):
- streaming kernels (forward, backward; see triton_kernels.py): a program owns BD channels and a chunk
  of G*CS rows of one batch row (or of the packed row in varlen mode), walked as G streams of CS rows
  in lockstep, one row per stream and step. Each stream keeps the extended inputs of its last W-1 rows
  (and, backward, its last W-1 ``gy`` rows) in registers, so x, dy, y and dx each cross the memory bus
  once (plus a W-1 row halo per stream) and the activation is evaluated once per element:
  ``gy_t = dy_t ⊙ act'(a_t)`` once per row, ``dx_t = Σ_s weight[W-1-s] ⊙ gy_{t+s}`` from the window
  (the backward walks down). Blocks of R rows away from sequence edges take a path without lookups;
  state slots, final-state gradients, sequence edges and rows past the data take a generic path.
  fp32 ``dweight``/``dbias`` partials stay in registers, are written once per program and summed by
  torch (deterministic, no atomics). No host read of ``cu_seqlens`` in the backward (the kernels read
  ``cu_seqlens[N]`` on device).
- varlen: chunks ignore sequence boundaries (2100 sequences of 1-3 tokens cost the same as one long
  one); rows find their sequence in a per-token int32 table built with ``torch.searchsorted`` on device.
- state kernels: one program per (sequence, channel tile) for ``final_state`` and ``d initial_state``.
- tiling: :data:`TUNE` (per direction) through :func:`_plan`; the stream length CS is a runtime
  argument (no recompilation per shape). Results do not depend on the tiling except for the fp32
  summation order of ``dweight``/``dbias`` (deterministic for a given tiling).
"""
from __future__ import annotations

import math
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
    cu = cu_seqlens.to(x.device).contiguous()  # the kernels index it as a flat array
    seq = (torch.searchsorted(cu.to(torch.int64), torch.arange(T, device=x.device), right=True) - 1).to(torch.int32)
    return True, N, cu, seq, N


#: streaming-kernel tiling per direction: ``vec`` channels per thread (capped at 16 bytes; halved for
#: W > 4 to bound the register windows), ``warps`` per program, ``r`` rows unrolled per block (their
#: loads are issued together; at most 4 for W > 4, where 8 spills), ``maxnreg`` registers per thread
#: (None: the compiler's choice; 128 keeps four 4-warp programs per SM; ``maxnreg_edges`` applies when an
#: initial state or a final-state gradient adds the slot loads, which need more), ``programs_per_sm``: the
#: stream length CS is chosen so that the grid has about this many programs per SM (a power of two in
#: [r, cs_max]).
#: Values: the fastest of benchmarks/tune_conv.py on the H200 (B4 T4096 D8192 W4 bf16; 2026-12-02, with the
#: MUFU sigmoid): forward 0.1475 ms (89% of a same-run copy), backward 0.277 ms (71%).
TUNE = {
    "fwd": {"vec": 8, "warps": 8, "r": 8, "maxnreg": None, "maxnreg_edges": None, "programs_per_sm": 4,
            "cs_max": 1024},
    "bwd": {"vec": 4, "warps": 4, "r": 4, "maxnreg": 128, "maxnreg_edges": 168, "programs_per_sm": 4,
            "cs_max": 1024},
}


def _plan(kind: str, B: int, T: int, D: int, W: int, elem_size: int, device: torch.device, edges: bool = False):
    """Tiling of a streaming kernel: ``(BD, G, CS, R, n_ct, launch options)``: channels per program (at
    most one warp wide), streams per program (a stream per warp row: more streams for narrow D), rows
    per stream (a multiple of R), rows unrolled per block, chunks of G*CS rows per batch row,
    ``num_warps``/``maxnreg``. ``edges``: an initial state or a final-state gradient is read."""
    cfg = TUNE[kind]
    vec = max(1, min(cfg["vec"], 16 // elem_size))
    r = cfg["r"]
    if W > 4:  # wider windows: fewer registers per window row, fewer unrolled rows (R 8 spills)
        vec, r = max(1, vec // 2), min(r, 4)
    warps = cfg["warps"]
    bd = min(max(16, tu.next_power_of_2(D)), 32 * vec)
    g = max(1, warps * 32 * vec // bd)
    chunks = max(1, tu.cdiv(cfg["programs_per_sm"] * tu.num_sms(device), tu.cdiv(D, bd)))
    cs = tu.cdiv(max(1, B * T), chunks * g)
    cs = min(max(r, 1 << max(0, round(math.log2(cs)))), cfg["cs_max"], tu.cdiv(tu.cdiv(max(T, 1), g), r) * r)
    cs = tu.cdiv(cs, r) * r
    opts = {"num_warps": warps}
    maxnreg = cfg.get("maxnreg_edges" if edges else "maxnreg")
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return bd, g, cs, r, tu.cdiv(T, g * cs), opts


def _slot_rows(t: Optional[torch.Tensor]):
    """(tensor, (stride_n, stride_d, stride_w)) of an [N, D, W] state or state gradient as the streaming
    kernels read it: a [N, W, D] copy with unit channel stride (tiny), so a slot reads like a row of x."""
    if t is None:
        return None, (0, 0, 0)
    r = t.transpose(1, 2).contiguous()
    return r, (r.stride(0), r.stride(2), r.stride(1))


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
        bd, g, cs, r, n_ct, opts = _plan("fwd", B, T, D, W, xk.element_size(), x.device, sk is not None)
        st, st_str = _slot_rows(sk)
        causal_conv1d_fwd_kernel[(B * n_ct, tu.cdiv(D, bd))](
            xk, wk, dummy if bk is None else bk, dummy if rk is None else rk, dummy if st is None else st, y,
            dummy if cu is None else cu, dummy if seq is None else seq, T, total, D, n_ct,
            xk.stride(0), xk.stride(1), wk.stride(0), wk.stride(1),
            rk.stride(0) if rk is not None else 0, rk.stride(1) if rk is not None else 0, *st_str, cs,
            W=W, SILU=silu, HAS_BIAS=bk is not None, HAS_RES=rk is not None, HAS_STATE=sk is not None,
            VARLEN=varlen, G=g, R=r, BD=bd, **opts)
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
    if rows and D:
        bd, g, cs, r, n_ct, opts = _plan("bwd", B, T, D, W, xk.element_size(), x.device,
                                          sk is not None or dfk is not None)
        part = torch.empty(B * n_ct, W + 1, D, dtype=torch.float32, device=x.device)  # dweight rows, dbias
        st, st_str = _slot_rows(sk)
        ft, ft_str = _slot_rows(dfk)
        causal_conv1d_bwd_kernel[(B * n_ct, tu.cdiv(D, bd))](
            xk, wk, bias_arg, dummy if st is None else st, dyk, dummy if ft is None else ft, dx, part,
            cu_arg, dummy if seq is None else seq, T, total, D, n_ct, xk.stride(0), xk.stride(1), wk.stride(0),
            wk.stride(1), *st_str, *dyk.stride(), *ft_str, cs, HAS_STATE=sk is not None, G=g, R=r, BD=bd,
            **opts, **{k: v for k, v in common.items() if k != "WP"})
        dw, db = part[:, :W].sum(0), part[:, W].sum(0)  # separate tensors: op outputs must not alias
    else:
        dw = torch.zeros(W, D, dtype=torch.float32, device=x.device)
        db = torch.zeros(D, dtype=torch.float32, device=x.device)
        if rows:
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
