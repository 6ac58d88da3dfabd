"""Shared helpers for the ``benchmarks/bench_*.py`` scripts: set-up, and (re-exported from the package's
ATK harness, :mod:`mindspeed_ops.atk.measure` and :mod:`mindspeed_ops.atk.report`, so there is one copy)
timing, memory, device ceilings, the fwd / fwd+bwd harness and the report writer.

Conventions every benchmark script follows (DESIGN 6, METHOD):

- time with ``triton.testing.do_bench`` (CUDA events, L2 flushed before each call, warm-up first),
  report the **median** (and the 20th/80th percentiles as the spread);
- count the **minimum** bytes an operator must move (every input read once, every output written
  once; fwd+bwd = the fwd minimum plus the bwd minimum) and report achieved GB/s and its fraction
  of the device copy bandwidth measured at the start of the same run (a large device-to-device copy,
  bytes read + bytes written);
- peak memory = ``torch.cuda.max_memory_allocated()`` during one call, after a reset, minus what was
  allocated before the call (the inputs), so it is the extra memory the call needs (outputs included);
- every baseline is compared with ``ours`` measured in the same run (``base ms / ours ms``: > 1 means
  ours is faster).

Call :func:`early_setup` before anything imports Triton kernels: in ``--dry-run`` mode without a GPU it
sets ``TRITON_INTERPRET=1`` (kernels then run on CPU under Triton's interpreter). Importing this module
imports no kernel module (``mindspeed_ops.atk.measure``/``report`` only need torch and triton at call time).

The operator-independent harness now lives in the package; new operators get their benchmark from a case
file (``tests/atk_tests/<op>.yaml``) and ``mindspeed-ops atk --suite performance memory``.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # the package need not be installed
    sys.path.insert(0, REPO_ROOT)

from mindspeed_ops.atk.measure import (  # noqa: E402,F401  (re-exported for the bench scripts)
    Case, Impl, Timing, _fwd_runner, _fwdbwd_runner, _inplace_graph, _random_cotangents, _short_error, as_tensors,
    bench_ms, copy_bandwidth_gbs, dist_version, env_info, gemm_tflops, graph_ms, measure_case, peak_extra_bytes,
    rel_rms, reset_compile_caches, sync, try_import)
from mindspeed_ops.atk.report import (  # noqa: E402,F401
    COLUMNS, _fmt, header_markdown, markdown_table, summary_table, write_report)


def early_setup(dry_run: bool, device: Optional[str] = None) -> str:
    """Put the repo on ``sys.path`` (the package need not be installed) and pick the device.

    Returns ``'cuda'`` or ``'cpu'``. Without CUDA only ``dry_run`` may proceed; it sets
    ``TRITON_INTERPRET=1`` before any Triton kernel is imported (torch itself may already be imported:
    ``@triton.jit`` reads the variable when a kernel is decorated).
    """
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        if not dry_run:
            raise SystemExit("no CUDA device: timings need a GPU; use --dry-run to check the plumbing on CPU")
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return device
