"""TileLang kernels for ``sinkhorn`` (SPEC 1.12.1): the optional ``tilelang`` backend.

Same math as the Triton kernels (:mod:`.triton_kernels`), written as SIMT code: one CUDA thread owns
one token and keeps its ``n x n`` matrix in registers (``n`` is a compile-time constant and every loop
over it is a ``#pragma unroll`` loop, so each index into the matrix is a constant after unrolling); the
``sinkhorn_iters`` steps are a runtime loop; ``BT_CUDA`` tokens a block. Inputs are read in place with
their strides (flat views plus int64 strides: slices, transposes and stride-0 gradients are not copied).

* forward: ``pre``/``post`` sigmoids, row softmax ``+ eps``, the column step, then
  ``sinkhorn_iters - 1`` (row, column) pairs; fp32 math, one rounding on store.
* backward: the exact gradient of the unrolled iterations. The thread re-runs the forward keeping each
  step's reciprocal sums ``r_t`` (``n`` floats a step, ``2·iters - 1`` steps, a per-thread local array:
  ``iters`` is a compile-time constant of the backward kernel), then walks the steps backwards,
  rebuilding each step's input from its output (``X_t = Y_t / r_t``) and applying
  ``dX = (dY - Σ_axis dY ⊙ Y) · r``; the softmax probabilities are recomputed from ``mixes``.
  ``hc_scale``/``hc_base`` gradients: each block sums its tokens' logit gradients in a fixed order
  through shared memory (fp32 partials, one row a block), the launcher sums the partials with torch:
  deterministic, no atomics.

Every kernel also has a CPU build (TileLang's C target: the block's threads become a serial loop) that
runs the same traced token code; the tests use it to check the math on machines without a GPU. The
backend itself (:func:`register`) is CUDA-only.

``tilelang`` is imported lazily (the first kernel build), so this module imports without it.
Kernels are compiled once per (kernel, ``n``, dtypes, ``iters`` for the backward, target) and cached.
"""

import functools
import importlib
import importlib.util
from typing import Optional

import torch

from ... import backends
from ..common import rows_2d
from .sinkhorn import OP, check_args

#: tokens (threads) a block on CUDA: small blocks spread the few thousand tokens of a step over the SMs
BT_CUDA = 64
#: tokens a program of the CPU build
BT_CPU = 16
#: compile target of the CPU build (TileLang's C backend)
CPU_TARGET = "c"

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_F32 = "float32"


def installed() -> bool:
    """Whether a ``tilelang`` package is installed (cheap: no import)."""
    try:
        return importlib.util.find_spec("tilelang") is not None
    except (ImportError, ValueError):  # e.g. a None entry in sys.modules
        return False


@functools.lru_cache(maxsize=None)
def _import_error() -> Optional[str]:
    try:
        importlib.import_module("tilelang.language")  # imports tilelang itself first
    except Exception as e:  # noqa: BLE001 - any failure makes the backend unavailable
        return f"{type(e).__name__}: {e}"
    return None


def available() -> tuple[bool, str]:
    """``(ok, reason)``: whether ``import tilelang`` works here (imports it: ~2 s the first time)."""
    if not installed():
        return False, "tilelang is not installed (pip install mindspeed-ops[tilelang])"
    err = _import_error()
    if err is not None:
        return False, f"import tilelang failed: {err}"
    return True, "tilelang importable"


def _tl():
    ok, why = available()
    if not ok:
        raise backends.BackendUnavailableError(f"{OP}: backend 'tilelang' is not available: {why}")
    import tilelang
    import tilelang.language as T

    return tilelang, T


def _tl_dtype(dtype: torch.dtype) -> str:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(f"{OP}: the tilelang kernels take float32/float16/bfloat16, got {dtype}") from None


