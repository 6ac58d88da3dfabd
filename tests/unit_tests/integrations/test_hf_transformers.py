"""mindspeed_ops.integrations.transformers: tiny random configs of the supported model families of the
installed transformers, on CPU. With and without ``apply``: logits and every parameter gradient (a
random-weighted logits loss), and the training loss (``chunk_loss`` head) and its gradients, agree
within the SPEC 0.9 thresholds (LA-o for outputs/losses, LA-g for gradients: the gradients of the
decay parameters go through ``dg``); ``revert`` restores HF's code bitwise.

The family tests run our operators on the reference backend (fast); one Qwen3-Next case runs the
Triton kernels (under the interpreter on CPU), with HF's strided q/k/v views."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import mindspeed_ops  # noqa: E402
from mindspeed_ops.integrations import transformers as mt  # noqa: E402
from mindspeed_ops.testing import assert_close  # noqa: E402

AVAILABLE = mt.available_families()
VOCAB, B, T = 64, 2, 24


def _tiny(family: str):
    """A tiny random model of ``family`` (fp32, train mode, moderate GDN/KDA decays)."""
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
    if family == "qwen3_next":
        cfg = transformers.Qwen3NextConfig(**common, intermediate_size=64, num_key_value_heads=1, head_dim=16,
                                           linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                                           linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"],
                                           num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=32)
        cls = transformers.Qwen3NextForCausalLM
    elif family in ("qwen3_5", "qwen3_5_moe"):
        kw = dict(**common, num_key_value_heads=1, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
                  linear_key_head_dim=16, linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"])
        if family == "qwen3_5":
            cfg, cls = transformers.Qwen3_5TextConfig(**kw, intermediate_size=64), transformers.Qwen3_5ForCausalLM
        else:
            cfg = transformers.Qwen3_5MoeTextConfig(**kw, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                                    num_experts=4, num_experts_per_tok=2)
            cls = transformers.Qwen3_5MoeForCausalLM
    elif family == "kimi_linear":
        cfg = transformers.KimiLinearConfig(**common, intermediate_size=64, moe_intermediate_size=32,
                                            num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=None,
                                            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, num_local_experts=4,
                                            num_experts_per_tok=2, n_shared_experts=1, linear_head_dim=16,
                                            linear_num_heads=2, layer_types=["linear_attention", "full_attention"],
                                            mlp_layer_types=["dense", "sparse"], pad_token_id=0, bos_token_id=1,
                                            eos_token_id=2)
        cls = transformers.KimiLinearForCausalLM
    elif family == "gpt_oss":
        cfg = transformers.GptOssConfig(**common, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                        head_dim=16, num_key_value_heads=1, sliding_window=8,
                                        layer_types=["sliding_attention", "full_attention"])
        cls = transformers.GptOssForCausalLM
    elif family == "deepseek_v4":
        cfg = transformers.DeepseekV4Config(**common, moe_intermediate_size=32, head_dim=32, q_lora_rank=16,
                                            num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1, o_groups=2,
                                            o_lora_rank=8, index_n_heads=2, index_head_dim=16, index_topk=4,
                                            sliding_window=8, hc_mult=4, partial_rotary_factor=0.5,
                                            layer_types=["sliding_attention", "compressed_sparse_attention"],
                                            mlp_layer_types=["hash_moe", "moe"])
        cls = transformers.DeepseekV4ForCausalLM
    else:
        raise KeyError(family)
    torch.manual_seed(0)
    model = cls(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # decays exp(g) ~ 0.3..0.95 per token: dg carries real signal
                p.copy_(torch.empty_like(p).uniform_(0.03, 0.5).log())
            elif p.dim() == 1 and "norm" in name:  # non-trivial norm weights (HF initialises ones/zeros)
                p.add_(0.3 * torch.randn_like(p))
    return model.train()


def _run(model, ids, labels=None):
    """(logits or loss, {param: grad}) of one forward/backward."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    if labels is None:
        w = torch.randn(out.logits.shape, generator=torch.Generator().manual_seed(1))
        (out.logits * w).sum().backward()
        value = out.logits.detach()
    else:
        out.loss.backward()
        value = out.loss.detach()
    return value, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(ref, out, what):
    (a, ga), (b, gb) = ref, out
    assert_close(what, a, b, "LA-o")
    assert ga.keys() == gb.keys(), f"{what}: parameters with gradients differ: {sorted(ga.keys() ^ gb.keys())}"
    for name in ga:
        assert_close(f"{what} grad {name}", ga[name], gb[name], "LA-g")


