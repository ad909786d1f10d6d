"""Cohere (GGUF archs "command-r": Command R / R+, Aya 23, Aya Expanse; "cohere2": Command R7B, Command A, Aya
Vision's text model). Keys: at the end.

Per layer, with x the layer input (llama.cpp's command-r.cpp / cohere2.cpp graphs):
    h = layernorm(x) * attn_norm                         LayerNorm without a bias, eps attention.layer_norm_epsilon
    q, k, v = Wq · h, Wk · h, Wv · h                     grouped-query heads, no biases
    [command-r with attn_q_norm / attn_k_norm (Command R+): q, k = layernorm(head) * norm[head], a LayerNorm
     over each head with a weight row PER HEAD (tensors f32 [n_head, head_dim], [n_head_kv, head_dim])]
    q, k = rope(q), rope(k)                              normal layout (pairs 2i, 2i+1), n_rot dims of each head
                                                         cohere2: only on the sliding layers (global: no RoPE)
    a = Wo · attention(q, k, v)                          1/sqrt(head_dim); cohere2's sliding layers see the
                                                         last sliding_window positions
    x = (x + ffn(h)) + a                                 PARALLEL: the FFN reads h too; no ffn_norm
        ffn(h) = Wdown · (silu(Wgate · h) * (Wup · h))   ffn.FFN, so --sparse threshold / exact work as for llama
Logits: (output · (layernorm(x) * output_norm)) * logit_mul, output = token_embd (tied) unless the file has
output.weight. The two adds come in llama.cpp's order (FFN first), so the rounding is the same.

llama.cpp loads the Q/K norms by depth (required at >= 64 layers, never read below); here they are required at
that depth and used wherever a file has them (HF's use_qk_norm), since a smaller file holding them means them.
A fused attn_qkv or q/k/v biases (which llama.cpp's generic loader would accept; Cohere's converters never write
them) are refused rather than ignored.

Decode steps take the Python path (no one-call C attention block): that block starts with an RMSNorm and adds
its output to the residual it was given, while here the input is LayerNormed and the FFN's output must be added
before the attention's; matching llama.cpp's bits would need a second C variant for one family.

Metadata keys (config.read with SPEC and read_args). Both archs (llama.cpp's loaders, src/models/command-r.cpp and cohere2.cpp):
  attention.layer_norm_epsilon  LayerNorm eps (no biases anywhere; SPEC.layer_norm)
  logit_scale                   the logits are MULTIPLIED by it (0 or absent: unscaled); optional for command-r,
                                required for cohere2, as llama.cpp's get_key calls say
  RoPE is the normal layout (pairs 2i, 2i+1; llama.cpp's rope type NORM for both; the converter permutes nothing
  because the HF model rotates interleaved pairs too); rope.dimension_count may be < head_dim (cohere2's
  rotary_pct).
cohere2 only:
  attention.sliding_window          window of the sliding layers (required)
  attention.sliding_window_pattern  one bool per layer (True = sliding) or a period n (default 4): layer il
                                    slides when il % n < n - 1, every layer when n is 0 (llama.cpp's
                                    set_swa_pattern without dense_first)
  the sliding layers rotate q and k; the global ones use no RoPE at all (no_rope_layers). rope.freq_base_swa is
  read by llama.cpp but its graph never uses it (every sliding layer rotates with rope.freq_base): ignored here.
command-r's optional per-head Q/K LayerNorms (Command R+) are tensors (above).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..layers.cache import KVCache
from .base import Expected, Model, head_expected, sparsify_expected
from .spec import ArchSpec

LAYER_TENSORS = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
                 "wv": "attn_v.weight", "wo": "attn_output.weight",
                 "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight"}
OPTIONAL = ("q_norm", "k_norm")
QK_NORM_DEPTH = 64  # llama.cpp's command-r loader requires the Q/K norms from this depth on (Command R+)
_REFUSED = ("attn_qkv.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")


def expected_tensors(c: ModelConfig) -> Expected:
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    e = head_expected(c)
    qk_norms = c.arch == "command-r"
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_norm.weight"] = ((c.n_embd,), True)
        e[p + "attn_q.weight"] = ((q_dim, c.n_embd), True)
        e[p + "attn_k.weight"] = ((kv_dim, c.n_embd), True)
        e[p + "attn_v.weight"] = ((kv_dim, c.n_embd), True)
        e[p + "attn_output.weight"] = ((c.n_embd, q_dim), True)
        if qk_norms:
            e[p + "attn_q_norm.weight"] = ((c.n_head, c.head_dim), c.n_layer >= QK_NORM_DEPTH)
            e[p + "attn_k_norm.weight"] = ((c.n_head_kv, c.head_dim), c.n_layer >= QK_NORM_DEPTH)
        e[p + "ffn_gate.weight"] = ((c.n_ff, c.n_embd), True)
        e[p + "ffn_up.weight"] = ((c.n_ff, c.n_embd), True)
        e[p + "ffn_down.weight"] = ((c.n_embd, c.n_ff), True)
    return sparsify_expected(c, e)


class CohereModel(Model):
    """Its own forward: one LayerNorm feeds attention and FFN in parallel (module docstring)."""

    LAYER_TENSORS = LAYER_TENSORS
    OPTIONAL_TENSORS = OPTIONAL

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        refused = [n for n in tensors if n.startswith("blk.") and n.split(".", 2)[2] in _REFUSED]
        if refused:
            raise UnsupportedError(f"{config.arch} files with a fused attn_qkv or attention biases are not supported "
                                   f"(found {refused[0]!r} and {len(refused) - 1} more)")
        super().__init__(config, tensors, kernels, sparse)
        if config.arch != "command-r":
            for L in self.layers:
                L.q_norm = L.k_norm = None
        for L in self.layers:  # per-head weight rows: [n_head, head_dim], [n_head_kv, head_dim]
            if L.q_norm is not None:
                L.q_norm = L.q_norm.reshape(config.n_head, config.head_dim)
            if L.k_norm is not None:
                L.k_norm = L.k_norm.reshape(config.n_head_kv, config.head_dim)
        self._logit_mul = np.float32(config.logit_mul)

    def layer_attention(self) -> list[tuple[int, tuple]]:
        """Per layer (window, RoPE arguments): cohere2's global layers rotate nothing (n_rot 0)."""
        c, no_rope = self.config, self.config.no_rope_layers
        out = []
        for il, swa in enumerate(c.swa_layers):
            rope = self.rope_args()
            out.append((c.sliding_window if swa else 0, (0, *rope[1:]) if no_rope and no_rope[il] else rope))
        return out

    def _head_norm(self, t: np.ndarray, w: np.ndarray | None) -> np.ndarray:
        """t f32 [N, H, D] LayerNormed over each head, times that head's weight row (llama.cpp: norm, then mul)."""
        if w is None:
            return t
        y = self.kernels.layernorm(t, None, None, self.config.norm_eps)
        y *= w
        return y

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, hd, eps = ids.shape[0], c.head_dim, c.norm_eps

        x = k.get_rows(self.token_embd, ids)  # [N, n_embd]
        for il, (L, (window, rope)) in enumerate(zip(self.layers, self.layer_attention())):
            h = k.layernorm(x, L.attn_norm, None, eps)
            q = self._head_norm(k.matmul(L.wq, h).reshape(n, c.n_head, hd), L.q_norm)
            kk = self._head_norm(k.matmul(L.wk, h).reshape(n, c.n_head_kv, hd), L.k_norm)
            v = k.matmul(L.wv, h).reshape(n, c.n_head_kv, hd)
            if rope[0]:
                k.rope(q, pos, *rope)
                k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, v)
            a = k.attention(q, cache.k[il], cache.v[il], p0, window, c.attn_scale)  # [N, n_head, hd]
            x += self.ffns[il](h, x)  # llama.cpp's order: the FFN's output first, then the attention's
            x += k.matmul(L.wo, a.reshape(n, c.n_head * hd))

        cache.n_past = p0 + n
        return self._head(x, all_logits)

    def _final_norm(self, x: np.ndarray) -> np.ndarray:
        return self.kernels.layernorm(x, self.output_norm, None, self.config.norm_eps)

    def _head(self, x: np.ndarray, all_logits: bool) -> np.ndarray:
        logits = super()._head(x, all_logits)
        if self._logit_mul != 1:
            logits *= self._logit_mul
        return logits


