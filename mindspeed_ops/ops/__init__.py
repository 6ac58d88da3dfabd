"""Operator families. Each package ``ops/<family>/`` holds ``reference.py`` (pure PyTorch: the spec in
code, the CPU path and the test oracle), ``triton_kernels.py`` (``@triton.jit`` code only), one host
launcher module per operator (checks, grids, configs) and ``autograd.py`` (custom-op registration,
autograd, backend registration). Importing a family registers its operators."""
