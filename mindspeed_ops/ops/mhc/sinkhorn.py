"""Host launchers for ``sinkhorn`` and ``sinkhorn_knopp`` (SPEC 1.12.1, 1.12.2): checks, tiling, grids."""
from __future__ import annotations

import math

import torch

from ... import triton_utils as tu
from ...validation import check_same_device, check_tensor, reject_float64, shape_str
from ..common import rows_2d

OP = "sinkhorn"
OP_KNOPP = "sinkhorn_knopp"


def as_int(op: str, name: str, v) -> int:
    """``v`` as a Python int for the public functions: ints (also numpy/0-d tensor ints) and integral
    floats pass; a fractional value or a bool raises instead of being silently truncated by ``int()``."""
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        raise ValueError(f"{op}: {name} must be an int, got {v!r}")
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{op}: {name} must be an int, got {v!r}") from None


def _check_iters_eps(op: str, iters_name: str, iters, eps) -> None:
    if not isinstance(iters, (int, torch.SymInt)) or isinstance(iters, bool) or iters < 1:
        raise ValueError(f"{op}: {iters_name} must be an int >= 1, got {iters!r}")
    if not isinstance(eps, (int, float)) or not eps >= 0 or not math.isfinite(eps):
        raise ValueError(f"{op}: eps must be a finite number >= 0, got {eps!r}")


def check_args(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps) -> int:
    """Validate the arguments of ``sinkhorn`` (also on fake tensors); returns ``n``."""
    # a SymInt under torch.compile(dynamic=True) when taken from a shape (e.g. ``X.shape[-2]``)
    if not isinstance(hc_mult, (int, torch.SymInt)) or isinstance(hc_mult, bool) or not 1 <= hc_mult <= 8:
        raise ValueError(f"{OP}: hc_mult must be an int in [1, 8], got {hc_mult!r}")
    _check_iters_eps(OP, "sinkhorn_iters", sinkhorn_iters, eps)
    reject_float64(OP, mixes=mixes, hc_scale=hc_scale, hc_base=hc_base)
    n = hc_mult
    W = (2 + n) * n
    check_tensor(OP, "mixes", mixes, min_ndim=1)
    if mixes.shape[-1] != W:
        raise ValueError(f"{OP}: mixes must have shape [..., (2+n)*n] = [..., {W}] for hc_mult={n}, "
                         f"got {shape_str(mixes.shape)}")
    check_tensor(OP, "hc_scale", hc_scale, shape=(3,))
    check_tensor(OP, "hc_base", hc_base, shape=(W,), shape_desc="[(2+n)*n]")
    check_same_device(OP, mixes=mixes, hc_scale=hc_scale, hc_base=hc_base)
    return n


def check_knopp_args(logits, iters, eps) -> int:
    _check_iters_eps(OP_KNOPP, "iters", iters, eps)
    reject_float64(OP_KNOPP, logits=logits)
    check_tensor(OP_KNOPP, "logits", logits, min_ndim=2)
    n = logits.shape[-1]
    if logits.shape[-2] != n or not 1 <= n <= 64:
        raise ValueError(f"{OP_KNOPP}: logits must have shape [..., n, n] with 1 <= n <= 64, "
                         f"got {shape_str(logits.shape)}")
    return n


