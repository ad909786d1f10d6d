"""Numpy reference kernels: the specification the C kernels are tested against.

Written for clarity, not speed. Quantized matmuls reproduce llama.cpp's arithmetic: activations are quantized
to Q8_0 blocks and each block's integer dot product is scaled by the two block scales.
"""
from __future__ import annotations

import numpy as np

from ..tensor import GGMLType, Tensor

# ==== quantization and matmul (owner: matmul helper) =====================================================
# Byte layouts (llama.cpp): Q8_0 block = f16 d + int8 q[32] (34 B); Q4_0 block = f16 d + uint8 q[16] (18 B),
# element j in the low nibble of q[j], element j + 16 in the high nibble, value (nibble - 8) * d.
from ..errors import UnsupportedError  # noqa: E402
from ..tensor import KERNEL_TYPES  # noqa: E402

QK = 32  # elements per Q8_0 / Q4_0 block
_FLOAT_DTYPES = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.BF16: np.uint16}


def check_kernel_type(ggml_type, what: str = "tensor") -> GGMLType:
    """The GGMLType if the kernels compute on it, else UnsupportedError naming `what`."""
    try:
        t = GGMLType(ggml_type)
    except ValueError:
        raise UnsupportedError(f"{what}: unknown tensor type {ggml_type!r}") from None
    if t not in KERNEL_TYPES:
        names = ", ".join(k.name for k in KERNEL_TYPES)
        raise UnsupportedError(f"{what}: tensor type {t.name} has no kernel (supported: {names})")
    return t


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even on the top 16 bits; NaN stays a (quiet) NaN."""
    u = x.astype(np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def _round_half_away(v: np.ndarray) -> np.ndarray:
    t = np.trunc(v)
    f = v - t  # exact in f32
    return t + (f >= 0.5) - (f <= -0.5)


def _inverse(d: np.ndarray) -> np.ndarray:
    """1 / d in f32, 0 where d == 0."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)


def quantize_q8_0_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [n, 32] -> (d f16 [n], q int8 [n, 32]): d = amax / 127, q = round-half-away(x * (1 / d))."""
    d = (np.abs(x).max(axis=-1) / np.float32(127)).astype(np.float32)
    q = _round_half_away(x * _inverse(d)[:, None]).astype(np.int8)
    return d.astype(np.float16), q


def _quantize_q4_0_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [n, 32] -> (d f16 [n], nibbles uint8 [n, 32]); m = first element of largest |x|, d = m / -8."""
    m = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[:, None], axis=-1)[:, 0]
    d = (m / np.float32(-8)).astype(np.float32)
    q = np.trunc(x * _inverse(d)[:, None] + np.float32(8.5)).clip(0, 15).astype(np.uint8)
    return d.astype(np.float16), q


def quantize(x, ggml_type) -> np.ndarray:
    """x f32 [R, K] -> data in Tensor layout: f32/f16/uint16 (bf16) [R, K] or uint8 [R, row_bytes]."""
    t = check_kernel_type(ggml_type, "quantize")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"quantize: x must be 2-D [rows, cols], got shape {x.shape}")
    if t == GGMLType.F32:
        return x.copy()
    if t == GGMLType.F16:
        return x.astype(np.float16)
    if t == GGMLType.BF16:
        return _f32_to_bf16(x)
    n_rows, n_cols = x.shape
    if n_cols % QK:
        raise ValueError(f"quantize: {t.name} rows need a multiple of {QK} columns, got {n_cols}")
    blocks = x.reshape(-1, QK)
    if t == GGMLType.Q8_0:
        d, q = quantize_q8_0_blocks(blocks)
        qs = q.view(np.uint8)
    else:
        d, q = _quantize_q4_0_blocks(blocks)
        qs = q[:, :16] | (q[:, 16:] << 4)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), qs], axis=1)
    return out.reshape(n_rows, -1)


