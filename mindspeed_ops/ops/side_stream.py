"""Two independent branches of a pipeline side by side on one GPU: the second on a side CUDA stream.

Why: at the issues' shapes (B1, 16 value heads) a chunk state scan is 64 programs on the H200's 132 SMs, a
latency-bound chain of chunk steps. In the GDN/KDA backward the recomputed forward scan (h, v_new) does not
depend on the reverse scan (dh), so the two can share the GPU instead of running one after the other.

Usage: the branch's outputs are made on the caller's stream before the fork, and its inputs stay referenced until
:func:`join`. So every tensor the two streams share belongs to the caller's stream: its memory goes back to that
stream's pool in stream order, with no ``record_stream`` (whose deferred frees would make the caching allocator
take new blocks for every layer the host runs ahead of the GPU)::

    h = torch.empty(...)                   # on the caller's stream
    side = fork(x.device)                  # None on CPU, or when switched off: one stream, nothing changes
    on_side(side, scan, ..., out=h)        # enqueued on the side stream, after all work queued so far
    dh = other_branch(...)                 # the caller's stream, concurrently
    join(side)                             # the caller's stream waits for the side branch

Results are bitwise those of the one-stream order (the branches share no outputs). CUDA-graph capture and
``torch.compile`` (inside a custom op's body) work: the side stream forks from and joins the caller's stream.
A fork inside a branch on the same caller's stream reuses its side stream and events (every wait still covers
what it needs: a wait binds to the event's latest record). If the caller's branch raises before :func:`join`, the
side work is not joined (a CUDA-graph capture then fails as unjoined).
``MINDSPEED_OPS_SIDE_STREAM=0`` (read at import; or set :data:`ENABLED`) keeps every launch on the caller's
stream, for comparison and timing.

Host cost is kept to a few driver calls (the step is often host-bound): events made once per side stream and
re-recorded (a wait binds to the record made before it), ``torch.cuda.set_stream`` instead of a stream context.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch

from .. import triton_utils as tu

#: Run independent branches on a side stream (True, default) or everything on the caller's stream.
ENABLED = tu.env_switch("MINDSPEED_OPS_SIDE_STREAM")


class Side:
    """A side stream bound to one caller's stream, with its fork and join events."""
    __slots__ = ("main", "stream", "fork_event", "join_event")

    def __init__(self, main: torch.cuda.Stream):
        self.main = main
        self.stream = torch.cuda.Stream(main.device)
        self.fork_event = torch.cuda.Event()
        self.join_event = torch.cuda.Event()


# one Side per (device, caller's stream), so a stream being captured into a CUDA graph gets its own events. The
# streams come from PyTorch's pool (32 per device, handed out in turn), so another user of the pool (NCCL, other
# threads) may share the CUDA stream: correct, only less concurrent; one equal to the caller's is not forked to.
_SIDES: Dict[Tuple[int, int], Side] = {}


def fork(device: torch.device, programs: Optional[int] = None) -> Optional[Side]:
    """A side stream of ``device`` that waits for everything queued so far on the caller's current stream.

    ``programs``: the number of programs each branch's main kernel runs, where the branches only gain if
    both fit on the SMs side by side (two such kernels sharing SMs can run slower than one after the other:
    GDN's scans at 128 programs each measured 2-3% slower on the H200, docs/benchmarks/gdn.md); ``None`` to
    always fork. Returns ``None`` (stay on one stream) off CUDA, when :data:`ENABLED` is False, or when
    ``2 * programs`` exceeds the SM count."""
    if not ENABLED or device.type != "cuda":
        return None
    main = torch.cuda.current_stream(device)
    if programs is not None and 2 * programs > tu.num_sms(device):
        return None
    key = (main.device_index, main.stream_id)
    side = _SIDES.get(key)
    if side is None:
        side = _SIDES[key] = Side(main)
    if side.stream == main:  # the pool handed out the caller's own stream: nothing to overlap
        return None
    side.fork_event.record(main)
    side.stream.wait_event(side.fork_event)
    return side


def on_side(side: Optional[Side], fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` with ``side``'s stream current (on the caller's stream when ``side`` is None). The
    current device is as before after it (``set_stream`` also makes the stream's device current)."""
    if side is None:
        return fn(*args, **kwargs)
    device = torch.cuda.current_device()
    torch.cuda.set_stream(side.stream)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.cuda.set_stream(side.main)
        if device != side.main.device_index:
            torch.cuda.set_device(device)


def join(side: Optional[Side]) -> None:
    """The caller's stream waits for ``side``'s work (a no-op when ``side`` is None). Temporaries the branch made
    and freed stay in the side stream's pool: only later side-stream work, in that stream's order, reuses them."""
    if side is None:
        return
    side.join_event.record(side.stream)
    side.main.wait_event(side.join_event)
