"""ATK case files: every operator has one, all of them validate, and a bad file gets a clear error."""
import inspect
import os
import textwrap

import pytest

from mindspeed_ops.atk import expr
from mindspeed_ops.atk.runner import resolve_callable
from mindspeed_ops.atk.schema import AtkSpecError, default_atk_dir, load_spec, load_specs, parse_spec, spec_paths

#: public names of mindspeed_ops.api that are not operators of their own (aliases, module/Function
#: wrappers, utilities): their operator's case file covers them
NOT_OPS = {
    "hc_split_sinkhorn": "alias of sinkhorn",
    "moe_sort_chunks_by_index": "alias of sort_chunks_by_idx",
    "moe_sort_chunks_by_index_with_probs": "alias of sort_chunks_by_idx_with_probs",
    "FusedCrossEntropyLoss": "nn.Module over fused_cross_entropy_loss",
    "FusedCrossEntropyLossFunction": "MindSpeed Function over fused_cross_entropy_loss",
    "L2Norm": "nn.Module over l2norm",
    "FusedRMSNormGated": "nn.Module over rms_norm_gated",
    "CausalConv1dFunction": "autograd Function of causal_conv1d",
    "ChunkGatedDeltaRuleFunction": "autograd Function of chunk_gated_delta_rule",
    "chunk_scaled_dot_kkt": "alias of chunk_scaled_dot_kkt_fwd",
    "ChunkKDAFunction": "autograd Function of chunk_kda",
    "get_available_device": "utility",
    "prepare_chunk_indices": "utility",
}


def test_every_operator_has_a_case_file():
    from mindspeed_ops import api

    have = set(spec_paths(default_atk_dir()))
    missing = [n for n in api.__all__ if n not in NOT_OPS and n not in have]
    assert not missing, f"operators without tests/atk_tests/<op>.yaml: {missing}"


def test_all_case_files_validate_and_resolve():
    specs = load_specs()
    assert len(specs) >= 20
    for spec in specs:
        for case in spec.cases:
            assert case.shapes and any(p.cpu for p in case.shapes), f"{spec.op}/{case.name}: no cpu-marked point"
            for path in (case.call, case.reference):
                assert callable(resolve_callable(path))
            # the reference takes the operator's arguments (SPEC 0.8)
            params = inspect.signature(resolve_callable(case.reference)).parameters
            accepts_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
            for name in list(case.inputs) + list(case.kwargs):
                assert accepts_kw or name in params, f"{spec.op}/{case.name}: reference has no argument {name!r}"


GOOD = """
op: tiny
family: test
reference: mindspeed_ops.ops.norm.reference:rms_norm
inputs:
  x: {shape: [N, D]}
grads: [x]
cost: {bytes_fwd: 2*n_x*e, bytes_bwd: 3*n_x*e}
cases:
  - name: rows
    shapes: [{N: 4, D: 8, cpu: true}]
"""


def _parse(text, path="tiny.yaml"):
    import yaml

    return parse_spec(yaml.safe_load(textwrap.dedent(text)), path)


def test_good_spec_parses():
    spec = _parse(GOOD)
    (case,) = spec.cases
    assert case.call == "mindspeed_ops.api:tiny" and case.outputs == ["E-fwd"] and case.grad_class == "E-bwd"
    assert case.suites == ("accuracy", "performance", "memory", "determinism")
    assert case.baselines == [{"name": "eager"}, {"name": "compile"}]
    assert case.dtypes["accuracy"] == ["fp32", "fp16", "bf16"] and case.dtypes["performance"] == ["bf16"]


