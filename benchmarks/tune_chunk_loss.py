"""chunk_loss forward+backward against its rows per chunk, beside the three GEMMs it cannot avoid and
torch.compile of linear + cross-entropy: median ms (``triton.testing.do_bench``) and peak extra memory of
``torch.autograd.grad(chunk_loss(...), (hidden, weight))``, then a kernel table of the default.

    python3 benchmarks/tune_chunk_loss.py [--N 8192] [--Hd 4096] [--V 151936] [--chunk-sizes 0 512 1024 2048]
    python3 benchmarks/tune_chunk_loss.py --device cpu --N 48 --Hd 32 --V 100 --chunk-sizes 0 16   # script check

``0`` in ``--chunk-sizes`` is the default (``chunk_size=None``; the rows it resolves to are printed). Every
size's gradients are checked against the default's (rel-RMS); a size whose check fails prints ``failed`` and the
script exits with status 1. Times: do_bench medians of about 30 calls (``bench_ms(min_calls=30)``: do_bench's
``rep`` is in ms, so it is scaled to one call's time). "peak extra" includes the returned gradients (dhidden, dweight).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mindspeed_ops.api import chunk_loss  # noqa: E402
from mindspeed_ops.atk.measure import bench_ms, peak_extra_bytes  # noqa: E402
from mindspeed_ops.ops.loss.chunk_loss import resolve_chunk_size  # noqa: E402
from mindspeed_ops.testing import rel_rms  # noqa: E402


def _time(fn, dev: str) -> float:
    """Median ms of about 30 calls (the ATK harness's bench_ms); on CPU a few host-timed calls (meaningless)."""
    return bench_ms(fn, "cuda" if _on_cuda(dev) else "cpu", min_calls=30).median_ms


def _on_cuda(dev: str) -> bool:
    return torch.device(dev).type == "cuda"


def _peak_extra_mib(fn, dev: str) -> float:
    """Peak extra MiB of one call (the ATK harness's measure); NaN on CPU."""
    b = peak_extra_bytes(lambda _: fn(), "cuda" if _on_cuda(dev) else "cpu")
    return float("nan") if b is None else b / 2 ** 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", type=int, default=8192, help="tokens")
    ap.add_argument("--Hd", type=int, default=4096, help="hidden size")
    ap.add_argument("--V", type=int, default=151936, help="vocabulary")
    ap.add_argument("--chunk-sizes", type=int, nargs="+", default=[0, 512, 1024, 2048])
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script itself (TRITON_INTERPRET=1)")
    a = ap.parse_args()
    dev = a.device
    dt = torch.bfloat16 if _on_cuda(dev) else torch.float32
    torch.manual_seed(0)
    hidden = (torch.randn(a.N, a.Hd, device=dev) * 0.5).to(dt).requires_grad_()
    weight = (torch.randn(a.V, a.Hd, device=dev) * a.Hd ** -0.5).to(dt).requires_grad_()
    labels = torch.randint(0, a.V, (a.N,), device=dev)
    flop = 3 * 2 * a.N * a.Hd * a.V
    if any(cs < 0 for cs in a.chunk_sizes):
        raise SystemExit("tune_chunk_loss: --chunk-sizes takes 0 (the default) or positive row counts")
    print(f"chunk_loss N={a.N} Hd={a.Hd} V={a.V} {dt} on {dev}; torch {torch.__version__}; "
          f"three GEMMs {flop / 1e12:.2f} TFLOP; default chunk_size resolves to "
          f"{resolve_chunk_size(a.N, a.V, a.Hd, None)} rows", flush=True)

    def step(cs):
        loss = chunk_loss(hidden, weight, labels, chunk_size=cs or None)
        return torch.autograd.grad(loss, (hidden, weight))

    # the floor: logits, dhidden and dweight products alone (bf16 out, cuBLAS)
    G = torch.randn(a.N, a.V, device=dev, dtype=dt)
    h, W = hidden.detach(), weight.detach()
    gemms = {"h @ W^T": lambda: h @ W.t(), "G @ W": lambda: G @ W, "G^T @ h": lambda: G.t() @ h}
    total = 0.0
    for name, fn in gemms.items():
        ms = _time(fn, dev)
        total += ms
        print(f"  {name:8s}: {ms:8.3f} ms", flush=True)
    print(f"  three GEMMs: {total:.3f} ms ({flop / (total * 1e-3) / 1e12:.0f} TFLOP/s)", flush=True)
    del G

    ref = step(0)
    best, failed = None, False
    for cs in a.chunk_sizes:
        out = step(cs)
        err = max(rel_rms(o.float(), r.float()) for o, r in zip(out, ref))
        ok = err <= (1e-6 if dt == torch.float32 else 2e-2)
        ms = _time(lambda: step(cs), dev)
        mib = _peak_extra_mib(lambda: step(cs), dev)
        label = "default" if not cs else f"chunk_size={cs}"
        print(f"  {label:16s}: {ms:8.3f} ms  peak extra {mib:8.0f} MiB  rel_rms vs default {err:.1e}"
              f"{'' if ok else '  failed'}", flush=True)
        failed |= not ok
        if ok and (best is None or ms < best[0]):  # NaN on CPU: the first row stays
            best = (ms, label)
    print(f"best: {best[1]} ({best[0]:.3f} ms)" if best else "best: none", flush=True)

    if _on_cuda(dev) and not a.no_compile:
        def eager(hh, ww, yy):
            logits = hh @ ww.t()
            return torch.nn.functional.cross_entropy(logits.float(), yy)

        comp = torch.compile(eager)

        def comp_step():
            return torch.autograd.grad(comp(hidden, weight, labels), (hidden, weight))

        comp_step()
        print(f"  torch.compile   : {_time(comp_step, dev):8.3f} ms  peak extra "
              f"{_peak_extra_mib(comp_step, dev):8.0f} MiB", flush=True)

    if _on_cuda(dev):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(0)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=110))
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
