"""Gated RMSNorm (SPEC 1.3): rms_norm_gated, FusedRMSNormGated."""