def _families():
    return [pytest.param(f, marks=pytest.mark.skipif(not AVAILABLE.get(f), reason=f"transformers lacks {f}"))
            for f in mt.FAMILIES]


@pytest.mark.parametrize("family", _families())
def test_apply_matches_hf(family):
    model = _tiny(family)
    ids = torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(2))
    hf_logits, hf_loss = _run(model, ids), _run(model, ids, ids)
    report = mt.apply(model)
    assert report, report.skipped
    assert any("chunk_loss" in k for k in report.swapped)
    with mindspeed_ops.use_backend("reference"):
        ours_logits, ours_loss = _run(model, ids), _run(model, ids, ids)
    _assert_same(hf_logits, ours_logits, f"{family} logits")
    _assert_same(hf_loss, ours_loss, f"{family} loss")
    assert mt.revert(model) > 0
    again = _run(model, ids)
    assert torch.equal(again[0], hf_logits[0]), "revert did not restore HF's forward"


EXPECTED = {  # operators that must run in a patched forward + backward (with labels: the chunk_loss head)
    "qwen3_next": ["chunk_gated_delta_rule", "causal_conv1d_fn", "rms_norm_gated", "rms_norm", "chunk_loss"],
    "qwen3_5": ["chunk_gated_delta_rule", "causal_conv1d_fn", "rms_norm_gated", "rms_norm", "chunk_loss"],
    "qwen3_5_moe": ["chunk_gated_delta_rule", "causal_conv1d_fn", "rms_norm_gated", "rms_norm", "chunk_loss"],
    "kimi_linear": ["causal_conv1d_fn", "rms_norm_gated", "rms_norm", "chunk_loss"],
    "gpt_oss": ["clipped_swiglu", "rms_norm", "chunk_loss"],
    "deepseek_v4": ["rmsnorm_without_weight", "sinkhorn", "mhc_pre_bmm", "mhc_post", "inplace_rope", "rms_norm",
                    "chunk_loss"],
}


@pytest.mark.parametrize("family", _families())
def test_swapped_operators_run(family, monkeypatch):
    """The report names the swaps, and the patched model really calls those operators (HF's own
    fallbacks are not taken)."""
    model = _tiny(family)
    report = mt.apply(model)
    for what in EXPECTED[family]:
        assert any(what in k for k in report.swapped), f"{family}: {what} not swapped:\n{report}"
    expected = list(EXPECTED[family])
    if family == "kimi_linear" and callable(getattr(mindspeed_ops.api, "chunk_kda", None)):
        expected.append("chunk_kda")
    calls = {}
    for name in expected:
        fn = getattr(mindspeed_ops.api, name)

        def spy(*args, _fn=fn, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _fn(*args, **kwargs)
        monkeypatch.setattr(mindspeed_ops.api, name, spy)
    ids = torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(7))
    with mindspeed_ops.use_backend("reference"):
        model(input_ids=ids, labels=ids).loss.backward()
    assert set(calls) == set(expected), f"{family}: called {calls}"
    if family == "deepseek_v4":  # q, kv and the inverse on the output of both attention layers, plus compressors
        assert calls["inplace_rope"] >= 6, calls
    if family == "kimi_linear":
        has_kda = callable(getattr(mindspeed_ops.api, "chunk_kda", None))
        assert any("chunk_kda" in k for k in report.swapped) == has_kda
        assert any("chunk_kda" in s for s in report.skipped) != has_kda


