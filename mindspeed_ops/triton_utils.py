"""Helpers shared by every Triton launcher, including the shim for the CPU interpreter.

Under ``TRITON_INTERPRET=1`` (how CI runs the real kernels on CPU) the stock interpreter has traps
that give silent wrong answers or crashes (DESIGN section 7). This module hides them so kernels are
written once for the GPU:

1. bf16 arithmetic is garbage in the interpreter (raw uint16 bits) and fp32->bf16 stores truncate.
   Launchers pass tensors through :func:`kernel_input` (bf16 -> fp32 copy when interpreting) and
   allocate outputs with :func:`kernel_dtype`; :func:`finish` rounds fp32 results back to bf16 with
   PyTorch (round-to-nearest-even, the single rounding the spec asks for). On the GPU these are
   no-ops.
2. ``@triton.autotune`` with several configs raises "0 active drivers": :func:`autotune` keeps only
   the first config under the interpreter.
3. ``libdevice`` functions are stubs: kernels use ``tl.exp``/``tl.sigmoid``/``tl.rsqrt``/... only.
4. float scalars stay Python floats and loop variables Python ints: kernels use ``tl.cast(x, dtype)``
   (works on both) instead of ``x.to(dtype)`` on those values; :func:`i64` is a jit helper for it.
5. numpy >= 2.4 breaks runtime loop bounds: CI pins ``numpy<2.4``; :func:`check_interpreter_env`
   says so loudly.
6. ``tl.device_assert`` never fires: launchers validate on the host (``mindspeed_ops.validation``).
"""
from __future__ import annotations

import importlib.util
import os
from typing import Iterable, Optional, Sequence

import torch

# triton (a Linux-only dependency; the reference path works without it) is imported on first use, never by
# ``import mindspeed_ops``: ``@triton.jit`` fixes compiled or interpreted mode when a function is decorated
# (triton.language's own helpers included, at triton's import), so TRITON_INTERPRET=1 can still be set
# after ``import mindspeed_ops`` registered the operators, as the CLI does for a CPU run
HAS_TRITON = importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return _env_value(b"TRITON_INTERPRET", "TRITON_INTERPRET") == "1"


def check_interpreter_env() -> None:
    """Raise if the interpreter would silently mis-execute runtime-bounded loops (numpy >= 2.4)."""
    if not interpreting():
        return
    import numpy as np

    major, minor = (int(p) for p in np.__version__.split(".")[:2])
    if (major, minor) >= (2, 4):
        raise RuntimeError(
            f"TRITON_INTERPRET=1 with numpy {np.__version__}: the Triton interpreter mis-runs loops with "
            "runtime bounds on numpy >= 2.4; install 'numpy<2.4'")


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype a kernel should read/write for a tensor of ``dtype`` (fp32 for bf16 when interpreting)."""
    if dtype == torch.bfloat16 and interpreting():
        return torch.float32
    return dtype


def kernel_input(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t`` as the kernel should see it: an fp32 copy of a bf16 tensor under the interpreter."""
    if t is None or t.dtype != torch.bfloat16 or not interpreting():
        return t
    return t.float()


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Copy a small host tensor (offsets, index tables) to ``device`` without draining the stream: a copy
    from pageable memory waits for all queued GPU work; from pinned memory it is queued like a kernel."""
    device = torch.device(device)
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def finish(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round a kernel output to ``dtype`` if the shim widened it (no-op otherwise)."""
    return t if t.dtype == dtype else t.to(dtype)


def autotune(configs: Sequence, key: Iterable[str], **kwargs):
    """``triton.autotune`` that keeps one config under the interpreter (which cannot benchmark), and keeps its
    choices in Triton's cache directory (``cache_results``): a later process on the same machine reuses them
    instead of timing again (seconds per new shape saved), so it also runs the same configurations (SPEC 0.6:
    bitwise run to run where a configuration could change a summation order)."""
    kwargs.setdefault("cache_results", True)
    configs = list(configs)
    prune = kwargs.get("prune_configs_by")
    kept = configs
    if interpreting():
        kept = configs[:1]
        kwargs.pop("prune_configs_by", None)
    import triton

    decorate = triton.autotune(configs=kept, key=list(key), **kwargs)

    def wrap(fn):
        tuner = decorate(fn)
        # every config and the pruning rule, for mindspeed_ops.compile_check (the interpreter runs only the first)
        tuner.all_configs, tuner.all_prune_configs_by = configs, prune
        return _lean(tuner) if len(kept) > 1 else tuner

    return wrap


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def dot_tile(n: int, cap: int) -> int:
    """Tile of a ``tl.dot`` operand dimension of size ``n``: a power of two in ``[16, cap]`` (16 is the smallest
    inner dimension NVIDIA's backend builds)."""
    return max(16, min(cap, next_power_of_2(n)))


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (a small stand-in on CPU: the interpreter is serial)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