def _blocks(t: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Block tensor -> (d f32 [n_rows, nb], integer values int8 [n_rows, nb, 32])."""
    raw = np.ascontiguousarray(t.data).reshape(t.n_rows, -1)
    nb = t.n_cols // QK
    size = 34 if t.type == GGMLType.Q8_0 else 18
    b = raw.reshape(t.n_rows, nb, size)
    d = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    if t.type == GGMLType.Q8_0:
        return d, b[..., 2:].view(np.int8)
    qs = b[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - np.int8(8)
    return d, q


def dequantize(t: Tensor) -> np.ndarray:
    """Tensor -> f32 array of t.shape."""
    ty = check_kernel_type(t.type, t.name)
    if ty == GGMLType.F32:
        return np.array(t.data, dtype=np.float32).reshape(t.shape)
    if ty == GGMLType.F16:
        return np.asarray(t.data, dtype=np.float16).astype(np.float32).reshape(t.shape)
    if ty == GGMLType.BF16:
        return (np.asarray(t.data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
    d, q = _blocks(t)
    return (d[..., None] * q.astype(np.float32)).reshape(t.shape)


def matmul(w: Tensor, x) -> np.ndarray:
    """y[t, r] = sum_c w[r, c] x[t, c]; x f32 [K] -> [M] or [N, K] -> [N, M]. Float types in f64, then f32.
    Q8_0/Q4_0: x is quantized to Q8_0 blocks (d rounded to f16), each block's integer dot is exact and
    scaled by d_w * d_x, summed in f64."""
    ty = check_kernel_type(w.type, w.name)
    x = np.asarray(x, dtype=np.float32)
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    if x2.ndim != 2 or x2.shape[1] != w.n_cols:
        raise ValueError(f"matmul {w.name}: x has shape {x.shape}, expected [..., {w.n_cols}]")
    if ty in _FLOAT_DTYPES:
        wf = dequantize(w).reshape(w.n_rows, w.n_cols).astype(np.float64)
        y = x2.astype(np.float64) @ wf.T
    else:
        dw, qw = _blocks(w)                                    # [M, nb], [M, nb, 32]
        dx, qx = quantize_q8_0_blocks(x2.reshape(-1, QK))
        nb = w.n_cols // QK
        dx = dx.astype(np.float64).reshape(len(x2), nb)        # [N, nb]
        qx = qx.reshape(len(x2), nb, QK)
        # integer dots per block, exact in f64: [nb, M, 32] @ [nb, 32, N] -> [nb, M, N]
        isum = np.matmul(qw.transpose(1, 0, 2).astype(np.float64), qx.transpose(1, 2, 0).astype(np.float64))
        y = np.einsum("mb,tb,bmt->tm", dw.astype(np.float64), dx, isum)
    y = y.astype(np.float32)
    return y[0] if x.ndim == 1 else y


def get_rows(w: Tensor, ids) -> np.ndarray:
    """Embedding lookup: f32 [N, K] = dequantized rows ids of w."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"get_rows {w.name}: ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    if len(ids) and (ids.min() < 0 or ids.max() >= w.n_rows):
        raise IndexError(f"get_rows {w.name}: ids must be in [0, {w.n_rows}), got {ids.min()}..{ids.max()}")
    return dequantize(w).reshape(w.n_rows, w.n_cols)[ids]


# ==== norms, rope, softmax, attention, activations (owner: ops helper) ====================================
# Computed in float64 and rounded to float32 once at the end, so the spec is as exact as numpy allows.


def rmsnorm(x, w, eps) -> np.ndarray:
    """x / sqrt(mean(x^2, last dim) + eps) * w: a new f32 array of x's shape (w f32 [D] or None)."""
    x64 = np.asarray(x, dtype=np.float64)
    y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + float(eps))
    if w is not None:
        y = y * np.asarray(w, dtype=np.float64)
    return y.astype(np.float32)


