"""The in-kernel qk l2norm's saved form (``ops.gdn.qk_norm``), GDN and KDA.

With ``use_qk_l2norm_in_kernel`` the forward ops also return ``q̂, k̂`` (in the inputs' dtype) and their fp32
rstd, autograd saves those in place of the raw q and k, and the backward runs on them instead of normalizing q
and k again (two l2norm launches a step fewer). Checked here:

1. The four outputs are the l2norm's of q and k, bitwise (and empty tensors without the l2norm).
2. The backward op given them is bitwise equal to the backward op given the raw q, k (which normalizes them
   itself, by the same kernels), on every gradient: fp32/fp16, GVA, varlen with tail tokens, g=None (GDN).
3. The reference backend's backward given them (autograd without the l2norm, then its closed-form backward)
   agrees with autograd through the whole reference.
4. Autograd keeps q̂/k̂, not the raw q/k.
5. Bad ``q_rstd``/``k_rstd`` raise naming the argument.
"""
import pytest
import torch
import torch.nn.functional as F

import mindspeed_ops
from mindspeed_ops import api, backends
from mindspeed_ops.testing import assert_close
from tests.conftest import DEVICE

ops = torch.ops.mindspeed_ops
BT = {"gdn": 16, "kda": 32}  # the smallest chunk size of each op


def _inputs(kind, T, H, HV, K, V, dtype, seed=0, with_g=True, cu=None):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)
    q, k, v = r(1, T, H, K), r(1, T, H, K) * 3.0, r(1, T, HV, V)
    gshape = (1, T, HV) if kind == "gdn" else (1, T, HV, K)
    g = F.logsigmoid(r(*gshape)) / 2 if with_g else None
    beta = torch.sigmoid(r(1, T, HV))
    N = 1 if cu is None else len(cu) - 1
    h0 = r(N, HV, K, V)
    do, dht = r(1, T, HV, V), r(N, HV, K, V)
    q, k, v, beta, do = (t.to(DEVICE, dtype) for t in (q, k, v, beta, do))
    return q, k, v, None if g is None else g.to(DEVICE), beta, h0.to(DEVICE), do, dht.to(DEVICE)


def _forward(kind, q, k, v, g, beta, h0, cu, BT, use_l2=True):
    fwd = ops.chunk_gated_delta_rule if kind == "gdn" else ops.chunk_kda
    return fwd(q, k, v, g, beta, 0.25, h0, True, use_l2, cu, BT)


def _backward(kind, outs, do, dht, q, k, v, g, beta, h0, cu, BT, rstd=None):
    if kind == "gdn":
        saved = outs[2:4]  # G, Ainv
        return ops.chunk_gated_delta_rule_bwd(do, dht, q, k, v, g, beta, *saved, h0, 0.25, True, cu, BT, None,
                                              *(rstd or (None, None)))
    saved = outs[2:5]  # G, Akk, Aqk
    return ops.chunk_kda_bwd(do, dht, q, k, v, g, beta, *saved, h0, 0.25, True, cu, BT, None, *(rstd or (None, None)))


CASES = [  # (kind, T, H, HV, K, V, dtype, cu, BT, with_g)
    ("gdn", 40, 2, 4, 32, 16, torch.float32, None, 16, True),
    ("gdn", 45, 1, 2, 60, 24, torch.float16, [0, 13, 13, 38], 16, True),  # varlen, empty sequence, tail tokens
    ("gdn", 33, 2, 2, 32, 16, torch.float32, None, 16, False),             # g = None
    ("kda", 40, 1, 2, 32, 16, torch.float32, [0, 17, 40], 32, True),
    ("kda", 37, 2, 2, 32, 16, torch.float16, None, 32, True),
]


@pytest.mark.parametrize("kind, T, H, HV, K, V, dtype, cu, BT, with_g", CASES)
def test_saved_normalized_qk_backward_is_bitwise_the_recomputing_one(kind, T, H, HV, K, V, dtype, cu, BT, with_g):
    q, k, v, g, beta, h0, do, dht = _inputs(kind, T, H, HV, K, V, dtype, with_g=with_g, cu=cu)
    cu_t = None if cu is None else torch.tensor(cu, device=DEVICE)
    outs = _forward(kind, q, k, v, g, beta, h0, cu_t, BT)
    qn, kn, rq, rk = outs[-4:]
    l2 = backends.implementation("l2norm", q.device)
    for name, got, want in zip(("qn", "q_rstd", "kn", "k_rstd"), (qn, rq, kn, rk), (*l2.forward(q, 1e-6, None),
                                                                                   *l2.forward(k, 1e-6, None))):
        assert got.dtype == want.dtype and torch.equal(got, want), name
    recomputed = _backward(kind, outs, do, dht, q, k, v, g, beta, h0, cu_t, BT)
    saved = _backward(kind, outs, do, dht, qn, kn, v, g, beta, h0, cu_t, BT, rstd=(rq, rk))
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), saved, recomputed):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert torch.isfinite(saved[0]).all() and torch.isfinite(saved[1]).all()


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_without_l2norm_the_four_outputs_are_empty(kind):
    q, k, v, g, beta, h0, _, _ = _inputs(kind, 20, 1, 1, 16, 16, torch.float32)
    outs = _forward(kind, q, k, v, g, beta, h0, None, BT[kind], use_l2=False)
    assert all(t.numel() == 0 for t in outs[-4:])


