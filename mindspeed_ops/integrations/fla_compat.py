"""Serve ``chunk_gated_delta_rule`` / ``chunk_kda`` where transformers looks for flash-linear-attention.

transformers decorates its pure-PyTorch linear-attention functions with
``use_kernel_func_from_hub_with_fallback(name, "fla")``: when its modeling module is imported it
tries ``import fla`` and takes ``fla.<name>`` or ``fla.ops.<family>.<name>`` instead of the PyTorch
code. :func:`install` adds an import hook that answers ``fla``, ``fla.ops``,
``fla.ops.gated_delta_rule`` and ``fla.ops.kda`` with small modules exposing our operators:

- ``chunk_gated_delta_rule`` and, when this build has them, ``fused_recurrent_gated_delta_rule``
  (forward-only decode), ``chunk_kda`` and ``fused_recurrent_kda`` (``chunk_kda`` without gradients);
  a name this build lacks is simply absent, so transformers keeps its PyTorch function for it.

It never shadows a real fla: the hook sits at the end of ``sys.meta_path`` (any installed ``fla`` is
found first), it refuses to serve submodules of a ``fla`` that is not its own, and :func:`install`
does nothing when ``fla`` is importable. The shim reports version ``0.0.0+mindspeed.ops``, so
``transformers.utils.is_flash_linear_attention_available()`` stays ``False`` and nothing mistakes it
for the real library. Call :func:`install` before transformers imports the modeling modules (models
already imported keep what they found; use :func:`mindspeed_ops.integrations.transformers.apply`).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Optional

SHIM_VERSION = "0.0.0+mindspeed.ops"
_PACKAGES = ("fla", "fla.ops")
_LEAVES = {"fla.ops.gated_delta_rule": ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"),
           "fla.ops.kda": ("chunk_kda", "fused_recurrent_kda")}


def _resolve(name: str):
    """Our callable for an fla name, or ``None`` when this build has no such operator."""
    from .. import api

    if name in ("chunk_gated_delta_rule", "chunk_kda"):
        fn = getattr(api, name, None)
        return fn if callable(fn) else None
    if name == "fused_recurrent_gated_delta_rule":
        fn = getattr(api, name, None)
        if callable(fn):
            return fn
        try:
            from ..api.triton.fused_recurrent_gated_delta_rule import fused_recurrent_gated_delta_rule
        except ImportError:
            return None
        return fused_recurrent_gated_delta_rule
    if name == "fused_recurrent_kda":
        chunk_kda = getattr(api, "chunk_kda", None)
        if not callable(chunk_kda):
            return None

        def fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                                use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
            """Decode-time KDA: ``chunk_kda`` (SPEC 2.2: it computes the same math at ``T = 1``)."""
            if initial_state is not None:
                initial_state = initial_state.float()
            return chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                             cu_seqlens=cu_seqlens)
        return fused_recurrent_kda
    return None


def _module_getattr(names: tuple):
    def __getattr__(attr: str):
        if attr in names:
            fn = _resolve(attr)
            if fn is not None:
                return fn
        raise AttributeError(attr)
    return __getattr__


class _ShimFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import hook for the ``fla`` shim (placed last on ``sys.meta_path``)."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in _PACKAGES and fullname not in _LEAVES:
            return None
        if fullname != "fla" and not is_shim(sys.modules.get("fla")):
            return None  # a real fla is loaded: never add modules to it
        return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in _PACKAGES)

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        module.__file__ = __file__
        module.__mindspeed_ops_shim__ = True
        module.__version__ = SHIM_VERSION
        module.__doc__ = f"mindspeed_ops stand-in for {name} (see mindspeed_ops.integrations.fla_compat)"
        if name in _PACKAGES:
            module.__path__ = []
        names = _LEAVES.get(name, ())
        if name == "fla":
            names = tuple(n for leaf in _LEAVES.values() for n in leaf)
        module.__getattr__ = _module_getattr(names)


_FINDER: Optional[_ShimFinder] = None


def is_shim(module) -> bool:
    """Whether ``module`` is one of this shim's modules."""
    return bool(getattr(module, "__mindspeed_ops_shim__", False))


def fla_installed() -> bool:
    """Whether a real flash-linear-attention is importable (the shim aside)."""
    if is_shim(sys.modules.get("fla")):
        return False
    was = _FINDER in sys.meta_path
    if was:
        sys.meta_path.remove(_FINDER)
    try:
        return importlib.util.find_spec("fla") is not None
    except (ImportError, ValueError):
        return False
    finally:
        if was:
            sys.meta_path.append(_FINDER)


def install() -> bool:
    """Add the ``fla`` shim import hook; returns ``True`` when it is (now or already) in place,
    ``False`` when a real fla is installed (then nothing is changed)."""
    global _FINDER
    if fla_installed():
        return False
    if _FINDER is None:
        _FINDER = _ShimFinder()
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    return True


def uninstall() -> None:
    """Remove the hook and the shim modules from ``sys.modules`` (modeling modules that already bound
    our functions keep them)."""
    if _FINDER is not None and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in list(sys.modules):
        if (name == "fla" or name.startswith("fla.")) and is_shim(sys.modules[name]):
            del sys.modules[name]


__all__ = ["install", "uninstall", "is_shim", "fla_installed", "SHIM_VERSION"]
