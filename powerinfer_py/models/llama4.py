"""Llama 4 text models (GGUF arch "llama4": Scout 17B-16E, Maverick 17B-128E), as llama.cpp's llama4 graph runs them.

Per layer il, with x the residual stream and the layout below (Llama4Layout; chunk C = 8192):
    n = rmsnorm(x) * attn_norm;   q, k, v = Wq n, Wk n, Wv n            (no biases; grouped-query attention)
    RoPE layers ((il + 1) % 4 != 0):  q, k = rope(q), rope(k)          normal layout (pairs 2i, 2i + 1), the
                                      file's rope_freqs.weight dividing the frequencies (Llama 3 style scaling),
                                      base rope.freq_base_swa on the chunked layers when the file has it;
                                      then q, k = rmsnorm(q), rmsnorm(k) per head, no weight (llama.cpp's
                                      "L2 norm"), unless the model has 128 experts (Maverick)
    NoPE layers:                      q = q * (1 + 0.1 ln(floor((p + 1) / C) + 1))   at position p (temperature)
    s_j = q · k_j / sqrt(head_dim) over the visible j <= p: all of them, or on the chunked layers
          (il % 4 < 3) only j >= (p // C) * C (attention within fixed chunks of positions, not a sliding window)
    h = x + Wo · attn
    m = rmsnorm(h) * ffn_norm
    dense layers ((il + 1) % interleave_moe_layer_step != 0):   y = h + Wdown (silu(Wgate m) * (Wup m))
    MoE layers:   r = router · m;   chosen = the n_used largest r (1 in the real models);  w = sigmoid(r[chosen])
                  y = h + sum_e down_e (silu(gate_e (w_e m)) * (up_e (w_e m))) + shared(m)
                  (the weight scales the expert's INPUT; shared: an ungated SwiGLU expert of the same width)
    logits = output · (rmsnorm(y_last) * output_norm)              (output tied to token_embd when absent)
Only the text model runs; images (the vision tower of the multimodal files) are not supported.
Every step runs the Python path (no one-call decode plan): a chunked layer's visible keys start at a position
that moves with p, which that plan's fixed window cannot express.

Metadata keys (config.read with SPEC and read_args):
As llama.cpp reads it; read_args merges what llama4_keys returns into the mixture-of-experts fields.

Keys (under llama4.):
  expert_count (> 0: llama.cpp refuses files without experts), expert_used_count, expert_feed_forward_length
      the routed experts; the shared expert of a MoE layer has the same width (no key of its own)
  interleave_moe_layer_step S (required)   layers with (il + 1) % S == 0 have experts, the others a dense SwiGLU
      FFN feed_forward_length wide (S = 1: Scout, all MoE; S = 2: Maverick, alternating)
  attention.sliding_window                 absent (the real Scout / Maverick files): the chunked layout below;
      present and 0 (MobileLLM conversions) is refused: llama.cpp's graph then applies the attention temperature
      on its last layer with a zero position unit, which its input code asserts against. Any other value is
      ignored (llama.cpp fixes the chunk at 8192).
  attention.sliding_window_pattern P (default 4, or a per-layer array)   chunked layers: il % P < P - 1
  rope.freq_base_swa                       the chunked layers' RoPE base (default: rope.freq_base)
The chunked layout (fixed in llama.cpp, no keys): chunk 8192 (a chunked layer's query at position p sees the
keys of positions chunk_start(p) = (p // 8192) * 8192 .. p); layers with (il + 1) % 4 == 0 use no RoPE and scale
q by 1 + 0.1 * ln(floor((p + 1) / 8192) + 1) (attention temperature); the RoPE layers RMS-normalize q and k per
head (no weight) after RoPE, except on the 128-expert model (Maverick), as llama.cpp decides by expert count.
Routing: sigmoid of the router logits, the top n_used by logit, weights not renormalized, and the weight
multiplies the expert's input (models/llama4.py); expert_weights_scale is not read for this arch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..layers.ffn import FFN, FFNWeights
from ..layers.cache import KVCache
from ..layers.moe import MoEFFN
from ..gguf.types import Tensor
from .base import Expected, Model, get_tensor, llama_like_expected
from .llama import LAYER_TENSORS, rope_factors
from .spec import ArchSpec

_ATTN_EXTRAS = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "attn_qkv.weight")


LLAMA4_CHUNK = 8192  # llama.cpp's chunk size whenever the file has no sliding_window = 0
LLAMA4_NO_ROPE_STEP = 4  # layers (il + 1) % 4 == 0 skip RoPE (llama.cpp's default step; no key sets it)
LLAMA4_CHUNK_PERIOD = 4  # default of {arch}.attention.sliding_window_pattern: 3 chunked layers, then 1 global
LLAMA4_TEMP_SCALE, LLAMA4_TEMP_FLOOR, LLAMA4_TEMP_OFFSET = 0.1, 8192, 1.0  # the NoPE layers' q temperature
LLAMA4_NO_KQ_NORM_EXPERTS = 128  # llama.cpp: the 17B-128E model (Maverick) has no q/k norm


@dataclass(frozen=True)
class Llama4Layout:
    """Per-layer attention of a llama4 file: chunked (attends within its chunk) and rope (RoPE, then the q/k
    RMS norm when kq_norm); the chunk length and the NoPE layers' temperature (scale, position unit, offset)."""

    chunked: tuple[bool, ...]
    rope: tuple[bool, ...]
    kq_norm: bool
    chunk: int = LLAMA4_CHUNK
    temp_scale: float = LLAMA4_TEMP_SCALE
    temp_floor: int = LLAMA4_TEMP_FLOOR
    temp_offset: float = LLAMA4_TEMP_OFFSET
    rope_base_chunked: float = 0.0  # {arch}.rope.freq_base_swa: the chunked layers' RoPE base (0: the global one)


