"""CPU kernels: thin validated wrappers over the C functions declared in csrc/pi.h.

Validation happens here, once, on the Python side of the boundary (DESIGN rule 3): dtypes, shapes,
contiguity and bounds are checked and turned into clear exceptions; C trusts what it is handed.
cffi releases the GIL during every call.
"""
from __future__ import annotations

import numpy as np

from ..gguf.types import GGMLType, Tensor
from .cpus import usable_cpus

try:
    from .._pi import ffi, lib
except ImportError as exc:  # pragma: no cover - only without a built extension
    raise ImportError(
        f"the C kernels are not built or do not load ({exc}): run `pip install -e .` (or `make install`) "
        "in the project folder"
    ) from exc


def _ptr(arr: np.ndarray, ctype: str = "void *"):
    """A C pointer to a C-contiguous numpy array (no copy)."""
    if not arr.flags.c_contiguous:
        raise ValueError("array must be C-contiguous")
    return ffi.cast(ctype, ffi.from_buffer(arr, require_writable=False))


def _f32(x, name: str = "x") -> np.ndarray:
    """x as a C-contiguous float32 array (copies only if it is not one already)."""
    arr = np.ascontiguousarray(x, dtype=np.float32)
    return arr


# ==== quantization and matmul, module level (owner: matmul helper) ====================================
from ..errors import UnsupportedError  # noqa: E402
from . import ref as _ref  # noqa: E402  (type checks and messages are shared with the spec)
from .checks import BIG as _OPS_BIG  # noqa: E402
from .checks import check_mscale as _ops_check_mscale, check_softcap as _ops_check_softcap  # noqa: E402
from .cpu_steps import CpuSteps  # noqa: E402

_QK = 32
_OUT_DTYPES = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.BF16: np.uint16}


def quantize(x, ggml_type) -> np.ndarray:
    """x f32 [R, K] -> data in Tensor layout: f32/f16/uint16 (bf16) [R, K] or uint8 [R, row_bytes]."""
    t = _ref.check_kernel_type(ggml_type, "quantize")
    if _ref.block_size(t) == _ref.QK_K or t in (GGMLType.IQ4_NL, GGMLType.MXFP4):
        raise UnsupportedError(f"quantize: {t.name} is computed on but not produced by these kernels")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"quantize: x must be 2-D [rows, cols], got shape {x.shape}")
    n_rows, n_cols = x.shape
    if t in _OUT_DTYPES:
        out = np.empty((n_rows, n_cols), dtype=_OUT_DTYPES[t])
    else:
        if n_cols % _QK:
            raise ValueError(f"quantize: {t.name} rows need a multiple of {_QK} columns, got {n_cols}")
        out = np.empty((n_rows, lib.pi_row_size(int(t), n_cols)), dtype=np.uint8)
    if x.size:
        lib.pi_quantize(int(t), ffi.from_buffer("float[]", x), ffi.from_buffer(out), n_rows, n_cols)
    return out


def dequantize(t: Tensor) -> np.ndarray:
    """Tensor -> f32 array of t.shape."""
    ty = _ref.check_kernel_type(t.type, t.name)
    data = np.ascontiguousarray(t.data)
    if t.n_cols % lib.pi_block_size(int(ty)):
        raise ValueError(f"{t.name}: {ty.name} rows need a multiple of {lib.pi_block_size(int(ty))} columns, "
                         f"got {t.n_cols}")
    if data.nbytes != t.n_rows * lib.pi_row_size(int(ty), t.n_cols):
        raise ValueError(f"{t.name}: {data.nbytes} bytes of data do not hold a {ty.name} tensor of shape {t.shape}")
    out = np.empty(t.shape, dtype=np.float32)
    if out.size:
        lib.pi_dequantize(int(ty), ffi.from_buffer(data), ffi.from_buffer("float[]", out), t.n_rows, t.n_cols)
    return out


