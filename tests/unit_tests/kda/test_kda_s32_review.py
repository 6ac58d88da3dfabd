"""Review tests of the thirty-second session's KDA kernel changes (SPEC 1.11): ``kda_aqk_fwd_kernel``'s ``KC`` path
(the row block's factored q/k tiles made once, K-wide, for 16-bit inputs with K <= 128) and
``kda_bwd_intra_kernel``'s diagonal block in two halvings (``_bwd_diag_level``) with one exponential per entry in
its exact 4x4 groups.

``test_aqk_small_key_dim_16bit_compiles_for_gpu`` failed at 2bc8a86: ``aqk_column_width`` returned
``next_power_of_2(K)`` with no floor of 16, so for 16-bit inputs with K <= 8 the KC path's ``tl.dot`` had an inner
dimension of 1..8 and Triton's NVIDIA backend rejects it (``Input shapes should have ... K >= 16``); every other
kernel of a KDA training step compiles at K = 8 (their key tiles are ``max(16, ...)``), and so did this one
before (BK = 16). The interpreter accepts any dot size, so only a compile-only check sees it. Fixed: KC >= 16."""
import warnings
from unittest import mock

import pytest
import torch

from mindspeed_ops import compile_check as cc
from mindspeed_ops.ops.kda import intra
from mindspeed_ops.ops.kda import reference as R
from mindspeed_ops.ops.kda.bwd import chunk_kda_bwd_intra
from mindspeed_ops.testing import assert_close, rel_rms, threshold
from tests.conftest import COMPILE_ONLY_MARKS, DEVICE, assert_compiled
from tests.unit_tests.kda.test_kda_aqk_review import _check, _inputs, _ref, _run
from tests.unit_tests.kda.test_kda_stages import _cu, _dev, _pipeline


@pytest.mark.parametrize("K", [pytest.param(8, marks=COMPILE_ONLY_MARKS)])
def test_aqk_small_key_dim_16bit_compiles_for_gpu(K):
    """fp16, K = 8 (accepted by the API; KC = 8): the Aqk launch must build for sm_90."""
    q = torch.empty(1, 64, 1, K, dtype=torch.float16)
    k, g = torch.empty_like(q), torch.empty(1, 64, 1, K)
    with cc.Recorder(dry=True) as rec:
        intra.aqk_forward(q, k, g, 1.0, None, None, 64, beta=torch.empty(1, 64, 1))
    launches = [la for la in rec.launches if la.qualname == "kda_aqk_fwd_kernel"]
    assert launches
    assert_compiled(cc.compile_launches(launches, archs=(90,), jobs=1), lambda r: None)


