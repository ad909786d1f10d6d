"""Numpy reference for the I-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (layouts:
csrc/quants.h).

Each weight is d * f * (2 ls + 1) * grid * sign: an unsigned grid value, a sign bit, a 4-bit scale ls per group
(32 or 16 weights) and f = 1/8 (IQ2), 1/4 (IQ3_XXS) or 1 (IQ3_S). The grids are data of the format and come
from the gguf package (gguf.quants.<TYPE>.grid); a 7-bit sign index k stands for the 8 signs k | parity(k) << 7.
iq_blocks returns the integer parts in ref.py's K-quant form, so ref.matmul / ref.dequantize treat them like
the other super-block types: q = grid * sign, sc = 2 ls + 1, d = f16 d * f.
IQ1_S / IQ1_M: value = d * (2 ls + 1) * (grid + delta), grid in {-1, 0, 1}, delta = +-1/8 per 32 (IQ1_S) or 8
(IQ1_M) weights (a sign bit); in the same form q = 8 grid + 8 delta (an integer), f = 1/8. IQ1_M has no d field:
its f16 d is the top nibbles of its four 16-bit scale words.
"""
from __future__ import annotations

import numpy as np
from gguf import quants

from ..gguf.types import GGMLType

IQ_TYPES = (GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ1_S,
            GGMLType.IQ1_M)
BLOCK_BYTES = {GGMLType.IQ2_XXS: 66, GGMLType.IQ2_XS: 74, GGMLType.IQ2_S: 82, GGMLType.IQ3_XXS: 98,
               GGMLType.IQ3_S: 110, GGMLType.IQ1_S: 50, GGMLType.IQ1_M: 56}
_FACTOR = {GGMLType.IQ2_XXS: 0.125, GGMLType.IQ2_XS: 0.125, GGMLType.IQ2_S: 0.125, GGMLType.IQ3_XXS: 0.25,
           GGMLType.IQ3_S: 1.0, GGMLType.IQ1_S: 0.125, GGMLType.IQ1_M: 0.125}
_GRIDS: dict = {}


def grid(ggml_type: GGMLType) -> np.ndarray:
    """The type's grid as int16 [n_entries, 8 (IQ2, IQ1) or 4 (IQ3)], from gguf.quants (IQ1: signed -1, 0, 1)."""
    if ggml_type not in _GRIDS:
        cls = getattr(quants, ggml_type.name)
        cls.init_grid()
        g = np.asarray(cls.grid, np.float32)
        _GRIDS[ggml_type] = g.reshape(-1, g.shape[-1]).astype(np.int16)
    return _GRIDS[ggml_type]


def sign_bytes(k: np.ndarray) -> np.ndarray:
    """7-bit sign indices -> sign bytes: the index with its parity as bit 7 (bit j set: weight j negative)."""
    k = k.astype(np.uint8) & 0x7F
    parity = np.unpackbits(k[..., None], axis=-1).sum(axis=-1) & 1
    return k | (parity.astype(np.uint8) << 7)


