"""benchmarks/bench_hf.py at a tiny CPU size (reference backend: seconds): the JSON report has every field
the H200 run is read for, the patched and unpatched models agree, and a patched model that computes
something else makes ``main`` return 1."""
import importlib.util
import json
import math
import os

import pytest

pytest.importorskip("transformers")

import mindspeed_ops  # noqa: E402
from mindspeed_ops.integrations import transformers as mt  # noqa: E402

pytestmark = pytest.mark.skipif(not mt.available_families().get("qwen3_next"), reason="transformers lacks qwen3_next")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TINY = ["--device", "cpu", "--family", "qwen3_next", "--hidden", "32", "--seq-len", "32", "--batch", "2",
        "--vocab", "64", "--experts", "4", "--dtype", "fp32", "--backend", "reference"]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_hf", os.path.join(ROOT, "benchmarks", "bench_hf.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_cpu_report(tmp_path, capsys):
    rc = _bench().main(TINY + ["--layers", "2", "--steps", "2", "--warmup", "1", "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().out
    assert "tokens/s" in capsys.readouterr().out  # the rich table
    doc = json.loads((tmp_path / "bench_hf_qwen3_next.json").read_text())
    assert doc["env"]["device"] == "cpu" and doc["env"]["transformers"]
    assert doc["env"]["backends"]["chunk_gated_delta_rule"] == "reference"
    assert set(doc["env"]["hf_kernels"]) == {"fla", "causal_conv1d"}
    cfg = doc["config"]
    assert (cfg["family"], cfg["layers"], cfg["hidden"], cfg["seq_len"], cfg["batch"], cfg["dtype"]) == \
        ("qwen3_next", 2, 32, 32, 2, "fp32")
    assert cfg["params"] > 0 and "perf_counter" in doc["timing"] and "max_memory_allocated" in doc["memory"]
    for name in ("unpatched", "patched"):
        r = doc["results"][name]
        assert len(r["step_ms"]) == 3 and r["step_ms_median"] > 0
        assert r["tokens_per_s"] == pytest.approx(2 * 32 / (r["step_ms_median"] / 1e3), rel=1e-6)
        assert r["peak_mem_bytes"] is None  # CUDA only
        assert math.isfinite(r["first_step_loss"]) and len(r["losses"]) == 3
        assert r["params"] == cfg["params"] and "logits" not in r
    swapped = doc["results"]["patched"]["apply_report"]["swapped"]
    assert any("chunk_gated_delta_rule" in k for k in swapped) and any("chunk_loss" in k for k in swapped)
    assert doc["speedup"] > 0 and doc["peak_mem_ratio"] is None
    g = doc["agreement"]
    assert g["passed"] and g["dtype"] == "fp32" and g["threshold_logits_loss"] == 1e-4
    assert g["logits_rel_rms"] <= 1e-4 and g["loss_rel_diff"] <= 1e-4 and g["grad_norm_rel_diff_max"] <= 1e-3
    assert doc["results"]["unpatched"]["first_step_loss"] == pytest.approx(
        doc["results"]["patched"]["first_step_loss"], rel=1e-4)
    assert doc["agreement_at_run_dtype"] == g


def test_disagreement_exits_nonzero(tmp_path, monkeypatch, capsys):
    real = mindspeed_ops.api.rms_norm
    monkeypatch.setattr(mindspeed_ops.api, "rms_norm", lambda *a, **k: real(*a, **k) * 1.01)  # a wrong "kernel"
    rc = _bench().main(TINY + ["--layers", "2", "--steps", "1", "--warmup", "0", "--out", str(tmp_path)])
    assert rc == 1
    assert "FAIL" in capsys.readouterr().out
    assert not json.loads((tmp_path / "bench_hf_qwen3_next.json").read_text())["agreement"]["passed"]


def test_bf16_run_is_anchored_to_fp32(tmp_path, capsys):
    """With --dtype bf16 (check in fp32) each bf16 variant is also compared with the fp32 unpatched model, so a
    bf16 patched-vs-unpatched gap can be attributed; the held logits are not left in the report."""
    args = [x if x != "fp32" else "bf16" for x in TINY]
    rc = _bench().main(args + ["--layers", "2", "--steps", "1", "--warmup", "0", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads((tmp_path / "bench_hf_qwen3_next.json").read_text())
    assert doc["agreement"]["dtype"] == "fp32" and doc["agreement_at_run_dtype"]["dtype"] == "bf16"
    anchor = doc["run_dtype_vs_check_dtype"]
    assert set(anchor) == {"unpatched", "patched"}
    for name in anchor:
        assert 0 < anchor[name]["logits_rel_rms"] < 0.1 and math.isfinite(anchor[name]["grad_norm_rel_diff_max"])
        assert "logits_run" not in doc["results"][name] and "logits" not in doc["results"][name]
    assert "patched in bf16 vs unpatched in fp32" in out
