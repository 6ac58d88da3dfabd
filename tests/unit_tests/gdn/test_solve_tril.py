"""solve_tril (SPEC 1.10.3): kernel vs torch.linalg inverse per chunk in float64, varlen, garbage
above the diagonal, tails, layouts, errors."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops.api.triton.solve_tril import solve_tril
from mindspeed_ops.ops.gdn import reference as ref
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, randn, snapshot
from tests.conftest import DEVICE, DTYPES

SEG13 = [0, 31, 64, 65, 130, 200, 333, 390, 512, 600, 777, 800, 1000, 1024]


def _kkt_A(B, T, H, HV, BT, dtype, cu=None, seed=0, K=64):
    """A of SPEC 1.10.2 from L2-normalised k, sigmoid beta and logsigmoid gates (chunk cumsum)."""
    gen = torch.Generator().manual_seed(seed)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen, dtype=torch.float64))
    g = F.logsigmoid(torch.randn(B, T, HV, generator=gen, dtype=torch.float64))
    G = ref.chunk_local_cumsum_ref(g, BT, cu_seqlens=cu)
    A = ref.chunk_scaled_dot_kkt_ref(k, G, beta, cu_seqlens=cu, chunk_size=BT)
    return A.to(dtype).to(DEVICE)


def _rand_A(B, T, HV, BT, dtype, seed=0):
    A = randn((B, T, HV, BT), torch.float32, "cpu", seed=seed, scale=0.1)
    return A.to(dtype).to(DEVICE)


def _check(A, cu=None, output_dtype=torch.float32, **kw):
    before = snapshot(A)
    out = solve_tril(A, cu_seqlens=cu, output_dtype=output_dtype, **kw)
    assert_unchanged(before, A, names=["A"])
    want = ref.solve_tril_ref(A.double(), cu_seqlens=cu)
    assert out.dtype == (A.dtype if output_dtype is None else output_dtype) and out.shape == A.shape
    assert_close("Ainv", want, out, "TRIL")
    # exact structure: unit diagonal and zeros above it on valid rows
    BT = A.shape[-1]
    o = out.float().cpu()
    if cu is None:
        pos = torch.arange(A.shape[1]) % BT
        valid = torch.ones(A.shape[1], dtype=torch.bool)
    else:
        c = cu.tolist()
        pos = torch.zeros(A.shape[1], dtype=torch.long)
        valid = torch.zeros(A.shape[1], dtype=torch.bool)
        for a, b in zip(c, c[1:]):
            pos[a:b] = torch.arange(b - a) % BT
            valid[a:b] = True
        assert (o[:, ~valid] == 0).all(), "tail rows must be 0"
    col = torch.arange(BT)
    upper = (col[None, :] > pos[:, None]) & valid[:, None]         # [T, BT]
    diag = (col[None, :] == pos[:, None]) & valid[:, None]
    assert (o.permute(0, 2, 1, 3)[:, :, upper] == 0).all()
    assert (o.permute(0, 2, 1, 3)[:, :, diag] == 1).all()
    return out


CPU_SHAPES = [(1, 63, 1, 16), (2, 100, 1, 32), (1, 150, 2, 64), (1, 128, 3, 16)]
GPU_SHAPES = [(1, 63, 1, 16), (2, 500, 4, 32), (2, 1000, 5, 64), (3, 1024, 6, 64), (4, 2048, 8, 64), (1, 1024, 32, 16)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,HV,BT", CPU_SHAPES)
def test_matches_reference(B, T, HV, BT, dtype, poisoned):
    _check(_kkt_A(B, T, 1, HV, BT, dtype, seed=1))
    if dtype == torch.float32:
        _check(_rand_A(B, T, HV, BT, dtype, seed=2))


@pytest.mark.parametrize("num_warps", [1, 2, 4, 8])
def test_launch_variants(num_warps, monkeypatch, poisoned):
    """Every warp count that benchmarks/tune_solve_tril.py may choose is exact (a varlen tail and every
    chunk size), not only the default."""
    import importlib

    st = importlib.import_module("mindspeed_ops.ops.gdn.solve_tril")
    monkeypatch.setattr(st, "NUM_WARPS", {16: num_warps, 32: num_warps, 64: num_warps})
    for BT in (16, 32, 64):
        _check(_kkt_A(1, 150, 1, 2, BT, torch.float32, seed=BT))
        cu = [0, 7, 90, 140]
        _check(_kkt_A(1, 145, 1, 1, BT, torch.float32, cu=torch.tensor(cu), seed=BT + 1),
               torch.tensor(cu, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("HV,BT,cu", [(4, 16, [0, 15]), (1, 64, [0, 15, 100, 300]),
                                      (1, 16, SEG13[:8]), (2, 32, [0, 0, 40, 40, 97])])
def test_varlen(HV, BT, cu, poisoned):
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    T = cu[-1] + 5  # tail rows
    _check(_kkt_A(1, T, 1, HV, BT, torch.float32, cu=torch.tensor(cu), seed=3), cu_t)
    _check(_rand_A(1, T, HV, BT, torch.float16, seed=4), cu_t.long(), output_dtype=None)


def _local_pos(T, cu):
    pos = torch.full((T,), -1, dtype=torch.long)  # -1: tail
    for a, b in zip(cu, cu[1:]):
        pos[a:b] = torch.arange(b - a)
    return pos


@pytest.mark.parametrize("BT", [16, 32, 64])
def test_garbage_above_diagonal_and_in_tail_ignored(BT):
    """NaN on/above the diagonal, in columns of another sequence and in tail rows is never read."""
    T = 2 * BT + 10
    A = _rand_A(1, T, 1, BT, torch.float32, seed=5)
    for cu in ([0, T], [0, BT + 3, 2 * BT]):
        pos = _local_pos(T, cu).to(DEVICE)
        lower = (torch.arange(BT, device=DEVICE)[None, :] < (pos % BT)[:, None]) & (pos >= 0)[:, None]
        lower = lower[None, :, None, :]
        clean = torch.where(lower, A, torch.zeros((), device=DEVICE))
        dirty = torch.where(lower, A, torch.full((), float("nan"), device=DEVICE))
        cu_t = torch.tensor(cu, device=DEVICE)
        out = solve_tril(dirty, cu_seqlens=cu_t)
        assert torch.isfinite(out).all()
        assert torch.equal(out, solve_tril(clean, cu_seqlens=cu_t))
        assert_close("Ainv", ref.solve_tril_ref(clean.double(), cu_t), out, "TRIL")


def test_non_contiguous_and_output_dtypes():
    A = _kkt_A(1, 64, 1, 2, 32, torch.float32, seed=6)
    _check(non_contiguous(A))
    _check(A.transpose(1, 2).contiguous().transpose(1, 2))
    _check(A, output_dtype=torch.float16)
    _check(A.half(), output_dtype=None)


def test_supplied_chunk_indices_and_determinism():
    from mindspeed_ops.api.triton.utils import prepare_chunk_indices

    cu = torch.tensor([0, 15, 100, 130], device=DEVICE)
    A = _kkt_A(1, 130, 1, 1, 64, torch.float32, cu=cu.cpu(), seed=7)
    a = solve_tril(A, cu_seqlens=cu)
    b = solve_tril(A, cu_seqlens=cu, chunk_indices=prepare_chunk_indices(cu, 64))
    assert torch.equal(a, b) and torch.equal(a, solve_tril(A, cu_seqlens=cu))


def test_empty():
    assert solve_tril(torch.empty(1, 0, 2, 16, device=DEVICE)).shape == (1, 0, 2, 16)
    out = solve_tril(torch.randn(1, 10, 2, 16, device=DEVICE), cu_seqlens=torch.tensor([0, 0], device=DEVICE))
    assert (out == 0).all()


def test_bad_input():
    A = torch.randn(1, 32, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="solve_tril: A must be 4-D"):
        solve_tril(A[0])
    with pytest.raises(ValueError, match="chunk size BT\\) must be 16, 32 or 64, got shape \\[1, 32, 2, 8\\]"):
        solve_tril(A[..., :8])
    with pytest.raises(TypeError, match="float64"):
        solve_tril(A.double())
    with pytest.raises(TypeError, match="A must have dtype"):
        solve_tril(A.int())
    with pytest.raises(TypeError, match="output_dtype"):
        solve_tril(A, output_dtype=torch.int32)
    with pytest.raises(ValueError, match="batch size must be 1"):
        solve_tril(A.expand(2, -1, -1, -1), cu_seqlens=torch.tensor([0, 32], device=DEVICE))
    with pytest.raises(ValueError, match="cu_seqlens\\[0\\] must be 0"):
        solve_tril(A, cu_seqlens=torch.tensor([1, 32], device=DEVICE))
    # a list of offsets: a TypeError naming cu_seqlens (was AttributeError: 'list' object has no attribute 'device')
    with pytest.raises(TypeError, match="solve_tril: cu_seqlens must be a torch.Tensor, got list"):
        solve_tril(A, cu_seqlens=[0, 32])


@pytest.mark.gpu
@pytest.mark.parametrize("B,T,HV,BT", GPU_SHAPES)
def test_gpu_real_sizes(B, T, HV, BT):
    for dtype in DTYPES:
        _check(_kkt_A(B, T, 1, HV, BT, dtype, seed=8, K=128))
    _check(_rand_A(B, T, HV, BT, torch.float32, seed=9))


@pytest.mark.gpu
def test_gpu_varlen_real():
    cu = [0, 15, 100, 300, 1200, 2000]
    _check(_kkt_A(1, 2000, 1, 4, 64, torch.float32, cu=torch.tensor(cu), seed=10), torch.tensor(cu, device=DEVICE))
    seg = torch.tensor(SEG13, device=DEVICE)
    for dtype in DTYPES:
        _check(_kkt_A(1, 1024, 1, 32, 16, dtype, cu=seg.cpu(), seed=11), seg)
