"""Case files of the ATK harness: ``tests/atk_tests/<op>.yaml`` -> :class:`OpSpec`.

One file per operator. Top-level keys give the defaults of every case; each entry of ``cases``
overrides them (``inputs`` field by field per tensor, ``kwargs``/``cost``/``memory`` key by key,
everything else wholesale) and lists its shape points. Full reference: ``tests/atk_tests/README.md``.

```yaml
op: rms_norm                                   # must equal the file name
family: norm                                   # plots: one PNG per family
spec: "1.2"                                    # SPEC section
call: mindspeed_ops.api:rms_norm               # default: mindspeed_ops.api:<op>
reference: mindspeed_ops.ops.norm.reference:rms_norm
dispatch_op: rms_norm                          # registered op that --backends applies to (default: op)
inputs:                                        # tensors, in call order; shapes are expressions of the dims
  x: {shape: [N, D]}
  weight: {shape: [D], scale: 0.5, shift: 1.0}
kwargs: {eps: 1.0e-6}                          # "$expr" strings are evaluated (dims, fp32/bf16/..., dtype)
call_kwargs: {}                                # arguments only our operator takes (not the reference)
outputs: [E-fwd]                               # SPEC 0.9 class (or a number, or null: not compared) per output
grads: [x, weight]                             # inputs whose gradients are compared / timed
grad_class: E-bwd
dtypes: {accuracy: [fp32, fp16, bf16], performance: [bf16]}
cost: {bytes_fwd: "2*n_x*e + n_weight*e_weight", bytes_bwd: "3*n_x*e + 2*n_weight*e_weight"}
baselines: [eager, compile, torch_rms_norm, liger_rms_norm]
cases:
  - name: hidden rows
    shapes:
      - {N: 64, D: 128, cpu: true}             # cpu: run on CPU (interpreter) too
      - {N: 8192, D: 4096, quick: true}        # quick: kept by --quick
  - name: large-mean rows
    values: boundary                           # normal | boundary | special
    inputs: {x: {shift: 1000}}
    shapes: [{N: 3, D: 769, cpu: true}]
```

:func:`load_spec` validates everything it can without importing an operator (structure, names,
dtypes, threshold classes, baseline names, and every expression at every shape point) and raises
:class:`AtkSpecError` listing each problem as ``file: location: message``.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from .expr import ExprError, evaluate, resolve

SUITES = ("accuracy", "performance", "memory", "determinism")
VALUE_KINDS = ("normal", "boundary", "special")
FLOAT_DTYPES = ("fp32", "fp16", "bf16")
DTYPE_NAMES = {  # spelling in case files -> canonical short name
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "fp64": "fp64", "float64": "fp64",
    "int32": "int32", "int64": "int64", "long": "int64", "bool": "bool", "uint8": "uint8",
}
DEFAULT_DTYPES = {"accuracy": ["fp32", "fp16", "bf16"], "performance": ["bf16"], "memory": ["bf16"],
                  "determinism": ["bf16", "fp32"]}

#: distribution -> its parameters (every tensor may also use COMMON_TENSOR_KEYS)
DISTS: dict[str, set] = {
    "normal": {"scale", "shift"},
    "uniform": {"low", "high"},
    "choice": {"values"},
    "gate": {"s", "zero_frac"},
    "sigmoid": {"scale"},
    "randint": {"low", "high"},
    "labels": {"V", "ignore_frac", "invalid_frac", "ignore_index"},
    "cu_seqlens": {"lens"},
    "splits": {"total", "zeros"},
    "permutation": set(),
    "positions": {"segments"},
    "zeros": set(),
    "ones": set(),
    "full": {"value"},
    "tril_chunk": {"scale", "upper"},
}
INT_DISTS = {"randint", "labels", "cu_seqlens", "splits", "permutation", "positions"}
COMMON_TENSOR_KEYS = {"shape", "dtype", "dist", "fill", "inject", "transpose", "noncontig", "seed", "device", "when"}
BUILDER_KEYS = {"builder", "args", "dtype", "seed", "device", "when"}
SHAPE_RESERVED = {"cpu", "quick", "label", "suites"}
COST_KEYS = {"bytes_fwd", "bytes_bwd", "flops_fwd", "flops_bwd", "size", "bound"}
MEMORY_KEYS = {"bound_fwd", "bound_fwd_bwd"}

# keys valid at the top level and (as overrides) in a case
_SHARED_KEYS = {"call", "reference", "dispatch_op", "inputs", "kwargs", "call_kwargs", "let", "outputs", "output_names", "grads",
                "grad_class", "err_atol", "nan_mask", "mutates", "dtypes", "baselines", "cost", "memory",
                "description"}
_TOP_KEYS = _SHARED_KEYS | {"op", "family", "spec", "cases"}
_CASE_KEYS = _SHARED_KEYS | {"name", "values", "suites", "shapes"}


class AtkSpecError(ValueError):
    """A case file that does not follow the schema; ``problems`` lists ``location: message`` lines."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = list(problems)
        lines = "\n".join(f"  {path}: {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in ATK case file {path}:\n{lines}")