@pytest.mark.parametrize("kind, cu", [("gdn", None), ("gdn", [0, 9, 30]), ("kda", [0, 9, 30])])
def test_reference_backward_through_the_saved_norm(kind, cu):
    """The reference backend's backward on q̂/k̂ and rstd (autograd without the l2norm, then its closed form)
    agrees with autograd through the whole reference (raw q/k, no rstd) to fp32 rounding."""
    q, k, v, g, beta, h0, do, dht = _inputs(kind, 34, 1, 2, 16, 8, torch.float32, seed=3, cu=cu)
    cu_t = None if cu is None else torch.tensor(cu, device=DEVICE)
    with mindspeed_ops.use_backend("reference"):
        outs = _forward(kind, q, k, v, g, beta, h0, cu_t, BT[kind])
        qn, kn, rq, rk = outs[-4:]
        want = _backward(kind, outs, do, dht, q, k, v, g, beta, h0, cu_t, BT[kind])
        got = _backward(kind, outs, do, dht, qn, kn, v, g, beta, h0, cu_t, BT[kind], rstd=(rq, rk))
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
        assert_close(name, b.double(), a, 1e-5)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_autograd_keeps_the_normalized_qk_not_the_raw_ones(kind):
    q, k, v, g, beta, h0, do, _ = _inputs(kind, 20, 1, 1, 16, 16, torch.float32)
    q, k = q.requires_grad_(), k.requires_grad_()
    f = api.chunk_gated_delta_rule if kind == "gdn" else api.chunk_kda
    o, _ = f(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, chunk_size=BT[kind])
    ptrs = {t.data_ptr() for t in o.grad_fn.saved_tensors if t is not None}
    assert q.data_ptr() not in ptrs and k.data_ptr() not in ptrs
    o2, _ = f(q, k, v, g, beta, use_qk_l2norm_in_kernel=False, chunk_size=BT[kind])
    assert q.data_ptr() in {t.data_ptr() for t in o2.grad_fn.saved_tensors if t is not None}


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_bad_rstd_arguments_raise(kind):
    q, k, v, g, beta, h0, do, dht = _inputs(kind, 20, 1, 1, 16, 16, torch.float32)
    bt = BT[kind]
    outs = _forward(kind, q, k, v, g, beta, h0, None, bt)
    qn, kn, rq, rk = outs[-4:]
    with pytest.raises(ValueError, match="given together"):
        _backward(kind, outs, do, dht, qn, kn, v, g, beta, h0, None, bt, rstd=(rq, None))
    with pytest.raises(ValueError, match="k_rstd must have shape"):
        _backward(kind, outs, do, dht, qn, kn, v, g, beta, h0, None, bt, rstd=(rq, rk[:, :5]))
    with pytest.raises(TypeError, match="q_rstd must have dtype"):
        _backward(kind, outs, do, dht, qn, kn, v, g, beta, h0, None, bt, rstd=(rq.half(), rk))
    bwd = ops.chunk_gated_delta_rule_bwd if kind == "gdn" else ops.chunk_kda_bwd
    saved = outs[2:4] if kind == "gdn" else outs[2:5]
    with pytest.raises(ValueError, match="use_qk_l2norm_in_kernel=False"):
        bwd(do, dht, qn, kn, v, g, beta, *saved, h0, 0.25, False, None, bt, None, rq, rk)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_forward_only_calls_do_not_write_the_normalized_qk(kind, monkeypatch):
    """The public function asks for q̂/k̂ only where autograd records the call; the op with
    ``return_qk_norm=False`` returns empty tensors there, the same o, and (under autograd all the same) saves the raw
    q/k, whose backward normalizes again: the same gradients, bitwise."""
    from mindspeed_ops.ops.gdn import qk_norm
    writes = []
    real = qk_norm.normalize

    def spy(*a, **kw):
        if len(a) < 4 or a[3] is None:  # a forward's call (no saved rstd given)
            writes.append(kw.get("write", True))
        return real(*a, **kw)
    monkeypatch.setattr(qk_norm, "normalize", spy)
    q, k, v, g, beta, h0, do, _ = _inputs(kind, 20, 1, 2, 16, 16, torch.float32)
    f = api.chunk_gated_delta_rule if kind == "gdn" else api.chunk_kda
    kw = dict(use_qk_l2norm_in_kernel=True, chunk_size=BT[kind])
    o_nograd, _ = f(q, k, v, g, beta, **kw)
    with torch.no_grad():
        f(q, k, v, g, beta.requires_grad_(), **kw)
    assert writes == [False, False]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, beta)]
    o, _ = f(leaves[0], leaves[1], leaves[2], g, leaves[3], **kw)
    assert writes[-1] is True and torch.equal(o, o_nograd)
    (o * do).sum().backward()
    want = [t.grad for t in leaves]

    fwd = ops.chunk_gated_delta_rule if kind == "gdn" else ops.chunk_kda
    outs = fwd(q, k, v, g, beta, 0.25, None, False, True, None, BT[kind], None, False)
    assert all(t.numel() == 0 for t in outs[-4:]) and torch.equal(outs[0], o_nograd)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, beta)]
    o2 = fwd(leaves[0], leaves[1], leaves[2], g, leaves[3], 0.25, None, False, True, None, BT[kind], None, False)[0]
    (o2 * do).sum().backward()
    for name, a, b in zip(("dq", "dk", "dv", "dbeta"), (t.grad for t in leaves), want):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kind, cu, T", [("gdn", [0, 9, 20], 24), ("kda", [0, 9, 20], 24), ("gdn", [0, 0, 0], 5)])
