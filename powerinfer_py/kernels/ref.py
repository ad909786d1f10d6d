"""Numpy reference kernels: the specification the C kernels are tested against.

Written for clarity, not speed. Quantized matmuls reproduce llama.cpp's arithmetic: activations are quantized
to Q8_0 blocks (Q8_K super-blocks for K-quants) and each block's integer dot product is scaled by the block scales.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gguf.types import GGMLType, Tensor

# ==== quantization and matmul (owner: matmul helper) =====================================================
# Byte layouts (llama.cpp): Q8_0 block = f16 d + int8 q[32] (34 B); Q4_0 block = f16 d + uint8 q[16] (18 B),
# element j in the low nibble of q[j], element j + 16 in the high nibble, value (nibble - 8) * d; Q5_0 = f16 d +
# uint32 qh + q[16] (22 B), bit 4 of element j in bit j of qh, value (q - 16) * d. Q4_1 / Q5_1 = f16 d, f16 m
# (+ qh) + q[16] (20 / 24 B), value d * q + m. IQ4_NL = f16 d + q[16] (18 B), value d * IQ4NL_VALUES[nibble].
# MXFP4 = E8M0 exponent byte e + q[16] (17 B), value 2^(e - 128) * MXFP4_VALUES[nibble] (doubled E2M1 levels).
# K-quants: csrc/quants.h.
from ..errors import UnsupportedError  # noqa: E402
from ..gguf.types import FLOAT_DTYPES as _FLOAT_DTYPES, KERNEL_TYPES  # noqa: E402
from . import ref_iq as _iq  # noqa: E402

QK = 32  # elements per Q8_0 / Q4_0 / Q5_0 block
QK_K = 256  # elements per K-quant super-block (and per Q8_K activation block)
_Q32_TYPES = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_1, GGMLType.Q5_1, GGMLType.IQ4_NL,
              GGMLType.MXFP4)
_MIN_TYPES = (GGMLType.Q4_1, GGMLType.Q5_1)  # value d * q + m: the activations' Q8_1 sum s enters (see matmul)
#: IQ4_NL's 16 levels (llama.cpp's kvalues_iq4nl)
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
#: MXFP4's 16 E2M1 codes (sign, 2-bit exponent, 1-bit mantissa: 0, 0.5, 1, 1.5, 2, 3, 4, 6), doubled to integers
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
_K_TYPES = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,  # activations quantized to Q8_K
            GGMLType.Q2_K,
            GGMLType.Q3_K,
            GGMLType.IQ4_XS,  # 8 sub-blocks of 32 with 6-bit scales, IQ4_NL's levels
            ) + _iq.IQ_TYPES  # grid values with sign bits, 4-bit scales 2 ls + 1
_BLOCK_BYTES = {GGMLType.Q8_0: 34, GGMLType.Q4_0: 18, GGMLType.Q5_0: 22,
                GGMLType.Q4_1: 20, GGMLType.Q5_1: 24, GGMLType.IQ4_NL: 18, GGMLType.MXFP4: 17,
                GGMLType.Q4_K: 144, GGMLType.Q5_K: 176, GGMLType.Q6_K: 210,
                GGMLType.Q2_K: 84,
                GGMLType.Q3_K: 110,
                GGMLType.IQ4_XS: 136,
                **_iq.BLOCK_BYTES,
                }
_TWO_BIT_SHIFTS = np.array([0, 2, 4, 6], np.uint8)[:, None]  # Q2_K/Q3_K: 2-bit field j of a byte


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


def block_size(ggml_type) -> int:
    """Elements per block: 1 (float types), 32, or 256 (K-quants)."""
    return QK_K if ggml_type in _K_TYPES else 1 if ggml_type in _FLOAT_DTYPES else QK


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


def _signed_amax(x: np.ndarray) -> np.ndarray:
    """Per row of x [n, k]: the first element of largest magnitude, sign kept."""
    return np.take_along_axis(x, np.abs(x).argmax(axis=-1)[:, None], axis=-1)[:, 0]


def quantize_q8_0_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [n, 32] -> (d f16 [n], q int8 [n, 32]): d = amax / 127, q = round-half-away(x * (1 / d))."""
    d = (np.abs(x).max(axis=-1) / np.float32(127)).astype(np.float32)
    q = _round_half_away(x * _inverse(d)[:, None]).astype(np.int8)
    return d.astype(np.float16), q


def quantize_q8_K_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x f32 [n, 256] -> (d f32 [n], q int8 [n, 256], bsums int32 [n, 16]) as llama.cpp's Q8_K: m = first
    element of largest magnitude, iscale = -127 / m, q = min(127, round-half-even(iscale * x)), d = 1 / iscale."""
    x = np.asarray(x, dtype=np.float32)
    m = _signed_amax(x)
    with np.errstate(divide="ignore"):
        iscale = np.where(m != 0, np.float32(-127) / m, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(x * iscale[:, None]), 127).astype(np.int8)
    d = _inverse(iscale)
    return d, q, q.reshape(len(x), 16, 16).sum(axis=-1, dtype=np.int32)


def _quantize_q_0_blocks(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 / Q5_0: x f32 [n, 32] -> (d f16 [n], unsigned q uint8 [n, 32]); d = m / -2^(bits-1)."""
    half = 1 << (bits - 1)
    d = (_signed_amax(x) / np.float32(-half)).astype(np.float32)
    q = np.trunc(x * _inverse(d)[:, None] + np.float32(half + 0.5)).clip(0, 2 * half - 1).astype(np.uint8)
    return d.astype(np.float16), q


