"""Compile-only check (DESIGN 7): every Triton kernel of the library, every autotune config, built for
sm_80 and sm_90 on this CPU machine (:mod:`mindspeed_ops.compile_check`).

``test_library_kernel_compiles`` has one case per recorded kernel specialization and arch, so
pytest-xdist spreads them (each xdist worker keeps one compiler process). The recording (all check
cases, fp32 + fp16 executed at small shapes, recorded "dry" at real shapes, bf16 derived from fp16)
is cached on disk keyed by a hash of the package sources, so xdist workers and reruns share it; the
Triton cache (``TRITON_CACHE_DIR``) makes recompiling unchanged kernels cheap.

``MINDSPEED_OPS_COMPILE_SHAPES=small`` restricts the recording to the small shapes (faster, but the
tile sizes chosen for GPU-size inputs are then not compiled).

The tests of the tool itself use kernels defined below, at module level (the compiler process
re-imports this file with ``TRITON_INTERPRET=0``): each runs correctly under the interpreter and must
be reported as a failure by the compiler (``tl.dot`` with K=8, an autotune config the interpreter never
runs, a pipelined matmul over the sm_80 shared-memory limit).
"""
import functools
import os

import pytest
import torch
import triton
import triton.language as tl

from mindspeed_ops import backends
from mindspeed_ops import compile_check as cc
from mindspeed_ops import triton_utils as tu

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"
SHAPES = tuple(s.strip() for s in os.environ.get("MINDSPEED_OPS_COMPILE_SHAPES", "small,real").split(",") if s.strip())


def _nvidia_toolchain() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401

        return cc._tool("ptxas") is not None
    except Exception:
        return False


def _interpreter_numpy_ok() -> bool:
    """Recording runs the kernels under the interpreter, which mis-runs loops on numpy >= 2.4
    (triton_utils.check_interpreter_env); GPU images may ship a newer numpy."""
    import numpy as np

    return tuple(int(p) for p in np.__version__.split(".")[:2]) < (2, 4)


pytestmark = [pytest.mark.skipif(not _nvidia_toolchain(), reason="triton's NVIDIA backend (ptxas) is not installed"),
              pytest.mark.skipif(not _interpreter_numpy_ok(),
                                 reason="recording under TRITON_INTERPRET=1 needs numpy<2.4 (CPU CI runs these)")]
needs_interpreter = pytest.mark.skipif(not INTERPRETING,
                                       reason="records launches by running kernels under TRITON_INTERPRET=1")


# --------------------------------------------------------------------------------------------------
# Kernels that the interpreter runs but the GPU compiler must reject (module level: see docstring)
# --------------------------------------------------------------------------------------------------

@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = tl.load(a_ptr + rm[:, None] * BK + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * BN + rn[None, :])
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], tl.dot(a, b))