# ------------------------------------------------------------------------------------------- kernels
def _token_macros(T, n: int):
    """Traced (macro) pieces of the per-token code, shared by the kernels.

    ``X``/``D`` are ``[n, n]`` fp32 local arrays, ``A`` a 4-float local scratch; the loops over ``n`` are
    ``T.unroll`` loops (``#pragma unroll`` with constant trip counts: the compiler unrolls them, so every
    index into ``X``/``D`` is a constant and they live in registers). ``m`` is the flat ``mixes`` buffer
    and ``rm`` the int64 offset of the token's row in it."""
    c0 = 2 * n  # first comb logit in a mixes row

    @T.macro
    def softmax(X, A, m, b, rm, s2, eps, add_eps: bool):
        # X[j, :] = softmax_k(s2 * m[2n + j*n + k] + b[2n + j*n + k]) (+ eps)
        for j in T.unroll(n):
            for k in T.unroll(n):
                X[j, k] = s2 * T.cast(m[rm + (c0 + j * n + k)], _F32) + b[c0 + j * n + k]
            A[0] = X[j, 0]
            for k in T.unroll(1, n):
                A[0] = T.max(A[0], X[j, k])
            A[1] = T.float32(0.0)
            for k in T.unroll(n):
                X[j, k] = T.exp(X[j, k] - A[0])
                A[1] = A[1] + X[j, k]
            for k in T.unroll(n):
                if add_eps:
                    X[j, k] = X[j, k] / A[1] + eps
                else:
                    X[j, k] = X[j, k] / A[1]

    @T.macro
    def col_step(X, A, R, t, eps, save: bool):
        # X[:, k] *= 1 / (Σ_j X[j, k] + eps); R[t, k] = that factor when saving
        for k in T.unroll(n):
            A[0] = X[0, k]
            for j in T.unroll(1, n):
                A[0] = A[0] + X[j, k]
            A[0] = 1.0 / (A[0] + eps)
            if save:
                R[t, k] = A[0]
            for j in T.unroll(n):
                X[j, k] = X[j, k] * A[0]

    @T.macro
    def row_step(X, A, R, t, eps, save: bool):
        for j in T.unroll(n):
            A[0] = X[j, 0]
            for k in T.unroll(1, n):
                A[0] = A[0] + X[j, k]
            A[0] = 1.0 / (A[0] + eps)
            if save:
                R[t, j] = A[0]
            for k in T.unroll(n):
                X[j, k] = X[j, k] * A[0]

    @T.macro
    def col_back(X, D, A, R, t):
        # Y = X (step t's output), dY = D: dX = (dY - Σ_j dY ⊙ Y) · r ; X <- Y / r
        for k in T.unroll(n):
            A[0] = D[0, k] * X[0, k]
            for j in T.unroll(1, n):
                A[0] = A[0] + D[j, k] * X[j, k]
            A[1] = R[t, k]
            for j in T.unroll(n):
                D[j, k] = (D[j, k] - A[0]) * A[1]
                X[j, k] = X[j, k] / A[1]

    @T.macro
    def row_back(X, D, A, R, t):
        for j in T.unroll(n):
            A[0] = D[j, 0] * X[j, 0]
            for k in T.unroll(1, n):
                A[0] = A[0] + D[j, k] * X[j, k]
            A[1] = R[t, j]
            for k in T.unroll(n):
                D[j, k] = (D[j, k] - A[0]) * A[1]
                X[j, k] = X[j, k] / A[1]

    return softmax, col_step, row_step, col_back, row_back