_LAZY: dict = {}


def __getattr__(name: str):
    """PEP 562: ``triton``, ``tl`` and the shared jit helpers (``i64``, ``sigmoid_f32``, ``sigmoid_fast_f32``),
    made on first use (when a kernel module imports them), so that importing this module never loads triton."""
    if name not in ("triton", "tl", "i64", "sigmoid_f32", "sigmoid_fast_f32", "exp_fast_f32") or not HAS_TRITON:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _LAZY:
        _LAZY.update(_jit_helpers())
    return _LAZY[name]


def _jit_helpers() -> dict:
    global triton, tl  # module globals: the helpers' bodies look ``tl`` up here when they are compiled
    import triton
    import triton.language as tl

    @triton.jit
    def i64(x):
        """``x`` as int64; works on tensors and on the interpreter's Python-int loop variables."""
        return tl.cast(x, tl.int64)

    @triton.jit
    def sigmoid_f32(x):
        """Sigmoid in fp32 with ``tl.exp`` (no libdevice, which the interpreter stubs out)."""
        return 1.0 / (1.0 + tl.exp(-x))

    global _COMPILED
    # constexpr: the helpers are compiled (not interpreted) on an NVIDIA build, so inline PTX is available
    _COMPILED = tl.constexpr(isinstance(i64, triton.runtime.JITFunction) and torch.version.hip is None)

    @triton.jit
    def sigmoid_fast_f32(x):
        """Sigmoid in fp32 as ``1 / (1 + 2^(-x·log2 e))`` with the flush-to-zero ``ex2``/``rcp`` approximations
        (PTX ISA: at most 2 ulp each): two MUFU ops and two FP32 ops, where ``tl.exp`` and ``/`` add range
        fix-ups (~13 instructions in all). For kernels that are bound by instruction issue (causal_conv1d).
        Differs from :func:`sigmoid_f32` by a few ulp; 0 and 1 at the extremes as there. Interpreted: that one."""
        if _COMPILED:
            e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * -1.4426950408889634],
                                          dtype=tl.float32, is_pure=True, pack=1)
            s = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [e + 1.0], dtype=tl.float32,
                                          is_pure=True, pack=1)
        else:
            s = 1.0 / (1.0 + tl.exp(-x))
        return s

    @triton.jit
    def exp_fast_f32(x):
        """``e^x`` in fp32 as the flush-to-zero ``ex2.approx.ftz.f32`` of ``x·log2 e`` (compiled on NVIDIA): one FP32
        and one MUFU instruction, where ``tl.exp`` adds a compare and two predicated multiplies for subnormal
        results. Equal to ``tl.exp`` wherever that is a normal number; 0 where it is subnormal (x < ~-87.3)."""
        if _COMPILED:
            e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * 1.4426950408889634],
                                          dtype=tl.float32, is_pure=True, pack=1)
        else:
            e = tl.exp(x)
        return e

    return {"triton": triton, "tl": tl, "i64": i64, "sigmoid_f32": sigmoid_f32, "sigmoid_fast_f32": sigmoid_fast_f32,
            "exp_fast_f32": exp_fast_f32}


# ------------------------------------------------------------------------------------------------
# Below the jit helpers on purpose: Triton's cache key of a jit function includes its starting line, and every
# kernel's key includes its helpers' keys; code added above ``_jit_helpers`` would recompile every kernel once.
# ------------------------------------------------------------------------------------------------

# os.environ's own byte-keyed store on POSIX (os.environ[...] = ... and monkeypatch.setenv update it): one dict
# lookup instead of os.environ.get's key encoding and value decoding, ~1.5 µs per call otherwise; launchers ask
# whether they run interpreted once per tensor (~70 times per Gated DeltaNet training step)
_ENV_BYTES = getattr(os.environ, "_data", None) if os.name == "posix" else None


