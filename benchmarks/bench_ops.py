"""H200 benchmark of the loss, conv, MoE-sort and mHC operators against PyTorch eager, torch.compile and
the installed peers (Liger-Kernel, cut-cross-entropy, flash-linear-attention), one process, one run.

    python3 benchmarks/bench_ops.py [--groups loss,conv,moe,mhc] [--out DIR]

Per implementation: median ms of forward and of forward+backward (``triton.testing.do_bench``: warm-up,
L2 flush, CUDA events), the same through a CUDA graph where capture works (``graph ms``: no host
launch cost), extra peak memory of one forward+backward (``max_memory_allocated`` after a reset,
minus what was allocated before: outputs and gradients included) and, for ours, GB/s of the minimum
bytes moved and its fraction of the device copy bandwidth measured at the start of the run.
A peer that is not installed or fails is reported with its error, never silently dropped.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch
import torch.nn.functional as F
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mindspeed_ops import api  # noqa: E402
from mindspeed_ops.ops.conv import reference as conv_ref  # noqa: E402
from mindspeed_ops.ops.mhc import reference as mhc_ref  # noqa: E402

DEV = "cuda"
ROWS: list[dict] = []
SAVE: dict = {}  # {"path": ..., "env": ..., "command": ...}: rows are saved after every measurement


def copy_bandwidth() -> float:
    """Device-to-device copy rate in GB/s (bytes read + written), median of do_bench."""
    x = torch.empty(2 ** 30, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    return 2 * x.numel() / (ms * 1e-3) / 1e9


PEERS = ("Liger", "cut-cross-entropy", "fla")


def _time(fn, graph: bool) -> tuple[float, float | None]:
    fn()
    torch.cuda.synchronize()
    ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
    g = None
    if graph:  # peers that synchronise inside capture leave the CUDA RNG in capture state: not tried
        try:
            g = do_bench_cudagraph(fn, rep=100, return_mode="median")
        except Exception:  # noqa: BLE001 - host copies/syncs in the call: no graph number
            g = None
    return ms, g


def _extra_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def bench(case: str, impls: dict, bytes_fwd: float | None, bytes_bwd: float | None, copy_gbs: float,
          flops: float | None = None) -> None:
    """``impls``: name -> (forward fn, forward+backward fn or None). Appends one row per implementation."""
    ours_ms = {}
    for name, (fwd, fwdbwd) in impls.items():
        row = {"case": case, "impl": name}
        graph = not name.startswith(PEERS)
        try:
            row["fwd_ms"], row["fwd_graph_ms"] = _time(fwd, graph)
            if fwdbwd is not None:
                row["fwdbwd_ms"], row["fwdbwd_graph_ms"] = _time(fwdbwd, graph)
                row["extra_mib"] = _extra_mib(fwdbwd)
            else:
                row["extra_mib"] = _extra_mib(fwd)
        except Exception as e:  # noqa: BLE001 - reported in the table
            row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
            traceback.print_exc(limit=2)
        if name == "ours" and "error" not in row:
            ours_ms = row
            best_f = min(x for x in (row["fwd_ms"], row["fwd_graph_ms"]) if x)
            if bytes_fwd:
                row["fwd_pct_copy"] = 100 * bytes_fwd / (best_f * 1e-3) / 1e9 / copy_gbs
            if bytes_bwd and row.get("fwdbwd_ms"):
                best_b = min(x for x in (row["fwdbwd_ms"], row["fwdbwd_graph_ms"]) if x)
                row["fwdbwd_pct_copy"] = 100 * (bytes_fwd + bytes_bwd) / (best_b * 1e-3) / 1e9 / copy_gbs
            if flops and row.get("fwdbwd_ms"):
                row["tflops"] = flops / (row["fwdbwd_ms"] * 1e-3) / 1e12
        elif ours_ms and "error" not in row:
            for k in ("fwd_ms", "fwdbwd_ms"):
                if row.get(k) and ours_ms.get(k):
                    row[k.replace("_ms", "_ratio")] = row[k] / ours_ms[k]
        ROWS.append(row)
        print(json.dumps(row), flush=True)
        _save()
        torch.cuda.empty_cache()


def _save() -> None:
    """Write what was measured so far (a run cut short by its time limit keeps its rows)."""
    if SAVE:
        with open(SAVE["path"], "w") as f:
            json.dump({"env": SAVE["env"], "command": SAVE["command"], "rows": ROWS}, f, indent=1)


def _grad(loss_fn, inputs):
    return lambda: torch.autograd.grad(loss_fn(), inputs)


def _peer(modname: str, attr: str):
    try:
        mod = __import__(modname, fromlist=[attr])
        return getattr(mod, attr)
    except Exception as e:  # noqa: BLE001
        print(f"peer {modname}.{attr} unavailable: {type(e).__name__}: {e}", flush=True)
        return None


# --------------------------------------------------------------------------------------------------

def group_loss(copy_gbs: float) -> None:
    N, V = 8192, 151936
    x = (torch.randn(N, V, device=DEV) * 2).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, V, (N,), device=DEV)
    compiled = torch.compile(lambda a, b: F.cross_entropy(a.float(), b))
    impls = {
        "ours": (lambda: api.fused_cross_entropy_loss(x, y), _grad(lambda: api.fused_cross_entropy_loss(x, y), x)),
        "eager F.cross_entropy(fp32)": (lambda: F.cross_entropy(x.float(), y),
                                        _grad(lambda: F.cross_entropy(x.float(), y), x)),
        "torch.compile": (lambda: compiled(x, y), _grad(lambda: compiled(x, y), x)),
    }
    liger_ce = _peer("liger_kernel.transformers.cross_entropy", "LigerCrossEntropyLoss")
    if liger_ce is not None:
        lce = liger_ce()
        xl = x.detach().clone().requires_grad_()  # Liger writes its gradient into the logits buffer
        impls["Liger CE"] = (lambda: lce(xl, y), _grad(lambda: lce(xl, y), xl))
    nb = N * V * 2
    bench(f"fused_cross_entropy_loss [{N}, {V}] bf16", impls, nb, 2 * nb, copy_gbs)
    del x, impls
    torch.cuda.empty_cache()

    liger_flce = _peer("liger_kernel.transformers.fused_linear_cross_entropy", "LigerFusedLinearCrossEntropyLoss")
    cce = _peer("cut_cross_entropy", "linear_cross_entropy")
    for N, H, V in ((8192, 4096, 151936), (16384, 4096, 128256), (4096, 2880, 201088)):
        h = torch.randn(N, H, device=DEV).to(torch.bfloat16).requires_grad_()
        w = (torch.randn(V, H, device=DEV) * H ** -0.5).to(torch.bfloat16).requires_grad_()
        y = torch.randint(0, V, (N,), device=DEV)
        comp = torch.compile(lambda a, b, c: F.cross_entropy((a @ b.t()).float(), c))
        impls = {
            "ours": (lambda: api.chunk_loss(h, w, y), _grad(lambda: api.chunk_loss(h, w, y), (h, w))),
            "ours accum_dtype=None (bf16 dweight accumulation)": (
                lambda: api.chunk_loss(h, w, y, accum_dtype=None),
                _grad(lambda: api.chunk_loss(h, w, y, accum_dtype=None), (h, w))),
            "eager linear+CE(fp32)": (lambda: F.cross_entropy((h @ w.t()).float(), y),
                                      _grad(lambda: F.cross_entropy((h @ w.t()).float(), y), (h, w))),
            "torch.compile": (lambda: comp(h, w, y), _grad(lambda: comp(h, w, y), (h, w))),
        }
        if liger_flce is not None:
            fl = liger_flce()
            impls["Liger FLCE"] = (lambda: fl(w, h, y), _grad(lambda: fl(w, h, y), (h, w)))
        if cce is not None:
            impls["cut-cross-entropy"] = (lambda: cce(h, w, y), _grad(lambda: cce(h, w, y), (h, w)))
        bench(f"chunk_loss [{N}, {H}] x [{V}, {H}] bf16", impls, None, None, copy_gbs, flops=6.0 * N * H * V)
        del h, w, impls
        torch.cuda.empty_cache()


def group_conv(copy_gbs: float) -> None:
    B, T, D, W = 4, 4096, 8192, 4
    x = torch.randn(B, T, D, device=DEV, dtype=torch.bfloat16).requires_grad_()
    wt = (torch.randn(W, D, device=DEV) * 0.5).to(torch.bfloat16).requires_grad_()
    b = torch.randn(D, device=DEV, dtype=torch.bfloat16).requires_grad_()
    comp = torch.compile(lambda a, c, d: conv_ref.causal_conv1d(a, c, d, activation="silu")[0])
    ours = lambda: api.causal_conv1d(x, wt, b, activation="silu")[0]  # noqa: E731
    eager = lambda: conv_ref.causal_conv1d(x, wt, b, activation="silu")[0]  # noqa: E731
    impls = {
        "ours": (ours, _grad(lambda: ours().float().sum(), (x, wt, b))),
        "eager": (eager, _grad(lambda: eager().float().sum(), (x, wt, b))),
        "torch.compile": (lambda: comp(x, wt, b), _grad(lambda: comp(x, wt, b).float().sum(), (x, wt, b))),
    }
    fla_conv = _peer("fla.modules.convolution", "causal_conv1d") or _peer("fla.modules.causal_conv1d.ops", "causal_conv1d")
    if fla_conv is not None:
        wf = wt.detach().t().contiguous().requires_grad_()
        fla = lambda: fla_conv(x, wf, b, activation="silu")[0]  # noqa: E731
        impls["fla triton"] = (fla, _grad(lambda: fla().float().sum(), (x, wf, b)))
    nb = B * T * D * 2
    # .float().sum() adds an fp32 read of y and a write of dy to every fwd+bwd: same for all impls
    bench(f"causal_conv1d W{W} silu [{B}, {T}, {D}] bf16", impls, 2 * nb, 3 * nb, copy_gbs)


def group_moe(copy_gbs: float) -> None:
    R, D, C = 65536, 4096, 64
    g = torch.Generator().manual_seed(0)
    cuts = sorted(torch.randperm(R - 1, generator=g)[:C - 1].add(1).tolist())
    split = [b - a for a, b in zip([0] + cuts, cuts + [R])]
    order = torch.randperm(C, generator=g).tolist()
    x = torch.randn(R, D, device=DEV, dtype=torch.bfloat16).requires_grad_()
    dy = torch.randn(R, D, device=DEV, dtype=torch.bfloat16)

    def eager_fn(a):
        parts = torch.split(a, split)
        return torch.cat([parts[i] for i in order])
    comp = torch.compile(eager_fn)
    ours = lambda: api.sort_chunks_by_idx(x, split, order)  # noqa: E731
    impls = {
        "ours": (ours, lambda: torch.autograd.grad(ours(), x, dy)),
        "eager split+cat": (lambda: eager_fn(x), lambda: torch.autograd.grad(eager_fn(x), x, dy)),
        "torch.compile": (lambda: comp(x), lambda: torch.autograd.grad(comp(x), x, dy)),
    }
    nb = R * D * 2
    bench(f"sort_chunks_by_idx [{R}, {D}] bf16, {C} chunks", impls, 2 * nb, 2 * nb, copy_gbs)


def group_mhc(copy_gbs: float) -> None:
    N, n, iters = 65536, 4, 20
    M = (2 + n) * n
    mixes = torch.randn(N, M, device=DEV).requires_grad_()
    s = torch.rand(3, device=DEV).add(0.5).requires_grad_()
    base = (torch.randn(M, device=DEV) * 0.1).requires_grad_()
    comp = torch.compile(lambda a, c, d: mhc_ref.sinkhorn(a, c, d, n, iters))

    def loss_of(outs):
        return sum(o.sum() for o in outs)
    ours = lambda: api.sinkhorn(mixes, s, base, n, iters)  # noqa: E731
    eager = lambda: mhc_ref.sinkhorn(mixes, s, base, n, iters)  # noqa: E731
    impls = {
        "ours": (ours, _grad(lambda: loss_of(ours()), (mixes, s, base))),
        "eager": (eager, _grad(lambda: loss_of(eager()), (mixes, s, base))),
        "torch.compile": (lambda: comp(mixes, s, base), _grad(lambda: loss_of(comp(mixes, s, base)), (mixes, s, base))),
    }
    lfwd = _peer("liger_kernel.ops.mhc", "mhc_split_sinkhorn_fwd")
    lbwd = _peer("liger_kernel.ops.mhc", "mhc_sinkhorn_bwd")
    if lfwd is not None:
        mix_c, b_c = mixes.detach().contiguous(), base.detach().contiguous()
        a0, a1, a2 = (s.detach()[i].reshape(1).contiguous() for i in range(3))
        kw = dict(tmax=iters, pre_eps=1e-6, sinkhorn_eps=1e-6, post_mult=2.0)
        gres = torch.ones(N, n, n, device=DEV)

        def liger_fb():
            out = lfwd(mix_c, b_c, a0, a1, a2, return_hist=True, **kw)
            return lbwd(mix_c, b_c, a2, gres, tmax=iters, sinkhorn_eps=1e-6, hist=out[3])
        impls["Liger mHC sinkhorn (kernels, comb grad only)"] = (lambda: lfwd(mix_c, b_c, a0, a1, a2, **kw),
                                                                  liger_fb if lbwd is not None else None)
    nb_f = N * M * 4 + N * (2 * n + n * n) * 4
    bench(f"sinkhorn n={n} iters={iters} [{N} tokens] fp32", impls, nb_f, nb_f + N * M * 4, copy_gbs)

    B, T, D = 4, 4096, 4096
    pre = torch.rand(B, T, n, device=DEV).requires_grad_()
    xs = torch.randn(B, T, n, D, device=DEV, dtype=torch.bfloat16).requires_grad_()
    cp = torch.compile(mhc_ref.mhc_pre_bmm)
    ours = lambda: api.mhc_pre_bmm(pre, xs)  # noqa: E731
    impls = {
        "ours": (ours, _grad(lambda: ours().float().sum(), (pre, xs))),
        "eager": (lambda: mhc_ref.mhc_pre_bmm(pre, xs), _grad(lambda: mhc_ref.mhc_pre_bmm(pre, xs).float().sum(), (pre, xs))),
        "torch.compile": (lambda: cp(pre, xs), _grad(lambda: cp(pre, xs).float().sum(), (pre, xs))),
    }
    nbx = B * T * n * D * 2
    bench(f"mhc_pre_bmm [{B}, {T}, {n}, {D}] bf16", impls, nbx + nbx / n, nbx / n + 2 * nbx, copy_gbs)

    xo = torch.randn(B, T, D, device=DEV, dtype=torch.bfloat16).requires_grad_()
    hp = torch.rand(B, T, n, device=DEV).requires_grad_()
    hr = torch.rand(B, T, n, n, device=DEV).requires_grad_()
    cpo = torch.compile(mhc_ref.mhc_post)
    ours = lambda: api.mhc_post(xo, xs, hp, hr)  # noqa: E731
    impls = {
        "ours": (ours, _grad(lambda: ours().float().sum(), (xo, xs, hp, hr))),
        "eager": (lambda: mhc_ref.mhc_post(xo, xs, hp, hr),
                  _grad(lambda: mhc_ref.mhc_post(xo, xs, hp, hr).float().sum(), (xo, xs, hp, hr))),
        "torch.compile": (lambda: cpo(xo, xs, hp, hr), _grad(lambda: cpo(xo, xs, hp, hr).float().sum(), (xo, xs, hp, hr))),
    }
    bench(f"mhc_post [{B}, {T}, {n}, {D}] bf16", impls, nbx / n + 2 * nbx, nbx + nbx / n + 2 * nbx, copy_gbs)


def _gdn_inputs(B, T, H, K, V, HV=None):
    HV = H if HV is None else HV
    q = torch.randn(B, T, H, K, device=DEV, dtype=torch.bfloat16).requires_grad_()
    k = torch.randn(B, T, H, K, device=DEV, dtype=torch.bfloat16).requires_grad_()
    v = torch.randn(B, T, HV, V, device=DEV, dtype=torch.bfloat16).requires_grad_()
    g = F.logsigmoid(torch.rand(B, T, HV, device=DEV)).requires_grad_()
    beta = torch.rand(B, T, HV, device=DEV).sigmoid().to(torch.bfloat16).requires_grad_()
    return q, k, v, g, beta


#: 8 unequal sequences, 16384 tokens: the varlen case of the linear-attention groups
_LA_LENS = [3000, 1000, 2500, 1500, 4000, 500, 2884, 1000]


#: what of the peers' linear-attention calls to time: "fwd+bwd", "fwd" or "none" (--la-peers)
LA_PEERS = {"mode": "fwd+bwd", "points": None, "off": []}


def _no_grad(fn):
    """``fn`` under ``torch.no_grad()``: the inference forward (the GDN/KDA ops then write no q̂/k̂ for a backward)."""
    def call():
        with torch.no_grad():
            return fn()
    return call


def _switched_off(fn, switch: str):
    """``fn`` with the ``mindspeed_ops.ops.<switch>`` module's ``ENABLED`` off for the call (``--off-too``'s A/B
    row; ``side_stream``: the GDN/KDA backward's side stream)."""
    import importlib

    mod = importlib.import_module(f"mindspeed_ops.ops.{switch}")

    def call():
        old, mod.ENABLED = mod.ENABLED, False
        try:
            return fn()
        finally:
            mod.ENABLED = old
    return call