def _apply_signs(values: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """values [..., n] (n = 8 or 4), signs uint8 [...] (bit j: value j negative) -> int8 signed values."""
    n = values.shape[-1]
    neg = (signs[..., None] >> np.arange(n, dtype=np.uint8)) & 1
    return np.where(neg == 1, -values, values).astype(np.int8)


def _nibbles(b: np.ndarray) -> np.ndarray:
    """uint8 [..., n] -> [..., 2n]: byte i's low nibble at 2i, high nibble at 2i + 1."""
    return np.stack([b & 15, b >> 4], axis=-1).reshape(*b.shape[:-1], -1).astype(np.int64)


def iq_blocks(ggml_type: GGMLType, b: np.ndarray) -> dict:
    """b uint8 [R, S, block bytes] -> {"q": int8 [R, S, 256], "sc": int [R, S, G], "d": f32 [R, S]}."""
    t = GGMLType(ggml_type)
    if t in (GGMLType.IQ1_S, GGMLType.IQ1_M):
        return _iq1_blocks(t, b)
    rs = b.shape[:2]
    d = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32) * np.float32(_FACTOR[t])
    g = grid(t)
    if t in (GGMLType.IQ2_XXS, GGMLType.IQ3_XXS):
        if t == GGMLType.IQ2_XXS:  # 8 x {4 grid index bytes, uint32 a}
            sub = b[..., 2:66].reshape(*rs, 8, 8)
            idx, a = sub[..., :4], sub[..., 4:].copy().view(np.uint32)[..., 0]
        else:  # 64 grid index bytes, then uint32 a[8]
            idx = b[..., 2:66].reshape(*rs, 8, 8)
            a = b[..., 66:98].copy().view(np.uint32)
        signs = sign_bytes(a[..., None] >> np.array([0, 7, 14, 21], np.uint32))  # [R, S, 8 sub-blocks, 4]
        vals = g[idx.astype(np.int64)]  # IQ2: [R, S, 8, 4, 8]; IQ3: [R, S, 8, 8, 4]
        if t == GGMLType.IQ3_XXS:  # a sign byte covers two grid entries of 4
            vals = vals.reshape(*rs, 8, 4, 8)
        q = _apply_signs(vals, signs)
        sc = 2 * (a >> 28).astype(np.int64) + 1
        return {"q": q.reshape(*rs, 256), "sc": sc, "d": d}
    if t == GGMLType.IQ2_XS:  # uint16 qs[32], scales[8]
        w = b[..., 2:66].copy().view(np.uint16)
        q = _apply_signs(g[(w & 511).astype(np.int64)], sign_bytes(w >> 9))
        return {"q": q.reshape(*rs, 256), "sc": 2 * _nibbles(b[..., 66:74]) + 1, "d": d}
    if t == GGMLType.IQ2_S:  # qs[32], signs[32], qh[8], scales[8]
        qh = (b[..., 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
        idx = b[..., 2:34].astype(np.int64) | (qh.reshape(*rs, 32).astype(np.int64) << 8)
        q = _apply_signs(g[idx], b[..., 34:66])
        return {"q": q.reshape(*rs, 256), "sc": 2 * _nibbles(b[..., 74:82]) + 1, "d": d}
    # IQ3_S: qs[64], qh[8], signs[32], scales[4]
    qh = (b[..., 66:74, None] >> np.arange(8, dtype=np.uint8)) & 1
    idx = b[..., 2:66].astype(np.int64) | (qh.reshape(*rs, 64).astype(np.int64) << 8)
    q = _apply_signs(g[idx].reshape(*rs, 32, 8), b[..., 74:106])
    return {"q": q.reshape(*rs, 256), "sc": 2 * _nibbles(b[..., 106:110]) + 1, "d": d}


def iq1m_d(b: np.ndarray) -> np.ndarray:
    """IQ1_M blocks uint8 [..., 56] -> their f16 d as f32: the top nibble of scale word k is bits 4k..4k+3."""
    w = b[..., 48:56].copy().view(np.uint16).astype(np.uint16)
    bits = (w[..., 0] >> 12) | ((w[..., 1] >> 12) << 4) | ((w[..., 2] >> 12) << 8) | ((w[..., 3] >> 12) << 12)
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


def put_iq1m_d(blocks: np.ndarray, d) -> None:
    """Write f16 scales d [n] into IQ1_M blocks uint8 [n, 56] in place (the top nibbles of the scale words; the
    3-bit scales below them are kept): IQ1_M has no d field, so tests and benchmarks that make random blocks
    set it here."""
    bits = np.asarray(d, np.float16).view(np.uint16).astype(np.uint16)
    w = blocks[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
    w |= ((bits[:, None] >> np.array([0, 4, 8, 12], np.uint16)) & np.uint16(15)) << np.uint16(12)
    blocks[:, 48:56] = w.view(np.uint8)


def _iq1_blocks(t: GGMLType, b: np.ndarray) -> dict:
    """IQ1_S (f16 d, qs[32], uint16 qh[8]) / IQ1_M (qs[32], qh[16], uint16 scales[4]) in iq_blocks' form."""
    rs = b.shape[:2]
    g = grid(t).astype(np.int64)
    if t == GGMLType.IQ1_S:
        qh = b[..., 34:50].copy().view(np.uint16).astype(np.int64)  # [R, S, 8]
        high = (qh[..., None] >> np.array([0, 3, 6, 9])) & 7  # [R, S, 8, 4]: group 4k + l
        idx = b[..., 2:34].astype(np.int64) | (high.reshape(*rs, 32) << 8)
        neg = np.repeat((qh >> 15) & 1, 4, axis=-1)  # per group of 8
        sc = 2 * ((qh >> 12) & 7) + 1
        d = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    else:
        nib = (b[..., 32:48, None].astype(np.int64) >> np.array([0, 4])) & 15  # group 2k + h: nibble h of qh[k]
        nib = nib.reshape(*rs, 32)
        idx = b[..., :32].astype(np.int64) | ((nib & 7) << 8)
        neg = nib >> 3
        w = b[..., 48:56].copy().view(np.uint16).astype(np.int64)  # [R, S, 4]
        sc = (2 * ((w[..., None] >> np.array([0, 3, 6, 9])) & 7) + 1).reshape(*rs, 16)
        d = iq1m_d(b)
    q = 8 * g[idx] + np.where(neg == 1, -1, 1)[..., None]  # [R, S, 32, 8]
    return {"q": q.reshape(*rs, 256).astype(np.int8), "sc": sc, "d": d * np.float32(0.125)}
