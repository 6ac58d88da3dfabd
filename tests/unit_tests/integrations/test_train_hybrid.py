"""examples/train_hybrid.py / ``mindspeed-ops train`` (mindspeed_ops.train) at the ``tiny`` preset:
outputs, checkpoint + resume reproduce an uninterrupted run, ``--compare`` plumbing, the KDA switch,
and one training step of the model on the Triton kernels (the interpreter on CPU) against the
reference backend."""
import json
import warnings

import pytest
import torch

import mindspeed_ops
from mindspeed_ops import api, cli
from mindspeed_ops.testing import assert_close
from mindspeed_ops.train import MODEL_FLAGS, PRESETS, main
from mindspeed_ops.train.data import ByteCorpus
from mindspeed_ops.train.loop import lr_at, RunSettings
from mindspeed_ops.train.model import HybridConfig, HybridLM, build_model, kda_available
from tests.conftest import DEVICE

TINY = {k: v for k, v in PRESETS["tiny"].items() if k in MODEL_FLAGS}


def _train(out, *extra):
    args = ["--preset", "tiny", "--backend", "reference", "--device", "cpu", "--data-mb", "0.5", "--out", str(out),
            *extra]
    assert main(args) == 0
    return json.loads((out / "metrics.json").read_text())


def test_outputs_and_resume(tmp_path, monkeypatch):
    full = _train(tmp_path / "full", "--steps", "4")
    for name in ("checkpoint.pt", "loss.png", "metrics.json"):
        assert (tmp_path / "full" / name).is_file(), name
    losses = full["runs"][0]["losses"]
    assert len(losses) == 4 and all(0 < x < 10 for x in losses)
    assert full["runs"][0]["val_loss"] is not None
    # interrupt a run after the step-2 checkpoint, then resume it with the same flags
    real_batch = ByteCorpus.batch

    def interrupted(self, split, *args):
        if split == "train" and args[3] == 3:
            raise KeyboardInterrupt
        return real_batch(self, split, *args)

    monkeypatch.setattr(ByteCorpus, "batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path / "split", "--steps", "4", "--ckpt-every", "2", "--no-plot")
    monkeypatch.setattr(ByteCorpus, "batch", real_batch)
    resumed = _train(tmp_path / "split", "--steps", "4", "--ckpt-every", "2", "--resume", "--no-plot")
    assert resumed["runs"][0]["resumed_from"] == 2
    assert resumed["runs"][0]["losses"] == losses  # same batches, same optimizer state: bitwise on CPU


def test_resume_refuses_another_model(tmp_path):
    _train(tmp_path, "--steps", "1", "--no-plot")
    with pytest.raises(SystemExit, match="different model"):
        _train(tmp_path, "--steps", "2", "--resume", "--d-model", "48", "--no-plot")


def test_compare_reports_the_difference(tmp_path):
    m = _train(tmp_path, "--steps", "2", "--compare", "--no-plot")
    assert [r["backend"] for r in m["runs"]] == ["reference", "reference"]
    assert m["compare"]["max_abs_loss_diff"] == 0.0  # same backend, same seed: identical runs
    assert m["compare"]["memory_ratio"] is None  # peak memory is measured on CUDA only


def test_cli_subcommand_and_lr_schedule():
    args = cli.build_parser().parse_args(["train", "--preset", "tiny", "--steps", "3"])
    assert args.command == "train" and args.steps == 3
    s = RunSettings(device="cpu", backend="auto", dtype="fp32", steps=100, batch_size=1, seq_len=8, lr=1.0,
                    warmup=10, seed=0, eval_batches=0, log_every=0)
    assert lr_at(5, s) == pytest.approx(0.5) and lr_at(10, s) == pytest.approx(1.0)
    assert lr_at(100, s) == pytest.approx(0.1)


def test_kda_switch():
    cfg = HybridConfig(**{**TINY, "kda": "on"})
    if kda_available():
        assert "kda" in HybridLM(cfg).kinds
    else:
        with pytest.raises(RuntimeError, match="chunk_kda"):
            HybridLM(cfg)
        with pytest.warns(UserWarning, match="run as Gated DeltaNet"):
            model = build_model(HybridConfig(**TINY))
        assert model.kinds == ["gdn", "gdn", "attn"]
    assert HybridLM(HybridConfig(**{**TINY, "kda": "off"})).kinds == ["gdn", "gdn", "attn"]
    with pytest.raises(ValueError, match="layers"):
        HybridConfig(layers="gdn,mamba").layer_kinds()


@pytest.fixture
def chunk_kda(monkeypatch):
    """``api.chunk_kda``: the real one when this build has it, else the float64-capable chunked reference
    of ops/kda (same signature, differentiable by autograd) standing in, so the KDA layer is exercised."""
    if not kda_available():
        ref = pytest.importorskip("mindspeed_ops.ops.kda.reference")

        def standin(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=64, **kwargs):
            return ref.chunk_kda_ref(q, k, v, g, beta, scale, initial_state, output_final_state,
                                     use_qk_l2norm_in_kernel, cu_seqlens, chunk_size)
        monkeypatch.setattr(api, "chunk_kda", standin, raising=False)
    return api.chunk_kda


def test_kda_layer_trains(chunk_kda):
    torch.manual_seed(0)
    model = HybridLM(HybridConfig(**{**TINY, "kda": "on"}))
    assert model.kinds == ["gdn", "kda", "attn"]
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with mindspeed_ops.use_backend("reference"):
        loss, aux = model(x, torch.roll(x, -1, dims=1))
        (loss + aux).backward()
    assert torch.isfinite(loss)
    kda = model.blocks[1].mixer.sublayer
    for name in ("A_log", "dt_bias", "norm_weight", "conv_weight"):
        grad = getattr(kda, name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
    for lin in (kda.in_proj, kda.f_a, kda.f_b, kda.g_a, kda.g_b, kda.out_proj):
        assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


def test_one_step_on_the_kernels_matches_the_reference():
    """Every operator of the model on the Triton backend (interpreter on CPU) vs the reference backend:
    loss and all parameter gradients of one step."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model(HybridConfig(**{**TINY, "layers": "gdn,attn"})).to(DEVICE)
    x = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    y = torch.roll(x, -1, dims=1)
    results = []
    for backend in ("reference", "triton"):
        model.zero_grad(set_to_none=True)
        with mindspeed_ops.use_backend(backend):
            loss, aux = model(x, y)
            (loss + aux).backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (l_ref, g_ref), (l_tri, g_tri) = results
    assert_close("loss", l_ref, l_tri, "LA-o")
    assert g_ref.keys() == g_tri.keys()
    for name in g_ref:
        assert_close(f"grad {name}", g_ref[name], g_tri[name], "LA-g")
    assert callable(api.chunk_loss)


def test_resume_from_an_unreadable_checkpoint_is_a_clear_error(tmp_path):
    tmp_path.joinpath("checkpoint.pt").write_text("garbage")  # e.g. truncated by a full disk
    with pytest.raises(SystemExit, match="cannot read .*checkpoint.pt"):
        _train(tmp_path, "--steps", "1", "--resume", "--no-plot")
    torch.save({"model": {}}, tmp_path / "checkpoint.pt")  # some other program's file
    with pytest.raises(SystemExit, match="not a checkpoint of mindspeed-ops train"):
        _train(tmp_path, "--steps", "1", "--resume", "--no-plot")


def test_resume_mismatch_names_the_difference(tmp_path):
    _train(tmp_path, "--steps", "1", "--no-plot", "--eval-batches", "0")
    with pytest.raises(SystemExit, match=r"d_model=32 \(this run: 48\)") as e:
        _train(tmp_path, "--steps", "2", "--resume", "--d-model", "48", "--no-plot")
    assert "lin_heads" not in str(e.value)  # only what differs, not the whole config


def test_small_data_is_a_clear_error(tmp_path, monkeypatch):
    c = ByteCorpus.from_stdlib(max_bytes=1)  # used to raise "no Python source found": no validation file
    assert c.train.numel() > 0 and c.val.numel() > 0
    tiny = ByteCorpus(torch.zeros(20, dtype=torch.uint8), torch.zeros(20, dtype=torch.uint8), "x", 2)
    monkeypatch.setattr(ByteCorpus, "from_stdlib", classmethod(lambda cls, **kw: tiny))
    with pytest.raises(SystemExit, match="the train split has 20 bytes.*--data-mb"):
        _train(tmp_path, "--steps", "1", "--no-plot")
