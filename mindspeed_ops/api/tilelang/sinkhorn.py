"""``sinkhorn`` at the TileLang path (SPEC 1.12.1, 2.1): the same contract as
:func:`mindspeed_ops.api.triton.sinkhorn.sinkhorn`, run by the TileLang kernels of
:mod:`mindspeed_ops.ops.mhc.tilelang_sinkhorn` (optional extra: ``pip install mindspeed-ops[tilelang]``).

Which kernels run:

* CUDA tensors, ``tilelang`` importable, eager mode: the TileLang forward and backward kernels, whatever
  the dispatcher's default for ``sinkhorn`` is.
* Otherwise (TileLang not installed or not importable, tensors not on CUDA): a ``UserWarning`` naming
  the reason, then the default dispatch of :func:`mindspeed_ops.ops.mhc.sinkhorn` (the Triton kernels
  on CUDA; on CPU the reference, or Triton under ``TRITON_INTERPRET=1``), the fallback SPEC 2.1
  documents.
* Under ``torch.compile``: the ``torch.ops.mindspeed_ops.sinkhorn`` custom op, no warning; the backend
  is then chosen by the dispatcher (``use_backend("tilelang")`` or ``MINDSPEED_OPS_BACKEND=tilelang``
  select the TileLang kernels there).
"""
import warnings

import torch

from ...ops.mhc import sinkhorn as _dispatched_sinkhorn
from ...ops.mhc import tilelang_sinkhorn as _tk


def tilelang_status(device) -> tuple:
    """``(ok, reason)``: whether this function runs the TileLang kernels for tensors on ``device``."""
    device = torch.device(device)
    if device.type != "cuda":
        return False, f"the TileLang kernels need CUDA tensors, got {device}"
    return _tk.available()


class TileLangSinkhornFunction(torch.autograd.Function):
    """Autograd of :func:`sinkhorn` on the TileLang kernels (forward and exact unrolled backward)."""

    @staticmethod
    def forward(ctx, mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps):
        out = _tk.forward(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)
        ctx.save_for_backward(mixes, hc_scale, hc_base)
        ctx.args = (hc_mult, sinkhorn_iters, eps)
        return out

    @staticmethod
    def backward(ctx, dpre, dpost, dcomb):
        mixes, hc_scale, hc_base = ctx.saved_tensors
        dm, ds, db = _tk.backward(dpre, dpost, dcomb, mixes, hc_scale, hc_base, *ctx.args)
        return dm, ds, db, None, None, None


def sinkhorn(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, hc_mult: int = 4,
             sinkhorn_iters: int = 20, eps: float = 1e-6) -> tuple:
    """DeepSeek-V4 mHC split + Sinkhorn (SPEC 1.12.1) on the TileLang kernels.

    Same arguments, results, gradients and errors as :func:`mindspeed_ops.api.triton.sinkhorn.sinkhorn`:
    ``mixes [..., (2+n)·n]``, ``hc_scale [3]``, ``hc_base [(2+n)·n]`` (fp32/fp16/bf16, ``n = hc_mult`` in
    ``[1, 8]``) -> ``(pre [..., n], post [..., n], comb [..., n, n])`` in ``mixes.dtype``; exact unrolled
    backward for all three tensors. See the module docstring for when it falls back (with a
    ``UserWarning``) to the default backend.

    Source: DeepSeek-V4 manifold-constrained hyper-connections; Sinkhorn & Knopp (1967).
    """
    from ...ops.mhc.sinkhorn import OP, as_int

    args = (as_int(OP, "hc_mult", hc_mult), as_int(OP, "sinkhorn_iters", sinkhorn_iters), float(eps))
    if torch.compiler.is_compiling():
        return _dispatched_sinkhorn(mixes, hc_scale, hc_base, *args)
    ok, why = tilelang_status(mixes.device) if isinstance(mixes, torch.Tensor) else (False, "mixes is not a tensor")
    if not ok:
        warnings.warn(f"api.tilelang.sinkhorn: running the default sinkhorn backend instead of TileLang: {why}",
                      UserWarning, stacklevel=2)
        return _dispatched_sinkhorn(mixes, hc_scale, hc_base, *args)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                          for t in (mixes, hc_scale, hc_base)):
        return TileLangSinkhornFunction.apply(mixes, hc_scale, hc_base, *args)
    return _tk.forward(mixes, hc_scale, hc_base, *args)


hc_split_sinkhorn = sinkhorn

__all__ = ["sinkhorn", "hc_split_sinkhorn", "tilelang_status", "TileLangSinkhornFunction"]
