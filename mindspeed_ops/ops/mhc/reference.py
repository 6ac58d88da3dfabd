"""Pure-PyTorch references of the mHC family (SPEC 1.12): fp32 math (fp64 when given fp64),
differentiable, so autograd through them is the backward oracle and the ``reference`` backend."""
from __future__ import annotations

from typing import Optional

import torch


def _cdt(*ts: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def _sinkhorn_core(C: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Steps 2-5 of SPEC 1.12.1 on logits ``C [..., n, n]`` (already in the compute dtype)."""
    P = torch.softmax(C, dim=-1) + eps
    P = P / (P.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        P = P / (P.sum(-1, keepdim=True) + eps)
        P = P / (P.sum(-2, keepdim=True) + eps)
    return P


def sinkhorn_knopp(logits: torch.Tensor, iters: int = 20, eps: float = 1e-6) -> torch.Tensor:
    """Unrolled Sinkhorn-Knopp (SPEC 1.12.2): ``[..., n, n]`` logits -> ``P`` in ``logits.dtype``."""
    return _sinkhorn_core(logits.to(_cdt(logits)), iters, eps).to(logits.dtype)


def sinkhorn(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, hc_mult: int = 4,
             sinkhorn_iters: int = 20, eps: float = 1e-6):
    """DeepSeek-V4 mHC split + Sinkhorn (SPEC 1.12.1) -> ``(pre [..., n], post [..., n], comb [..., n, n])``."""
    n = hc_mult
    dt = _cdt(mixes, hc_scale, hc_base)
    m, s, b = mixes.to(dt), hc_scale.to(dt), hc_base.to(dt)
    pre = torch.sigmoid(s[0] * m[..., :n] + b[:n]) + eps
    post = 2.0 * torch.sigmoid(s[1] * m[..., n:2 * n] + b[n:2 * n])
    C = (s[2] * m[..., 2 * n:] + b[2 * n:]).unflatten(-1, (n, n))
    comb = _sinkhorn_core(C, sinkhorn_iters, eps)
    od = mixes.dtype
    return pre.to(od), post.to(od), comb.to(od)


def mhc_pre_bmm(pre: torch.Tensor, x: torch.Tensor, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``y = Σ_j pre_j · x_j`` (SPEC 1.12.3): ``pre [..., n]``, ``x [..., n, D]`` -> ``[..., D]``."""
    dt = _cdt(pre, x)
    y = (pre.to(dt).unsqueeze(-1) * x.to(dt)).sum(-2)
    return y.to(out_dtype or x.dtype)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, h_post: torch.Tensor, h_res: torch.Tensor) -> torch.Tensor:
    """``out_k = h_post_k · x + Σ_j h_res[j, k] · residual_j`` (SPEC 1.12.4, DeepSeek convention)."""
    dt = _cdt(x, residual, h_post, h_res)
    out = h_post.to(dt).unsqueeze(-1) * x.to(dt).unsqueeze(-2) \
        + torch.einsum("...jk,...jd->...kd", h_res.to(dt), residual.to(dt))
    return out.to(x.dtype)