@tu.autotune(configs=[triton.Config({"BK": 16}, num_warps=4), triton.Config({"BK": 8}, num_warps=4)], key=["K"])
@triton.jit
def _tuned_dot_kernel(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


@triton.jit
def _pipelined_mm_kernel(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + rk[:, None] * BN + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        acc += tl.dot(tl.load(a_ptrs), tl.load(b_ptrs))
        a_ptrs += BK
        b_ptrs += BK * BN
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


# --------------------------------------------------------------------------------------------------
# Fixtures and parametrization
# --------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _library_recording():
    """(Recording, None) or (None, error text) for every check case of the library."""
    try:
        return cc.record_launches_cached(shapes=SHAPES), None
    except Exception as e:  # reported by test_library_recording, not as a collection error
        return None, f"{type(e).__name__}: {e}"


def pytest_generate_tests(metafunc):
    if "library_launch" not in metafunc.fixturenames:
        return
    rec, _ = _library_recording() if _nvidia_toolchain() else (None, None)
    params = [pytest.param(launch, arch, id=f"{launch.test_id()}-sm{arch}")
              for launch in (rec.launches if rec else []) for arch in cc.ARCHS]
    if not params:
        params = [pytest.param(None, 0, id="no-launches")]
    metafunc.parametrize(("library_launch", "arch"), params)


@pytest.fixture(scope="session")
def worker():
    with cc.CompileWorker() as w:
        yield w


def _record(fn):
    """Launches recorded while ``fn()`` runs under the interpreter."""
    with cc.Recorder() as rec:
        fn()
    return rec.launches


def _fp16(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) / 4).half()


# --------------------------------------------------------------------------------------------------
# The library
# --------------------------------------------------------------------------------------------------

def test_library_kernel_compiles(library_launch, arch, worker):
    if library_launch is None:
        pytest.fail(f"no kernel launch was recorded: {_library_recording()[1] or 'see test_library_recording'}")
    r = worker.compile(library_launch, arch)
    assert r.ok, (f"{library_launch.label()} does not build for sm_{arch} (first seen in case "
                  f"{library_launch.case!r}, {library_launch.shapes} shapes):\n{r.error}")
    assert r.shared is not None and r.shared <= cc.SHARED_LIMIT[arch]


def test_library_recording():
    rec, err = _library_recording()
    assert err is None, err
    assert not rec.errors, "check cases failed while recording:\n" + "\n".join(
        f"{e.case} {e.dtype} {e.shapes}: {e.error}" for e in rec.errors)
    assert rec.launches, "no Triton kernel launch recorded"
    # every case of an op with a Triton implementation must have launched a kernel
    silent = [n.split(":")[0] for n in rec.notes if n.endswith("no Triton kernel launch recorded")]
    with_triton = [c for c in silent if "triton" in backends.registered_backends(c.split(" ")[0])]
    assert not with_triton, f"cases whose Triton kernels were not reached: {with_triton}"
    # bf16 launches are derived from fp16 ones (the interpreter never sees bf16 pointers)
    fp16 = {(l.module, l.qualname) for l in rec.launches if l.dtype == "fp16"}
    bf16 = {(l.module, l.qualname) for l in rec.launches if l.dtype == "bf16"}
    assert bf16 <= fp16 and (bf16 or not fp16), (fp16, bf16)
    for l in rec.launches:
        if l.dtype == "bf16":
            assert not any(isinstance(t, str) and t.startswith("*fp16") for t in l.signature.values()), l.label()


# --------------------------------------------------------------------------------------------------
# The tool itself
# --------------------------------------------------------------------------------------------------

@needs_interpreter
def test_dot_with_k_below_16_is_reported(worker):
    a, b = _fp16(16, 8), _fp16(8, 16, seed=1)
    for bk, a_, b_ in ((8, a, b), (16, _fp16(16, 16), _fp16(16, 16, seed=1))):
        c = torch.empty(16, 16)

        def run():
            _dot_kernel[(1,)](a_, b_, c, BM=16, BN=16, BK=bk)

        (launch,) = _record(run)
        # the interpreter runs it (that is the trap) ...
        torch.testing.assert_close(c, a_.float() @ b_.float(), atol=1e-2, rtol=1e-2)
        assert launch.signature["a_ptr"] == "*fp16" and launch.constexpr_str() == f"BM=16 BN=16 BK={bk}"
        # ... the compiler does not (K=8), and accepts K=16
        for arch in cc.ARCHS:
            r = worker.compile(launch, arch)
            if bk == 8:
                assert not r.ok and "K >= 16" in r.summary and "CompilationError" in r.summary, r.error
            else:
                assert r.ok, r.error
                assert r.regs is not None and r.regs > 0 and r.shared is not None


@needs_interpreter
def test_every_autotune_config_is_compiled(worker):
    K = 32
    a, b, c = _fp16(16, K), _fp16(K, 16, seed=1), torch.empty(16, 16)
    launches = _record(lambda: _tuned_dot_kernel[(1,)](a, b, c, K, BM=16, BN=16))
    torch.testing.assert_close(c, a.float() @ b.float(), atol=1e-2, rtol=1e-2)  # the interpreter ran config 1
    assert sorted(l.config for l in launches) == ["1/2", "2/2"]
    assert _tuned_dot_kernel.all_configs[1].kwargs == {"BK": 8}
    by_cfg = {l.config: l for l in launches}
    assert "BK=16" in by_cfg["1/2"].constexpr_str() and "BK=8" in by_cfg["2/2"].constexpr_str()
    assert by_cfg["1/2"].signature["K"] == "i32" and by_cfg["1/2"].attrs.get("3") == [["tt.divisibility", 16]]
    for arch in cc.ARCHS:
        assert worker.compile(by_cfg["1/2"], arch).ok
        bad = worker.compile(by_cfg["2/2"], arch)
        assert not bad.ok and "K >= 16" in bad.summary


@needs_interpreter
def test_shared_memory_over_the_arch_limit_is_reported(worker):
    # 7 pipeline stages of a 128x128x64 fp16 matmul: ~192 KB of shared memory on sm_80 (limit 163 KB),
    # ~224 KB on sm_90 (limit 227 KB). The interpreter has no shared memory and runs it fine.
    K = 128
    a, b, c = _fp16(128, K), _fp16(K, 128, seed=1), torch.empty(128, 128)
    (launch,) = _record(lambda: _pipelined_mm_kernel[(1,)](a, b, c, K, BM=128, BN=128, BK=64, num_warps=8,
                                                          num_stages=7))
    torch.testing.assert_close(c, a.float() @ b.float(), atol=2e-2, rtol=2e-2)
    assert launch.options == {"num_warps": 8, "num_stages": 7}
    r80, r90 = worker.compile(launch, 80), worker.compile(launch, 90)
    assert not r80.ok and r80.shared > cc.SHARED_LIMIT[80], (r80.shared, r80.error)
    assert "shared memory" in r80.summary and "sm_80" in r80.summary
    assert r90.ok and r90.shared <= cc.SHARED_LIMIT[90], (r90.shared, r90.error)


@needs_interpreter
def test_local_kernel_is_a_clear_error(worker):
    @triton.jit
    def local_copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs))

    x, y = torch.randn(16), torch.empty(16)
    (launch,) = _record(lambda: local_copy[(1,)](x, y, BLOCK=16))
    r = worker.compile(launch, 90)
    assert not r.ok and "module level" in r.error


