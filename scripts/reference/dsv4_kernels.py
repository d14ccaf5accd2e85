"""Pure-PyTorch float32 stand-ins for the official DeepSeek V4 `inference/kernel.py`.

The official kernel.py is written in tilelang and works on bf16/fp8/fp4 tensors. For golden
data we run the official `model.py` with every weight and activation in float32, so this
module replaces `kernel` (it is installed as sys.modules["kernel"] before model.py is
imported). Semantics follow the official tilelang kernels:

- act_quant(..., inplace=True): FP8 (e4m3fn) quantise-dequantise simulation per block:
  amax = max(|x|, 1e-4); scale = 2^ceil(log2(amax * f32(1/448))) (exact exponent arithmetic,
  as the kernel's bit tricks); q = clamp(x / scale, +-448) rounded to the nearest e4m3fn value
  (ties to even code, subnormals included); x = q * scale.
  NOTE: some public copies of the tilelang kernel cast to `out_dtype` (== the input dtype when
  inplace) instead of FP8, i.e. they never round to the FP8 grid; later copies cast to FP8.
  We implement the FP8 rounding (QAT semantics; ds4.c agrees).
- fp4_act_quant(..., inplace=True): FP4 (e2m1) simulation per 32-block: amax =
  max(|x|, 6*2^-126); scale = 2^ceil(log2(amax * f32(1/6))); grid {0,.5,1,1.5,2,3,4,6},
  ties to even code.
- sparse_attn: gather the top-k KV rows (index -1 = masked), softmax over the scores plus one
  extra "sink" logit per head (attn_sink) whose value row is zero.
- hc_split_sinkhorn: pre = sigmoid(m*s0+b)+eps, post = 2*sigmoid(m*s1+b),
  comb = softmax(m*s2+b over the last axis)+eps, then column-normalise, then
  (iters-1) x (row-normalise, column-normalise), each with +eps in the denominator.
- hadamard(x): normalised Walsh-Hadamard transform (Sylvester order) as a butterfly
  (stride 1, 2, 4, ...), then times f32(n^-0.5); replaces fast_hadamard_transform.

fp8_gemm / fp4_gemm are not needed (all weights are float32) and raise.
"""
import math
import torch

F32_INV_448 = None  # filled lazily (device/dtype independent scalars)

# Statistics a caller can inspect (mechanism coverage), reset by stats_reset(); collected only
# while COLLECT is true (the Sinkhorn statistics synchronise the device).
STATS = {}
COLLECT = False


def stats_reset():
    STATS.clear()
    STATS.update({
        "sinkhorn_calls": 0,
        "sinkhorn_max_rowsum_dev": 0.0,   # max |row sum - 1| of comb after the last iteration
        "sinkhorn_max_last_delta": 0.0,   # max |comb_iters - comb_(iters-1)|
        "fp8_calls": 0, "fp8_elems": 0,
        "fp4_calls": 0, "fp4_elems": 0,
    })


stats_reset()


