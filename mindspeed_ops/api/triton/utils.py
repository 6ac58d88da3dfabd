"""``prepare_chunk_indices`` and ``get_available_device`` (SPEC 2.1)."""
import torch


def get_available_device() -> str:
    """``"cuda"`` when a CUDA device is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


__all__ = ["get_available_device"]
