"""Work of the GDN backward folded into neighbouring kernels (one launch fewer each).

1. The reverse chunk cumsum of dG inside wy's backward (``wy_fast.backward(dg_cumsum=True)``): equal, to fp32
   rounding, to the separate reverse ``chunk_local_cumsum`` of its unfolded dg (varlen with empty sequences and
   a NaN/inf-poisoned tail, GVA, chunk sizes 16/64); the other outputs bitwise equal.
2. The in-kernel qk l2norm's backward of dq applied inside ``chunk_bwd_dqkwg`` (``chunk.FOLD_DQ_NORM``).

Where one dqkwg program holds a whole K row (``bwd_dqkwg.folds_q_norm``: K <= 64, or fp16/bf16 with K <= 128),
the backward passes q's rstd to dqkwg, which applies ``rq·(dq − q̂ Σ dq ⊙ q̂)`` before its store, instead of a
separate l2norm backward over an fp32 dq. Against the unfolded path: dq to fp32 rounding (only the row sum's
order differs), every other gradient bitwise equal (dqkwg's dg part still uses the gradient of q̂). Cases: GVA,
varlen with tail tokens, a partial last chunk, non-contiguous q, K 64 (folded) and 100 (not folded: two K
blocks), fp16 K 128 (folded), NaN-poisoned outputs; and the same against the float64 oracle's gradients."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops import api
from mindspeed_ops.ops.gdn import bwd_dqkwg, chunk, cumsum, wy_fast
from mindspeed_ops.ops.gdn.common import device_tables
from mindspeed_ops.ops.gdn import reference as gdn_ref
from mindspeed_ops.testing import assert_close, threshold
from tests.conftest import COMPILE_ONLY_MARKS, DEVICE, assert_compiled


@pytest.mark.parametrize("BT, cu, dtype", [(64, None, torch.float32), (16, [0, 37, 100, 101, 150], torch.float32),
                                           (64, [0, 0, 70, 150, 150, 200], torch.float16)])
def test_wy_backward_dg_cumsum(BT, cu, dtype, poisoned):
    from tests.unit_tests.gdn.test_wy_fast import make_inputs

    T = 150 if cu is None else cu[-1] + 7
    k, v, beta, G, _, A, dw, du = make_inputs(2 if cu is None else 1, T, 1, 2, 32, 24, BT, dtype, cu=cu, seed=5)
    if cu is not None:
        for t in (k, v, beta, G, A, dw, du):
            t[:, cu[-1]:] = float("nan")
    cu_t = None if cu is None else torch.tensor(cu, device=DEVICE)
    cu_d, idx = device_tables(cu, BT, k.device)
    dg_acc = torch.randn(G.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    if cu is not None:
        dg_acc[:, cu[-1]:] = 0  # as dqkwg leaves its tail
    dk_acc = torch.randn(k.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    plain = wy_fast.backward(k, v, G, beta, A, dw, du, cu, cu_t, dk_acc=dk_acc, dg_acc=dg_acc, fold=False)
    fused = wy_fast.backward(k, v, G, beta, A, dw, du, cu, cu_t, dk_acc=dk_acc, dg_acc=dg_acc, fold=False,
                             dg_cumsum=True)
    for name, x, y in zip(("dk", "dv", "dbeta"), fused[:3], plain[:3]):
        assert torch.equal(x, y), name
    want = cumsum.forward(plain[3], BT, True, None, cu, cu_d, torch.float32, idx)
    assert torch.isfinite(fused[3]).all()
    assert_close("dg", want.double(), fused[3], 1e-6)
    if cu is not None:
        assert (fused[3][:, cu[-1]:] == 0).all()


def _inputs(B, T, H, HV, K, V, dtype, seed=0, q_view=False):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)
    q = r(B, H, T, K).transpose(1, 2) if q_view else r(B, T, H, K)
    k, v = r(B, T, H, K) * 3.0, r(B, T, HV, V)
    g = F.logsigmoid(torch.rand(B, T, HV, generator=gen)) / 0.5
    beta = torch.sigmoid(r(B, T, HV))
    h0 = r(B, HV, K, V)
    do = r(B, T, HV, V)
    ins = [t.to(DEVICE, dtype) for t in (q, k, v)] + [g.to(DEVICE), beta.to(DEVICE, dtype), h0.to(DEVICE)]
    return ins, do.to(DEVICE, dtype)


def _grads(ins, do, cu, fold, monkeypatch):
    monkeypatch.setattr(chunk, "FOLD_DQ_NORM", fold)
    leaves = [t.detach().clone().requires_grad_() for t in ins]
    q, k, v, g, beta, h0 = leaves
    o, _ = api.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                      use_qk_l2norm_in_kernel=True, cu_seqlens=cu, chunk_size=64)
    (o.float() * do.float()).sum().backward()
    return [t.grad for t in leaves]


CASES = [  # (B, T, H, HV, K, V, dtype, varlen, q_view)
    (1, 150, 2, 4, 64, 32, torch.float32, False, True),     # GVA, partial last chunk, non-contiguous q: folded
    (1, 200, 2, 2, 64, 48, torch.float32, True, False),     # varlen with tail tokens: folded
    (2, 70, 1, 2, 100, 32, torch.float32, False, False),    # two K blocks: not folded
    (1, 130, 1, 1, 128, 32, torch.float16, False, False),   # fp16, whole K = 128 in one block: folded
]


@pytest.mark.parametrize("B, T, H, HV, K, V, dtype, varlen, q_view", CASES)
def test_fold_matches_separate_l2norm_backward(B, T, H, HV, K, V, dtype, varlen, q_view, monkeypatch, poisoned):
    ins, do = _inputs(B, T, H, HV, K, V, dtype, q_view=q_view)
    cu = torch.tensor([0, 60, 61, 170], device=DEVICE) if varlen else None
    if varlen:
        ins[5] = ins[5][:1].expand(3, -1, -1, -1).contiguous()  # one initial state per sequence
    folded = bwd_dqkwg.folds_q_norm(ins[0])
    assert folded == (K <= 64 or (K <= 128 and dtype != torch.float32))
    calls = []
    orig = chunk._l2norm

    def spy(x):
        impl = orig(x)

        class Counting:
            forward = staticmethod(impl.forward)

            @staticmethod
            def backward(*a, **kw):
                calls.append(a[0].shape)
                return impl.backward(*a, **kw)
        return Counting
    monkeypatch.setattr(chunk, "_l2norm", spy)
    a = _grads(ins, do, cu, True, monkeypatch)
    n_fold = len(calls)
    b = _grads(ins, do, cu, False, monkeypatch)
    assert n_fold == (1 if folded else 2) and len(calls) - n_fold == 2  # the q launch goes only where folded
    names = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
    for name, x, y in zip(names, a, b):
        assert x is not None and torch.isfinite(x).all(), name
        assert x.dtype == y.dtype, name
        if name == "dq" and folded:
            assert_close(name, y.double(), x, 1e-6 if dtype == torch.float32 else 2e-3)
        else:
            assert torch.equal(x, y), name
    if varlen:
        assert (a[0][:, int(cu[-1]):] == 0).all()


def test_fold_against_oracle(monkeypatch):
    """The folded path's gradients against autograd of the float64 chunked reference (fp32, GVA)."""
    ins, do = _inputs(1, 100, 2, 4, 64, 32, torch.float32, seed=3)
    got = _grads(ins, do, None, True, monkeypatch)
    ref_leaves = [t.detach().double().clone().requires_grad_() for t in ins]
    q, k, v, g, beta, h0 = ref_leaves
    o, _ = gdn_ref.chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                              use_qk_l2norm_in_kernel=True, chunk_size=64)
    (o * do.double()).sum().backward()
    for name, x, y, cls in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, ref_leaves,
                               ("LA-d", "LA-d", "LA-d", "LA-g", "LA-g", "LA-d")):
        assert_close(name, y.grad, x, threshold(cls, torch.float32))


