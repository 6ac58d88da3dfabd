"""RoPE family (SPEC 1.5)."""
