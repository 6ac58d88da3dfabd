"""Norm family (SPEC 1.1-1.3): ``l2norm`` (+ ``L2Norm``, ``l2norm_fwd``, ``l2norm_bwd``),
``rmsnorm_without_weight``, ``rms_norm``; gated RMSNorm lives in ``norm.gated``.

Importing this package registers the ops (``torch.ops.mindspeed_ops.<name>``) and their backends."""
from .autograd import L2Norm, l2norm, l2norm_bwd, l2norm_fwd, rms_norm, rmsnorm_without_weight

__all__ = ["l2norm", "L2Norm", "l2norm_fwd", "l2norm_bwd", "rmsnorm_without_weight", "rms_norm"]
