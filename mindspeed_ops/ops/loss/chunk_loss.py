"""Host launchers for ``chunk_loss`` (SPEC 1.8): fused LM head + cross-entropy, chunk by chunk.

Per chunk of ``r`` rows: ``logits = hidden_chunk @ Wᵀ`` by cuBLAS in the compute dtype with an fp32
output, then one row kernel (:func:`ce_fwd_kernel`) that computes ``lse`` and the loss and, when
gradients are wanted, writes the chunk's ``dlogits`` (``G``) in the compute dtype. The gradient
products ``dhidden = G·W``, ``dweight = Gᵀ·hidden`` and ``dbias = Σ_rows G`` run once per *group* of
chunks: the rows of ``G`` are collected in a group buffer so that the ``dweight`` product has a deep
``K`` and the fp32 ``dweight`` accumulator is read and written once per group, not once per chunk.

Group size (the memory plan, SPEC 1.8 bound ``2·r·V·4 + V·Hd·4`` bytes beyond inputs/outputs/grads):
- if ``G`` for all ``N`` rows fits in that bound next to one fp32 chunk of logits, one group: ``dweight``
  is a single GEMM over all rows (fp32 accumulation inside the GEMM, one rounding), no accumulator;
- else groups of ``Kg`` rows (a multiple of ``r``) sized to what the bound leaves beside the
  ``accum_dtype`` accumulator (``Kg = 2r`` for bf16 with an fp32 accumulator).

``mean``/``sum``: everything runs in forward with the row scale ``w_i`` (gradients of ``Σ w_i·ℓ_i``), times
``1/Σw`` for ``mean`` in bf16/fp32 (:func:`folds_mean`); backward only multiplies the saved gradients by the
0-dim ``g`` (``g/Σw`` for an fp16 ``mean``), in place where autograd frees them afterwards (:func:`scale_`).
``none``: forward computes the loss only; backward recomputes each chunk's logits and folds the
per-token upstream gradient into ``G``.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import FLOAT_DTYPES, check_same_device, check_tensor, reject_float64, shape_str
from ..common import autocast_off
from . import cross_entropy as ce
from . import reference as _ref

OP = "chunk_loss"
_HALF = (torch.float16, torch.bfloat16)
_MARGIN = 32 << 20  # of the bound's 64 MiB slack, kept for small temporaries and the GEMM workspace


def check_args(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: Optional[torch.Tensor],
               loss_weight: Optional[torch.Tensor], ignore_index, reduction: str, label_smoothing: float,
               lse_square_scale: float, softcap: Optional[float], chunk_size: Optional[int],
               accum_dtype: Optional[torch.dtype]) -> tuple[int, int, int]:
    """Validate the arguments (also on fake tensors under torch.compile); returns ``(N, Hd, V)``."""
    reject_float64(OP, hidden=hidden, weight=weight, bias=bias)
    check_tensor(OP, "hidden", hidden, min_ndim=1)
    check_tensor(OP, "weight", weight, ndim=2)
    Hd, V = hidden.shape[-1], weight.shape[0]
    if weight.shape[1] != Hd:
        raise ValueError(f"{OP}: weight must have shape [V, Hd] = [{V}, {Hd}] (hidden-first order: "
                         f"chunk_loss(hidden, weight, labels)), got {shape_str(weight.shape)}")
    if V < 1:
        raise ValueError(f"{OP}: weight must have at least one row (the vocabulary V), got {shape_str(weight.shape)}")
    if bias is not None:
        check_tensor(OP, "bias", bias, shape=(V,), shape_desc="[V]")
    ce.check_rows(OP, hidden.shape[:-1], labels, loss_weight, "hidden.shape[:-1]")
    check_same_device(OP, hidden=hidden, weight=weight, labels=labels, bias=bias, loss_weight=loss_weight)
    ce.check_options(OP, ignore_index, reduction, label_smoothing, lse_square_scale, softcap)
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError(f"{OP}: chunk_size must be None or a positive int, got {chunk_size!r}")
    if accum_dtype is not None and accum_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{OP}: accum_dtype must be None or one of float32/float16/bfloat16, got {accum_dtype}")
    n = 1
    for s in hidden.shape[:-1]:
        n *= s
    return n, Hd, V


def resolve_chunk_size(N: int, V: int, Hd: int, chunk_size: Optional[int]) -> int:
    """``chunk_size`` or the default: the largest power of two ``r`` with ``r·V <= N·Hd``, clamped to
    ``[min(N, 256), N]`` (at least 1)."""
    if chunk_size is not None:
        return int(chunk_size)
    ratio = (N * Hd) // max(V, 1)
    r = 1 << (ratio.bit_length() - 1) if ratio >= 1 else 1
    return max(1, min(max(r, min(N, 256)), N))


def group_rows(N: int, V: int, Hd: int, r: int, g_size: int, acc_size: int) -> int:
    """Rows per gradient group (see the module docstring). ``g_size``: bytes per element of the ``G``
    buffer; ``acc_size``: bytes per element of a separate ``dweight`` accumulator (0 if none)."""
    budget = 2 * r * V * 4 + V * Hd * 4
    budget -= min(_MARGIN, budget // 16)
    logits = min(r, N) * V * 4
    if N * V * g_size + logits <= budget:
        return max(N, 1)
    kg = (budget - V * Hd * acc_size - logits) // (V * g_size)
    return max(1, min(N, max(r, kg // r * r)))


# ---------------------------------------------------------------------------------------------
# matrix products with fp32 accumulation (cuBLAS in the compute dtype; fp32 emulation on CPU)

_PROBES: dict = {}


def _half_fp32_gemm(device: torch.device) -> tuple[bool, bool]:
    """(``mm(..., out_dtype=fp32)`` works, in-place ``addmm(..., out_dtype=fp32, out=acc)`` works) for
    fp16/bf16 operands on ``device`` (probed once; PyTorch >= 2.8 has both on CUDA)."""
    key = (device.type, device.index)
    if key not in _PROBES:
        mm_ok = addmm_ok = False
        try:
            for dt in _HALF:
                a = torch.randn(64, 32, device=device).to(dt)
                b = torch.randn(32, 48, device=device).to(dt)
                want = a.float() @ b.float()
                c = torch.mm(a, b, out_dtype=torch.float32)
                mm_ok = c.dtype == torch.float32 and torch.allclose(c, want, rtol=1e-4, atol=1e-4)
                if not mm_ok:
                    break
            if mm_ok:
                acc = torch.ones(64, 48, device=device)
                torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
                addmm_ok = torch.allclose(acc, want + 1, rtol=1e-4, atol=1e-4)
        except Exception:  # noqa: BLE001 - any failure means "not supported here"
            pass
        _PROBES[key] = (mm_ok, addmm_ok)
        if device.type == "cuda" and not mm_ok:
            warnings.warn(f"{OP}: this PyTorch has no fp32-output fp16/bf16 GEMM (torch.mm(out_dtype=...)); "
                          "chunk logits are rounded to the compute dtype before the fp32 loss", RuntimeWarning)
    return _PROBES[key]


def mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a @ b`` accumulated in fp32 and rounded once to ``out_dtype`` (written into ``out`` if given)."""
    if a.device.type == "cuda":
        if out_dtype == a.dtype:
            return torch.mm(a, b, out=out) if out is not None else torch.mm(a, b)
        if out_dtype == torch.float32 and a.dtype in _HALF and _half_fp32_gemm(a.device)[0]:
            res = torch.mm(a, b, out_dtype=torch.float32)
        else:
            res = torch.mm(a, b).to(out_dtype)
    else:  # CPU (interpreter tests): fp32 products of the compute-dtype operands
        res = torch.mm(a.float(), b.float()).to(out_dtype)
    if out is None:
        return res
    out.copy_(res)
    return out


