"""ATK inputs: tensor specs -> seeded tensors (distributions, modifiers, builders)."""
import math
import textwrap

import pytest
import torch
import yaml

from mindspeed_ops.atk.inputs import build_inputs, cost_names
from mindspeed_ops.atk.schema import parse_spec


def _case(inputs: str, kwargs: str = "{}"):
    body = "\n".join("  " + line for line in textwrap.dedent(inputs).strip().splitlines())
    text = ("op: t\nfamily: test\nreference: mindspeed_ops.ops.norm.reference:rms_norm\ninputs:\n" + body + "\n"
            f"kwargs: {kwargs}\ncases:\n  - name: c\n    suites: [accuracy]\n"
            "    shapes: [{N: 6, D: 8, V: 11, lens: [3, 0, 2], cpu: true}]\n")
    spec = parse_spec(yaml.safe_load(text), "t.yaml")
    return spec.cases[0], spec.cases[0].shapes[0].dims


def test_distributions_and_determinism():
    case, dims = _case("""
        x: {shape: [N, D], scale: 2.0, shift: 1.0}
        u: {dist: uniform, shape: [N], low: -1, high: 1, dtype: fp32}
        c: {dist: choice, shape: [N, D], values: [-7, 7, .nan]}
        g: {dist: gate, shape: [N, 4], s: 0.01, zero_frac: 0.5}
        y: {dist: labels, shape: [N * 10], V: V, ignore_frac: 0.3, invalid_frac: 0.2}
        cu: {dist: cu_seqlens, shape: [len(lens) + 1], lens: lens}
        sizes: {dist: splits, shape: [5], total: N * 4 - 3, zeros: 2}
        perm: {dist: permutation, shape: [5], device: host}
        pos: {dist: positions, shape: [N], segments: 2}
        A: {dist: tril_chunk, shape: [1, N, 2, 4], upper: .nan}
    """, "{eps: $D * 0.5, dt: $fp32}")
    a = build_inputs(case, dims, torch.float16, "cpu")
    b = build_inputs(case, dims, torch.float16, "cpu")
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v.view(torch.uint8) if v.is_floating_point() else v,
                               b[k].view(torch.uint8) if v.is_floating_point() else b[k]), k
    assert a["x"].dtype == torch.float16 and a["x"].shape == (6, 8) and a["u"].dtype == torch.float32
    assert set(a["c"][~a["c"].isnan()].tolist()) <= {-7.0, 7.0} and a["c"].isnan().any()
    g = a["g"].float()
    assert (g <= 0).all() and (g == 0).any() and g.min() < -25
    y = a["y"]
    assert y.dtype == torch.int64 and (y == -100).any() and (y == 11).any() and (y == -1).any()
    assert ((y >= 0) & (y < 11) | (y == -100) | (y == 11) | (y == -1)).all()
    assert a["cu"].tolist() == [0, 3, 3, 5] and a["cu"].dtype == torch.int32
    assert int(a["sizes"].sum()) == 21 and int((a["sizes"] == 0).sum()) >= 2
    assert sorted(a["perm"].tolist()) == list(range(5))
    assert a["pos"].tolist() == [0, 1, 2, 0, 1, 2]
    A = a["A"][0, :, 0].float()  # [T, BT]
    for t in range(6):
        assert torch.isfinite(A[t, : t % 4]).all() and A[t, t % 4:].isnan().all()
    assert a["eps"] == 4.0 and a["dt"] is torch.float32


def test_modifiers_and_builders():
    case, dims = _case("""
        x: {shape: [N, D], fill: [{dim: 0, start: 4, value: .inf}], inject: {nan: 0.5}}
        xt: {shape: [N, D], transpose: [0, 1]}
        xp: {shape: [N, D], noncontig: pad}
        w: {shape: [D], when: D > 100}
        cos: {builder: rope_cos, args: {t_max: $N, rope_dim: 4}}
    """)
    a = build_inputs(case, dims, torch.float32, "cpu")
    x = a["x"]
    assert (x[4:].isinf() | x[4:].isnan()).all() and x[:4].isnan().any()
    assert a["xt"].shape == (6, 8) and a["xt"].stride() == (1, 6)
    assert a["xp"].shape == (6, 8) and not a["xp"].is_contiguous()
    assert "w" not in a
    assert a["cos"].shape == (6, 2)
    n = cost_names(case, dims, torch.float32, a)
    assert n["n_x"] == 48 and n["e_x"] == 4 and n["n_w"] == 0 and n["e"] == 4 and n["N"] == 6


def test_kkt_builder_is_unit_lower_input():
    case, dims = _case("""
        A: {builder: kkt_A, args: {B: 1, T: $N, H: 2, BT: 4}}
    """)
    A = build_inputs(case, dims, torch.float32, "cpu")["A"]
    assert A.shape == (1, 6, 2, 4)
    for t in range(6):  # strictly lower inside each chunk
        assert (A[0, t, :, t % 4:] == 0).all()
    assert math.isfinite(float(A.abs().sum())) and float(A.abs().sum()) > 0


def test_bad_builder_argument_is_an_error():
    case, dims = _case("""
        A: {builder: kkt_A, args: {B: 1}}
    """)
    with pytest.raises(TypeError):
        build_inputs(case, dims, torch.float32, "cpu")


def test_gdn_G_builder_per_channel_and_hard_reset():
    case, dims = _case("""
        g: {builder: gdn_G, args: {B: 1, T: $N, HV: 2, BT: 4}}
        gk: {builder: gdn_G, args: {B: 1, T: $N, HV: 2, BT: 4, K: 3}}
        gr: {builder: gdn_G, args: {B: 1, T: $N, HV: 2, BT: 4, K: 3, reset_frac: 0.5}}
    """)
    a = build_inputs(case, dims, torch.float32, "cpu")
    assert a["g"].shape == (1, 6, 2) and a["g"].dtype == torch.float32 and (a["g"] <= 0).all()
    assert a["gk"].shape == (1, 6, 2, 3) and (a["gk"] <= 0).all()
    # chunk-local: the first position of each chunk is the raw gate, so a reset shows as <= -1000 somewhere
    assert (a["gr"] <= -1000).any() and torch.isfinite(a["gr"]).all()