def transpose(a: np.ndarray) -> np.ndarray:
    """A contiguous copy of a 2-D array's transpose (elements of 1, 2, 4 or 8 bytes): np.ascontiguousarray(a.T),
    done in cache-sized tiles."""
    a = np.ascontiguousarray(a)
    if a.ndim != 2 or a.itemsize not in (1, 2, 4, 8):
        raise ValueError(f"transpose: a 2-D array of 1-, 2-, 4- or 8-byte elements, got {a.dtype} {a.shape}")
    out = np.empty((a.shape[1], a.shape[0]), dtype=a.dtype)
    if out.size:
        lib.pi_transpose(ffi.from_buffer(a), a.shape[0], a.shape[1], a.itemsize, ffi.from_buffer(out))
    return out


def _weight_info(w: Tensor) -> tuple:
    """Checks a weight once: (data, C pointer, type id, n_rows, n_cols). Cached by CpuKernels per tensor."""
    ty = _ref.check_kernel_type(w.type, w.name)
    data = w.data
    if not isinstance(data, np.ndarray) or not data.flags.c_contiguous:
        raise ValueError(f"{w.name}: weight data must be a C-contiguous numpy array")
    n_rows, n_cols = w.n_rows, w.n_cols
    if n_cols % lib.pi_block_size(int(ty)):
        raise ValueError(f"{w.name}: {ty.name} rows need a multiple of {lib.pi_block_size(int(ty))} columns, "
                         f"got {n_cols}")
    if data.nbytes != n_rows * lib.pi_row_size(int(ty), n_cols):
        raise ValueError(f"{w.name}: {data.nbytes} bytes of data do not hold a {ty.name} tensor of shape {w.shape}")
    return (data, ffi.from_buffer(data), int(ty), n_rows, n_cols)