@dataclass
class ShapePoint:
    """One point of a case's sweep: dimension values plus the reserved flags."""

    dims: dict
    cpu: bool = False
    quick: bool = False
    label: Optional[str] = None
    suites: Optional[tuple] = None

    def text(self) -> str:
        """``label`` or ``N=8192 D=4096``."""
        return self.label or " ".join(f"{k}={v}" for k, v in self.dims.items())


@dataclass
class CaseSpec:
    """One case of an operator file, with the op-level defaults merged in."""

    op: str
    family: str
    name: str
    call: str
    reference: str
    dispatch_op: Optional[str]
    inputs: dict
    kwargs: dict
    call_kwargs: dict
    let: dict
    outputs: list
    output_names: Optional[list]
    grads: list
    grad_class: Any
    err_atol: Optional[float]
    nan_mask: bool
    mutates: list
    dtypes: dict
    baselines: list
    cost: dict
    memory: dict
    values: str
    suites: tuple
    shapes: list
    description: str = ""

    @property
    def forward_only(self) -> bool:
        return not self.grads

    def names(self, dims: dict, dtype: Optional[str] = None) -> dict:
        """Expression names at a shape point: the dims, the ``let`` values, ``dtype`` (short name)."""
        names = dict(dims)
        if dtype is not None:
            names["dtype_name"] = dtype
        for k, v in self.let.items():
            names[k] = evaluate(v, names)
        return names


@dataclass
class OpSpec:
    """A parsed, validated ``<op>.yaml``."""

    op: str
    family: str
    spec: str
    path: str
    description: str
    cases: list = field(default_factory=list)


def default_atk_dir() -> str:
    """``$MINDSPEED_OPS_ATK_DIR`` or ``<repo>/tests/atk_tests`` (next to the ``mindspeed_ops`` package)."""
    env = os.environ.get("MINDSPEED_OPS_ATK_DIR")
    if env:
        return env
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(here, "tests", "atk_tests")


def spec_paths(atk_dir: str) -> dict[str, str]:
    """``{op: path}`` of every ``*.yaml`` in ``atk_dir`` (files starting with ``_`` are skipped)."""
    if not os.path.isdir(atk_dir):
        why = "is not a directory" if os.path.exists(atk_dir) else "does not exist"
        raise FileNotFoundError(f"ATK case directory {atk_dir!r} {why} (use --atk-dir)")
    out = {}
    for f in sorted(os.listdir(atk_dir)):
        if f.endswith((".yaml", ".yml")) and not f.startswith("_"):
            out[os.path.splitext(f)[0]] = os.path.join(atk_dir, f)
    if not out:  # a wrong --atk-dir must not "validate" or list nothing silently
        raise FileNotFoundError(f"ATK case directory {atk_dir!r} has no *.yaml case files (use --atk-dir)")
    return out


