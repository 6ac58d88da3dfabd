#!/usr/bin/env python
"""Train a small hybrid language model built from mindspeed_ops operators (same as ``mindspeed-ops train``).

The model (``mindspeed_ops/train/model.py``) uses every operator where real models do:

- Gated DeltaNet layers (Qwen3-Next): ``causal_conv1d``, ``l2norm``, ``chunk_gated_delta_rule``,
  ``rms_norm_gated``;
- a KDA layer (Kimi-Linear): ``chunk_kda`` (in a build without ``mindspeed_ops.api.chunk_kda`` a Gated
  DeltaNet layer takes its place, with a message);
- a full-attention layer with DeepSeek-V4's interleaved ``inplace_rope``;
- a GPT-OSS-style MoE MLP: ``sort_chunks_by_idx(_with_probs)`` for the expert-parallel token
  regrouping and ``clipped_swiglu`` in the experts;
- mHC residual streams (DeepSeek-V4): ``rmsnorm_without_weight``, ``sinkhorn``, ``mhc_pre_bmm``,
  ``mhc_post``; ``rms_norm`` pre-norms;
- ``chunk_loss`` (fused LM head + cross-entropy) at the head.

It trains on the Python standard library's own source files, byte by byte (nothing to download).

Examples::

    python examples/train_hybrid.py                      # CPU: reference backend, 200 steps in a few minutes
    python examples/train_hybrid.py --steps 300 --resume # continue that run to step 300 (--steps is the total)
    python examples/train_hybrid.py --preset gpu --compare   # GPU: Triton kernels vs the PyTorch reference

Outputs in ``--out`` (default ``out/train_hybrid``): ``checkpoint.pt``, ``loss.png``, ``metrics.json``.
Run ``python examples/train_hybrid.py --help`` for every option.
"""
import sys

from mindspeed_ops.train import main

if __name__ == "__main__":
    sys.exit(main())
