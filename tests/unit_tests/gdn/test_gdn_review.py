"""Review regressions for the GDN family (SPEC 1.10): custom-op aliasing of the backward op, stage
functions on the reference path (CPU without the interpreter), strided offsets/chunk tables for every
stage, and torch.compile with symbolic sizes and varlen."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops import api
from mindspeed_ops.api.triton.chunk_bwd_dqkwg import chunk_bwd_dqkwg
from mindspeed_ops.api.triton.chunk_bwd_dv_local import chunk_bwd_dv_local
from mindspeed_ops.api.triton.chunk_fwd_o import chunk_fwd_o
from mindspeed_ops.api.triton.chunk_gated_delta_rule_bwd_dhu import chunk_gated_delta_rule_bwd_dhu
from mindspeed_ops.api.triton.chunk_gated_delta_rule_fwd_h import chunk_gated_delta_rule_fwd_h
from mindspeed_ops.api.triton.chunk_local_cumsum import chunk_local_cumsum
from mindspeed_ops.api.triton.chunk_scaled_dot_kkt import chunk_scaled_dot_kkt_fwd
from mindspeed_ops.api.triton.solve_tril import solve_tril
from mindspeed_ops.api.triton.utils import prepare_chunk_indices
from mindspeed_ops.api.triton.wy_fast import prepare_wy_repr_bwd, recompute_w_u_fwd
from mindspeed_ops.testing import assert_linear_attention_compiles
from tests.conftest import DEVICE

BT = 32
CU = [0, 37, 70, 71, 100]


def _inputs(B=1, T=100, H=1, HV=2, K=16, V=16, N=None, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen).to(DEVICE)
    q, k = F.normalize(r(B, T, H, K), dim=-1), F.normalize(r(B, T, H, K), dim=-1)
    v, beta = r(B, T, HV, V), torch.sigmoid(r(B, T, HV))
    g = F.logsigmoid(r(B, T, HV))
    return q, k, v, g, beta, r(N or B, HV, K, V)


def _pipeline(q, k, v, g, beta, h0, **kw):
    """Every GDN stage function once (forward and backward stages), outputs in call order."""
    do = torch.ones_like(v) * 0.5
    G = chunk_local_cumsum(g, BT, **kw)
    A = chunk_scaled_dot_kkt_fwd(k, g=G, beta=beta, chunk_size=BT, **kw)
    Ai = solve_tril(A, **kw)
    w, u = recompute_w_u_fwd(k, v, beta, Ai, g=G, **kw)
    h, vn, fs = chunk_gated_delta_rule_fwd_h(k, w, u, g=G, initial_state=h0, output_final_state=True, chunk_size=BT,
                                             **kw)
    o = chunk_fwd_o(q, k, vn, h, g=G, chunk_size=BT, **kw)
    dvl = chunk_bwd_dv_local(q, k, do, g=G, chunk_size=BT, **kw)
    dh, dh0, dv2 = chunk_gated_delta_rule_bwd_dhu(q, k, w, do, dvl, g=G, h0=h0, dht=fs, chunk_size=BT, **kw)
    dqkwg = chunk_bwd_dqkwg(q, k, vn, do, h, dh, g=G, dv=dv2, w=w, chunk_size=BT, **kw)
    wyb = prepare_wy_repr_bwd(k, v, G, beta, Ai, w, dv2, chunk_size=BT, **kw)
    return (G, A, Ai, w, u, h, vn, fs, o, dvl, dh, dh0, dv2, *dqkwg, *wyb)


def test_bwd_op_without_g_and_h0_returns_distinct_tensors():
    """The backward op returned one placeholder tensor for both absent gradients (dg, dh0): two
    aliased returns, rejected by torch.library (so torch.compile's backward failed with g=None and
    no initial_state)."""
    q, k, v, _, beta, _ = _inputs(T=20)
    do = torch.randn_like(v)
    o, _, G, Ainv, *_ = torch.ops.mindspeed_ops.chunk_gated_delta_rule(q, k, v, None, beta, 0.25, None, False, False,
                                                                   None, 16)
    outs = torch.ops.mindspeed_ops.chunk_gated_delta_rule_bwd(do, None, q, k, v, None, beta, G, Ainv, None, 0.25,
                                                              False, None, 16)
    assert outs[3].numel() == 0 and outs[5].numel() == 0
    assert outs[3] is not outs[5]


def test_compile_backward_without_g_and_h0():
    q, k, v, _, beta, _ = _inputs(T=20)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, beta)]
    f = torch.compile(lambda q, k, v, b: api.chunk_gated_delta_rule(q, k, v, None, b, use_qk_l2norm_in_kernel=True,
                                                                    chunk_size=16)[0], fullgraph=True)
    f(*leaves).pow(2).sum().backward()
    eager = [t.clone().requires_grad_(True) for t in (q, k, v, beta)]
    api.chunk_gated_delta_rule(*eager[:3], None, eager[3], use_qk_l2norm_in_kernel=True,
                               chunk_size=16)[0].pow(2).sum().backward()
    for a, b in zip(leaves, eager):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_stage_outputs_never_require_grad_on_reference_path(monkeypatch):
    """SPEC 1.10: stage functions are not differentiable. On CPU without the interpreter they run the
    references, whose outputs required grad when the inputs did."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ins = [t.requires_grad_(True) for t in _inputs(T=40, N=1)]
    outs = _pipeline(*ins)
    assert all(o is None or not o.requires_grad for o in outs), [o is not None and o.requires_grad for o in outs]