def _fwd_prim_func(n: int, mdt: str, cuda: bool):
    _, T = _tl()
    softmax, col_step, row_step, _, _ = _token_macros(T, n)
    W = (2 + n) * n
    BT = BT_CUDA if cuda else BT_CPU
    M = T.dynamic("M")
    LM = T.dynamic("LM")

    @T.macro
    def token(m, sm, s, b, pre, post, comb, r, iters, eps):
        if r < M:
            rm = T.cast(r, "int64") * sm
            s0 = s[0]
            s1 = s[1]
            s2 = s[2]
            for k in T.unroll(n):
                pre[r, k] = T.cast(T.sigmoid(s0 * T.cast(m[rm + k], _F32) + b[k]) + eps, mdt)
                post[r, k] = T.cast(2.0 * T.sigmoid(s1 * T.cast(m[rm + (n + k)], _F32) + b[n + k]), mdt)
            X = T.alloc_local((n, n), _F32)
            A = T.alloc_local((4,), _F32)
            softmax(X, A, m, b, rm, s2, eps, True)
            col_step(X, A, X, 0, eps, False)
            for _ in T.serial(iters - 1):
                row_step(X, A, X, 0, eps, False)
                col_step(X, A, X, 0, eps, False)
            for j in T.unroll(n):
                for k in T.unroll(n):
                    comb[r, j, k] = T.cast(X[j, k], mdt)

    if cuda:
        @T.prim_func
        def sinkhorn_fwd(m: T.Tensor((LM,), mdt), s: T.Tensor((3,), _F32), b: T.Tensor((W,), _F32),
                         pre: T.Tensor((M, n), mdt), post: T.Tensor((M, n), mdt), comb: T.Tensor((M, n, n), mdt),
                         sm: T.int64, iters: T.int32, eps: T.float32):
            with T.Kernel(T.ceildiv(M, BT), threads=BT) as bx:
                tx = T.get_thread_binding()
                token(m, sm, s, b, pre, post, comb, bx * BT + tx, iters, eps)
    else:
        import tilelang.cpu.language as TC

        @T.prim_func
        def sinkhorn_fwd(m: T.Tensor((LM,), mdt), s: T.Tensor((3,), _F32), b: T.Tensor((W,), _F32),
                         pre: T.Tensor((M, n), mdt), post: T.Tensor((M, n), mdt), comb: T.Tensor((M, n, n), mdt),
                         sm: T.int64, iters: T.int32, eps: T.float32):
            with TC.Kernel(T.ceildiv(M, BT)) as bx:
                for tx in T.serial(BT):
                    token(m, sm, s, b, pre, post, comb, bx * BT + tx, iters, eps)

    return sinkhorn_fwd


