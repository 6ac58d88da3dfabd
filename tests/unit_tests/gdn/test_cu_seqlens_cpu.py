"""The ``cu_seqlens_cpu`` hint of ``chunk_gated_delta_rule`` and ``chunk_kda`` (SPEC 1.10.10, 1.11.3): a host
copy of ``cu_seqlens`` that spares the device->host read of the offsets, in the forward and the backward,
eagerly, through ``torch.ops.mindspeed_ops`` and under ``torch.compile``. Small varlen shapes (a zero-length
sequence and tail tokens) so the interpreter is quick."""
import pytest
import torch
import torch.nn.functional as F

import mindspeed_ops
from mindspeed_ops import api
from mindspeed_ops.testing import assert_compiled_matches_eager
from tests.conftest import DEVICE

ops = torch.ops.mindspeed_ops
T, H, HV, K, V = 40, 1, 2, 16, 16
CU = [0, 13, 13, 37]  # a zero-length sequence and 3 tail tokens
#: family -> (public function, chunk size, per-channel gate)
FAMILIES = {"gdn": (api.chunk_gated_delta_rule, 16, False), "kda": (api.chunk_kda, 32, True)}
OPS = {"gdn": "chunk_gated_delta_rule", "kda": "chunk_kda"}


def _inputs(fam, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)
    per_channel = FAMILIES[fam][2]
    g = F.logsigmoid(r(1, T, HV, K) if per_channel else r(1, T, HV))
    ts = (r(1, T, H, K), r(1, T, H, K), r(1, T, HV, V), g, torch.sigmoid(r(1, T, HV)), r(len(CU) - 1, HV, K, V))
    return [t.to(DEVICE) for t in ts]


def _cu():
    return torch.tensor(CU, dtype=torch.int32, device=DEVICE)