COHERE2_SWA_PERIOD = 4  # llama.cpp's default pattern for cohere2: 3 sliding layers, then a global one


def cohere2_swa(r, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
    """(sliding_window, swa_layers, RoPE base of the sliding layers) of a cohere2 file; r: config.MetaReader."""
    window = r.positive("{arch}.attention.sliding_window")
    key = r.key("{arch}.attention.sliding_window_pattern")
    pattern = r.meta.get(key, COHERE2_SWA_PERIOD)
    if isinstance(pattern, list):
        if len(pattern) != n_layer or not all(isinstance(v, (bool, int)) for v in pattern):
            raise ModelFileError(f"{r.f.path}: {key} must hold one flag per layer ({n_layer}), got {pattern!r:.80}")
        layers = tuple(bool(v) for v in pattern)
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 0:
        layers = tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(n_layer))
    else:
        raise ModelFileError(f"{r.f.path}: {key} must be a period >= 0 or one flag per layer, got {pattern!r:.80}")
    return window, layers, rope_freq_base


def cohere_keys(r, n_layer: int) -> dict:
    """ModelConfig fields of a command-r / cohere2 file (logit_mul; cohere2's RoPE-less global layers). r: config.MetaReader."""
    scale = r.get("{arch}.logit_scale", 0.0 if r.arch == "command-r" else None, kind=float)
    if not math.isfinite(scale):
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.logit_scale')} must be finite, got {scale}")
    out = {"logit_mul": scale if scale else 1.0}
    if r.arch == "cohere2":
        _, layers, _ = cohere2_swa(r, n_layer, 0.0)
        out["no_rope_layers"] = tuple(not swa for swa in layers)
    return out


def read_args(r, d: dict) -> None:
    d.update(cohere_keys(r, d["n_layer"]))


SPEC = ArchSpec("command-r", model=CohereModel, expected=expected_tensors, layer_norm=True)
VARIANTS = (replace(SPEC, name="cohere2", swa=cohere2_swa),)  # windowed RoPE layers + NoPE global ones
