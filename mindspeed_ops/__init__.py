"""mindspeed_ops: fused forward+backward operators for training large language models.

Use the flat API: ``from mindspeed_ops import api; api.clipped_swiglu(x)``. The device of the inputs
picks the implementation (Triton on CUDA, the pure-PyTorch reference on CPU); see
:mod:`mindspeed_ops.backends` and :func:`use_backend`.
"""
from .backends import BackendUnavailableError, use_backend
# every operator registered as torch.ops.mindspeed_ops.<name> (SPEC 2.1); this loads no triton (triton_utils)
from . import api  # noqa: E402,F401
from . import compile_cache

compile_cache.tag()  # a torch.compile cache entry made with other sources of this package is not reused

__version__ = "0.1.0"

__all__ = ["use_backend", "BackendUnavailableError", "__version__"]
