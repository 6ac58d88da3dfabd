"""Pieces every family's autograd layer uses: the reference backward and output-shape helpers."""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Callable, Iterator, Optional, Sequence

import torch
from torch._C import DispatchKey

from .. import backends

# Keys a custom op's body runs with excluded (it is dispatched below autograd); the reference
# backward needs them back to record a graph through the reference.
_AUTOGRAD_KEYS = tuple(getattr(DispatchKey, n) for n in (
    "ADInplaceOrView", "AutogradCPU", "AutogradCUDA", "AutogradXPU", "AutogradMPS", "AutogradMeta",
    "AutogradPrivateUse1", "AutogradOther", "AutogradFunctionality") if hasattr(DispatchKey, n))


@contextlib.contextmanager
def autograd_recording() -> Iterator[None]:
    """Record autograd graphs even inside a custom op's body (where the dispatcher excludes the
    autograd keys, so ``torch.enable_grad()`` alone records nothing and gradients come back 0)."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _AUTOGRAD_KEYS:
        exclude = exclude.remove(key)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        yield


def reference_vjp(fn: Callable, primals: Sequence[Optional[torch.Tensor]], cotangents, *args, **kwargs):
    """Gradients of ``fn(*primals, *args, **kwargs)`` w.r.t. the floating ``primals`` by autograd.

    This is the ``reference`` backend's backward: autograd through the pure-PyTorch reference, so the
    CPU path and the test oracle share one definition. Returns one entry per primal (``None`` for
    non-float or ``None`` primals, zeros where the output does not depend on it).
    """
    with autograd_recording():
        leaves = [p.detach().requires_grad_(True) if isinstance(p, torch.Tensor) and p.is_floating_point() else p
                  for p in primals]
        outs = fn(*leaves, *args, **kwargs)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        cots = cotangents if isinstance(cotangents, (tuple, list)) else (cotangents,)
        pairs = [(o, c) for o, c in zip(outs, cots) if c is not None and isinstance(o, torch.Tensor)
                 and o.is_floating_point()]
        if any(not o.requires_grad for o, _ in pairs) and any(
                isinstance(p, torch.Tensor) and p.requires_grad for p in leaves):
            raise RuntimeError(f"reference_vjp: {getattr(fn, '__name__', fn)} recorded no autograd graph")
        wrt = [p for p in leaves if isinstance(p, torch.Tensor) and p.requires_grad]
        if not pairs or not wrt:
            grads = [None] * len(wrt)
        else:
            grads = torch.autograd.grad([o for o, _ in pairs], wrt, [c.to(o.dtype) for o, c in pairs],
                                        allow_unused=True)
    it = iter(grads)
    result = []
    for p in leaves:
        if isinstance(p, torch.Tensor) and p.requires_grad:
            g = next(it)
            result.append(torch.zeros_like(p) if g is None else g)
        else:
            result.append(None)
    return result


def has_autocast(device_type: str) -> bool:
    # cuda/cpu answered without the C call: dynamo cannot trace torch._C._is_autocast_available (seen on
    # CUDA, torch 2.11), and callers run inside compiled training steps
    return device_type in ("cuda", "cpu") or torch.amp.is_autocast_available(device_type)


def autocast_off(device_type: str):
    """``torch.autocast(device_type, enabled=False)``, or nothing where the device has no autocast
    (``meta``: shape-only calls must work)."""
    if has_autocast(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def without_autocast(fn: Callable) -> Callable:
    """Run a float32/float64 oracle with autocast off on its first tensor argument's device: under autocast
    its matmuls would round to bf16 (and writes of their results into fp32 buffers fail)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        dev = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        with autocast_off(dev):
            return fn(*args, **kwargs)

    return wrapper