def param(value: Any, names: dict) -> Any:
    """A tensor parameter: strings are expressions (a leading ``$`` is optional), lists are evaluated
    element-wise, numbers stay as they are."""
    if isinstance(value, str):
        return evaluate(value[1:] if value.startswith("$") else value, names)
    return evaluate(value, names)


# ---------------------------------------------------------------------------------------------------
# validation helpers


class _Problems:
    def __init__(self):
        self.items: list[str] = []

    def add(self, where: str, msg: str) -> None:
        self.items.append(f"{where}: {msg}")


def _dtype_ok(name: Any) -> bool:
    return isinstance(name, str) and (name in DTYPE_NAMES or name == "case")


def _check_unknown(p: _Problems, where: str, d: dict, allowed: set) -> None:
    for k in d:
        if k not in allowed:
            p.add(where, f"unknown key {k!r}; allowed: {', '.join(sorted(allowed))}")


def _check_class(p: _Problems, where: str, cls: Any) -> None:
    from ..testing import THRESHOLDS

    if cls is None or (isinstance(cls, (int, float)) and not isinstance(cls, bool) and cls >= 0):
        return
    if isinstance(cls, str) and cls in THRESHOLDS:
        return
    p.add(where, f"threshold must be a SPEC 0.9 class ({', '.join(THRESHOLDS)}), a number >= 0 or null, "
                 f"got {cls!r}")


def _check_tensor(p: _Problems, where: str, name: str, spec: Any) -> None:
    w = f"{where}.{name}"
    if spec is None:
        return
    if not isinstance(spec, dict):
        p.add(w, f"must be a mapping (shape, dist, ...), got {type(spec).__name__}")
        return
    if "builder" in spec:
        from .inputs import BUILDERS

        _check_unknown(p, w, spec, BUILDER_KEYS)
        if spec["builder"] not in BUILDERS:
            p.add(w, f"unknown builder {spec['builder']!r}; known: {', '.join(sorted(BUILDERS))}")
        if "args" in spec and not isinstance(spec["args"], dict):
            p.add(w, "args must be a mapping")
    else:
        dist = spec.get("dist", "normal")
        if dist not in DISTS:
            p.add(w, f"unknown dist {dist!r}; known: {', '.join(DISTS)}")
            return
        _check_unknown(p, w, spec, COMMON_TENSOR_KEYS | DISTS[dist])
        if "shape" not in spec:
            p.add(w, "missing 'shape'")
        elif not isinstance(spec["shape"], list):
            p.add(w, f"shape must be a list of dimension expressions, got {spec['shape']!r}")
        if dist == "choice" and not isinstance(spec.get("values"), list):
            p.add(w, "dist 'choice' needs a list 'values'")
        if dist == "cu_seqlens" and "lens" not in spec:
            p.add(w, "dist 'cu_seqlens' needs 'lens'")
        if dist == "labels" and "V" not in spec:
            p.add(w, "dist 'labels' needs 'V' (vocabulary size)")
        for f in spec.get("fill") or []:
            if not isinstance(f, dict) or "value" not in f:
                p.add(w, f"fill entries need 'value' (and dim/start/stop), got {f!r}")
            else:
                _check_unknown(p, f"{w}.fill", f, {"value", "dim", "start", "stop"})
        inj = spec.get("inject")
        if inj is not None:
            if not isinstance(inj, dict) or not all(_is_number(k) for k in inj):
                p.add(w, f"inject must map a value (nan, inf, -inf or a number) to a fraction, got {inj!r}")
        if spec.get("transpose") is not None and not (isinstance(spec["transpose"], list)
                                                      and len(spec["transpose"]) == 2):
            p.add(w, "transpose must be a list of two dims, e.g. [1, 2]")
        if spec.get("noncontig") not in (None, "pad", "transpose"):
            p.add(w, f"noncontig must be 'pad' or 'transpose', got {spec['noncontig']!r}")
    if "dtype" in spec and not _dtype_ok(spec["dtype"]):
        p.add(w, f"unknown dtype {spec['dtype']!r}; use case, {', '.join(sorted(set(DTYPE_NAMES.values())))}")
    if spec.get("device") not in (None, "host", "device"):
        p.add(w, f"device must be 'host' or 'device', got {spec['device']!r}")