def _quantize_q_1_blocks(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 / Q5_1: x f32 [n, 32] -> (d f16, m f16 [n], q uint8 [n, 32]); d = (max - min) / (2^bits - 1),
    m = min, q = min(2^bits - 1, trunc((x - min) * (1 / d) + 0.5))."""
    qmax = (1 << bits) - 1
    lo, hi = x.min(axis=-1), x.max(axis=-1)
    d = ((hi - lo) / np.float32(qmax)).astype(np.float32)
    q = np.minimum(np.trunc((x - lo[:, None]) * _inverse(d)[:, None] + np.float32(0.5)), qmax).astype(np.uint8)
    return d.astype(np.float16), lo.astype(np.float16), q


def quantize(x, ggml_type) -> np.ndarray:
    """x f32 [R, K] -> data in Tensor layout: f32/f16/uint16 (bf16) [R, K] or uint8 [R, row_bytes]."""
    t = check_kernel_type(ggml_type, "quantize")
    if t in _K_TYPES or t in (GGMLType.IQ4_NL, GGMLType.MXFP4):
        raise UnsupportedError(f"quantize: {t.name} is computed on but not produced by these kernels")
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
        parts = [q.view(np.uint8)]
    else:
        if t in _MIN_TYPES:
            d, m, q = _quantize_q_1_blocks(blocks, 4 if t == GGMLType.Q4_1 else 5)
        else:
            d, q = _quantize_q_0_blocks(blocks, 4 if t == GGMLType.Q4_0 else 5)
        qs = (q[:, :16] & 0x0F) | (q[:, 16:] << 4)
        qh = np.packbits(q >> 4, axis=-1, bitorder="little")  # Q5_*: bit 4 of element j = bit j of qh
        parts = [qs] if t in (GGMLType.Q4_0, GGMLType.Q4_1) else [qh, qs]
        if t in _MIN_TYPES:
            parts = [m.view(np.uint8).reshape(-1, 2)] + parts
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2)] + parts, axis=1)
    return out.reshape(n_rows, -1)


def _f16(b: np.ndarray) -> np.ndarray:
    """uint8 [..., 2] -> f32 [...] (little-endian f16)."""
    return b.copy().view(np.float16)[..., 0].astype(np.float32)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """MXFP4 exponent bytes uint8 [...] -> f32 2^(e - 128) (the block scale 2^(e - 127) halved for the doubled
    levels), built from its bits: e = 0, 1 are the subnormals 2^-128, 2^-127."""
    e = np.asarray(e).astype(np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32).view(np.float32)


def _raw_blocks(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.data).reshape(t.n_rows, t.n_cols // QK, _BLOCK_BYTES[t.type])


def _mins(t: Tensor) -> np.ndarray:
    """Q4_1/Q5_1 tensor -> m f32 [n_rows, nb]."""
    return _f16(_raw_blocks(t)[..., 2:4])


def _blocks(t: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """32-element block tensor -> (d f32 [n_rows, nb], integer values int8 [n_rows, nb, 32]): Q4_0 / Q5_0
    minus 8 / 16, Q4_1 / Q5_1 unsigned (their m: _mins), IQ4_NL / MXFP4 the table's levels (MXFP4: d from e)."""
    b = _raw_blocks(t)
    if t.type == GGMLType.MXFP4:
        qs = b[..., 1:]
        return e8m0_half(b[..., 0]), MXFP4_VALUES[np.concatenate([qs & 0x0F, qs >> 4], axis=-1)]
    d = _f16(b[..., :2])
    if t.type == GGMLType.Q8_0:
        return d, b[..., 2:].view(np.int8)
    qs = b[..., -16:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8)
    if t.type == GGMLType.Q4_0:
        return d, q - np.int8(8)
    if t.type == GGMLType.Q4_1:
        return d, q
    if t.type == GGMLType.IQ4_NL:
        return d, IQ4NL_VALUES[q]
    qh = b[..., 4:8] if t.type == GGMLType.Q5_1 else b[..., 2:6]
    high = np.unpackbits(qh, axis=-1, bitorder="little").astype(np.int8)  # bit j of qh
    return d, q + (high << 4) - np.int8(16 if t.type == GGMLType.Q5_0 else 0)


def _k_blocks(t: Tensor) -> dict:
    """K-quant tensor -> integer parts, per row r, super-block s:
    q int8 [R, S, 256] (Q6_K: minus 32, Q3_K: minus 4, IQ4_XS: the IQ4_NL levels, IQ2/IQ3: grid * sign (ref_iq),
    sc: 2 ls + 1, d: d * f), sc int [R, S, G] (G = 8
    groups of 32 for Q4_K/Q5_K/IQ4_XS, 16 of 16 for Q2_K/Q3_K/Q6_K; Q3_K and IQ4_XS: the 6-bit scale minus 32),
    mn int [R, S, G] (Q2_K/Q4_K/Q5_K: the mins), d, dmin f32 [R, S]."""
    ns = t.n_cols // QK_K
    b = np.ascontiguousarray(t.data).reshape(t.n_rows, ns, _BLOCK_BYTES[t.type])
    if t.type in _iq.IQ_TYPES:
        return _iq.iq_blocks(t.type, b)
    if t.type == GGMLType.IQ4_XS:  # f16 d, uint16 scales_h, scales_l[4], qs[128]
        low = b[..., 4:8, None] >> np.array([0, 4], np.uint8)  # sub-block s: nibble s % 2 of scales_l[s // 2]
        high = b[..., 2:4].copy().view(np.uint16).astype(np.int64) >> (2 * np.arange(8))  # bits 2s, 2s + 1
        sc = (low.reshape(*b.shape[:2], 8).astype(np.int64) & 15) | ((high & 3) << 4)
        qs = b[..., 8:].reshape(*b.shape[:2], 8, 16)  # sub-block s: low nibbles, then high nibbles
        q = IQ4NL_VALUES[np.concatenate([qs & 0x0F, qs >> 4], axis=-1)].reshape(*b.shape[:2], QK_K)
        return {"q": q, "sc": sc - 32, "d": _f16(b[..., :2])}
    if t.type in (GGMLType.Q2_K, GGMLType.Q3_K):  # element 128n + 32j + l: bits 2j of qs[32n + l]
        qs = b[..., 16:80] if t.type == GGMLType.Q2_K else b[..., 32:96]
        q = ((qs.reshape(*b.shape[:2], 2, 1, 32) >> _TWO_BIT_SHIFTS) & 3).reshape(*b.shape[:2], QK_K).astype(np.int8)
        if t.type == GGMLType.Q2_K:
            scales = b[..., :16].astype(np.int64)
            return {"q": q, "sc": scales & 15, "mn": scales >> 4, "d": _f16(b[..., 80:82]), "dmin": _f16(b[..., 82:84])}
        high = (b[..., None, :32] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [R, S, 4n + j, l]
        q = q + (high.reshape(q.shape).astype(np.int8) << 2) - np.int8(4)
        packed = b[..., 96:108].astype(np.int64)
        low = np.concatenate([packed[..., :8] & 15, packed[..., :8] >> 4], axis=-1)  # group g: nibble g // 8
        top = (packed[..., None, 8:12] >> (2 * np.arange(4))[:, None]) & 3  # [R, S, g // 4, g % 4]
        sc = low | (top.reshape(low.shape) << 4)
        return {"q": q, "sc": sc - 32, "d": _f16(b[..., 108:110])}
    if t.type == GGMLType.Q6_K:
        ql, qh = b[..., :128].reshape(*b.shape[:2], 2, 2, 32), b[..., 128:192].reshape(*b.shape[:2], 2, 1, 32)
        low = np.concatenate([ql & 0x0F, ql >> 4], axis=-2)  # [R, S, half, i = 0..3, 32]
        high = (qh >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
        q = (low | (high << 4)).astype(np.int8).reshape(*b.shape[:2], QK_K) - np.int8(32)
        return {"q": q, "sc": b[..., 192:208].view(np.int8).astype(np.int64), "d": _f16(b[..., 208:210])}
    sc_bytes = b[..., 4:16].reshape(*b.shape[:2], 3, 4).astype(np.int64)
    lo, hi, mix = sc_bytes[..., 0, :], sc_bytes[..., 1, :], sc_bytes[..., 2, :]
    sc = np.concatenate([lo & 63, (mix & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 63, (mix >> 4) | ((hi >> 6) << 4)], axis=-1)
    qs = b[..., -128:].reshape(*b.shape[:2], 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-2).reshape(*b.shape[:2], QK_K)  # sub-block s = 32 values
    if t.type == GGMLType.Q5_K:
        qh = b[..., 16:48]  # bit s of qh[l] = bit 4 of element l of sub-block s
        q = q | (((qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4).reshape(q.shape)
    return {"q": q.astype(np.int8), "sc": sc, "mn": mn, "d": _f16(b[..., :2]), "dmin": _f16(b[..., 2:4])}


def transpose(a: np.ndarray) -> np.ndarray:
    """A contiguous copy of a 2-D array's transpose (the C kernels' transpose gives the same bytes, faster)."""
    return np.ascontiguousarray(np.asarray(a).T)


def dequantize(t: Tensor) -> np.ndarray:
    """Tensor -> f32 array of t.shape."""
    ty = check_kernel_type(t.type, t.name)
    if ty == GGMLType.F32:
        return np.array(t.data, dtype=np.float32).reshape(t.shape)
    if ty == GGMLType.F16:
        return np.asarray(t.data, dtype=np.float16).astype(np.float32).reshape(t.shape)
    if ty == GGMLType.BF16:
        return (np.asarray(t.data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
    if ty in _K_TYPES:  # value = (d * sc) * q - dmin * m, each product rounded to f32 (as llama.cpp, gguf)
        k = _k_blocks(t)
        g = k["sc"].shape[-1]
        q = k["q"].reshape(*k["q"].shape[:2], g, -1).astype(np.float32)
        y = (k["d"][..., None] * k["sc"].astype(np.float32))[..., None] * q
        if "mn" in k:
            y = y - (k["dmin"][..., None] * k["mn"].astype(np.float32))[..., None]
        return y.astype(np.float32).reshape(t.shape)
    d, q = _blocks(t)
    y = d[..., None] * q.astype(np.float32)
    if ty in _MIN_TYPES:
        y = y + _mins(t)[..., None]
    return y.reshape(t.shape)


def _group_dots(qw: np.ndarray, qx: np.ndarray) -> np.ndarray:
    """qw [M, B, L], qx [N, B, L] integers -> exact dots f64 [B, M, N] (|sums| << 2^53)."""
    return np.matmul(qw.transpose(1, 0, 2).astype(np.float64), qx.transpose(1, 2, 0).astype(np.float64))


def _matmul_quantized(w: Tensor, x2: np.ndarray, absolute: bool) -> np.ndarray:
    """f64 [N, M] by llama.cpp's arithmetic (absolute=True: the same sum over |terms|, for error bounds).
    32-element blocks: y = sum_b (d_w d_x)_b * (q_w . q_x)_b over blocks of 32 (x quantized to Q8_0); Q4_1 / Q5_1
    add sum_b m_b * s_b with s = f16(d * sum(q_x)), d the unrounded amax / 127 (llama.cpp's Q8_1 activations).
    K-quants: y = sum_s d_x * (d * sum_g sc_g (q_w . q_x)_g - dmin * sum_g m_g bsum_g) (x quantized to Q8_K)."""
    n = len(x2)
    f = np.abs if absolute else (lambda a: a)
    if w.type in _Q32_TYPES:
        dw, qw = _blocks(w)  # [M, nb], [M, nb, 32]
        dx, qx = quantize_q8_0_blocks(x2.reshape(-1, QK))
        nb = w.n_cols // QK
        isum = _group_dots(f(qw.astype(np.int64)), f(qx.reshape(n, nb, QK).astype(np.int64)))  # [nb, M, N]
        y = np.einsum("mb,tb,bmt->tm", f(dw.astype(np.float64)), f(dx.astype(np.float64).reshape(n, nb)), isum)
        if w.type in _MIN_TYPES:
            d_raw = (np.abs(x2.reshape(-1, QK)).max(axis=-1) / np.float32(127)).astype(np.float32)
            s = (d_raw * qx.astype(np.int64).sum(axis=-1).astype(np.float32)).astype(np.float16).astype(np.float64)
            y = y + f(s.reshape(n, nb)) @ f(_mins(w).astype(np.float64)).T
        return y
    k = _k_blocks(w)
    ns, g = w.n_cols // QK_K, k["sc"].shape[-1]
    dx, qx, bsums = quantize_q8_K_blocks(x2.reshape(-1, QK_K))
    m = w.n_rows
    dots = _group_dots(f(k["q"].astype(np.int64)).reshape(m, ns * g, -1),
                       f(qx.astype(np.int64)).reshape(n, ns * g, -1)).reshape(ns, g, m, n)
    isum = np.einsum("msg,sgmt->tms", f(k["sc"]).astype(np.float64), dots)  # [N, M, S]
    y = isum * f(k["d"].astype(np.float64))[None]
    if "mn" in k:  # Q2_K (16 mins), Q4_K / Q5_K (8 mins: pairs of bsums)
        gm = k["mn"].shape[-1]
        group_sums = bsums.reshape(n, ns, gm, 16 // gm).sum(axis=-1).astype(np.float64)  # [N, S, gm]
        imin = np.einsum("msg,tsg->tms", k["mn"].astype(np.float64), f(group_sums))
        y = y + (1.0 if absolute else -1.0) * imin * f(k["dmin"].astype(np.float64))[None]
    return np.einsum("tms,ts->tm", y, f(dx.astype(np.float64).reshape(n, ns)))


def _check_x(w: Tensor, x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    if x2.ndim != 2 or x2.shape[1] != w.n_cols:
        raise ValueError(f"matmul {w.name}: x has shape {x.shape}, expected [..., {w.n_cols}]")
    return x2


def bf16_round(x) -> np.ndarray:
    """x rounded to bf16 (nearest even), as f32."""
    return (_f32_to_bf16(np.asarray(x, np.float32)).astype(np.uint32) << 16).view(np.float32)


def operand(w: Tensor, x2: np.ndarray) -> np.ndarray:
    """x as every kernel multiplies it by w's values (mat-vec, row gather, AXPY): rounded to bf16 for BF16
    weights (nearest even, as llama.cpp does), else f32 as given."""
    return bf16_round(x2) if w.type == GGMLType.BF16 else x2


def matmul(w: Tensor, x) -> np.ndarray:
    """y[t, r] = sum_c w[r, c] x[t, c]; x f32 [K] -> [M] or [N, K] -> [N, M]. Float types in f64, then f32
    (BF16: on activations rounded to bf16, operand). Quantized types: llama.cpp's integer arithmetic (see
    _matmul_quantized), summed in f64."""
    ty = check_kernel_type(w.type, w.name)
    x2 = operand(w, _check_x(w, x))
    if ty in _FLOAT_DTYPES:
        wf = dequantize(w).reshape(w.n_rows, w.n_cols).astype(np.float64)
        y = x2.astype(np.float64) @ wf.T
    else:
        y = _matmul_quantized(w, x2, absolute=False)
    y = y.astype(np.float32)
    return y[0] if np.ndim(x) == 1 else y


def matmul_abs_terms(w: Tensor, x) -> np.ndarray:
    """f64 of matmul's shape: the sum of |every term| matmul adds up (for f32 rounding-error bounds)."""
    check_kernel_type(w.type, w.name)
    x2 = operand(w, _check_x(w, x))
    if w.type in _FLOAT_DTYPES:
        y = np.abs(x2.astype(np.float64)) @ np.abs(dequantize(w).reshape(w.n_rows, -1).astype(np.float64)).T
    else:
        y = _matmul_quantized(w, x2, absolute=True)
    return y[0] if np.ndim(x) == 1 else y


def check_rows(w: Tensor, rows) -> np.ndarray:
    """rows as int32 [n_sel] after checking: 1-D integers in [0, n_rows), ascending and distinct."""
    rows = np.asarray(rows)
    if rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise ValueError(f"matmul_rows {w.name}: rows must be a 1-D integer array, got {rows.dtype} {rows.shape}")
    if len(rows):
        if rows.min() < 0 or rows.max() >= w.n_rows:
            raise IndexError(f"matmul_rows {w.name}: rows must be in [0, {w.n_rows}), got {rows.min()}..{rows.max()}")
        if np.any(np.diff(rows) <= 0):
            raise ValueError(f"matmul_rows {w.name}: rows must be ascending and distinct")
    return rows.astype(np.int32)


def matmul_rows(w: Tensor, rows, x) -> np.ndarray:
    """y[t, j] = w[rows[j], :] . x[t, :]: x f32 [K] -> [n_sel] or [N, K] -> [N, n_sel] (rows ascending)."""
    rows = check_rows(w, rows)
    sub = Tensor(w.name, w.type, (len(rows), w.n_cols), np.asarray(w.data).reshape(w.n_rows, -1)[rows])
    if not len(rows):
        return np.zeros((0,) if np.ndim(x) == 1 else (len(_check_x(w, x)), 0), dtype=np.float32)
    return matmul(sub, x)


def check_experts(w: Tensor, experts, tok_off, x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """matmul_experts' argument checks (shared with cpu.py): (experts int32 [G], tok_off int64 [G + 1], x f32
    [T, K]) as C-contiguous arrays."""
    if len(w.shape) != 3:
        raise ValueError(f"matmul_experts {w.name}: the weight must be 3-D (n_expert, rows, cols), got {w.shape}")
    e = np.ascontiguousarray(experts, dtype=np.int32).reshape(-1)
    off = np.ascontiguousarray(tok_off, dtype=np.int64).reshape(-1)
    x = np.asarray(x)
    if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == w.shape[2]):
        raise ValueError(f"matmul_experts {w.name}: x must be f32 [T, {w.shape[2]}], got {x.dtype} {x.shape}")
    if len(off) != len(e) + 1 or off[0] != 0 or (np.diff(off) < 0).any() or off[-1] != len(x):
        raise ValueError(f"matmul_experts {w.name}: tok_off must rise from 0 to the {len(x)} tokens, one entry more "
                         f"than the {len(e)} experts")
    if len(e) and (e.min() < 0 or e.max() >= w.shape[0]):
        raise ValueError(f"matmul_experts {w.name}: experts must be in [0, {w.shape[0]})")
    return e, off, np.ascontiguousarray(x)


def matmul_experts(w: Tensor, experts, tok_off, x) -> np.ndarray:
    """y [T, rows] where the tokens tok_off[g] .. tok_off[g + 1] - 1 of x f32 [T, K] go through expert
    experts[g] of the 3-D weight w (n_expert, rows, K): matmul of that expert's slice, group by group."""
    e, off, x = check_experts(w, experts, tok_off, x)
    y = np.zeros((len(x), w.shape[1]), dtype=np.float32)
    for g, ex in enumerate(e):
        if off[g + 1] > off[g]:
            sub = Tensor(w.name, w.type, w.shape[1:], np.asarray(w.data)[ex])
            y[off[g]:off[g + 1]] = matmul(sub, x[off[g]:off[g + 1]])
    return y


def check_store_kv(dst, p0, x) -> None:
    """store_kv's argument checks (shared with cpu.py)."""
    if not (isinstance(dst, np.ndarray) and dst.dtype == np.float16 and dst.ndim == 3 and dst.flags.c_contiguous):
        raise ValueError("store_kv: the cache plane must be a C-contiguous float16 array [n_head_kv, n_ctx, head_dim]")
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 3 or x.shape[1:] != (dst.shape[0], dst.shape[2]):
        raise ValueError(f"store_kv: x must be f32 [N, {dst.shape[0]}, {dst.shape[2]}], got {x.dtype} {x.shape}")
    if not 0 <= p0 <= dst.shape[1] - x.shape[0]:
        raise ValueError(f"store_kv: positions {p0}..{p0 + x.shape[0] - 1} are outside the cache (n_ctx "
                         f"{dst.shape[1]})")


def store_kv(dst, p0, x) -> None:
    """Write x f32 [N, Hkv, D] into the f16 cache plane dst [Hkv, n_ctx, D] at positions p0 .. p0+N-1."""
    check_store_kv(dst, p0, x)
    dst[:, p0:p0 + x.shape[0]] = np.asarray(x).transpose(1, 0, 2)


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


def rope(x, pos, n_rot, freq_base, freq_scale, neox, freq_factors=None, mscale=1.0) -> np.ndarray:
    """Rotates x f32 [N, H, D] in place and returns it. Pair i < n_rot/2 of token t turns by
    pos[t] * freq_scale * freq_base^(-2i/n_rot) / freq_factors[i] (factors default to 1); pairs are (2i, 2i+1)
    (normal) or (i, i + n_rot/2) (neox). The rotated pairs are scaled by mscale (cos and sin times mscale)."""
    half = n_rot // 2
    inv_freq = float(freq_base) ** (-2.0 * np.arange(half) / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64).reshape(half)
    theta = np.asarray(pos, dtype=np.float64)[:, None] * (float(freq_scale) * inv_freq)  # [N, half]
    c, s = mscale * np.cos(theta)[:, None, :], mscale * np.sin(theta)[:, None, :]  # broadcast over heads
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


def attention(q, k, v, pos0, window, scale, softcap=0.0, sinks=None) -> np.ndarray:
    """Causal grouped-query attention. q f32 [N, H, D] (token t at position pos0 + t); k, v f16 [Hkv, n_ctx, D].
    Query head h reads kv head h // (H // Hkv); position p sees j <= p with j > p - window when window > 0.
    Scores are scale * q.k; softcap > 0 (Gemma 2) squashes them to softcap * tanh(score / softcap) before the
    softmax, 0 leaves them as they are. sinks (gpt-oss), f32 [H] or None: head h's sink logit joins its softmax's
    max and denominator but weighs no value row, so the weights sum to less than 1. Returns f32 [N, H, D]."""
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
            if softcap:
                s = float(softcap) * np.tanh(s / float(softcap))
            m = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            w = np.exp(s - m)
            total = w.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - m))
            out[t, h] = (w / total) @ vh
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
    """GELU, tanh approximation g(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as llama.cpp's CPU backend
    evaluates it (the engine GGUF models are checked against): on f32 x, 0 for x <= -10, x for x >= 10, else
    f16(g(f16(x))), g evaluated in f32 term by term as written above (as llama.cpp builds its f16 table), tanh
    rounded correctly to f32."""
    x = np.asarray(x, dtype=np.float32)
    f = np.float32
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).astype(np.float32)
        arg = f(0.7978845608028654) * h * (f(1) + f(0.044715) * h * h)
        tanh = np.tanh(arg.astype(np.float64)).astype(np.float32)  # a correctly rounded f32 tanh, as libm's tanhf
        g = f(0.5) * h * (f(1) + tanh)
        y = g.astype(np.float16).astype(np.float32)
    y = np.where(x >= 10.0, x, y)
    return np.where(x <= -10.0, np.float32(0), y).astype(np.float32)


def swiglu(g, u) -> np.ndarray:
    """silu(g) * u."""
    g64 = np.asarray(g, dtype=np.float64)
    return (g64 / (1.0 + np.exp(-g64)) * np.asarray(u, dtype=np.float64)).astype(np.float32)


def geglu(g, u) -> np.ndarray:
    """gelu(g) * u in f32 (gelu as above)."""
    return (gelu(g) * np.asarray(u, dtype=np.float32)).astype(np.float32)


class RefKernels:
    """The numpy kernels in the same shape as cpu.CpuKernels (kernels.Ops), so a model can run on either. No
    one-call steps: every layer takes the Python path, the specification the steps are tested against."""

    n_threads = 1
    steps = None

    def __getattr__(self, name):
        fn = globals().get(name)
        if fn is None or not callable(fn):
            raise AttributeError(name)
        return fn

    def close(self) -> None:
        pass


# ==== sparse FFN (owner: sparse helper) ==================================================================
# Semantics: docs/FORMATS.md section 2. `rows` lists neurons (rows of ffn_down_t, n_embd values each) in ascending
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
    return np.ascontiguousarray(h if h.ndim == 2 else h[None, :])


def axpy_rows(w: Tensor, rows, h) -> np.ndarray:
    """y[t, :] = sum_j h[t, j] * w[rows[j], :] over j with h[t, j] != 0, in f64 rounded to f32 once (BF16 rows:
    h rounded to bf16 first, operand).
    h f32 [n_sel] -> y [n_cols], or [n_tok, n_sel] -> [n_tok, n_cols]. Rows whose h is zero for every token
    take no part (a non-finite weight there does not leak into y)."""
    check_kernel_type(w.type, w.name)
    what = f"axpy_rows {w.name}"
    if len(w.shape) != 2:
        raise ValueError(f"{what}: the weight must be 2-D, got shape {w.shape}")
    r = check_sparse_rows(what, rows, w.n_rows)
    h2 = operand(w, check_sparse_h(what, h, len(r)))
    keep = (h2 != 0).any(axis=0)
    wd = dequantize(w).reshape(w.n_rows, w.n_cols)[r[keep]].astype(np.float64)
    y = (h2[:, keep].astype(np.float64) @ wd).astype(np.float32)
    return y[0] if np.ndim(h) == 1 else y


def check_sparse_vector(what: str, name: str, x) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 1:
        raise ValueError(f"{what}: {name} must be a 1-D float32 array, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    return np.ascontiguousarray(x)


def select_active(logits, threshold) -> np.ndarray:
    """Ascending int32 indices i with logits[i] >= threshold (predictor mode; NaN logits are inactive)."""
    logits = check_sparse_vector("select_active", "logits", logits)
    if np.isnan(threshold):
        raise ValueError("select_active: threshold is NaN")
    return np.flatnonzero(logits >= np.float32(threshold)).astype(np.int32)


def select_nonzero(x) -> np.ndarray:
    """Ascending int32 indices i with x[i] != 0 (exact mode, after ReLU; NaN counts as nonzero)."""
    return np.flatnonzero(check_sparse_vector("select_nonzero", "x", x)).astype(np.int32)


# ==== a Q4_0 / Q8_0 predictor fc2 repacked by hidden unit (csrc/fc2t.c) ================================
# The predictor's hidden layer r = relu(fc1 . p) is about half zeros, so fc2 . r needs only the fc2 columns of
# the non-zero r_k. The copy moves a quantized fc2's codes and scales (unchanged) so that each column is one
# contiguous row, outputs in tiles of 64: Q4_0 uint8 [rank][np / 2] (in tile t's 32 bytes, byte j holds output
# 64 t + j in its low nibble and 64 t + 32 + j in its high one), Q8_0 int8 [rank][np]; then the f16 scales
# [rank / 32][np] (0 in padding); np = n_ff rounded up to 64.
FC2T_TILE = 64
FC2T_QUANT_TYPES = (GGMLType.Q4_0, GGMLType.Q8_0)


@dataclass(frozen=True)
class FC2T:
    """A Q4_0 / Q8_0 fc2 [n_ff, rank] repacked by hidden unit (fc2t_pack): data uint8 [fc2t_bytes(...)]."""
    name: str
    type: GGMLType
    n_ff: int
    rank: int
    data: np.ndarray


def fc2t_padded(n_ff: int) -> int:
    return -(-n_ff // FC2T_TILE) * FC2T_TILE


def _fc2t_row_bytes(ggml_type, n_ff: int) -> int:
    np_ = fc2t_padded(n_ff)
    return np_ // 2 if ggml_type == GGMLType.Q4_0 else np_


def fc2t_bytes(ggml_type, n_ff: int, rank: int) -> int:
    return rank * _fc2t_row_bytes(ggml_type, n_ff) + rank // QK * fc2t_padded(n_ff) * 2


def check_fc2t_source(fc2: Tensor) -> tuple[int, int]:
    """(n_ff, rank) of a tensor fc2t_pack accepts: Q4_0 or Q8_0, 2-D, the rank a multiple of 32."""
    if fc2.type not in FC2T_QUANT_TYPES or len(fc2.shape) != 2:
        raise ValueError(f"fc2t_pack: {fc2.name} must be a 2-D Q4_0 or Q8_0 tensor, got {fc2.type.name} {fc2.shape}")
    n_ff, rank = fc2.shape
    if n_ff < 1 or rank < QK or rank % QK:
        raise ValueError(f"fc2t_pack: {fc2.name} has shape {fc2.shape}; its rows need a multiple of {QK} values")
    return n_ff, rank


def check_fc2t_copy(q) -> None:
    """Raises unless q is an FC2T whose buffer holds a copy of its stated type and shape."""
    if not isinstance(q, FC2T):
        raise ValueError(f"fc2t_logits: expected an FC2T (fc2t_pack), got {type(q).__name__}")
    d = q.data
    if (q.type not in FC2T_QUANT_TYPES or not isinstance(d, np.ndarray) or d.dtype != np.uint8
            or not d.flags.c_contiguous or q.rank % QK or q.rank < QK or q.n_ff < 1 or d.size != fc2t_bytes(q.type, q.n_ff, q.rank)):
        raise ValueError(f"fc2t_logits: {q.name} does not hold a copy of a {q.n_ff} x {q.rank} "
                         f"{getattr(q.type, 'name', q.type)} fc2")


def check_fc2t(q, r) -> np.ndarray:
    """r as a C-contiguous f32 [q.rank] for fc2t_logits, after checking q (check_fc2t_copy)."""
    check_fc2t_copy(q)
    if not isinstance(r, np.ndarray) or r.dtype != np.float32 or r.shape != (q.rank,):
        raise ValueError(f"fc2t_logits: r must be a float32 array of shape ({q.rank},), got "
                         f"{getattr(r, 'dtype', type(r).__name__)} {np.shape(r)}")
    return np.ascontiguousarray(r)


def fc2t_pack(fc2: Tensor) -> FC2T:
    """The copy by hidden unit of a Q4_0 / Q8_0 fc2 [n_ff, rank]: the same codes and scales, row k = unit k."""
    n_ff, rank = check_fc2t_source(fc2)
    np_, nb = fc2t_padded(n_ff), rank // QK
    b = _raw_blocks(fc2)  # [n_ff, nb, block bytes]
    if fc2.type == GGMLType.Q8_0:
        codes = np.zeros((rank, np_), np.uint8)
        codes[:, :n_ff] = b[..., 2:].reshape(n_ff, rank).T
    else:
        full = np.zeros((np_, rank), np.uint8)
        qs = b[..., 2:]
        full[:n_ff] = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n_ff, rank)
        t = full.reshape(np_ // FC2T_TILE, 2, FC2T_TILE // 2, rank)  # [tile, half, byte, k]
        codes = (t[:, 0] | (t[:, 1] << 4)).transpose(2, 0, 1).reshape(rank, np_ // 2)
    d = np.zeros((nb, np_), np.uint16)
    d[:, :n_ff] = np.ascontiguousarray(b[..., :2]).view(np.uint16)[..., 0].T
    data = np.concatenate([codes.ravel(), d.view(np.uint8).ravel()])
    return FC2T(fc2.name.replace("fc2", "fc2_t"), fc2.type, n_ff, rank, data)


def fc2t_unpack(q: FC2T) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8 [n_ff, rank], scales f32 [n_ff, rank / 32]) of a copy: fc2 = d * codes (Q4_0: the codes
    minus 8, as in ref._blocks)."""
    np_, rank = fc2t_padded(q.n_ff), q.rank
    rowb = _fc2t_row_bytes(q.type, q.n_ff)
    raw = q.data[:rank * rowb].reshape(rank, rowb)
    if q.type == GGMLType.Q8_0:
        codes = raw.view(np.int8)
    else:
        nib = raw.reshape(rank, np_ // FC2T_TILE, FC2T_TILE // 2)
        codes = np.stack([nib & 0x0F, nib >> 4], axis=2).reshape(rank, np_).astype(np.int8) - np.int8(8)
    d = _f16(q.data[rank * rowb:].reshape(rank // QK, np_, 2))
    return np.ascontiguousarray(codes[:, :q.n_ff].T), np.ascontiguousarray(d[:, :q.n_ff].T)


def fc2t_logits(q: FC2T, r) -> np.ndarray:
    """logits f32 [n_ff] = fc2 . r from its copy by hidden unit, by its arithmetic (csrc/fc2t.c) on one
    thread: r as Q8_0 blocks (codes qr, scales dr); per block b with some qr != 0, in order, logits =
    fma(f32(d * dr), isum, logits) with isum the exact integer block dot of the weight codes and qr (the fma
    emulated in f64, where the product is exact)."""
    r = check_fc2t(q, r)
    codes, d = fc2t_unpack(q)
    dr, qr = quantize_q8_0_blocks(r.reshape(-1, QK))
    nb = q.rank // QK
    isum = np.einsum("ibk,bk->ib", codes.reshape(q.n_ff, nb, QK).astype(np.int64), qr.astype(np.int64))
    out = np.zeros(q.n_ff, np.float32)
    for b in np.flatnonzero((qr != 0).any(axis=1)):
        dd = (d[:, b] * np.float32(dr[b])).astype(np.float32)
        out = (dd.astype(np.float64) * isum[:, b] + out).astype(np.float32)
    return out


# ==== Q8 tiles: the int8 layout of a quantized source's stored transpose (the model-wide mode) ===========
# A transposed matrix w_t [n_in, n_cols] (rows = inputs) is stored as int8 codes q [n_in, n_cols] and one f32
# scale per tile of 32 inputs x 32 outputs, d [ceil(n_in / 32), ceil(n_cols / 32)] (edge tiles are partial):
# w_t[i, c] ~ d[i // 32, c // 32] * q[i, c]. A row is still one input's contiguous weights (the AXPY skips its
# bytes), and because the scale is shared by 32 inputs, 32 consecutive inputs can be summed in integers: the
# activations are quantized per token and per 32-input tile row (as a Q8_0 activation block is), and
#   y[t, c] = sum over tiles B, ascending, of fma(dx[t, B] * d[B, c // 32], isum[t, B, c], .)
#   isum[t, B, c] = sum_{j: rows[j] in B} xq[t, j] * q[rows[j], c]        (an exact integer)
# with a[t, B] = max |h[t, j]| over the tile's selected inputs, dx = a / 127, xq = rint(h * (1 / dx)) (f32
# arithmetic, ties to even); a tile with a = 0 adds nothing. Every order of the integer sum gives the same isum,
# so a batch (whatever rows its other tokens keep) gives each token its one-token result.
Q8T = 32  # inputs and outputs per scale tile


@dataclass(frozen=True)
class Q8Tiles:
    """A stored transpose in Q8 tiles: q int8 [n_in, n_cols], d f32 [ceil(n_in / 32), ceil(n_cols / 32)]."""
    name: str
    q: np.ndarray
    d: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def n_rows(self) -> int:
        return int(self.q.shape[0])

    @property
    def n_cols(self) -> int:
        return int(self.q.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.q.nbytes + self.d.nbytes)


def q8_tiles_shape(n_in: int, n_cols: int) -> tuple[int, int]:
    """The shape of the scale array of an n_in x n_cols Q8 tile matrix."""
    return -(-n_in // Q8T), -(-n_cols // Q8T)


def check_q8_tiles(w, what: str = "axpy_tiles") -> Q8Tiles:
    """w if it is a consistent Q8Tiles (int8 2-D codes, f32 scales of the tile grid's shape), else ValueError."""
    if not isinstance(w, Q8Tiles):
        raise ValueError(f"{what}: expected Q8 tiles, got {type(w).__name__}")
    q, d = w.q, w.d
    if not isinstance(q, np.ndarray) or q.dtype != np.int8 or q.ndim != 2 or not q.flags.c_contiguous:
        raise ValueError(f"{what}: {w.name} codes must be a C-contiguous 2-D int8 array")
    want = q8_tiles_shape(*q.shape)
    if not isinstance(d, np.ndarray) or d.dtype != np.float32 or d.shape != want or not d.flags.c_contiguous:
        raise ValueError(f"{what}: {w.name} scales must be a C-contiguous float32 array of shape {want} for "
                         f"{q.shape[0]} x {q.shape[1]} codes, got {getattr(d, 'dtype', '?')} {getattr(d, 'shape', '?')}")
    return w


def _tiles_padded(x: np.ndarray, fill=0) -> np.ndarray:
    n, m = x.shape
    nb, mb = q8_tiles_shape(n, m)
    out = np.full((nb * Q8T, mb * Q8T), fill, dtype=x.dtype)
    out[:n, :m] = x
    return out.reshape(nb, Q8T, mb, Q8T)


def quantize_q8_tiles(w_t: np.ndarray, name: str = "w_t") -> Q8Tiles:
    """Q8 tiles of a float matrix w_t [n_in, n_cols]: per tile d = max |w| / 127, q = rint(w / d) (0 where d = 0)."""
    w = np.ascontiguousarray(w_t, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_q8_tiles: {name} must be 2-D, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"quantize_q8_tiles: {name} holds a value that is not finite")
    n, m = w.shape
    t = _tiles_padded(w)
    amax = np.abs(t).max(axis=(1, 3))  # [nb, mb]
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint(t * inv[:, None, :, None]), -127, 127).astype(np.int8)
    q = q.reshape(t.shape[0] * Q8T, t.shape[2] * Q8T)[:n, :m]
    return Q8Tiles(name, np.ascontiguousarray(q), d)


def dequantize_q8_tiles(w: Q8Tiles) -> np.ndarray:
    """f32 [n_in, n_cols]: d[i // 32, c // 32] * q[i, c]."""
    w = check_q8_tiles(w, "dequantize_q8_tiles")
    n, m = w.shape
    dd = np.repeat(np.repeat(w.d, Q8T, axis=0), Q8T, axis=1)[:n, :m]
    return (dd * w.q.astype(np.float32)).astype(np.float32)


def quantize_tile_activations(h2: np.ndarray, tile: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(xq int32 [n_tok, n_sel], dx f32 [n_tok, n_sel]: the scale of each entry's tile) of h2 [n_tok, n_sel],
    where tile[j] = rows[j] // 32 (ascending): per token and tile a = max |h|, dx = a / 127, xq = rint(h / dx)."""
    n_tok, n_sel = h2.shape
    xq = np.zeros((n_tok, n_sel), dtype=np.int32)
    dx = np.zeros((n_tok, n_sel), dtype=np.float32)
    if n_sel == 0:
        return xq, dx
    starts = np.flatnonzero(np.r_[True, tile[1:] != tile[:-1]])
    amax = np.maximum.reduceat(np.abs(h2), starts, axis=1)  # [n_tok, n_tiles]
    counts = np.diff(np.r_[starts, n_sel])
    a = np.repeat(amax, counts, axis=1)
    d = (a / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0).astype(np.float32)
    xq[:] = np.rint((h2 * inv).astype(np.float32)).astype(np.int32)
    dx[:] = d
    return xq, dx


def axpy_tiles(w: Q8Tiles, rows, h) -> np.ndarray:
    """The AXPY over the listed rows of Q8 tiles (the section comment above): h f32 [n_sel] -> y [n_cols], or
    [n_tok, n_sel] -> [n_tok, n_cols]; rows int32 ascending. The fused multiply-add of each tile is evaluated in
    f64 and rounded to f32 (the C kernel rounds once per fma: they can differ in the last bit)."""
    w = check_q8_tiles(w)
    what = f"axpy_tiles {w.name}"
    r = check_sparse_rows(what, rows, w.n_rows)
    h2 = check_sparse_h(what, h, len(r))
    n_tok = h2.shape[0]
    tile = r // Q8T
    xq, dx = quantize_tile_activations(h2, tile)
    y = np.zeros((n_tok, w.n_cols), dtype=np.float32)
    col_tile = np.arange(w.n_cols) // Q8T
    for b in np.unique(tile):
        sel = np.flatnonzero(tile == b)
        isum = xq[:, sel].astype(np.int64) @ w.q[r[sel]].astype(np.int64)  # [n_tok, n_cols], exact
        s = (dx[:, sel[0]][:, None] * w.d[b][col_tile][None, :]).astype(np.float32)  # [n_tok, n_cols]
        live = dx[:, sel[0]] > 0
        y[live] = (s[live].astype(np.float64) * isum[live] + y[live]).astype(np.float32)
    return y[0] if np.ndim(h) == 1 else y
