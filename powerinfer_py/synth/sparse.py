"""write_sparse_model: a synthetic ReLU LLaMA as a PowerInfer (PWRI) file, with predictors, and its dense twin.

For benchmarks and tests of the sparse FFN engine: any shape (default LLaMA-7B's layer shape), any layer count,
F32/F16/Q8_0/Q4_0, written tensor by tensor so several-GB files need about one layer of memory.

How the sparsity is made real (the kernels are not told which neurons fire; the data decides):
  - Every token embedding is  e = m*u + B^T z + iso,  u a unit vector, B [k, n_embd] an orthonormal basis of a
    k-dimensional subspace orthogonal to u, z ~ N(0, s_b^2 I_k) per token, iso small isotropic noise; the three
    parts hold 10%, 60% and 30% of the energy (rms 1). Attention and FFN outputs are kept small (rms ~0.1 of
    the residual, their output projections are scaled on sample data), so later layers see the same picture.
  - Neuron i of layer l gets a firing probability p_i = min(0.99, p0 * rank_i^-power) (rank_i a random
    permutation of 1..n_ff, p0 solved so that mean(p) = mean_active): a few hot neurons fire for most tokens,
    most rarely. Its effective gate row (the gate with the ffn_norm weight w folded in) is
        g_i = -c_i*u + v_i*B + r_i,    |v_i| = 1, r_i random (orthogonal to u), |r_i . x| ~ noise * s_b,
    so that over tokens g_i . x ~ N(-c_i * mean(u.x), s_b^2 (1 + noise^2) + c_i^2 var(u.x)); c_i is solved so
    that P(g_i . x > 0) = p_i, with mean(u.x) and the variances measured, layer by layer, on sample tokens
    pushed through the layers already written. The stored gate row is g_i / w.
  - Predictor: fc1 = [B; u; -B; -u] (rank R = 2(k+1), so k = R/2 - 1), fc2 = [V, -c, -V, c]. Because
    relu(z) - relu(-z) = z, fc2 . relu(fc1 . p) = V B p - c (u . p): exactly the effective gate applied to the
    predictor input p (the pre-norm residual; RMSNorm only rescales by a positive number) minus the r_i part,
    which the predictor cannot see. `noise` sets how much of the gate it misses, hence the recall/precision trade.
  - powerinfer.sparse_threshold is calibrated on the sample tokens (a numpy forward pass of the stored,
    i.e. quantized then dequantized, weights) so that the fraction of truly active neurons (relu(gate . x) > 0)
    with predictor logit >= threshold is `recall`.
The calibration results are stored as synthetic.* metadata (measured active fraction, predicted-active
fraction, recall); measure_sparsity() re-measures any file on fresh tokens.

The dense twin is an ordinary llama GGUF with the same tensors (ffn_down [n_embd, n_ff] instead of ffn_down_t,
no fc1/fc2) and powerinfer.hidden_act = "relu", so our engine computes the same function from it. llama.cpp
ignores that key and applies SiLU: for llama.cpp the twin is only a speed reference (same shapes, same bytes
per token), not the same function.
"""
from __future__ import annotations

import contextlib
import os
import struct
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np
from gguf import GGUFValueType

from ..convert.output import atomic_output, check_free_space, check_target, quantize_rows
from ..gguf import open_gguf
from ..gguf.types import GGMLType, Tensor
from ..gguf.writer import _resolve_alignment, build_header, data_layout, tensor_info_bytes, tensor_nbytes
from .generic import _Spec

DTYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}
#: named shapes: n_embd, n_ff, n_head, n_vocab, predictor rank
SHAPES = {"7b": dict(n_embd=4096, n_ff=11008, n_head=32, n_vocab=32000, rank=1024),
          "tiny": dict(n_embd=128, n_ff=512, n_head=4, n_vocab=512, rank=64)}
ENERGY_MEAN, ENERGY_SUB = 0.1, 0.6  # shares of an embedding's energy on u and on the subspace (rest: isotropic)
P_CAP, P_FLOOR = 0.99, 1e-5  # firing probabilities are kept inside [P_FLOOR, P_CAP]
ATTN_REL, FFN_REL = 0.1, 0.1  # rms of the attention / FFN output relative to the residual's
DEFAULT_NOISE = 0.35  # at recall 0.9: ~12% predicted active for 10% active, as PowerInfer's 7B predictors
EPS = 1e-5
N_CTX_TRAIN = 2048
CHUNK = 1024  # rows of a matrix made, encoded and written at a time
MAX_PENDING_WRITES = 16  # blocks queued for the writer thread (each <= CHUNK rows)
_TAGS = {name: i for i, name in enumerate(
    ("basis", "embd", "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "law", "v", "r",
     "ffn_up", "ffn_down_t", "output_norm", "output", "sample"))}


