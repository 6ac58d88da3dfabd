"""Backend selection: for an operator and the device of its tensors, which implementation runs.

This is the only module that decides. Families register their implementations here
(``register``); autograd/custom-op code asks ``implementation(op, device)``.

Order of precedence, first match wins:

1. ``use_backend(name, ops=...)`` context manager (innermost wins);
2. environment variable ``MINDSPEED_OPS_BACKEND=<name>``;
3. the default: CPU tensors use ``reference`` (``triton`` when ``TRITON_INTERPRET=1``, which is how
   CI runs the real kernels without a GPU); CUDA tensors use the highest-priority registered
   backend that is available and supports the device's arch (``sm80``, ``sm90``, ...), ``triton``
   unless something faster is registered.

Asking for a backend that is not installed, not built, or cannot run on the device raises
:class:`BackendUnavailableError` naming the backend, the op and the reason.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

BACKENDS = ("reference", "triton", "tilelang", "cuda", "cutlass")
ENV_BACKEND = "MINDSPEED_OPS_BACKEND"


class BackendUnavailableError(RuntimeError):
    """The requested backend is not installed/built or cannot run on the tensors' device."""


@dataclass(frozen=True)
class Implementation:
    """One backend's implementation of one operator.

    ``fns`` holds the callables the family's autograd layer needs (e.g. ``forward``, ``backward``);
    their signatures are the family's business.
    """

    op: str
    backend: str
    fns: dict
    archs: Optional[frozenset] = None  # None: every arch the backend runs on
    priority: int = 0  # higher wins among available backends on CUDA

    def __getattr__(self, name: str) -> Callable:
        try:
            return self.fns[name]
        except KeyError:
            raise AttributeError(f"{self.op}[{self.backend}] has no function {name!r}") from None


_REGISTRY: dict[str, dict[str, Implementation]] = {}
_OVERRIDES: contextvars.ContextVar[tuple] = contextvars.ContextVar("mindspeed_ops_overrides", default=())


def register(op: str, backend: str, *, archs: Optional[Iterable[str]] = None, priority: Optional[int] = None,
             **fns: Callable) -> Implementation:
    """Register ``backend``'s implementation of ``op`` (its functions given as keywords)."""
    if backend not in BACKENDS:
        raise ValueError(f"register: backend must be one of {BACKENDS}, got {backend!r}")
    if priority is None:
        priority = {"reference": -100, "triton": 0}.get(backend, 10)
    impl = Implementation(op, backend, dict(fns), frozenset(archs) if archs else None, priority)
    _REGISTRY.setdefault(op, {})[backend] = impl
    _RESOLVED.clear()
    return impl


def unregister(op: str, backend: Optional[str] = None) -> None:
    """Remove ``op`` (one ``backend`` of it, or all) from the registry; for tests and plug-ins."""
    if backend is None:
        _REGISTRY.pop(op, None)
    else:
        _REGISTRY.get(op, {}).pop(backend, None)
    _RESOLVED.clear()


def clear_cache() -> None:
    """Forget cached selections (after changing what ``backend_status``/``device_arch`` report)."""
    _RESOLVED.clear()


def registered_ops() -> list[str]:
    _load_families()
    return sorted(_REGISTRY)


def registered_backends(op: str) -> list[str]:
    _load_families()
    return sorted(_REGISTRY.get(op, {}), key=BACKENDS.index)


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _cuda_arch(index: Optional[int]) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


def device_arch(device: torch.device | str) -> str:
    """``'cpu'`` or ``'sm<major><minor>'`` of a CUDA device (``'sm90'`` on H100/H200)."""
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_arch(device.index if device.index is not None else torch.cuda.current_device())
    return device.type


@functools.lru_cache(maxsize=None)
def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def backend_status(backend: str, device: torch.device | str) -> tuple[bool, str]:
    """(available, reason) for running ``backend`` on ``device``."""
    device = torch.device(device)
    if backend == "reference":
        return True, "pure PyTorch"
    if backend == "triton":
        if not _installed("triton"):
            return False, "triton is not installed (pip install triton)"
        if device.type == "cuda":
            return True, "CUDA"
        if device.type == "cpu" and triton_interpreting():
            return True, "CPU under TRITON_INTERPRET=1"
        return False, f"triton needs a CUDA device or TRITON_INTERPRET=1 (tensors are on {device})"
    if backend == "tilelang":
        if not _installed("tilelang"):
            return False, "tilelang is not installed (pip install mindspeed-ops[tilelang])"
        return (device.type == "cuda", "CUDA" if device.type == "cuda" else f"tilelang needs CUDA, got {device}")
    if backend in ("cuda", "cutlass"):
        if not _installed("mindspeed_ops._C"):
            return False, f"the compiled {backend} extension (mindspeed_ops._C) is not built in this install"
        return (device.type == "cuda", "CUDA" if device.type == "cuda" else f"{backend} needs CUDA, got {device}")
    return False, f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}"


