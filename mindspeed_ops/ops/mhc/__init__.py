"""mHC family (SPEC 1.12): ``sinkhorn`` (alias ``hc_split_sinkhorn``), ``sinkhorn_knopp``,
``mhc_pre_bmm``, ``mhc_post``."""
from .autograd import hc_split_sinkhorn, mhc_post, mhc_pre_bmm, sinkhorn, sinkhorn_knopp

__all__ = ["sinkhorn", "hc_split_sinkhorn", "sinkhorn_knopp", "mhc_pre_bmm", "mhc_post"]
