"""Registration sweep (definition of done: "torch.library registration, works under torch.compile,
torch.ops.mindspeed_ops.<name>").

- every trainable op is registered once ``mindspeed_ops.api`` is imported;
- ``torch.library.opcheck`` of every registered op, the ``_bwd`` ops included (most family tests
  opcheck only the forward op), on contiguous and on permuted-dense inputs (a ``[B, H, T, K]`` tensor
  seen as ``[B, T, H, K]``), with the default backend and with the ``reference`` backend (the CPU
  path): the fakes promise contiguous outputs, so the real outputs must be contiguous too, and
  outputs may not alias each other;
- ``torch.compile(fullgraph=True)`` forward + backward equals eager for the public functions and
  Function/Module wrappers whose compile tests checked only the forward values or none.

Regressions found by this sweep: the GDN/KDA ``_bwd`` fakes kept a permuted input's strides
(``torch.compile`` failed with a stride assertion); the reference backend returned non-contiguous
outputs from ``causal_conv1d`` (final_state), ``mhc_post_bwd`` (dh_res) and, for permuted inputs,
most ops, and aliased outputs (dx/dinitial_state views of one buffer) from ``causal_conv1d_bwd``.
"""
import functools

import pytest
import torch
import torch.nn.functional as F

import mindspeed_ops
from mindspeed_ops import api
from mindspeed_ops.testing import assert_compiled_matches_eager
from tests.conftest import DEVICE

ops = torch.ops.mindspeed_ops

TRAINABLE = ["causal_conv1d", "chunk_gated_delta_rule", "chunk_kda", "chunk_loss", "clipped_swiglu",
             "fused_cross_entropy_loss", "inplace_rope", "l2norm", "mhc_post", "mhc_pre_bmm", "rms_norm",
             "rms_norm_gated", "rmsnorm_without_weight", "sinkhorn", "sinkhorn_knopp", "sort_chunks_by_idx",
             "sort_chunks_by_idx_with_probs"]
OTHER = ["chunk_loss_bwd", "chunk_loss_scale", "fused_cross_entropy_loss_bwd_inplace",
         "fused_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule_bwd", "l2norm_bwd",
         "causal_conv1d_bwd", "chunk_gated_delta_rule_bwd", "chunk_kda_bwd", "clipped_swiglu_bwd",
         "fused_cross_entropy_loss_bwd", "inplace_rope_bwd", "mhc_post_bwd", "mhc_pre_bmm_bwd", "rms_norm_bwd",
         "rms_norm_gated_bwd", "rmsnorm_without_weight_bwd", "sinkhorn_bwd", "sinkhorn_knopp_bwd",
         "sort_chunks_by_idx_bwd", "sort_chunks_by_idx_with_probs_bwd"]


def test_ops_registered():
    registered = {n for n in dir(ops) if not n.startswith("_") and n != "name"}
    missing = set(TRAINABLE + OTHER) - registered
    assert not missing, f"not registered after importing mindspeed_ops.api: {sorted(missing)}"
    for name in TRAINABLE + OTHER:
        assert getattr(ops, name).default._schema.name == f"mindspeed_ops::{name}"


# ------------------------------------------------------------------------------------------------ opcheck

def _r(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE)


def _leaf(*ts):
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in ts]


def _permuted(t):
    """Same values, dense memory in reversed dim order (not contiguous; ``empty_like`` keeps that layout)."""
    if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.is_floating_point():
        return t
    p = list(range(t.dim()))[::-1]
    return t.detach().permute(p).contiguous().permute(p).requires_grad_(t.requires_grad)


B, T, H, HV, K, V = 1, 20, 1, 2, 16, 16