@COMPILE_ONLY_MARKS[0]
@COMPILE_ONLY_MARKS[1]
def test_folded_dqkwg_compiles_for_gpu():
    """The folded dqkwg launch at Qwen3-Next's head size (bf16, K = V = 128, GVA 16/32) builds for sm_80 and sm_90
    with every kept configuration and no more spills than the unfolded one's bound (DQKWG_BK128_SPILL)."""
    from mindspeed_ops import compile_check as cc
    from tests.unit_tests.gdn.test_bwd_dqkwg import DQKWG_BK128_SPILL

    T, BT, H, HV, K = 4096, 64, 16, 32, 128
    dt = torch.float16  # recorded in fp16, built as its bf16 twin (the interpreter shim widens bf16)
    q, w, v = (torch.empty(1, T, n, K, dtype=dt) for n in (H, HV, HV))
    G, h = torch.empty(1, T, HV), torch.empty(1, T // BT, HV, K, K, dtype=dt)
    with cc.Recorder(dry=True) as rec:
        bwd_dqkwg.forward(q, q, v, v, h, h, G, v, w, None, None, None, BT, dw_dtype=dt,
                          q_rstd=torch.empty(1, T, H))
    launches = [cc.as_bf16(la) for la in cc.dedupe(rec.launches)]
    assert launches and all("NORM_DQ=True" in la.label() for la in launches)
    assert_compiled(cc.compile_launches(launches, archs=(80, 90), jobs=2), lambda r: DQKWG_BK128_SPILL)