def _la_group(op: str, ours_fn, peer, per_channel: bool, shapes, copy_gbs: float, with_bwd: bool) -> None:
    """One linear-attention case per shape ``(B, T, H, HV, varlen?)``, K = V = 128, bf16 q/k/v, fp32 gates
    ``logsigmoid(U)`` (per head, or per channel with ``per_channel``), qk l2norm in kernel; ours vs
    the fla peer (same call). Varlen: ours gets ``cu_seqlens_cpu`` too (no host read of the offsets, so
    the call can be graph-captured). Floor: the minimum bytes (q, k, v, g, beta read once, o written once)."""
    K = V = 128
    for B, T, H, HV, varlen in shapes[:LA_PEERS["points"]]:
        cu = None if not varlen else torch.tensor([0] + torch.tensor(_LA_LENS).cumsum(0).tolist(), device=DEV,
                                                    dtype=torch.int64)
        ours_kw = {} if cu is None else {"cu_seqlens_cpu": cu.cpu()}
        q, k, v, g, beta = _gdn_inputs(B, T, H, K, V, HV)
        if per_channel:
            g = F.logsigmoid(torch.rand(B, T, HV, K, device=DEV)).requires_grad_()
        ins = (q, k, v, g, beta)
        calls = {"ours": (ours_fn, ours_kw, with_bwd)}
        if peer is not None and LA_PEERS["mode"] != "none":
            calls[f"fla {op}"] = (peer, {}, with_bwd and LA_PEERS["mode"] == "fwd+bwd")
        impls = {}
        for label, (fn, kw, bwd) in calls.items():
            def fwd(fn=fn, kw=kw):
                return fn(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu, **kw)[0]
            impls[label] = (fwd, _grad(lambda fwd=fwd: fwd().float().sum(), ins) if bwd else None)
            if label == "ours":  # the forward of a training step (above) and of inference
                impls["ours, no grad"] = (_no_grad(fwd), None)
            for switch in LA_PEERS["off"] if label == "ours" else ():
                impls[f"ours, {switch} off"] = tuple(None if f is None else _switched_off(f, switch)
                                                     for f in impls[label])
        nb = B * T * (H * 2 * K + HV * 2 * V) * 2 + B * T * HV * ((K if per_channel else 1) * 4 + 2)
        name = f"{op} B{B} T{T} H{H}" + (f" HV{HV}" if HV != H else "") + " K=V=128" \
            + (f" varlen {len(_LA_LENS)} seqs" if varlen else "")
        msg = f"# {name}: floor {nb / copy_gbs / 1e6:.3f} ms of bytes ({nb / 1e6:.0f} MB)"
        if not per_channel:  # chunked FLOPs: kkt, w/u, state update, output
            flops = 2.0 * B * T * HV * 64 * (K + K + V + K + V) + 2.0 * B * T * HV * K * V * 3
            msg += f", {flops / 1e9:.1f} GFLOP fwd"
        print(msg, flush=True)
        bench(name, impls, nb, None, copy_gbs)
        del q, k, v, g, beta, ins, impls
        torch.cuda.empty_cache()