def _cases(layout):
    """name -> (op, args); every tensor argument already in ``layout``."""
    lay = _permuted if layout == "permuted" else (lambda t: t)
    r = _r
    q, k, v = r(B, T, H, K, seed=1), r(B, T, H, K, seed=2), r(B, T, HV, V, seed=3)
    g, beta, h0 = F.logsigmoid(r(B, T, HV, seed=4)), torch.sigmoid(r(B, T, HV, seed=5)), r(B, HV, K, V, seed=6)
    gk = F.logsigmoid(r(B, T, HV, K, seed=7))
    q, k, v, g, beta, h0, gk = (lay(t) for t in (q, k, v, g, beta, h0, gk))
    sizes, idx = torch.tensor([4, 0, 6, 12, 0], device=DEVICE), torch.tensor([3, 2, 0, 4, 1], device=DEVICE)
    labels = torch.randint(0, 50, (6,), generator=torch.Generator().manual_seed(8)).to(DEVICE)
    cu = torch.tensor([0, 7, 7, 20], device=DEVICE)
    h03 = lay(r(3, HV, K, V, seed=9))
    # the cu_seqlens_cpu hint cases: int32 device offsets (what fla-style callers pass) with an int64 host copy,
    # and tail tokens after the last sequence
    cu_h = torch.tensor([0, 7, 7, 17], dtype=torch.int32, device=DEVICE)
    cu_cpu = torch.tensor([0, 7, 7, 17])
    o, fs, G, Ainv, *_ = ops.chunk_gated_delta_rule(q, k, v, g, beta, 0.25, h0, True, True, None, 16)
    # the hint case's backward takes the forward's normalized q/k and their rstd (what autograd passes it)
    go, gfs, gG, gAinv, gqn, gkn, grq, grk = ops.chunk_gated_delta_rule(q, k, v, g, beta, 0.25, h03, True, True,
                                                                        cu_h, 16, cu_cpu)
    ko, kfs, kG, Akk, Aqk, *_ = ops.chunk_kda(q, k, v, gk, beta, 0.25, h0, True, True, None, 32)
    vo, vfs, vG, vAkk, vAqk, *_ = ops.chunk_kda(q, k, v, gk, beta, 0.25, h03, True, True, cu, 32)
    ho, hfs, hG, hAkk, hAqk, hqn, hkn, hrq, hrk = ops.chunk_kda(q, k, v, gk, beta, 0.25, h03, True, True, cu_h, 32,
                                                                 cu_cpu)
    x6 = r(6, 40, seed=10)
    raw = {
        "clipped_swiglu": (ops.clipped_swiglu, (*_leaf(r(6, 48, seed=11) * 4), 1.702, 7.0, False)),
        "clipped_swiglu_bwd": (ops.clipped_swiglu_bwd, (r(6, 24, seed=12), r(6, 48, seed=13) * 4, 1.702, None, True)),
        "sinkhorn": (ops.sinkhorn, (*_leaf(r(6, 24, seed=14), r(3, seed=15), r(24, seed=16)), 4, 3, 1e-6)),
        "sinkhorn_bwd": (ops.sinkhorn_bwd, (r(6, 4, seed=17), r(6, 4, seed=18), r(6, 4, 4, seed=19), r(6, 24, seed=20),
                                            r(3, seed=21), r(24, seed=22), 4, 3, 1e-6)),
        "sinkhorn_knopp": (ops.sinkhorn_knopp, (*_leaf(r(5, 4, 4, seed=23)), 3, 1e-6)),
        "sinkhorn_knopp_bwd": (ops.sinkhorn_knopp_bwd, (r(5, 4, 4, seed=24), r(5, 4, 4, seed=25), 3, 1e-6)),
        "mhc_post": (ops.mhc_post, tuple(_leaf(r(3, 32, seed=26), r(3, 4, 32, seed=27), r(3, 4, seed=28),
                                               r(3, 4, 4, seed=29)))),
        "mhc_post_bwd": (ops.mhc_post_bwd, (r(3, 4, 32, seed=30), r(3, 32, seed=31), r(3, 4, 32, seed=32),
                                            r(3, 4, seed=33), r(3, 4, 4, seed=34))),
        "mhc_pre_bmm": (ops.mhc_pre_bmm, (*_leaf(r(3, 4, seed=35), r(3, 4, 32, seed=36)), None)),
        "mhc_pre_bmm_bwd": (ops.mhc_pre_bmm_bwd, (r(3, 32, seed=37), r(3, 4, seed=38), r(3, 4, 32, seed=39),
                                                  torch.float32)),
        "rms_norm": (ops.rms_norm, (*_leaf(x6, r(40, seed=40)), 1e-6, 1.0)),
        "rms_norm_bwd": (ops.rms_norm_bwd, (r(6, 40, seed=41), x6, r(40, seed=42), 1e-6, 1.0, True)),
        "rms_norm_bwd_noweight": (ops.rms_norm_bwd, (r(6, 40, seed=41), x6, None, 1e-6, 0.0, False)),
        "rmsnorm_without_weight": (ops.rmsnorm_without_weight, (*_leaf(x6), 1e-6, True, None)),
        "rmsnorm_without_weight_bwd": (ops.rmsnorm_without_weight_bwd, (x6, r(6, 1, seed=43), r(6, 40, seed=44), 1e-6)),
        "rmsnorm_without_weight_bwd_rstd": (ops.rmsnorm_without_weight_bwd, (x6, r(6, 1, seed=43), None, 1e-6)),
        "l2norm": (ops.l2norm, (*_leaf(x6), 1e-6, None)),
        "l2norm_bwd": (ops.l2norm_bwd, (x6, r(6, seed=45).abs() + 0.1, r(6, 40, seed=46), 1e-6, False, None)),
        "rms_norm_gated": (ops.rms_norm_gated, (*_leaf(r(6, 64, seed=47), r(6, 64, seed=48), r(64, seed=49),
                                                       r(64, seed=50), r(6, 64, seed=51)),
                                                1e-6, "swish", None, True, "fp32", True, False)),
        "rms_norm_gated_bwd": (ops.rms_norm_gated_bwd, (r(6, 64, seed=52), r(6, 64, seed=53), r(6, 64, seed=54),
                                                        r(6, 64, seed=55), r(64, seed=56), r(64, seed=57),
                                                        r(6, 64, seed=58), 1e-6, "sigmoid", 16, False, "fp32", True,
                                                        True)),
        "causal_conv1d": (ops.causal_conv1d, (*_leaf(r(1, 10, 16, seed=59), r(4, 16, seed=60), r(16, seed=61),
                                                     r(1, 10, 16, seed=62), r(1, 16, 4, seed=63)), "silu", None, True)),
        "causal_conv1d_bwd": (ops.causal_conv1d_bwd, (r(1, 10, 16, seed=64), r(1, 16, 4, seed=65),
                                                      r(1, 10, 16, seed=66), r(4, 16, seed=67), r(16, seed=68),
                                                      r(1, 16, 4, seed=69), "silu", None)),
        "causal_conv1d_bwd_varlen": (ops.causal_conv1d_bwd, (r(1, 10, 16, seed=70), r(2, 16, 4, seed=71),
                                                             r(1, 10, 16, seed=72), r(4, 16, seed=73), None,
                                                             r(2, 16, 4, seed=74), None,
                                                             torch.tensor([0, 4, 10], device=DEVICE))),
        "sort_chunks_by_idx_with_probs_bwd": (ops.sort_chunks_by_idx_with_probs_bwd,
                                              (r(24, 8, seed=75), r(24, seed=76), sizes, idx)),
        "sort_chunks_by_idx_bwd": (ops.sort_chunks_by_idx_bwd, (r(24, 8, seed=77), sizes, idx)),
        "fused_cross_entropy_loss_bwd": (ops.fused_cross_entropy_loss_bwd,
                                         (r(6, seed=78), r(6, 50, seed=79), r(6, seed=80), labels, None, -100, 0.1,
                                          1e-4, None)),
        "chunk_loss": (ops.chunk_loss, (*_leaf(r(6, 16, seed=81), r(50, 16, seed=82)), labels, None, None, -100,
                                        "mean", 0.0, 0.0, None, None, torch.float32, None, True, True, False)),
        "chunk_gated_delta_rule": (ops.chunk_gated_delta_rule, (*_leaf(q, k, v, g, beta), 0.25, *_leaf(h0), True,
                                                                True, None, 16)),
        "chunk_gated_delta_rule_bwd": (ops.chunk_gated_delta_rule_bwd,
                                       (r(*o.shape, seed=83), r(*fs.shape, seed=84), q, k, v, g, beta, G, Ainv, h0,
                                        0.25, True, None, 16)),
        "chunk_gated_delta_rule_hint": (ops.chunk_gated_delta_rule, (*_leaf(q, k, v, g, beta), 0.25, *_leaf(h03),
                                                                     True, True, cu_h, 16, cu_cpu)),
        "chunk_gated_delta_rule_bwd_hint": (ops.chunk_gated_delta_rule_bwd,
                                            (r(*go.shape, seed=89), r(*gfs.shape, seed=90), gqn, gkn, v, g, beta,
                                             gG, gAinv, h03, 0.25, True, cu_h, 16, cu_cpu, grq, grk)),
        "chunk_kda": (ops.chunk_kda, (*_leaf(q, k, v, gk, beta), 0.25, *_leaf(h0), True, True, None, 32)),
        "chunk_kda_hint": (ops.chunk_kda, (*_leaf(q, k, v, gk, beta), 0.25, *_leaf(h03), True, True, cu_h, 32,
                                           cu_cpu)),
        "chunk_kda_bwd": (ops.chunk_kda_bwd, (r(*ko.shape, seed=85), r(*kfs.shape, seed=86), q, k, v, gk, beta, kG,
                                              Akk, Aqk, h0, 0.25, True, None, 32)),
        "chunk_kda_bwd_varlen": (ops.chunk_kda_bwd, (r(*vo.shape, seed=87), r(*vfs.shape, seed=88), q, k, v, gk, beta,
                                                     vG, vAkk, vAqk, h03, 0.25, True, cu, 32)),
        "chunk_kda_bwd_hint": (ops.chunk_kda_bwd, (r(*ho.shape, seed=91), r(*hfs.shape, seed=92), hqn, hkn, v, gk,
                                                   beta, hG, hAkk, hAqk, h03, 0.25, True, cu_h, 32, cu_cpu, hrq, hrk)),
        "fused_recurrent_gated_delta_rule": (ops.fused_recurrent_gated_delta_rule,
                                             (q, k, v, g, beta, 0.25, h03, True, True, cu, None)),
        "fused_recurrent_gated_delta_rule_hint": (ops.fused_recurrent_gated_delta_rule,
                                                  (q, k, v, g, beta, 0.25, h03, True, True, cu_h, cu_cpu)),
    }
    return {name: (op, tuple(lay(a) for a in args)) for name, (op, args) in raw.items()}