def test_compiler_crash_and_timeout_are_failures_not_hangs(tmp_path):
    def launch_of(module, qualname, file):
        return cc.Launch(module=module, qualname=qualname, file=file,
                         arg_names=["a_ptr", "b_ptr", "c_ptr", "BM", "BN", "BK"],
                         signature={"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "BM": "constexpr",
                                    "BN": "constexpr", "BK": "constexpr"},
                         constexprs={"3": 16, "4": 16, "5": 16}, attrs={}, options={"num_warps": 4})

    crash, hang = tmp_path / "cc_crash_kernels.py", tmp_path / "cc_hang_kernels.py"
    crash.write_text("import os\nos._exit(3)\n")
    hang.write_text("import time\ntime.sleep(600)\n")
    fn = _dot_kernel.fn
    good = launch_of(fn.__module__, fn.__qualname__, fn.__code__.co_filename)
    with cc.CompileWorker() as w:
        r = w.compile(launch_of("_cc_crash_kernels_not_importable", "k", str(crash)), 90)
        assert not r.ok and "crashed (exit code 3)" in r.error, r.error
        assert w.compile(good, 90).ok  # a fresh compiler process took over
        w.timeout = 3.0
        r = w.compile(launch_of("_cc_hang_kernels_not_importable", "k", str(hang)), 90)
        assert not r.ok and "timed out" in r.error, r.error


