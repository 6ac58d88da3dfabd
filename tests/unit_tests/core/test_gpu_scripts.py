"""scripts/gpu_lanes.sh, scripts/gpu_run.sh and scripts/gpu_ab.sh (bash only): exit codes, what gets packed, bad modes.
Run from a copy of the scripts without a .whl directory, with trivial lane commands."""
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils timeout")


def _repo(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    return repo


def _lanes(repo, tmp_path, *args):
    env = {**os.environ, "OUT": str(tmp_path / "lanes" / "lanes_out"), "LANE_ROOT": str(tmp_path / "lanes"),
           "BUNDLES": ""}
    return subprocess.run(["bash", "scripts/gpu_lanes.sh", *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=60)


def _members(tmp_path):
    with tarfile.open(tmp_path / "lanes" / "lanes_out" / "lanes.tar.gz") as t:
        return sorted(m.name for m in t.getmembers())


def test_gpu_lanes_exit_code_and_packed_lanes(tmp_path):
    """A failing or timed-out lane used to leave the script's exit code 0, and the archive packed every
    `lane*` entry of /tmp: lanes of an earlier run and OUT itself when OUT=/tmp/lanes_out."""
    repo = _repo(tmp_path)
    r = _lanes(repo, tmp_path, "20", 'echo hi; echo "$CUDA_VISIBLE_DEVICES $SITE_READY"', "echo bad; exit 3")
    assert r.returncode != 0, r.stdout + r.stderr
    assert "lane 0 rc 0" in r.stdout and "lane 1 rc 3" in r.stdout and "0 1" in r.stdout
    assert _members(tmp_path) == ["lane0", "lane0/lane.log", "lane1", "lane1/lane.log"]

    r = _lanes(repo, tmp_path, "20", "echo second")  # one lane now: nothing of the first run is packed
    assert r.returncode == 0, r.stdout + r.stderr
    assert _members(tmp_path) == ["lane0", "lane0/lane.log"]
    assert "second" in (tmp_path / "lanes" / "lane0" / "lane.log").read_text()

    r = _lanes(repo, tmp_path, "1", "sleep 5")
    assert r.returncode != 0 and "lane 0 rc 124" in r.stdout


def test_gpu_lanes_needs_lane_commands(tmp_path):
    repo = _repo(tmp_path)
    for args in ((), ("20",)):  # no limit / a limit but no lane: a usage error, not a silent success
        r = _lanes(repo, tmp_path, *args)
        assert r.returncode == 2 and "usage" in r.stderr, r.stdout + r.stderr


def test_gpu_run_rejects_unknown_mode(tmp_path):
    """A mistyped mode (or a test path given as the mode) used to run nothing and exit 0."""
    repo = _repo(tmp_path)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE_READY": "1", "BUNDLES": ""}
    for mode in ("test", "tests/unit_tests/gdn"):
        r = subprocess.run(["bash", "scripts/gpu_run.sh", mode], cwd=repo, env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and "unknown mode" in r.stderr, r.stdout + r.stderr


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True, timeout=60)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_gpu_ab_runs_every_ref_from_its_own_tree(tmp_path):
    """scripts/gpu_ab.sh: `pack` two refs, `run` two commands; each output names its ref and imports that ref's
    package (not the working tree's), a failing or timed-out run makes the exit code non-zero."""
    repo = _repo(tmp_path)
    pkg = repo / "mindspeed_ops"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("WHICH = 'main'\n")
    # run as a script in a subfolder (as benchmarks/*.py are): sys.path[0] is that folder, so PYTHONPATH decides
    (repo / "tools").mkdir()
    (repo / "tools" / "show.py").write_text("import mindspeed_ops\nprint('WHICH', mindspeed_ops.WHICH)\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "main")
    _git(repo, "checkout", "-q", "-b", "feat/x")
    (pkg / "__init__.py").write_text("WHICH = 'branch'\n")
    _git(repo, "commit", "-q", "-am", "branch")
    (pkg / "__init__.py").write_text("WHICH = 'dirty working tree'\n")  # never what a ref's run imports
    env = {**os.environ, "OUT": str(tmp_path / "out"), "AB_ROOT": str(tmp_path / "ab"), "BUNDLES": "",
           "SITE_READY": "", "PYTHONPATH": ""}
    r = subprocess.run(["bash", "scripts/gpu_ab.sh", "pack", "main", "feat/x"], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [ln.split()[0] for ln in (repo / ".ab" / "refs").read_text().splitlines()] == ["main", "feat_x"]
    show = "python3 tools/show.py"
    r = subprocess.run(["bash", "scripts/gpu_ab.sh", "run", "20", show + ' && touch "$AB_OUT/$AB_REF.made"', "exit 3"],
                       cwd=repo, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "command 1 ref main rc 0" in r.stdout and "command 2 ref feat_x rc 3" in r.stdout
    out = tmp_path / "out" / "ab"
    assert "WHICH main" in (out / "1_main.txt").read_text()
    text = (out / "1_feat_x.txt").read_text()
    assert "WHICH branch" in text and "# ref feat_x commit" in text and str(tmp_path / "ab" / "feat_x") in text
    assert (out / "main.made").exists() and (out / "feat_x.made").exists()  # $AB_OUT/$AB_REF
    # a second run in the same $OUT goes on numbering (it wrote over 1_<ref>.txt before)
    r = subprocess.run(["bash", "scripts/gpu_ab.sh", "run", "1", "sleep 5"], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "command 3 ref main rc 124" in r.stdout
    assert "WHICH main" in (out / "1_main.txt").read_text() and (out / "3_main.txt").exists()


def test_gpu_ab_usage_errors(tmp_path):
    repo = _repo(tmp_path)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "BUNDLES": ""}
    for args in ((), ("pack",), ("run", "20"), ("bench",)):
        r = subprocess.run(["bash", "scripts/gpu_ab.sh", *args], cwd=repo, env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and "usage" in r.stderr, (args, r.stdout + r.stderr)
    r = subprocess.run(["bash", "scripts/gpu_ab.sh", "run", "20", "true"], cwd=repo, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "pack" in r.stderr