NAMES = ["clipped_swiglu", "clipped_swiglu_bwd", "sinkhorn", "sinkhorn_bwd", "sinkhorn_knopp", "sinkhorn_knopp_bwd",
         "mhc_post", "mhc_post_bwd", "mhc_pre_bmm", "mhc_pre_bmm_bwd", "rms_norm", "rms_norm_bwd",
         "rms_norm_bwd_noweight", "rmsnorm_without_weight", "rmsnorm_without_weight_bwd",
         "rmsnorm_without_weight_bwd_rstd", "l2norm", "l2norm_bwd", "rms_norm_gated", "rms_norm_gated_bwd",
         "causal_conv1d", "causal_conv1d_bwd", "causal_conv1d_bwd_varlen", "sort_chunks_by_idx_with_probs_bwd",
         "sort_chunks_by_idx_bwd", "fused_cross_entropy_loss_bwd", "chunk_loss", "chunk_gated_delta_rule",
         "chunk_gated_delta_rule_bwd", "chunk_kda", "chunk_kda_bwd", "chunk_kda_bwd_varlen",
         "fused_recurrent_gated_delta_rule", "chunk_gated_delta_rule_hint", "chunk_gated_delta_rule_bwd_hint",
         "chunk_kda_hint", "chunk_kda_bwd_hint", "fused_recurrent_gated_delta_rule_hint"]


