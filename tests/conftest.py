"""Test setup: on a machine without CUDA the Triton kernels run under the interpreter.

``TRITON_INTERPRET=1`` must be set before any kernel module is imported (``@triton.jit`` reads it at
decoration time), so it is set here, at the top, before ``mindspeed_ops`` is imported.
"""
import contextlib
import os
from typing import Optional

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":  # helpers inside a launch skip re-patching triton.language
    from mindspeed_ops import interpreter_speedup  # noqa: E402

    interpreter_speedup.install()

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
#: dtypes the kernels are tested in: bf16 arithmetic only for real on the GPU (DESIGN 7, trap 1);
#: MINDSPEED_OPS_TEST_BF16=1 adds bf16 on CPU too (through the interpreter shim: catches test-side issues)
DTYPES = [torch.float32, torch.float16, torch.bfloat16] \
    if ON_GPU or os.environ.get("MINDSPEED_OPS_TEST_BF16") == "1" else [torch.float32, torch.float16]


def pytest_collection_modifyitems(config, items):
    _deselect_passed(config, items)
    if ON_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu/large marker)")
    for item in items:
        if any(m in item.keywords for m in ("gpu", "large", "bigmem", "exclusive")):
            item.add_marker(skip)


def _deselect_passed(config, items):
    """``MINDSPEED_OPS_RESUME=log``: leave out the cases a previous ``pytest -v`` log shows PASSED (resumes a
    device run that its time limit cut short)."""
    path = os.environ.get("MINDSPEED_OPS_RESUME")
    if not path:
        return
    import re

    with open(path) as f:
        passed = set(re.findall(r"PASSED (\S+)", f.read()))
    keep = [it for it in items if it.nodeid not in passed]
    config.hook.pytest_deselected(items=[it for it in items if it.nodeid in passed])
    items[:] = keep


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def poisoned(monkeypatch):
    """Every ``torch.empty`` float buffer starts NaN-filled, so unwritten output elements are caught."""
    real = torch.empty

    def empty(*args, **kwargs):
        t = real(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)


def _ptxas_available() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401

        from mindspeed_ops import compile_check

        return compile_check._tool("ptxas") is not None
    except Exception:
        return False


#: marks of the compile-only tests that record launches dry under the interpreter (DESIGN 7)
COMPILE_ONLY_MARKS = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="records launches under the interpreter"),
    pytest.mark.skipif(not _ptxas_available(), reason="triton's NVIDIA backend (ptxas) is not installed"),
]


def assert_compiled(results, spill_allowed=lambda r: 0) -> None:
    """Results of ``compile_check.compile_launches``: every build succeeded, shared memory within the
    arch's limit, register spills at most ``spill_allowed(result)`` bytes (``None``: not bounded)."""
    from mindspeed_ops import compile_check as cc

    bad = [f"{r.launch.label()} sm_{r.arch}: {r.summary}" for r in results if not r.ok]
    assert not bad, "\n".join(bad)
    over = []
    for r in results:
        assert r.shared is not None and r.shared <= cc.SHARED_LIMIT[r.arch], f"{r.launch.label()} sm_{r.arch}"
        allowed = spill_allowed(r)
        if allowed is not None and r.spill_stores > allowed:
            over.append(f"{r.launch.label()} sm_{r.arch} spills {r.spill_stores} bytes (allowed {allowed})")
    assert not over, "\n".join(over)


@contextlib.contextmanager
def side_stream_inline(branches: Optional[list] = None):
    """The GDN/KDA backward's forked code path (``ops/side_stream.py``) on any device: ``fork`` returns a token,
    ``on_side`` runs its function at once on the caller's stream (appending it to ``branches`` when given), ``join``
    does nothing. For bitwise tests of that path and for recording its launches without a GPU."""
    from unittest import mock

    from mindspeed_ops.ops import side_stream

    def on_side(side, fn, *args, **kwargs):
        if branches is not None:
            branches.append(fn)
        return fn(*args, **kwargs)
    with mock.patch.object(side_stream, "fork", lambda device, programs=None: object()), \
            mock.patch.object(side_stream, "on_side", on_side), mock.patch.object(side_stream, "join", lambda side: None):
        yield


@pytest.fixture(autouse=True)
def _release_cuda_cache(request):
    """Several xdist workers share one GPU: hand cached blocks back after every test so one worker's
    real-size case does not leave the others out of memory."""
    if ON_GPU:
        torch.cuda.reset_peak_memory_stats()
    yield
    if ON_GPU:
        import gc

        _log_peak_memory(request.node.nodeid)
        gc.collect()
        torch.cuda.empty_cache()


def _log_peak_memory(nodeid: str):
    """Cases whose peak exceeds 4 GiB go to $MINDSPEED_OPS_MEMLOG (so the ones needing ``bigmem`` can be found)."""
    path = os.environ.get("MINDSPEED_OPS_MEMLOG")
    peak = torch.cuda.max_memory_allocated()
    if path and peak > 4 * 2**30:
        with open(path, "a") as f:
            f.write(f"{peak / 2**30:.1f} GiB {nodeid}\n")


def pytest_runtest_logreport(report):
    """``MINDSPEED_OPS_FAILLOG=path``: append each failure's traceback as it happens, so a device run
    cut short by its time limit still brings back why a test failed (pytest's summary comes at the end).
    ``MINDSPEED_OPS_DURLOG=path``: the cases slower than 5 s. Written by the xdist controller only (it
    gets every worker's reports as they come), so each case appears once."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    dur = os.environ.get("MINDSPEED_OPS_DURLOG")
    if dur and report.when == "call" and report.duration > 5.0:  # the slow cases, to plan device calls
        with open(dur, "a") as f:
            f.write(f"{report.duration:.1f} s {report.nodeid}\n")
    path = os.environ.get("MINDSPEED_OPS_FAILLOG")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"===== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n")