def _is_number(k: Any) -> bool:
    try:
        float(str(k))
        return True
    except ValueError:
        return False


def _merge_inputs(base: dict, over: dict) -> dict:
    """Case inputs over the op-level ones: field by field per tensor (a new ``dist`` drops the old
    distribution's parameters; a ``builder`` on either side replaces the spec); ``null`` removes."""
    out = copy.deepcopy(base)
    for name, spec in (over or {}).items():
        old = out.get(name)
        if spec is None:
            out.pop(name, None)
        elif isinstance(old, dict) and isinstance(spec, dict) and "builder" not in spec and "builder" not in old:
            merged = {**old, **copy.deepcopy(spec)}
            new_dist, old_dist = spec.get("dist"), old.get("dist", "normal")
            if new_dist is not None and new_dist != old_dist:
                for k in DISTS.get(old_dist, ()):
                    if k not in spec and k not in DISTS.get(new_dist, ()):
                        merged.pop(k, None)
            out[name] = merged
        else:
            out[name] = copy.deepcopy(spec)
    return out


def _norm_dtypes(p: _Problems, where: str, value: Any) -> dict:
    if value is None:
        return dict(DEFAULT_DTYPES)
    if isinstance(value, list):
        value = {s: value for s in SUITES}
    if not isinstance(value, dict):
        p.add(where, f"dtypes must be a list or a mapping suite -> list, got {value!r}")
        return dict(DEFAULT_DTYPES)
    out = dict(DEFAULT_DTYPES)
    for suite, lst in value.items():
        if suite not in SUITES:
            p.add(where, f"unknown suite {suite!r} in dtypes; suites: {', '.join(SUITES)}")
            continue
        if not isinstance(lst, list) or not all(isinstance(d, str) and DTYPE_NAMES.get(d) in FLOAT_DTYPES
                                                 for d in lst):
            p.add(where, f"dtypes[{suite}] must be a list of fp32/fp16/bf16, got {lst!r}")
            continue
        out[suite] = [DTYPE_NAMES[d] for d in lst]
    return out


def _norm_baselines(p: _Problems, where: str, value: Any) -> list:
    from .baselines import REGISTRY

    out = []
    for i, b in enumerate(value or []):
        entry = {"name": b} if isinstance(b, str) else b
        if not isinstance(entry, dict) or "name" not in entry:
            p.add(f"{where}[{i}]", f"a baseline is a name or {{name, when}}, got {b!r}")
            continue
        _check_unknown(p, f"{where}[{i}]", entry, {"name", "when"})
        if entry["name"] not in REGISTRY:
            p.add(f"{where}[{i}]", f"unknown baseline {entry['name']!r}; known: {', '.join(sorted(REGISTRY))}")
            continue
        out.append(dict(entry))
    return out


def _shape_points(p: _Problems, where: str, shapes: Any) -> list:
    if not isinstance(shapes, list) or not shapes:
        p.add(where, "shapes must be a non-empty list of mappings {dim: value, ...}")
        return []
    out = []
    for i, s in enumerate(shapes):
        w = f"{where}[{i}]"
        if not isinstance(s, dict):
            p.add(w, f"a shape point is a mapping of dims, got {s!r}")
            continue
        dims = {k: v for k, v in s.items() if k not in SHAPE_RESERVED}
        suites = s.get("suites")
        if suites is not None and (not isinstance(suites, list) or any(x not in SUITES for x in suites)):
            p.add(w, f"suites must be a list of {', '.join(SUITES)}, got {suites!r}")
            suites = None
        for k in ("cpu", "quick"):
            if k in s and not isinstance(s[k], bool):
                p.add(w, f"{k} must be true or false, got {s[k]!r}")
        out.append(ShapePoint(dims, bool(s.get("cpu", False)), bool(s.get("quick", False)),
                              None if s.get("label") is None else str(s["label"]),
                              None if suites is None else tuple(suites)))
    return out


