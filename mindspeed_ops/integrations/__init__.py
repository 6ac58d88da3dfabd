"""Drop-in integrations with model code of other libraries.

- :mod:`mindspeed_ops.integrations.transformers`: ``apply(model)`` swaps our operators into Hugging Face
  transformers models (Qwen3-Next, Qwen3.5, Kimi-Linear, GPT-OSS, DeepSeek-V4) and a ``chunk_loss`` head.
- :mod:`mindspeed_ops.integrations.fla_compat`: ``install()`` serves our GDN/KDA kernels where
  transformers probes for flash-linear-attention (never shadowing a real installation).

Nothing is imported here: each submodule imports its library when it is used.
"""
