"""``mindspeed-ops check`` cases of the MoE family."""
import torch

from ...checks import CheckCase
from ...testing import generator, randn
from . import reference as ref
from .autograd import sort_chunks_by_idx, sort_chunks_by_idx_with_probs


def random_splits(num_splits: int, num_tokens: int, seed: int = 0, *, tail: int = 0, zeros: int = 2):
    """Random ``split_sizes`` summing to ``num_tokens - tail`` with at least ``zeros`` empty chunks, and a
    random permutation ``sorted_idxs`` (both int64 CPU tensors)."""
    g = generator(seed)
    total = num_tokens - tail
    cuts = torch.sort(torch.randint(0, total + 1, (num_splits - 1,), generator=g)).values
    sizes = torch.diff(torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.tensor([total])]))
    if num_splits > zeros:  # force empty chunks: move their rows to a neighbour
        for j in torch.randperm(num_splits, generator=g)[:zeros].tolist():
            sizes[(j + 1) % num_splits] += sizes[j]
            sizes[j] = 0
    return sizes, torch.randperm(num_splits, generator=g)


def _inputs(small, real, with_probs):
    def make(device, dtype, is_small):
        ns, nt, hidden = small if is_small else real
        sizes, order = random_splits(ns, nt, seed=ns, tail=3)
        d = {"inp": randn((nt, hidden), dtype, device, seed=1), "split_sizes": sizes.to(device),
             "sorted_idxs": order.to(device)}
        if with_probs:
            d["probs"] = randn((nt,), torch.float32, device, seed=2)
        return d
    return make


def _run_probs(inp, probs, split_sizes, sorted_idxs):
    return sort_chunks_by_idx_with_probs(inp, probs, split_sizes, sorted_idxs)


def _ref_probs(inp, probs, split_sizes, sorted_idxs):
    return ref.sort_chunks_by_idx_with_probs(inp, probs, split_sizes, sorted_idxs)


CASES = [
    CheckCase("sort_chunks_by_idx", f"{real[0]} splits {list(real[1:])}", _inputs(small, real, False),
              sort_chunks_by_idx, ref.sort_chunks_by_idx, out_classes=("EXACT",), grad_inputs=("inp",),
              grad_class="EXACT")
    for small, real in [((16, 512, 64), (257, 10_000, 7168)), ((8, 256, 40), (32, 65_536, 4096))]
] + [
    CheckCase("sort_chunks_by_idx_with_probs", f"{real[0]} splits {list(real[1:])}", _inputs(small, real, True),
              _run_probs, _ref_probs, out_classes=("EXACT", "EXACT"), grad_inputs=("inp", "probs"),
              grad_class="EXACT")
    for small, real in [((16, 512, 64), (64, 16_384, 4096))]
]
