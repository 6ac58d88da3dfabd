"""Compatibility helpers for code written for MindSpeed."""


def is_arch35() -> bool:
    """Always ``False``: lets code written for MindSpeed's two NPU generations import unchanged."""
    return False