def layernorm(x, w, b, eps) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * w + b over the last dim (biased variance); w, b f32 [D] or None."""
    x64 = np.asarray(x, dtype=np.float64)
    c = x64 - np.mean(x64, axis=-1, keepdims=True)
    y = c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + float(eps))
    if w is not None:
        y = y * np.asarray(w, dtype=np.float64)
    if b is not None:
        y = y + np.asarray(b, dtype=np.float64)
    return y.astype(np.float32)


def rope(x, pos, n_rot, freq_base, freq_scale, neox) -> np.ndarray:
    """Rotates x f32 [N, H, D] in place and returns it. Pair i < n_rot/2 of token t turns by
    pos[t] * freq_scale * freq_base^(-2i/n_rot); pairs are (2i, 2i+1) (normal) or (i, i + n_rot/2) (neox)."""
    half = n_rot // 2
    inv_freq = float(freq_base) ** (-2.0 * np.arange(half) / n_rot)
    theta = np.asarray(pos, dtype=np.float64)[:, None] * (float(freq_scale) * inv_freq)  # [N, half]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]  # broadcast over heads
    if neox:
        ia, ib = np.arange(half), np.arange(half) + half
    else:
        ia, ib = np.arange(0, n_rot, 2), np.arange(1, n_rot, 2)
    a, b = x[..., ia].astype(np.float64), x[..., ib].astype(np.float64)
    x[..., ia] = a * c - b * s
    x[..., ib] = a * s + b * c
    return x


def softmax(x) -> np.ndarray:
    """Softmax over the last dim of x f32, in place (max subtracted first); returns x."""
    x64 = np.asarray(x, dtype=np.float64)
    e = np.exp(x64 - np.max(x64, axis=-1, keepdims=True))
    x[...] = e / np.sum(e, axis=-1, keepdims=True)
    return x


def attention(q, k, v, pos0, window, scale) -> np.ndarray:
    """Causal grouped-query attention. q f32 [N, H, D] (token t at position pos0 + t); k, v f16 [Hkv, n_ctx, D].
    Query head h reads kv head h // (H // Hkv); position p sees j <= p with j > p - window when window > 0.
    Returns f32 [N, H, D]."""
    n_tok, n_head, _ = q.shape
    n_rep = n_head // k.shape[0]
    out = np.empty(q.shape, dtype=np.float32)
    for t in range(n_tok):
        p = pos0 + t
        j0 = max(0, p - window + 1) if window > 0 else 0
        for h in range(n_head):
            kh = k[h // n_rep, j0:p + 1].astype(np.float64)  # [n, D]
            vh = v[h // n_rep, j0:p + 1].astype(np.float64)
            s = float(scale) * (kh @ q[t, h].astype(np.float64))
            w = np.exp(s - s.max())
            out[t, h] = (w / w.sum()) @ vh
    return out


def relu(x) -> np.ndarray:
    return np.maximum(np.asarray(x, dtype=np.float32), np.float32(0))


def silu(x) -> np.ndarray:
    """x * sigmoid(x)."""
    x64 = np.asarray(x, dtype=np.float64)
    return (x64 / (1.0 + np.exp(-x64))).astype(np.float32)


def _gelu64(x64: np.ndarray) -> np.ndarray:
    # 0.5 (1 + tanh(u)) == 1 / (1 + e^(-2u)); the second form keeps full relative precision for u << 0,
    # where 1 + tanh(u) cancels to nothing even in float64
    u = np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64**3)
    with np.errstate(over="ignore"):
        return x64 / (1.0 + np.exp(-2.0 * u))


def gelu(x) -> np.ndarray:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return _gelu64(np.asarray(x, dtype=np.float64)).astype(np.float32)


def swiglu(g, u) -> np.ndarray:
    """silu(g) * u."""
    g64 = np.asarray(g, dtype=np.float64)
    return (g64 / (1.0 + np.exp(-g64)) * np.asarray(u, dtype=np.float64)).astype(np.float32)


def geglu(g, u) -> np.ndarray:
    """gelu(g) * u."""
    return (_gelu64(np.asarray(g, dtype=np.float64)) * np.asarray(u, dtype=np.float64)).astype(np.float32)


class RefKernels:
    """The numpy kernels in the same shape as cpu.CpuKernels, so a model can run on either."""

    n_threads = 1

    def __getattr__(self, name):
        fn = globals().get(name)
        if fn is None or not callable(fn):
            raise AttributeError(name)
        return fn

    def close(self) -> None:
        pass


# ==== sparse FFN (owner: sparse helper) ==================================================================
# Semantics: FORMATS.md section 2. `rows` lists neurons (rows of ffn_down_t, n_embd values each) in ascending
# order; h holds their activations per token. Validation is shared with cpu.py so both raise the same errors.


def check_sparse_rows(what: str, rows, n_rows: int) -> np.ndarray:
    """rows as a C-contiguous int32 array [n_sel]: strictly ascending, every entry in [0, n_rows)."""
    r = np.asarray(rows)
    if r.ndim != 1 or (r.dtype.kind not in "iu" and r.size):
        raise ValueError(f"{what}: rows must be a 1-D integer array, got {r.dtype} {r.shape}")
    if r.size:
        # order first, on the caller's dtype, so that a wide integer cannot wrap into range in the cast
        if r.size > 1 and not (r[1:] > r[:-1]).all():
            raise ValueError(f"{what}: rows must be strictly ascending")
        lo, hi = int(r[0]), int(r[-1])
        if lo < 0 or hi >= n_rows:
            raise IndexError(f"{what}: rows must be in [0, {n_rows}), got {lo}..{hi}")
        if r.dtype != np.int32 or not r.flags.c_contiguous:
            r = np.ascontiguousarray(r, dtype=np.int32)
    elif r.dtype != np.int32:
        r = np.zeros(0, np.int32)
    return r


def check_sparse_h(what: str, h, n_sel: int) -> np.ndarray:
    """h as a C-contiguous float32 array [n_tok, n_sel] (a 1-D h [n_sel] is one token)."""
    if not isinstance(h, np.ndarray) or h.dtype != np.float32:
        raise ValueError(f"{what}: h must be a float32 array, got {getattr(h, 'dtype', type(h).__name__)}")
    if h.ndim not in (1, 2) or h.shape[-1] != n_sel:
        raise ValueError(f"{what}: h must have shape [{n_sel}] or [n_tok, {n_sel}] to match rows, got {h.shape}")
    return np.ascontiguousarray(h.reshape(-1, n_sel))


def axpy_rows(w: Tensor, rows, h) -> np.ndarray:
    """y[t, :] = sum_j h[t, j] * w[rows[j], :] over j with h[t, j] != 0, in f64 rounded to f32 once.
    h f32 [n_sel] -> y [n_cols], or [n_tok, n_sel] -> [n_tok, n_cols]. Rows whose h is zero for every token
    take no part (a non-finite weight there does not leak into y)."""
    check_kernel_type(w.type, w.name)
    what = f"axpy_rows {w.name}"
    if len(w.shape) != 2:
        raise ValueError(f"{what}: the weight must be 2-D, got shape {w.shape}")
    r = check_sparse_rows(what, rows, w.n_rows)
    h2 = check_sparse_h(what, h, len(r))
    keep = (h2 != 0).any(axis=0)
    wd = dequantize(w).reshape(w.n_rows, w.n_cols)[r[keep]].astype(np.float64)
    y = (h2[:, keep].astype(np.float64) @ wd).astype(np.float32)
    return y[0] if np.ndim(h) == 1 else y


def _check_vector(what: str, name: str, x) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 1:
        raise ValueError(f"{what}: {name} must be a 1-D float32 array, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    return np.ascontiguousarray(x)


def select_active(logits, threshold) -> np.ndarray:
    """Ascending int32 indices i with logits[i] >= threshold (predictor mode; NaN logits are inactive)."""
    logits = _check_vector("select_active", "logits", logits)
    if np.isnan(threshold):
        raise ValueError("select_active: threshold is NaN")
    return np.flatnonzero(logits >= np.float32(threshold)).astype(np.int32)


def select_nonzero(x) -> np.ndarray:
    """Ascending int32 indices i with x[i] != 0 (exact mode, after ReLU; NaN counts as nonzero)."""
    return np.flatnonzero(_check_vector("select_nonzero", "x", x)).astype(np.int32)