def test_packed_conv_keeps_sequences_apart():
    """HF passes the packed-batch offsets as ``cu_seq_lens_q``: the conv adapter turns them into
    ``seq_idx`` (HF's PyTorch conv would mix sequences)."""
    conv = mt._hf_causal_conv1d_fn(lambda *a, **k: pytest.fail("fell back to HF"))
    x = torch.randn(1, 12, 30)
    w = torch.randn(12, 4)
    cu = torch.tensor([0, 7, 19, 27], dtype=torch.int32)
    with mindspeed_ops.use_backend("reference"):
        out = conv(x, w, None, activation="silu", cu_seq_lens_q=cu, max_length_q=12)
        parts = [conv(x[..., a:b], w, None, activation="silu") for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
    assert_close("packed", torch.cat(parts, -1), out[..., :27], "E-fwd")
    assert torch.equal(out[..., 27:], torch.zeros_like(out[..., 27:]))  # tail positions (seq_idx -1) are 0


@pytest.mark.skipif(not AVAILABLE.get("kimi_linear"), reason="transformers lacks kimi_linear")
def test_kimi_linear_chunk_kda(monkeypatch):
    """Kimi-Linear's KDA through ``api.chunk_kda`` (when this build lacks it, the ops/kda chunked reference
    stands in: this checks the adapter's argument mapping: raw per-channel gate, scale, state dtype)."""
    if not callable(getattr(mindspeed_ops.api, "chunk_kda", None)):
        ref = pytest.importorskip("mindspeed_ops.ops.kda.reference")

        def standin(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=64, **kwargs):
            return ref.chunk_kda_ref(q, k, v, g, beta, scale, initial_state, output_final_state,
                                     use_qk_l2norm_in_kernel, cu_seqlens, chunk_size)
        monkeypatch.setattr(mindspeed_ops.api, "chunk_kda", standin, raising=False)
    model = _tiny("kimi_linear")
    ids = torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(6))
    ref_run = _run(model, ids)
    report = mt.apply(model, loss=False)
    assert any("chunk_kda" in k for k in report.swapped), report
    with mindspeed_ops.use_backend("reference"):
        _assert_same(ref_run, _run(model, ids), "kimi_linear logits (chunk_kda)")


@pytest.mark.skipif(not AVAILABLE.get("qwen3_next"), reason="transformers lacks qwen3_next")
def test_triton_kernels_in_qwen3_next():
    """Default backend (Triton; the interpreter on CPU): HF passes strided q/k/v views and an fp32 gate."""
    model = _tiny("qwen3_next")
    ids = torch.randint(3, VOCAB, (1, 20), generator=torch.Generator().manual_seed(3))
    ref = _run(model, ids, ids)
    mt.apply(model)
    _assert_same(ref, _run(model, ids, ids), "qwen3_next loss (triton)")


@pytest.mark.skipif(not AVAILABLE.get("qwen3_next"), reason="transformers lacks qwen3_next")
def test_other_models_keep_hf_code_and_options():
    patched, plain = _tiny("qwen3_next"), _tiny("qwen3_next")
    ids = torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before = plain(input_ids=ids).logits
    report = mt.apply_qwen3_next(patched, gdn=False, loss=False)
    assert not any("chunk_gated_delta_rule" in k or "chunk_loss" in k for k in report.swapped)
    with torch.no_grad(), mindspeed_ops.use_backend("reference"):
        patched(input_ids=ids)  # the module-level dispatchers are now installed
        after = plain(input_ids=ids).logits
    assert torch.equal(before, after), "an unpatched model changed"
    from transformers.models.qwen3_next import modeling_qwen3_next as mq
    assert getattr(mq.causal_conv1d_fn, "_mindspeed_ops_dispatch", False)
    with pytest.raises(ValueError, match="unknown option"):
        mt.apply(patched, flash=True)
    with pytest.raises(ValueError, match="unknown family"):
        mt.apply(patched, families=["llama"])
    assert not mt.apply(torch.nn.Linear(2, 2))


