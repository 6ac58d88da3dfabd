"""The side stream of the GDN/KDA backward (``mindspeed_ops.ops.side_stream``): the recomputed forward scan runs
beside the reverse scan. Results must be bitwise those of one stream, eagerly, in varlen, on a caller's own
stream and inside a CUDA graph; on CPU nothing forks, and KDA's split ``dAq`` / ``dv`` launches equal the
combined one."""
import pytest
import torch
import torch.nn.functional as F

from mindspeed_ops import api
from mindspeed_ops.ops import side_stream
from mindspeed_ops.ops.kda import bwd as kda_bwd
from tests.conftest import DEVICE, side_stream_inline

#: family -> (public function, per-channel gate)
FAMILIES = {"gdn": (api.chunk_gated_delta_rule, False), "kda": (api.chunk_kda, True)}


def test_no_fork_off_cuda_or_switched_off(monkeypatch):
    assert side_stream.fork(torch.device("cpu")) is None
    monkeypatch.setattr(side_stream, "ENABLED", False)
    assert side_stream.fork(torch.device("cuda")) is None  # never touches CUDA when off
    side_stream.join(None)  # a no-op without a side stream
    assert side_stream.on_side(None, torch.add, 1, 2) == 3


def test_side_by_side_scans_keep_to_half_the_sms(monkeypatch):
    """Two scans side by side take the narrowest V tile (16 or 32) at which each fits in half the SMs (the 132 of
    the H200: 16 heads -> 32, 4 heads -> 16), and their autotuners then keep no narrower tile."""
    from mindspeed_ops import triton_utils as tu
    from mindspeed_ops.ops.gdn import bwd_dhu, fwd_h
    from mindspeed_ops.ops.gdn.common import shared_v_tile

    monkeypatch.setattr(tu, "num_sms", lambda device: 132)
    dev = torch.device("cuda")
    assert shared_v_tile(dev, 16, 128) == 32 and shared_v_tile(dev, 4, 128) == 16
    assert shared_v_tile(dev, 64, 128) == 32  # neither fits: the fork is declined by its programs check
    t = torch.empty(0, dtype=torch.bfloat16)
    for mod, args in ((fwd_h, {"k_ptr": t, "w_ptr": t, "u_ptr": t, "KG": False}),
                      (bwd_dhu, {n: t for n in ("q_ptr", "k_ptr", "w_ptr", "do_ptr", "dv_ptr")})):
        named = {"V": 128, **args}
        every = mod._prune(mod._configs(), named, BK=128, NK=1, BT=64, USE_GK=False)
        shared = mod._prune(mod._configs(), named, min_bv=32, BK=128, NK=1, BT=64, USE_GK=False)
        assert min(c.kwargs["BV"] for c in every) == 16 and shared
        assert min(c.kwargs["BV"] for c in shared) == 32 and set(map(str, shared)) <= set(map(str, every))
        narrow_v = mod._prune(mod._configs(), {**named, "V": 16}, min_bv=32, BK=128, NK=1, BT=64, USE_GK=False)
        assert narrow_v, "V narrower than min_bv keeps the tiles V needs"


