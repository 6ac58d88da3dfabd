"""A faster CPU interpreter run (``TRITON_INTERPRET=1``, how CI runs the kernels): one redundant step skipped.

Triton 3.6's interpreter patches ``triton.language`` (wrappers for every builtin of ``tl``, ``tl.core``,
``tl.math`` and ``tl.tensor``, found with ``inspect.getmembers``) when a launch starts, and undoes it when the
launch ends. It does the same again on every call of a ``@triton.jit`` helper from inside the kernel: once
per helper call per program instance, each time building the same wrappers over the same modules. In the
KDA kernels (many helper calls per program) that repeated patching was ~40% of a test's time.
Also, the interpreter's numpy dtype of a Triton type rebuilds a 17-entry table on every operation; the
table is built once instead.

:func:`install` makes the nested patching a no-op when the launch already patched the modules the helper
sees (the common case: both import ``triton.language``); anything else goes through Triton's own code. The
kernels run the same interpreted operations either way. Only Triton 3.6's interpreter is touched (version
and names checked); otherwise :func:`install` does nothing, as it does with
``MINDSPEED_OPS_INTERPRETER_SPEEDUP=0`` (or false/off/no) in the environment.
"""
from __future__ import annotations

import inspect

from .triton_utils import env_switch

_state = {"installed": False, "langs": None}  # langs: lang modules patched by the running launch (None: no launch)


class _NoRestore:
    @staticmethod
    def restore() -> None:
        pass


def install() -> bool:
    """Install the skip (idempotent). Returns whether it is active."""
    if _state["installed"]:
        return True
    if not env_switch("MINDSPEED_OPS_INTERPRETER_SPEEDUP"):  # off: Triton's interpreter as shipped
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    import triton

    if not triton.__version__.startswith("3.6."):  # the internals below are Triton 3.6's
        return False
    original = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if original is None or executor is None or "__call__" not in vars(executor):
        return False
    lang_modules = (tl, tl.core)
    launch = executor.__call__

    def patch_lang(fn):
        active = _state["langs"]
        if active is None:  # not inside a launch: Triton's own behaviour
            return original(fn)
        langs = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in lang_modules)
        if langs and langs <= active:  # a helper inside a launch that already patched its modules
            return _NoRestore
        scope = original(fn)  # the launch's own patching (restored when it ends), or modules it did not patch
        _state["langs"] = active | langs
        return scope

    def launch_tracked(self, *args, **kwargs):
        _state["langs"] = frozenset()
        try:
            return launch(self, *args, **kwargs)
        finally:
            _state["langs"] = None

    patch_lang.__wrapped__, launch_tracked.__wrapped__ = original, launch
    interpreter._patch_lang = patch_lang
    executor.__call__ = launch_tracked
    np_dtype = getattr(interpreter, "_get_np_dtype", None)
    if np_dtype is not None:
        interpreter._get_np_dtype = _np_dtype_table(np_dtype, tl)
    _state["installed"] = True
    return True


def uninstall() -> None:
    """Put Triton's own functions back (tests)."""
    if not _state["installed"]:
        return
    from triton.runtime import interpreter

    interpreter._patch_lang = interpreter._patch_lang.__wrapped__
    interpreter.GridExecutor.__call__ = interpreter.GridExecutor.__call__.__wrapped__
    if hasattr(interpreter._get_np_dtype, "__wrapped__"):
        interpreter._get_np_dtype = interpreter._get_np_dtype.__wrapped__
    _state.update(installed=False, langs=None)


def _np_dtype_table(original, tl):
    """``original`` (Triton's Triton-type -> numpy-dtype function) with its answers for the scalar types
    computed once; pointers and block types resolve as Triton does (element type, pointer -> uint64)."""
    table = {}
    for name in dir(tl):
        ty = getattr(tl, name)
        if isinstance(ty, tl.dtype) and not isinstance(ty, (tl.pointer_type, tl.block_type)):
            try:
                table[ty] = original(ty)
            except (KeyError, TypeError):
                pass
    pointer = original(tl.pointer_type(tl.float32))

    def np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):
            return pointer
        found = table.get(tt_dtype)
        return original(tt_dtype) if found is None else found

    np_dtype.__wrapped__ = original
    return np_dtype
