"""Programmatic dependent launch (PDL, Hopper and later): a kernel launched with ``launch_pdl=True`` may start
while the kernel before it in the stream still runs, once every program of that kernel has called
``gdc_launch_dependents`` (or ended).

Why: a chunk state scan (GDN/KDA ``fwd_h``) is a chain of chunk steps that fills about half of the H200's SMs
at the issues' shapes (64 programs); the output stage after it can then run on the other SMs, chunk by chunk as
the scan signals them (``triton_fwd._signal_chunk`` / ``_wait_chunk``), instead of after the scan. The consumer
cannot starve the scan: it starts only once every scan program is resident.
``MINDSPEED_OPS_PDL=0`` (read at import; or set :data:`ENABLED`) launches everything in plain stream order.
"""
from __future__ import annotations

import functools

import torch

from .. import triton_utils as tu

#: Let an output stage start while its state scan runs (True, default, where the device supports it).
ENABLED = tu.env_switch("MINDSPEED_OPS_PDL")


@functools.lru_cache(maxsize=None)
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def available(device: torch.device) -> bool:
    """PDL for kernels on ``device``: on when :data:`ENABLED`, on CUDA of compute capability 9.0 or later,
    and not under Triton's interpreter."""
    return (ENABLED and device.type == "cuda" and not tu.interpreting()
            and _hopper_or_later(device.index if device.index is not None else torch.cuda.current_device()))


def ready_counts(B: int, NT: int, HV: int, device: torch.device) -> torch.Tensor:
    """Zeroed per-chunk ready counts ``[B, NT, HV]`` int32 of a state scan (a new buffer per call: calls on
    other streams or in a CUDA graph never share one)."""
    return torch.zeros(B, NT, HV, dtype=torch.int32, device=device)


def producer_args(flags, pdl: bool) -> dict:
    """Launch arguments of a scan that signals ``flags`` (none without flags)."""
    if flags is None:
        return {}
    return {"SIGNAL": True, "flag_ptr": flags, "s_fb": flags.stride(0), "s_fc": flags.stride(1), "PDL": pdl}


def consumer_args(flags, pdl: bool) -> dict:
    """Launch arguments of a stage that waits on ``flags``, launched to start early with ``pdl``."""
    if flags is None:
        return {}
    extra = {"launch_pdl": True} if pdl else {}
    return {"WAIT": True, "flag_ptr": flags, "s_fb": flags.stride(0), "s_fc": flags.stride(1), **extra}
