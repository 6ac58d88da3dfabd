from ...ops.mhc import mhc_pre_bmm

__all__ = ["mhc_pre_bmm"]