# ---- the design -------------------------------------------------------------------------------------------

def _rng(seed: int, tag: str, layer: int = -1) -> np.random.Generator:
    """An independent generator per (seed, tensor kind, layer): the output does not depend on the order of use."""
    return np.random.default_rng([seed, _TAGS[tag], layer + 1])


def firing_probabilities(n_ff: int, mean_active: float, power: float, rng: np.random.Generator) -> np.ndarray:
    """p f32 [n_ff]: p_i = min(P_CAP, p0 * rank_i^-power), ranks a random permutation of 1..n_ff, p0 such that
    mean(p) = mean_active (bisection on log p0), floored at P_FLOOR."""
    if not P_FLOOR < mean_active < P_CAP:
        raise ValueError(f"mean_active must lie in ({P_FLOOR}, {P_CAP}), got {mean_active}")
    if power < 0:
        raise ValueError(f"power must be >= 0, got {power}")
    law = np.arange(1, n_ff + 1, dtype=np.float64) ** -power
    lo, hi = -30.0, 30.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.clip(np.exp(mid) * law, P_FLOOR, P_CAP).mean() < mean_active else (lo, mid)
    p = np.clip(np.exp(lo) * law, P_FLOOR, P_CAP)
    return p[rng.permutation(n_ff)].astype(np.float32)


def intended_probabilities(seed: int, layer: int, n_ff: int, mean_active: float, power: float) -> np.ndarray:
    """The firing probabilities write_sparse_model(seed=seed, ...) designed for `layer`."""
    return firing_probabilities(n_ff, mean_active, power, _rng(seed, "law", layer))


_norm_ppf = np.vectorize(NormalDist().inv_cdf, otypes=[np.float64])


def _solve_offsets(p: np.ndarray, a_mean: float, a_var: float, s2: float) -> np.ndarray:
    """c [n] with P(-c*a + N(0, s2) > 0) = p for a ~ N(a_mean, a_var): c*a_mean = k * sqrt(s2 + c^2 a_var),
    k the standard normal quantile of 1 - p (fixed point; the a_var term is a small correction)."""
    k = _norm_ppf(1.0 - p.astype(np.float64))
    c = k * np.sqrt(s2) / a_mean
    for _ in range(6):
        c = k * np.sqrt(s2 + c * c * a_var) / a_mean
    return c.astype(np.float32)


class _Basis:
    """u [n_embd] and B [k, n_embd]: orthonormal rows spanning a random (k+1)-dimensional subspace."""

    def __init__(self, n_embd: int, k: int, seed: int):
        a = _rng(seed, "basis").standard_normal((k + 1, n_embd))
        # rows orthonormalised through the Cholesky factor of the Gram matrix (numpy's QR is far slower here)
        q = np.linalg.solve(np.linalg.cholesky(a @ a.T), a)
        self.u = np.ascontiguousarray(q[0], dtype=np.float32)
        self.B = np.ascontiguousarray(q[1:], dtype=np.float32)


def _embedding_rows(basis: _Basis, rng: np.random.Generator, n: int) -> np.ndarray:
    """n token embeddings f32 [n, n_embd] of rms ~1: mean part m*u, subspace part, isotropic part."""
    d, k = basis.B.shape[1], basis.B.shape[0]
    m, s_b, s_iso = np.sqrt(ENERGY_MEAN * d), np.sqrt(ENERGY_SUB * d / k), np.sqrt(1 - ENERGY_MEAN - ENERGY_SUB)
    e = _uniform(rng, (n, d), s_iso)
    e += (rng.standard_normal((n, k), dtype=np.float32) * np.float32(s_b)) @ basis.B
    e += np.float32(m) * basis.u
    return e


def _norm_weight(rng: np.random.Generator, d: int) -> np.ndarray:
    return np.clip(1.0 + 0.05 * rng.standard_normal(d, dtype=np.float32), 0.8, 1.2).astype(np.float32)


def _gaussian(rng: np.random.Generator, shape: tuple[int, int], std: float) -> np.ndarray:
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.float32(std)
    return x


_UNIFORM_STD = np.sqrt((256 ** 2 - 1) / 12)  # std of the 256 values -127.5, -126.5, ..., 127.5


def _uniform(rng: np.random.Generator, shape: tuple[int, int], std: float) -> np.ndarray:
    """Zero-mean weights of the given std, uniform on 256 levels: ~20x faster to draw than normal values, and
    every product with an activation vector sums thousands of them, so its distribution is Gaussian anyway."""
    x = rng.integers(-128, 128, size=shape, dtype=np.int8).astype(np.float32)
    x += np.float32(0.5)
    x *= np.float32(std / _UNIFORM_STD)
    return x