class CpuKernels:
    """The C kernels with their thread pool (kernels.Ops). One per model; close() (or garbage collection) frees
    the pool. steps: the optional one-call decode steps (kernels.Steps, cpu_steps.py) on the same pool."""

    def __init__(self, n_threads: int | None = None):
        n = n_threads if n_threads is not None else usable_cpus()
        if n < 1:
            raise ValueError(f"threads must be at least 1, got {n}")
        self.n_threads = int(n)
        self._pool = ffi.gc(lib.pi_pool_new(self.n_threads), lib.pi_pool_free)
        self.steps = CpuSteps(self)

    def close(self) -> None:
        if self._pool is not None:
            ffi.release(self._pool)
            self._pool = None

    # ==== quantization and matmul (owner: matmul helper) ================================================
    # One call at a time per CpuKernels: the pool's scratch holds the quantized activations of the call.

    # weights checked once each; a mixture-of-experts model brings 3 x n_expert expert views per layer
    # (Qwen3-30B-A3B: 18432), which should not push each other out
    _WEIGHT_CACHE_MAX = 1 << 16

    def _weight(self, w: Tensor) -> tuple:
        cache = self.__dict__.setdefault("_weights", {})
        info = cache.get(id(w))
        if info is None or info[0] is not w.data:  # id reuse: the cached entry keeps its data alive
            if len(cache) >= self._WEIGHT_CACHE_MAX:
                cache.clear()
            info = cache[id(w)] = _weight_info(w)
        return info

    def matmul(self, w: Tensor, x) -> np.ndarray:
        """y = x @ w.T: x f32 [K] -> [M] or [N, K] -> [N, M] (w has n_rows M, n_cols K)."""
        _, wp, ty, n_rows, n_cols = self._weight(w)
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or not x.flags.c_contiguous:
            raise ValueError(f"matmul {w.name}: x must be a C-contiguous float32 array, got "
                             f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.ndim == 1:
            n_tok = 1
            y = np.empty(n_rows, dtype=np.float32)
        elif x.ndim == 2:
            n_tok = x.shape[0]
            y = np.empty((n_tok, n_rows), dtype=np.float32)
        else:
            raise ValueError(f"matmul {w.name}: x must be [K] or [N, K], got shape {x.shape}")
        if x.shape[-1] != n_cols:
            raise ValueError(f"matmul {w.name}: x has {x.shape[-1]} columns, the weight has {n_cols}")
        if n_tok and n_rows:
            lib.pi_matmul(self._pool, ty, wp, n_rows, n_cols, ffi.from_buffer("float[]", x), n_tok,
                          ffi.from_buffer("float[]", y))
        return y

    def matmul_rows(self, w: Tensor, rows, x) -> np.ndarray:
        """y[t, j] = w[rows[j], :] . x[t, :] (rows: ascending distinct ints in [0, M)): x f32 [K] -> [n_sel]
        or [N, K] -> [N, n_sel]. Each value is bit-identical to the same row of matmul(w, x)."""
        _, wp, ty, n_rows, n_cols = self._weight(w)
        if not (type(rows) is np.ndarray and rows.dtype == np.int32 and rows.ndim == 1 and rows.flags.c_contiguous
                and (not len(rows) or (rows[0] >= 0 and rows[-1] < n_rows and (len(rows) < 2 or
                                                                             np.all(rows[1:] > rows[:-1]))))):
            rows = np.ascontiguousarray(_ref.check_rows(w, rows))
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or not x.flags.c_contiguous or x.ndim not in (1, 2):
            raise ValueError(f"matmul_rows {w.name}: x must be a C-contiguous float32 array [K] or [N, K], got "
                             f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
        if x.shape[-1] != n_cols:
            raise ValueError(f"matmul_rows {w.name}: x has {x.shape[-1]} columns, the weight has {n_cols}")
        n_tok = 1 if x.ndim == 1 else x.shape[0]
        y = np.empty((len(rows),) if x.ndim == 1 else (n_tok, len(rows)), dtype=np.float32)
        if n_tok and len(rows):
            lib.pi_matmul_rows(self._pool, ty, wp, n_cols, ffi.from_buffer("int32_t[]", rows), len(rows),
                               ffi.from_buffer("float[]", x), n_tok, ffi.from_buffer("float[]", y))
        return y

    def matmul_experts(self, w: Tensor, experts, tok_off, x) -> np.ndarray:
        """y f32 [T, rows]: the tokens tok_off[g] .. tok_off[g + 1] - 1 of x f32 [T, K] through expert
        experts[g] of the 3-D weight w (n_expert, rows, K), every group in one C call. Each value has the bits
        matmul gives that expert's slice on that group's tokens."""
        e, off, x = _ref.check_experts(w, experts, tok_off, x)
        n_expert, n_rows, n_cols = w.shape
        flat = self._weight(w)  # checks the type and keeps the C pointer; rows are n_expert * n_rows
        y = np.empty((len(x), n_rows), dtype=np.float32)
        if len(x) and n_rows:
            lib.pi_matmul_experts(self._pool, flat[2], flat[1], n_rows, n_cols, ffi.from_buffer("int32_t[]", e),
                                  ffi.from_buffer("int64_t[]", off), len(e), ffi.from_buffer("float[]", x),
                                  ffi.from_buffer("float[]", y))
        return y

    def get_rows(self, w: Tensor, ids) -> np.ndarray:
        """Embedding lookup: f32 [N, K] = dequantized rows `ids` (int [N]) of w."""
        _, wp, ty, n_rows, n_cols = self._weight(w)
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"get_rows {w.name}: ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        out = np.empty((len(ids), n_cols), dtype=np.float32)
        if len(ids):
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= n_rows:
                raise IndexError(f"get_rows {w.name}: ids must be in [0, {n_rows}), got {lo}..{hi}")
            ids32 = np.ascontiguousarray(ids, dtype=np.int32)
            lib.pi_get_rows(ty, wp, n_cols, ffi.from_buffer("int32_t[]", ids32), len(ids32),
                            ffi.from_buffer("float[]", out))
        return out

    def store_kv(self, dst, p0, x) -> None:
        """Write x f32 [N, Hkv, D] into the f16 cache plane dst [Hkv, n_ctx, D] at positions p0 .. p0+N-1."""
        if not (type(x) is np.ndarray and x.dtype is _F32 and x.flags.c_contiguous and x.ndim == 3
                and type(dst) is np.ndarray and dst.dtype is _F16 and dst.flags.c_contiguous and dst.ndim == 3
                and x.shape[1] == dst.shape[0] and x.shape[2] == dst.shape[2]
                and 0 <= p0 <= dst.shape[1] - x.shape[0]):
            _ref.check_store_kv(dst, p0, x)
            x = np.ascontiguousarray(x, dtype=np.float32)
        n_tok, n_head_kv, head_dim = x.shape
        if x.size:
            lib.pi_store_kv(_fb(_FA, x), n_tok, n_head_kv, head_dim, _fb(_HA, dst), dst.shape[1], p0)

    def read_probe(self, buf) -> float:
        """Reads every byte of buf (a C-contiguous array) on all threads; returns their sum (for benchmarks)."""
        arr = np.asarray(buf)
        if not arr.flags.c_contiguous:
            raise ValueError("read_probe: buf must be C-contiguous")
        return float(lib.pi_read_probe(self._pool, ffi.from_buffer(arr), arr.nbytes))

    def read_rows_probe(self, buf, row_bytes: int, rows, ahead: int = 4) -> float:
        """Reads only the listed rows (ascending ids) of buf seen as rows of row_bytes bytes, on all threads, with
        no arithmetic beyond a sum (the access pattern of a sparse kernel alone; for benchmarks). ahead: rows
        prefetched ahead as the gathers do (0: none). Returns the sum of its 64-bit words (wrapping)."""
        arr = np.asarray(buf)
        ids = np.ascontiguousarray(rows, dtype=np.int32)
        if not arr.flags.c_contiguous:
            raise ValueError("read_rows_probe: buf must be C-contiguous")
        if row_bytes <= 0 or (ids.size and (ids.min() < 0 or (int(ids.max()) + 1) * row_bytes > arr.nbytes)):
            raise ValueError(f"read_rows_probe: rows must lie in [0, {arr.nbytes // max(row_bytes, 1)})")
        return float(lib.pi_read_rows_probe(self._pool, ffi.from_buffer(arr), int(row_bytes),
                                            ffi.from_buffer("int32_t[]", ids), ids.size, int(ahead)))


    # ==== norms, rope, softmax, attention, activations (owner: ops helper) ===============================

    # Each method tests the common case (C-contiguous float32 arrays of matching shapes) with a few attribute
    # checks; anything else goes to a full validator that raises ValueError naming the op and argument (or
    # accepts, e.g. an ndarray subclass). C gets pointers to the arrays themselves: no copies; outputs are
    # allocated here with np.empty. Decoding makes a few hundred of these calls per token.

    def rmsnorm(self, x, w, eps) -> np.ndarray:
        """x / sqrt(mean(x^2) + eps) * w over the last dim of x f32 [..., D]; w f32 [D] or None. New array."""
        if not (type(x) is np.ndarray and x.dtype is _F32 and x.flags.c_contiguous and x.ndim and eps >= 0
                and (w is None or (type(w) is np.ndarray and w.dtype is _F32 and w.flags.c_contiguous
                                  and w.shape == x.shape[-1:]))):
            _ops_check_norm("rmsnorm", x, w, None, eps)
        y = np.empty(x.shape, _F32)
        if x.size:
            dim = x.shape[-1]
            lib.pi_rmsnorm(self._pool or _ops_closed(), _fb(_FA, x), ffi.NULL if w is None else _fb(_FA, w), eps,
                           x.size // dim, dim, _fb(_FA, y))
        return y

    def layernorm(self, x, w, b, eps) -> np.ndarray:
        """(x - mean) / sqrt(var + eps) * w + b over the last dim; w, b f32 [D] or None. New array."""
        _ops_check_norm("layernorm", x, w, b, eps)
        y = np.empty(x.shape, _F32)
        if x.size:
            dim = x.shape[-1]
            lib.pi_layernorm(self._pool or _ops_closed(), _fb(_FA, x), ffi.NULL if w is None else _fb(_FA, w),
                             ffi.NULL if b is None else _fb(_FA, b), eps, x.size // dim, dim, _fb(_FA, y))
        return y

    def rope(self, x, pos, n_rot, freq_base, freq_scale, neox, freq_factors=None, mscale=1.0) -> np.ndarray:
        """Rotates the first n_rot dims of every head of x f32 [N, H, D] in place (pos int32 [N]); returns x.
        freq_factors: None or f32 [n_rot/2], divisors of the pair frequencies (rope_freqs.weight); mscale scales
        the rotated dims (YaRN's attention factor)."""
        if not (type(x) is np.ndarray and x.dtype is _F32 and x.flags.c_contiguous and x.flags.writeable
                and x.ndim == 3 and type(pos) is np.ndarray and pos.dtype is _I32 and pos.flags.c_contiguous
                and pos.shape == x.shape[:1] and 0 <= n_rot <= x.shape[2] and not n_rot % 2 and freq_base > 0
                and -_OPS_BIG < freq_scale < _OPS_BIG):
            pos = _ops_check_rope(x, pos, n_rot, freq_base, freq_scale)
        ff = ffi.NULL if freq_factors is None else _fb(_FA, _ops_check_freq_factors("rope", freq_factors, n_rot))
        if x.size and n_rot:
            n_tok, n_head, head_dim = x.shape
            lib.pi_rope(self._pool or _ops_closed(), _fb(_FA, x), _fb(_IA, pos), n_tok, n_head, head_dim, n_rot,
                        freq_base, freq_scale, 1 if neox else 0, ff,
                        1.0 if mscale == 1.0 else _ops_check_mscale("rope", mscale))
        return x

    def softmax(self, x) -> np.ndarray:
        """Softmax over the last dim of x f32, in place; returns x."""
        if not (type(x) is np.ndarray and x.dtype is _F32 and x.flags.c_contiguous and x.flags.writeable
                and x.ndim):
            _ops_check_f32("softmax", "x", x, writable=True)
            _ops_check_ndim("softmax", x)
        if x.size:
            n_cols = x.shape[-1]
            lib.pi_softmax(self._pool or _ops_closed(), _fb(_FA, x), x.size // n_cols, n_cols)
        return x

    def attention(self, q, k, v, pos0, window, scale, softcap=0.0, sinks=None) -> np.ndarray:
        """Causal GQA: q f32 [N, H, D] at positions pos0.., k/v f16 [Hkv, n_ctx, D] -> f32 [N, H, D]. softcap > 0:
        scores become softcap * tanh(score / softcap) before the softmax (Gemma 2); 0: off. sinks: f32 [H]
        logits that join each head's softmax denominator (gpt-oss), or None."""
        if not (type(q) is np.ndarray and q.dtype is _F32 and q.flags.c_contiguous and q.ndim == 3
                and type(k) is np.ndarray and k.dtype is _F16 and k.flags.c_contiguous and k.ndim == 3
                and type(v) is np.ndarray and v.dtype is _F16 and v.flags.c_contiguous and v.shape == k.shape
                and k.shape[2] == q.shape[2] and k.shape[0] and not q.shape[1] % k.shape[0]
                and 0 <= pos0 and pos0 + q.shape[0] <= k.shape[1] and window >= 0 and -_OPS_BIG < scale < _OPS_BIG
                and 0 <= softcap < _OPS_BIG):
            _ops_check_attention(q, k, v, pos0, window, scale, softcap)
        if sinks is not None and not (type(sinks) is np.ndarray and sinks.dtype is _F32 and sinks.flags.c_contiguous
                                      and sinks.shape == (q.shape[1],)):
            raise ValueError(f"attention: sinks must be a C-contiguous float32 array of shape ({q.shape[1]},), got "
                             f"{_ops_desc(sinks)}")
        out = np.empty(q.shape, _F32)
        if q.size:
            n_tok, n_head, head_dim = q.shape
            lib.pi_attention(self._pool or _ops_closed(), _fb(_FA, q), _fb(_HA, k), _fb(_HA, v), n_tok, n_head,
                             k.shape[0], head_dim, k.shape[1], pos0, window, scale, softcap,
                             ffi.NULL if sinks is None else _fb(_FA, sinks), _fb(_FA, out))
        return out

    def _unary(self, fn, x, op: str) -> np.ndarray:
        if not (type(x) is np.ndarray and x.dtype is _F32 and x.flags.c_contiguous):
            _ops_check_f32(op, "x", x)
        y = np.empty(x.shape, _F32)
        if x.size:
            fn(self._pool or _ops_closed(), _fb(_FA, x), _fb(_FA, y), x.size)
        return y

    def _gated(self, fn, g, u, op: str) -> np.ndarray:
        if not (type(g) is np.ndarray and g.dtype is _F32 and g.flags.c_contiguous
                and type(u) is np.ndarray and u.dtype is _F32 and u.flags.c_contiguous and g.shape == u.shape):
            _ops_check_f32(op, "g", g)
            _ops_check_f32(op, "u", u)
            if g.shape != u.shape:
                raise ValueError(f"{op}: g and u shapes differ: {g.shape} vs {u.shape}")
        y = np.empty(g.shape, _F32)
        if g.size:
            fn(self._pool or _ops_closed(), _fb(_FA, g), _fb(_FA, u), _fb(_FA, y), g.size)
        return y

    def relu(self, x) -> np.ndarray:
        """max(x, 0). New array."""
        return self._unary(lib.pi_relu, x, "relu")

    def silu(self, x) -> np.ndarray:
        """x * sigmoid(x). New array."""
        return self._unary(lib.pi_silu, x, "silu")

    def gelu(self, x) -> np.ndarray:
        """GELU, tanh approximation. New array."""
        return self._unary(lib.pi_gelu, x, "gelu")

    def swiglu(self, g, u) -> np.ndarray:
        """silu(g) * u. New array."""
        return self._gated(lib.pi_swiglu, g, u, "swiglu")

    def geglu(self, g, u) -> np.ndarray:
        """gelu(g) * u. New array."""
        return self._gated(lib.pi_geglu, g, u, "geglu")

    # ==== sparse FFN (owner: sparse helper) ==============================================================
    # Validation is kernels/ref.py's (same messages); C gets pointers to the caller's arrays when they are
    # already int32 / float32 and C-contiguous, which is what the sparse FFN hands it.

    def axpy_rows(self, w: Tensor, rows, h) -> np.ndarray:
        """y[t, :] = sum_j h[t, j] * w[rows[j], :] over the listed rows of w (ffn_down_t), zero h skipped.
        rows int32 [n_sel] ascending; h f32 [n_sel] -> y [n_cols], or [n_tok, n_sel] -> [n_tok, n_cols]."""
        _, wp, ty, n_rows, n_cols = self._weight(w)
        if self._pool is None:
            raise ValueError("this CpuKernels has been closed")
        what = f"axpy_rows {w.name}"
        r = _ref.check_sparse_rows(what, rows, n_rows)
        h2 = _ref.check_sparse_h(what, h, len(r))
        n_tok, n_sel = h2.shape
        y = np.empty((n_tok, n_cols), dtype=np.float32)
        if n_tok and n_cols:
            lib.pi_axpy_rows(self._pool, ty, wp, n_cols, ffi.from_buffer("int32_t[]", r),
                             ffi.from_buffer("float[]", h2), n_sel, n_tok, ffi.from_buffer("float[]", y))
        return y[0] if h.ndim == 1 else y

    def axpy_tiles(self, w: "_ref.Q8Tiles", rows, h) -> np.ndarray:
        """axpy_rows for a matrix in Q8 tiles (ref.Q8Tiles: int8 codes [n_in, n_cols], one f32 scale per 32 x 32
        tile; csrc/axpy_q8t.c, ref.axpy_tiles is the spec): h is quantized per token and per 32-input tile row, and
        each tile row's sum over its kept inputs is an exact integer. rows int32 [n_sel] ascending; h f32 [n_sel]
        -> y [n_cols], or [n_tok, n_sel] -> [n_tok, n_cols]."""
        w = _ref.check_q8_tiles(w)
        if self._pool is None:
            raise ValueError("this CpuKernels has been closed")
        what = f"axpy_tiles {w.name}"
        r = _ref.check_sparse_rows(what, rows, w.n_rows)
        h2 = _ref.check_sparse_h(what, h, len(r))
        n_tok, n_sel = h2.shape
        n_in, n_cols = w.shape
        y = np.empty((n_tok, n_cols), dtype=np.float32)
        if n_sel == 0:
            y[:] = 0
        elif n_tok and n_cols:
            lib.pi_axpy_q8t(self._pool, ffi.from_buffer("int8_t[]", w.q), ffi.from_buffer("float[]", w.d), n_in,
                            n_cols, ffi.from_buffer("int32_t[]", r), ffi.from_buffer("float[]", h2), n_sel, n_tok,
                            ffi.from_buffer("float[]", y))
        return y[0] if h.ndim == 1 else y

    def fc2t_pack(self, fc2: Tensor) -> "_ref.FC2T":
        """The copy by hidden unit of a Q4_0 / Q8_0 predictor fc2 [n_ff, rank] (csrc/fc2t.c): the same codes and
        scales, one row per hidden unit, for fc2t_logits. The buffer is 64-byte aligned (rows are whole lines)."""
        n_ff, rank = _ref.check_fc2t_source(fc2)
        _, wp, ty, _, _ = self._weight(fc2)
        if self._pool is None:
            raise ValueError("this CpuKernels has been closed")
        nbytes = lib.pi_fc2t_bytes(ty, n_ff, rank)
        raw = np.empty(nbytes + 64, np.uint8)
        at = -raw.ctypes.data % 64
        data = raw[at:at + nbytes]
        lib.pi_fc2t_pack(self._pool, ty, wp, n_ff, rank, ffi.from_buffer(data))
        return _ref.FC2T(fc2.name.replace("fc2", "fc2_t"), fc2.type, n_ff, rank, data)

    def fc2t_logits(self, q: "_ref.FC2T", r) -> np.ndarray:
        """logits f32 [n_ff] = fc2 . r from fc2's copy by hidden unit, reading only the rows of the units whose
        Q8_0 code is non-zero (r f32 [rank]); the mat-vec's exact block dots summed in another order."""
        r = _ref.check_fc2t(q, r)
        if self._pool is None:
            raise ValueError("this CpuKernels has been closed")
        y = np.empty(q.n_ff, dtype=np.float32)
        if lib.pi_fc2t_logits(self._pool, int(q.type), ffi.from_buffer(q.data), q.n_ff, q.rank, _fb(_FA, r),
                              _fb(_FA, y)):
            raise MemoryError("fc2t_logits: no memory for the kernel's scratch")
        return y

    def select_active(self, logits, threshold) -> np.ndarray:
        """Ascending int32 indices i with logits[i] >= threshold (logits f32 [n_ff]; NaN is inactive)."""
        logits = _ref.check_sparse_vector("select_active", "logits", logits)
        if np.isnan(threshold):
            raise ValueError("select_active: threshold is NaN")
        out = np.empty(len(logits), dtype=np.int32)
        k = lib.pi_select_active(ffi.from_buffer("float[]", logits), len(logits), float(threshold),
                                 ffi.from_buffer("int32_t[]", out)) if len(logits) else 0
        return out[:k]

    def select_nonzero(self, x) -> np.ndarray:
        """Ascending int32 indices i with x[i] != 0 (x f32 [n_ff] after ReLU; NaN counts as nonzero)."""
        x = _ref.check_sparse_vector("select_nonzero", "x", x)
        out = np.empty(len(x), dtype=np.int32)
        k = lib.pi_select_nonzero(ffi.from_buffer("float[]", x), len(x), ffi.from_buffer("int32_t[]", out)) \
            if len(x) else 0
        return out[:k]


# Full validators for the ops above: reached only when the fast test fails; they raise or accept.
_F32, _F16, _I32 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)
_FA, _HA, _IA = ffi.typeof("float[]"), ffi.typeof("uint16_t[]"), ffi.typeof("int32_t[]")
_fb = ffi.from_buffer


def _ops_closed():
    raise ValueError("this CpuKernels has been closed")


def _ops_desc(a) -> str:
    if isinstance(a, np.ndarray):
        order = "C-contiguous" if a.flags.c_contiguous else "non-contiguous"
        return f"{order} {a.dtype} array of shape {a.shape}"
    return type(a).__name__


def _ops_check_f32(op: str, name: str, x, writable: bool = False) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != _F32 or not x.flags.c_contiguous:
        raise ValueError(f"{op}: {name} must be a C-contiguous float32 array, got {_ops_desc(x)}")
    if writable and not x.flags.writeable:
        raise ValueError(f"{op}: {name} is modified in place and must be writable")


def _ops_check_ndim(op: str, x: np.ndarray) -> None:
    if x.ndim == 0:
        raise ValueError(f"{op}: x must have at least one dimension")


def _ops_check_norm(op: str, x, w, b, eps) -> None:
    _ops_check_f32(op, "x", x)
    _ops_check_ndim(op, x)
    for name, p in (("w", w), ("b", b)):
        if p is not None:
            _ops_check_f32(op, name, p)
            if p.shape != x.shape[-1:]:
                raise ValueError(f"{op}: {name} must have shape {x.shape[-1:]} to match x, got {p.shape}")
    if not float(eps) >= 0.0:
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")


def _ops_check_freq_factors(op, ff, n_rot) -> np.ndarray:
    """RoPE frequency factors as C-contiguous f32 [n_rot/2], all finite and > 0."""
    ff = np.ascontiguousarray(ff, dtype=np.float32)
    if ff.shape != (n_rot // 2,):
        raise ValueError(f"{op}: freq_factors must have shape ({n_rot // 2},) for n_rot {n_rot}, got {ff.shape}")
    if not (np.isfinite(ff).all() and (ff > 0).all()):
        raise ValueError(f"{op}: freq_factors must be finite and > 0")
    return ff


def _ops_check_rope(x, pos, n_rot, freq_base, freq_scale) -> np.ndarray:
    """Validates rope's arguments; returns pos as C-contiguous int32."""
    _ops_check_f32("rope", "x", x, writable=True)
    if x.ndim != 3:
        raise ValueError(f"rope: x must be [n_tok, n_head, head_dim], got shape {x.shape}")
    n_tok, head_dim = x.shape[0], x.shape[2]
    if not isinstance(pos, np.ndarray) or pos.shape != (n_tok,) or pos.dtype.kind not in "iu":
        raise ValueError(f"rope: pos must be an integer array of shape ({n_tok},), got {_ops_desc(pos)}")
    if pos.dtype != _I32 or not pos.flags.c_contiguous:
        if n_tok and (int(pos.min()) < -2**31 or int(pos.max()) >= 2**31):
            raise ValueError("rope: positions do not fit in int32")
        pos = np.ascontiguousarray(pos, dtype=np.int32)
    if int(n_rot) != n_rot or n_rot < 0 or n_rot % 2 or n_rot > head_dim:
        raise ValueError(f"rope: n_rot must be even and in [0, head_dim={head_dim}], got {n_rot}")
    if not float(freq_base) > 0 or not abs(float(freq_scale)) < _OPS_BIG:
        raise ValueError(f"rope: freq_base must be > 0 and freq_scale finite, got {freq_base}, {freq_scale}")
    return pos


def _ops_check_attention(q, k, v, pos0, window, scale, softcap=0.0) -> None:
    _ops_check_f32("attention", "q", q)
    if q.ndim != 3:
        raise ValueError(f"attention: q must be [n_tok, n_head, head_dim], got shape {q.shape}")
    n_tok, n_head, head_dim = q.shape
    for name, a in (("k", k), ("v", v)):
        if not isinstance(a, np.ndarray) or a.dtype != _F16 or not a.flags.c_contiguous or a.ndim != 3:
            raise ValueError(f"attention: {name} must be a C-contiguous float16 array [n_head_kv, n_ctx, head_dim],"
                             f" got {_ops_desc(a)}")
    if k.shape != v.shape:
        raise ValueError(f"attention: k and v shapes differ: {k.shape} vs {v.shape}")
    n_head_kv, n_ctx, kv_dim = k.shape
    if kv_dim != head_dim:
        raise ValueError(f"attention: q has head_dim {head_dim}, the cache has {kv_dim}")
    if n_head_kv < 1 or n_head % n_head_kv:
        raise ValueError(f"attention: n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})")
    if int(pos0) != pos0 or int(window) != window:
        raise ValueError(f"attention: pos0 and window must be integers, got {pos0!r}, {window!r}")
    if pos0 < 0 or pos0 + n_tok > n_ctx:
        raise ValueError(f"attention: positions {pos0}..{pos0 + n_tok - 1} do not fit in the cache (n_ctx {n_ctx})")
    if window < 0:
        raise ValueError(f"attention: window must be >= 0 (0 = no window), got {window}")
    if not abs(float(scale)) < _OPS_BIG:
        raise ValueError(f"attention: scale must be finite, got {scale}")
    _ops_check_softcap("attention", softcap)