def _tile(n: int, M: int) -> tuple[int, int]:
    """(NP, BT): ~2048 matrix entries (tokens x NP²) a program, 16 a thread at 4 warps (the backward
    keeps ~5 live copies in registers)."""
    NP = max(2, tu.next_power_of_2(n))
    return NP, max(1, 2048 // (NP * NP))


def _wide(n: int, dtype: torch.dtype) -> bool:
    """16-bit inputs with ``n > 4`` run the fp32 kernels on fp32 copies (the math is fp32 either way): on the
    H200 the same kernels with bf16 ``mixes`` at n = 8 took 368 vs 67 µs (forward) and 830 vs 210 µs
    (backward) at 65536 tokens (docs/benchmarks/s8/profile_sinkhorn_*.txt); n = 4 ran as fast in both."""
    return dtype in (torch.float16, torch.bfloat16) and n > 4


def _operands(mixes, hc_scale, hc_base, wide: bool):
    """``(mixes as [M, W] rows, hc_scale, hc_base)`` as the kernels read them (fp32 copies when ``wide``)."""
    m = rows_2d(tu.kernel_input(mixes))
    s, b = tu.kernel_input(hc_scale).contiguous(), tu.kernel_input(hc_base).contiguous()
    return (m.float(), s.float(), b.float()) if wide else (m, s, b)


def forward(mixes, hc_scale, hc_base, hc_mult: int = 4, sinkhorn_iters: int = 20, eps: float = 1e-6):
    from .triton_kernels import sinkhorn_fwd_kernel

    n = check_args(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)
    lead = mixes.shape[:-1]
    wide = _wide(n, mixes.dtype)
    m, s, b = _operands(mixes, hc_scale, hc_base, wide)
    M = m.shape[0]
    kd = torch.float32 if wide else tu.kernel_dtype(mixes.dtype)
    pre = torch.empty(M, n, dtype=kd, device=mixes.device)
    post = torch.empty(M, n, dtype=kd, device=mixes.device)
    comb = torch.empty(M, n, n, dtype=kd, device=mixes.device)
    if M:
        NP, BT = _tile(n, M)
        sinkhorn_fwd_kernel[(tu.cdiv(M, BT),)](m, s, b, pre, post, comb, M, m.stride(0), int(sinkhorn_iters),
                                              float(eps), N=n, NP=NP, BT=BT, num_warps=4)
    od = mixes.dtype
    return (tu.finish(pre, od).view(*lead, n), tu.finish(post, od).view(*lead, n),
            tu.finish(comb, od).view(*lead, n, n))


def _grad(g, M, tail, like):
    """Upstream gradient as ``[M, *tail]`` with any strides (stride-0 from ``.sum()`` is not copied)."""
    if g is None:  # output unused: a stride-0 zero gradient, no allocation
        return like.new_zeros(()).expand(M, *tail)
    return tu.kernel_input(g).reshape(M, *tail)


def backward(dpre, dpost, dcomb, mixes, hc_scale, hc_base, hc_mult: int = 4, sinkhorn_iters: int = 20,
             eps: float = 1e-6):
    from .triton_kernels import sinkhorn_bwd_kernel

    n = hc_mult
    wide = _wide(n, mixes.dtype)
    m, s, b = _operands(mixes, hc_scale, hc_base, wide)
    M = m.shape[0]
    kd = torch.float32 if wide else tu.kernel_dtype(mixes.dtype)
    dm = torch.empty(M, (2 + n) * n, dtype=kd, device=mixes.device)
    if not M:
        return (dm.view(mixes.shape).to(mixes.dtype), torch.zeros_like(hc_scale, memory_format=torch.contiguous_format),
                torch.zeros_like(hc_base, memory_format=torch.contiguous_format))
    gp, gq, gc = (_grad(g, M, tail, m) for g, tail in ((dpre, (n,)), (dpost, (n,)), (dcomb, (n, n))))
    if wide:
        gp, gq, gc = gp.float(), gq.float(), gc.float()
    NP, BT = _tile(n, M)
    G = tu.cdiv(M, BT)
    ds = torch.empty(G, 3, dtype=torch.float32, device=mixes.device)
    db = torch.empty(G, (2 + n) * n, dtype=torch.float32, device=mixes.device)
    r = torch.empty(2 * sinkhorn_iters - 1, M, NP, dtype=torch.float32, device=mixes.device)  # scratch
    sinkhorn_bwd_kernel[(G,)](m, s, b, gp, gq, gc, dm, ds, db, r, M, m.stride(0), gp.stride(0), gp.stride(1),
                              gq.stride(0), gq.stride(1), gc.stride(0), gc.stride(1), gc.stride(2), dm.stride(0),
                              int(sinkhorn_iters), float(eps), N=n, NP=NP, BT=BT, num_warps=4)
    return (tu.finish(dm, mixes.dtype).view(mixes.shape), ds.sum(0).to(hc_scale.dtype),
            db.sum(0).to(hc_base.dtype))


def knopp_forward(logits, iters: int = 20, eps: float = 1e-6):
    from .triton_kernels import sinkhorn_knopp_fwd_kernel

    n = check_knopp_args(logits, iters, eps)
    c = tu.kernel_input(logits).reshape(-1, n, n).contiguous()
    M = c.shape[0]
    p = torch.empty(M, n, n, dtype=tu.kernel_dtype(logits.dtype), device=logits.device)
    if M:
        NP, BT = _tile(n, M)
        sinkhorn_knopp_fwd_kernel[(tu.cdiv(M, BT),)](c, p, M, int(iters), float(eps), N=n, NP=NP, BT=BT,
                                                     num_warps=4)
    return tu.finish(p, logits.dtype).view(logits.shape)


def knopp_backward(dp, logits, iters: int = 20, eps: float = 1e-6):
    from .triton_kernels import sinkhorn_knopp_bwd_kernel

    n = logits.shape[-1]
    c = tu.kernel_input(logits).reshape(-1, n, n).contiguous()
    M = c.shape[0]
    dc = torch.empty(M, n, n, dtype=tu.kernel_dtype(logits.dtype), device=logits.device)
    if M:
        g = tu.kernel_input(dp).reshape(M, n, n)
        NP, BT = _tile(n, M)
        r = torch.empty(2 * iters - 1, M, NP, dtype=torch.float32, device=logits.device)  # scratch
        sinkhorn_knopp_bwd_kernel[(tu.cdiv(M, BT),)](c, g, dc, r, M, g.stride(0), g.stride(1), g.stride(2), int(iters),
                                                     float(eps), N=n, NP=NP, BT=BT, num_warps=4)
    return tu.finish(dc, logits.dtype).view(logits.shape)
