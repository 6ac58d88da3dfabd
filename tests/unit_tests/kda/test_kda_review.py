"""Review regressions for the KDA family (SPEC 1.11): stage functions on the reference path (CPU without
the interpreter) return outputs that never require grad; torch.compile with changing sizes and varlen."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops import api
from mindspeed_ops.api.triton.chunk_kda_bwd import chunk_kda_bwd_wy_dqkg_fused
from mindspeed_ops.api.triton.chunk_kda_fwd_intra import chunk_kda_fwd_intra
from mindspeed_ops.ops.kda.bwd import chunk_kda_bwd_dav, chunk_kda_bwd_intra
from mindspeed_ops.ops.kda.fwd_o import chunk_kda_fwd_o
from mindspeed_ops.testing import assert_linear_attention_compiles
from tests.conftest import DEVICE


def _inputs(B=1, T=40, H=1, HV=2, K=16, V=16, N=None, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen).to(DEVICE)
    q, k = F.normalize(r(B, T, H, K), dim=-1), F.normalize(r(B, T, H, K), dim=-1)
    return q, k, r(B, T, HV, V), F.logsigmoid(r(B, T, HV, K)), torch.sigmoid(r(B, T, HV)), r(N or B, HV, K, V)


def test_stage_outputs_never_require_grad_on_reference_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, g, beta, h0 = (t.requires_grad_(True) for t in _inputs())
    BT = 32
    G = api.chunk_local_cumsum(g.detach(), BT).requires_grad_(True)
    w, u, qg, kg, Aqk, Akk = chunk_kda_fwd_intra(q, k, v, G, beta, chunk_size=BT, output_qg=True)
    NT = 2
    h = torch.randn(1, NT, 2, 16, 16, device=DEVICE, requires_grad=True)
    do = torch.randn_like(v, requires_grad=True)
    o = chunk_kda_fwd_o(q, v, h, G, Aqk, chunk_size=BT)
    dav = chunk_kda_bwd_dav(v, do, Aqk)
    wy = chunk_kda_bwd_wy_dqkg_fused(q, k, v, v, G, beta, Akk, h, do, h, v, chunk_size=BT)
    intra = chunk_kda_bwd_intra(q, k, G, beta, wy[5], wy[5])
    outs = (w, u, qg, kg, Aqk, Akk, o, *dav, *wy, *intra)
    assert all(t is None or not t.requires_grad for t in outs), [t is not None and t.requires_grad for t in outs]


@pytest.mark.parametrize("dynamic", [True, None])
def test_compile_sizes_change_and_varlen(dynamic):
    assert_linear_attention_compiles(api.chunk_kda, _inputs, 32, 40, dynamic)