@pytest.mark.gpu
def test_fork_only_where_both_branches_fit():
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    assert side_stream.fork(dev, programs=sms // 2 + 1) is None
    x = torch.zeros(4, device=dev)  # queued before the fork, so the side stream's add waits for it
    side = side_stream.fork(dev, programs=sms // 2)
    assert side is not None and side.stream != torch.cuda.current_stream()
    device = torch.cuda.current_device()
    side_stream.on_side(side, x.add_, 1)
    assert torch.cuda.current_stream() == side.main  # the caller's stream and device are current again
    assert torch.cuda.current_device() == device
    side_stream.join(side)
    assert x.sum().item() == 4


@pytest.mark.parametrize("value,on", [("0", False), ("off", False), ("FALSE", False), ("no", False), ("1", True),
                                      ("", True), ("yes", True)])
def test_env_switch_values(monkeypatch, value, on):
    """``MINDSPEED_OPS_SIDE_STREAM`` (read at import): the values of ``triton_utils.env_switch``."""
    import importlib

    monkeypatch.setenv("MINDSPEED_OPS_SIDE_STREAM", value)
    try:
        assert importlib.reload(side_stream).ENABLED is on
    finally:
        monkeypatch.delenv("MINDSPEED_OPS_SIDE_STREAM")
        importlib.reload(side_stream)


@pytest.mark.parametrize("cu", [None, [0, 21, 21, 50]])
def test_kda_dav_split_equals_combined(cu):
    """dA-only and dv-only launches (the backward's two streams) give the combined launch's bits."""
    gen = torch.Generator().manual_seed(3)
    T, HV, V, BT = 53, 2, 20, 32
    vn, do = (torch.randn(1, T, HV, V, generator=gen).to(DEVICE) for _ in range(2))
    Aqk = torch.randn(1, T, HV, BT, generator=gen).to(DEVICE)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    dA, dv = kda_bwd.dav_forward(vn, do, Aqk, 0.7, cu, cu_t)
    dA1, none1 = kda_bwd.dav_forward(vn, do, Aqk, 0.7, cu, cu_t, dv=False)
    dA2 = torch.full_like(dA, float("nan"))  # a caller's buffer (poisoned): every element written
    assert kda_bwd.dav_forward(vn, do, Aqk, 0.7, cu, cu_t, dv=False, dA_out=dA2)[0] is dA2
    assert torch.equal(dA, dA2)
    none2, dv1 = kda_bwd.dav_forward(None, do, Aqk, 0.7, cu, cu_t, dA=False)
    assert none1 is None and none2 is None
    assert torch.equal(dA, dA1) and torch.equal(dv, dv1)
    assert torch.isfinite(dA).all() and torch.isfinite(dv).all()


@pytest.mark.parametrize("fam", ["gdn", "kda"])
@pytest.mark.parametrize("cu", [None, [0, 21, 21, 50]])
def test_side_branch_code_path_on_cpu(fam, cu):
    """The forked code path (outputs made before the fork, KDA's split dAq/dv launches into the caller's buffers)
    with the streams stubbed out, on any device: the bits of the one-stream path."""
    T = 53 if cu is None else 50
    gen = torch.Generator().manual_seed(7)

    def r(*shape):
        return torch.randn(*shape, generator=gen)
    per_channel = FAMILIES[fam][1]
    N = 1 if cu is None else len(cu) - 1
    ins = [r(1, T, 1, 16), r(1, T, 1, 16), r(1, T, 2, 24),
           F.logsigmoid(r(1, T, 2, 16) if per_channel else r(1, T, 2)), torch.sigmoid(r(1, T, 2)), r(N, 2, 16, 24)]
    ins = [t.to(DEVICE) for t in ins]
    kw = {} if cu is None else {"cu_seqlens": torch.tensor(cu, dtype=torch.int32, device=DEVICE)}

    def run():
        leaves = [t.clone().requires_grad_(True) for t in ins]
        o, fs = FAMILIES[fam][0](*leaves[:5], initial_state=leaves[5], output_final_state=True,
                                 use_qk_l2norm_in_kernel=True, chunk_size=16 if fam == "gdn" else 32, **kw)
        ((o * 1.5).sum() + fs.pow(2).sum()).backward()
        return [o, fs] + [t.grad for t in leaves]
    one = run()
    branches = []
    with side_stream_inline(branches):
        _assert_equal(run(), one, "forked code path")
    assert len(branches) == (2 if fam == "kda" else 1), branches  # the scan (and KDA's dAq) took the side branch


def _inputs(fam, T, H, HV, K, V, n_seq, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)
    g = F.logsigmoid(r(1, T, HV, K) if FAMILIES[fam][1] else r(1, T, HV))
    q, k, v = (r(1, T, H, K).to(dtype), r(1, T, H, K).to(dtype), r(1, T, HV, V).to(dtype))
    ts = (q, k, v, g, torch.sigmoid(r(1, T, HV)), r(n_seq, HV, K, V))
    return [t.to("cuda") for t in ts]


def _step(fam, leaves, cu_host, wo):
    """Forward + every gradient (loss on o and the final state) as one function of the leaves."""
    f = FAMILIES[fam][0]
    cu = None if cu_host is None else torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    o, fs = f(*leaves[:5], initial_state=leaves[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
              cu_seqlens=cu, cu_seqlens_cpu=None if cu_host is None else torch.tensor(cu_host))
    loss = (o.float() * wo).sum() + fs.pow(2).sum()
    return [o, fs, *torch.autograd.grad(loss, leaves)]


def _run(fam, ins, cu_host):
    leaves = [t.detach().clone().requires_grad_(True) for t in ins]
    wo = torch.randn(ins[2].shape, generator=torch.Generator().manual_seed(9)).to("cuda")
    return _step(fam, leaves, cu_host, wo)


def _assert_equal(a, b, what):
    names = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0")
    for name, x, y in zip(names, a, b):
        assert torch.isfinite(x).all(), f"{what}: {name} not finite"
        assert torch.equal(x, y), f"{what}: {name} differs from the one-stream run"


CASES = [  # (T, H, HV, K, V, cu_seqlens): few heads, so the scans leave most SMs free; GVA; varlen
    (2048, 2, 4, 128, 128, None),
    (1000, 1, 2, 100, 64, [0, 300, 300, 999]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("fam", ["gdn", "kda"])
@pytest.mark.parametrize("case", CASES)
def test_side_stream_bitwise_equal_one_stream(fam, case, monkeypatch):
    T, H, HV, K, V, cu_host = case
    ins = _inputs(fam, T, H, HV, K, V, 1 if cu_host is None else len(cu_host) - 1, torch.bfloat16)
    monkeypatch.setattr(side_stream, "ENABLED", False)
    one = _run(fam, ins, cu_host)
    monkeypatch.setattr(side_stream, "ENABLED", True)
    for _ in range(3):  # repeated: the allocator reuses the side branch's blocks
        _assert_equal(_run(fam, ins, cu_host), one, "side stream")
    caller = torch.cuda.Stream()  # on a caller's own stream (its own side stream)
    caller.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(caller):
        got = _run(fam, ins, cu_host)
    torch.cuda.current_stream().wait_stream(caller)
    _assert_equal(got, one, "caller's stream")


@pytest.mark.gpu
@pytest.mark.parametrize("fam", ["gdn", "kda"])
def test_side_stream_in_cuda_graph(fam):
    """Forward + backward captured into a CUDA graph (the fork and join become graph edges): replays give the
    eager bits, also after the inputs change in place."""
    T, H, HV, K, V, cu_host = CASES[0]
    ins = _inputs(fam, T, H, HV, K, V, 1, torch.bfloat16)
    leaves = [t.detach().clone().requires_grad_(True) for t in ins]
    wo = torch.randn(ins[2].shape, generator=torch.Generator().manual_seed(9)).to("cuda")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):  # warm-up (autotuning, compiles) outside the capture, as CUDA graphs need
        for _ in range(2):
            _step(fam, leaves, cu_host, wo)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = _step(fam, leaves, cu_host, wo)
    for seed in (0, 5):
        new = _inputs(fam, T, H, HV, K, V, 1, torch.bfloat16, seed=seed)
        with torch.no_grad():
            for leaf, t in zip(leaves, new):
                leaf.copy_(t)
        graph.replay()
        torch.cuda.synchronize()
        _assert_equal([t.clone() for t in static], _run(fam, new, cu_host), f"graph replay, seed {seed}")