def addmm_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with fp32 products, one rounding to ``acc.dtype`` per call."""
    if a.device.type == "cuda":
        if acc.dtype == a.dtype:
            acc.addmm_(a, b)
            return
        if acc.dtype == torch.float32 and a.dtype in _HALF and _half_fp32_gemm(a.device)[1]:
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            return
    # row slices keep the fp32 temporary <= 64 MiB
    step = max(1, (64 << 20) // (4 * max(acc.shape[1], 1)))
    bf = b if b.dtype == torch.float32 else b.float()
    for s in range(0, acc.shape[0], step):
        part = mm(a[s:s + step], b, torch.float32) if a.device.type == "cuda" else a[s:s + step].float() @ bf
        acc[s:s + step] = (acc[s:s + step].float() + part).to(acc.dtype)


# ---------------------------------------------------------------------------------------------
# the sweep over chunks


def ce_block(V: int) -> tuple[int, int]:
    """(BLOCK, num_warps) of the row kernel over a chunk's fp32 logits; fixed per ``V`` (SPEC 0.6).

    A chunk has few rows (one program each, 256 at the target shape), so each program needs many bytes in
    flight. H200 sweep, [256, 151936] fp32 with dlogits (nineteenth session, proto in docs/benchmarks/s19):
    8192 x 8 warps 104 µs, 8192 x 16 103, 4096 x 8 117, 2048 x 4 160. Reading each logit once instead (one
    program per block of a row, kept in registers while it waits for the rest of its row: s19/split_rows_kernel.patch)
    measured slower, 105.8 µs at best vs 102.2 in the same run."""
    block = min(tu.next_power_of_2(V), 8192)
    return block, (8 if block >= 2048 else 4)


def folds_mean(reduction: str, compute_dtype: torch.dtype) -> bool:
    """Whether the forward's gradients already carry ``1/Σw`` (``mean``), so that backward multiplies by the
    upstream gradient alone, usually exactly 1 (nothing to do). Not for fp16, whose dlogits ``p·w/Σw`` would
    fall below its normal range (bf16 and fp32 have fp32's exponent range)."""
    return reduction == "mean" and compute_dtype != torch.float16


def _sweep(hidden, weight, labels, bias, loss_weight, ignore_index, label_smoothing, lse_square_scale, softcap,
           r, compute_dtype, accum_dtype, need_dh, need_dw, need_db, *, loss_rows=None, lse=None, scale=None,
           grad=None):
    """One pass over the chunks. Forward (``grad is None``): fills ``loss_rows``/``lse`` and, if any
    ``need_*``, the gradients scaled by ``loss_weight·scale``. Backward (``grad`` given, ``lse`` known):
    the gradients for the per-row upstream gradient ``grad``. Returns ``(dh, dw, db)`` (None if not needed)."""
    N, Hd = hidden.shape
    V = weight.shape[0]
    dev = hidden.device
    h = hidden if hidden.dtype == compute_dtype else hidden.to(compute_dtype)
    W = weight if weight.dtype == compute_dtype else weight.to(compute_dtype)
    if dev.type != "cuda":  # CPU (interpreter): the fp32 products of the rounded operands, upcast once
        h, W = h.float(), W.float()
    Wt = W.t()
    b32 = None if bias is None else bias.detach().to(torch.float32).contiguous()
    lab, w = ce.flat_rows(labels, loss_weight)
    opts = (ignore_index, label_smoothing, lse_square_scale, softcap)
    want = need_dh or need_dw or need_db
    r = max(1, min(r, max(N, 1)))
    block = ce_block(V)

    dh = dw = db = acc = db_acc = gbuf = None
    kg = max(N, 1)
    if want:
        gdt = tu.kernel_dtype(compute_dtype)
        acc_dtype = accum_dtype or weight.dtype
        acc_size = acc_dtype.itemsize if need_dw and acc_dtype != weight.dtype else 0
        kg = group_rows(N, V, Hd, r, torch.empty(0, dtype=compute_dtype).element_size(), acc_size)
        gbuf = torch.empty(min(kg, N), V, dtype=gdt, device=dev)
        if need_dh:
            dh = torch.empty(N, Hd, dtype=hidden.dtype, device=dev)
        if need_dw and kg < N:
            acc = torch.zeros(V, Hd, dtype=acc_dtype, device=dev)
        if need_db:
            db_acc = torch.zeros(V, dtype=torch.float32, device=dev)

    for g0 in range(0, N, kg):
        g1 = min(N, g0 + kg)
        for c0 in range(g0, g1, r):
            c1 = min(g1, c0 + r)
            n = c1 - c0
            logits = mm(h[c0:c1], Wt, torch.float32)
            layout = (n, 0, V)
            rows_w = None if w is None else w[c0:c1]
            if grad is None:
                ce.launch_fwd(logits, layout, n, V, lab[c0:c1], rows_w, b32, loss_rows[c0:c1], lse[c0:c1], *opts,
                              dx=gbuf[c0 - g0:c1 - g0] if want else None, scale=scale, block=block)
            else:
                ce.launch_bwd(logits, layout, gbuf[c0 - g0:c1 - g0], layout, n, V, lab[c0:c1], rows_w, b32,
                              grad[c0:c1], lse[c0:c1], *opts)
            del logits
        if not want:
            continue
        G = tu.finish(gbuf[:g1 - g0], compute_dtype)
        if need_dh:
            mm(G, W, hidden.dtype, out=dh[g0:g1])
        if need_dw:
            if acc is None:  # one group: a single GEMM over all rows, fp32 accumulation inside it
                dw = mm(G.t(), h[g0:g1], weight.dtype)
            else:
                addmm_(acc, G.t(), h[g0:g1])
        if need_db:
            db_acc += G.sum(0, dtype=torch.float32)
        del G
    if acc is not None:
        dw = acc.to(weight.dtype)
    elif need_dw and dw is None:  # no rows
        dw = torch.zeros(V, Hd, dtype=weight.dtype, device=dev)
    if db_acc is not None:
        db = db_acc.to(bias.dtype)
    return dh, dw, db


def _launch_scale(xk: torch.Tensor, s: torch.Tensor, y: torch.Tensor) -> None:
    from .triton_kernels import scale_kernel

    n = xk.numel()
    if n:
        block = 4096
        s32 = s.reshape(1).to(device=xk.device, dtype=torch.float32)  # a host scalar is accepted too
        # at most 2048 programs (of 4096 elements): enough to stream at copy speed on an H200 (132 SMs)
        scale_kernel[(min(tu.cdiv(n, block), 2048),)](xk, s32, y, n, IN_PLACE=y is xk, BLOCK=block, num_warps=8)


def scale(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``x·s`` for a 0-dim fp32 ``s`` on the device: fp32 product, one rounding to ``x.dtype`` (a bf16
    ``torch.mul`` on CUDA may round ``s`` to bf16 first). No host synchronisation."""
    xk = tu.kernel_input(x).contiguous()
    y = torch.empty(x.shape, dtype=tu.kernel_dtype(x.dtype), device=x.device)
    _launch_scale(xk, s, y)
    return tu.finish(y, x.dtype)


def scale_(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``x *= s`` in place (contiguous ``x``), as :func:`scale`; where ``s`` is exactly 1 on the device the
    kernel reads and writes nothing (the usual ``loss.backward()``), still without a host synchronisation."""
    if not x.is_contiguous():
        raise ValueError(f"{OP}: in-place scaling needs a contiguous tensor, got strides {tuple(x.stride())}")
    xk = tu.kernel_input(x)
    _launch_scale(xk, s, xk)
    if xk is not x:  # the interpreter's fp32 stand-in for bf16
        x.copy_(xk)
    return x


def safe_denominator(labels: torch.Tensor, loss_weight: Optional[torch.Tensor], ignore_index: int) -> torch.Tensor:
    """``Σ_valid w`` (fp32, 0-dim, on device, no sync), 1 where it is 0 (the empty-denominator decision)."""
    valid = labels.reshape(-1) != ignore_index
    if loss_weight is None:
        denom = valid.sum().to(torch.float32)
    else:
        # where, not a product: a non-finite weight on an ignored row must not reach the sum
        denom = torch.where(valid, loss_weight.detach().reshape(-1).to(torch.float32), 0.0).sum()
    return torch.where(denom == 0, torch.ones_like(denom), denom)


def forward(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: Optional[torch.Tensor],
            loss_weight: Optional[torch.Tensor], ignore_index: int, reduction: str, label_smoothing: float,
            lse_square_scale: float, softcap: Optional[float], chunk_size: int, compute_dtype: torch.dtype,
            accum_dtype: Optional[torch.dtype], need_dhidden: bool, need_dweight: bool, need_dbias: bool):
    """``hidden [N, Hd]`` → ``(loss, lse, dhidden, dweight, dbias)``; the gradients of the *sum* of the
    row losses ``Σ w_i·ℓ_i`` (of the mean where :func:`folds_mean`) only for ``mean``/``sum`` and only those
    asked for, else None."""
    N = hidden.shape[0]
    dev = hidden.device
    loss_rows = torch.empty(N, dtype=torch.float32, device=dev)
    lse = torch.empty(N, dtype=torch.float32, device=dev)
    pre = reduction != "none"
    need = (need_dhidden and pre, need_dweight and pre, need_dbias and pre and bias is not None)
    # the gradients are computed for the *sum* of the row losses (row scale w_i), times 1/Σw for a folded
    # mean (folds_mean); backward applies the rest: g (sum, folded mean) or g/Σw (fp16 mean)
    denom = safe_denominator(labels, loss_weight, ignore_index) if reduction == "mean" else None
    scale = None
    if any(need):
        scale = (1.0 / denom).reshape(1) if folds_mean(reduction, compute_dtype) \
            else torch.ones(1, dtype=torch.float32, device=dev)
    with autocast_off(dev.type):
        dh, dw, db = _sweep(hidden, weight, labels, bias, loss_weight, ignore_index, label_smoothing,
                            lse_square_scale, softcap, chunk_size, compute_dtype, accum_dtype, *need,
                            loss_rows=loss_rows, lse=lse, scale=scale)
    if reduction == "none":
        loss = loss_rows
    elif reduction == "sum":
        loss = loss_rows.sum()
    else:
        loss = loss_rows.sum() / denom
    return loss, lse, dh, dw, db


def backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
             bias: Optional[torch.Tensor], loss_weight: Optional[torch.Tensor], lse: torch.Tensor, ignore_index: int,
             label_smoothing: float, lse_square_scale: float, softcap: Optional[float], chunk_size: int,
             compute_dtype: torch.dtype, accum_dtype: Optional[torch.dtype], need_dhidden: bool, need_dweight: bool,
             need_dbias: bool):
    """Gradients for ``reduction='none'`` with the per-token upstream gradient ``grad [N]`` (recomputes
    each chunk's logits; never stores them). Returns ``(dhidden, dweight, dbias)``, None where not needed."""
    N = hidden.shape[0]
    g = grad.reshape(-1)
    if g.numel() != N:
        g = g.expand(N)
    with autocast_off(hidden.device.type):
        dh, dw, db = _sweep(hidden, weight, labels, bias, loss_weight, ignore_index, label_smoothing,
                            lse_square_scale, softcap, chunk_size, compute_dtype, accum_dtype, need_dhidden,
                            need_dweight, need_dbias and bias is not None, lse=lse.reshape(-1), grad=g)
    return dh, dw, db