GATED_DELTA = ("chunk_gated_delta_rule", "chunk_kda", "fused_recurrent_gated_delta_rule")  # name prefixes
#: the sweep's cases by op family (name prefixes), one test each: xdist spreads them over its workers (as one
#: test the default-backend sweep took ~110 s on the 2-core CI machine, the longest single test)
GROUPS = {
    "activation_mhc": ("clipped_swiglu", "sinkhorn", "mhc_"),
    "norm": ("rms_norm", "rmsnorm_without_weight", "l2norm"),
    "conv": ("causal_conv1d",),
    "moe_loss": ("sort_chunks_by_idx", "fused_cross_entropy_loss", "chunk_loss"),
    "gdn": ("chunk_gated_delta_rule",),
    "kda": ("chunk_kda",),
    "recurrent": ("fused_recurrent_gated_delta_rule",),
}


@functools.lru_cache(maxsize=None)
def _cases_for(backend: str, layout: str):
    """``_cases(layout)`` built once per xdist worker and backend (it runs interpreted GDN/KDA forwards for the
    backward ops' saved tensors): the per-family tests share it as the one sweep test did."""
    return _cases(layout)


def _group(name: str) -> str:
    return next(g for g, prefixes in GROUPS.items() if name.startswith(prefixes))


def test_opcheck_sweep_covers_every_case():
    """Every case of ``_cases`` is named in NAMES, and every name falls in exactly one group."""
    for layout in ("contiguous", "permuted"):
        assert sorted(_cases_for("default", layout)) == sorted(NAMES)
    for name in NAMES:
        assert sum(name.startswith(p) for p in GROUPS.values()) == 1, name