def _requested(op: str) -> tuple[Optional[str], str, bool]:
    """The backend requested for ``op`` by an override, where the request came from, and whether it
    names ``op`` explicitly (``use_backend(..., ops=[op])``: then a missing implementation is an error;
    a global request falls back to the default for ops the backend does not implement)."""
    for name, ops in reversed(_OVERRIDES.get()):
        if ops is None or op in ops:
            return name, f"use_backend({name!r})", ops is not None
    env = os.environ.get(ENV_BACKEND, "").strip()
    if env:
        return env, f"{ENV_BACKEND}={env}", False
    return None, "default", False


def select(op: str, device: torch.device | str) -> str:
    """Name of the backend that runs ``op`` on ``device``."""
    return implementation(op, device).backend


_RESOLVED: dict = {}


def implementation(op: str, device: torch.device | str) -> Implementation:
    """The :class:`Implementation` of ``op`` for tensors on ``device`` (see module docstring).

    Called on every operator call, so the answer is cached per (op, device, overrides, environment);
    errors are not cached."""
    key = (op, str(device), _OVERRIDES.get(), os.environ.get(ENV_BACKEND), os.environ.get("TRITON_INTERPRET"))
    impl = _RESOLVED.get(key)
    if impl is None:
        impl = _resolve(op, device)
        _RESOLVED[key] = impl
    return impl


def _resolve(op: str, device: torch.device | str) -> Implementation:
    _load_families()
    device = torch.device(device)
    impls = _REGISTRY.get(op)
    if not impls:
        raise KeyError(f"no operator named {op!r} is registered; known: {', '.join(sorted(_REGISTRY))}")
    arch = device_arch(device)
    name, origin, explicit = _requested(op)
    if name is not None:
        ok, why = backend_status(name, device)
        if not ok:
            raise BackendUnavailableError(f"{op}: backend {name!r} requested by {origin} is not available: {why}")
        impl = impls.get(name)
        if impl is None:
            if explicit:
                raise BackendUnavailableError(
                    f"{op}: backend {name!r} requested by {origin} has no implementation of this op; "
                    f"available: {', '.join(registered_backends(op))}")
        elif impl.archs is not None and arch not in impl.archs:
            raise BackendUnavailableError(
                f"{op}: backend {name!r} supports archs {sorted(impl.archs)}, the device is {arch}")
        else:
            return impl
    if device.type == "cpu":
        key = "triton" if triton_interpreting() and "triton" in impls else "reference"
        return impls[key]
    candidates = sorted(
        (i for i in impls.values() if i.backend != "reference" and backend_status(i.backend, device)[0]
         and (i.archs is None or arch in i.archs)),
        key=lambda i: -i.priority)
    if candidates:
        return candidates[0]
    return impls["reference"]


@contextlib.contextmanager
def use_backend(name: str, ops: Optional[Iterable[str]] = None) -> Iterator[None]:
    """Run the enclosed code with backend ``name`` (for ``ops`` only, or every op when ``None``).

    Example: ``with mindspeed_ops.use_backend("reference"): y = api.l2norm(x)``.
    Raises ``ValueError`` for an unknown backend or op name; availability is checked when an op runs.
    """
    if name not in BACKENDS:
        raise ValueError(f"use_backend: name must be one of {BACKENDS}, got {name!r}")
    if ops is not None:
        ops = [ops] if isinstance(ops, str) else list(ops)
        unknown = sorted(set(ops) - set(registered_ops()))
        if unknown:
            raise ValueError(f"use_backend: unknown op name(s) {unknown}; known: {', '.join(registered_ops())}")
    token = _OVERRIDES.set(_OVERRIDES.get() + ((name, None if ops is None else frozenset(ops)),))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def overrides() -> tuple:
    """The ``use_backend`` choices in force here (an opaque value for :func:`with_overrides`)."""
    return _OVERRIDES.get()


@contextlib.contextmanager
def with_overrides(saved: tuple) -> Iterator[None]:
    """Run the enclosed code with the ``use_backend`` choices ``saved`` by :func:`overrides` elsewhere: a
    backward runs with those of its forward (on CUDA autograd runs it on a thread of its own, which
    does not see the caller's context)."""
    token = _OVERRIDES.set(saved)
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


_FAMILIES = ("activation", "norm", "norm.gated", "rope", "loss", "moe", "conv", "mhc", "gdn", "kda")
_loaded = False


def _load_families() -> None:
    """Import every family so that its ``register`` calls have run. A family that fails to import
    raises here, on every call, rather than leaving a silently partial registry."""
    global _loaded
    if _loaded:
        return
    for fam in _FAMILIES:
        importlib.import_module(f"mindspeed_ops.ops.{fam}")
    _loaded = True


def describe(device: torch.device | str) -> list[dict[str, Any]]:
    """One row per op: the backend that would run on ``device`` (or the error), for ``info``."""
    rows = []
    for op in registered_ops():
        try:
            chosen = select(op, device)
        except (BackendUnavailableError, KeyError) as e:
            chosen = f"error: {e}"
        rows.append({"op": op, "backend": chosen, "registered": registered_backends(op)})
    return rows


__all__ = [
    "BACKENDS", "BackendUnavailableError", "Implementation", "register", "unregister", "clear_cache", "registered_ops",
    "registered_backends", "device_arch", "backend_status", "select", "implementation", "use_backend",
    "triton_interpreting", "describe",
]
