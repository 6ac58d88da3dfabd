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


def test_fingerprint_follows_the_sources(monkeypatch):
    fp = compile_cache.fingerprint()
    assert fp == compile_cache.fingerprint() and len(fp) == 16
    real = compile_cache.os.stat

    def touched(path, *a, **k):  # one source file edited: another size and mtime
        st = real(path, *a, **k)
        if path.endswith("chunk_loss.py"):
            return type("S", (), {"st_size": st.st_size + 1, "st_mtime_ns": st.st_mtime_ns + 1})()
        return st
    monkeypatch.setattr(compile_cache.os, "stat", touched)
    assert compile_cache.fingerprint() != fp


def test_import_sets_the_tag():
    import mindspeed_ops  # noqa: F401

    cfg = torch.compiler.config
    if hasattr(cfg, "cache_key_tag"):
        assert "mindspeed_ops-" in cfg.cache_key_tag
