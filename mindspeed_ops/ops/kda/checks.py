"""``mindspeed-ops check`` cases of the KDA family (SPEC 1.11.3): the full operator against the chunked
reference, shared recipe of SPEC 1.10.0 with per-channel gates (l2-normalised q/k in kernel, sigmoid
beta, logsigmoid gates with some exact zeros, fp32 gates and initial state as HF Kimi-Linear passes)."""
from ...checks import CheckCase
from ..gdn.checks import inputs
from . import reference as ref
from .autograd import chunk_kda


def _inputs(small, real, lens=None, h0=True, chunk_size=64):
    return inputs(small, real, lens, h0, chunk_size, per_channel=True)


def _ref(**kw):
    return ref.chunk_kda_ref(**kw)


_GRADS = ("q", "k", "v", "g", "beta", "initial_state")

CASES = [
    CheckCase("chunk_kda", "B1 T8192 H16 K=V=128", _inputs((1, 80, 1, 2, 32, 32), (1, 8192, 16, 16, 128, 128)),
              chunk_kda, _ref, out_classes=("LA-o", "LA-o"), grad_inputs=_GRADS, grad_class="LA-g"),
    CheckCase("chunk_kda", "varlen GVA H4 HV16 BT32",
              _inputs((1, 100, 1, 2, 32, 48), (1, 4096, 4, 16, 128, 128), lens=([30, 1, 69], [1024, 1, 2000, 1071]),
                      chunk_size=32),
              chunk_kda, _ref, out_classes=("LA-o", "LA-o"), grad_inputs=_GRADS, grad_class="LA-g"),
    CheckCase("chunk_kda", "Kimi-Linear B1 T4096 H32", _inputs((1, 40, 1, 1, 16, 16), (1, 4096, 32, 32, 128, 128)),
              chunk_kda, _ref, out_classes=("LA-o", "LA-o"), grad_inputs=_GRADS, grad_class="LA-g"),
]
