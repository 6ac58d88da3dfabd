"""Outputs an op keeps only for its own backward (chunk_loss's saved gradients, the GDN/KDA ``G``, ``Ainv``,
``Akk``, ``Aqk``) get no gradient: autograd must not build zero tensors for them before the backward runs
(``ctx.set_materialize_grads(False)``). On the H200 those fills took 0.39 ms of a 48 ms chunk_loss step (a 1.2 GB
dweight-shaped zero tensor) and ~50 µs of a KDA step."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mindspeed_ops
from mindspeed_ops.api import chunk_gated_delta_rule, chunk_kda, chunk_loss
from tests.conftest import DEVICE

_FILLS = {"zeros", "zeros_like", "zero_", "fill_", "new_zeros", "full", "full_like"}


class _Fills(TorchDispatchMode):
    """Shapes of the tensors that zero/fill ops make while active."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.split(".")[0] in _FILLS and isinstance(out, torch.Tensor):
            self.shapes.append(tuple(out.shape))
        return out


def _backward_fills(loss, leaves):
    with _Fills() as mode:
        torch.autograd.grad(loss, leaves)
    return mode.shapes


def test_chunk_loss_backward_fills_no_saved_gradient():
    N, Hd, V = 6, 8, 30
    h = torch.randn(N, Hd, device=DEVICE, requires_grad=True)
    W = torch.randn(V, Hd, device=DEVICE, requires_grad=True)
    y = torch.randint(0, V, (N,), device=DEVICE)
    with mindspeed_ops.use_backend("reference"):
        fills = _backward_fills(chunk_loss(h, W, y, chunk_size=4), (h, W))
    assert (V, Hd) not in fills and (N, Hd) not in fills, fills


def test_gdn_kda_backward_fill_no_saved_intermediates():
    B, T, H, K, V = 1, 40, 2, 16, 8  # V != K: KDA's G [B, T, H, K] differs from o [B, T, H, V]
    q, k = (torch.randn(B, T, H, K, device=DEVICE, requires_grad=True) for _ in range(2))
    v = torch.randn(B, T, H, V, device=DEVICE, requires_grad=True)
    beta = torch.rand(B, T, H, device=DEVICE, requires_grad=True)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=DEVICE)).requires_grad_()
    gk = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device=DEVICE)).requires_grad_()
    with mindspeed_ops.use_backend("reference"):
        o, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        fills = _backward_fills(o.sum(), (q, k, v, g, beta))
        assert not any(s[:2] == (B, T) and s != o.shape for s in fills), fills  # G [B, T, H], Ainv [B, T, H, BT]
        o, _ = chunk_kda(q, k, v, gk, beta, use_qk_l2norm_in_kernel=True)
        fills = _backward_fills(o.sum(), (q, k, v, gk, beta))
        assert not any(s[:2] == (B, T) and s != o.shape for s in fills), fills  # G, Akk, Aqk