def _dry_names(case: CaseSpec, dims: dict) -> dict:
    """Names for checking expressions without tensors (sizes of builder inputs are placeholders)."""
    import math

    names = case.names(dims, "bf16")
    names.update(e=2, dtype=None, fp32=None, fp16=None, bf16=None, fp64=None, int32=None, int64=None)
    for tname, spec in case.inputs.items():
        if not isinstance(spec, dict):
            continue
        try:
            skip = "builder" in spec or ("when" in spec and not evaluate(spec["when"], names))
            numel = 1 if skip else math.prod(int(x) for x in evaluate(spec.get("shape", []), names))
        except (ExprError, TypeError, ValueError):
            numel = 1
        names[f"n_{tname}"] = numel
        names[f"e_{tname}"] = 2
    return names


def _check_point(p: _Problems, where: str, case: CaseSpec, point: ShapePoint) -> None:
    try:
        names = case.names(point.dims, "bf16")
    except ExprError as e:
        p.add(f"{where}.let", str(e))
        return
    names.update(fp32=None, fp16=None, bf16=None, fp64=None, int32=None, int64=None, dtype=None)
    for tname, spec in case.inputs.items():
        if not isinstance(spec, dict):
            continue
        loc = f"{where}: inputs.{tname}"
        try:
            if "when" in spec and not evaluate(spec["when"], names):
                continue
        except ExprError as e:
            p.add(f"{loc}.when", str(e))
            continue
        if "builder" in spec:
            try:
                resolve(spec.get("args", {}), names)
            except ExprError as e:
                p.add(f"{loc}.args", str(e))
            continue
        try:
            shape = evaluate(spec.get("shape", []), names)
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape):
                p.add(f"{loc}.shape", f"must evaluate to non-negative ints, got {shape}")
        except ExprError as e:
            p.add(f"{loc}.shape", str(e))
        for k in DISTS.get(spec.get("dist", "normal"), ()):
            if k in spec:
                try:
                    param(spec[k], names)
                except ExprError as e:
                    p.add(f"{loc}.{k}", str(e))
        for f in spec.get("fill") or []:
            try:
                evaluate([f.get("dim", 0), f.get("start", 0)] + ([f["stop"]] if f.get("stop") is not None else []),
                         names)
            except ExprError as e:
                p.add(f"{loc}.fill", str(e))
    for key in ("kwargs", "call_kwargs"):
        try:
            resolve(getattr(case, key), names)
        except ExprError as e:
            p.add(f"{where}: {key}", str(e))
    dry = _dry_names(case, point.dims)
    for key in ("bytes_fwd", "bytes_bwd", "flops_fwd", "flops_bwd", "size"):
        if key in case.cost:
            try:
                evaluate(case.cost[key], dry)
            except ExprError as e:
                p.add(f"{where}: cost.{key}", str(e))
    for key, expr in case.memory.items():
        try:
            evaluate(expr, dry)
        except ExprError as e:
            p.add(f"{where}: memory.{key}", str(e))
    for i, b in enumerate(case.baselines):
        if "when" in b:
            try:
                evaluate(b["when"], dry)
            except ExprError as e:
                p.add(f"{where}: baselines[{i}].when", str(e))


