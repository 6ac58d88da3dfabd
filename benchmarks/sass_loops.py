"""Instruction counts of an operator's Triton kernels in their sm_90 SASS, without a GPU: where a loop spends its
instructions (the seventeenth session found causal_conv1d's loops long, a third of them range fix-ups of
``tl.exp`` and ``/``; docs/benchmarks/s17/).

    python3 benchmarks/sass_loops.py --op causal_conv1d [--arch 90] [--out DIR]

The launches of one forward+backward at a representative shape are recorded under the CPU interpreter (a child
process, ``compile_check.Recorder(dry=True)``: nothing runs; fp16 recorded, swapped to bf16; 132 SMs, as the H200),
compiled here with ``triton.compile`` and disassembled with ``nvdisasm`` from Triton's wheel. Per kernel: registers and spills, the
MUFU ex2/rcp count, the exp (``FSETP < -126``) and division (``FSETP > 2^126``) fix-ups, and every loop (a label
to its back-branch) with its instruction count and, where it issues async copies, how many copy groups its waits
leave in flight (0: every step waits for its own loads). ``--out`` keeps the SASS files.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def _run_op(op: str, HV: int = 32) -> None:
    """One forward+backward of ``op`` at the shape its issue's benchmark uses (T short: T only sizes the grid);
    ``HV`` value heads over 16 q/k heads."""
    import torch
    import torch.nn.functional as F

    from mindspeed_ops import api
    dt = torch.float16
    if op == "causal_conv1d":
        x = torch.randn(4, 4096, 8192, dtype=dt, requires_grad=True)
        w = torch.randn(4, 8192, dtype=dt, requires_grad=True)
        y = api.causal_conv1d(x, w, activation="silu")[0]
        y.backward(torch.randn_like(y))
        return
    B, T, H, K = 1, 1024, 16, 128
    q, k = (torch.randn(B, T, H, K, dtype=dt, requires_grad=True) for _ in range(2))
    v = torch.randn(B, T, HV, K, dtype=dt, requires_grad=True)
    beta = torch.rand(B, T, HV, dtype=dt).requires_grad_()
    if op == "chunk_kda":
        g = (-torch.rand(B, T, HV, K) * 0.1).requires_grad_()
        o = api.chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]
    else:
        g = F.logsigmoid(torch.rand(B, T, HV)).requires_grad_()
        o = api.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]
    o.backward(torch.randn_like(o))


def record(op: str, path: str, HV: int = 32) -> None:
    """(child process, interpreter) the op's launches, one per kernel, as bf16 launches in ``path``."""
    from mindspeed_ops import compile_check as cc
    from mindspeed_ops import triton_utils as tu
    tu.num_sms = lambda device: 132  # the H200's: the launchers size their grids (and tiles) by it
    with cc.Recorder(dry=True) as rec:
        _run_op(op, HV)
    seen, out = set(), []
    for launch in rec.launches:
        if launch.qualname not in seen:
            seen.add(launch.qualname)
            out.append(cc.as_bf16(launch).to_dict())
    with open(path, "w") as f:
        json.dump(out, f)


def loops(sass: str) -> list:
    """``(label, instructions, MUFU count, async-copy waits, plain loads)`` of every loop: a label and the backward
    branch to it. Plain loads (``LDG``, not staged by the software pipeline) stall the first instruction that uses
    them; in a scan's chain that is a global load's latency every step unless the value is loaded a step ahead
    (the scans' per-channel gate rows: branch ``gate-row-prefetch``, docs/STATUS.md).
    The waits are the ``DEPBAR.LE SB0, N`` in the body (``cp.async.wait_group N``). A loop that issues its own copies
    (``LDGSTS``) and waits with N = 0 waits for all of them every iteration: the copies for the next step are not
    hidden behind this one. The twenty-eighth session found the state scans at 2 stages like this
    (docs/benchmarks/gdn.md)."""
    lines = sass.split("\n")
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line))}
    out = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            body = [b for b in lines[labels[m.group(1)]:i + 1] if _INSTR.match(b)]
            if len(body) > 1:
                waits = [int(w.group(1), 16) for b in body if (w := re.search(r"DEPBAR\.LE SB0, 0x([0-9a-f]+)", b))]
                copies = sum("LDGSTS" in b for b in body)
                plain = sum(bool(re.search(r"\bLDG\.E", b)) for b in body)
                out.append((m.group(1), len(body), sum("MUFU" in b for b in body), waits if copies else [], plain))
    return sorted(out, key=lambda t: -t[1])


def summary(sass: str) -> dict:
    ops = [m.group(1) for line in sass.split("\n") if (m := _INSTR.match(line))]
    return {"instructions": len(ops), "MUFU.EX2": ops.count("MUFU.EX2"), "MUFU.RCP": ops.count("MUFU.RCP"),
            "exp fix-ups": 3 * len(re.findall(r"FSETP\S* P\d+, PT, R\d+, -126", sass)),
            "div fix-ups": len(re.findall(r"FSETP\S* P\d+, PT, R\d+, 8\.507", sass))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", required=True, choices=["causal_conv1d", "chunk_kda", "chunk_gated_delta_rule"])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--hv", type=int, default=32, help="value heads over 16 q/k heads (16: equal heads)")
    ap.add_argument("--out", help="keep the .sass files here")
    ap.add_argument("--kernels", nargs="+", help="only kernels whose name contains one of these")
    ap.add_argument("--record", help=argparse.SUPPRESS)  # internal: the interpreter child writes the launches here
    args = ap.parse_args()
    if args.record:
        record(args.op, args.record, args.hv)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "launches.json")
        env = dict(os.environ, TRITON_INTERPRET="1")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--op", args.op, "--hv", str(args.hv),
                        "--record", path], env=env,
                       check=True)
        with open(path) as f:
            launches = json.load(f)
    os.environ["TRITON_INTERPRET"] = "0"
    import triton

    from mindspeed_ops import compile_check as cc
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    for d in launches:
        launch = cc.Launch.from_dict(d)
        if args.kernels and not any(n in launch.qualname for n in args.kernels):
            continue
        kernel = cc.compile_kernel(launch, args.arch)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(kernel.asm["cubin"])
            cubin.flush()
            sass = subprocess.run([nvdisasm, "-c", cubin.name], capture_output=True, text=True, check=True).stdout
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"{launch.qualname}.sass"), "w") as f:
                f.write(sass)
        usage = cc.resource_usage(kernel.asm["cubin"], kernel.asm.get("ptx"), args.arch)
        print(f"{launch.qualname} {launch.options_str()} {launch.constexpr_str()}")
        print(f"  regs {usage.get('regs')} spills {usage.get('spill_stores')} {summary(sass)}")
        for label, n, mufu, waits, plain in loops(sass):
            wait = f", waits for its copies down to {min(waits)} groups in flight" if waits else ""
            print(f"  loop {label}: {n} instructions, {mufu} MUFU, {plain} plain loads{wait}")


if __name__ == "__main__":
    main()