@pytest.mark.skipif(not AVAILABLE.get("gpt_oss"), reason="transformers lacks gpt_oss")
def test_chunk_loss_head_hf_loss_options():
    """num_items_in_batch (sum / count), ignored labels, return_dict=False, eval mode (HF's own head)."""
    model = _tiny("gpt_oss")
    ids = torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(5))
    labels = ids.clone()
    labels[:, :5] = -100
    n = torch.tensor(17)
    ref = model(input_ids=ids, labels=labels, num_items_in_batch=n).loss
    mt.apply(model)
    with mindspeed_ops.use_backend("reference"):
        out = model(input_ids=ids, labels=labels, num_items_in_batch=n)
        assert out.logits is None
        assert_close("loss / num_items", ref.detach(), out.loss.detach(), "LA-o")
        tup = model(input_ids=ids, labels=labels, return_dict=False)
        assert isinstance(tup, tuple) and tup[0].dim() == 0
        model.eval()
        assert model(input_ids=ids, labels=labels).logits is not None  # eval keeps HF's logits + loss


@pytest.mark.parametrize("family", _families())
def test_patched_forward_keeps_hf_signature(family):
    """``generate`` reads ``inspect.signature(model.forward)`` to decide whether to pass ``position_ids``,
    ``attention_mask`` and ``logits_to_keep``: the chunk_loss head's forward keeps the class's signature
    (it was ``(*args, **kwargs)``: no position_ids from the mask, full-vocabulary prefill logits)."""
    import inspect
    model = _tiny(family)
    before = inspect.signature(model.forward)
    assert any("chunk_loss" in k for k in mt.apply(model).swapped)
    assert "forward" in model.__dict__
    assert inspect.signature(model.forward) == before
    assert model._supports_logits_to_keep()


@pytest.mark.skipif(not AVAILABLE.get("deepseek_v4"), reason="transformers lacks deepseek_v4")
def test_generate_left_padded_deepseek_v4():
    """DeepSeek-V4's output depends on absolute positions: a left-padded row generated under ``apply``
    matches HF's only when generate still passes the mask-derived ``position_ids``."""
    import copy
    model = _tiny("deepseek_v4").eval()
    plain = copy.deepcopy(model)
    mt.apply(model)
    ids = torch.randint(3, VOCAB, (2, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=2, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad(), mindspeed_ops.use_backend("reference"):
        ours = model.generate(ids, **kw).scores
        ref = plain.generate(ids, **kw).scores
    for step, (a, b) in enumerate(zip(ref, ours)):
        assert_close(f"generate step {step} scores", a, b, "LA-o")


@pytest.mark.parametrize("family", [f for f in ("qwen3_next", "kimi_linear")])
def test_packed_batch_matches_separate_sequences(family):
    """A packed batch (``B == 1`` with HF's ``cu_seq_lens_q``, as DataCollatorWithFlattening passes it) gives
    each sequence the logits it gets alone: conv and GDN/KDA both keep the sequences apart. Kimi-Linear's
    layer passes the offsets to its KDA function only as ``cu_seq_lens_q`` (the KDA adapter ignored them
    while the conv adapter used them: rel_rms 0.12 vs the separate runs)."""
    if not AVAILABLE.get(family):
        pytest.skip(f"transformers lacks {family}")
    model = _tiny(family)
    model.config.layer_types = ["linear_attention"] * 2  # attention (sdpa) layers would mix packed sequences
    torch.manual_seed(0)
    model = type(model)(model.config).eval()
    mt.apply(model)
    lens = [7, 12, 5]
    seqs = [torch.randint(3, VOCAB, (1, n), generator=torch.Generator().manual_seed(i)) for i, n in enumerate(lens)]
    cu = torch.tensor([0, 7, 19, 24], dtype=torch.int32)
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    with torch.no_grad(), mindspeed_ops.use_backend("reference"):
        alone = torch.cat([model(input_ids=s, use_cache=False).logits for s in seqs], 1)
        packed = model(input_ids=torch.cat(seqs, 1), position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                       max_length_q=12, max_length_k=12, use_cache=False).logits
    assert_close(f"{family} packed vs alone", alone, packed, "LA-o")