@pytest.mark.parametrize("edit,message", [
    (("cases:", "casez: 1\ncases:"), "top level: unknown key 'casez'"),
    (("reference: mindspeed_ops.ops.norm.reference:rms_norm\n", ""), "reference: missing"),
    (("op: tiny", "op: other"), "op: 'other' differs from the file name 'tiny'"),
    (("{shape: [N, D]}", "{shape: [N, Q]}"), "cases[0] (rows).shapes[0] (N=4 D=8): inputs.x.shape: 'Q': unknown name 'Q'; known: D, N"),
    (("{shape: [N, D]}", "{shape: [N, D], dist: gauss}"), "inputs.x: unknown dist 'gauss'"),
    (("{shape: [N, D]}", "{shape: [N, D], scael: 2}"), "inputs.x: unknown key 'scael'"),
    (("{shape: [N, D]}", "{shape: [N, D], dtype: fp8}"), "inputs.x: unknown dtype 'fp8'"),
    (("{shape: [N, D]}", "{dist: normal}"), "inputs.x: missing 'shape'"),
    (("grads: [x]", "grads: [y]"), "grads: 'y' is not an input"),
    (("grads: [x]", "grads: [x]\noutputs: [E-fwdd]"), "outputs[0]: threshold must be a SPEC 0.9 class"),
    (("grads: [x]", "grads: [x]\nbaselines: [eager, ligerr]"), "unknown baseline 'ligerr'"),
    (("grads: [x]", "grads: [x]\ndtypes: [fp8]"), "dtypes[accuracy] must be a list of fp32/fp16/bf16"),
    (("cost: {bytes_fwd: 2*n_x*e, bytes_bwd: 3*n_x*e}", "cost: {bytes_bwd: 3*n_x*e}"),
     "a case in the performance suite needs bytes_fwd"),
    (("cost: {bytes_fwd: 2*n_x*e, bytes_bwd: 3*n_x*e}", "cost: {bytes_fwd: 2*n_x*e + open('f')}"),
     "Call is not allowed"),
    (("cost: {bytes_fwd: 2*n_x*e, bytes_bwd: 3*n_x*e}", "cost: {bytes_fwd: x.__class__}"),
     "Attribute is not allowed"),
    (("shapes: [{N: 4, D: 8, cpu: true}]", "shapes: []"), "shapes must be a non-empty list"),
    (("shapes: [{N: 4, D: 8, cpu: true}]", "shapes: [{N: 4, D: 8, cpu: yes please}]"), "cpu must be true or false"),
    (("  - name: rows", "  - name: rows\n    values: weird"), "values: must be one of normal, boundary, special"),
    (("  - name: rows", "  - name: rows\n    suites: [speed]"), "suites: must be a list of accuracy"),
    (("inputs:\n  x: {shape: [N, D]}", "inputs:\n  x: {builder: nope}"), "unknown builder 'nope'"),
])
def test_bad_spec_message(edit, message):
    old, new = edit
    assert old in GOOD
    with pytest.raises(AtkSpecError) as e:
        _parse(GOOD.replace(old, new, 1))
    text = str(e.value)
    assert message in text, text
    assert "problem(s) in ATK case file tiny.yaml:" in text and e.value.path == "tiny.yaml"


def test_all_problems_listed_at_once():
    bad = GOOD.replace("grads: [x]", "grads: [y]\noutputs: [nope]").replace("{shape: [N, D]}", "{shape: [N, Q]}")
    with pytest.raises(AtkSpecError) as e:
        _parse(bad)
    n = len(e.value.problems)
    assert n >= 3 and f"{n} problem(s)" in str(e.value)
    assert any("'Q'" in x for x in e.value.problems) and any("'y' is not an input" in x for x in e.value.problems)


def test_yaml_syntax_and_missing_files(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("op: broken\ncases: [\n")
    with pytest.raises(AtkSpecError, match="YAML syntax"):
        load_spec(str(p))
    with pytest.raises(ValueError, match="no ATK case file for nope"):
        load_specs(str(tmp_path), ["nope"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_specs(str(tmp_path / "missing"))


def test_case_overrides_merge_field_by_field():
    extra = ("  - name: shifted\n"
             "    inputs: {x: {shift: 5.0}}\n"
             "    shapes: [{N: 2, D: 2, cpu: true}]\n"
             "  - name: boundary values\n"
             "    inputs: {x: {dist: choice, values: [-1, 1]}}\n"
             "    kwargs: {eps: 0.5}\n"
             "    shapes: [{N: 2, D: 2, cpu: true}]\n")
    text = GOOD.replace("cases:\n", "cases:\n" + extra).replace("  x: {shape: [N, D]}", "  x: {shape: [N, D], scale: 3.0}")
    shifted, choice, rows = _parse(text).cases
    assert shifted.inputs["x"] == {"shape": ["N", "D"], "scale": 3.0, "shift": 5.0}
    assert choice.inputs["x"] == {"shape": ["N", "D"], "dist": "choice", "values": [-1, 1]}  # normal's scale dropped
    assert choice.kwargs == {"eps": 0.5} and rows.kwargs == {}


def test_expressions():
    names = {"N": 8, "lens": [3, 5]}
    assert expr.evaluate("2*N + len(lens) - sum(lens)", names) == 10
    assert expr.evaluate(["N", 4, "N // 3"], names) == [8, 4, 2]
    assert expr.evaluate("pow2floor(100) + cdiv(N, 3) + min(N, 2)", names) == 64 + 3 + 2
    assert expr.evaluate("1 if N > 4 and N < 10 else 0", names) == 1
    assert expr.resolve({"a": "$N * 2", "b": "text", "c": ["$lens[1]"]}, names) == {"a": 16, "b": "text", "c": [5]}
    for bad, msg in [("__import__('os')", "Call is not allowed"), ("N.real", "Attribute"), ("M", "unknown name 'M'"),
                     ("N +", "cannot parse"), ("N / 0", "ZeroDivisionError"), ("lambda: 1", "Lambda")]:
        with pytest.raises(expr.ExprError, match=msg):
            expr.evaluate(bad, names)


def test_shipped_files_have_the_suites_the_issue_asks_for():
    # every op is exercised on CPU, sweeps reach real sizes, and the value kinds are covered somewhere
    specs = load_specs()
    kinds = {c.values for s in specs for c in s.cases}
    assert kinds == {"normal", "boundary", "special"}
    for s in specs:
        perf = [c for c in s.cases if "performance" in c.suites]
        assert perf, f"{s.op}: no case in the performance suite"
        assert max(len(c.shapes) for c in perf) >= 2, f"{s.op}: no size sweep"
        assert os.path.basename(s.path) == f"{s.op}.yaml"
