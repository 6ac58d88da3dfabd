"""``mindspeed-ops check`` cases of the GDN family (SPEC 1.10.10): the full operator against the
chunked reference, shared recipe of SPEC 1.10.0 (l2-normalised q/k in kernel, sigmoid beta,
logsigmoid gates with some exact zeros)."""
import torch
import torch.nn.functional as F

from ...checks import CheckCase
from ...testing import randn, uniform
from . import reference as ref
from .autograd import chunk_gated_delta_rule


def inputs(small, real, lens=None, h0=True, chunk_size=64, per_channel=False):
    """Input builder of the GDN and KDA check cases (``per_channel``: KDA gates ``[B, T, HV, K]``)."""
    def make(device, dtype, is_small):
        B, T, H, HV, K, V = small if is_small else real
        gshape = (B, T, HV, K) if per_channel else (B, T, HV)
        g = F.logsigmoid(uniform(gshape, 0.0, 1.0, torch.float32, device, seed=3)) / 0.1
        g = g * (uniform(gshape, 0.0, 1.0, torch.float32, device, seed=4) > 0.2)
        d = {"q": randn((B, T, H, K), dtype, device, seed=0), "k": randn((B, T, H, K), dtype, device, seed=1),
             "v": randn((B, T, HV, V), dtype, device, seed=2), "g": g,
             "beta": torch.sigmoid(randn((B, T, HV), torch.float32, device, seed=5)).to(dtype),
             "use_qk_l2norm_in_kernel": True, "output_final_state": True, "chunk_size": chunk_size}
        N = B
        if lens is not None:
            ls = lens[0 if is_small else 1]
            cu = [0]
            for n in ls:
                cu.append(cu[-1] + n)
            d["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device=device)
            N = len(ls)
        if h0:
            d["initial_state"] = randn((N, HV, K, V), torch.float32, device, seed=6)
        return d
    return make


def _ref(**kw):
    return ref.chunk_gated_delta_rule_ref(**kw)


CASES = [
    CheckCase("chunk_gated_delta_rule", "B1 T8192 H16 K=V=128", inputs((1, 80, 2, 2, 32, 32), (1, 8192, 16, 16, 128, 128)),
              chunk_gated_delta_rule, _ref, out_classes=("LA-o", "LA-o"),
              grad_inputs=("q", "k", "v", "g", "beta", "initial_state"), grad_class="LA-g"),
    CheckCase("chunk_gated_delta_rule", "varlen GVA H4 HV16", inputs((1, 100, 1, 2, 32, 48), (1, 4096, 4, 16, 128, 128),
                                                                    lens=([30, 1, 69], [1024, 1, 2000, 1071])),
              chunk_gated_delta_rule, _ref, out_classes=("LA-o", "LA-o"),
              grad_inputs=("q", "k", "v", "g", "beta", "initial_state"), grad_class="LA-g"),
]
