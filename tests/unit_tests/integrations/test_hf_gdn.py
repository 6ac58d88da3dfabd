"""chunk_gated_delta_rule (SPEC 1.10.10) against transformers' own Qwen3-Next PyTorch implementation
``torch_chunk_gated_delta_rule`` (its ``__wrapped__``: the decorated name may point at fla when that
is installed), on small CPU shapes: output, final state and the gradients of q, k, v, g, beta and the
initial state, within LA-o / LA-d / LA-g keyed by the input dtype.

HF computes in fp32 whatever the inputs (and returns ``q.dtype``), so for fp16 inputs both sides see
the same rounded inputs and our fp16-staged chunk states account for the difference."""
import inspect

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from mindspeed_ops import api  # noqa: E402
from mindspeed_ops.testing import assert_close, randn, threshold  # noqa: E402
from tests.conftest import DEVICE, DTYPES  # noqa: E402

mq = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next",
                         reason="transformers lacks the Qwen3-Next model code")
# the PyTorch function under every wrapper (HF's kernel-hub wrapper, our integration's dispatcher)
hf_chunk = inspect.unwrap(mq.torch_chunk_gated_delta_rule)

# (B, T, H, HV, K, V): partial last chunk, several chunks, GVA, K != V
SHAPES = [(2, 50, 2, 2, 32, 32), (1, 130, 2, 4, 16, 24), (2, 64, 1, 2, 32, 16)]


def _inputs(shape, dtype, seed, h0: bool):
    B, T, H, HV, K, V = shape
    q = randn((B, T, H, K), dtype, DEVICE, seed=seed)
    k = randn((B, T, H, K), dtype, DEVICE, seed=seed + 1)
    v = randn((B, T, HV, V), dtype, DEVICE, seed=seed + 2)
    g = F.logsigmoid(randn((B, T, HV), torch.float32, DEVICE, seed=seed + 3)) * 0.5  # fp32 like HF's gate
    beta = torch.sigmoid(randn((B, T, HV), dtype, DEVICE, seed=seed + 4))
    s0 = randn((B, HV, K, V), torch.float32, DEVICE, seed=seed + 5) if h0 else None
    return [q, k, v, g, beta, s0]


def _run(fn, inputs, do, dht, l2):
    xs = [None if x is None else x.detach().clone().requires_grad_(True) for x in inputs]
    q, k, v, g, beta, s0 = xs
    o, final = fn(q, k, v, g=g, beta=beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=l2)
    ((o.float() * do).sum() + (final * dht).sum()).backward()
    return o.detach(), final.detach(), [None if x is None else x.grad for x in xs]


# every shape once, every dtype once per shape cycle (the interpreter costs ~2 s a case)
CASES = [(shape, DTYPES[i % len(DTYPES)], True, True) for i, shape in enumerate(SHAPES)] + [
    (SHAPES[0], DTYPES[-1], True, True),
    (SHAPES[0], torch.float32, True, False),  # no initial state
    (SHAPES[2], torch.float32, False, True),  # keys normalised by the caller
]


@pytest.mark.parametrize("shape,dtype,l2,h0", CASES)
def test_matches_hf_torch_chunk_gated_delta_rule(shape, dtype, l2, h0):
    inputs = _inputs(shape, dtype, seed=11, h0=h0)
    if not l2:  # unnormalised keys need a small norm for a stable delta rule
        inputs[1] = F.normalize(inputs[1].float(), dim=-1).to(dtype)
    B, T, H, HV, K, V = shape
    do = randn((B, T, HV, V), torch.float32, DEVICE, seed=21)
    dht = randn((B, HV, K, V), torch.float32, DEVICE, seed=22)
    o_hf, s_hf, g_hf = _run(hf_chunk, inputs, do, dht, l2)
    o, s, grads = _run(api.chunk_gated_delta_rule, inputs, do, dht, l2)
    assert o.dtype == o_hf.dtype == dtype and s.dtype == s_hf.dtype == torch.float32
    assert_close("o", o_hf, o, "LA-o")
    assert_close("final_state", s_hf, s, threshold("LA-o", dtype))
    for name, a, b, cls in zip(["dq", "dk", "dv", "dg", "dbeta", "dh0"], g_hf, grads,
                               ["LA-d", "LA-d", "LA-d", "LA-g", "LA-g", "LA-d"]):
        if a is None:
            assert b is None, name
            continue
        assert b is not None and b.dtype == a.dtype, name
        assert_close(name, a, b, threshold(cls, dtype))  # keyed by the q/k/v dtype (SPEC 0.9)


def test_hf_call_through_the_adapter():
    """The integration's adapter takes HF's exact keywords (no scale/chunk_size, cu_seqlens=None, extras)."""
    from mindspeed_ops.integrations.transformers import _hf_chunk_gated_delta_rule

    inputs = _inputs((1, 40, 2, 4, 16, 16), torch.float32, seed=31, h0=True)
    q, k, v, g, beta, s0 = inputs
    kw = dict(g=g, beta=beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_hf, s_hf = hf_chunk(q, k, v, **kw)
    o, s = _hf_chunk_gated_delta_rule(q, k, v, cu_seqlens=None, position_ids=None, **kw)
    assert_close("o", o_hf, o, "LA-o")
    assert_close("final_state", s_hf, s, "LA-o")
