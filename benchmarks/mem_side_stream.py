"""Peak memory of a many-layer GDN or KDA backward, for the side stream's A/B (``ops/side_stream.py``).

Builds ``--layers`` independent layers at B1 T8192 H16 K=V=128 bf16 (in-kernel qk l2norm), runs one backward
through all of them, and prints ``max_memory_reserved`` / ``max_memory_allocated`` per iteration. Run it once
with ``MINDSPEED_OPS_SIDE_STREAM=1`` and once with ``=0`` (the switch is read at import)::

    MINDSPEED_OPS_SIDE_STREAM=1 python3 benchmarks/mem_side_stream.py --op gdn
    MINDSPEED_OPS_SIDE_STREAM=0 python3 benchmarks/mem_side_stream.py --op gdn

GPU only.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=["gdn", "kda"], default="gdn")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    args = ap.parse_args()
    from mindspeed_ops.api import chunk_gated_delta_rule, chunk_kda

    B, T, H, K = 1, args.T, args.H, 128
    torch.manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_()

    for it in range(args.iters):
        torch.cuda.reset_peak_memory_stats()
        outs = []
        for _ in range(args.layers):
            q, k, v = leaf(B, T, H, K), leaf(B, T, H, K), leaf(B, T, H, K)
            beta = torch.rand(B, T, H, device="cuda").sigmoid().requires_grad_()
            if args.op == "gdn":
                g = F.logsigmoid(torch.randn(B, T, H, device="cuda")).requires_grad_()
                o, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
            else:
                g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).requires_grad_()
                o, _ = chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
            outs.append(o)
        sum(o.float().sum() for o in outs).backward()
        torch.cuda.synchronize()
        mib = 2 ** 20
        print(f"{args.op} side_stream={os.environ.get('MINDSPEED_OPS_SIDE_STREAM', '1')} iter {it}: "
              f"max_reserved {torch.cuda.max_memory_reserved() / mib:.0f} MiB, "
              f"max_allocated {torch.cuda.max_memory_allocated() / mib:.0f} MiB, "
              f"reserved now {torch.cuda.memory_reserved() / mib:.0f} MiB")
        del outs


if __name__ == "__main__":
    main()
