"""Training throughput and peak memory of a Hugging Face model, unpatched vs patched with
``mindspeed_ops.integrations.transformers.apply`` (issue 9, item 4).

    python3 benchmarks/bench_hf.py [--device cuda|cpu] [--family qwen3_next] [--layers N] [--hidden H]
        [--seq-len T] [--batch B] [--steps S] [--dtype bf16|fp32] [--out DIR]

The model (a Qwen3-Next-style config scaled from ``--hidden``/``--layers``, random weights, decays and norm
weights perturbed as in tests/unit_tests/integrations) is built twice from the same seed, one variant at a
time (so each peak is its own). Per variant, on random token ids: one sanity step (logits of a forward
without labels; loss and per-parameter gradient norms of a forward with labels), then training steps
(forward with labels -> loss, backward, AdamW step). Step time: ``time.perf_counter`` around each whole step,
with ``torch.cuda.synchronize()`` before and after; the median over ``--steps`` after ``--warmup`` steps.
Peak memory: ``torch.cuda.max_memory_allocated`` over the training steps, reset per variant (weights,
gradients, optimizer state and activations; the other variant is freed first).

Exit status 1 when the variants disagree on one identical step beyond the SPEC 0.9 thresholds the
integration tests use (logits and loss: LA-o; every parameter's gradient norm: LA-g), in ``--check-dtype``
(default fp32: with ``--dtype bf16`` two fp32 models are built for the check, and the bf16 step's numbers
are reported only, since HF's own bf16 logits already differ from its fp32 ones by ~1e-2 rel_rms).
On CPU the patched model runs what the library dispatches to there (the reference backend; Triton's
interpreter when ``TRITON_INTERPRET=1``).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import math
import os
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # the package need not be installed
    sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402

FAMILIES = ("qwen3_next", "kimi_linear", "gpt_oss", "deepseek_v4")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
#: sizes by device: a GPU-meaningful model (a ~2 min run on an H200) and a seconds-long CPU one
PRESETS = {
    "cuda": dict(layers=4, hidden=1024, seq_len=4096, batch=2, steps=10, warmup=3, dtype="bf16", vocab=151936,
                 experts=16),
    "cpu": dict(layers=2, hidden=64, seq_len=64, batch=2, steps=3, warmup=1, dtype="fp32", vocab=256, experts=4),
}


# ---------------------------------------------------------------------------------------------
# model configs (the integration tests' tiny configs, scaled by hidden size)


def _layer_types(n: int, linear: str, full: str) -> list[str]:
    """Three linear-attention layers per full one (Qwen3-Next, Kimi-Linear); with fewer than 4 layers the last is
    full (HF's cache wants at least one attention layer)."""
    return [full if i % 4 == 3 or (i == n - 1 and n < 4) else linear for i in range(n)]


def build_config(family: str, layers: int, hidden: int, vocab: int, seq_len: int, experts: int):
    import transformers as tf

    hd = min(128, max(16, hidden // 8))  # head dim
    nh = max(1, hidden // hd)
    topk = max(2, experts // 4)
    window = min(128, max(8, seq_len // 4))
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=nh)
    if family == "qwen3_next":
        return tf.Qwen3NextConfig(**common, num_key_value_heads=max(1, nh // 8), head_dim=hd,
                                  intermediate_size=2 * hidden, linear_num_key_heads=nh, linear_num_value_heads=2 * nh,
                                  linear_key_head_dim=hd, linear_value_head_dim=hd,
                                  layer_types=_layer_types(layers, "linear_attention", "full_attention"),
                                  num_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=hidden // 2,
                                  shared_expert_intermediate_size=hidden // 2), tf.Qwen3NextForCausalLM
    if family == "kimi_linear":
        return tf.KimiLinearConfig(**common, num_key_value_heads=nh, intermediate_size=2 * hidden,
                                   moe_intermediate_size=hidden // 2, kv_lora_rank=hidden // 2, q_lora_rank=None,
                                   qk_rope_head_dim=hd // 2, qk_nope_head_dim=hd // 2, v_head_dim=hd,
                                   num_local_experts=experts, num_experts_per_tok=topk, n_shared_experts=1,
                                   linear_head_dim=hd, linear_num_heads=nh,
                                   layer_types=_layer_types(layers, "linear_attention", "full_attention"),
                                   mlp_layer_types=["dense"] + ["sparse"] * (layers - 1), pad_token_id=0,
                                   bos_token_id=1, eos_token_id=2), tf.KimiLinearForCausalLM
    if family == "gpt_oss":
        return tf.GptOssConfig(**common, num_key_value_heads=max(1, nh // 8), head_dim=hd, intermediate_size=hidden,
                               num_local_experts=experts, num_experts_per_tok=topk, sliding_window=window,
                               layer_types=["sliding_attention", "full_attention"] * (layers // 2)
                               + ["sliding_attention"] * (layers % 2)), tf.GptOssForCausalLM
    if family == "deepseek_v4":
        head_dim = min(256, 2 * hd)
        rope = min(64, head_dim // 2)  # the indexer's heads carry the rotary part too: index_head_dim >= rope
        return tf.DeepseekV4Config(**common, head_dim=head_dim, q_lora_rank=hidden // 2,
                                   moe_intermediate_size=hidden // 2, n_routed_experts=experts,
                                   num_experts_per_tok=topk, n_shared_experts=1, o_groups=2, o_lora_rank=hidden // 4,
                                   index_n_heads=max(2, nh // 2), index_head_dim=max(rope, head_dim // 4),
                                   index_topk=max(4, seq_len // 16), sliding_window=window, hc_mult=4,
                                   partial_rotary_factor=rope / head_dim,
                                   layer_types=["sliding_attention", "compressed_sparse_attention"] * (layers // 2)
                                   + ["sliding_attention"] * (layers % 2),
                                   mlp_layer_types=["hash_moe"] + ["moe"] * (layers - 1)), tf.DeepseekV4ForCausalLM
    raise KeyError(family)


def build_model(family: str, a, device: str, dtype: torch.dtype, seed: int = 0):
    cfg, cls = build_config(family, a.layers, a.hidden, a.vocab, a.seq_len, a.experts)
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(cfg)
        with torch.no_grad():  # as the integration tests: decays exp(g) ~ 0.3..0.95, non-trivial norm weights
            for name, p in model.named_parameters():
                if name.endswith("A_log"):
                    p.copy_(torch.empty_like(p).uniform_(0.03, 0.5).log())
                elif p.dim() == 1 and "norm" in name:
                    p.add_(0.3 * torch.randn_like(p))
    return model.to(device=device, dtype=dtype).train()  # buffers HF makes on the CPU too


# ---------------------------------------------------------------------------------------------
# measurement


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def sanity_step(model, ids):
    """Logits of a forward without labels, then the loss and per-parameter gradient norms of one with labels."""
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    norms = {n: (p.grad.float().norm().item() if p.grad is not None else None) for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logits, loss.item(), norms


def train_steps(model, ids, device: str, steps: int, warmup: int) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    _sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if device == "cuda" else None  # weights and the batch
    times, losses = [], []
    for _ in range(warmup + steps):
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    med = statistics.median(times[warmup:])
    out = dict(step_ms_median=1e3 * med, step_ms=[1e3 * t for t in times], warmup=warmup,
               tokens_per_s=ids.numel() / med, losses=losses, mem_before_steps_bytes=before, peak_mem_bytes=None)
    if device == "cuda":
        out["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
    del opt
    return out


def _rel(a: float, b: float, floor: float = 0.0) -> float:
    den = max(abs(a), floor)
    return 0.0 if a == b else (abs(a - b) / den if den > 0 else math.inf)


def compare_runs(ref: dict, ours: dict, ref_logits, our_logits, dtype: torch.dtype) -> dict:
    """Agreement of the patched variant with the unpatched one on the sanity step: logits and loss within
    LA-o, every parameter's gradient norm within LA-g (SPEC 0.9, as the integration tests)."""
    from mindspeed_ops.testing import compare, threshold

    t_o, t_g = threshold("LA-o", dtype), threshold("LA-g", dtype)
    c = compare("logits", ref_logits, our_logits, t_o)
    gref, gours = ref["grad_norms"], ours["grad_norms"]
    total = math.sqrt(sum(v * v for v in gref.values() if v is not None))
    floor = 1e-3 * total / math.sqrt(max(1, len(gref)))  # a parameter whose gradient is ~0 is compared absolutely
    worst, worst_rel = None, 0.0
    for name, a in gref.items():
        b = gours.get(name)
        r = 0.0 if a is None and b is None else math.inf if a is None or b is None else _rel(a, b, floor)
        if r > worst_rel or worst is None:
            worst, worst_rel = name, r
    loss_rel = _rel(ref["first_step_loss"], ours["first_step_loss"])
    ok = c.passed and loss_rel <= t_o and worst_rel <= t_g
    return dict(logits_rel_rms=c.rel_rms, logits_max_abs=c.max_abs, logits_note=c.reason, loss_rel_diff=loss_rel,
                grad_norm_rel_diff_max=worst_rel, grad_norm_worst_param=worst, threshold_logits_loss=t_o,
                threshold_grad_norms=t_g, passed=bool(ok))


def measure(a, dtype: torch.dtype, patched: bool, ref: dict | None = None, train: bool = True,
            keep_logits: bool = False) -> dict:
    """Build one variant, run the sanity step (compared with ``ref``'s when given) and, with ``train``, the
    timed steps. With ``keep_logits`` the sanity step's logits stay (on the host) as ``res["logits_run"]``
    for :func:`anchor_to_fp32`. The model is freed before returning."""
    from mindspeed_ops.integrations import transformers as mt

    _free(a.device)
    model = build_model(a.family, a, a.device, dtype)
    res = dict(params=sum(p.numel() for p in model.parameters()))
    if patched:
        report = mt.apply(model, families=[a.family])
        res["apply_report"] = dict(swapped=report.swapped, skipped=report.skipped)
    ids = torch.randint(3, a.vocab, (a.batch, a.seq_len), generator=torch.Generator().manual_seed(2)).to(a.device)
    logits, res["first_step_loss"], res["grad_norms"] = sanity_step(model, ids)
    if ref is None:
        res["logits"] = logits.cpu()  # off the device: it must not count in the other variant's peak
    else:  # compared on the device (fast), freed before the timed steps
        ref_logits = ref.pop("logits").to(a.device)
        res["agreement"] = compare_runs(ref, res, ref_logits, logits, dtype)
        del ref_logits
    if keep_logits:
        res["logits_run"] = logits.cpu()
    del logits
    if train:
        res.update(train_steps(model, ids, a.device, a.steps, a.warmup))
    del model, ids
    _free(a.device)
    return res


def anchor_to_fp32(cref: dict, results: dict, device: str, dtype: torch.dtype) -> dict:
    """Each run-dtype variant's sanity step against the fp32 unpatched model's (``cref``, logits still held):
    how far HF's own bf16 model and the patched one are from fp32, so that the bf16 patched-vs-unpatched
    difference can be read (which side carries it). Reported only."""
    anchor = {}
    fp32_logits = cref["logits"].to(device)
    for name, res in results.items():
        run_logits = res.pop("logits_run").to(device)
        anchor[name] = compare_runs(cref, res, fp32_logits, run_logits, dtype)
        del run_logits
    del fp32_logits
    _free(device)
    return anchor


def hf_kernels() -> dict:
    """Which optional kernel packages HF's unpatched modeling code can import (it prefers them to its PyTorch
    code, as it does: an import that fails means the PyTorch path)."""
    out = {}
    for name in ("fla", "causal_conv1d"):
        try:
            importlib.import_module(name)
            out[name] = True
        except Exception:  # noqa: BLE001 - absent, hidden (--hf-torch-only) or broken: HF falls back alike
            out[name] = False
    return out


# ---------------------------------------------------------------------------------------------
# command line


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--family", choices=FAMILIES, default="qwen3_next")
    for name, typ in (("layers", int), ("hidden", int), ("seq-len", int), ("batch", int), ("steps", int),
                      ("warmup", int), ("vocab", int), ("experts", int)):
        p.add_argument(f"--{name}", type=typ, default=None, help="default: the device preset")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--check-dtype", choices=tuple(DTYPES), default="fp32",
                   help="dtype of the pass/fail comparison (default fp32; with --dtype bf16 two extra fp32 models "
                        "are built for it, and the bf16 comparison is reported only: HF's own bf16 logits differ "
                        "from its fp32 ones by ~1e-2 rel_rms, beyond the per-operator bf16 thresholds)")
    p.add_argument("--backend", default=None,
                   help="run the patched model under mindspeed_ops.use_backend(NAME) (default: the library's choice)")
    p.add_argument("--hf-torch-only", action="store_true",
                   help="hide flash-linear-attention / causal-conv1d from transformers: the unpatched baseline is "
                        "HF's pure-PyTorch code")
    p.add_argument("--out", default="out/bench_hf")
    a = p.parse_args(argv)
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device")
    for k, v in PRESETS[a.device].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return a


def print_table(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    r, c = doc["results"], doc["config"]
    gpu = doc["env"].get("gpu") if doc["env"]["device"] == "cuda" else "CPU"
    header = (f"{c['family']} ({c['params']:,} parameters): {c['layers']} layers, hidden {c['hidden']}, "
              f"batch {c['batch']} x {c['seq_len']} tokens, {c['dtype']}, {gpu}")
    t = Table()
    for col in ("model", "step ms (median)", "tokens/s", "peak GiB", "first-step loss"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for name in ("unpatched", "patched"):
        v = r[name]
        peak = "n/a" if v["peak_mem_bytes"] is None else f"{v['peak_mem_bytes'] / 2**30:.2f}"
        t.add_row(name, f"{v['step_ms_median']:.1f}", f"{v['tokens_per_s']:,.0f}", peak, f"{v['first_step_loss']:.5f}")
    con = Console(width=None if sys.stdout.isatty() else 140)  # logs: no wrapping at 80 columns
    con.print(header)
    con.print(t)
    ratio = doc["peak_mem_ratio"]
    con.print(f"speed-up {doc['speedup']:.2f}x (unpatched / patched step time), peak memory patched / unpatched "
              f"{'n/a' if ratio is None else f'{ratio:.2f}'}")
    checks = [(doc["agreement"], True)]
    if doc["agreement_at_run_dtype"]["dtype"] != doc["agreement"]["dtype"]:
        checks.insert(0, (doc["agreement_at_run_dtype"], False))
    for g, gates in checks:
        verdict = ("[green]PASS[/green]" if g["passed"] else "[red]FAIL[/red]") if gates else "(reported only)"
        con.print(f"patched vs unpatched, one identical step in {g['dtype']}: "
                  f"logits rel_rms {g['logits_rel_rms']:.2e}, "
                  f"loss rel diff {g['loss_rel_diff']:.2e} (LA-o {g['threshold_logits_loss']:.0e}); max grad-norm "
                  f"rel diff {g['grad_norm_rel_diff_max']:.2e} at {g['grad_norm_worst_param']} "
                  f"(LA-g {g['threshold_grad_norms']:.0e}) {verdict}")
    for name, g in (doc.get("run_dtype_vs_check_dtype") or {}).items():
        con.print(f"{name} in {doc['config']['dtype']} vs unpatched in {doc['config']['check_dtype']}: "
                  f"logits rel_rms {g['logits_rel_rms']:.2e}, loss rel diff {g['loss_rel_diff']:.2e}; max grad-norm "
                  f"rel diff {g['grad_norm_rel_diff_max']:.2e} at {g['grad_norm_worst_param']} (reported only)")


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.hf_torch_only:  # before transformers imports its modeling code, which probes for these packages
        for name in ("fla", "causal_conv1d"):
            sys.modules.setdefault(name, None)
    import mindspeed_ops
    from mindspeed_ops import backends
    from mindspeed_ops.atk.measure import env_info
    from mindspeed_ops.integrations import transformers as mt

    import transformers

    if not mt.available_families().get(a.family):
        print(f"bench_hf: transformers {transformers.__version__} has no {a.family} model", file=sys.stderr)
        return 2
    # fp32 means fp32 on both sides (cuDNN would run HF's PyTorch causal conv in TF32; our kernels use IEEE fp32)
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:  # only the patched model calls our operators, so the override can cover both variants
        with mindspeed_ops.use_backend(a.backend) if a.backend else contextlib.nullcontext():
            return _run(a, env_info(a.device), backends.describe(a.device), transformers.__version__)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


def _run(a, env: dict, backend_rows: list, tf_version: str) -> int:
    env.update(transformers=tf_version, hf_kernels=hf_kernels(), backends={r["op"]: r["backend"] for r in backend_rows})
    anchored = a.check_dtype != a.dtype
    ref = measure(a, DTYPES[a.dtype], patched=False, keep_logits=anchored)
    ours = measure(a, DTYPES[a.dtype], patched=True, ref=ref, keep_logits=anchored)
    at_run_dtype = ours.pop("agreement")
    results = {"unpatched": ref, "patched": ours}
    anchor = None
    if not anchored:
        agreement = at_run_dtype
    else:  # the same comparison in the dtype whose thresholds hold model-wide (see --check-dtype)
        cref = measure(a, DTYPES[a.check_dtype], patched=False, train=False)
        anchor = anchor_to_fp32(cref, results, a.device, DTYPES[a.dtype])
        agreement = measure(a, DTYPES[a.check_dtype], patched=True, ref=cref, train=False)["agreement"]
    agreement["dtype"] = a.check_dtype
    at_run_dtype["dtype"] = a.dtype

    cfg_args = {k: getattr(a, k) for k in ("family", "layers", "hidden", "seq_len", "batch", "steps", "warmup", "dtype",
                                           "check_dtype", "vocab", "experts", "backend", "hf_torch_only")}
    peaks = [results[n]["peak_mem_bytes"] for n in ("unpatched", "patched")]
    doc = dict(env=env, config=dict(cfg_args, params=ref["params"]),
               timing="time.perf_counter around each whole step (zero_grad, forward with labels, backward, "
                      "AdamW step), torch.cuda.synchronize() before and after; median over the steps after the warm-up",
               memory="torch.cuda.max_memory_allocated over the training steps, reset per variant (weights, grads, "
                      "optimizer state, activations); null on CPU",
               results=results, agreement=agreement, agreement_at_run_dtype=at_run_dtype,
               run_dtype_vs_check_dtype=anchor,
               speedup=ref["step_ms_median"] / ours["step_ms_median"],
               peak_mem_ratio=None if None in peaks else peaks[1] / peaks[0])
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"bench_hf_{a.family}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print_table(doc)
    print(f"wrote {path}")
    return 0 if agreement["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
