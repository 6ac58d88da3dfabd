"""Safe arithmetic expressions of the ATK case files (shapes, kwargs, cost formulas).

A case file writes sizes in the dimension names of its shape points: ``shape: [N, 2*I]``,
``bytes_fwd: 2*N*D*e + D*e``, ``hc_mult: $n``. :func:`evaluate` computes such an expression from a
mapping of names; only numbers, names, lists, ``+ - * / // % **``, comparisons, ``and/or/not``,
``a if c else b``, subscripts and the functions in :data:`FUNCTIONS` are allowed (no attribute
access, no other calls), so a case file can never run arbitrary code.
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Any, Mapping


class ExprError(ValueError):
    """An expression that does not parse, uses a forbidden construct or an unknown name."""


def _pow2floor(x) -> int:
    """Largest power of two ``<= x`` (1 for ``x < 2``)."""
    x = int(x)
    return 1 if x < 2 else 1 << (x.bit_length() - 1)


def _cdiv(a, b) -> int:
    return -(-int(a) // int(b))


FUNCTIONS = {
    "min": min, "max": max, "sum": sum, "len": len, "abs": abs, "int": int, "float": float, "round": round,
    "ceil": math.ceil, "floor": math.floor, "log2": math.log2, "sqrt": math.sqrt, "prod": math.prod,
    "cdiv": _cdiv, "pow2floor": _pow2floor, "range": lambda *a: list(range(*a)),
    "cumsum": lambda xs: [sum(xs[: i + 1]) for i in range(len(xs))],
}

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
           ast.NotIn: lambda a, b: a not in b}
#: names always present (dtype constants) that an "unknown name" message does not list
_QUIET = {"dtype", "dtype_name", "fp32", "fp16", "bf16", "fp64", "int32", "int64", "bool", "uint8"}
_CONSTANTS = {"inf": math.inf, "nan": math.nan, "None": None, "True": True, "False": False,
              "true": True, "false": False, "null": None}


def _eval(node: ast.AST, names: Mapping[str, Any]):
    if isinstance(node, ast.Expression):
        return _eval(node.body, names)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (int, float, str, bool)) or node.value is None:
            return node.value
        raise ExprError(f"constant {node.value!r} is not allowed")
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        known = sorted(k for k in names if k not in _QUIET)
        raise ExprError(f"unknown name {node.id!r}; known: {', '.join(known) or '(none)'}")
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left, names), _eval(node.right, names))
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, names)
        if isinstance(node.op, ast.USub):
            return -v
        if isinstance(node.op, ast.UAdd):
            return +v
        if isinstance(node.op, ast.Not):
            return not v
    if isinstance(node, ast.BoolOp):
        vals = [_eval(v, names) for v in node.values]
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, names)
        for op, comp in zip(node.ops, node.comparators):
            if type(op) not in _CMPOPS:
                break
            right = _eval(comp, names)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        else:
            return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, names) if _eval(node.test, names) else _eval(node.orelse, names)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, names) for e in node.elts]
    if isinstance(node, ast.Subscript):
        return _eval(node.value, names)[_eval(node.slice, names)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS \
            and not node.keywords:
        return FUNCTIONS[node.func.id](*[_eval(a, names) for a in node.args])
    raise ExprError(f"{type(node).__name__} is not allowed in a case-file expression")


def evaluate(expr: Any, names: Mapping[str, Any]) -> Any:
    """Value of ``expr`` (a number, a list of expressions or an expression string) given ``names``.

    Raises:
        ExprError: syntax error, forbidden construct, unknown name or a failing operation (the message
            quotes the expression).
    """
    if isinstance(expr, bool) or expr is None or isinstance(expr, (int, float)):
        return expr
    if isinstance(expr, (list, tuple)):
        return [evaluate(e, names) for e in expr]
    if not isinstance(expr, str):
        raise ExprError(f"expected a number or an expression string, got {type(expr).__name__} {expr!r}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"cannot parse {expr!r}: {e.msg}") from None
    try:
        return _eval(tree, names)
    except ExprError as e:
        raise ExprError(f"{expr!r}: {e}") from None
    except (TypeError, ZeroDivisionError, IndexError, KeyError, ValueError, OverflowError) as e:
        raise ExprError(f"{expr!r}: {type(e).__name__}: {e}") from None


def is_ref(value: Any) -> bool:
    """A ``$expr`` string (an expression inside ``kwargs`` or tensor parameters)."""
    return isinstance(value, str) and value.startswith("$")


def resolve(value: Any, names: Mapping[str, Any]) -> Any:
    """``$expr`` strings evaluated (recursively inside lists and dicts); everything else unchanged."""
    if is_ref(value):
        return evaluate(value[1:], names)
    if isinstance(value, list):
        return [resolve(v, names) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, names) for k, v in value.items()}
    return value


__all__ = ["ExprError", "FUNCTIONS", "evaluate", "is_ref", "resolve"]
