"""Review regressions of the command line: bad ``train`` flags are usage errors (exit code 2, the flag
named, no traceback), ``--resume`` never rewrites a checkpoint to an earlier step, ``atk`` with nothing
to run or a negative time budget exits 2, and usage errors print the sub-command's usage."""
import json

import pytest
import torch

from mindspeed_ops import cli

TRAIN = ["train", "--preset", "tiny", "--device", "cpu", "--backend", "reference", "--data-mb", "0.5", "--no-plot"]


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2, argv
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("flags, words", [
    (["--layers", "gdn,mamba"], "layers"),
    (["--top-k", "9"], "top_k"),
    (["--rope-dim", "7"], "rope_dim"),
    (["--lr", "-1"], "--lr"),
    (["--threads", "0"], "--threads"),
    (["--warmup", "-1"], "--warmup"),
    (["--sinkhorn-iters", "0"], "--sinkhorn-iters"),
    (["--data-mb", "0"], "--data-mb"),
    (["--steps", "0"], "--steps"),
    (["--seq-len", "5000"], "--seq-len"),
    (["--experts", "0"], "--experts"),
    (["--eval-batches", "-1"], "--eval-batches"),
])
def test_train_bad_flags_are_usage_errors(flags, words, tmp_path, capsys):
    err = _usage_error([*TRAIN, "--out", str(tmp_path / "run"), *flags], capsys)
    assert "mindspeed-ops train: error" in err and words in err
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_train_unwritable_out_is_a_usage_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    err = _usage_error([*TRAIN, "--out", str(blocker / "sub")], capsys)
    assert "--out" in err


def test_train_checkpoint_path_that_is_a_directory_is_a_usage_error(tmp_path, capsys):
    """Found by a fresh-user review: out/checkpoint.pt being a directory crashed only at the final save."""
    (tmp_path / "run" / "checkpoint.pt").mkdir(parents=True)
    err = _usage_error([*TRAIN, "--out", str(tmp_path / "run")], capsys)
    assert "--out" in err and "checkpoint.pt is a directory" in " ".join(err.split())


def test_resume_past_steps_keeps_the_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main([*TRAIN, "--steps", "3", "--eval-batches", "0", "--out", str(out)]) == 0
    ck = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ck["step"] == 3 and len(ck["losses"]) == 3
    capsys.readouterr()
    # same --steps: nothing to train, says so, checkpoint unchanged in step and history
    assert cli.main([*TRAIN, "--steps", "3", "--eval-batches", "0", "--out", str(out), "--resume"]) == 0
    assert "nothing to train" in " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    ck = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ck["step"] == 3 and len(ck["losses"]) == 3
    # fewer --steps than the checkpoint: refused, checkpoint untouched (it used to be rewritten as step 2
    # with 3 losses, and a later --resume then appended a duplicate step 3)
    with pytest.raises(SystemExit, match="already at step 3"):
        cli.main([*TRAIN, "--steps", "2", "--eval-batches", "0", "--out", str(out), "--resume"])
    ck = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ck["step"] == 3 and len(ck["losses"]) == 3
    assert cli.main([*TRAIN, "--steps", "4", "--eval-batches", "0", "--out", str(out), "--resume"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["runs"][0]["resumed_from"] == 3 and len(m["runs"][0]["losses"]) == 4


def test_atk_nothing_to_run_and_bad_budget(tmp_path, capsys):
    assert cli.main(["atk", "--ops", "rms_norm", "--suite", "accuracy", "--cases", "no-such-case"]) == 2
    assert "nothing to run" in capsys.readouterr().out
    err = _usage_error(["atk", "--ops", "rms_norm", "--time-budget", "-1"], capsys)
    assert "--time-budget" in err and "usage: mindspeed-ops atk" in err


def test_usage_errors_show_the_subcommand(capsys):
    err = _usage_error(["check", "--ops", "no_such_op"], capsys)
    assert "usage: mindspeed-ops check" in err and "no_such_op" in err
    err = _usage_error(["atk", "--ops", "no_such_op", "--list"], capsys)
    assert "usage: mindspeed-ops atk" in err and "no_such_op" in err


@pytest.mark.parametrize("argv", [["--ops", "bogus"], ["--dtypes", "bf16"], ["--arch", "75"], ["--shapes", "huge"]])
def test_compile_check_bad_arguments_are_usage_errors(argv, capsys):
    """compile-check's bad arguments exit 2 with the sub-command's usage, before recording anything."""
    from mindspeed_ops import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["compile-check", *argv])
    assert e.value.code == 2
    assert "mindspeed-ops compile-check" in capsys.readouterr().err


def test_train_unavailable_backend_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MINDSPEED_OPS_BACKEND", "bogus")  # used to be a BackendUnavailableError traceback
    argv = [a for a in TRAIN if a not in ("--backend", "reference")]  # --backend would override it
    err = _usage_error([*argv, "--out", str(tmp_path / "run")], capsys)
    assert "MINDSPEED_OPS_BACKEND=bogus" in err
