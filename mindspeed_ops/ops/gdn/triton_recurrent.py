"""Triton kernel of ``fused_recurrent_gated_delta_rule`` (SPEC 1.10.11): the token-by-token gated
delta rule of SPEC 1.10.0 with the fp32 state in registers (decode and very short sequences).
Kernel only: the launcher lives in ``fused_recurrent.py``."""
import triton
import triton.language as tl

from ...triton_utils import i64


@triton.jit
def fused_recurrent_gdr_fwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, h0_ptr, o_ptr, ht_ptr, cu_ptr,
                                   T, HV, GQ, K, V, scale,
                                   s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
                                   s_gb, s_gt, s_gh, s_bb, s_bt, s_bh, s_0n, s_0h, s_0k,
                                   s_ob, s_ot, s_oh, s_tn, s_th, s_tk,
                                   BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, HAS_H0: tl.constexpr,
                                   STORE_FINAL: tl.constexpr, L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr):
    """One (sequence, value head, V-tile of ``BV``) per program; the state ``S [K, BV]`` (``BK >= K``)
    stays in fp32 registers across the tokens. Per token: optional l2norm of q, k
    (``x / sqrt(Σx² + 1e-6)``); ``S ← e^{g} S``; ``e = v − Sᵀ k``; ``S ← S + β k eᵀ``;
    ``o = scale · Sᵀ q`` (stored in o's dtype). Program id: ``(sequence · HV + head) · NV + V-tile``;
    tokens of a varlen sequence from ``cu_seqlens``; tail tokens are never read."""
    pid = tl.program_id(0).to(tl.int64)
    NV = tl.cdiv(V, BV)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_h = i_nh % HV
    if IS_VARLEN:
        bos = tl.load(cu_ptr + i_n).to(tl.int64)
        eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
        i_b = i_n * 0
    else:
        bos = i_n * 0
        eos = bos + T
        i_b = i_n
    d = tl.arange(0, BK)
    dmask = d < K
    cols = i_v * BV + tl.arange(0, BV)
    cmask = cols < V
    smask = dmask[:, None] & cmask[None, :]
    i_hk = i_h // GQ
    q_base = q_ptr + i_b * s_qb + i_hk * s_qh
    k_base = k_ptr + i_b * s_kb + i_hk * s_kh
    v_base = v_ptr + i_b * s_vb + i_h * s_vh
    g_base = g_ptr + i_b * s_gb + i_h * s_gh
    b_base = beta_ptr + i_b * s_bb + i_h * s_bh
    o_base = o_ptr + i_b * s_ob + i_h * s_oh

    S = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        S = tl.load(h0_ptr + i_n * s_0n + i_h * s_0h + d[:, None] * s_0k + cols[None, :], mask=smask,
                    other=0.0).to(tl.float32)
    for i in range(0, eos - bos):
        t = bos + i64(i)
        b_q = tl.load(q_base + t * s_qt + d, mask=dmask, other=0.0).to(tl.float32)
        b_k = tl.load(k_base + t * s_kt + d, mask=dmask, other=0.0).to(tl.float32)
        b_v = tl.load(v_base + t * s_vt + cols, mask=cmask, other=0.0).to(tl.float32)
        b_beta = tl.load(b_base + t * s_bt).to(tl.float32)
        if L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 0) + 1e-6)
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 0) + 1e-6)
        if USE_G:
            S = S * tl.exp(tl.load(g_base + t * s_gt).to(tl.float32))
        e = b_v - tl.sum(S * b_k[:, None], 0)
        S = S + b_k[:, None] * (b_beta * e)[None, :]
        b_o = tl.sum(S * b_q[:, None], 0) * scale
        tl.store(o_base + t * s_ot + cols, b_o.to(o_ptr.dtype.element_ty), mask=cmask)
    if STORE_FINAL:
        tl.store(ht_ptr + i_n * s_tn + i_h * s_th + d[:, None] * s_tk + cols[None, :], S, mask=smask)