def _pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(v)) for v > 0, exactly (frexp, no float log2)."""
    m, e = torch.frexp(v)
    e = torch.where(m == 0.5, e - 1, e)
    return torch.ldexp(torch.ones_like(v), e)


def e4m3_round(y: torch.Tensor) -> torch.Tensor:
    """Round f32 values (|y| <= 448) to the nearest e4m3fn value, ties to even."""
    a = y.abs()
    _, e = torch.frexp(a)              # a = m * 2^e, m in [0.5, 1)  => a = 1.f * 2^(e-1)
    qexp = torch.clamp(e - 1, min=-6) - 3
    quantum = torch.ldexp(torch.ones_like(a), qexp)
    r = torch.round(a / quantum) * quantum   # torch.round: half to even
    return torch.copysign(r, y)


def e2m1_round(y: torch.Tensor) -> torch.Tensor:
    """Round f32 values (|y| <= 6) to the nearest e2m1 value, ties to even code."""
    a = y.abs()
    quantum = torch.where(a < 2, torch.full_like(a, 0.5), torch.where(a < 4, torch.ones_like(a), torch.full_like(a, 2.0)))
    r = torch.round(a / quantum) * quantum
    return torch.copysign(r, y)


def _c(x: torch.Tensor, v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32, device=x.device)


def act_quant(x: torch.Tensor, block_size: int = 128, scale_fmt=None,
              scale_dtype=torch.float32, inplace: bool = False):
    if not inplace:
        raise NotImplementedError("only the in-place FP8 simulation is used with f32 weights")
    if scale_fmt is None:
        raise NotImplementedError("expected scale_fmt='ue8m0' (power-of-two scales), as in the Flash config")
    n = x.size(-1)
    assert n % block_size == 0
    xf = x.float().unflatten(-1, (n // block_size, block_size))
    amax = xf.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    s = _pow2_ceil(amax * _c(x, 1.0 / 448.0))
    y = e4m3_round(torch.clamp(xf / s, -448.0, 448.0)) * s
    x.copy_(y.flatten(-2))
    STATS["fp8_calls"] += 1
    STATS["fp8_elems"] += x.numel()
    return x


def fp4_act_quant(x: torch.Tensor, block_size: int = 32, inplace: bool = False):
    if not inplace:
        raise NotImplementedError("only the in-place FP4 simulation is used")
    n = x.size(-1)
    assert n % block_size == 0
    xf = x.float().unflatten(-1, (n // block_size, block_size))
    amax = xf.abs().amax(-1, keepdim=True).clamp(min=6 * 2.0 ** -126)
    s = _pow2_ceil(amax * _c(x, 1.0 / 6.0))
    y = e2m1_round(torch.clamp(xf / s, -6.0, 6.0)) * s
    x.copy_(y.flatten(-2))
    STATS["fp4_calls"] += 1
    STATS["fp4_elems"] += x.numel()
    return x


def fp8_gemm(*args, **kwargs):
    raise NotImplementedError("fp8 weights are not used by the golden generator")


def fp4_gemm(*args, **kwargs):
    raise NotImplementedError("fp4 weights are not used by the golden generator")


def sparse_attn(q: torch.Tensor, kv: torch.Tensor, attn_sink: torch.Tensor,
                topk_idxs: torch.Tensor, softmax_scale: float, chunk: int = 256) -> torch.Tensor:
    """q [b,s,h,d], kv [b,n,d], attn_sink [h], topk_idxs [b,s,k] (-1 = none) -> o [b,s,h,d]."""
    b, s, h, d = q.shape
    out = torch.empty_like(q)
    bidx = torch.arange(b, device=q.device).view(b, 1, 1)
    for c0 in range(0, s, chunk):
        idx = topk_idxs[:, c0:c0 + chunk].long()
        valid = idx >= 0
        g = kv[bidx, idx.clamp(min=0)]                       # [b,c,k,d]
        qc = q[:, c0:c0 + chunk].float()
        sc = torch.einsum("bchd,bckd->bchk", qc, g.float()) * softmax_scale
        sc = sc.masked_fill(~valid[:, :, None, :], float("-inf"))
        sink = attn_sink.float().view(1, 1, h, 1).expand(b, sc.size(1), h, 1)
        p = torch.softmax(torch.cat([sc, sink], dim=-1), dim=-1)[..., :-1]
        out[:, c0:c0 + chunk] = torch.einsum("bchk,bckd->bchd", p, g.float()).to(out.dtype)
    return out


def hc_split_sinkhorn(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                      hc_mult: int = 4, sinkhorn_iters: int = 20, eps: float = 1e-6):
    hc = hc_mult
    m = mixes.float()
    pre = torch.sigmoid(m[..., :hc] * hc_scale[0] + hc_base[:hc]) + eps
    post = 2 * torch.sigmoid(m[..., hc:2 * hc] * hc_scale[1] + hc_base[hc:2 * hc])
    comb = (m[..., 2 * hc:] * hc_scale[2] + hc_base[2 * hc:]).unflatten(-1, (hc, hc))
    comb = torch.softmax(comb, dim=-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    prev = comb
    for _ in range(sinkhorn_iters - 1):
        prev = comb
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    if not COLLECT:
        return pre, post, comb
    STATS["sinkhorn_calls"] += 1
    STATS["sinkhorn_max_rowsum_dev"] = max(STATS["sinkhorn_max_rowsum_dev"],
                                           float((comb.sum(-1) - 1).abs().max()))
    STATS["sinkhorn_max_last_delta"] = max(STATS["sinkhorn_max_last_delta"],
                                           float((comb - prev).abs().max()))
    return pre, post, comb


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Normalised Walsh-Hadamard transform over the last axis (Sylvester order), butterfly."""
    n = x.size(-1)
    assert n & (n - 1) == 0
    y = x.float()
    shape = y.shape
    stride = 1
    while stride < n:
        y = y.reshape(*shape[:-1], n // (2 * stride), 2, stride)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack([a + b, a - b], dim=-2)
        stride *= 2
    y = y.reshape(shape)
    return y * torch.tensor(n ** -0.5, dtype=torch.float32, device=y.device)