def group_gdn(copy_gbs: float, with_bwd: bool = True) -> None:
    """Issue-4/5 shapes of chunk_gated_delta_rule (Qwen3-Next GDN) vs fla: B1 T8192 H16, B1 T32768 H32,
    8 sequences / 16384 tokens H16, and GVA H16/HV32 at T32768."""
    _la_group("chunk_gated_delta_rule", api.chunk_gated_delta_rule,
              _peer("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"), False,
              ((1, 8192, 16, 16, False), (1, 32768, 32, 32, False), (1, 16384, 16, 16, True),
               (1, 32768, 16, 32, False)), copy_gbs, with_bwd)


def group_kda(copy_gbs: float, with_bwd: bool = True) -> None:
    """Issue-6 shapes of chunk_kda (Kimi-Linear KDA, per-channel gates) vs fla: B1 T8192 H16, B1 T32768 H32
    and 8 sequences / 16384 tokens H16."""
    _la_group("chunk_kda", api.chunk_kda, _peer("fla.ops.kda", "chunk_kda"), True,
              ((1, 8192, 16, 16, False), (1, 32768, 32, 32, False), (1, 16384, 16, 16, True)), copy_gbs, with_bwd)


def render(doc: dict) -> str:
    """Markdown tables (one per case) from a bench_ops.json document."""
    env = doc["env"]
    out = [f"Command: `{doc['command']}`; {env['gpu']}, torch {env['torch']}, triton {env['triton']}, "
           f"CUDA {env['cuda']}; peers: Liger-Kernel {env.get('liger_kernel')}, fla-core {env.get('fla')}, "
           f"cut-cross-entropy {env.get('cut_cross_entropy')}; copy bandwidth {env['copy_gbs']:.0f} GB/s.", ""]

    def f(v, fmt="{:.3f}"):
        return "—" if v is None else fmt.format(v)
    cases = list(dict.fromkeys(r["case"] for r in doc["rows"]))
    for case in cases:
        out += [f"### {case}", "",
                "| impl | fwd ms | fwd graph ms | fwd+bwd ms | fwd+bwd graph ms | extra MiB | % of copy (fwd / fwd+bwd) "
                "| ours faster by (fwd / fwd+bwd) |", "|---|---|---|---|---|---|---|---|"]
        for r in (r for r in doc["rows"] if r["case"] == case):
            if "error" in r:
                out.append(f"| {r['impl']} | error: {r['error']} |  |  |  |  |  |  |")
                continue
            pct = f"{f(r.get('fwd_pct_copy'), '{:.0f}')} / {f(r.get('fwdbwd_pct_copy'), '{:.0f}')}" \
                if "fwd_pct_copy" in r else ("—" if "tflops" not in r else f"{r['tflops']:.0f} TFLOP/s")
            ratio = f"{f(r.get('fwd_ratio'), '{:.2f}x')} / {f(r.get('fwdbwd_ratio'), '{:.2f}x')}" \
                if r["impl"] != "ours" else ""
            out.append(f"| {r['impl']} | {f(r.get('fwd_ms'))} | {f(r.get('fwd_graph_ms'))} | {f(r.get('fwdbwd_ms'))} "
                       f"| {f(r.get('fwdbwd_graph_ms'))} | {f(r.get('extra_mib'), '{:.0f}')} | {pct} | {ratio} |")
        out.append("")
    return "\n".join(out)


