"""An independent numpy forward pass for llama, qwen2, qwen3, gemma3 and phi3, used as the oracle of
test_models.py.

It shares no code with powerinfer_py.models or the kernels: it reads metadata keys itself, dequantizes every
weight to f32 with the gguf package, and recomputes full causal attention over the whole sequence on every
call (no KV cache, no batching tricks). Written for obviousness, not speed; fine for tiny models.

Deliberate imitations of llama.cpp's arithmetic, which the runtime shares:
- K and V are rounded to f16 before attention (the KV cache is f16); without it the f32 comparison would
  need a tolerance 10x looser.
- optionally (act_q8_0=True), the input of every matmul whose weight is Q8_0/Q4_0 is rounded to Q8_0 blocks
  (32 values share one f16 scale amax/127) the way llama.cpp quantizes activations; this isolates the rest
  of the arithmetic so quantized models can be compared tightly too.
- the input of every matmul whose weight is BF16 is rounded to bf16 (nearest even), the activation type
  llama.cpp gives BF16 weights.
"""
from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

from powerinfer_py.gguf import open_gguf


def dequantize(t) -> np.ndarray:
    """A powerinfer_py Tensor -> f32 array of t.shape."""
    if t.type == T.F32:
        return np.array(t.data, dtype=np.float32)
    if t.type == T.F16:
        return t.data.astype(np.float32)
    if t.type == T.BF16:
        return (t.data.astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
    return quants.dequantize(np.asarray(t.data), t.type).reshape(t.shape).astype(np.float32)


def bf16_round_trip(x):
    """x rounded to bf16, nearest even (f32 bits + 0x7fff + the kept lowest bit, top half), back as f32."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return r.view(np.float32)


def q8_0_round_trip(x):
    """x [..., K] rounded as llama.cpp quantizes activations to Q8_0: per block of 32, d = amax / 127 stored
    as f16, q = round-half-away-from-zero(x / d) in int8; returns q * d."""
    x32 = np.asarray(x, dtype=np.float32)
    b = x32.reshape(-1, 32)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    v = b * inv
    q = np.trunc(v) + (v - np.trunc(v) >= 0.5) - (v - np.trunc(v) <= -0.5)
    return (q * d.astype(np.float16).astype(np.float64)).reshape(x32.shape)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, n_rot, base, scale, neox, factors=None):
    """x [N, H, D]: rotate the first n_rot dims of every head by position * base^(-2i/n_rot) * scale / factors[i]
    (factors: the file's rope_freqs.weight, or None)."""
    x = x.copy()
    half = n_rot // 2
    theta = positions[:, None] * scale * base ** (-np.arange(half) * 2.0 / n_rot)  # [N, half]
    if factors is not None:
        theta = theta / factors
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:  # pairs (i, i + half)
        a, b = x[..., :half].copy(), x[..., half:n_rot].copy()
        x[..., :half], x[..., half:n_rot] = a * cos - b * sin, a * sin + b * cos
    else:  # pairs (2i, 2i + 1)
        a, b = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
        x[..., 0:n_rot:2], x[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
    return x


def causal_attention(q, k, v, scale, window):
    """q [N, H, D], k/v [N, Hkv, D] -> [N, H, D]; query p sees keys j <= p (and p - j < window if window)."""
    n, n_head, _ = q.shape
    group = n_head // k.shape[1]
    p, j = np.arange(n)[:, None], np.arange(n)[None, :]
    visible = j <= p
    if window:
        visible &= p - j < window
    out = np.empty_like(q)
    for h in range(n_head):
        s = q[:, h] @ k[:, h // group].T * scale  # [N, N]
        s = np.where(visible, s, -np.inf)
        s = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (s / s.sum(axis=1, keepdims=True)) @ v[:, h // group]
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    """The tanh GELU as llama.cpp evaluates it: on f16-rounded input, result rounded to f16, 0 at and below
    -10, x from 10 on (written out here again, independently of powerinfer_py.kernels.ref)."""
    x32 = np.asarray(x, dtype=np.float32)
    h = x32.astype(np.float16).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        g = 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
    g = g.astype(np.float16).astype(np.float64)
    return np.where(x32 >= 10, x32.astype(np.float64), np.where(x32 <= -10, 0.0, g))


class ReferenceModel:
    """All weights of one GGUF file in f32, and logits(tokens) -> f32 [N, n_vocab] for every position."""

    def __init__(self, path, *, sliding_window: int | None = None, n_ctx: int = 32):
        f = open_gguf(path)
        m = f.metadata
        self.arch = a = m["general.architecture"]
        self.w = {name: dequantize(t) for name, t in f.tensors.items()}
        self.quantized = {name for name, t in f.tensors.items() if t.type in (T.Q8_0, T.Q4_0)}
        self.bf16 = {name for name, t in f.tensors.items() if t.type == T.BF16}
        f.close()
        self.n_layer = m[f"{a}.block_count"]
        self.n_embd = m[f"{a}.embedding_length"]
        self.n_head = m[f"{a}.attention.head_count"]
        self.n_head_kv = m.get(f"{a}.attention.head_count_kv", self.n_head)
        self.head_dim = m.get(f"{a}.attention.key_length", self.n_embd // self.n_head)
        self.n_rot = m.get(f"{a}.rope.dimension_count", self.head_dim)
        self.eps = m[f"{a}.attention.layer_norm_rms_epsilon"]
        self.base = m.get(f"{a}.rope.freq_base", 10000.0)
        # the window may be overridden to show what the model would compute without one
        self.window = sliding_window if sliding_window is not None else m.get(f"{a}.attention.sliding_window", 0)
        self.phi3_factors, self.attn_factor = None, 1.0
        if a == "phi3":
            self._phi3_unfuse(m, n_ctx)

    def _phi3_unfuse(self, m, n_ctx):
        """phi3: split attn_qkv (rows q | k | v) and ffn_up (rows gate | up) into llama's tensors; pick the
        RoPE factors llama.cpp picks for a context of n_ctx (long beyond the original context, else short)
        and the attn_factor that multiplies RoPE's cos and sin."""
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        for il in range(self.n_layer):
            p = f"blk.{il}."
            parts = [("attn_qkv.weight", ("attn_q.weight", "attn_k.weight", "attn_v.weight"), (q_dim, q_dim + kv_dim)),
                     ("ffn_up.weight", ("ffn_gate.weight", "ffn_up.weight"), (m["phi3.feed_forward_length"],))]
            for fused, names, cuts in parts:
                if p + fused not in self.w:
                    continue
                quantized = p + fused in self.quantized
                for name, rows in zip(names, np.split(self.w.pop(p + fused), cuts)):
                    self.w[p + name] = rows
                    if quantized:
                        self.quantized.add(p + name)
        orig = m.get("phi3.rope.scaling.original_context_length", m["phi3.context_length"])
        self.phi3_factors = self.w.get("rope_factors_long.weight" if n_ctx > orig else "rope_factors_short.weight")
        self.attn_factor = m.get("phi3.rope.scaling.attn_factor", 1.0)

    def layer_rope(self, il):
        """(freq base, is sliding-window layer) of layer il. Gemma 3: 5 local layers then 1 global, repeated."""
        if self.arch == "gemma3" and il % 6 != 5:
            return 10000.0, True
        return self.base, False

    def logits(self, tokens, act_q8_0: bool = False) -> np.ndarray:
        w, a, hd = self.w, self.arch, self.head_dim

        def mm(x, name):  # x [N, K] @ weight.T, with llama.cpp's activation rounding if asked for
            if act_q8_0 and name in self.quantized:
                x = q8_0_round_trip(x)
            if name in self.bf16:
                x = bf16_round_trip(x)
            return x @ w[name].T

        tokens = np.asarray(tokens)
        n = len(tokens)
        positions = np.arange(n, dtype=np.float64)
        neox = a in ("qwen2", "qwen3", "gemma3", "phi3")
        x = w["token_embd.weight"][tokens].astype(np.float64)
        if a == "gemma3":
            x *= math.sqrt(self.n_embd)
        for il in range(self.n_layer):
            L = lambda s: w[f"blk.{il}.{s}"]  # noqa: E731
            W = lambda x, s: mm(x, f"blk.{il}.{s}")  # noqa: E731
            base, local = self.layer_rope(il)
            h = rms_norm(x, L("attn_norm.weight"), self.eps)
            q, k, v = W(h, "attn_q.weight"), W(h, "attn_k.weight"), W(h, "attn_v.weight")
            if a == "qwen2":
                q, k, v = q + L("attn_q.bias"), k + L("attn_k.bias"), v + L("attn_v.bias")
            q, k, v = q.reshape(n, self.n_head, hd), k.reshape(n, self.n_head_kv, hd), v.reshape(n, self.n_head_kv, hd)
            if a in ("gemma3", "qwen3"):  # per-head Q/K RMSNorm, before RoPE
                q, k = rms_norm(q, L("attn_q_norm.weight"), self.eps), rms_norm(k, L("attn_k_norm.weight"), self.eps)
            ff, r = w.get("rope_freqs.weight", self.phi3_factors), self.n_rot  # llama.cpp: rope_freqs wins
            q = rope(q, positions, r, base, 1.0, neox, ff)
            k = rope(k, positions, r, base, 1.0, neox, ff)
            q[..., :r], k[..., :r] = q[..., :r] * self.attn_factor, k[..., :r] * self.attn_factor
            k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
            att = causal_attention(q, k, v, 1.0 / math.sqrt(hd), self.window if local else 0)
            o = W(att.reshape(n, -1), "attn_output.weight")
            x = x + (rms_norm(o, L("post_attention_norm.weight"), self.eps) if a == "gemma3" else o)
            h = rms_norm(x, L("ffn_norm.weight"), self.eps)
            g, u = W(h, "ffn_gate.weight"), W(h, "ffn_up.weight")
            f = W((gelu_tanh(g) if a == "gemma3" else silu(g)) * u, "ffn_down.weight")
            x = x + (rms_norm(f, L("post_ffw_norm.weight"), self.eps) if a == "gemma3" else f)
        h = rms_norm(x, w["output_norm.weight"], self.eps)
        return mm(h, "output.weight" if "output.weight" in w else "token_embd.weight").astype(np.float32)