def parse_spec(data: Any, path: str = "<string>") -> OpSpec:
    """Validate the parsed YAML ``data`` of one case file (see module docstring)."""
    p = _Problems()
    if not isinstance(data, dict):
        raise AtkSpecError(path, [f"top level: expected a mapping, got {type(data).__name__}"])
    _check_unknown(p, "top level", data, _TOP_KEYS)
    op = data.get("op")
    stem = os.path.splitext(os.path.basename(path))[0]
    if not isinstance(op, str) or not op:
        p.add("op", "missing or not a string")
        op = stem
    elif path != "<string>" and op != stem:
        p.add("op", f"{op!r} differs from the file name {stem!r}")
    family = data.get("family")
    if not isinstance(family, str) or not family:
        p.add("family", "missing (the op family: norm, loss, gdn, ...)")
        family = "?"
    if not isinstance(data.get("reference"), str):
        p.add("reference", "missing: 'module:function' of the operator's reference")
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        p.add("cases", "missing or empty: list the cases with their shapes")
        cases = []

    top_inputs = data.get("inputs") or {}
    if not isinstance(top_inputs, dict):
        p.add("inputs", "must be a mapping name -> tensor spec")
        top_inputs = {}
    spec = OpSpec(op, family, str(data.get("spec", "")), path, str(data.get("description", "")).strip())
    seen = set()
    for ci, raw in enumerate(cases):
        where = f"cases[{ci}]"
        if not isinstance(raw, dict):
            p.add(where, f"a case is a mapping, got {type(raw).__name__}")
            continue
        _check_unknown(p, where, raw, _CASE_KEYS)
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            p.add(where, "missing 'name'")
            name = f"case{ci}"
        if name in seen:
            p.add(where, f"duplicate case name {name!r}")
        seen.add(name)
        where = f"cases[{ci}] ({name})"

        def get(key, default=None):
            return raw[key] if key in raw else data.get(key, default)

        inputs = _merge_inputs(top_inputs, raw.get("inputs") if isinstance(raw.get("inputs"), dict) else {})
        if "inputs" in raw and not isinstance(raw["inputs"], dict):
            p.add(f"{where}.inputs", "must be a mapping name -> tensor spec")
        if not inputs:
            p.add(where, "no inputs (give 'inputs' at the top level or in the case)")
        for tname, tspec in inputs.items():
            _check_tensor(p, f"{where}.inputs", tname, tspec)
        kwargs = {**(data.get("kwargs") or {}), **(raw.get("kwargs") or {})}
        call_kwargs = {**(data.get("call_kwargs") or {}), **(raw.get("call_kwargs") or {})}
        let = {**(data.get("let") or {}), **(raw.get("let") or {})}
        outputs = get("outputs", ["E-fwd"])
        if not isinstance(outputs, list) or not outputs:
            p.add(f"{where}.outputs", f"must be a non-empty list of threshold classes, got {outputs!r}")
            outputs = ["E-fwd"]
        for i, c in enumerate(outputs):
            _check_class(p, f"{where}.outputs[{i}]", c)
        out_names = get("output_names")
        if out_names is not None and (not isinstance(out_names, list) or len(out_names) != len(outputs)):
            p.add(f"{where}.output_names", f"must list one name per output ({len(outputs)})")
            out_names = None
        grads = get("grads", []) or []
        if not isinstance(grads, list):
            p.add(f"{where}.grads", "must be a list of input names")
            grads = []
        for g in grads:
            if g not in inputs:
                p.add(f"{where}.grads", f"{g!r} is not an input ({', '.join(inputs)})")
        grad_class = get("grad_class", "E-bwd")
        if isinstance(grad_class, dict):
            for g, c in grad_class.items():  # (entries for gradients a case drops are allowed)
                _check_class(p, f"{where}.grad_class.{g}", c)
            missing = [g for g in grads if g not in grad_class]
            if missing and "default" not in grad_class:
                p.add(f"{where}.grad_class", f"no class for {', '.join(missing)} (add them or 'default')")
        else:
            _check_class(p, f"{where}.grad_class", grad_class)
        mutates = get("mutates", []) or []
        for m in mutates:
            if m not in inputs:
                p.add(f"{where}.mutates", f"{m!r} is not an input")
        values = raw.get("values", "normal")
        if values not in VALUE_KINDS:
            p.add(f"{where}.values", f"must be one of {', '.join(VALUE_KINDS)}, got {values!r}")
        suites = raw.get("suites", list(SUITES) if values == "normal" else ["accuracy"])
        if not isinstance(suites, list) or any(s not in SUITES for s in suites):
            p.add(f"{where}.suites", f"must be a list of {', '.join(SUITES)}, got {suites!r}")
            suites = ["accuracy"]
        cost = {**(data.get("cost") or {}), **(raw.get("cost") or {})}
        _check_unknown(p, f"{where}.cost", cost, COST_KEYS)
        if cost.get("bound", "memory") not in ("memory", "compute"):
            p.add(f"{where}.cost.bound", f"must be memory or compute, got {cost['bound']!r}")
        if ("performance" in suites) and not any(k in cost for k in ("bytes_fwd", "flops_fwd")):
            p.add(f"{where}.cost", "a case in the performance suite needs bytes_fwd (or flops_fwd)")
        if not grads and any(k in cost for k in ("bytes_bwd", "flops_bwd")):
            p.add(f"{where}.cost", "bytes_bwd/flops_bwd given but the case has no grads (forward-only)")
        memory = {**(data.get("memory") or {}), **(raw.get("memory") or {})}
        _check_unknown(p, f"{where}.memory", memory, MEMORY_KEYS)
        err_atol = get("err_atol")
        if err_atol is not None and not (isinstance(err_atol, (int, float)) and err_atol >= 0):
            p.add(f"{where}.err_atol", f"must be a number >= 0, got {err_atol!r}")
        for key in ("call", "reference", "dispatch_op"):
            v = get(key)
            if v is not None and not isinstance(v, str):
                p.add(f"{where}.{key}", f"must be a string, got {v!r}")
        case = CaseSpec(
            op=op, family=family, name=name, call=get("call") or f"mindspeed_ops.api:{op}",
            reference=get("reference") or "", dispatch_op=get("dispatch_op", op), inputs=inputs, kwargs=kwargs,
            call_kwargs=call_kwargs,
            let=let, outputs=list(outputs), output_names=out_names, grads=list(grads), grad_class=grad_class,
            err_atol=err_atol, nan_mask=bool(get("nan_mask", False)), mutates=list(mutates),
            dtypes=_norm_dtypes(p, f"{where}.dtypes", get("dtypes")),
            baselines=_norm_baselines(p, f"{where}.baselines", get("baselines", ["eager", "compile"])),
            cost=cost, memory=memory, values=values, suites=tuple(suites),
            shapes=_shape_points(p, f"{where}.shapes", raw.get("shapes")),
            description=str(get("description", "") if "description" in raw else "").strip())
        for i, point in enumerate(case.shapes):
            _check_point(p, f"{where}.shapes[{i}] ({point.text()})", case, point)
        spec.cases.append(case)
    if p.items:
        raise AtkSpecError(path, p.items)
    return spec