GROUPS = {"loss": group_loss, "conv": group_conv, "moe": group_moe, "mhc": group_mhc, "gdn": group_gdn,
          "gdn_fwd": lambda c: group_gdn(c, with_bwd=False), "kda": group_kda}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default=",".join(GROUPS), help="comma list of " + ", ".join(GROUPS))
    ap.add_argument("--out", default="out/bench_ops")
    ap.add_argument("--render", metavar="JSON", help="only print the markdown tables of a saved run")
    ap.add_argument("--la-peers", choices=("fwd+bwd", "fwd", "none"), default="fwd+bwd",
                    help="gdn/kda groups: which of fla's calls to time (its backward autotunes for minutes)")
    ap.add_argument("--la-points", type=int, default=None, help="gdn/kda groups: only the first N shapes")
    ap.add_argument("--off-too", default="", metavar="SWITCHES",
                    help="gdn/kda groups: also time ours with each of these switches off (comma list of "
                         "mindspeed_ops.ops modules with an ENABLED switch, e.g. side_stream; A/B rows in one process)")
    args = ap.parse_args()
    LA_PEERS.update(mode=args.la_peers, points=args.la_points, off=[s for s in args.off_too.split(",") if s])
    if args.render:
        with open(args.render) as fh:
            print(render(json.load(fh)))
        return 0
    os.makedirs(args.out, exist_ok=True)
    import triton
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda}
    for p in ("liger_kernel", "fla", "cut_cross_entropy"):
        try:
            from importlib.metadata import version
            env[p] = version({"fla": "fla-core", "liger_kernel": "liger-kernel",
                              "cut_cross_entropy": "cut-cross-entropy"}[p])
        except Exception:  # noqa: BLE001
            env[p] = None
    env["copy_gbs"] = copy_bandwidth()
    print(json.dumps(env), flush=True)
    SAVE.update(path=os.path.join(args.out, "bench_ops.json"), env=env,
                command="python3 benchmarks/bench_ops.py " + " ".join(sys.argv[1:]))
    for gname in args.groups.split(","):
        try:
            GROUPS[gname](env["copy_gbs"])
        except Exception:  # noqa: BLE001 - one broken group must not lose the others
            traceback.print_exc()
        torch.cuda.empty_cache()
    _save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