def _bwd_prim_func(n: int, iters: int, mdt: str, gdt: str, cuda: bool):
    _, T = _tl()
    softmax, col_step, row_step, col_back, row_back = _token_macros(T, n)
    W = (2 + n) * n
    ZW = (W + 3) | 1  # row of the shared partials (W logit grads, 3 scale grads), odd: no bank conflicts
    S = 2 * iters - 1
    BT = BT_CUDA if cuda else BT_CPU
    c0 = 2 * n
    M = T.dynamic("M")
    LM, LP, LQ, LC = T.dynamic("LM"), T.dynamic("LP"), T.dynamic("LQ"), T.dynamic("LC")
    G = T.ceildiv(M, BT)

    @T.macro
    def token(m, s, b, gp, gq, gc, dm, st, Z, tx, r, eps):
        # Z[tx, :W] = this token's logit gradients, Z[tx, W:W+3] = Σ dlogit · m per segment (0 past M);
        # the body only writes Z (no shared reads before the barrier that follows it).
        # st = (mixes row, dpre row, dpre col, dpost row, dpost col, dcomb row, dcomb j, dcomb k) strides
        if r < M:
            QA = T.alloc_local((3,), _F32)
            for i in T.unroll(3):
                QA[i] = T.float32(0.0)
            r64 = T.cast(r, "int64")
            rm = r64 * st[0]
            rp = r64 * st[1]
            rq = r64 * st[3]
            rc = r64 * st[5]
            s0 = s[0]
            s1 = s[1]
            s2 = s[2]
            for k in T.unroll(n):
                mp = T.cast(m[rm + k], _F32)
                sp = T.sigmoid(s0 * mp + b[k])
                dzp = T.cast(gp[rp + k * st[2]], _F32) * sp * (1.0 - sp)
                dm[r, k] = T.cast(dzp * s0, mdt)
                Z[tx, k] = dzp
                QA[0] = QA[0] + dzp * mp
                mq = T.cast(m[rm + (n + k)], _F32)
                sq = T.sigmoid(s1 * mq + b[n + k])
                dzq = 2.0 * T.cast(gq[rq + k * st[4]], _F32) * sq * (1.0 - sq)
                dm[r, n + k] = T.cast(dzq * s1, mdt)
                Z[tx, n + k] = dzq
                QA[1] = QA[1] + dzq * mq

            X = T.alloc_local((n, n), _F32)
            D = T.alloc_local((n, n), _F32)
            A = T.alloc_local((4,), _F32)
            R = T.alloc_local((S, n), _F32)
            softmax(X, A, m, b, rm, s2, eps, True)
            col_step(X, A, R, 0, eps, True)
            for i in T.serial(iters - 1):
                row_step(X, A, R, 2 * i + 1, eps, True)
                col_step(X, A, R, 2 * i + 2, eps, True)
            for j in T.unroll(n):
                for k in T.unroll(n):
                    D[j, k] = T.cast(gc[rc + j * st[6] + k * st[7]], _F32)
            for i in T.serial(iters - 1):
                col_back(X, D, A, R, S - 1 - 2 * i)
                row_back(X, D, A, R, S - 2 - 2 * i)
            col_back(X, D, A, R, 0)
            # D = d(P̃ + eps) = dP̃; softmax backward with P̃ recomputed (X no longer needed)
            softmax(X, A, m, b, rm, s2, eps, False)
            for j in T.unroll(n):
                A[0] = D[j, 0] * X[j, 0]
                for k in T.unroll(1, n):
                    A[0] = A[0] + D[j, k] * X[j, k]
                for k in T.unroll(n):
                    A[1] = X[j, k] * (D[j, k] - A[0])
                    dm[r, c0 + j * n + k] = T.cast(A[1] * s2, mdt)
                    Z[tx, c0 + j * n + k] = A[1]
                    QA[2] = QA[2] + A[1] * T.cast(m[rm + (c0 + j * n + k)], _F32)
            for i in T.unroll(3):
                Z[tx, W + i] = QA[i]
        else:
            for w in T.unroll(W + 3):
                Z[tx, w] = T.float32(0.0)

    @T.macro
    def reduce(Z, ds, db, bx, w):
        # column w of the block's partials, summed over its tokens in order
        if w < W + 3:
            acc = T.alloc_var(_F32, init=0.0)
            for t in T.serial(BT):
                acc = acc + Z[t, w]
            if w < W:
                db[bx, w] = acc
            else:
                ds[bx, w - W] = acc

    if cuda:
        NR = -(-(W + 3) // BT)  # reduction rounds: W + 3 columns over BT threads

        @T.prim_func
        def sinkhorn_bwd(m: T.Tensor((LM,), mdt), s: T.Tensor((3,), _F32), b: T.Tensor((W,), _F32),
                         gp: T.Tensor((LP,), gdt), gq: T.Tensor((LQ,), gdt), gc: T.Tensor((LC,), gdt),
                         dm: T.Tensor((M, W), mdt), ds: T.Tensor((G, 3), _F32), db: T.Tensor((G, W), _F32),
                         sm: T.int64, sp0: T.int64, sp1: T.int64, sq0: T.int64, sq1: T.int64, sc0: T.int64,
                         sc1: T.int64, sc2: T.int64, eps: T.float32):
            with T.Kernel(G, threads=BT) as bx:
                tx = T.get_thread_binding()
                Z = T.alloc_shared((BT, ZW), _F32)
                token(m, s, b, gp, gq, gc, dm, (sm, sp0, sp1, sq0, sq1, sc0, sc1, sc2), Z, tx, bx * BT + tx, eps)
                T.sync_threads()
                for i in T.serial(NR):
                    reduce(Z, ds, db, bx, i * BT + tx)
    else:
        import tilelang.cpu.language as TC

        @T.prim_func
        def sinkhorn_bwd(m: T.Tensor((LM,), mdt), s: T.Tensor((3,), _F32), b: T.Tensor((W,), _F32),
                         gp: T.Tensor((LP,), gdt), gq: T.Tensor((LQ,), gdt), gc: T.Tensor((LC,), gdt),
                         dm: T.Tensor((M, W), mdt), ds: T.Tensor((G, 3), _F32), db: T.Tensor((G, W), _F32),
                         sm: T.int64, sp0: T.int64, sp1: T.int64, sq0: T.int64, sq1: T.int64, sc0: T.int64,
                         sc1: T.int64, sc2: T.int64, eps: T.float32):
            with TC.Kernel(G) as bx:
                Z = T.alloc_local((BT, ZW), _F32)
                for tx in T.serial(BT):
                    token(m, s, b, gp, gq, gc, dm, (sm, sp0, sp1, sq0, sq1, sc0, sc1, sc2), Z, tx,
                          bx * BT + tx, eps)
                for w in T.serial(W + 3):
                    reduce(Z, ds, db, bx, w)

    return sinkhorn_bwd


def _target_key(device: torch.device) -> str:
    """``'c'`` (the CPU build) or ``'cuda:sm_XY'`` for the device's arch."""
    if device.type == "cpu":
        return CPU_TARGET
    if device.type == "cuda":
        return "cuda:sm_" + backends.device_arch(device)[2:]
    raise ValueError(f"{OP}: the tilelang kernels run on CUDA (or the CPU build), got device {device}")


@functools.lru_cache(maxsize=None)
def _compiled(kind: str, n: int, mdt: str, gdt: str, iters: int, target_key: str):
    tilelang, _ = _tl()
    cuda = target_key != CPU_TARGET
    target = {"kind": "cuda", "arch": target_key.split(":", 1)[1]} if cuda else CPU_TARGET
    func = _fwd_prim_func(n, mdt, cuda) if kind == "fwd" else _bwd_prim_func(n, iters, mdt, gdt, cuda)
    # every index is in range by construction (row < M, strides of real tensors): no bounds-check code
    return tilelang.compile(func, target=target, pass_configs={"tl.disable_safe_memory_legalize": True})


def kernel_source(kind: str, n: int, dtype: torch.dtype = torch.float32, iters: int = 20,
                  target="cuda:sm_90") -> str:
    """Generated source of one kernel (``kind`` ``'fwd'``/``'bwd'``) for ``target`` (``'cuda:sm_XY'`` or
    ``'c'``), compiling it if needed; no GPU is needed for a CUDA target, only ``nvcc``."""
    d = _tl_dtype(dtype)
    return _compiled(kind, n, d, d, iters if kind == "bwd" else 0, target).get_kernel_source()


def _kernel(kind: str, n: int, mdt: str, gdt: str, iters: int, device: torch.device):
    return _compiled(kind, n, mdt, gdt, iters, _target_key(device))


# ------------------------------------------------------------------------------------------- launchers
def forward(mixes, hc_scale, hc_base, hc_mult: int = 4, sinkhorn_iters: int = 20, eps: float = 1e-6):
    """Same contract as :func:`mindspeed_ops.ops.mhc.sinkhorn.forward` (SPEC 1.12.1):
    ``(pre [..., n], post [..., n], comb [..., n, n])`` in ``mixes.dtype``."""
    n = check_args(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)
    lead = mixes.shape[:-1]
    m = rows_2d(mixes)
    M = m.shape[0]
    dev = mixes.device
    pre = torch.empty(M, n, dtype=mixes.dtype, device=dev)
    post = torch.empty(M, n, dtype=mixes.dtype, device=dev)
    comb = torch.empty(M, n, n, dtype=mixes.dtype, device=dev)
    if M:
        d = _tl_dtype(mixes.dtype)
        s = hc_scale.detach().to(torch.float32).contiguous()
        b = hc_base.detach().to(torch.float32).contiguous()
        _kernel("fwd", n, d, d, 0, dev)(_flat(m), s, b, pre, post, comb, m.stride(0), int(sinkhorn_iters),
                                        float(eps))
    return pre.view(*lead, n), post.view(*lead, n), comb.view(*lead, n, n)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The storage span of ``t`` (non-negative strides, at least one element) as a 1-D view, so a kernel
    can index it with ``t``'s strides: no copy, whatever the layout (slices, transposes, stride 0)."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.detach().as_strided((span,), (1,))  # detached: DLPack export refuses tensors needing grad


def _grad(g, M, tail, like, dtype):
    """Upstream gradient as ``[M, *tail]`` in ``dtype``, any strides (a stride-0 zero when unused)."""
    if g is None:
        return like.new_zeros((), dtype=dtype).expand(M, *tail)
    return g.to(dtype).reshape(M, *tail)


def backward(dpre, dpost, dcomb, mixes, hc_scale, hc_base, hc_mult: int = 4, sinkhorn_iters: int = 20,
             eps: float = 1e-6):
    """Same contract as :func:`mindspeed_ops.ops.mhc.sinkhorn.backward`:
    ``(d mixes, d hc_scale, d hc_base)`` in the inputs' dtypes; gradients may have any strides."""
    n = hc_mult
    W = (2 + n) * n
    m = rows_2d(mixes)
    M = m.shape[0]
    dev = mixes.device
    dm = torch.empty(M, W, dtype=mixes.dtype, device=dev)
    if not M:
        return (dm.view(mixes.shape), torch.zeros_like(hc_scale, memory_format=torch.contiguous_format),
                torch.zeros_like(hc_base, memory_format=torch.contiguous_format))
    given = [g.dtype for g in (dpre, dpost, dcomb) if g is not None]
    gdtype = given[0] if given and all(t == given[0] for t in given) and given[0] in _DTYPES else torch.float32
    gp = _grad(dpre, M, (n,), m, gdtype)
    gq = _grad(dpost, M, (n,), m, gdtype)
    gc = _grad(dcomb, M, (n, n), m, gdtype)
    BT = BT_CUDA if dev.type == "cuda" else BT_CPU
    G = -(-M // BT)
    ds = torch.empty(G, 3, dtype=torch.float32, device=dev)
    db = torch.empty(G, W, dtype=torch.float32, device=dev)
    s = hc_scale.detach().to(torch.float32).contiguous()
    b = hc_base.detach().to(torch.float32).contiguous()
    kern = _kernel("bwd", n, _tl_dtype(mixes.dtype), _tl_dtype(gdtype), int(sinkhorn_iters), dev)
    kern(_flat(m), s, b, _flat(gp), _flat(gq), _flat(gc), dm, ds, db, m.stride(0), *gp.stride(), *gq.stride(),
         *gc.stride(), float(eps))
    return dm.view(mixes.shape), ds.sum(0).to(hc_scale.dtype), db.sum(0).to(hc_base.dtype)


# ------------------------------------------------------------------------------------------- registration
#: priority of the ``tilelang`` implementation among CUDA backends (``triton`` is 0): below triton, so the
#: default dispatch keeps Triton until TileLang is timed faster on the target GPU (then raise it above 0);
#: ``use_backend("tilelang")`` or ``MINDSPEED_OPS_BACKEND=tilelang`` select it explicitly meanwhile
DEFAULT_PRIORITY = -10


def register(priority: int = DEFAULT_PRIORITY) -> bool:
    """Register the ``tilelang`` backend of ``sinkhorn`` when TileLang is installed and CUDA is available;
    returns whether it did. Cheap (no ``import tilelang``): the kernels are built on first use, and a
    TileLang that is installed but fails to import raises ``BackendUnavailableError`` naming the cause."""
    if not installed() or not torch.cuda.is_available():
        return False
    backends.register(OP, "tilelang", forward=forward, backward=backward, priority=priority)
    return True


__all__ = ["forward", "backward", "register", "available", "installed", "kernel_source", "DEFAULT_PRIORITY"]
