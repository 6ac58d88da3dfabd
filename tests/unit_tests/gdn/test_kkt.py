"""chunk_scaled_dot_kkt_fwd (SPEC 1.10.2): kernel vs float64 reference (scalar and per-channel gates),
chunk sizes, GVA, head dims, varlen with poisoned tails, strong decay, layouts, errors, compile-only."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops.api.triton.chunk_scaled_dot_kkt import chunk_scaled_dot_kkt, chunk_scaled_dot_kkt_fwd
from mindspeed_ops.ops.gdn import reference as ref
from mindspeed_ops.ops.gdn.reference_wy import chunk_scaled_dot_kkt_fwd_ref
from mindspeed_ops.testing import (assert_close, assert_unchanged, err_atol, non_contiguous, snapshot, threshold,
                                   to_ref)
from tests.conftest import COMPILE_ONLY_MARKS, DEVICE, DTYPES

SEG13 = [0, 31, 64, 65, 130, 200, 333, 390, 512, 600, 777, 800, 1000, 1024]


def _gates(shape, BT, cu, gen, s=1.0):
    """Chunk-local cumsum of ``logsigmoid(rand)/s`` with ~20% exact zeros (SPEC 1.10.0 recipe), fp32."""
    g = F.logsigmoid(torch.rand(shape, generator=gen, dtype=torch.float64)) / s
    g = g * (torch.rand(shape, generator=gen, dtype=torch.float64) > 0.2)
    return ref.chunk_local_cumsum_ref(g, BT, cu_seqlens=cu).float().to(DEVICE)


def make_inputs(B, T, H, HV, K, BT, dtype, cu=None, seed=0, s=1.0):
    """``(k, G, Gk, beta)``: L2-normalised k in ``dtype``, scalar and per-channel fp32 gate cumsums,
    sigmoid beta in ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    cu_cpu = None if cu is None else torch.as_tensor(cu).cpu()
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(dtype).to(DEVICE)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen)).to(dtype).to(DEVICE)
    return k, _gates((B, T, HV), BT, cu_cpu, gen, s), _gates((B, T, HV, K), BT, cu_cpu, gen, s), beta


def _positions(T, BT, cu):
    """Chunk position of every token (-1 for tail tokens)."""
    pos = torch.full((T,), -1, dtype=torch.long)
    for a, b in (zip(cu, cu[1:]) if cu is not None else [(0, T)]):
        pos[a:b] = torch.arange(b - a) % BT
    return pos


def check(k, g=None, gk=None, beta=None, cu=None, BT=64, output_dtype=torch.float32, **kw):
    """Run the kernel, check no mutation, dtype/shape, LA-o against the float64 reference and the
    exact structure (zeros on/above the diagonal and in tail rows)."""
    before = snapshot(k, g, gk, beta)
    out = chunk_scaled_dot_kkt_fwd(k, g=g, gk=gk, beta=beta, cu_seqlens=cu, chunk_size=BT,
                                   output_dtype=output_dtype, **kw)
    assert_unchanged(before, k, g, gk, beta, names=["k", "g", "gk", "beta"])
    B, T, H, _ = k.shape
    HV = next((t.shape[2] for t in (beta, g, gk) if t is not None), H)
    assert out.shape == (B, T, HV, BT)
    assert out.dtype == (k.dtype if output_dtype is None else output_dtype)
    kr, gr, gkr, br = to_ref(k, g, gk, beta)
    want = chunk_scaled_dot_kkt_fwd_ref(kr, gr, gkr, br, cu_seqlens=cu, chunk_size=BT)
    # LA-o keyed by k.dtype; a 16-bit output_dtype of fp32 keys adds its own rounding
    key = out.dtype if k.dtype == torch.float32 else k.dtype
    assert_close("A", want, out, threshold("LA-o", key), err_atol(key))
    pos = _positions(T, BT, None if cu is None else cu.tolist()).to(out.device)
    zero = torch.arange(BT, device=out.device)[None, :] >= pos[:, None]    # [T, BT]: on/above diag, tail rows
    assert (out.permute(0, 2, 1, 3)[:, :, zero] == 0).all()
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("BT", [16, 32, 64])
@pytest.mark.parametrize("gate", ["g", "gk", None])
def test_matches_reference(gate, BT, dtype, poisoned):
    k, G, Gk, beta = make_inputs(2, 100, 2, 2, 32, BT, dtype, seed=BT)   # T not a multiple of BT
    check(k, g=G if gate == "g" else None, gk=Gk if gate == "gk" else None, beta=beta, BT=BT)