def test_specialization_and_bf16_twin():
    launch = cc.Launch(module="m", qualname="k", file="", arg_names=["x", "y", "n", "one", "B", "DT"],
                       signature={"x": "*fp16", "y": "*fp32", "n": "i32", "one": "constexpr", "B": "constexpr",
                                  "DT": "constexpr"},
                       constexprs={"3": 1, "4": 64, "5": {"__dtype__": "fp16"}}, attrs={"0": [["tt.divisibility", 16]]},
                       options={"num_warps": 4}, dtype="fp16")
    twin = cc.as_bf16(launch)
    assert twin.signature == {**launch.signature, "x": "*bf16"} and twin.dtype == "bf16"
    assert twin.constexprs["5"] == {"__dtype__": "bf16"} and launch.constexprs["5"] == {"__dtype__": "fp16"}
    assert cc.Launch.from_dict(twin.to_dict()).key() == twin.key() != launch.key()
    assert cc.dedupe([launch, cc.as_bf16(launch), launch])[0].count == 2


def test_resource_limits_and_ptxas_log():
    log = ("ptxas info    : Function properties for k\n"
           "    8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 0 barriers, 584 bytes cmem[0]\n")
    assert cc._parse_ptxas_log(log) == {"regs": 255, "stack": 8, "spill_stores": 8, "spill_loads": 4}
    assert cc.limit_violations(90, 200_000, 128, 4) == []
    assert "shared memory" in cc.limit_violations(80, 200_000, 128, 4)[0]
    assert "registers" in cc.limit_violations(90, 0, 255, 16)[0]  # 255 regs x 512 threads > 64K
    assert "threads" in cc.limit_violations(90, 0, 32, 64)[0]


@needs_interpreter
def test_command_line(capsys):
    rc = cc.main(["--ops", "clipped_swiglu", "--no-real", "--dtypes", "fp32", "--no-bf16", "--arch", "90",
                  "-j", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "clipped_swiglu_fwd_kernel" in out and "clipped_swiglu_bwd_kernel" in out and "compilations ok" in out


def test_resource_usage_kept_by_kernel_hash(tmp_path, monkeypatch):
    """A Triton cache hit does not run ptxas: the usage is read from the per-hash file, not rebuilt
    (``ptxas -v`` of a spilling kernel took seconds per launch); a tool failure is not remembered."""
    monkeypatch.setattr(cc, "_default_cache_dir", lambda: str(tmp_path))
    calls = []
    usage = {"regs": 96, "stack": 16, "spill_stores": 8, "spill_loads": 8}
    monkeypatch.setattr(cc, "resource_usage", lambda cubin, ptx, arch: calls.append(arch) or dict(usage))
    assert cc.cached_resource_usage("h1", b"", None, 90) == usage
    assert cc.cached_resource_usage("h1", b"", None, 90) == usage and calls == [90]
    cc.store_resource_usage("h2", {**usage, "regs": 40})  # what a build that ran ptxas -v logged
    assert cc.cached_resource_usage("h2", b"", None, 90)["regs"] == 40 and calls == [90]
    failed = {"regs": None, "stack": None, "spill_stores": None, "spill_loads": None}
    partial = {"regs": 96, "stack": 64, "spill_stores": None, "spill_loads": None}  # cuobjdump ran, ptxas -v not
    for i, bad in enumerate((failed, partial)):
        monkeypatch.setattr(cc, "resource_usage", lambda cubin, ptx, arch, bad=bad: calls.append(arch) or dict(bad))
        cc.cached_resource_usage(f"h{3 + i}", b"", None, 80)
        cc.cached_resource_usage(f"h{3 + i}", b"", None, 80)
    assert calls == [90, 80, 80, 80, 80]
    with open(cc._usage_path("h1"), "w") as f:  # a damaged entry is a miss
        f.write("{}")
    monkeypatch.setattr(cc, "resource_usage", lambda cubin, ptx, arch: calls.append(arch) or dict(usage))
    assert cc.cached_resource_usage("h1", b"", None, 90) == usage and calls[-1] == 90
