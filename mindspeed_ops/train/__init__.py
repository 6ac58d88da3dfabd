"""``mindspeed-ops train`` / ``examples/train_hybrid.py``: train a small hybrid language model
(Gated DeltaNet, KDA, attention with interleaved RoPE, GPT-OSS-style MoE, mHC residual streams,
``chunk_loss`` head; :mod:`mindspeed_ops.train.model`) on the Python standard library's own source
files, byte-level (:mod:`mindspeed_ops.train.data`), with a progress bar, checkpoint/resume, a
loss-curve PNG and ``--compare`` (the same run with the pure-PyTorch reference backend).

Nothing here imports a kernel module at import time: on a CPU, ``--backend triton`` must switch on
the Triton interpreter (``TRITON_INTERPRET=1``) before the operators are imported.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

#: named sizes; explicit flags override them. "cpu": the README main job (minutes on 2 cores).
PRESETS: dict[str, dict] = {
    "tiny": dict(d_model=32, layers="gdn,kda,attn", lin_heads=1, lin_v_heads=2, lin_head_dim=16, attn_heads=2,
                 attn_head_dim=16, rope_dim=8, experts=4, top_k=2, expert_ffn=32, hc_mult=2, sinkhorn_iters=4,
                 batch_size=2, seq_len=32, steps=4, warmup=1, lr=3e-3, eval_batches=1, log_every=1, threads=1),
    "cpu": dict(d_model=128, layers="gdn,kda,gdn,attn", lin_heads=2, lin_v_heads=4, lin_head_dim=32, attn_heads=4,
                attn_head_dim=32, rope_dim=16, experts=4, top_k=2, expert_ffn=128, hc_mult=4, sinkhorn_iters=20,
                batch_size=8, seq_len=128, steps=200, warmup=20, lr=3e-3, eval_batches=8, log_every=20, threads=1),
    "gpu": dict(d_model=1024, layers="gdn,kda,gdn,attn,gdn,kda,gdn,attn", lin_heads=8, lin_v_heads=16,
                lin_head_dim=128, attn_heads=16, attn_head_dim=64, rope_dim=32, experts=8, top_k=2,
                expert_ffn=1024, hc_mult=4, sinkhorn_iters=20, batch_size=8, seq_len=1024, steps=200, warmup=20,
                lr=1e-3, eval_batches=8, log_every=20),
}

#: HybridConfig fields settable from the command line (dest name == field name)
MODEL_FLAGS = ("d_model", "layers", "lin_heads", "lin_v_heads", "lin_head_dim", "attn_heads", "attn_head_dim",
               "rope_dim", "experts", "top_k", "expert_ffn", "hc_mult", "sinkhorn_iters", "kda", "chunk_size")
RUN_FLAGS = ("batch_size", "seq_len", "steps", "warmup", "lr", "eval_batches", "log_every", "threads")


def build_parser(p: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    """Add the ``train`` arguments to ``p`` (a new parser when ``None``) and return it."""
    if p is None:
        p = argparse.ArgumentParser(prog="train_hybrid", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), help="named size (default: gpu on CUDA, else cpu)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available, else cpu")
    p.add_argument("--backend", choices=["auto", "triton", "reference"], default="auto",
                   help="operator backend (auto: the library's choice for the device: Triton on CUDA, the "
                        "reference on CPU unless TRITON_INTERPRET=1; triton on CPU runs the kernels under the "
                        "interpreter, slowly)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], help="activation dtype via autocast (default: bf16 on CUDA, "
                                                             "fp32 on CPU); parameters stay fp32")
    p.add_argument("--compare", action="store_true",
                   help="also train the same model (same seed, steps, data) with the pure-PyTorch reference "
                        "backend and report the loss-curve difference and the speed and memory ratios")
    g = p.add_argument_group("run")
    g.add_argument("--steps", type=int, help="optimizer steps")
    g.add_argument("--batch-size", type=int, dest="batch_size")
    g.add_argument("--seq-len", type=int, dest="seq_len")
    g.add_argument("--lr", type=float, help="peak learning rate (AdamW; linear warm-up, cosine to 10%%)")
    g.add_argument("--warmup", type=int, help="warm-up steps")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", default="out/train_hybrid", metavar="DIR",
                   help="checkpoint, loss.png and metrics.json go here (default: %(default)s; \"\": write none of them)")
    g.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt when it exists")
    g.add_argument("--ckpt-every", type=int, default=100, dest="ckpt_every", metavar="N",
                   help="also checkpoint every N steps (0: only at the end)")
    g.add_argument("--log-every", type=int, dest="log_every", metavar="N", help="print a loss line every N steps (0: none)")
    g.add_argument("--eval-batches", type=int, dest="eval_batches", metavar="N",
                   help="validation batches at the end (0: none)")
    g.add_argument("--data-mb", type=float, default=8.0, dest="data_mb",
                   help="MiB of standard-library source to read (default: %(default)s)")
    g.add_argument("--threads", type=int,
                   help="CPU threads for PyTorch (cpu/tiny presets: 1, predictable on a busy machine: the model's "
                        "ops are small; gpu preset: PyTorch's choice)")
    g.add_argument("--no-plot", action="store_true", dest="no_plot", help="skip the loss-curve PNG")
    m = p.add_argument_group("model (override the preset)")
    m.add_argument("--d-model", type=int, dest="d_model")
    m.add_argument("--layers", help="comma-separated mixer kinds: gdn, kda, attn (e.g. gdn,kda,gdn,attn)")
    m.add_argument("--lin-heads", type=int, dest="lin_heads", help="GDN q/k heads")
    m.add_argument("--lin-v-heads", type=int, dest="lin_v_heads", help="GDN value heads (KDA heads)")
    m.add_argument("--lin-head-dim", type=int, dest="lin_head_dim")
    m.add_argument("--attn-heads", type=int, dest="attn_heads")
    m.add_argument("--attn-head-dim", type=int, dest="attn_head_dim")
    m.add_argument("--rope-dim", type=int, dest="rope_dim")
    m.add_argument("--experts", type=int)
    m.add_argument("--top-k", type=int, dest="top_k")
    m.add_argument("--expert-ffn", type=int, dest="expert_ffn")
    m.add_argument("--hc-mult", type=int, dest="hc_mult", help="mHC residual streams")
    m.add_argument("--sinkhorn-iters", type=int, dest="sinkhorn_iters")
    m.add_argument("--chunk-size", type=int, dest="chunk_size", choices=[16, 32, 64])
    m.add_argument("--kda", choices=["auto", "on", "off"],
                   help="auto (default): KDA layers when api.chunk_kda exists, else Gated DeltaNet in their "
                        "place; on: require chunk_kda; off: always Gated DeltaNet")
    return p


def _prepare_backend(device: str, backend: str) -> None:
    """Switch on the Triton interpreter for ``--backend triton`` on a CPU, before kernels are imported."""
    if device == "cpu" and backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        if "TRITON_INTERPRET" in os.environ:
            raise SystemExit("--backend triton on CPU needs TRITON_INTERPRET=1 (it is set to "
                             f"{os.environ['TRITON_INTERPRET']!r})")
        from ..check_runner import kernel_modules_loaded

        if kernel_modules_loaded():
            raise SystemExit("--backend triton on CPU: TRITON_INTERPRET=1 must be set before mindspeed_ops kernels "
                             "are imported; set it in the environment")
        os.environ["TRITON_INTERPRET"] = "1"


def run_cli(args: argparse.Namespace, parser: Optional[argparse.ArgumentParser] = None) -> int:
    """Run ``train`` for parsed ``args``; returns the exit code."""
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        msg = "--device cuda: no CUDA device is available"
        if parser is not None:
            parser.error(msg)
        raise SystemExit(msg)
    _prepare_backend(device, args.backend)
    from .loop import resolve, run  # imports the operators

    try:
        if args.compare and args.resume:
            raise ValueError("--compare and --resume cannot be combined (the comparison needs two full runs)")
        resolve(args, device)  # bad flags: a usage error (exit code 2) before any data is read
        from .. import backends
        from .loop import _backend_ctx

        with _backend_ctx(args.backend):  # e.g. MINDSPEED_OPS_BACKEND naming an unavailable backend
            backends.select("chunk_gated_delta_rule", device)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            if not os.access(out, os.W_OK):
                raise ValueError(f"--out {args.out}: directory is not writable")
    except OSError as e:
        _usage_error(parser, f"--out {args.out}: {e.strerror or e}")
    except (ValueError, RuntimeError) as e:
        _usage_error(parser, str(e))
    return run(args, device)


def _usage_error(parser: Optional[argparse.ArgumentParser], msg: str) -> None:
    if parser is not None:
        parser.error(msg)  # exits with code 2
    print(f"train: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``examples/train_hybrid.py`` (same arguments as ``mindspeed-ops train``)."""
    from ..cli import quiet_on_closed_pipe  # like mindspeed-ops: a closed stdout pipe ends quietly

    parser = build_parser()
    return quiet_on_closed_pipe(lambda: run_cli(parser.parse_args(argv), parser))


__all__ = ["PRESETS", "build_parser", "run_cli", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
