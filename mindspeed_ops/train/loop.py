"""The training loop of ``mindspeed-ops train``: AdamW with warm-up and cosine decay, a rich progress
bar (loss, tokens/s), periodic loss lines, checkpoint/resume, validation, ``loss.png`` and
``metrics.json``, and the ``--compare`` run against the reference backend."""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from .. import backends
from . import PRESETS, MODEL_FLAGS, RUN_FLAGS
from .data import ByteCorpus
from .model import HybridConfig, HybridLM, kda_substitution_message

CHECKPOINT = "checkpoint.pt"


@dataclass
class RunSettings:
    """Everything one training run needs besides the model config."""

    device: str
    backend: str  # auto | triton | reference
    dtype: str  # fp32 | bf16
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup: int
    seed: int
    eval_batches: int
    log_every: int
    ckpt_every: int = 0
    threads: Optional[int] = None
    out: Optional[Path] = None
    resume: bool = False
    label: str = "train"


@dataclass
class RunResult:
    """What a run measured. ``losses[i]`` is the training loss (nats/byte) of step ``i + 1``."""

    backend: str
    losses: list = field(default_factory=list)
    step_seconds: list = field(default_factory=list)
    val_loss: Optional[float] = None
    tokens_per_s: Optional[float] = None
    peak_mem_bytes: Optional[int] = None
    resumed_from: int = 0
    params: int = 0

    def to_dict(self) -> dict:
        return dict(backend=self.backend, losses=self.losses, val_loss=self.val_loss, tokens_per_s=self.tokens_per_s,
                    peak_mem_bytes=self.peak_mem_bytes, resumed_from=self.resumed_from, params=self.params)


def resolve(args: argparse.Namespace, device: str) -> tuple[HybridConfig, RunSettings]:
    """Preset + explicit flags -> (model config, run settings)."""
    preset = PRESETS[args.preset or ("gpu" if device == "cuda" else "cpu")]

    def pick(name):
        value = getattr(args, name, None)
        return preset.get(name) if value is None else value

    cfg_kw = {k: pick(k) for k in MODEL_FLAGS if pick(k) is not None}
    cfg = HybridConfig(**cfg_kw)
    run = {k: pick(k) for k in RUN_FLAGS}
    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    out = Path(args.out) if args.out else None
    settings = RunSettings(device=device, backend=args.backend, dtype=dtype, seed=args.seed, out=out,
                           resume=args.resume, ckpt_every=args.ckpt_every, **run)
    validate(cfg, settings, data_mb=getattr(args, "data_mb", None))
    return cfg, settings


def validate(cfg: HybridConfig, s: RunSettings, data_mb: Optional[float] = None) -> None:
    """Check the flags before anything is trained: raises ``ValueError`` (naming the flag) for a bad value
    and ``ValueError``/``RuntimeError`` from the model constructor (built on the meta device: no memory)
    for sizes the model does not accept."""
    for name in ("steps", "batch_size", "seq_len"):
        if getattr(s, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(s, name)}")
    if s.seq_len > cfg.max_seq_len:
        raise ValueError(f"--seq-len must be <= {cfg.max_seq_len}, got {s.seq_len}")
    if not (math.isfinite(s.lr) and s.lr > 0):
        raise ValueError(f"--lr must be a positive number, got {s.lr}")
    for name in ("warmup", "ckpt_every", "log_every", "eval_batches"):
        if getattr(s, name) is not None and getattr(s, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(s, name)}")
    if s.threads is not None and s.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {s.threads}")
    if data_mb is not None and not data_mb > 0:
        raise ValueError(f"--data-mb must be > 0, got {data_mb}")
    if s.out is not None:  # found after a whole run otherwise (the writes come at the end)
        from ..check_runner import output_path_problem

        for path, is_dir in ((s.out, True), (s.out / CHECKPOINT, False), (s.out / "metrics.json", False),
                             (s.out / "loss.png", False)):
            if problem := output_path_problem(str(path), is_dir):
                raise ValueError(f"--out: {path} {problem}")
    if cfg.sinkhorn_iters < 1:
        raise ValueError(f"--sinkhorn-iters must be >= 1, got {cfg.sinkhorn_iters}")
    for name in ("d_model", "lin_heads", "lin_v_heads", "lin_head_dim", "attn_heads", "attn_head_dim",
                 "experts", "expert_ffn"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    import warnings

    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        HybridLM(cfg)  # the constructor's own checks (layers, top_k, rope_dim, hc_mult, kda=on)


def lr_at(step: int, s: RunSettings) -> float:
    """Learning rate of (1-based) ``step``: linear warm-up, then cosine decay to 10% at the last step."""
    if step <= s.warmup:
        return s.lr * step / max(1, s.warmup)
    t = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t))))