def _run(fam, ins, **kw):
    """Forward + backward (loss with fixed weights on o and final_state); returns o, final and every grad."""
    f, cs, _ = FAMILIES[fam]
    ls = [t.detach().clone().requires_grad_(True) for t in ins]
    o, fs = f(*ls[:5], initial_state=ls[5], output_final_state=True, use_qk_l2norm_in_kernel=True, chunk_size=cs,
              **kw)
    wo = torch.randn(o.shape, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    ((o * wo).sum() + fs.pow(2).sum()).backward()
    return [o, fs] + [t.grad for t in ls]


def _assert_equal(a, b):
    names = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0")
    for name, x, y in zip(names, a, b):
        assert torch.equal(x, y), f"{name} differs"


class _HostReadSpy:
    """Fails on any host read (``tolist``, ``item``, ``numpy``, ``cpu``, ``to``, iteration) of a tensor sharing
    ``cu``'s storage: the reads through which the launchers could turn ``cu_seqlens`` into host offsets."""
    METHODS = ("tolist", "item", "numpy", "cpu", "to", "__iter__")

    def __init__(self, monkeypatch, cu):
        ptr = cu.untyped_storage().data_ptr()
        for name in self.METHODS:
            orig = getattr(torch.Tensor, name)

            def spy(self, *a, _orig=orig, _name=name, **kw):
                if self.device.type != "meta" and self.untyped_storage().data_ptr() == ptr:
                    raise AssertionError(f"host read of cu_seqlens ({_name})")
                return _orig(self, *a, **kw)
            monkeypatch.setattr(torch.Tensor, name, spy)


@pytest.mark.parametrize("fam", ["gdn", "kda"])
def test_hint_bitwise_equal(fam):
    """Outputs and all gradients with the hint equal those without it, bitwise; the hint alone (no
    ``cu_seqlens``) serves as the offsets."""
    ins = _inputs(fam)
    base = _run(fam, ins, cu_seqlens=_cu())
    _assert_equal(_run(fam, ins, cu_seqlens=_cu(), cu_seqlens_cpu=torch.tensor(CU)), base)
    _assert_equal(_run(fam, ins, cu_seqlens_cpu=torch.tensor(CU, dtype=torch.int32)), base)


@pytest.mark.parametrize("fam", ["gdn", "kda"])
def test_no_host_read_with_hint(fam, monkeypatch):
    """With the hint, neither the forward nor the backward reads ``cu_seqlens`` (spied host reads), and its
    values are never used: offsets that fail validation when read give the result of the good ones."""
    ins = _inputs(fam)
    base = _run(fam, ins, cu_seqlens=_cu())
    bad = torch.tensor([0, 99, 5, 3], dtype=torch.int32, device=DEVICE)  # decreasing, > T
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        _run(fam, ins, cu_seqlens=bad)
    with mindspeed_ops.use_backend("triton", ops=[OPS[fam]]):
        cu = _cu()
        _HostReadSpy(monkeypatch, cu)
        with pytest.raises(AssertionError, match="host read of cu_seqlens"):  # the spy sees the read
            _run(fam, ins, cu_seqlens=cu)
        _HostReadSpy(monkeypatch, bad)
        _assert_equal(_run(fam, ins, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor(CU)), base)
        if bad.device.type == "cpu":  # a CPU cu_seqlens is compared with its hint (free): a mismatch is an error
            with pytest.raises(ValueError, match=r"cu_seqlens_cpu \[0, 13, 13, 37\] must hold the values of cu_seqlens"):
                _run(fam, ins, cu_seqlens=bad, cu_seqlens_cpu=torch.tensor(CU))
        else:
            _assert_equal(_run(fam, ins, cu_seqlens=bad, cu_seqlens_cpu=torch.tensor(CU)), base)


@pytest.mark.parametrize("fam", ["gdn", "kda"])
def test_no_host_read_torch_ops(fam, monkeypatch):
    """The same through the registered ops, forward op and ``_bwd`` op called directly."""
    f, cs, _ = FAMILIES[fam]
    q, k, v, g, beta, h0 = _inputs(fam)
    fwd, bwd = getattr(ops, OPS[fam]), getattr(ops, OPS[fam] + "_bwd")
    want_f = fwd(q, k, v, g, beta, 0.25, h0, True, True, _cu(), cs)
    do = torch.randn(want_f[0].shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    want_b = bwd(do, want_f[1], q, k, v, g, beta, *want_f[2:-4], h0, 0.25, True, _cu(), cs)
    with mindspeed_ops.use_backend("triton", ops=[OPS[fam]]):
        cu = _cu()
        _HostReadSpy(monkeypatch, cu)
        got_f = fwd(q, k, v, g, beta, 0.25, h0, True, True, cu, cs, torch.tensor(CU))
        got_b = bwd(do, got_f[1], q, k, v, g, beta, *got_f[2:-4], h0, 0.25, True, cu, cs, torch.tensor(CU))
    for a, b in zip(got_f + got_b, want_f + want_b):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fam", ["gdn", "kda"])
def test_reference_backend_with_hint(fam):
    """The reference backend reads ``cu_seqlens`` itself: the hint changes nothing (bitwise)."""
    ins = _inputs(fam)
    with mindspeed_ops.use_backend("reference", ops=[OPS[fam]]):
        base = _run(fam, ins, cu_seqlens=_cu())
        _assert_equal(_run(fam, ins, cu_seqlens=_cu(), cu_seqlens_cpu=torch.tensor(CU)), base)


@pytest.mark.parametrize("fam", ["gdn", "kda"])
def test_bad_hint(fam):
    """Wrong type, dtype, device, rank or length, or bad values: errors naming ``cu_seqlens_cpu``."""
    f, cs, _ = FAMILIES[fam]
    q, k, v, g, beta, h0 = _inputs(fam)

    def call(hint, cu=None):
        f(q, k, v, g, beta, initial_state=h0, cu_seqlens=_cu() if cu is None else cu, chunk_size=cs,
          cu_seqlens_cpu=hint)
    with pytest.raises(TypeError, match="cu_seqlens_cpu must be a torch.Tensor"):
        call(CU)
    with pytest.raises(TypeError, match="cu_seqlens_cpu must have dtype int32/int64, got float32"):
        call(torch.tensor(CU, dtype=torch.float32))
    with pytest.raises(ValueError, match="cu_seqlens_cpu must be a CPU tensor"):
        call(torch.tensor(CU, device="meta"))
    with pytest.raises(ValueError, match="cu_seqlens_cpu must be 1-D"):
        call(torch.tensor([CU]))
    with pytest.raises(ValueError, match=r"cu_seqlens_cpu must have the shape of cu_seqlens \[4\], got \[3\]"):
        call(torch.tensor(CU[:3]))
    with pytest.raises(ValueError, match="cu_seqlens_cpu must be non-decreasing"):
        call(torch.tensor([0, 13, 12, 37]))
    with pytest.raises(ValueError, match=r"cu_seqlens_cpu\[-1\] must be <= T = 40"):
        call(torch.tensor([0, 13, 13, 41]))
    if DEVICE == "cpu":  # valid offsets that are not cu_seqlens' (a CPU cu_seqlens is compared: no sync needed)
        with pytest.raises(ValueError, match=r"cu_seqlens_cpu \[0, 20, 20, 37\] must hold the values of cu_seqlens"):
            call(torch.tensor([0, 20, 20, 37]))
    # the registered ops check it as well, the _bwd op and the fakes included (metadata only there)
    fwd, bwd = getattr(ops, OPS[fam]), getattr(ops, OPS[fam] + "_bwd")
    with pytest.raises(ValueError, match="cu_seqlens_cpu must have the shape of cu_seqlens"):
        fwd(q, k, v, g, beta, 0.25, h0, True, True, _cu(), cs, torch.tensor(CU[:3]))
    with pytest.raises(ValueError, match="cu_seqlens_cpu is given without cu_seqlens"):
        fwd(q, k, v, g, beta, 0.25, h0[:1], True, True, None, cs, torch.tensor(CU))
    o, fs, *aux = fwd(q, k, v, g, beta, 0.25, h0, True, True, _cu(), cs)
    aux = aux[:-4]  # the saved tensors, not the normalized q/k and rstd
    with pytest.raises(ValueError, match="cu_seqlens_cpu must have the shape of cu_seqlens"):
        bwd(o, fs, q, k, v, g, beta, *aux, h0, 0.25, True, _cu(), cs, torch.tensor(CU[:3]))
    mode = torch._subclasses.fake_tensor.FakeTensorMode()
    fake = [mode.from_tensor(t) for t in (q, k, v, g, beta, h0, _cu(), torch.tensor(CU[:3]))]
    with mode, pytest.raises(ValueError, match="cu_seqlens_cpu must have the shape of cu_seqlens"):
        fwd(*fake[:5], 0.25, fake[5], True, True, fake[6], cs, fake[7])


@pytest.mark.parametrize("fam", ["gdn", "kda"])
def test_compile_with_hint(fam):
    """``torch.compile(fullgraph=True)`` with the hint: forward and backward equal eager without it, and the
    compiled graph does not read ``cu_seqlens`` either (invalid offsets with a good hint give the same)."""
    f, cs, _ = FAMILIES[fam]
    wo = torch.randn(1, T, HV, V, generator=torch.Generator().manual_seed(9)).to(DEVICE)

    def fn(q, k, v, g, beta, h0, cu, cu_cpu):
        o, fs = f(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  cu_seqlens=cu, chunk_size=cs, cu_seqlens_cpu=cu_cpu)
        return (o * wo).sum() + fs.pow(2).sum()

    def eager(q, k, v, g, beta, h0, cu, cu_cpu):
        return fn(q, k, v, g, beta, h0, _cu(), None)

    torch._dynamo.reset()
    bad = torch.tensor([0, 99, 5, 3], dtype=torch.int32, device=DEVICE)
    compiled = torch.compile(fn, fullgraph=True)
    for cu in (_cu(), bad) if bad.device.type != "cpu" else (_cu(),):  # a CPU cu_seqlens is compared with its hint
        assert_compiled_matches_eager(eager, compiled, [(_inputs(fam), cu, torch.tensor(CU))], rtol=1e-5, atol=1e-6)


# opcheck of the forward and _bwd ops with the hint: test_registration_sweep.py (its ``*_hint`` cases)


def test_zero_head_dim_needs_a_scale(poisoned):
    """K = 0 with the default scale (K ** -0.5 undefined) is a ValueError naming q, in all three ops (it was a
    ZeroDivisionError); with an explicit scale the op runs (the outputs are 0)."""
    from mindspeed_ops.api import chunk_gated_delta_rule, chunk_kda, fused_recurrent_gated_delta_rule

    q, v, beta = torch.randn(1, 4, 1, 0), torch.randn(1, 4, 1, 8), torch.rand(1, 4, 1)
    for f, g in ((chunk_gated_delta_rule, -torch.rand(1, 4, 1)), (chunk_kda, torch.zeros(1, 4, 1, 0)),
                 (fused_recurrent_gated_delta_rule, -torch.rand(1, 4, 1))):
        q, v, beta, g = (t.to(DEVICE) for t in (q, v, beta, g))
        with pytest.raises(ValueError, match=r"q has head dim K = 0 .*the default scale K \*\* -0.5 is undefined"):
            f(q, q, v, g, beta)
        o = f(q, q, v, g, beta, scale=1.0)[0]
        assert o.shape == v.shape and not o.any()
