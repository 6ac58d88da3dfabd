"""Host launchers of ``l2norm`` (SPEC 1.1): argument checks and calls into the shared row kernels
(``rms_norm.rows_forward`` / ``rows_backward`` with ``inv_n = 1``: ``r = 1/sqrt(Σx² + eps)``)."""
from __future__ import annotations

from typing import Optional

import torch

from ... import triton_utils as tu
from ...validation import check_tensor, reject_float64, shape_str
from ..common import rows_2d
from .rms_norm import check_eps, check_out_dtype, check_x, rows_backward, rows_forward, rows_forward_pair

OP = "l2norm"


def check_args(x: torch.Tensor, eps: float, output_dtype: Optional[torch.dtype]) -> int:
    """Validate the forward arguments (also on fake tensors); returns ``D``."""
    D = check_x(OP, x)
    check_eps(OP, eps)
    check_out_dtype(OP, "output_dtype", output_dtype)
    return D


def check_bwd_args(y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, dx_dtype: Optional[torch.dtype]) -> None:
    """Validate ``l2norm_bwd(y, rstd, dy)``: ``y``, ``dy`` ``[..., D]`` alike, ``rstd`` ``y.shape[:-1]`` fp32."""
    op = "l2norm_bwd"
    reject_float64(op, y=y, dy=dy)
    check_tensor(op, "y", y, min_ndim=1)
    if y.shape[-1] < 1:
        raise ValueError(f"{op}: y's last dim D must be >= 1, got shape {shape_str(y.shape)}")
    check_tensor(op, "dy", dy, shape=tuple(y.shape), shape_desc="y.shape", device=y.device)
    check_tensor(op, "rstd", rstd, dtypes=(torch.float32,), shape=tuple(y.shape[:-1]), shape_desc="y.shape[:-1]",
                 device=y.device)
    check_out_dtype(op, "dx_dtype", dx_dtype)


def forward(x: torch.Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None):
    """``(y [..., D] in output_dtype or x.dtype, rstd x.shape[:-1] fp32)``."""
    check_args(x, eps, output_dtype)
    x2 = rows_2d(tu.kernel_input(x))
    y, rstd = rows_forward(x2, None, inv_n=1.0, eps=eps, y_dtype=output_dtype or x.dtype, rstd_dtype=torch.float32)
    return y.view(x.shape), rstd.view(x.shape[:-1])


def forward_pair(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6, write: bool = True) -> tuple:
    """``(q̂, k̂, q_rstd, k_rstd)`` of two tensors of one shape and dtype in one launch (GDN/KDA's in-kernel
    l2norm; :func:`forward`'s shapes); ``write=False``: ``(None, None, q_rstd, k_rstd)``, the normalized rows never
    written (the launch reads q and k only). Bitwise :func:`forward` of each. Internal: the ops validated q and k
    under their own names already. Two launches where one cannot serve both (different shapes or dtypes, rows longer
    than the tile kernel's, D = 1: ``rms_norm.rows_forward_pair``)."""
    check_args(q, eps, None)
    check_args(k, eps, None)
    q2, k2 = rows_2d(tu.kernel_input(q)), rows_2d(tu.kernel_input(k))
    if q.dtype == k.dtype:
        (qn, rq), (kn, rk) = rows_forward_pair(q2, k2, inv_n=1.0, eps=eps, y_dtype=q.dtype if write else None,
                                               rstd_dtype=torch.float32)
    else:  # each in its own dtype (rows_forward_pair writes one)
        (qn, rq), (kn, rk) = (rows_forward(x2, None, inv_n=1.0, eps=eps, y_dtype=x.dtype if write else None,
                                           rstd_dtype=torch.float32) for x, x2 in ((q, q2), (k, k2)))
    if write:
        qn, kn = qn.view(q.shape), kn.view(k.shape)
    return qn, kn, rq.view(q.shape[:-1]), rk.view(k.shape[:-1])


def backward(x_or_y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, eps: float = 1e-6,
             normalized: bool = False, dx_dtype: Optional[torch.dtype] = None, dy_group: int = 1) -> torch.Tensor:
    """``dx = rstd·(dy − ŷ·Σ_d dy·ŷ)``.

    ``normalized=False``: ``x_or_y`` is ``x`` and ``ŷ = x·rstd`` is recomputed in fp32 (the autograd
    path); ``normalized=True``: it is the forward output ``y`` (``l2norm_bwd``). ``dx`` is in
    ``dx_dtype`` (default: the dtype of ``x_or_y``). ``dy_group = G > 1`` (internal, GVA): ``x_or_y`` is
    ``[..., H, D]`` and ``dy`` ``[..., H·G, D]``, each row's gradient the fp32 sum of its ``G`` consecutive
    heads (``gdn.common.fold_value_heads``), added as the rows are read.
    """
    D = x_or_y.shape[-1]
    x2 = rows_2d(tu.kernel_input(x_or_y))
    N = x2.shape[0]
    dy2 = tu.kernel_input(dy).reshape(N, dy_group, D) if dy_group > 1 else tu.kernel_input(dy).reshape(N, D)
    r = rstd.reshape(N).float().contiguous()
    dx, _ = rows_backward(x2, dy2, None, inv_n=1.0, eps=eps, rstd=r, x_is_normalized=normalized,
                          dx_dtype=dx_dtype or x_or_y.dtype)
    return dx.view(x_or_y.shape)
