"""Norm family (SPEC 1.1-1.3)."""
