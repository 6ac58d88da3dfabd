"""Review tests of ``kda_aqk_fwd_kernel`` (``intra.aqk_forward``; SPEC 1.11): every sequence length 1..BT,
bitwise row causality of ``Aqk`` and ``M`` at every row of the diagonal block's sub-block boundaries (the 8- and
4-row halvings factor through rows 4, 8, 12), and no writes outside a program's own sequence (subset chunk
table, poisoned outputs)."""
from unittest import mock

import pytest
import torch

from mindspeed_ops.ops.gdn.common import build_chunk_indices
from mindspeed_ops.ops.gdn.reference_wy import chunk_scaled_dot_kkt_fwd_ref
from mindspeed_ops.ops.kda import intra
from mindspeed_ops.ops.kda.reference import kda_aqk_ref
from mindspeed_ops.testing import rel_rms
from tests.conftest import DEVICE


def _inputs(T, H, HV, K, cu, BT, dtype, *, hard=0.05, seed=0):
    """q, k in ``dtype``; G the chunk-local cumsum of log-sigmoid gates with -1000 on ``hard`` of the entries;
    beta, rq, rk fp32."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, K, generator=gen))
    g = torch.where(torch.rand(1, T, HV, K, generator=gen) < hard, torch.full_like(g, -1000.0), g)
    G = torch.zeros_like(g)
    for bos, eos in zip(cu[:-1], cu[1:]):
        for s in range(bos, eos, BT):
            G[:, s:min(s + BT, eos)] = g[:, s:min(s + BT, eos)].double().cumsum(1).float()
    beta = torch.rand(1, T, HV, generator=gen)
    rq, rk = torch.rand(1, T, H, generator=gen) + 0.5, torch.rand(1, T, H, generator=gen) + 0.5
    return q.to(dtype), k.to(dtype), G, beta, rq, rk


def _ref(q, k, G, beta, scale, cu, BT, rq, rk):
    """float64 ``Aqk``, ``M`` from the package's references (``kda_aqk_ref``, the per-channel kkt reference), with
    the l2norm factors applied to q, k."""
    qq, kk = q.double() * rq.double()[..., None], k.double() * rk.double()[..., None]
    cu_t = torch.tensor(cu, dtype=torch.int64)
    A = kda_aqk_ref(qq, kk, G.double(), scale, cu_t, BT)
    M = chunk_scaled_dot_kkt_fwd_ref(kk, gk=G.double(), beta=beta.double(), cu_seqlens=cu_t, chunk_size=BT)
    return A, M


def _run(q, k, G, beta, scale, cu, BT, rq, rk):
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    A, _, _, M = intra.aqk_forward(*(t.to(DEVICE) for t in (q, k, G)), scale, cu, cu_t, BT,
                                   rq=rq.to(DEVICE), rk=rk.to(DEVICE), beta=beta.to(DEVICE))
    return A.cpu(), M.cpu()


def _check(A, M, Ar, Mr, dtype):
    thr = 2e-6 if dtype == torch.float32 else 2e-3
    for name, o, r in (("Aqk", A, Ar), ("M", M, Mr)):
        assert not torch.isnan(o).any(), name
        assert ((r == 0) & (o.double() != 0)).sum() == 0, f"{name}: nonzero where the reference is 0"
        assert rel_rms(o.double(), r) <= thr, (name, rel_rms(o.double(), r))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("BT", [32, 64])
def test_aqk_every_sequence_length(dtype, BT):
    """Sequences of every length 1..BT (every partial 16-row block and 4-/8-row sub-block), empty ones, tail
    rows, GVA, hard resets, l2norm factors."""
    lens = list(range(1, BT + 1)) + [0, 3, 0]
    cu = [0]
    for L in lens:
        cu.append(cu[-1] + L)
    q, k, G, beta, rq, rk = _inputs(cu[-1] + 5, 1, 2, 16, cu, BT, dtype, seed=BT)
    A, M = _run(q, k, G, beta, 0.25, cu, BT, rq, rk)
    Ar, Mr = _ref(q, k, G, beta, 0.25, cu, BT, rq, rk)
    _check(A, M, Ar, Mr, dtype)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's overflow/NaN warnings (wild inputs)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_aqk_rows_causal_bitwise_at_every_sub_block_boundary(dtype):
    """Rows ``<= i`` of Aqk and M are bitwise unchanged when every input of the later rows of the chunk changes,
    to valid values (more decay, -3000 resets) or to values outside SPEC 1.11 (rising gates, NaN, Inf)."""
    BT, T = 32, 32
    q, k, G, beta, rq, rk = _inputs(T, 1, 2, 16, [0, T], BT, dtype, seed=3)
    A0, M0 = _run(q, k, G, beta, 0.5, [0, T], BT, rq, rk)
    gen = torch.Generator().manual_seed(7)
    for i in list(range(0, 18)) + [19, 20, 23, 24, 27, 28]:
        for wild in (False, True):
            q2, k2, G2, b2, rq2, rk2 = (t.clone() for t in (q, k, G, beta, rq, rk))
            sl = slice(i + 1, T)
            q2[:, sl] = torch.randn(q2[:, sl].shape, generator=gen).to(dtype)
            k2[:, sl] = torch.randn(k2[:, sl].shape, generator=gen).to(dtype)
            if wild:
                G2[:, sl] = 200 * torch.randn(G2[:, sl].shape, generator=gen)
                G2[0, T - 1, 0, 0] = float("nan")
                k2[0, T - 1, 0, 1] = float("inf")
            else:
                G2[:, sl] = G2[:, sl] - 5 * torch.rand(G2[:, sl].shape, generator=gen)
                G2[:, sl][torch.rand(G2[:, sl].shape, generator=gen) < 0.1] = -3000.0
            b2[:, sl] = torch.rand(b2[:, sl].shape, generator=gen)
            rq2[:, sl], rk2[:, sl] = 7.0, 3.0
            A1, M1 = _run(q2, k2, G2, b2, 0.5, [0, T], BT, rq2, rk2)
            for name, x, y in (("Aqk", A0, A1), ("M", M0, M1)):
                assert torch.equal(x[:, :i + 1], y[:, :i + 1]), f"{name}: rows <= {i} changed (wild={wild})"


@pytest.mark.parametrize("BT", [32, 64])
def test_aqk_writes_only_its_sequence(BT):
    """Programs of one sequence (a subset chunk table) write every entry of that sequence's rows and nothing
    else: the other rows keep the NaN the outputs were filled with."""
    cu, T = [0, 5, 21, 70, 100], 107
    q, k, G, beta, rq, rk = _inputs(T, 2, 4, 60, cu, BT, torch.float32, seed=1)
    Ar, Mr = _ref(q, k, G, beta, 0.3, cu, BT, rq, rk)
    full = build_chunk_indices(torch.tensor(cu, dtype=torch.int64), BT)
    class NanTorch:  # intra's torch, with outputs allocated NaN-filled
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*a, **kw):
            return torch.empty(*a, **kw).fill_(float("nan"))

    for n in range(len(cu) - 1):
        sub = full[full[:, 0] == n]

        def table(op, cu_host, cu_seqlens, B, T_, BT_, ci, device=None):
            return sub.shape[0], cu_seqlens.to(torch.int64), sub.to(device=cu_seqlens.device, dtype=torch.int32)

        with mock.patch.object(intra, "chunk_table", table), mock.patch.object(intra, "torch", NanTorch()):
            A, M = _run(q, k, G, beta, 0.3, cu, BT, rq, rk)
        bos, eos = cu[n], cu[n + 1]
        other = torch.ones(T, dtype=torch.bool)
        other[bos:eos] = False
        other[cu[-1]:] = False  # tail rows: zeroed by the launcher
        for name, o, r in (("Aqk", A, Ar), ("M", M, Mr)):
            assert torch.isnan(o[:, other]).all(), f"{name}: sequence {n} wrote rows of another sequence"
            assert (o[:, cu[-1]:] == 0).all(), name
            assert not torch.isnan(o[:, bos:eos]).any(), f"{name}: sequence {n} left entries unwritten"
            assert rel_rms(o[:, bos:eos].double(), r[:, bos:eos]) <= 2e-6, name