@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
@pytest.mark.parametrize("backend", ["default", "reference"])
def test_opcheck_sweep(backend, layout, group):
    """opcheck (schema, fake tensor, autograd registration, AOT dispatch) of every case of one op family; all
    failures are collected so one run names every op that breaks. The permuted layout runs the checks its strides
    can change (schema: no input mutated or aliased; fake tensor: output metadata as the real op's) for the Gated
    DeltaNet / KDA ops, whose other checks cost minutes under the interpreter: their autograd registration does
    not depend on the layout, and test_compile_gated_delta_permuted_layout compiles them end to end (forward and
    backward) on permuted inputs. Every other op runs every check in both layouts. The ``*_hint`` cases are the
    ``cu_seqlens_cpu`` variants."""
    ctx = mindspeed_ops.use_backend("reference") if backend == "reference" else torch.enable_grad()
    failures = []
    with ctx:
        cases = _cases_for(backend, layout)  # built under the backend's context on first use
        for name in (n for n in NAMES if _group(n) == group):
            op, args = cases[name]
            try:
                if layout == "permuted" and name.startswith(GATED_DELTA):
                    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
                else:
                    torch.library.opcheck(op, args)
            except Exception as e:  # noqa: BLE001 - collect every op's failure
                failures.append(f"{name}: {type(e).__name__}: {str(e)[:400]}")
    assert not failures, "\n".join(failures)