def _backend_ctx(backend: str):
    return backends.use_backend(backend) if backend != "auto" else contextlib.nullcontext()


def _autocast(s: RunSettings):
    if s.dtype == "bf16":
        return torch.autocast(s.device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_model(cfg: HybridConfig, s: RunSettings) -> tuple[HybridLM, torch.optim.Optimizer]:
    """The model (seeded by ``s.seed``) and its AdamW optimizer, on ``s.device``."""
    torch.manual_seed(s.seed)
    model = HybridLM(cfg).to(s.device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=s.lr, betas=(0.9, 0.95), eps=1e-8)
    return model, opt


def save_checkpoint(path: Path, model: HybridLM, opt: torch.optim.Optimizer, step: int, cfg: HybridConfig,
                    s: RunSettings, result: RunResult) -> None:
    """Atomically write model, optimizer, step, config and the loss history to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step, "config": cfg.to_dict(),
                "kinds": model.kinds, "seed": s.seed, "batch_size": s.batch_size, "seq_len": s.seq_len,
                "losses": result.losses, "step_seconds": result.step_seconds}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, model: HybridLM, opt: torch.optim.Optimizer, cfg: HybridConfig, s: RunSettings,
                    result: RunResult) -> int:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns its step.

    Raises:
        SystemExit: the checkpoint was written for another model (config or built layers) or data
            settings (seed, batch size, sequence length).
    """
    try:
        ck = torch.load(path, map_location=s.device, weights_only=False)
    except Exception as e:  # noqa: BLE001 - a truncated/foreign file: say so, no traceback
        from ..check_runner import _exc_text

        raise SystemExit(f"--resume: cannot read {path} ({_exc_text(e)}); delete it or use another --out") from None
    keys = ("model", "optim", "step", "config", "kinds", "seed", "batch_size", "seq_len", "losses", "step_seconds")
    if not isinstance(ck, dict) or any(k not in ck for k in keys):
        raise SystemExit(f"--resume: {path} is not a checkpoint of mindspeed-ops train; delete it or use another --out")
    if ck["config"] != cfg.to_dict() or ck["kinds"] != model.kinds:
        want = cfg.to_dict()
        diff = [f"{k}={ck['config'].get(k)!r} (this run: {want.get(k)!r})"
                for k in sorted(set(want) | set(ck["config"])) if ck["config"].get(k) != want.get(k)]
        if ck["kinds"] != model.kinds:
            diff.append(f"layers built {','.join(ck['kinds'])} (this run: {','.join(model.kinds)})")
        raise SystemExit(f"--resume: {path} holds a different model: {'; '.join(diff)}; "
                         f"use another --out or the same flags")
    for name in ("seed", "batch_size", "seq_len"):
        if ck[name] != getattr(s, name):
            raise SystemExit(f"--resume: {path} was trained with {name}={ck[name]}, this run has {getattr(s, name)}")
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optim"])
    result.losses = list(ck["losses"])
    result.step_seconds = list(ck["step_seconds"])
    return int(ck["step"])


@torch.no_grad()
def evaluate(model: HybridLM, corpus: ByteCorpus, s: RunSettings) -> Optional[float]:
    """Mean validation loss (nats/byte) over ``s.eval_batches`` fixed batches, or ``None``."""
    if s.eval_batches <= 0:
        return None
    model.eval()
    total = 0.0
    for i in range(s.eval_batches):
        x, y = corpus.batch("val", s.batch_size, s.seq_len, s.seed, i, s.device)
        with _autocast(s):
            loss, _ = model(x, y)
        total += float(loss)
    model.train()
    return total / s.eval_batches


def train(cfg: HybridConfig, s: RunSettings, corpus: ByteCorpus, console=None, progress=None) -> RunResult:
    """One training run with backend ``s.backend``; returns its measurements. With ``s.out`` set, the
    run checkpoints to ``s.out/checkpoint.pt`` (every ``s.ckpt_every`` steps and at the end) and, with
    ``s.resume``, continues from it."""
    with _backend_ctx(s.backend):
        model, opt = make_model(cfg, s)
        result = RunResult(backend=backends.select("chunk_gated_delta_rule", s.device), params=model.num_params())
        start = 0
        ckpt = s.out / CHECKPOINT if s.out is not None else None
        if s.resume and ckpt is not None and ckpt.exists():
            start = load_checkpoint(ckpt, model, opt, cfg, s, result)
            result.resumed_from = start
            if start > s.steps:
                raise SystemExit(f"--resume: {ckpt} is already at step {start}, beyond --steps {s.steps} (--steps is "
                                 f"the total step count: pass --steps > {start} to train further)")
            if console is not None:
                console.print(f"resumed from {ckpt} at step {start}" + (
                    f"; nothing to train (--steps {s.steps} is the total step count: pass a larger --steps to "
                    "continue)" if start == s.steps else ""))
        if s.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        tokens = s.batch_size * s.seq_len
        task = progress.add_task(s.label, total=s.steps, completed=start, loss=float("nan"), tps=0.0) \
            if progress is not None else None
        model.train()
        for step in range(start + 1, s.steps + 1):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, s)
            x, y = corpus.batch("train", s.batch_size, s.seq_len, s.seed, step, s.device)
            _sync(s.device)
            t0 = time.perf_counter()
            with _autocast(s):
                loss, aux = model(x, y)
            (loss + aux).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = float(loss.detach())  # syncs
            dt = time.perf_counter() - t0
            if not math.isfinite(value):
                raise FloatingPointError(f"{s.label}: loss is {value} at step {step}")
            result.losses.append(value)
            result.step_seconds.append(dt)
            if task is not None:
                progress.update(task, advance=1, loss=value, tps=tokens / dt)
            if console is not None and s.log_every and (step % s.log_every == 0 or step == s.steps):
                console.print(f"{s.label} step {step:>5}/{s.steps}  loss {value:.4f}  lr {lr_at(step, s):.2e}  "
                              f"{tokens / dt:,.0f} tok/s")
            if ckpt is not None and s.ckpt_every and step % s.ckpt_every == 0 and step < s.steps:
                save_checkpoint(ckpt, model, opt, step, cfg, s, result)
        if ckpt is not None:
            save_checkpoint(ckpt, model, opt, s.steps, cfg, s, result)
        if s.device == "cuda":
            result.peak_mem_bytes = torch.cuda.max_memory_allocated()
        timed = result.step_seconds[min(len(result.step_seconds) - 1, max(2, len(result.step_seconds) // 10)):]
        if timed:
            result.tokens_per_s = tokens * len(timed) / sum(timed)
        result.val_loss = evaluate(model, corpus, s)
    return result


def compare_stats(a: RunResult, b: RunResult) -> dict:
    """Loss-curve difference and speed/memory ratios of run ``a`` against run ``b`` (the reference)."""
    n = min(len(a.losses), len(b.losses))
    diffs = [abs(x - y) for x, y in zip(a.losses[:n], b.losses[:n])]
    rel = [d / max(abs(y), 1e-12) for d, y in zip(diffs, b.losses[:n])]
    out = {"steps": n, "max_abs_loss_diff": max(diffs) if diffs else None,
           "mean_abs_loss_diff": sum(diffs) / n if n else None, "final_abs_loss_diff": diffs[-1] if diffs else None,
           "max_rel_loss_diff": max(rel) if rel else None,
           "val_loss_diff": (abs(a.val_loss - b.val_loss) if a.val_loss is not None and b.val_loss is not None
                             else None),
           "speedup_tokens_per_s": (a.tokens_per_s / b.tokens_per_s if a.tokens_per_s and b.tokens_per_s else None),
           "memory_ratio": (a.peak_mem_bytes / b.peak_mem_bytes if a.peak_mem_bytes and b.peak_mem_bytes else None)}
    return out


def _ema(xs: list, alpha: float = 0.1) -> list:
    out, m = [], None
    for x in xs:
        m = x if m is None else (1 - alpha) * m + alpha * x
        out.append(m)
    return out


def plot(path: Path, runs: list[RunResult], title: str) -> Optional[str]:
    """Write the loss curve(s) to ``path`` (PNG); returns an error note instead when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no loss.png"
    two = len(runs) == 2
    fig, axes = plt.subplots(2 if two else 1, 1, figsize=(8, 6.5 if two else 4.5), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1]} if two else None)
    ax = axes[0] if two else axes
    for r, color in zip(runs, ("tab:blue", "tab:orange")):
        steps = list(range(1, len(r.losses) + 1))
        ax.plot(steps, r.losses, color=color, alpha=0.25, linewidth=0.8)
        label = f"{r.backend}" + (f" (val {r.val_loss:.3f})" if r.val_loss is not None else "")
        ax.plot(steps, _ema(r.losses), color=color, linewidth=1.8, label=label)
    ax.set_ylabel("train loss (nats/byte)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    if two:
        n = min(len(runs[0].losses), len(runs[1].losses))
        axes[1].plot(range(1, n + 1), [runs[0].losses[i] - runs[1].losses[i] for i in range(n)], color="tab:red")
        axes[1].set_ylabel(f"{runs[0].backend} - {runs[1].backend}")
        axes[1].grid(alpha=0.3)
    (axes[-1] if two else ax).set_xlabel("step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def _fmt_mem(b: Optional[int]) -> str:
    return "-" if b is None else f"{b / 2**20:,.0f} MiB"


def run(args: argparse.Namespace, device: str) -> int:
    """``mindspeed-ops train``: print the set-up, train (and with ``--compare`` train again on the
    reference backend), write ``loss.png``/``metrics.json`` and print a summary. Returns the exit code."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn
    from rich.table import Table

    from ..cli import _console

    cfg, s = resolve(args, device)
    if s.threads:
        torch.set_num_threads(s.threads)
    if args.compare and args.resume:
        raise SystemExit("--compare and --resume cannot be combined (the comparison needs two full runs)")
    con = _console(piped_width=120)  # the CLI's console: main() handles a closed stdout pipe
    try:
        corpus = ByteCorpus.from_stdlib(max_bytes=int(args.data_mb * 2**20))
    except RuntimeError as e:
        raise SystemExit(f"train: {e}") from None
    for split, data in (("train", corpus.train), ("validation", corpus.val if s.eval_batches else None)):
        if data is not None and data.numel() <= s.seq_len + 1:
            raise SystemExit(f"--data-mb {args.data_mb:g}: the {split} split has {data.numel()} bytes, fewer than "
                             f"--seq-len + 1 = {s.seq_len + 1}; read more data (a larger --data-mb)")
    con.print(f"[bold]mindspeed-ops train[/bold]: hybrid LM on {corpus.files} standard-library files "
              f"({corpus.train.numel() / 2**20:.1f} MiB train, {corpus.val.numel() / 2**20:.2f} MiB val) "
              f"from {escape(corpus.root)}")
    note = kda_substitution_message(cfg)
    if note:
        con.print(f"[yellow]note[/yellow]: {escape(note)}")
    with _backend_ctx(s.backend):
        chosen = backends.select("chunk_gated_delta_rule", device)
    interp = " (Triton interpreter)" if device == "cpu" and chosen == "triton" else ""
    con.print(f"layers {','.join(cfg.resolved_kinds())} | d_model {cfg.d_model} | hc_mult {cfg.hc_mult} | "
              f"experts {cfg.experts} top-{cfg.top_k} | device {device} | backend {chosen}{interp} | "
              f"dtype {s.dtype} | batch {s.batch_size}x{s.seq_len} | steps {s.steps} | seed {s.seed}"
              + (f" | {torch.get_num_threads()} CPU thread(s)" if device == "cpu" else ""))
    if args.compare and device == "cpu" and chosen == "reference":
        con.print("[yellow]note[/yellow]: on CPU the default backend is already the reference; use "
                  "--backend triton to compare the Triton kernels (under the interpreter, slowly)")

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.4f}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
               TimeElapsedColumn(), TimeRemainingColumn())
    runs: list[RunResult] = []
    with Progress(*columns, console=con, transient=False) as progress:
        runs.append(train(cfg, s, corpus, con, progress))
        if args.compare:
            ref = RunSettings(**{**s.__dict__, "backend": "reference", "label": "reference",
                                 "out": s.out / "reference" if s.out else None, "resume": False})
            runs.append(train(cfg, ref, corpus, con, progress))

    main = runs[0]
    t = Table(title="train_hybrid")
    for col in ("run", "backend", "params", "first loss", "last-10 loss", "val loss", "bits/byte", "tok/s", "peak mem"):
        t.add_column(col, justify="left" if col in ("run", "backend") else "right")
    for label, r in zip(("main", "reference"), runs):
        first = r.losses[0] if r.losses else float("nan")
        last = sum(r.losses[-10:]) / len(r.losses[-10:]) if r.losses else float("nan")
        t.add_row(label, r.backend, f"{r.params:,}", f"{first:.4f}", f"{last:.4f}",
                  "-" if r.val_loss is None else f"{r.val_loss:.4f}",
                  "-" if r.val_loss is None else f"{r.val_loss / math.log(2):.3f}",
                  "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}", _fmt_mem(r.peak_mem_bytes))
    con.print(t)
    metrics = {"device": device, "dtype": s.dtype, "steps": s.steps, "batch_size": s.batch_size, "seq_len": s.seq_len,
               "config": cfg.to_dict(), "layers_built": cfg.resolved_kinds(), "runs": [r.to_dict() for r in runs]}
    if args.compare:
        c = compare_stats(runs[0], runs[1])
        metrics["compare"] = c
        fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
        con.print(f"compare {runs[0].backend} vs reference over {c['steps']} steps: loss |diff| max "
                  f"{fmt(c['max_abs_loss_diff'], '.2e')}, mean {fmt(c['mean_abs_loss_diff'], '.2e')}, final "
                  f"{fmt(c['final_abs_loss_diff'], '.2e')}; val |diff| {fmt(c['val_loss_diff'], '.2e')}; "
                  f"speed {fmt(c['speedup_tokens_per_s'], '.2f')}x tokens/s; peak memory "
                  f"{fmt(c['memory_ratio'], '.2f')}x of the reference" + ("" if device == "cuda" else " (CUDA only)"))
    if s.out is not None:
        s.out.mkdir(parents=True, exist_ok=True)
        (s.out / "metrics.json").write_text(json.dumps(metrics, indent=2))
        if not args.no_plot:
            title = (f"hybrid LM ({','.join(cfg.resolved_kinds())}, d={cfg.d_model}) on Python stdlib bytes, "
                     f"{device}, {s.dtype}, batch {s.batch_size}x{s.seq_len}")
            err = plot(s.out / "loss.png", runs, title)
            con.print(f"[yellow]{escape(err)}[/yellow]" if err else f"wrote {s.out / 'loss.png'}")
        con.print(f"wrote {s.out / 'metrics.json'} and {s.out / CHECKPOINT}")
    falling = len(main.losses) >= 2 and sum(main.losses[-5:]) / len(main.losses[-5:]) < main.losses[0]
    if not falling and s.steps >= 20:
        con.print("[red]the training loss did not fall[/red]")
        return 1
    return 0


__all__ = ["RunSettings", "RunResult", "resolve", "validate", "lr_at", "make_model", "train", "evaluate", "compare_stats",
           "plot",
           "save_checkpoint", "load_checkpoint", "run"]
