"""compile_cache: the package's source fingerprint in torch.compile's cache key (a cached backward traced
from other sources of this package must not be reused)."""
import pytest
import torch

from mindspeed_ops import compile_cache


def test_tag_keeps_the_users_tag_and_refreshes_ours():
    cfg = pytest.importorskip("torch.compiler.config")
    if not hasattr(cfg, "cache_key_tag"):
        pytest.skip("this PyTorch has no torch.compiler.config.cache_key_tag")
    # not monkeypatch: its undo deletes the setting from a torch config module (compile then fails)
    saved = cfg.cache_key_tag
    try:
        cfg.cache_key_tag = "user-tag|mindspeed_ops-0123456789abcdef"
        compile_cache.tag()
        compile_cache.tag()
        assert cfg.cache_key_tag == f"user-tag|mindspeed_ops-{compile_cache.fingerprint()}"
    finally:
        cfg.cache_key_tag = saved
    assert hasattr(cfg, "cache_key_tag")


def test_fingerprint_follows_the_sources(monkeypatch, tmp_path):
    """Bytes, not file times: a byte-identical copy of the package (another install) has the same
    fingerprint, one edited byte another."""
    import shutil

    fp = compile_cache.fingerprint()
    assert fp == compile_cache.fingerprint() and len(fp) == 16
    src = compile_cache.os.path.dirname(compile_cache.__file__)
    copy = tmp_path / "mindspeed_ops"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    monkeypatch.setattr(compile_cache, "__file__", str(copy / "compile_cache.py"))
    assert compile_cache.fingerprint() == fp
    with open(copy / "ops" / "loss" / "chunk_loss.py", "a") as f:
        f.write("\n")
    assert compile_cache.fingerprint() != fp


def test_import_sets_the_tag():
    import mindspeed_ops  # noqa: F401

    cfg = torch.compiler.config
    if hasattr(cfg, "cache_key_tag"):
        assert "mindspeed_ops-" in cfg.cache_key_tag
