"""chunk_bwd_dv_local (SPEC 1.10.8): the float64 reference against autograd of the intra-chunk output,
then the kernel against the reference: chunk sizes, GVA, head dims, varlen with poisoned tails,
g=None == zeros, strong decay, layouts, determinism, errors."""
import pytest
import torch

from mindspeed_ops.api.triton.chunk_bwd_dv_local import chunk_bwd_dv_local
from mindspeed_ops.ops.gdn import reference_bwd as rb
from mindspeed_ops.ops.gdn import reference_fwd as rf
from mindspeed_ops.testing import assert_close, assert_unchanged, non_contiguous, snapshot, to_ref
from tests.conftest import DEVICE, DTYPES
from tests.unit_tests.gdn.test_bwd_dhu import SEG13, build, cast, close


def test_reference_matches_autograd():
    """dv_local is the gradient w.r.t. v of the intra-chunk output
    ``o_i = scale·Σ_{j≤i, same chunk} (q_i·k_j) e^{G_i−G_j} v_j`` (float64, GVA, varlen)."""
    cu = [0, 10, 10, 45, 70]
    d = build(1, 70, 1, 2, 8, 5, BT=16, cu=cu, s=0.3, seed=1, device="cpu", fwd=False)
    cu_t = torch.tensor(cu)
    v = torch.randn(1, 70, 2, 5, dtype=torch.float64, requires_grad=True)
    zero_h = torch.zeros(1, sum(-(-(b - a) // 16) for a, b in zip(cu, cu[1:])), 2, 8, 5, dtype=torch.float64)
    o = rf.chunk_fwd_o_ref(d["q"], d["k"], v, zero_h, d["G"], 0.3, cu_t, 16)
    (grad,) = torch.autograd.grad((o * d["do"]).sum(), v)
    assert_close("dv", grad, rb.chunk_bwd_dv_local_ref(d["q"], d["k"], d["do"], d["G"], 0.3, cu_t, 16), 1e-12)


def check(d, dtype, BT, cu=None, gate=True, scale=None, chunk_indices=None):
    q, k, do = (cast(d[n], dtype, cu) for n in ("q", "k", "do"))
    G = cast(d["G"], torch.float32, cu) if gate else None
    cu_t = None if cu is None else torch.tensor(cu, device=DEVICE)
    before = snapshot(q, k, do, G)
    dv = chunk_bwd_dv_local(q, k, do, g=G, scale=scale, cu_seqlens=cu_t, chunk_size=BT, chunk_indices=chunk_indices)
    assert_unchanged(before, q, k, do, G, names=["q", "k", "do", "g"])
    assert dv.dtype == dtype
    close("dv", rb.chunk_bwd_dv_local_ref(*to_ref(q, k, do, G), scale, cu_t, BT), dv, "LA-d", dtype)
    if cu is not None and cu[-1] < q.shape[1]:
        assert (dv[:, cu[-1]:] == 0).all(), "tail tokens must be 0"
    return dv


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,H,HV,K,V,BT", [(2, 100, 2, 2, 32, 32, 32), (1, 90, 1, 4, 16, 24, 16),
                                             (1, 70, 1, 1, 100, 100, 64), (1, 64, 2, 2, 8, 8, 64)])
def test_matches_reference(B, T, H, HV, K, V, BT, dtype, poisoned):
    check(build(B, T, H, HV, K, V, BT=BT, seed=2, fwd=False), dtype, BT)


@pytest.mark.parametrize("BT,cu", [(64, [0, 15, 100, 130]), (16, SEG13[:6]), (32, [0, 0, 40, 40, 97])])
def test_varlen_poisoned_tail(BT, cu, poisoned):
    d = build(1, cu[-1] + 9, 1, 2, 16, 16, BT=BT, cu=cu, seed=3, fwd=False)
    check(d, torch.float32, BT, cu)
    check(d, torch.float16, BT, cu, scale=0.5)


def test_no_gate_equals_zero_gate_and_strong_decay(poisoned):
    d = build(1, 50, 1, 1, 16, 16, BT=16, gate=None, seed=4, fwd=False)
    a = check(d, torch.float32, 16, gate=False)
    q, k, do = (cast(d[n], torch.float32) for n in ("q", "k", "do"))
    assert torch.equal(a, chunk_bwd_dv_local(q, k, do, g=torch.zeros(1, 50, 1, device=DEVICE), chunk_size=16))
    for dtype in DTYPES:  # G down to ~ −4000 inside a chunk, partial last chunk
        assert torch.isfinite(check(build(2, 75, 1, 1, 16, 16, BT=64, s=0.01, seed=5, fwd=False), dtype, 64)).all()


def test_layouts_determinism_chunk_indices():
    from mindspeed_ops.api.triton.utils import prepare_chunk_indices

    d = build(1, 60, 2, 2, 16, 16, BT=16, seed=6, fwd=False)
    q, k, do, G = (cast(d[n], torch.float32) for n in ("q", "k", "do", "G"))
    do = do[:, :, :, :1].expand_as(do)                  # stride-0 upstream gradient
    base = chunk_bwd_dv_local(q, k, do.contiguous(), g=G, chunk_size=16)
    assert torch.equal(base, chunk_bwd_dv_local(q, k, do.contiguous(), g=G, chunk_size=16))
    out = chunk_bwd_dv_local(q.transpose(1, 2).contiguous().transpose(1, 2), non_contiguous(k, "transpose"), do,
                             g=non_contiguous(G), chunk_size=16)
    assert torch.equal(base, out)
    cu = torch.tensor([0, 20, 60], device=DEVICE)
    assert torch.equal(chunk_bwd_dv_local(q, k, do, g=G, cu_seqlens=cu, chunk_size=16),
                       chunk_bwd_dv_local(q, k, do, g=G, cu_seqlens=cu, chunk_size=16,
                                          chunk_indices=prepare_chunk_indices(cu, 16)))


def test_empty():
    q, do = torch.randn(1, 0, 2, 16, device=DEVICE), torch.randn(1, 0, 4, 8, device=DEVICE)
    assert chunk_bwd_dv_local(q, q, do).shape == (1, 0, 4, 8)
    q, do = torch.randn(1, 5, 2, 16, device=DEVICE), torch.randn(1, 5, 4, 8, device=DEVICE)
    assert (chunk_bwd_dv_local(q, q, do, cu_seqlens=torch.tensor([0, 0], device=DEVICE)) == 0).all()


def test_bad_input():
    q = torch.randn(1, 32, 2, 16, device=DEVICE)
    do = torch.randn(1, 32, 4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="chunk_bwd_dv_local: q must be 4-D"):
        chunk_bwd_dv_local(q[0], q, do)
    with pytest.raises(ValueError, match="k must have shape \\[B, T, H, K\\] = \\[1, 32, 2, 16\\], "
                                         "got \\[1, 32, 2, 8\\]"):
        chunk_bwd_dv_local(q, q[..., :8], do)
    with pytest.raises(ValueError, match="do must have shape"):
        chunk_bwd_dv_local(q, q, do[:, :8])
    with pytest.raises(ValueError, match="multiple of the key heads"):
        chunk_bwd_dv_local(q, q, do[:, :, :3])
    with pytest.raises(ValueError, match="g must have shape \\[B, T, HV\\]"):
        chunk_bwd_dv_local(q, q, do, g=torch.zeros(1, 32, 2, device=DEVICE))
    with pytest.raises(ValueError, match="chunk_size must be 16, 32 or 64"):
        chunk_bwd_dv_local(q, q, do, chunk_size=8)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        chunk_bwd_dv_local(q, q, do, scale=float("nan"))
    with pytest.raises(TypeError, match="float64"):
        chunk_bwd_dv_local(q, q, do.double())
    with pytest.raises(TypeError, match="q must have dtype"):
        chunk_bwd_dv_local(q.long(), q, do)
    with pytest.raises(ValueError, match="K must be <= 256"):
        qb = torch.zeros(1, 4, 1, 300, device=DEVICE)
        chunk_bwd_dv_local(qb, qb, do[:, :4])
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        chunk_bwd_dv_local(q, q, do, cu_seqlens=torch.tensor([0, 9, 5], device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("B,T,cu", [(1, 4096, [0, 1024, 1164, 2000, 4096]), (1, 4096, None), (1, 2048, None),
                                    (2, 4096, None)])
def test_gpu_real_sizes(B, T, cu):
    d = build(B, T, 32, 32, 128, 128, cu=cu, seed=20, fwd=False)
    for dtype in DTYPES:
        check(d, dtype, 64, cu)
    d = build(B, T, 16, 32, 128, 128, BT=16, cu=cu, seed=21, fwd=False)
    check(d, torch.bfloat16, 16, cu)
    check(d, torch.float32, 16, cu)
