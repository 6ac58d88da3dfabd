"""``sinkhorn`` at the TileLang path (SPEC 2.1). No TileLang kernel exists yet: this is the Triton
implementation (the SPEC's documented fallback when TileLang is absent)."""
from ..triton.sinkhorn import sinkhorn

__all__ = ["sinkhorn"]