def llama4_keys(r, n_layer: int, n_expert: int, n_ff_exp: int) -> dict:
    """The ModelConfig fields of a llama4 file beyond the shared expert keys (module docstring); r: config's
    metadata reader."""
    path = r.f.path
    if r.meta.get(r.key("{arch}.attention.sliding_window")) == 0:
        raise UnsupportedError(f"{path}: llama4 files with attention.sliding_window = 0 (all layers global, e.g. "
                               "MobileLLM conversions) are not supported: llama.cpp's graph cannot run them either")
    step = r.positive("{arch}.interleave_moe_layer_step")
    pattern = r.meta.get(r.key("{arch}.attention.sliding_window_pattern"), LLAMA4_CHUNK_PERIOD)
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise ModelFileError(f"{path}: {r.key('{arch}.attention.sliding_window_pattern')} has {len(pattern)} "
                                 f"entries for {n_layer} layers")
        chunked = tuple(bool(p) for p in pattern)
    elif isinstance(pattern, int) and pattern >= 0:
        chunked = tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(n_layer))
    else:
        raise ModelFileError(f"{path}: {r.key('{arch}.attention.sliding_window_pattern')} must be a period >= 0 "
                             f"or one flag per layer, got {pattern!r}")
    layout = Llama4Layout(chunked=chunked,
                          rope=tuple((il + 1) % LLAMA4_NO_ROPE_STEP != 0 for il in range(n_layer)),
                          kq_norm=n_expert != LLAMA4_NO_KQ_NORM_EXPERTS,
                          rope_base_chunked=r.get("{arch}.rope.freq_base_swa", 0.0, kind=float))
    return {"llama4": layout, "moe_layers": tuple((il + 1) % step == 0 for il in range(n_layer)),
            "n_ff_shexp": n_ff_exp, "expert_gating": "sigmoid", "expert_weights_norm": False,
            "no_rope_layers": tuple(not rope for rope in layout.rope)}


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's tensors; the MoE layers' router, expert stacks and ungated shared expert; rope_freqs optional."""
    e = llama_like_expected(c, shared_gate=False)
    e["rope_freqs.weight"] = ((c.n_rot // 2,), False)
    return e


def chunked_attention(kernels, q: np.ndarray, k: np.ndarray, v: np.ndarray, p0: int, chunk: int,
                      scale: float) -> np.ndarray:
    """Causal attention where a query at position p sees only keys at positions (p // chunk) * chunk .. p.
    q f32 [N, H, D] at positions p0..; k, v f16 [Hkv, n_ctx, D] (the cache planes) -> f32 [N, H, D].
    The queries are split at chunk boundaries. A run starting at its chunk's first position, or one query, needs
    no copy (the kernel's causal mask, or a window of p - chunk_start + 1); longer runs attend over a copy of
    their chunk's keys."""
    n = q.shape[0]
    out = np.empty(q.shape, np.float32)
    a = p0
    while a < p0 + n:
        c = (a // chunk) * chunk
        b = min(p0 + n, c + chunk)
        qa = q[a - p0:b - p0]
        if c == 0:  # the first chunk: plain causal attention
            out[a - p0:b - p0] = kernels.attention(qa, k, v, a, 0, scale)
        elif b - a == 1:  # one query: a window reaching back to its chunk's start
            out[a - p0] = kernels.attention(qa, k, v, a, a - c + 1, scale)[0]
        else:
            kc, vc = np.ascontiguousarray(k[:, c:b]), np.ascontiguousarray(v[:, c:b])
            out[a - p0:b - p0] = kernels.attention(qa, kc, vc, a - c, 0, scale)
        a = b
    return out


def attn_temperature(pos: np.ndarray, layout) -> np.ndarray:
    """The NoPE layers' q factors f32 [N] at positions pos: 1 + scale * ln(floor((p + offset) / floor) + 1)."""
    p = pos.astype(np.float64)
    return (1.0 + layout.temp_scale * np.log(np.floor((p + layout.temp_offset) / layout.temp_floor) + 1.0)
            ).astype(np.float32)


class Llama4Model(Model):
    """The block of the module docstring: its own forward (chunked attention, NoPE temperature, q/k norms)."""

    LAYER_TENSORS = LAYER_TENSORS

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels, sparse=None):
        extra = [n for n in tensors if n.startswith("blk.") and n.split(".", 2)[2] in _ATTN_EXTRAS]
        if extra:
            raise UnsupportedError(f"llama4 files with attention biases or a fused attn_qkv are not supported "
                                   f"(found {extra[0]!r})")
        super().__init__(config, tensors, kernels, sparse)
        ff = rope_factors(tensors)
        if ff is not None:
            self.rope_freqs = ff if self.rope_freqs is None else (ff * self.rope_freqs).astype(np.float32)
        c, lay = config, config.llama4
        base_args = self.rope_args()
        chunk_base = lay.rope_base_chunked or c.rope_freq_base
        self.layer_rope = [((base_args[0], chunk_base if lay.chunked[il] else c.rope_freq_base,
                             *base_args[2:]) if lay.rope[il] else None) for il in range(c.n_layer)]
        self.kq_ones = np.ones(c.head_dim, np.float32)  # the weightless per-head RMS norm of q and k

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        """Sigmoid routing by logit, the weight on the expert's input, plus the ungated shared expert."""
        c, p = self.config, f"blk.{il}."
        shared = FFN(self.kernels, FFNWeights(up=get_tensor(tensors, p + "ffn_up_shexp.weight"),
                                              gate=get_tensor(tensors, p + "ffn_gate_shexp.weight"),
                                              down=get_tensor(tensors, p + "ffn_down_shexp.weight")),
                     "swiglu", self.sparse, layer=il)
        return MoEFFN(self.kernels, get_tensor(tensors, p + "ffn_gate_inp.weight"),
                      get_tensor(tensors, p + "ffn_gate_exps.weight"), get_tensor(tensors, p + "ffn_up_exps.weight"),
                      get_tensor(tensors, p + "ffn_down_exps.weight"), c.n_expert_used, False, layer=il,
                      shared=shared, gating="sigmoid", weight_input=True)

    def attn_plans(self) -> list | None:
        return None  # the Python path on every step (module docstring)

    def attend(self, il: int, q: np.ndarray, cache: KVCache, p0: int) -> np.ndarray:
        """Layer il's attention output f32 [N, H, D] for q at positions p0.. over the cache (chunked or global)."""
        c, lay = self.config, self.config.llama4
        if lay.chunked[il]:
            return chunked_attention(self.kernels, q, cache.k[il], cache.v[il], p0, lay.chunk, c.attn_scale)
        return self.kernels.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k, lay = self.config, self.kernels, self.config.llama4
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps = ids.shape[0], c.norm_eps
        x = self._embed(ids, pos)
        temp = attn_temperature(pos, lay)[:, None, None]
        for il, (L, rope) in enumerate(zip(self.layers, self.layer_rope)):
            q, kk, v = self._qkv(L, k.rmsnorm(x, L.attn_norm, eps), n)
            if rope is not None:
                k.rope(q, pos, *rope)
                k.rope(kk, pos, *rope)
                if lay.kq_norm:
                    q, kk = k.rmsnorm(q, self.kq_ones, eps), k.rmsnorm(kk, self.kq_ones, eps)
            else:
                q *= temp
            self._store_kv(cache, il, p0, kk, v)
            a = self.attend(il, q, cache, p0)
            x += k.matmul(L.wo, a.reshape(n, c.n_head * c.head_dim))
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x)
        cache.n_past = p0 + n
        return self._head(x, all_logits)


def read_args(r, d: dict) -> None:
    d.update(llama4_keys(r, d["n_layer"], d["n_expert"], d["n_ff_exp"]))


SPEC = ArchSpec("llama4", model=Llama4Model, expected=expected_tensors, moe=True, moe_norm=False)