def test_reference_backend_nan_tail_tokens_get_zero_gradients(kind, cu, T):
    """Varlen tail tokens (past ``cu_seqlens[-1]``) holding NaN: zero dq/dk there on the reference backend too (its
    closed-form l2norm backward over q̂ = NaN rows gave NaN; fresh-eyes review), finite everywhere else."""
    q, k, v, g, beta, _, _, _ = _inputs(kind, T, 1, 2, 16, 16, torch.float32, seed=5)
    for t in (q, k, v):
        t[:, cu[-1]:] = float("nan")
    leaves = [t.requires_grad_() for t in (q, k, v, g, beta)]
    f = api.chunk_gated_delta_rule if kind == "gdn" else api.chunk_kda
    with mindspeed_ops.use_backend("reference"):
        o, _ = f(*leaves, use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor(cu, device=DEVICE),
                 chunk_size=BT[kind])
        (o[:, :cu[-1]].sum() + 0 * o[:, cu[-1]:].nan_to_num().sum()).backward()
    for name, t in (("dq", leaves[0]), ("dk", leaves[1])):
        assert (t.grad[:, cu[-1]:] == 0).all() and torch.isfinite(t.grad).all(), name


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_views_of_one_projection_save_the_raw_qk(kind):
    """q, k and v split from one projection (the HF Qwen3-Next layout): the saved v keeps their storage alive, so
    the raw q, k are saved (q̂, k̂ would be memory on top) and the backward normalizes again; separate tensors save
    q̂, k̂. Same gradients either way, bitwise."""
    H, HV, K, V, T = 1, 2, 16, 16, 20
    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(1, T, 2 * H * K + HV * V, generator=gen).to(DEVICE)
    g = F.logsigmoid(torch.randn(1, T, HV, *(() if kind == "gdn" else (K,)), generator=gen)).to(DEVICE)
    beta = torch.rand(1, T, HV, generator=gen).to(DEVICE)
    f = api.chunk_gated_delta_rule if kind == "gdn" else api.chunk_kda
    grads = []
    for split in (True, False):
        leaf = qkv.clone().requires_grad_()
        src = leaf if split else leaf.clone()  # not split: three separate tensors
        q, k, v = torch.split(src, [H * K, H * K, HV * V], dim=-1)
        if not split:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        q, k, v = q.reshape(1, T, H, K), k.reshape(1, T, H, K), v.reshape(1, T, HV, V)
        o, _ = f(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, chunk_size=BT[kind])
        ptrs = {t.untyped_storage().data_ptr() for t in o.grad_fn.saved_tensors if t is not None}
        assert (q.untyped_storage().data_ptr() in ptrs) == split
        o.sum().backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])


def test_compiled_calls_keep_the_recomputing_backward(monkeypatch):
    """Under torch.compile the public function asks for no q̂/k̂ (views of one projection cannot be told apart
    there, and saving q̂/k̂ for them would add memory): the compiled op gets return_qk_norm=False."""
    from mindspeed_ops.ops.gdn import qk_norm
    seen = []
    real = qk_norm.save_normalized

    def spy(*a):
        seen.append(real(*a))
        return seen[-1]
    monkeypatch.setattr(qk_norm, "save_normalized", spy)
    q, k, v, g, beta, _, _, _ = _inputs("gdn", 20, 1, 1, 16, 16, torch.float32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, beta)]
    f = torch.compile(lambda q, k, v, b: api.chunk_gated_delta_rule(q, k, v, g, b, use_qk_l2norm_in_kernel=True,
                                                                    chunk_size=16)[0], fullgraph=True)
    f(*leaves).sum().backward()
    assert seen == [False] and all(t.grad is not None for t in leaves)
