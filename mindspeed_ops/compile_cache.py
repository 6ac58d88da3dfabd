"""Keep torch.compile's on-disk caches from running an older version of this package's autograd code.

The AOTAutograd and Inductor caches key a compiled graph by its ops and their fake functions, not by
the Python behind a custom op's ``setup_context``/``backward`` or its launchers: a backward graph traced
before this package was upgraded or edited would be reused as is (seen in the nineteenth session: after
chunk_loss's mean started folding ``1/Σw`` into its forward, a cached backward divided by ``Σw`` again).
:func:`tag` adds a fingerprint of the package's sources (a hash of every ``.py`` file's path and bytes,
~5-10 ms at import; the same on every machine with the same sources, so shared caches stay shared) to
``torch.compiler.config.cache_key_tag``, which every one of those cache keys includes. A program that sets
its own tag after importing ``mindspeed_ops`` should append to it (or call :func:`tag` again).
"""
from __future__ import annotations

import hashlib
import os

_PREFIX = "mindspeed_ops-"


def fingerprint() -> str:
    """A short hash of the relative path and bytes of every ``.py`` file of the package."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.blake2b(digest_size=8)
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(d, name)
                with open(path, "rb") as f:
                    data = f.read()
                h.update(f"{os.path.relpath(path, root)}:{len(data)}:".encode())
                h.update(data)
    return h.hexdigest()


def tag() -> None:
    """Append (or refresh) this package's fingerprint in ``torch.compiler.config.cache_key_tag``, keeping
    any tag of the user's. A PyTorch without that setting is left alone."""
    try:
        import torch.compiler.config as cfg
    except ImportError:
        return
    if not hasattr(cfg, "cache_key_tag"):
        return
    parts = [p for p in str(cfg.cache_key_tag or "").split("|") if p and not p.startswith(_PREFIX)]
    cfg.cache_key_tag = "|".join(parts + [_PREFIX + fingerprint()])
