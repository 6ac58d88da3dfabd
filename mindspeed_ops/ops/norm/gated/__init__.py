"""Gated RMSNorm (SPEC 1.3): rms_norm_gated, FusedRMSNormGated.

Importing this package registers ``torch.ops.mindspeed_ops.rms_norm_gated`` (+ ``_bwd``) and its
``triton``/``reference`` backends.
"""
from .autograd import FusedRMSNormGated, rms_norm_gated

__all__ = ["rms_norm_gated", "FusedRMSNormGated"]
