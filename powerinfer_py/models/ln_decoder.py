"""LayerNorm decoders with biases: Phi-2 (GGUF arch "phi2"), StableLM 2 / 3B / Zephyr ("stablelm"), StarCoder2
("starcoder2") and GPT-2 ("gpt2"), as llama.cpp's phi2.cpp, stablelm.cpp, starcoder2.cpp and gpt2.cpp compute them.

x = token_embd[ids] (+ position_embd[pos]: gpt2's learned positions, row p for position p; gpt2 has no RoPE)
Per layer, with x the layer input:
    h = layernorm(x) * attn_norm + attn_norm_b
    q, k, v = Wq·h (+bq), Wk·h (+bk), Wv·h (+bv)     or one fused attn_qkv (rows [q | k | v]) with its bias
    [stablelm with attn_q_norm / attn_k_norm (StableLM 2 12B): each head LayerNormed (no bias) and multiplied by
     that head's own weight row, f32 [n_head, head_dim] / [n_head_kv, head_dim], before RoPE]
    q, k = rope_neox(q), rope_neox(k)                 over the first n_rot dims of each head (phi2: 32 of 80,
                                                      StableLM 2: 25%); starcoder2 rotates whole heads;
                                                      gpt2 none (n_rot 0)
    a = Wo · attention(q, k, v) (+ bo)                1/sqrt(head_dim), grouped-query
  sequential (starcoder2, gpt2; stablelm with ffn_norm):  x = x + a;  x = x + ffn(layernorm(x) * ffn_norm + ffn_norm_b)
  parallel (phi2; stablelm without ffn_norm):       x = x + a + ffn(h)      the FFN reads the attention's input
    ffn: phi2, starcoder2, gpt2  Wdown · gelu(Wup · m + b_up) + b_down    (ggml's tanh GELU, ffn.FFN variant "gelu")
         stablelm          Wdown · (silu(Wgate · m) * (Wup · m))     no biases (SwiGLU)
Logits: output · (layernorm(x) * output_norm + output_norm_b) (+ output.bias: phi2), output tied to token_embd
when the file has no output.weight (starcoder2 and gpt2; llama.cpp requires it for phi2 and stablelm).

Decode steps take the Python path (the one-call C attention block starts with an RMSNorm).

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  phi2, stablelm, starcoder2, gpt2  LayerNorm with biases (layer_norm_epsilon), NeoX RoPE over
          rope.dimension_count dims (gpt2: learned positions, no RoPE); phi2, starcoder2 and gpt2 default to a GELU
          FFN with biases, stablelm to SwiGLU (models/ln_decoder.py)
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ContextFullError, ModelFileError
from ..gguf.types import Tensor
from ..layers.cache import KVCache
from .base import Expected, Model, get_tensor, head_expected, norm_weight
from .phi3 import row_views
from .spec import ArchSpec

LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight", "attn_norm_b": "attn_norm.bias",
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "bo": "attn_output.bias",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "ffn_norm": "ffn_norm.weight", "ffn_norm_b": "ffn_norm.bias",
}
# what each arch's llama.cpp loader requires (the q/k/v weights are checked by split_qkv: fused or separate)
_REQUIRED = {
    "phi2": ("attn_output.bias",),
    "stablelm": (),
    "starcoder2": ("attn_output.bias", "ffn_norm.weight", "ffn_norm.bias"),
    "gpt2": ("attn_qkv.weight", "attn_qkv.bias", "attn_output.bias", "ffn_norm.weight", "ffn_norm.bias"),
}
_OPTIONAL = {  # tensors llama.cpp reads when present (beyond the q/k/v forms every arch may have)
    "phi2": (),
    "stablelm": ("attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight", "ffn_norm.bias"),
    "starcoder2": (),
    "gpt2": (),
}
FFN_BIAS_ARCHS = ("phi2", "starcoder2", "gpt2")  # gelu(Wup·m + b_up), + b_down; stablelm's SwiGLU has no biases


def expected_tensors(c: ModelConfig) -> Expected:
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    e = head_expected(c, layer_norm=True)
    if c.arch not in ("starcoder2", "gpt2"):
        e["output.weight"] = ((c.n_vocab, c.n_embd), True)
    if c.arch == "phi2":
        e["output.bias"] = ((c.n_vocab,), True)
    if c.arch == "gpt2":
        e["position_embd.weight"] = ((c.n_ctx_train, c.n_embd), True)
    shapes = {"attn_q.weight": (q_dim, c.n_embd), "attn_k.weight": (kv_dim, c.n_embd),
              "attn_v.weight": (kv_dim, c.n_embd), "attn_qkv.weight": (q_dim + 2 * kv_dim, c.n_embd),
              "attn_q.bias": (q_dim,), "attn_k.bias": (kv_dim,), "attn_v.bias": (kv_dim,),
              "attn_qkv.bias": (q_dim + 2 * kv_dim,), "attn_output.weight": (c.n_embd, q_dim),
              "attn_output.bias": (c.n_embd,), "attn_q_norm.weight": (c.n_head, c.head_dim),
              "attn_k_norm.weight": (c.n_head_kv, c.head_dim), "ffn_norm.weight": (c.n_embd,),
              "ffn_norm.bias": (c.n_embd,)}
    always = ("attn_output.weight",)
    optional = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.weight", "attn_q.bias", "attn_k.bias",
                "attn_v.bias", "attn_qkv.bias")
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_norm.weight"] = ((c.n_embd,), True)
        e[p + "attn_norm.bias"] = ((c.n_embd,), True)
        for s in always + _REQUIRED[c.arch]:
            e[p + s] = (shapes[s], True)
        for s in optional + _OPTIONAL[c.arch]:
            e.setdefault(p + s, (shapes[s], False))
        if c.arch == "stablelm":
            e[p + "ffn_gate.weight"] = ((c.n_ff, c.n_embd), True)
        e[p + "ffn_up.weight"] = ((c.n_ff, c.n_embd), True)
        e[p + "ffn_down.weight"] = ((c.n_embd, c.n_ff), True)
        if c.arch in FFN_BIAS_ARCHS:
            e[p + "ffn_up.bias"] = ((c.n_ff,), True)
            e[p + "ffn_down.bias"] = ((c.n_embd,), True)
    return e


def split_qkv(c: ModelConfig, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """tensors plus, per layer, attn_q/k/v(.weight, .bias) views of a fused attn_qkv(.bias) (the rows [q | k | v],
    as llama.cpp's build_qkv slices them); a layer with neither form is a ModelFileError naming it."""
    out = dict(tensors)
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    for il in range(c.n_layer):
        p = f"blk.{il}."
        for kind in ("weight", "bias"):
            fused = tensors.get(f"{p}attn_qkv.{kind}")
            if fused is None:
                continue
            if kind == "bias":  # a 1-D bias splits as a [n, 1] matrix would
                fused = Tensor(fused.name, fused.type, (fused.shape[0], 1), np.asarray(fused.data).reshape(-1, 1))
            parts = row_views(fused, {f"{p}attn_{x}.{kind}": n for x, n in zip("qkv", (q_dim, kv_dim, kv_dim))})
            if kind == "bias":
                parts = {n: Tensor(n, t.type, (t.shape[0],), np.asarray(t.data).reshape(-1)) for n, t in parts.items()}
            out.update(parts)
        if not all(f"{p}attn_{x}.weight" in out for x in "qkv"):
            raise ModelFileError(f"missing required tensor {p + 'attn_qkv.weight'!r} (or {p}attn_q/k/v.weight)")
    return out


class LnDecoderModel(Model):
    """phi2, stablelm, starcoder2, gpt2: the block of the module docstring. A layer without ffn_norm is parallel."""

    LAYER_TENSORS = LAYER_TENSORS
    OPTIONAL_TENSORS = ("bq", "bk", "bv", "bo", "q_norm", "k_norm", "ffn_norm", "ffn_norm_b")
    LAYER_NORM = True

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        self.FFN_BIASES = config.arch in FFN_BIAS_ARCHS
        tensors = split_qkv(config, tensors)
        super().__init__(config, tensors, kernels, sparse)
        self.output_b = norm_weight(get_tensor(tensors, "output.bias", required=False))
        self.position_embd = get_tensor(tensors, "position_embd.weight") if config.arch == "gpt2" else None
        for L in self.layers:  # per-head weight rows of stablelm's Q/K LayerNorms
            if L.q_norm is not None:
                L.q_norm = L.q_norm.reshape(config.n_head, config.head_dim)
            if L.k_norm is not None:
                L.k_norm = L.k_norm.reshape(config.n_head_kv, config.head_dim)

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        """gpt2's context is bounded by its learned positions (position_embd rows)."""
        if self.position_embd is not None:
            n_pos = self.position_embd.shape[0]
            n_ctx = n_ctx or n_pos
            if n_ctx > n_pos:
                raise ContextFullError(f"{self.config.arch} has learned positions for {n_pos} tokens; a context of "
                                       f"{n_ctx} does not fit: use at most {n_pos}")
        return super().new_cache(n_ctx)

    def _embed(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        x = self.kernels.get_rows(self.token_embd, ids)  # [N, n_embd], a fresh array
        if self.position_embd is not None:
            x += self.kernels.get_rows(self.position_embd, pos)
        return x

    def _head_norm(self, t: np.ndarray, w: np.ndarray | None) -> np.ndarray:
        """t f32 [N, H, D] LayerNormed over each head (no bias) times that head's weight row; t when w is None."""
        if w is None:
            return t
        y = self.kernels.layernorm(t, None, None, self.config.norm_eps)
        y *= w
        return y

    def _qkv(self, L, h: np.ndarray, n: int):
        c, k = self.config, self.kernels
        out = []
        for w, b, heads in ((L.wq, L.bq, c.n_head), (L.wk, L.bk, c.n_head_kv), (L.wv, L.bv, c.n_head_kv)):
            y = k.matmul(w, h)  # [N, heads * head_dim], a fresh array
            if b is not None:
                y += b
            out.append(y.reshape(n, heads, c.head_dim))
        q, kk, v = out
        return self._head_norm(q, L.q_norm), self._head_norm(kk, L.k_norm), v

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps = ids.shape[0], c.norm_eps
        rope = self.rope_args()

        x = self._embed(ids, pos)  # [N, n_embd]
        for il, L in enumerate(self.layers):
            h = k.layernorm(x, L.attn_norm, L.attn_norm_b, eps)
            q, kk, v = self._qkv(L, h, n)
            if c.n_rot:
                k.rope(q, pos, *rope)
                k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, v)
            a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)  # [N, n_head, head_dim]
            att = k.matmul(L.wo, a.reshape(n, c.n_head * c.head_dim))
            if L.bo is not None:
                att += L.bo
            if L.ffn_norm is None:  # parallel: the FFN reads h; the predictor (if any) the layer input x
                f = self.ffns[il](h, x)
                x += att
                x += f
            else:
                x += att
                x += self.ffns[il](k.layernorm(x, L.ffn_norm, L.ffn_norm_b, eps), x)

        cache.n_past = p0 + n
        return self._head(x, all_logits)

    def _head(self, x: np.ndarray, all_logits: bool) -> np.ndarray:
        logits = super()._head(x, all_logits)
        if self.output_b is not None:
            logits += self.output_b
        return logits


_LN = dict(model=LnDecoderModel, expected=expected_tensors, layer_norm=True)
# no SPEC: no arch is named ln_decoder; models/__init__.ALIASES sends these four here
VARIANTS = (
    ArchSpec("phi2", **_LN, rope_neox=True, hidden_act="gelu", ungated_ffn=True),  # parallel, partial RoPE
    ArchSpec("stablelm", **_LN, rope_neox=True),  # SwiGLU, optional Q/K norms
    ArchSpec("starcoder2", **_LN, rope_neox=True, hidden_act="gelu", ungated_ffn=True),  # sequential
    ArchSpec("gpt2", **_LN, rope=False, hidden_act="gelu", ungated_ffn=True),  # learned positions
)