@pytest.mark.parametrize("K", [8, 60, 100])
def test_head_dims(K, poisoned):
    k, G, Gk, beta = make_inputs(1, 80, 1, 2, K, 32, torch.float32, seed=K)
    check(k, g=G, beta=beta, BT=32)
    check(k, gk=Gk, beta=beta, BT=32)


def test_gva(poisoned):
    """H=2 q/k heads, HV=8 value heads: value head i reads key head i // 4."""
    for dtype in DTYPES:
        k, G, Gk, beta = make_inputs(1, 40, 2, 8, 16, 32, dtype, seed=3)
        check(k, g=G, beta=beta, BT=32)
        check(k, gk=Gk, beta=beta, BT=32)
    check(k, g=G, BT=32)          # HV from g
    check(k, gk=Gk, BT=32)        # HV from gk


@pytest.mark.parametrize("BT,cu", [(16, [0, 37, 100, 101, 230]), (64, [0, 0, 70, 150, 150, 200]), (64, SEG13),
                                   (32, [0, 15])])
def test_varlen_poisoned_tail(BT, cu, poisoned):
    """Varlen (int32 and int64 offsets): sequences never see each other; tail tokens hold NaN/huge
    values, are never read, and give zero rows."""
    T = cu[-1] + 9
    HV = 1 if len(cu) > 8 else 2
    k, G, Gk, beta = make_inputs(1, T, 1, HV, 32, BT, torch.float32, cu=cu, seed=len(cu))
    end = cu[-1]
    k[:, end:] = float("nan")
    beta[:, end:] = 1e30
    G[:, end:] = float("inf")
    Gk[:, end:] = float("nan")
    for i, dt in enumerate((torch.int32, torch.int64)):
        if i == 1 and len(cu) > 8:
            continue  # the per-channel kernel is slow under the interpreter
        cu_t = torch.tensor(cu, dtype=dt, device=DEVICE)
        out = check(k, g=G if i == 0 else None, gk=Gk if i == 1 else None, beta=beta, cu=cu_t, BT=BT)
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("gate", ["g", "gk"])
def test_strong_decay_finite(gate, poisoned):
    """g = logsigmoid(rand)/0.01 (g ~ -31..-69 per token, G down to ~ -4000 per chunk), T = 75."""
    for dtype in DTYPES:
        k, G, Gk, beta = make_inputs(1, 75, 1, 2, 16, 64, dtype, seed=5, s=0.01)
        out = check(k, g=G if gate == "g" else None, gk=Gk if gate == "gk" else None, beta=beta, BT=64)
        assert torch.isfinite(out).all()


def test_no_gate_no_beta_and_output_dtypes():
    k, G, Gk, beta = make_inputs(1, 50, 2, 2, 16, 16, torch.float32, seed=6)
    a = check(k, BT=16)                              # HV = H, beta = 1, no decay
    assert torch.equal(a, chunk_scaled_dot_kkt_fwd(k, g=torch.zeros_like(G), chunk_size=16))  # g=None == zeros
    check(k, g=G, beta=beta, BT=16, output_dtype=torch.float16)
    check(k, g=G, beta=beta, BT=16, output_dtype=torch.bfloat16)
    check(k.half(), g=G, beta=beta.half(), BT=16, output_dtype=None)
    check(k.half(), gk=Gk, beta=beta, BT=16)                     # mixed dtypes: fp16 k, fp32 beta/gk


def test_non_contiguous():
    k, G, Gk, beta = make_inputs(1, 64, 2, 2, 32, 32, torch.float32, seed=7)
    kt = k.transpose(1, 2).contiguous().transpose(1, 2)          # token stride != H*K
    out = check(non_contiguous(k), g=non_contiguous(G), beta=non_contiguous(beta, "pad"), BT=32)
    assert torch.equal(out, check(kt, g=G, beta=beta, BT=32))
    assert torch.equal(out, chunk_scaled_dot_kkt_fwd(k, g=G, beta=beta, chunk_size=32))
    check(non_contiguous(k, "transpose"), gk=non_contiguous(Gk, "transpose"), beta=beta, BT=32)


