"""Gated DeltaNet family (SPEC 1.10): references and the first stage kernels.

Stage functions are forward-only plain functions (not registered custom ops, no autograd):
``chunk_local_cumsum`` (1.10.1) and ``solve_tril`` (1.10.3). ``reference`` holds the token-by-token
oracle and the chunked reference of the full operator.
"""
from .cumsum import chunk_local_cumsum
from .solve_tril import solve_tril

__all__ = ["chunk_local_cumsum", "solve_tril"]
