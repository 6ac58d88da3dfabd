from ...ops.norm.gated import FusedRMSNormGated, rms_norm_gated

__all__ = ["rms_norm_gated", "FusedRMSNormGated"]
