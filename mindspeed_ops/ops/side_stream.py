"""Two independent branches of a pipeline side by side on one GPU: the second on a side CUDA stream.

Why: at the issues' shapes (B1, 16 value heads) a chunk state scan is 64 programs on the H200's 132 SMs, a
latency-bound chain of chunk steps. In the GDN/KDA backward the recomputed forward scan (h, v_new) does not
depend on the reverse scan (dh), so the two can share the GPU instead of running one after the other.

Usage (the branch's inputs must stay referenced until :func:`join`; its outputs are handed to the caller's
stream there)::

    side = fork(x.device)                  # None on CPU, or when switched off: one stream, nothing changes
    h, v_new = on_side(side, scan, ...)    # enqueued on the side stream, after all work queued so far
    dh = other_branch(...)                 # the caller's stream, concurrently
    join(side, h, v_new)                   # the caller's stream waits for the side branch

Results are bitwise those of the one-stream order (the branches share no outputs). CUDA-graph capture and
``torch.compile`` (inside a custom op's body) work: the side stream forks from and joins the caller's stream.
A fork is not re-entrant: join it before the same caller's stream forks again.
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


# one side stream per (device, caller's stream): a caller's stream being captured into a CUDA graph never
# shares its side stream with another caller's work
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
    side.fork_event.record(main)
    side.stream.wait_event(side.fork_event)
    return side


def on_side(side: Optional[Side], fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` with ``side``'s stream current (on the caller's stream when ``side`` is None)."""
    if side is None:
        return fn(*args, **kwargs)
    torch.cuda.set_stream(side.stream)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.cuda.set_stream(side.main)


def join(side: Optional[Side], *outputs: Optional[torch.Tensor]) -> None:
    """The caller's stream waits for ``side``'s work; ``outputs`` (made on ``side``) are marked as used by the
    caller's stream, so the caching allocator does not hand their memory to the side stream while the
    caller's later kernels may still read them."""
    if side is None:
        return
    side.join_event.record(side.stream)
    side.main.wait_event(side.join_event)
    for t in outputs:
        if t is not None:
            t.record_stream(side.main)
