"""Check cases: how ``mindspeed-ops check`` (and later ATK) runs an operator against its reference.

Each family lists its cases in ``ops/<family>/checks.py`` as ``CASES: list[CheckCase]``. A case says
how to make inputs at a small (CPU/interpreter) or real (GPU) shape, how to call the library and the
reference with them, and which threshold class (SPEC 0.9) applies to each output and gradient.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class CheckCase:
    """One operator call to verify.

    Attributes:
        op: registered op name (``backends.registered_ops()``).
        name: short label for tables, e.g. ``"[8192, 4096]"``.
        make_inputs: ``(device, dtype, small) -> dict`` of keyword arguments (tensors and options).
            ``small=True`` on CPU (interpreter budget: ~100 programs a launch), real shapes otherwise.
            Tensors listed in ``grad_inputs`` must be floating point.
        run: ``(**inputs) -> Tensor | tuple`` calling the library (``api``) function.
        reference: ``(**inputs) -> Tensor | tuple`` calling the reference on the same arguments (the
            runner passes float64 copies of the floating tensors).
        out_classes: threshold class per output of ``run`` (``None`` skips an output, e.g. a returned
            input alias).
        grad_inputs: names of inputs whose gradient is compared (empty: forward-only).
        grad_class: threshold class of those gradients.
        dtypes: dtypes to run on GPU; on CPU the runner drops bf16 (interpreter trap).
    """

    op: str
    name: str
    make_inputs: Callable[..., dict]
    run: Callable[..., object]
    reference: Callable[..., object]
    out_classes: Sequence = ("E-fwd",)
    grad_inputs: Sequence[str] = ()
    grad_class: str = "E-bwd"
    dtypes: Sequence[torch.dtype] = field(default_factory=lambda: DTYPES)


def all_cases() -> list[CheckCase]:
    """Every family's cases, in family order."""
    import importlib

    from .backends import _FAMILIES

    cases: list[CheckCase] = []
    for fam in _FAMILIES:
        try:
            mod = importlib.import_module(f"mindspeed_ops.ops.{fam}.checks")
        except ModuleNotFoundError as e:
            if e.name != f"mindspeed_ops.ops.{fam}.checks":
                raise
            continue
        cases.extend(mod.CASES)
    return cases
