"""Training text that every machine has without a download: the Python standard library's own source
files, read as bytes (a byte-level vocabulary of 256).

Files are read in sorted path order (``sysconfig`` ``stdlib`` directory, ``*.py``, site-/dist-packages
excluded) until ``max_bytes`` are collected and the validation split has a file; every 20th file goes to
the validation split, so the validation text comes from files the model never trains on. Batches are
drawn by a generator seeded with ``(seed, step)``: a run resumed from a checkpoint sees exactly the
batches of an uninterrupted run.
"""
from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_dir() -> Path:
    """The directory of this interpreter's standard library sources."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Optional[Path] = None) -> list[Path]:
    """Sorted ``*.py`` files of the standard library (third-party package directories excluded)."""
    root = Path(root) if root is not None else stdlib_dir()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return sorted(files)


@dataclass
class ByteCorpus:
    """Train and validation byte streams (``uint8`` tensors) and where they came from."""

    train: torch.Tensor
    val: torch.Tensor
    root: str
    files: int

    @classmethod
    def from_stdlib(cls, max_bytes: int = 8 << 20, root: Optional[Path] = None, val_every: int = 20
                    ) -> "ByteCorpus":
        """Read up to ``max_bytes`` of standard-library source (see the module docstring).

        Raises:
            RuntimeError: no readable ``.py`` file under ``root`` (e.g. a Python built without its sources).
        """
        root = Path(root) if root is not None else stdlib_dir()
        train, val, total, used = [], [], 0, 0
        for i, path in enumerate(stdlib_files(root)):
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if not data:
                continue
            (val if i % val_every == val_every - 1 else train).append(data)
            total += len(data)
            used += 1
            if total >= max_bytes and val:  # a tiny max_bytes still gets a validation file
                break
        if not train or not val:
            raise RuntimeError(f"no Python source found under {root} (needs the standard library's .py files)")
        as_tensor = lambda chunks: torch.frombuffer(bytearray(b"\n".join(chunks)), dtype=torch.uint8)  # noqa: E731
        return cls(as_tensor(train), as_tensor(val), str(root), used)

    def batch(self, split: str, batch_size: int, seq_len: int, seed: int, step: int,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, labels)``, both ``[batch_size, seq_len]`` int64: random windows of the split,
        labels shifted by one byte. Deterministic in ``(seed, split, step)``."""
        data = self.train if split == "train" else self.val
        if data.numel() <= seq_len + 1:
            raise ValueError(f"the {split} split has {data.numel()} bytes, fewer than seq_len + 1 = {seq_len + 1}")
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 2 + (split != "train"))
        starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=gen)
        rows = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()]).long()
        rows = rows.to(device, non_blocking=True)
        return rows[:, :-1], rows[:, 1:]


__all__ = ["ByteCorpus", "stdlib_dir", "stdlib_files"]