def test_chunk_indices_determinism_alias():
    from mindspeed_ops.api.triton.utils import prepare_chunk_indices

    cu = torch.tensor([0, 15, 100, 130], device=DEVICE)
    k, G, Gk, beta = make_inputs(1, 130, 1, 2, 32, 64, torch.float32, cu=cu, seed=8)
    a = chunk_scaled_dot_kkt_fwd(k, g=G, beta=beta, cu_seqlens=cu)
    b = chunk_scaled_dot_kkt(k, g=G, beta=beta, cu_seqlens=cu, chunk_indices=prepare_chunk_indices(cu, 64))
    assert chunk_scaled_dot_kkt is chunk_scaled_dot_kkt_fwd
    assert torch.equal(a, b) and torch.equal(a, chunk_scaled_dot_kkt_fwd(k, g=G, beta=beta, cu_seqlens=cu))
    c = chunk_scaled_dot_kkt_fwd(k[:, :40], gk=Gk[:, :40], beta=beta[:, :40], chunk_size=16)
    assert torch.equal(c, chunk_scaled_dot_kkt_fwd(k[:, :40], gk=Gk[:, :40], beta=beta[:, :40], chunk_size=16))


def test_reference_per_channel_matches_scalar():
    """The per-channel reference with the same gate on every channel equals the scalar reference."""
    k, G, _, beta = make_inputs(1, 90, 1, 2, 8, 32, torch.float64, seed=9)
    cu = torch.tensor([0, 40, 90])
    a = chunk_scaled_dot_kkt_fwd_ref(k, g=G.double(), beta=beta, cu_seqlens=cu, chunk_size=32)
    b = chunk_scaled_dot_kkt_fwd_ref(k, gk=G.double()[..., None].expand(-1, -1, -1, 8), beta=beta, cu_seqlens=cu,
                                     chunk_size=32)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_empty():
    k = torch.randn(1, 0, 2, 16, device=DEVICE)
    assert chunk_scaled_dot_kkt_fwd(k, chunk_size=16).shape == (1, 0, 2, 16)
    k = torch.randn(1, 10, 2, 16, device=DEVICE)
    out = chunk_scaled_dot_kkt_fwd(k, cu_seqlens=torch.tensor([0, 0], device=DEVICE), chunk_size=32)
    assert out.shape == (1, 10, 2, 32) and (out == 0).all()


def test_bad_input():
    k = torch.randn(1, 32, 2, 16, device=DEVICE)
    g = torch.randn(1, 32, 4, device=DEVICE)
    beta = torch.rand(1, 32, 4, device=DEVICE)
    f = chunk_scaled_dot_kkt_fwd
    with pytest.raises(ValueError, match="chunk_scaled_dot_kkt_fwd: k must be 4-D"):
        f(k[0])
    with pytest.raises(TypeError, match="float64"):
        f(k.double())
    with pytest.raises(TypeError, match="k must have dtype"):
        f(k.int())
    with pytest.raises(ValueError, match="K must be <= 256"):
        f(torch.randn(1, 4, 1, 257, device=DEVICE))
    with pytest.raises(ValueError, match="not both"):
        f(k, g=g, gk=torch.randn(1, 32, 4, 16, device=DEVICE))
    with pytest.raises(ValueError, match=r"chunk_size must be 16, 32 or 64, got 128"):
        f(k, chunk_size=128)
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV\] = \[1, 32, 4\], got \[1, 32, 2\]"):
        f(k, g=g[..., :2], beta=beta)
    with pytest.raises(ValueError, match=r"gk must have shape \[B, T, HV, K\] = \[1, 32, 4, 16\], got \[1, 32, 4, 8\]"):
        f(k, gk=torch.randn(1, 32, 4, 8, device=DEVICE), beta=beta)
    with pytest.raises(ValueError, match="HV = 3 .* multiple of the key heads H = 2"):
        f(k, beta=beta[..., :3])
    with pytest.raises(TypeError, match="output_dtype"):
        f(k, output_dtype=torch.int32)
    with pytest.raises(ValueError, match="batch size must be 1"):
        f(k.expand(2, -1, -1, -1), cu_seqlens=torch.tensor([0, 32], device=DEVICE))
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\] must be <= T = 32"):
        f(k, cu_seqlens=torch.tensor([0, 33], device=DEVICE))
    with pytest.raises(ValueError, match=r"chunk_indices must have shape \[NT, 2\] = \[1, 2\]"):
        f(k, cu_seqlens=torch.tensor([0, 32], device=DEVICE), chunk_indices=torch.zeros(2, 2, dtype=torch.int32))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="on one device"):
            f(k, g=g.cpu() if k.is_cuda else g.cuda())