def load_spec(path: str) -> OpSpec:
    """Read and validate one case file (:func:`parse_spec`); YAML syntax errors become
    :class:`AtkSpecError` too."""
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise AtkSpecError(path, [f"YAML syntax: {e}"]) from None
    return parse_spec(data, path)


def load_specs(atk_dir: Optional[str] = None, ops: Optional[list] = None) -> list[OpSpec]:
    """Validated specs of ``ops`` (default: every file in ``atk_dir``), in file-name order.

    Raises:
        ValueError: an op without a case file (the message lists the files there).
        AtkSpecError: the first invalid file.
    """
    atk_dir = atk_dir or default_atk_dir()
    paths = spec_paths(atk_dir)
    if ops:
        unknown = [o for o in ops if o not in paths]
        if unknown:
            raise ValueError(f"no ATK case file for {', '.join(unknown)} in {atk_dir}; "
                             f"ops with case files: {', '.join(paths)}")
        paths = {o: paths[o] for o in ops}
    return [load_spec(p) for p in paths.values()]


__all__ = ["SUITES", "VALUE_KINDS", "DISTS", "AtkSpecError", "ShapePoint", "CaseSpec", "OpSpec", "default_atk_dir",
           "spec_paths", "parse_spec", "load_spec", "load_specs"]