def _env_value(key_bytes: bytes, key: str, default: str = "0") -> str:
    if _ENV_BYTES is not None:
        value = _ENV_BYTES.get(key_bytes)
        return default if value is None else value.decode()
    return os.environ.get(key, default)


def env_switch(name: str) -> bool:
    """An on/off environment switch that defaults to on: 0/false/off/no (any case) turn it off, 1/true/on/yes
    or unset keep it on; another value warns and keeps it on."""
    import warnings

    value = os.environ.get(name, "1").strip().lower()
    if value in ("0", "false", "off", "no"):
        return False
    if value not in ("", "1", "true", "on", "yes"):
        warnings.warn(f"{name}={os.environ[name]!r} is not one of 0/1/false/true/off/on/no/yes: kept on",
                      stacklevel=2)
    return True


def _lean(tuner):
    """``tuner`` with :func:`_fast_tuner_class` as its class when the switch is on and it has what that reads."""
    if env_switch("MINDSPEED_OPS_FAST_AUTOTUNE") and _fast_tuner_ok(tuner):
        tuner.__class__ = _fast_tuner_class()
    return tuner


def _fast_tuner_ok(tuner) -> bool:
    """Whether ``tuner`` has the fields :class:`_CachedKeyAutotuner` reads (Triton 3.x's Autotuner)."""
    return all(hasattr(tuner, a) for a in ("keys", "arg_names", "cache", "configs", "fn")) and not any(
        getattr(tuner, a, False) for a in ("user_defined_pre_hook", "reset_to_zero", "restore_value"))


_FAST_TUNER: list = []


def _fast_tuner_class():
    """A subclass of Triton's ``Autotuner`` whose launches with an already-tuned key skip its generic key
    building (a dict of every argument, a ``hasattr`` per argument: ~30 µs of host time per launch on the H200's
    host, most of a small kernel's launch). The key is the same tuple Triton builds, so its disk cache and
    ``self.cache`` are shared; a key not yet tuned, a single kept config, a config with a pre-hook, or a patched
    ``Autotuner.run`` (compile_check's recorder) take Triton's own path."""
    if _FAST_TUNER:
        return _FAST_TUNER[0]
    from triton.runtime.autotuner import Autotuner

    class _CachedKeyAutotuner(Autotuner):
        def run(self, *args, **kwargs):
            config = self.cache.get(tuning_key(self, args, kwargs)) if len(self.configs) > 1 else None
            if config is None or config.pre_hook is not None or not _is_tritons_run(Autotuner.run):
                return Autotuner.run(self, *args, **kwargs)
            self.best_config = config
            return self.fn.run(*args, **kwargs, **config.all_kwargs())

    _FAST_TUNER.append(_CachedKeyAutotuner)
    return _CachedKeyAutotuner


def _is_tritons_run(fn) -> bool:
    """``fn`` is Triton's own ``Autotuner.run`` (not a patch installed over it, whenever that happened)."""
    return getattr(fn, "__qualname__", None) == "Autotuner.run" and \
        getattr(fn, "__module__", None) == "triton.runtime.autotuner"


_DTYPE_STR: dict = {}


def tuning_key(tuner, args: tuple, kwargs: dict) -> tuple:
    """The tuple Triton's ``Autotuner.run`` caches a choice under: the values of the key arguments given
    (positionally or by keyword; keys that are not kernel arguments are left out), then ``str(dtype)`` of every
    argument that has a ``dtype``, positional ones first, in order."""
    names = tuner.arg_names
    plan = tuner.__dict__.get("_key_plan")
    if plan is None or plan[0] != len(args):
        index = {n: i for i, n in enumerate(names)}
        plan = tuner._key_plan = (len(args), [(k, index[k]) for k in tuner.keys if k in index], frozenset(names))
    n_pos, key_idx, name_set = plan
    key = []
    for name, i in key_idx:
        if i < n_pos:
            key.append(args[i])
        elif name in kwargs:
            key.append(kwargs[name])
    for a in args[:len(names)] if n_pos > len(names) else args:
        if type(a) is torch.Tensor:
            d = a.dtype
            s = _DTYPE_STR.get(d)
            if s is None:
                s = _DTYPE_STR[d] = str(d)
            key.append(s)
        elif hasattr(a, "dtype"):
            key.append(str(a.dtype))
    for name, a in kwargs.items():
        if name in name_set and hasattr(a, "dtype"):
            key.append(str(a.dtype))
    return tuple(key)