# ------------------------------------------------------------------------------------------------
# GPU sizes (SPEC must-test shapes)
# ------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("BT", [16, 32, 64])
def test_gpu_real_sizes(BT):
    for dtype in DTYPES:
        cu = [0, 1024, 1164, 2000, 4096]
        k, G, Gk, beta = make_inputs(1, 4096, 32, 32, 128, BT, dtype, cu=cu, seed=10)
        check(k, g=G, beta=beta, cu=torch.tensor(cu, device=DEVICE), BT=BT)
        k, G, Gk, beta = make_inputs(2, 4096, 32, 32, 128, BT, dtype, seed=11)
        check(k, g=G, beta=beta, BT=BT)
        check(k[:, :1024], gk=Gk[:, :1024], beta=beta[:, :1024], BT=BT)
        k, G, Gk, beta = make_inputs(1, 1024, 32, 32, 128, BT, dtype, cu=SEG13, seed=12)
        check(k, g=G, beta=beta, cu=torch.tensor(SEG13, device=DEVICE), BT=BT)
        k, G, Gk, beta = make_inputs(2, 1000, 4, 16, 60, BT, dtype, seed=13)     # GVA, K = 60
        check(k, g=G, beta=beta, BT=BT)
        check(k, gk=Gk, beta=beta, BT=BT)
        k, G, Gk, beta = make_inputs(1, 75, 4, 16, 128, BT, dtype, seed=14, s=0.01)  # strong decay
        assert torch.isfinite(check(k, g=G, beta=beta, BT=BT)).all()
        assert torch.isfinite(check(k, gk=Gk, beta=beta, BT=BT)).all()


# ------------------------------------------------------------------------------------------------
# compile-only (DESIGN 7): the launches of real sizes, built for sm_80 / sm_90
# ------------------------------------------------------------------------------------------------

@COMPILE_ONLY_MARKS[0]
@COMPILE_ONLY_MARKS[1]
def test_kernels_compile_for_gpu():
    from mindspeed_ops import compile_check as cc

    with cc.Recorder(dry=True) as rec:
        for dt in (torch.float32, torch.float16):
            k = torch.empty(1, 8192, 16, 128, dtype=dt)
            for BT in (64,):
                G, beta = torch.empty(1, 8192, 32), torch.empty(1, 8192, 32, dtype=dt)
                chunk_scaled_dot_kkt_fwd(k, g=G, beta=beta, chunk_size=BT)
                chunk_scaled_dot_kkt_fwd(k, gk=torch.empty(1, 8192, 32, 128), beta=beta, chunk_size=BT,
                                         cu_seqlens=torch.tensor([0, 100, 8192]))
    launches = cc.dedupe(rec.launches)
    bf16 = [cc.as_bf16(la) for la in launches if "*fp16" in la.signature.values()]
    assert {la.qualname for la in launches} == {"kkt_fwd_kernel", "kkt_gk_fwd_kernel"}
    # H200 (sm_90) for every dtype; A100 (sm_80) for bf16
    results = cc.compile_launches(launches + bf16, archs=(90,), jobs=2)
    results += cc.compile_launches(bf16, archs=(80,), jobs=2)
    bad = [f"{r.launch.label()} sm_{r.arch}: {r.summary}" for r in results if not r.ok]
    assert not bad, "\n".join(bad)
    for r in results:
        assert r.shared is not None and r.shared <= cc.SHARED_LIMIT[r.arch]


def test_non_contiguous_offsets_and_chunk_indices(poisoned):
    """Strided views of ``cu_seqlens`` and of a supplied ``chunk_indices`` table give the same result as
    contiguous ones (the kernels index both as flat arrays; found by the conv review for conv)."""
    from mindspeed_ops.varlen import build_chunk_indices

    cu = [0, 37, 100, 101, 150]
    k, G, _, beta = make_inputs(1, 150, 1, 2, 16, 32, torch.float32, cu=cu, seed=11)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    cu_strided = torch.stack([cu_t, -cu_t], 1).to(DEVICE).reshape(-1)[::2]   # values of cu, stride 2
    idx = build_chunk_indices(cu_t.long(), 32)
    idx_strided = torch.stack([idx, -idx], 1).to(DEVICE)[:, 0]               # [NT, 2] with row stride 4
    assert not cu_strided.is_contiguous() and not idx_strided.is_contiguous()
    want = chunk_scaled_dot_kkt_fwd(k, g=G, beta=beta, cu_seqlens=cu_t.to(DEVICE), chunk_size=32)
    got = chunk_scaled_dot_kkt_fwd(k, g=G, beta=beta, cu_seqlens=cu_strided, chunk_size=32,
                                   chunk_indices=idx_strided)
    assert torch.equal(got, want)