def test_fused_recurrent_bwd_op_raises():
    """The forward-only op's ``_bwd`` is registered (so compile can trace a backward) and raises when run."""
    q = _r(1, 2, 1, 4, seed=1)
    with pytest.raises(NotImplementedError, match="forward-only"):
        ops.fused_recurrent_gated_delta_rule_bwd(q, q, q, q, _r(1, 2, 1, seed=2))


# ------------------------------------------------------------------------------------------------ compile

def _w(shape, seed):
    """Fixed cotangent weights, so the gradients are not those of a plain sum."""
    return _r(*shape, seed=seed)


def _check(fn, tensors, *extra):
    torch._dynamo.reset()
    assert_compiled_matches_eager(fn, torch.compile(fn, fullgraph=True), [(list(tensors), *extra)],
                                  rtol=1e-4, atol=1e-5)


def _gdn_inputs(kda=False, layout="contiguous"):
    lay = _permuted if layout == "permuted" else (lambda t: t)
    q, k, v = _r(B, H, T, K, seed=1), _r(B, H, T, K, seed=2), _r(B, HV, T, V, seed=3)
    if layout == "permuted":  # head-major storage, token-major view (a transpose(1, 2) of [B, H, T, K])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    else:
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    g = F.logsigmoid(_r(B, T, HV, K, seed=4) if kda else _r(B, T, HV, seed=4))
    return q, k, v, lay(g), torch.sigmoid(_r(B, T, HV, seed=5)), _r(B, HV, K, V, seed=6)


@pytest.mark.parametrize("fam", ["gdn", "kda"])
@pytest.mark.parametrize("backend", ["default", "reference"])
def test_compile_gated_delta_permuted_layout(fam, backend):
    """q/k/v as transposed views of head-major buffers: compiled forward+backward equals eager (the
    ``_bwd`` fakes used ``empty_like`` and promised the permuted strides; the kernels return contiguous)."""
    f = api.chunk_kda if fam == "kda" else api.chunk_gated_delta_rule
    cs = 32 if fam == "kda" else 16
    wo = _w((B, T, HV, V), 90)

    def fn(q, k, v, g, beta, h0):
        o, fs = f(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  chunk_size=cs)
        return (o * wo).sum() + fs.pow(2).sum() * 1e-2

    ctx = mindspeed_ops.use_backend("reference") if backend == "reference" else torch.enable_grad()
    with ctx:
        _check(fn, _gdn_inputs(fam == "kda", "permuted"))


def test_compile_function_wrappers_gdn_kda():
    """``ChunkGatedDeltaRuleFunction.apply`` / ``ChunkKDAFunction.apply`` (MindSpeed entries): gradients too."""
    wo = _w((B, T, HV, V), 91)

    def fn(q, k, v, g, beta, h0):
        o1, f1 = api.ChunkGatedDeltaRuleFunction.apply(q, k, v, g, beta, None, h0, True, True, None, 16)
        o2, f2 = api.ChunkKDAFunction.apply(q, k, v, g[..., None].expand(*g.shape, K), beta, None, h0, True, True,
                                            None, 32)
        return ((o1 + o2) * wo).sum() + (f1 + f2).pow(2).sum() * 1e-2

    _check(fn, _gdn_inputs())


@pytest.mark.parametrize("backend", ["default", "reference"])
def test_compile_causal_conv1d_forms(backend):
    """causal_conv1d with final state, CausalConv1dFunction.apply and causal_conv1d_fn, with gradients
    (the reference backend's final_state was a transposed view and its dx/dstate aliased)."""
    wy, wf = _w((1, 10, 16), 92), _w((1, 16, 4), 93)

    def fn(x, w, b, r, s):
        y, fs = api.causal_conv1d(x, w, b, r, s, activation="silu", output_final_state=True)
        y2, fs2 = api.CausalConv1dFunction.apply(x, w, None, None, s, None, None, True)
        y3, fs3 = api.causal_conv1d_fn(x.transpose(1, 2), w.t(), b, initial_states=s[..., 1:],
                                       return_final_states=True, activation="silu")
        return ((y + y2 + y3.transpose(1, 2)) * wy).sum() + ((fs + fs2) * wf).sum() + fs3.sum()

    ctx = mindspeed_ops.use_backend("reference") if backend == "reference" else torch.enable_grad()
    with ctx:
        _check(fn, [_r(1, 10, 16, seed=1), _r(4, 16, seed=2), _r(16, seed=3), _r(1, 10, 16, seed=4),
                    _r(1, 16, 4, seed=5)])