@pytest.mark.parametrize("K,BT,cu", [(60, 32, [0, 3, 17, 50, 51, 70]), (100, 64, [0, 1, 9, 40])])
def test_aqk_kc_path_masked_channels_varlen_gva(K, BT, cu):
    """fp16 through the KC path with masked channels (K = 60 -> KC 64, K = 100 -> KC 128): sequences shorter than a
    16-row block (1, 3, 8), GVA (H 1, HV 2), hard resets, l2norm factors and M; against the float64 references, and
    within rounding of the BK-tiled path (KC = 0) on the same inputs."""
    assert intra.aqk_column_width(K, torch.float16) in (64, 128) and intra.aqk_column_width(K, torch.float32) == 0
    q, k, G, beta, rq, rk = _inputs(cu[-1] + 3, 1, 2, K, cu, BT, torch.float16, seed=K)
    A, M = _run(q, k, G, beta, 0.3, cu, BT, rq, rk)
    Ar, Mr = _ref(q, k, G, beta, 0.3, cu, BT, rq, rk)
    _check(A, M, Ar, Mr, torch.float16)
    assert (A[:, cu[-1]:] == 0).all() and (M[:, cu[-1]:] == 0).all()
    with mock.patch.object(intra, "aqk_column_width", lambda K_, dt: 0):
        A0, M0 = _run(q, k, G, beta, 0.3, cu, BT, rq, rk)
    assert rel_rms(A.double(), A0.double()) <= 1e-3 and rel_rms(M.double(), M0.double()) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_aqk_zero_gates_and_single_token(dtype):
    """G = 0 (no decay: every factor exactly 1) with K = 24 (KC 32 for fp16), and a T = 1 sequence."""
    for T, cu, K in ((64, [0, 64], 24), (1, [0, 1], 60)):
        q, k, G, beta, rq, rk = _inputs(T, 1, 2, K, cu, 64, dtype, seed=T)
        G = torch.zeros_like(G)
        A, M = _run(q, k, G, beta, 0.5, cu, 64, rq, rk)
        Ar, Mr = _ref(q, k, G, beta, 0.5, cu, 64, rq, rk)
        _check(A, M, Ar, Mr, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_intra_bwd_halvings_hard_gates_short_sequences(dtype):
    """The diagonal block's halvings and exact groups with -1000 resets (G down to about -3400) and gates of
    magnitude ~1/0.01, varlen with sequences of 3 and 1 rows (partial 4- and 8-row sub-blocks), a tail, GVA,
    chunk size 32, K = 60 (partial key tile): finite and within LA-g of the float64 reference."""
    cu = [0, 3, 17, 50, 51, 70]
    p = _pipeline(1, 74, 1, 2, 60, 8, 32, cu=torch.tensor(cu), hard=True, s=0.01, seed=60)
    q, k, beta = (_dev(p[n], dtype) for n in ("q", "k", "beta"))
    G, dAq, dAm = (_dev(p[n], torch.float32) for n in ("G", "dAq", "dAm"))
    assert G.min() < -1000
    out = chunk_kda_bwd_intra(q, k, G, beta, dAq, dAm, _cu(cu))
    refs = R.chunk_kda_bwd_intra_ref(*(t.double() for t in (q, k, G, beta, dAq, dAm)), _cu(cu))
    for name, a, b in zip(("dq", "dk", "db", "dG"), refs, out):
        assert torch.isfinite(b).all(), name
        assert_close(name, a, b, threshold("LA-g", dtype))
        assert torch.equal(b[:, 70:], torch.zeros_like(b[:, 70:])), name


def test_intra_bwd_rows_causal_bitwise_at_sub_block_boundaries():
    """With dAq, dAm zero from row P on (a loss on rows < P), changing q, k, beta, G (non-increasing, -5000
    resets) at rows >= P leaves dq, dk, db, dG of rows < P bitwise unchanged, for P at and around every 4-, 8- and
    16-row boundary the halvings factor through."""
    T, K, BT = 32, 24, 32
    p = _pipeline(1, T, 1, 1, K, 8, BT, hard=True, s=0.05, seed=5)
    gen = torch.Generator().manual_seed(1)
    dtype = torch.float16
    q, k, beta = (_dev(p[n], dtype) for n in ("q", "k", "beta"))
    G, dAq, dAm = (_dev(p[n], torch.float32) for n in ("G", "dAq", "dAm"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for P in (1, 4, 5, 8, 9, 12, 16, 17, 20, 24, 28):
            a, m = dAq.clone(), dAm.clone()
            a[:, P:] = 0
            m[:, P:] = 0
            o0 = chunk_kda_bwd_intra(q, k, G, beta, a, m)
            q2, k2, b2, G2 = q.clone(), k.clone(), beta.clone(), G.clone()
            q2[:, P:] = torch.randn(q2[:, P:].shape, generator=gen).to(dtype).to(DEVICE)
            k2[:, P:] = torch.randn(k2[:, P:].shape, generator=gen).to(dtype).to(DEVICE)
            b2[:, P:] = torch.rand(b2[:, P:].shape, generator=gen).to(dtype).to(DEVICE)
            tail = G2[:, P - 1:P].cpu() - 50 * torch.rand(G2[:, P:].shape, generator=gen).cumsum(1)
            tail[torch.rand(tail.shape, generator=gen) < 0.1] = -5000.0
            G2[:, P:] = torch.cummin(tail, 1).values.to(DEVICE)
            o1 = chunk_kda_bwd_intra(q2, k2, G2, b2, a, m)
            for name, x, y in zip(("dq", "dk", "db", "dG"), o0, o1):
                assert torch.equal(x[:, :P], y[:, :P]), f"{name}: rows < {P} changed"