# ---- numpy forward of the stored weights (calibration and measurement) -----------------------------------

@dataclass(frozen=True)
class _Hparams:
    n_embd: int
    n_head: int
    n_head_kv: int

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def _rmsnorm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def _rope(x: np.ndarray) -> np.ndarray:
    """x [S, T, H, D]: llama's (normal) RoPE, pairs (2i, 2i+1), base 10000, positions 0..T-1 per sequence."""
    d = x.shape[-1]
    theta = np.arange(x.shape[1])[:, None] * 10000.0 ** (-np.arange(d // 2) * 2.0 / d)  # [T, D/2]
    cos, sin = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def _attention_core(h: np.ndarray, W: dict, hp: _Hparams) -> np.ndarray:
    """h [S, T, n_embd] (layer input) -> attention heads' output before attn_output, [S, T, n_head * head_dim]."""
    S, T, _ = h.shape
    hd, H, Hkv = hp.head_dim, hp.n_head, hp.n_head_kv
    x = _rmsnorm(h, W["attn_norm"]).reshape(S * T, -1)
    q = _rope((x @ W["attn_q"].T).reshape(S, T, H, hd))
    k = np.repeat(_rope((x @ W["attn_k"].T).reshape(S, T, Hkv, hd)), H // Hkv, axis=2)
    v = np.repeat((x @ W["attn_v"].T).reshape(S, T, Hkv, hd), H // Hkv, axis=2)
    s = q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1) / np.float32(np.sqrt(hd))  # [S, H, T, T]
    s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    out = s @ v.transpose(0, 2, 1, 3)  # [S, H, T, D]
    return np.ascontiguousarray(out.transpose(0, 2, 1, 3)).reshape(S, T, H * hd).astype(np.float32)


@dataclass
class _LayerStats:
    """One layer on the sample: truly active mask [N, n_ff] and predictor logits [N, n_ff]."""

    active: np.ndarray
    logits: np.ndarray | None


def _ffn(p: np.ndarray, W: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """p [N, n_embd] (pre-norm residual) -> (gate pre-activation [N, n_ff], relu(gate)*up [N, n_ff],
    predictor logits [N, n_ff] or None)."""
    x = _rmsnorm(p, W["ffn_norm"])
    g = x @ W["ffn_gate"].T
    h = np.maximum(g, 0) * (x @ W["ffn_up"].T)
    logits = np.maximum(p @ W["fc1"].T, 0) @ W["fc2"].T if "fc1" in W else None
    return g, h, logits


# ---- streaming output ---------------------------------------------------------------------------------------

class _StreamedFile:
    """One GGUF/PWRI file whose header is fixed by (name, type, shape) specs; tensors are then written in
    that order, each in one or more row blocks. Float32 metadata values can be patched before the rename."""

    def __init__(self, path: Path, metadata: dict, types: dict, specs: list[tuple[str, GGMLType, tuple]],
                 magic: str):
        self.path, self.specs = path, specs
        metadata = dict(metadata)
        self.alignment = _resolve_alignment(metadata, None)
        self.sizes = [tensor_nbytes(t, s) for _, t, s in specs]
        offsets = data_layout(self.sizes, self.alignment)
        infos = [tensor_info_bytes(n, t, s, off) for (n, t, s), off in zip(specs, offsets)]
        self.header = build_header(magic, metadata, types, infos, self.alignment)
        self.total = len(self.header) + (offsets[-1] + self.sizes[-1] if specs else 0)
        self.index, self.written, self.fh = -1, 0, None
        self._pending: deque = deque()  # writes in flight on the writer thread (file.write releases the GIL)

    def open(self, stack: contextlib.ExitStack) -> None:
        tmp = stack.enter_context(atomic_output(self.path))
        self.fh = stack.enter_context(open(tmp, "wb"))
        self._writer = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="pi-synth-write"))
        stack.callback(self._drain)  # runs first on exit: no write outlives the file
        self.fh.write(self.header)

    def _put(self, data) -> None:
        self._pending.append(self._writer.submit(self.fh.write, data))
        while len(self._pending) > MAX_PENDING_WRITES:
            self._pending.popleft().result()

    def _drain(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def write(self, name: str, block: np.ndarray) -> None:
        if self.index < 0 or name != self.specs[self.index][0]:
            self._finish()
            self.index += 1
            if self.index >= len(self.specs) or self.specs[self.index][0] != name:
                raise RuntimeError(f"{self.path}: tensor {name!r} written out of order")
        block = np.array(block, order="C", copy=True) if block.dtype == np.float32 else np.ascontiguousarray(block)
        self._put(block.reshape(-1).view(np.uint8).data)  # f32 blocks may be views of reused buffers: copied
        self.written += block.nbytes

    def _finish(self) -> None:
        if self.index >= 0:
            size = self.sizes[self.index]
            if self.written != size:
                raise RuntimeError(f"{self.path}: tensor {self.specs[self.index][0]!r}: {self.written} bytes "
                                   f"written, {size} expected")
            self._put(bytes(-size % self.alignment))
        self.written = 0

    def patch_f32(self, key: str, value: float) -> None:
        raw = key.encode()
        needle = struct.pack("<Q", len(raw)) + raw + struct.pack("<I", GGUFValueType.FLOAT32)
        at = self.header.find(needle)
        if at < 0:
            raise KeyError(key)
        self._drain()
        self.fh.seek(at + len(needle))
        self.fh.write(struct.pack("<f", value))
        self.fh.seek(0, os.SEEK_END)

    def close(self) -> None:
        self._finish()
        self._drain()
        if self.index != len(self.specs) - 1:
            raise RuntimeError(f"{self.path}: {len(self.specs) - 1 - self.index} tensors were never written")


def _encode(x: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    if ggml_type == GGMLType.F32:
        return np.ascontiguousarray(x, dtype=np.float32)
    return quantize_rows(x.reshape(-1, x.shape[-1]), ggml_type).reshape(*x.shape[:-1], -1)


def _dequantize(data: np.ndarray, ggml_type: GGMLType, shape: tuple[int, ...]) -> np.ndarray:
    """Stored bytes -> the f32 values the engines compute with."""
    if ggml_type == GGMLType.F32:
        return np.asarray(data, dtype=np.float32).reshape(shape)
    try:
        from ..kernels.cpu import dequantize
    except (ImportError, OSError):
        from ..kernels.ref import dequantize
    return dequantize(Tensor("w", ggml_type, shape, np.ascontiguousarray(data)))


# ---- the writer -----------------------------------------------------------------------------------------------

@dataclass
class SparseStats:
    """Activity on sample tokens: active = fraction of (token, neuron) pairs with relu(gate . x) > 0;
    predicted = fraction with predictor logit >= threshold; recall = predicted among the active."""

    n_tokens: int
    threshold: float
    active: float
    predicted: float
    recall: float
    layer_active: list[float]
    layer_predicted: list[float]
    frequencies: np.ndarray | None = None  # f32 [n_layer, n_ff]: per-neuron firing frequency (measure only)

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("frequencies")
        return d


def _summarise(stats: list[_LayerStats], threshold: float | None, recall: float | None) -> SparseStats:
    """Pool the layers: choose the threshold for `recall` (if not given), then count."""
    if threshold is None:
        pooled = np.concatenate([s.logits[s.active] for s in stats])
        threshold = float(np.quantile(pooled, 1.0 - recall, method="lower")) if pooled.size else 0.0
    n_act = sum(int(s.active.sum()) for s in stats)
    hits = sum(int((s.logits[s.active] >= threshold).sum()) for s in stats) if stats[0].logits is not None else 0
    layer_pred = [float((s.logits >= threshold).mean()) if s.logits is not None else float("nan") for s in stats]
    return SparseStats(n_tokens=stats[0].active.shape[0], threshold=threshold,
                       active=float(np.mean([s.active.mean() for s in stats])),
                       predicted=float(np.mean(layer_pred)), recall=hits / max(n_act, 1),
                       layer_active=[float(s.active.mean()) for s in stats], layer_predicted=layer_pred,
                       frequencies=np.stack([s.active.mean(axis=0) for s in stats]).astype(np.float32))


def _sample_tokens(seed_tag: tuple[int, str], n_vocab: int, n_seq: int, seq_len: int) -> np.ndarray:
    return _rng(seed_tag[0], seed_tag[1]).integers(3, n_vocab, size=(n_seq, seq_len))


class _Generator:
    """Produces the tensors of both files in file order, pushing the sample tokens through each layer as it is
    written (with the stored weights) to calibrate the next one. Matrices are made, encoded and written CHUNK
    rows at a time; the stored values the forward pass needs go to buffers reused from layer to layer (fresh
    large allocations cost more in page faults than the arithmetic)."""

    def __init__(self, hp: _Hparams, n_layer: int, n_ff: int, n_vocab: int, ggml_type: GGMLType, rank: int,
                 mean_active: float, power: float, noise: float, seed: int, n_sample: int):
        self.hp, self.n_layer, self.n_ff, self.n_vocab, self.type = hp, n_layer, n_ff, n_vocab, ggml_type
        self.rank, self.mean_active, self.power, self.noise, self.seed = rank, mean_active, power, noise, seed
        self.basis = _Basis(hp.n_embd, rank // 2 - 1, seed)
        seq_len = min(64, n_sample)
        self.sample = _sample_tokens((seed, "sample"), n_vocab, max(1, n_sample // seq_len), seq_len)
        self.sparse: list[_StreamedFile] = []
        self.dense: list[_StreamedFile] = []
        self._buffers: dict[str, np.ndarray] = {}

    def specs(self, dense: bool) -> list[tuple[str, GGMLType, tuple]]:
        d, F, R, t = self.hp.n_embd, self.n_ff, self.rank, self.type
        q_dim, kv_dim = self.hp.n_head * self.hp.head_dim, self.hp.n_head_kv * self.hp.head_dim
        out = [("token_embd.weight", t, (self.n_vocab, d))]
        for il in range(self.n_layer):
            p = f"blk.{il}."
            out += [(p + "attn_norm.weight", GGMLType.F32, (d,)), (p + "attn_q.weight", t, (q_dim, d)),
                    (p + "attn_k.weight", t, (kv_dim, d)), (p + "attn_v.weight", t, (kv_dim, d)),
                    (p + "attn_output.weight", t, (d, q_dim)), (p + "ffn_norm.weight", GGMLType.F32, (d,)),
                    (p + "ffn_gate.weight", t, (F, d)), (p + "ffn_up.weight", t, (F, d))]
            out += [(p + "ffn_down.weight", t, (d, F))] if dense else [
                (p + "fc1.weight", t, (R, d)), (p + "fc2.weight", t, (F, R)), (p + "ffn_down_t.weight", t, (F, d))]
        return out + [("output_norm.weight", GGMLType.F32, (d,)), ("output.weight", t, (self.n_vocab, d))]

    def _buffer(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != shape:
            buf = self._buffers[key] = np.empty(shape, dtype=np.float32)
        return buf

    def _emit(self, name: str, x: np.ndarray, files: list[_StreamedFile], key: str | None = None):
        """Write a 1-D tensor (F32) or a small matrix; return its stored values (f32) if key is given."""
        t = GGMLType.F32 if x.ndim == 1 else self.type
        enc = _encode(x, t)
        for f in files:
            f.write(name, enc)
        return _dequantize(enc, t, x.shape) if key else None

    def _emit_rows(self, name: str, shape: tuple[int, int], make: Callable[[int, int], np.ndarray],
                   files: list[_StreamedFile], key: str | None = None) -> np.ndarray | None:
        """Write a matrix made by make(r0, r1) -> f32 rows [r1 - r0, n_cols], CHUNK rows at a time; return its
        stored values (f32 [n_rows, n_cols], the buffer `key`, valid until the next use of that key) if key."""
        out = self._buffer(key, shape) if key else None
        for r0 in range(0, shape[0], CHUNK):
            r1 = min(shape[0], r0 + CHUNK)
            enc = _encode(make(r0, r1), self.type)
            for f in files:
                f.write(name, enc)
            if out is not None:
                out[r0:r1] = _dequantize(enc, self.type, (r1 - r0, shape[1]))
        return out

    def _uniform_rows(self, tag: str, il: int, n_cols: int, std: float) -> Callable[[int, int], np.ndarray]:
        rng = _rng(self.seed, tag, il)
        return lambda r0, r1: _uniform(rng, (r1 - r0, n_cols), std)

    def _vocab_rows(self, name: str, make: Callable[[int, int], np.ndarray], ids: np.ndarray | None = None):
        """A [n_vocab, n_embd] tensor written CHUNK rows at a time; returns the stored rows `ids` (or None)."""
        d = self.hp.n_embd
        flat = None if ids is None else ids.reshape(-1)
        picked = None if ids is None else np.zeros((flat.size, d), dtype=np.float32)
        for r0 in range(0, self.n_vocab, CHUNK):
            n = min(CHUNK, self.n_vocab - r0)
            enc = _encode(make(r0, r0 + n), self.type)
            for f in self.sparse + self.dense:
                f.write(name, enc)
            if flat is not None:
                sel = np.nonzero((flat >= r0) & (flat < r0 + n))[0]
                if sel.size:
                    picked[sel] = _dequantize(enc[flat[sel] - r0], self.type, (sel.size, d))
        return None if ids is None else picked.reshape(*ids.shape, d)

    def run(self, progress: Callable[[str, int, int], None] | None) -> list[_LayerStats]:
        d = self.hp.n_embd
        rng_e = _rng(self.seed, "embd")
        h = self._vocab_rows("token_embd.weight", lambda r0, r1: _embedding_rows(self.basis, rng_e, r1 - r0),
                             self.sample)
        stats = []
        for il in range(self.n_layer):
            if progress:
                progress(f"blk.{il}", il, self.n_layer + 1)
            h, st = self._layer(il, h)
            stats.append(st)
        if progress:
            progress("output", self.n_layer, self.n_layer + 1)
        self._emit("output_norm.weight", _norm_weight(_rng(self.seed, "output_norm"), d), self.sparse + self.dense)
        self._vocab_rows("output.weight", self._uniform_rows("output", -1, d, 2.5 / np.sqrt(d)))
        return stats

    def _attention(self, il: int, h: np.ndarray) -> np.ndarray:
        """Write layer il's attention tensors; return the residual after attention, [S, T, n_embd]."""
        d, hp, both, p = self.hp.n_embd, self.hp, self.sparse + self.dense, f"blk.{il}."
        q_dim, kv_dim = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        W = {"attn_norm": self._emit(p + "attn_norm.weight", _norm_weight(_rng(self.seed, "attn_norm", il), d),
                                     both, key="attn_norm")}
        for name, rows in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
            W[name] = self._emit_rows(p + name + ".weight", (rows, d), self._uniform_rows(name, il, d, d ** -0.5),
                                      both, key=name)
        att = _attention_core(h, W, hp)
        # scale attn_output so that its output has rms ATTN_REL x the residual's
        std = ATTN_REL * np.sqrt(np.mean(h * h)) / (np.sqrt(np.mean(att * att)) * np.sqrt(q_dim))
        wo = self._emit_rows(p + "attn_output.weight", (d, q_dim), self._uniform_rows("attn_output", il, q_dim, std),
                             both, key="attn_output")
        return h + att @ wo.T

    def _gate(self, il: int, p: np.ndarray, w_norm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Layer il's gate (stored rows = effective rows / ffn_norm weight), designed on the sample's FFN
        inputs p [N, n_embd]. Returns (stored gate f32 [n_ff, n_embd], V [n_ff, k], c [n_ff])."""
        u, B, F, d = self.basis.u, self.basis.B, self.n_ff, self.hp.n_embd
        xh = p / np.sqrt(np.mean(p * p, axis=-1, keepdims=True) + EPS)  # the normalised input, before w
        a, b = xh @ u, xh @ B.T
        s_b2, var_r = float(b.var(axis=0).mean()), float(xh.var(axis=0).mean())
        prob = intended_probabilities(self.seed, il, F, self.mean_active, self.power)
        c = _solve_offsets(prob, float(a.mean()), float(a.var()), s_b2 * (1 + self.noise ** 2))
        V = _gaussian(_rng(self.seed, "v", il), (F, B.shape[0]), 1.0)
        V /= np.linalg.norm(V, axis=1, keepdims=True)
        rand = self._uniform_rows("r", il, d, self.noise * np.sqrt(s_b2 / var_r) / np.sqrt(d))

        def rows(r0: int, r1: int) -> np.ndarray:
            g = rand(r0, r1)
            g -= (g @ u)[:, None] * u  # r_i orthogonal to u: no per-neuron offset from the mean direction
            g += V[r0:r1] @ B
            g -= c[r0:r1, None] * u
            g /= w_norm
            return g

        gate = self._emit_rows(f"blk.{il}.ffn_gate.weight", (F, d), rows, self.sparse + self.dense, key="ffn_gate")
        return gate, V, c

    def _layer(self, il: int, h: np.ndarray) -> tuple[np.ndarray, _LayerStats]:
        d, F, shape, pre = self.hp.n_embd, self.n_ff, h.shape, f"blk.{il}."
        both = self.sparse + self.dense
        p = self._attention(il, h).reshape(-1, d)
        W = {"ffn_norm": self._emit(pre + "ffn_norm.weight", _norm_weight(_rng(self.seed, "ffn_norm", il), d),
                                    both, key="ffn_norm")}
        W["ffn_gate"], V, c = self._gate(il, p, W["ffn_norm"])
        W["ffn_up"] = self._emit_rows(pre + "ffn_up.weight", (F, d), self._uniform_rows("ffn_up", il, d, d ** -0.5),
                                      both, key="ffn_up")
        u, B = self.basis.u, self.basis.B
        fc1 = np.concatenate([B, u[None], -B, -u[None]])  # [rank, n_embd]
        fc2 = np.concatenate([V, -c[:, None], -V, c[:, None]], axis=1)  # [n_ff, rank]
        W["fc1"] = self._emit(pre + "fc1.weight", fc1, self.sparse, key="fc1")
        W["fc2"] = self._emit(pre + "fc2.weight", fc2, self.sparse, key="fc2")
        g, hidden, logits = _ffn(p, W)
        # scale the down projection so that the FFN output has rms FFN_REL x the residual's
        std = FFN_REL * np.sqrt(np.mean(p * p)) / np.sqrt(np.mean(np.sum(hidden * hidden, axis=1)))
        raw, make = self._buffer("down_raw", (F, d)), self._uniform_rows("ffn_down_t", il, d, std)

        def down_t_rows(r0: int, r1: int) -> np.ndarray:
            raw[r0:r1] = make(r0, r1)  # kept: the dense twin stores its transpose
            return raw[r0:r1]

        down_t = self._emit_rows(pre + "ffn_down_t.weight", (F, d), down_t_rows, self.sparse, key="ffn_down_t")
        if self.dense:
            self._emit_rows(pre + "ffn_down.weight", (d, F), lambda r0, r1: np.ascontiguousarray(raw[:, r0:r1].T),
                            self.dense)
        return (p + hidden @ down_t).reshape(shape), _LayerStats(g > 0, logits)


def _metadata(spec: _Spec, dtype: str, params: dict) -> tuple[dict, dict]:
    meta, types = spec.metadata(dtype)
    meta["general.name"] = f"synthetic-sparse-llama-{dtype}"
    meta["powerinfer.hidden_act"] = "relu"
    meta.update({f"synthetic.{k}": v for k, v in params.items()})
    for k in ("measured_active", "measured_predicted", "measured_recall"):
        meta[f"synthetic.{k}"] = 0.0  # patched once the model is written
    return meta, types


def _check_args(arch: str, dtype: str, n_embd: int, n_ff: int, n_head: int, n_head_kv: int, rank: int,
                mean_active: float, power: float, recall: float, noise: float) -> None:
    if arch != "llama":
        raise ValueError(f"synthetic sparse models exist for arch 'llama' (ReLU LLaMA), got {arch!r}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    if rank < 4 or rank % 2 or rank // 2 > n_embd:
        raise ValueError(f"rank must be even, >= 4 and <= 2 * n_embd, got {rank}")
    if DTYPES[dtype] in (GGMLType.Q8_0, GGMLType.Q4_0) and (n_embd % 32 or n_ff % 32 or rank % 32):
        raise ValueError(f"{dtype} needs n_embd, n_ff and rank that are multiples of 32")
    if n_embd % n_head or (n_embd // n_head) % 2 or n_head % n_head_kv:
        raise ValueError(f"n_embd {n_embd}, n_head {n_head}, n_head_kv {n_head_kv}: need an even head size and "
                         "n_head a multiple of n_head_kv")
    if not P_FLOOR < mean_active < P_CAP or power < 0:
        raise ValueError(f"mean_active must lie in ({P_FLOOR}, {P_CAP}) and power be >= 0, got {mean_active}, "
                         f"{power}")
    if not 0 < recall <= 1 or noise < 0:
        raise ValueError(f"recall must lie in (0, 1] and noise be >= 0, got {recall}, {noise}")


def write_sparse_model(path: str | os.PathLike, *, arch: str = "llama", n_layer: int = 2, n_embd: int = 4096,
                       n_ff: int = 11008, n_head: int = 32, n_head_kv: int | None = None, n_vocab: int = 32000,
                       dtype: str = "f16", mean_active: float = 0.10, power: float = 1.0, rank: int = 1024,
                       recall: float = 0.9, noise: float = DEFAULT_NOISE,
                       dense_path: str | os.PathLike | None = None,
                       seed: int = 0, n_sample: int = 256, force: bool = True,
                       progress: Callable[[str, int, int], None] | None = None) -> tuple[Path, Path | None]:
    """Write a synthetic sparse ReLU LLaMA to `path` (PWRI) and, if dense_path is given, its dense twin (GGUF);
    returns (path, dense_path or None). See the module docstring for the construction.

    mean_active: mean firing probability of a neuron; power: exponent of the per-neuron law; rank: predictor
    rank (even; the data subspace has rank/2 - 1 dimensions); recall: the predictor's target recall, which sets
    powerinfer.sparse_threshold; noise: the part of each gate row the predictor cannot see, relative to the
    part it can (more noise: more neurons predicted active at the same recall); n_sample: calibration tokens.
    Both files appear only once complete. force=False refuses to overwrite existing files."""
    n_head_kv = n_head_kv or n_head
    if n_layer < 1 or n_sample < 1:
        raise ValueError(f"n_layer and n_sample must be at least 1, got {n_layer}, {n_sample}")
    _check_args(arch, dtype, n_embd, n_ff, n_head, n_head_kv, rank, mean_active, power, recall, noise)
    hp = _Hparams(n_embd, n_head, n_head_kv)
    gen = _Generator(hp, n_layer, n_ff, n_vocab, DTYPES[dtype], rank, mean_active, power, noise, seed, n_sample)
    spec = _Spec("llama", n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab,
                 dict(n_ctx_train=N_CTX_TRAIN, norm_eps=EPS, tied=False))
    params = dict(seed=seed, mean_active=float(mean_active), power=float(power), noise=float(noise),
                  recall_target=float(recall), sample_tokens=int(gen.sample.size))
    meta, types = _metadata(spec, dtype, params)
    targets = [(Path(path), dict(meta, **{"powerinfer.sparse_threshold": 0.0}), "PWRI", False)]
    if dense_path is not None:
        targets.append((Path(dense_path), meta, "GGUF", True))
    files = []
    for target, m, magic, dense in targets:
        check_target(target, force)
        files.append(_StreamedFile(target, m, types, gen.specs(dense), magic))
        check_free_space(target, files[-1].total)
    gen.sparse, gen.dense = files[:1], files[1:]
    with contextlib.ExitStack() as stack:
        for f in files:
            f.open(stack)
        stats = _summarise(gen.run(progress), None, recall)
        files[0].patch_f32("powerinfer.sparse_threshold", stats.threshold)
        for f in files:
            f.patch_f32("synthetic.measured_active", stats.active)
            f.patch_f32("synthetic.measured_predicted", stats.predicted)
            f.patch_f32("synthetic.measured_recall", stats.recall)
            f.close()
    return Path(path), (Path(dense_path) if dense_path is not None else None)


def synth_info(path: str | os.PathLike) -> dict:
    """The synthetic.* metadata of a file written here (parameters and calibration results), keys unprefixed."""
    from ..gguf import read_metadata_only

    f = read_metadata_only(path)
    try:
        info = {k.split(".", 1)[1]: v for k, v in f.metadata.items() if k.startswith("synthetic.")}
        if "powerinfer.sparse_threshold" in f.metadata:
            info["threshold"] = f.metadata["powerinfer.sparse_threshold"]
        return info
    finally:
        f.close()


def measure_sparsity(path: str | os.PathLike, *, n_tokens: int = 256, seq_len: int = 64, seed: int = 1,
                     threshold: float | None = None, tokens: np.ndarray | None = None) -> SparseStats:
    """Push n_tokens random tokens (sequences of seq_len; or `tokens` int [n_seq, seq_len]) through a file's
    layers with a numpy forward pass of its stored weights, one layer in memory at a time, and count the truly
    active neurons and the predictor's verdicts (threshold: the file's powerinfer.sparse_threshold unless
    given). Works on the PWRI file and, without predictor figures, on the dense twin."""
    f = open_gguf(path)
    try:
        m, T = f.metadata, f.tensors
        hp = _Hparams(m["llama.embedding_length"], m["llama.attention.head_count"],
                      m.get("llama.attention.head_count_kv", m["llama.attention.head_count"]))
        n_layer = m["llama.block_count"]
        if threshold is None:
            threshold = float(m.get("powerinfer.sparse_threshold", 0.0))
        emb = T["token_embd.weight"]
        ids = np.atleast_2d(tokens) if tokens is not None else \
            _rng(seed, "sample").integers(3, emb.shape[0], size=(max(1, n_tokens // seq_len), seq_len))
        rows = np.asarray(emb.data)[ids.reshape(-1)]
        h = _dequantize(rows, emb.type, (ids.size, hp.n_embd)).reshape(*ids.shape, hp.n_embd)

        def deq(name: str) -> np.ndarray:
            t = T[name]
            return _dequantize(np.asarray(t.data), t.type, t.shape)

        stats = []
        for il in range(n_layer):
            p = f"blk.{il}."
            W = {k: deq(p + k + ".weight") for k in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                     "ffn_norm", "ffn_gate", "ffn_up")}
            if p + "fc1.weight" in T:
                W["fc1"], W["fc2"] = deq(p + "fc1.weight"), deq(p + "fc2.weight")
            down_t = deq(p + "ffn_down_t.weight") if p + "ffn_down_t.weight" in T else deq(p + "ffn_down.weight").T
            shape = h.shape
            res = (h + _attention_core(h, W, hp) @ W["attn_output"].T).reshape(-1, hp.n_embd)
            g, hidden, logits = _ffn(res, W)
            stats.append(_LayerStats(g > 0, logits))
            h = (res + hidden @ down_t).reshape(shape)
        if stats[0].logits is None:
            for s in stats:
                s.logits = np.full(s.active.shape, np.inf, dtype=np.float32)  # no predictor: all "predicted"
        return _summarise(stats, threshold, None)
    finally:
        f.close()