@pytest.mark.parametrize("backend", ["default", "reference"])
def test_compile_mhc(backend):
    """sinkhorn (= hc_split_sinkhorn), sinkhorn_knopp, mhc_pre_bmm, mhc_post: gradients too (the
    existing compile tests check forward values only; the reference mhc_post_bwd returned dh_res transposed)."""
    wp, wc, wk = _w((6, 4), 94), _w((6, 4, 4), 95), _w((5, 4, 4), 96)

    def fn(m, s, b, L, x, res):
        pre, post, comb = api.hc_split_sinkhorn(m, s, b, 4, 3)
        P = api.sinkhorn_knopp(L, 3)
        y = api.mhc_pre_bmm(pre, res)
        out = api.mhc_post(x + y, res, post, comb)
        return (pre * wp).sum() + (comb * wc).sum() + (P * wk).sum() + out.pow(2).sum() * 1e-2

    ctx = mindspeed_ops.use_backend("reference") if backend == "reference" else torch.enable_grad()
    with ctx:
        _check(fn, [_r(6, 24, seed=1), _r(3, seed=2), _r(24, seed=3), _r(5, 4, 4, seed=4), _r(6, 32, seed=5),
                    _r(6, 4, 32, seed=6)])


def test_compile_norms_activation_modules():
    """clipped_swiglu (both layouts), L2Norm module, l2norm, rms_norm_gated (prenorm, residual, bias) and
    FusedRMSNormGated, rmsnorm_without_weight (rstd only): gradients against eager."""
    l2 = api.L2Norm()
    norm = api.FusedRMSNormGated(32, activation="sigmoid", device=DEVICE)
    wy = _w((6, 32), 97)

    def fn(gu, x, g, w, b, r):
        a = api.clipped_swiglu(gu) + api.clipped_swiglu(gu, interleaved=True, swiglu_limit=None)
        y, ro = api.rms_norm_gated(x, g, w, b, residual=r, prenorm=True, residual_in_fp32=True)
        z = l2(a) + norm(x, g) + api.rmsnorm_without_weight(a) * y + ro
        return (z * wy).sum()

    _check(fn, [_r(6, 64, seed=1) * 4, _r(6, 32, seed=2), _r(6, 32, seed=3), _r(32, seed=4), _r(32, seed=5),
                _r(6, 32, seed=6)])


def test_compile_losses_and_sort():
    """FusedCrossEntropyLoss module (mean, smoothing) and moe_sort_chunks_by_index(_with_probs): gradients
    against eager."""
    ce = api.FusedCrossEntropyLoss(label_smoothing=0.1)
    labels = torch.randint(0, 50, (6,), generator=torch.Generator().manual_seed(9)).to(DEVICE)
    labels[2] = -100
    wy, wp = _w((24, 8), 98), _w((24,), 99)

    def fn(logits, x, p, lab):
        out, pp = api.moe_sort_chunks_by_index_with_probs(x, p, [4, 0, 6, 12, 2], [3, 2, 0, 4, 1])
        out2 = api.moe_sort_chunks_by_index(x, torch.tensor([4, 0, 6, 12, 2]), torch.tensor([1, 0, 4, 2, 3]))
        return ce(logits, lab) + ((out + out2) * wy).sum() + (pp * wp).sum()

    _check(fn, [_r(6, 50, seed=1), _r(24, 8, seed=2), _r(24, seed=3)], labels)
