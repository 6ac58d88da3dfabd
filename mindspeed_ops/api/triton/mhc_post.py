from ...ops.mhc import mhc_post

__all__ = ["mhc_post"]
