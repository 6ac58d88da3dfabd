"""One training step of the ``mindspeed-ops train`` model on each backend and dtype, compared with the
fp32 reference: the loss and every parameter's gradient (rel_rms, ``mindspeed_ops.testing``).

    python3 benchmarks/train_grad_agreement.py [--preset gpu|cpu|tiny] [--device cuda|cpu] [--top 20]
        [--json PATH]

Why: ``train --compare`` trains the same model on the Triton kernels and on the pure-PyTorch reference;
their loss curves drift apart over tens of steps, which bf16 rounding alone can do. This script separates
the two causes on one batch: a kernel whose gradient is wrong shows up in fp32 (Triton fp32 vs reference
fp32, expected ~1e-5), and a bf16 path much worse than bf16 rounding shows up as a parameter whose Triton
bf16 error is many times the reference bf16 error (the reference backend also runs under bf16 autocast,
with the GDN/KDA oracles in fp32).

Variants: (reference, fp32) is the truth; (triton, fp32), (reference, bf16), (triton, bf16). bf16 means
``torch.autocast(dtype=bfloat16)`` around forward and backward with fp32 parameters, as the train loop.
The model is built once (seed 0); every variant starts from the same weights and batch (real text: the
first training batch of the standard-library corpus). MoE routing can flip between variants on near-ties.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # the package need not be installed
    sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402

VARIANTS = (("reference", "fp32"), ("triton", "fp32"), ("reference", "bf16"), ("triton", "bf16"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=None, help="train preset (default: gpu on CUDA, else tiny)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--top", type=int, default=20, help="parameters listed (worst Triton bf16 / reference bf16 first)")
    p.add_argument("--json", default=None, help="write every number here")
    return p.parse_args(argv)


def one_step(model, x, y, backend: str, dtype: str, device: str):
    """Loss, aux loss and {name: grad (fp32 copy)} of one forward+backward."""
    import mindspeed_ops

    model.zero_grad(set_to_none=True)
    amp = torch.autocast(device, dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()
    with mindspeed_ops.use_backend(backend), amp:
        loss, aux = model(x, y)
        (loss + aux).backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.item(), aux.item(), grads


def main(argv=None) -> int:
    a = parse_args(argv)
    from mindspeed_ops.testing import rel_rms  # on the tensors' device (the gpu preset has 264 M parameters)
    from mindspeed_ops.train import MODEL_FLAGS, PRESETS
    from mindspeed_ops.train.data import ByteCorpus
    from mindspeed_ops.train.model import HybridConfig, build_model

    preset = PRESETS[a.preset or ("gpu" if a.device == "cuda" else "tiny")]
    cfg = HybridConfig(**{k: preset[k] for k in MODEL_FLAGS if k in preset})
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means IEEE fp32
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model(cfg).to(a.device)
    corpus = ByteCorpus.from_stdlib(max_bytes=1 << 20)
    x, y = corpus.batch("train", preset["batch_size"], preset["seq_len"], 0, 0, a.device)

    runs = {}
    for backend, dtype in VARIANTS:
        t0 = time.perf_counter()
        runs[(backend, dtype)] = one_step(model, x, y, backend, dtype, a.device)
        print(f"  {backend}/{dtype}: {time.perf_counter() - t0:.1f} s (first calls compile)", flush=True)
    truth_loss, truth_aux, truth = runs[("reference", "fp32")]
    rows = []
    for name, g in truth.items():
        row = {"param": name, "numel": g.numel()}
        for key in VARIANTS[1:]:
            other = runs[key][2].get(name)
            row["/".join(key)] = float("inf") if other is None else rel_rms(g, other)
        rows.append(row)
    for key in VARIANTS[1:]:
        missing = set(runs[key][2]) ^ set(truth)
        if missing:
            print(f"{'/'.join(key)}: gradients present in one variant only: {sorted(missing)}")

    print(f"preset {a.preset or 'default'} on {a.device}: {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"batch {tuple(x.shape)}; torch {torch.__version__}")
    for key in VARIANTS:
        loss, aux, _ = runs[key]
        print(f"  {'/'.join(key):16s} loss {loss:.6f} (diff {loss - truth_loss:+.2e})  aux {aux:.6f}")
    for key in VARIANTS[1:]:
        k = "/".join(key)
        vals = sorted(r[k] for r in rows)
        print(f"  grad rel_rms vs reference/fp32, {k:16s}: median {vals[len(vals) // 2]:.2e}, max {vals[-1]:.2e}")
    ratio = lambda r: r["triton/bf16"] / max(r["reference/bf16"], 1e-12)  # noqa: E731
    print(f"\nworst {a.top} parameters by triton bf16 error / reference bf16 error:")
    print(f"  {'parameter':60s} {'triton fp32':>11s} {'ref bf16':>10s} {'triton bf16':>11s} {'ratio':>7s}")
    for r in sorted(rows, key=ratio, reverse=True)[:a.top]:
        print(f"  {r['param'][:60]:60s} {r['triton/fp32']:11.2e} {r['reference/bf16']:10.2e} "
              f"{r['triton/bf16']:11.2e} {ratio(r):7.2f}")
    print(f"\nworst {a.top} parameters by triton fp32 error:")
    for r in sorted(rows, key=lambda r: r["triton/fp32"], reverse=True)[:a.top]:
        print(f"  {r['param'][:60]:60s} {r['triton/fp32']:11.2e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"losses": {"/".join(k): v[:2] for k, v in runs.items()}, "grads": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