def test_strided_offsets_and_chunk_indices_every_stage():
    """Strided ``cu_seqlens`` and a strided ``chunk_indices`` table (int64 and int32) give bitwise the
    results of contiguous ones for every stage and the full operators."""
    cu = torch.tensor(CU, dtype=torch.int32)
    cu_s = torch.stack([cu, -cu], 1).to(DEVICE).reshape(-1)[::2]
    idx = prepare_chunk_indices(cu, BT).long()
    idx_s = torch.stack([idx, -idx], 1).to(DEVICE)[:, 0]
    assert not cu_s.is_contiguous() and not idx_s.is_contiguous()
    ins = _inputs(N=len(CU) - 1)
    want = _pipeline(*ins, cu_seqlens=cu.to(DEVICE))
    got = _pipeline(*ins, cu_seqlens=cu_s, chunk_indices=idx_s)
    for i, (a, b) in enumerate(zip(want, got)):
        assert (a is None and b is None) or torch.equal(a, b), i
    kw = dict(initial_state=ins[5], output_final_state=True, chunk_size=BT)
    for a, b in zip(api.chunk_gated_delta_rule(*ins[:5], cu_seqlens=cu.to(DEVICE), **kw),
                    api.chunk_gated_delta_rule(*ins[:5], cu_seqlens=cu_s, chunk_indices=idx_s.int(), **kw)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dynamic", [True, None])
def test_compile_sizes_change_and_varlen(dynamic):
    """torch.compile(fullgraph=True) with T/B changing between calls (dynamic=True and the default
    automatic dynamic shapes), then varlen with a different number of sequences: same values and
    gradients as eager."""
    assert_linear_attention_compiles(api.chunk_gated_delta_rule, lambda **kw: _inputs(**kw, K=16), 16, 30, dynamic)


def test_stage_functions_follow_a_global_reference_request(monkeypatch):
    """use_backend('reference') and MINDSPEED_OPS_BACKEND=reference also route the stage functions to
    their float references (they are plain functions, not registered ops)."""
    from mindspeed_ops import backends
    from mindspeed_ops.api.triton.chunk_local_cumsum import chunk_local_cumsum
    from mindspeed_ops.ops.gdn import common, reference as gref

    g = torch.nn.functional.logsigmoid(torch.randn(1, 40, 2))
    want = gref.chunk_local_cumsum_ref(g.double(), 16).float()
    with backends.use_backend("reference"):
        assert not common.use_triton(g.device)
        torch.testing.assert_close(chunk_local_cumsum(g, 16), want)
    monkeypatch.setenv(backends.ENV_BACKEND, "reference")
    assert not common.use_triton(g.device)
    monkeypatch.delenv(backends.ENV_BACKEND)
    assert common.use_triton(g.device) == backends.backend_status("triton", g.device)[0]


def test_cu_seqlens_list_is_a_type_error_naming_it():
    """Offsets given as a Python list: every stage function raised AttributeError ('list' object has no
    attribute 'device') from its device check instead of SPEC 0.7's TypeError naming the argument."""
    from mindspeed_ops.api import chunk_kda_fwd_intra

    T, K, V, HV = 40, 16, 16, 2
    k, q, w = (torch.randn(1, T, 1, K, device=DEVICE) for _ in range(3))
    u, do = torch.randn(1, T, HV, V, device=DEVICE), torch.randn(1, T, HV, V, device=DEVICE)
    g, beta = torch.randn(1, T, HV, device=DEVICE), torch.rand(1, T, HV, device=DEVICE)
    A = torch.zeros(1, T, HV, BT, device=DEVICE)
    h = torch.zeros(2, HV, K, V, device=DEVICE)
    gk = torch.randn(1, T, HV, K, device=DEVICE)
    cu = [0, T]
    calls = {
        "chunk_local_cumsum": lambda: chunk_local_cumsum(g, BT, cu_seqlens=cu),
        "chunk_scaled_dot_kkt_fwd": lambda: chunk_scaled_dot_kkt_fwd(k, g=g, beta=beta, cu_seqlens=cu, chunk_size=BT),
        "solve_tril": lambda: solve_tril(A, cu_seqlens=cu),
        "recompute_w_u_fwd": lambda: recompute_w_u_fwd(k, u, beta, A, g=g, cu_seqlens=cu),
        "chunk_gated_delta_rule_fwd_h": lambda: chunk_gated_delta_rule_fwd_h(k, w.expand(1, T, HV, K), u, g=g,
                                                                             chunk_size=BT, cu_seqlens=cu),
        "chunk_fwd_o": lambda: chunk_fwd_o(q, k, u, h, g=g, cu_seqlens=cu, chunk_size=BT),
        "chunk_bwd_dv_local": lambda: chunk_bwd_dv_local(q, k, do, g=g, cu_seqlens=cu, chunk_size=BT),
        "chunk_kda_fwd_intra": lambda: chunk_kda_fwd_intra(q, k, u, gk, beta, cu_seqlens=cu, chunk_size=BT),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=f"{name}: cu_seqlens must be a torch.Tensor, got list"):
            call()
