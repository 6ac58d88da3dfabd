"""Host launchers for ``fused_cross_entropy_loss`` (SPEC 1.7): argument checks, row layouts, grids.

Forward reads the logits once (one program per row); backward reads them once more and writes the
gradient once (grid ``rows × column blocks``). Nothing of size ``[N, V]`` is allocated besides the
gradient itself (none at all with ``inplace_backward``).
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from ... import triton_utils as tu
from ..common import unit_last_stride
from ...validation import (FLOAT_DTYPES, INDEX_DTYPES, check_choice, check_same_device, check_tensor,
                           reject_float64, shape_str)

OP = "fused_cross_entropy_loss"
REDUCTIONS = ("mean", "sum", "none")
WEIGHT_DTYPES = FLOAT_DTYPES + (torch.float64,)


def check_options(op: str, ignore_index, reduction: str, label_smoothing: float, lse_square_scale: float,
                  softcap: Optional[float]) -> None:
    """Scalar options shared with chunk_loss (``ValueError`` naming the option)."""
    check_choice(op, "reduction", reduction, REDUCTIONS)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{op}: ignore_index must be an int, got {type(ignore_index).__name__}")
    # numbers.Real: numpy scalars too (np.float32(0.1) was refused as "must be in [0, 1], got 0.1")
    if not (isinstance(label_smoothing, numbers.Real) and 0.0 <= label_smoothing <= 1.0):
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    # comparisons, not math.isfinite: under torch.compile(dynamic=True) the floats may be symbolic
    if not (isinstance(lse_square_scale, numbers.Real) and 0.0 <= lse_square_scale < math.inf):
        raise ValueError(f"{op}: lse_square_scale must be a finite number >= 0, got {lse_square_scale!r}")
    if softcap is not None and not (isinstance(softcap, numbers.Real) and softcap > 0):
        raise ValueError(f"{op}: softcap must be None or a number > 0, got {softcap!r}")


def norm_softcap(softcap) -> Optional[float]:
    """``None`` for no capping (``None`` or ``+inf``), else the float."""
    return None if softcap is None or softcap == math.inf else float(softcap)


def check_rows(op: str, lead, labels: torch.Tensor, loss_weight: Optional[torch.Tensor], lead_desc: str) -> None:
    """``labels`` (int32/int64) and ``loss_weight`` (any float) of shape ``lead``."""
    check_tensor(op, "labels", labels, dtypes=INDEX_DTYPES, shape=tuple(lead), shape_desc=lead_desc)
    if loss_weight is not None:
        check_tensor(op, "loss_weight", loss_weight, dtypes=WEIGHT_DTYPES, shape=tuple(lead), shape_desc=lead_desc)


def check_args(logits: torch.Tensor, labels: torch.Tensor, loss_weight: Optional[torch.Tensor], ignore_index,
               reduction: str, label_smoothing: float, lse_square_scale: float, softcap: Optional[float]) -> None:
    """Validate the arguments (also on fake tensors under torch.compile)."""
    reject_float64(OP, logits=logits)
    check_tensor(OP, "logits", logits, min_ndim=1)
    if logits.shape[-1] < 1:
        raise ValueError(f"{OP}: logits' last dim (the vocabulary V) must be >= 1, got shape {shape_str(logits.shape)}")
    check_rows(OP, logits.shape[:-1], labels, loss_weight, "logits.shape[:-1]")
    check_same_device(OP, logits=logits, labels=labels, loss_weight=loss_weight)
    check_options(OP, ignore_index, reduction, label_smoothing, lse_square_scale, softcap)


def check_inplace(logits: torch.Tensor) -> None:
    """``inplace_backward=True`` writes one gradient element per logit into ``logits``' storage: a tensor
    whose elements share memory (an ``expand``-ed / stride-0 view) cannot hold it (``ValueError``, as
    PyTorch's own in-place ops refuse such tensors) instead of a silently wrong gradient."""
    if any(st == 0 and sz > 1 for sz, st in zip(logits.shape, logits.stride())):  # traceable by dynamo
        raise ValueError(f"{OP}: inplace_backward=True needs logits whose elements do not share memory, got "
                         f"shape {shape_str(logits.shape)} with strides {list(logits.stride())} (an expanded view?); "
                         "pass a contiguous copy or use inplace_backward=False")


# ---------------------------------------------------------------------------------------------
# layouts and tiles


def row_layout(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """``x [..., V]`` as (tensor, rows_inner, stride_outer, stride_inner): row ``r`` starts at element
    ``(r // rows_inner)·stride_outer + (r % rows_inner)·stride_inner`` of the returned tensor.

    Views whose leading dims collapse to at most two strided levels (``x[:, :-1, :]`` of ``[B, T, V]``,
    row slices, padded rows) are used in place; anything else, or a last dim with stride != 1, is
    copied to a contiguous tensor.
    """
    V = x.shape[-1]
    x = unit_last_stride(x)
    dims = [(s, st) for s, st in zip(x.shape[:-1], x.stride()[:-1]) if s != 1]
    merged: list[list[int]] = []
    for s, st in dims:
        if merged and merged[-1][1] == st * s:
            merged[-1] = [merged[-1][0] * s, st]
        else:
            merged.append([s, st])
    if not merged:
        return x, 1, 0, 0
    if len(merged) == 1:
        return x, max(merged[0][0], 1), 0, merged[0][1]
    if len(merged) == 2:
        return x, merged[1][0], merged[0][1], merged[1][1]
    x = x.contiguous()
    return x, max(x.numel() // max(V, 1), 1), 0, V


def fwd_block(V: int, dtype: torch.dtype) -> tuple[int, int]:
    """(BLOCK, num_warps) of the row kernel: fixed per (V, dtype) so that the reduction order, hence every
    bit of the result, does not depend on the number of rows or on tuning (SPEC 0.6). The same on CPU
    (interpreter) and GPU, so the compile-only check sees the GPU tiles. Tuning knob for the H200."""
    # H200 sweep (benchmarks/tune_ce.py, [8192, 151936] bf16): 4096 x 4 warps 0.690 ms (85% of copy),
    # 2048 x 4 0.699, 8192 x 8 0.735, 8192 x 16 0.912: small programs, many resident per SM, hide latency
    # best (the per-block cross-warp max/sum is the serial part).
    # fp32 rows (chunk_loss's logits) keep 4096 x 8 warps: not swept yet.
    block = min(tu.next_power_of_2(V), 4096)
    return block, (4 if dtype.itemsize <= 2 else 8 if block >= 2048 else 4)


def bwd_block(V: int) -> tuple[int, int]:
    """(BLOCK, num_warps) of the element-wise gradient kernel (same on CPU and GPU; tuning knob)."""
    block = min(tu.next_power_of_2(V), 4096)
    return block, (8 if block >= 2048 else 4)


def _flags(bias, loss_weight, label_smoothing, lse_square_scale, softcap) -> dict:
    return dict(HAS_BIAS=bias is not None, HAS_WEIGHT=loss_weight is not None, HAS_SMOOTHING=label_smoothing > 0,
                HAS_ZLOSS=lse_square_scale > 0, HAS_SOFTCAP=softcap is not None)


def _scalars(softcap: Optional[float]) -> tuple[float, float]:
    return (float(softcap), 1.0 / float(softcap)) if softcap is not None else (1.0, 1.0)


def flat_rows(labels: torch.Tensor, loss_weight: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Labels as a contiguous 1-D int tensor and the weights as contiguous fp32 (both tiny)."""
    lab = labels.reshape(-1).contiguous()
    w = None if loss_weight is None else loss_weight.detach().reshape(-1).to(torch.float32).contiguous()
    return lab, w


# ---------------------------------------------------------------------------------------------
# kernel launches (also used by chunk_loss)


def launch_fwd(x: torch.Tensor, layout: tuple[int, int, int], n_rows: int, V: int, labels: torch.Tensor,
               loss_weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], loss: torch.Tensor,
               lse: torch.Tensor, ignore_index: int, label_smoothing: float, lse_square_scale: float,
               softcap: Optional[float], dx: Optional[torch.Tensor] = None, scale: Optional[torch.Tensor] = None,
               block: Optional[tuple[int, int]] = None) -> None:
    """Run :func:`ce_fwd_kernel` over ``n_rows`` rows; with ``dx`` (contiguous rows) also the gradient
    scaled by ``loss_weight·scale`` (``scale``: a 1-element fp32 tensor, read with stride 0)."""
    from .triton_kernels import ce_fwd_kernel

    if n_rows == 0:
        return
    rows_inner, s_outer, s_inner = layout
    BLOCK, nw = block or fwd_block(V, x.dtype)
    cap, inv_cap = _scalars(softcap)
    write = dx is not None
    ce_fwd_kernel[(n_rows,)](
        x, bias if bias is not None else x, labels, loss_weight if loss_weight is not None else loss,
        scale if write else loss, loss, lse, dx if write else loss,
        V, rows_inner, s_outer, s_inner, 0, dx.stride(0) if write else 0, int(ignore_index),
        float(label_smoothing), float(lse_square_scale), cap, inv_cap,
        WRITE_GRAD=write, BLOCK=BLOCK, num_warps=nw,
        **_flags(bias, loss_weight, label_smoothing, lse_square_scale, softcap))


def launch_bwd(x: torch.Tensor, layout: tuple[int, int, int], dx: torch.Tensor, dx_layout: tuple[int, int, int],
               n_rows: int, V: int, labels: torch.Tensor, loss_weight: Optional[torch.Tensor],
               bias: Optional[torch.Tensor], grad: torch.Tensor, lse: torch.Tensor, ignore_index: int,
               label_smoothing: float, lse_square_scale: float, softcap: Optional[float]) -> None:
    """Run :func:`ce_bwd_kernel`: ``dx`` rows from ``x`` rows, ``lse`` and the per-row scale
    ``grad[i]·loss_weight[i]`` (``grad`` 1-D, any stride, 0 included)."""
    from .triton_kernels import ce_bwd_kernel

    if n_rows == 0:
        return
    BLOCK, nw = bwd_block(V)
    cap, inv_cap = _scalars(softcap)
    ce_bwd_kernel[(n_rows, tu.cdiv(V, BLOCK))](
        x, bias if bias is not None else x, labels, loss_weight if loss_weight is not None else lse, grad, lse, dx,
        V, *layout, *dx_layout, grad.stride(0), int(ignore_index), float(label_smoothing),
        float(lse_square_scale), cap, inv_cap, BLOCK=BLOCK, num_warps=nw,
        **_flags(bias, loss_weight, label_smoothing, lse_square_scale, softcap))


# ---------------------------------------------------------------------------------------------
# operator entry points (the "triton" backend of fused_cross_entropy_loss)


def forward(logits: torch.Tensor, labels: torch.Tensor, loss_weight: Optional[torch.Tensor], ignore_index: int,
            label_smoothing: float, lse_square_scale: float,
            softcap: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(``w_i·ℓ_i``, ``lse_i``), fp32, shape ``logits.shape[:-1]``."""
    lead, V = logits.shape[:-1], logits.shape[-1]
    x, *layout = row_layout(tu.kernel_input(logits))
    lab, w = flat_rows(labels, loss_weight)
    n = lab.numel()
    loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)
    launch_fwd(x, tuple(layout), n, V, lab, w, None, loss, lse, ignore_index, label_smoothing, lse_square_scale,
               softcap)
    return loss.view(lead), lse.view(lead)


def _grad_rows(grad: torch.Tensor, n: int) -> torch.Tensor:
    g = grad.reshape(-1)  # a view for contiguous and expanded (stride-0) gradients, a copy otherwise
    return g if g.numel() == n else g.expand(n)


def backward(grad: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor,
             loss_weight: Optional[torch.Tensor], ignore_index: int, label_smoothing: float, lse_square_scale: float,
             softcap: Optional[float]) -> torch.Tensor:
    """dlogits (a new contiguous tensor in ``logits.dtype``) for the per-row upstream gradient ``grad``."""
    V = logits.shape[-1]
    x, *layout = row_layout(tu.kernel_input(logits))
    lab, w = flat_rows(labels, loss_weight)
    n = lab.numel()
    dx = torch.empty(logits.shape, dtype=tu.kernel_dtype(logits.dtype), device=logits.device)
    launch_bwd(x, tuple(layout), dx, (max(n, 1), 0, V), n, V, lab, w, None, _grad_rows(grad, n),
               lse.reshape(-1), ignore_index, label_smoothing, lse_square_scale, softcap)
    return tu.finish(dx, logits.dtype)


def backward_inplace(grad: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor,
                     loss_weight: Optional[torch.Tensor], ignore_index: int, label_smoothing: float,
                     lse_square_scale: float, softcap: Optional[float]) -> None:
    """Write dlogits into ``logits``' own storage (``inplace_backward=True``)."""
    V = logits.shape[-1]
    xk = tu.kernel_input(logits)
    x, *layout = row_layout(xk)
    lab, w = flat_rows(labels, loss_weight)
    n = lab.numel()
    launch_bwd(x, tuple(layout), x, tuple(layout), n, V, lab, w, None, _grad_rows(grad, n), lse.reshape(-1),
               ignore_index, label_smoothing, lse_square_scale, softcap)
    if x.data_ptr() != logits.data_ptr():  # the kernel wrote into a copy (interpreter bf16, odd layout)
        logits.copy_(x)