def contiguous_as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` with contiguous strides (no copy when it already is): what a backward op's fake
    promises for a gradient, whatever the input's layout (a permuted ``[B, H, T, K]`` seen as ``[B, T, H, K]``)."""
    return t.to(dtype, memory_format=torch.contiguous_format)


def empty_contiguous_like(t: torch.Tensor) -> torch.Tensor:
    """The fake-function side of :func:`contiguous_as`."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def rows_2d(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, D]`` with unit stride on the last dim; a view when possible (any row stride),
    a copy otherwise. Kernels take the row stride, so padded/sliced rows are not copied."""
    d = x.shape[-1] if x.dim() else 1
    return unit_last_stride(x.reshape(math.prod(x.shape[:-1]), d))  # not -1: D == 0 must work too


def unit_last_stride(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t`` itself when its last dim has unit stride (or size <= 1), else a contiguous copy: what a
    kernel that takes the other strides as arguments needs for wide loads."""
    if t is not None and t.dim() and t.stride(-1) != 1 and t.shape[-1] > 1:
        return t.contiguous()
    return t


def bump_version(t: torch.Tensor) -> None:
    """Tell autograd that ``t`` was written in place. The eager path runs an op's body directly (a
    Triton kernel writing through the data pointer), which bypasses the dispatcher's version-counter
    bump; without it a tensor saved for backward elsewhere and then overwritten would silently give a
    wrong gradient instead of PyTorch's "modified by an inplace operation" error. Bumping twice (when
    the op was dispatched) is harmless. Under torch.compile the functionalized op takes care of it."""
    if not torch.compiler.is_compiling():
        torch.autograd.graph.increment_version(t)


def pin_backends(cls):
    """Class decorator for a ``torch.autograd.Function`` (``forward(ctx, ...)`` style): its backward runs
    with the ``use_backend`` choices in force at its forward. On CUDA autograd runs backward on a thread
    of its own, which does not see the caller's context, so without this a backward would take the
    device's default backend whatever the forward ran. Traced (torch.compile) forwards record nothing."""
    fwd, bwd = cls.forward, cls.backward

    def forward(ctx, *args, **kwargs):
        if not torch.compiler.is_compiling():
            ctx.overrides = backends.overrides()
        return fwd(ctx, *args, **kwargs)

    def backward(ctx, *grads):
        saved = getattr(ctx, "overrides", None)
        if saved is None:
            return bwd(ctx, *grads)
        with backends.with_overrides(saved):
            return bwd(ctx, *grads)

    forward.__wrapped__, backward.__wrapped__ = fwd, bwd
    cls.forward, cls.backward = staticmethod(forward), staticmethod(backward)
    return cls


def records_autograd(*args) -> bool:
    """Whether a call with ``args`` is recorded by autograd: grad mode on and a tensor argument that requires grad."""
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def eager_autograd(op, setup_context: Callable, backward: Callable) -> Callable:
    """Call path of a custom op with autograd that is cheap in eager mode.

    ``torch.library`` custom ops cost hundreds of microseconds of host time per call on a GPU host
    (measured on the H200: ~0.25 ms for the op layer alone, forward and again backward), which for
    memory-bound kernels is more than the kernel. So:

    - under ``torch.compile`` the returned function calls ``op`` itself (traceable, fake functions);
    - in eager mode it runs the op's Python body directly, inside a plain ``autograd.Function``
      built from the same ``setup_context``/``backward`` given to ``op.register_autograd``, and
      without autograd at all when no input requires grad.

    Backward functions call their backward ops through :func:`call_op` so they take the same
    shortcut. Both paths run the same launchers and are tested against each other.
    """
    fwd = op._init_fn

    @pin_backends  # the backward runs with the backends that ran the forward
    class EagerFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            ctx.eager = True
            out = fwd(*args)
            setup_context(ctx, args, out)
            return out

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    EagerFunction.__name__ = EagerFunction.__qualname__ = f"{op._name}_eager"

    def call(*args):
        if torch.compiler.is_compiling():
            return op(*args)
        if records_autograd(*args):
            return EagerFunction.apply(*args)
        return fwd(*args)

    call.eager_function = EagerFunction
    return call


def call_op(ctx, op, *args):
    """Call custom op ``op`` from a backward: its Python body when the forward ran eagerly
    (``ctx.eager``, set by :func:`eager_autograd`), the op itself when traced by ``torch.compile`` or
    when the backward is itself differentiated (``create_graph=True``: the op's autograd is needed)."""
    if getattr(ctx, "eager", False) and not records_autograd(*args):
        return op._init_fn(*args)
    return op(*args)


def run_op(op, *args):
    """Call custom op ``op`` outside a backward: the op under ``torch.compile``, its Python body in
    eager mode (see :func:`eager_autograd` for why)."""
    return op(*args) if torch.compiler.is_compiling() else op._init_fn(*args)
