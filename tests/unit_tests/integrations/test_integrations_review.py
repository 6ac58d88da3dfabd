"""Review checks of ``mindspeed_ops.integrations.transformers`` as a new user calls it: wrong arguments
give clear errors, a model with nothing to patch says so (a warning and a falsy report), ``apply``
twice is harmless, ``revert`` restores HF's code bitwise, and generation (HF's decode path) of a
patched Qwen3-Next equals the unpatched model's."""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import mindspeed_ops  # noqa: E402
from mindspeed_ops.integrations import transformers as mt  # noqa: E402

AVAILABLE = mt.available_families()


def _qwen3_next():
    cfg = transformers.Qwen3NextConfig(
        vocab_size=48, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, intermediate_size=48, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"],
        num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16)
    torch.manual_seed(1)
    return transformers.Qwen3NextForCausalLM(cfg).eval()


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=48, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32)
    return transformers.LlamaForCausalLM(cfg)


def test_bad_arguments_are_clear():
    with pytest.raises(TypeError, match="nn.Module"):
        mt.apply("Qwen/Qwen3-Next-80B-A3B")
    with pytest.raises(TypeError, match="nn.Module"):
        mt.revert(None)
    model = _llama()
    with pytest.raises(ValueError, match="unknown option"):
        mt.apply(model, rmsnorm=False)
    with pytest.raises(ValueError, match=r"unknown family \['llama'\]"):
        mt.apply(model, families="llama")  # a single name, not its characters


def test_unsupported_model_warns_and_is_untouched():
    model = _llama()
    with pytest.warns(UserWarning, match="nothing swapped in LlamaForCausalLM"):
        report = mt.apply(model)
    assert not report and "no module of the families" in str(report)
    assert mt.revert(model) == 0
    assert not any("forward" in m.__dict__ for m in model.modules())


@pytest.mark.skipif(not AVAILABLE.get("qwen3_next"), reason="transformers lacks qwen3_next")
def test_apply_twice_revert_and_generate():
    model = _qwen3_next()
    plain = copy.deepcopy(model)
    ids = torch.randint(0, 48, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = plain(input_ids=ids).logits
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a supported model: no "nothing swapped" warning
        first = mt.apply(model, families="qwen3_next")
        second = mt.apply(model)
    assert first and second.swapped == first.swapped
    with mindspeed_ops.use_backend("reference"), torch.no_grad():
        out = model(input_ids=ids).logits
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        gen = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(gen, plain.generate(ids, max_new_tokens=4, do_sample=False))
    assert mt.revert(model) > 0 and mt.revert(model) == 0
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
