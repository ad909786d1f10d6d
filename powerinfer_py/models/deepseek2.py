"""DeepSeek-V2 / V2-Lite / Coder-V2-Lite, Moonlight and DeepSeek-V3-style files (GGUF arch "deepseek2"): multi-head
latent attention (MLA) and a mixture of experts after leading dense layers.

Per layer il, for the tokens x f32 [N, n_embd] at positions pos, as llama.cpp's deepseek2 graph computes them
(H heads; each q/k head is nope + r wide, r = n_rot; values are dv wide; the latent is L = kv_lora_rank wide):
    n      = rmsnorm(x) * attn_norm
    q      = Wq · n                                      (Lite files: attn_q)
           = Wq_b · (rmsnorm(Wq_a · n) * q_a_norm)       (q_lora_rank > 0: attn_q_a, attn_q_a_norm, attn_q_b)
    q_h    = [qn_h (nope), qr_h (r)] per head h
    [c, kr]= Wkv_a · n                                   (attn_kv_a_mqa: L + r rows)
    c      = rmsnorm(c) * kv_a_norm                      the latent, shared by every head
    qr_h, kr = rope(qr_h), rope(kr)                      normal layout (pairs 2i, 2i+1), RoPE on the tail only;
                                                         YaRN per config.py (rotated dims scaled by rope_mscale)
    The expanded keys and values would be k_h = [Wk_b,h^T c, kr] and v_h = Wv_b,h · c (Wk_b,h: (L, nope),
    Wv_b,h: (dv, L)); we compute the same thing absorbed, as llama.cpp does for files with the split tensors:
    Q_h    = [Wk_b,h · qn_h (L), qr_h (r)],  K = [c, kr]  (one key of L + r per token for all heads: MQA)
    s_h,j  = attn_scale * Q_h · K_j  (= attn_scale * q_h · k_h,j)
    o_h    = sum_j softmax(s_h)_j c_j  (the first L dims of attention over K as keys and values)
    y      = Wo · concat_h(Wv_b,h · o_h)
    x      = x + y
    x      = x + ffn_il(rmsnorm(x) * ffn_norm)
    logits = output · (rmsnorm(x_last) * output_norm)
attn_scale = mscale^2 / sqrt(nope + r) (config.py; 1/sqrt(nope + r) without YaRN). The KV cache holds K only, one
"head" of L + r f16 values per token and layer (576 for V2/V3: MLA's point), and the attention reads it as both
keys and values (LatentCache: v is k). Older files store one attn_kv_b (H*(nope + dv), L) instead of attn_k_b
(H, L, nope) / attn_v_b (H, dv, L); it is split at load into the two, dequantized to f32 (the key half must
be transposed; this costs 4 bytes per weight of those tensors).
ffn_il: SwiGLU (feed_forward_length wide) on the first leading_dense_block_count layers; then moe.MoEFFN with
softmax or sigmoid router scores, the optional selection bias exp_probs_b.bias, group-limited selection,
optional renormalization and the routed scale, plus an ungated shared SwiGLU expert (ffn_*_shexp).

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  deepseek2 (DeepSeek-V2/V2-Lite/V3, Moonlight) multi-head latent attention (models/deepseek2.py) plus experts:
          head_dim is the q/k head width, nope + rope ({arch}.attention.key_length_mla in files with the split
          attn_k_b/attn_v_b, key_length in older files with attn_kv_b), v_head_dim the value width
          (value_length_mla / value_length), n_rot = rope.dimension_count the rotated tail of each head (normal
          layout); {arch}.attention.kv_lora_rank, q_lora_rank (absent or 0: a plain attn_q); n_head_kv is 1 (the
          cache holds one latent + rope key per token). {arch}.leading_dense_block_count dense layers, then
          experts with expert_gating_func (absent/1 softmax, 2 sigmoid), expert_weights_norm (default off),
          expert_weights_scale (absent/0: 1), expert_group_count / expert_group_used_count, and an ungated shared
          expert expert_shared_count x expert_feed_forward_length wide. YaRN as llama.cpp computes it for this
          arch: with L = rope.scaling.yarn_log_multiplier / 0.1 (0 when absent) and factor F, the rotated dims are
          scaled by a = attn_factor (times 1 + 0.1 ln F when L is absent) and attn_scale is
          (a (1 + 0.1 L ln F))^2 / sqrt(head_dim)
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..gguf.types import GGMLType, Tensor
from ..kernels.ref import dequantize
from ..layers.cache import KVCache, lazy_zeros
from ..layers.moe import MoEFFN
from .base import Expected, Model, ffn_expected, get_tensor, head_expected, norm_weight
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> Expected:
    """deepseek2's tensors in llama.cpp's names (numpy shapes), either kv_b layout as the metadata says."""
    E, H, hd, L, r, dv = c.n_embd, c.n_head, c.head_dim, c.kv_lora_rank, c.n_rot, c.v_head_dim
    nope = hd - r
    e = head_expected(c)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_norm.weight"] = ((E,), True)
        if c.q_lora_rank:
            e[p + "attn_q_a.weight"] = ((c.q_lora_rank, E), True)
            e[p + "attn_q_a_norm.weight"] = ((c.q_lora_rank,), True)
            e[p + "attn_q_b.weight"] = ((H * hd, c.q_lora_rank), True)
        else:
            e[p + "attn_q.weight"] = ((H * hd, E), True)
        e[p + "attn_kv_a_mqa.weight"] = ((L + r, E), True)
        e[p + "attn_kv_a_norm.weight"] = ((L,), True)
        if c.mla_kv_split:
            e[p + "attn_k_b.weight"] = ((H, L, nope), True)
            e[p + "attn_v_b.weight"] = ((H, dv, L), True)
        else:
            e[p + "attn_kv_b.weight"] = ((H * (nope + dv), L), True)
        e[p + "attn_output.weight"] = ((E, H * dv), True)
        e[p + "ffn_norm.weight"] = ((E,), True)
        e.update(ffn_expected(c, il, shared_gate=False, select_bias=False))
    return e


class LatentCache(KVCache):
    """The MLA cache: per layer one plane f16 [1, n_ctx, L + r] of latents and rope keys, read as keys and as
    values (v[il] is k[il])."""

    def __init__(self, n_layer: int, n_ctx: int, width: int):
        super().__init__(0, 1, n_ctx, width)
        self.k = [lazy_zeros((1, self.n_ctx, width)) for _ in range(n_layer)]
        self.v = self.k

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k)


class DeepSeek2Model(Model):
    """The block of the module docstring (its own forward; no one-call decode step)."""

    LAYER_TENSORS = {
        "attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wq_a": "attn_q_a.weight",
        "q_a_norm": "attn_q_a_norm.weight", "wq_b": "attn_q_b.weight", "wkv_a": "attn_kv_a_mqa.weight",
        "kv_a_norm": "attn_kv_a_norm.weight", "wk_b": "attn_k_b.weight", "wv_b": "attn_v_b.weight",
        "wkv_b": "attn_kv_b.weight", "wo": "attn_output.weight", "ffn_norm": "ffn_norm.weight",
    }
    OPTIONAL_TENSORS = ("wq", "wq_a", "q_a_norm", "wq_b", "wk_b", "wv_b", "wkv_b")
    fused_attention = False

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        c = config
        nope = c.head_dim - c.n_rot
        for L in self.layers:
            if L.wkv_b is not None and L.wk_b is None:  # older files: split (and transpose) kv_b at load
                kvb = dequantize(L.wkv_b).reshape(c.n_head, nope + c.v_head_dim, c.kv_lora_rank)
                L.wk_b = Tensor(L.wkv_b.name + "[k]", GGMLType.F32, (c.n_head, c.kv_lora_rank, nope),
                                np.ascontiguousarray(kvb[:, :nope].transpose(0, 2, 1)))
                L.wv_b = Tensor(L.wkv_b.name + "[v]", GGMLType.F32, (c.n_head, c.v_head_dim, c.kv_lora_rank),
                                np.ascontiguousarray(kvb[:, nope:]))
            L.wkv_b = None
        self._heads = np.arange(c.n_head, dtype=np.int32)
        self.rope_at = nope  # where the rotated dims of a q head start: the tail (tests move it to see it matter)

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        c = self.config
        moe = super().build_moe(tensors, il)
        return MoEFFN(self.kernels, moe.router, moe.gate, moe.up, moe.down, c.n_expert_used, c.expert_weights_norm,
                      layer=il, shared=moe.shared, shared_gate=None,
                      select_bias=norm_weight(get_tensor(tensors, f"blk.{il}.exp_probs_b.bias", required=False)),
                      gating=c.expert_gating, weights_scale=c.expert_weights_scale, n_groups=c.n_expert_groups,
                      n_group_used=c.n_expert_group_used)

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        c = self.config
        return LatentCache(c.n_layer, n_ctx or c.n_ctx_train, c.kv_lora_rank + c.n_rot)

    def _per_head(self, w: Tensor, x: np.ndarray) -> np.ndarray:
        """x f32 [N, H, K] -> f32 [N, H, rows]: head h through w[h] (w 3-D (H, rows, K)), one grouped call."""
        n, H, K = x.shape
        xs = np.ascontiguousarray(x.transpose(1, 0, 2)).reshape(H * n, K)
        y = self.kernels.matmul_experts(w, self._heads, np.arange(H + 1, dtype=np.int64) * n, xs)
        return y.reshape(H, n, -1).transpose(1, 0, 2)

    def _attention(self, L, n: np.ndarray, pos: np.ndarray, p0: int, cache: KVCache, il: int) -> np.ndarray:
        """What layer L's attention adds to the residual for the normed input n f32 [N, n_embd]."""
        c, k = self.config, self.kernels
        N, H, r, lat = n.shape[0], c.n_head, c.n_rot, c.kv_lora_rank
        if L.wq is not None:
            q = k.matmul(L.wq, n)
        else:
            q = k.matmul(L.wq_b, k.rmsnorm(k.matmul(L.wq_a, n), L.q_a_norm, c.norm_eps))
        q = q.reshape(N, H, c.head_dim)
        a0 = self.rope_at
        q_pe = np.ascontiguousarray(q[:, :, a0:a0 + r])
        q_nope = q[:, :, :a0] if a0 + r == c.head_dim else np.concatenate([q[:, :, :a0], q[:, :, a0 + r:]], axis=2)
        kv = k.matmul(L.wkv_a, n)  # [N, L + r]
        k_pe = np.ascontiguousarray(kv[:, lat:]).reshape(N, 1, r)
        rope = (r, c.rope_freq_base, c.rope_freq_scale, c.rope_neox, self.rope_freqs, self.rope_mscale)
        k.rope(q_pe, pos, *rope)
        k.rope(k_pe, pos, *rope)
        qk = np.empty((N, H, lat + r), dtype=np.float32)
        qk[:, :, :lat] = self._per_head(L.wk_b, q_nope)  # absorbed: Wk_b,h · qn_h
        qk[:, :, lat:] = q_pe
        key = np.empty((N, 1, lat + r), dtype=np.float32)
        key[:, 0, :lat] = k.rmsnorm(np.ascontiguousarray(kv[:, :lat]), L.kv_a_norm, c.norm_eps)
        key[:, :, lat:] = k_pe
        k.store_kv(cache.k[il], p0, key)
        a = k.attention(qk, cache.k[il], cache.k[il], p0, 0, c.attn_scale)  # [N, H, L + r]; values: the latents
        o = self._per_head(L.wv_b, a[:, :, :lat])  # [N, H, dv]
        return k.matmul(L.wo, np.ascontiguousarray(o).reshape(N, H * c.v_head_dim))

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        x = self._embed(ids, pos)
        for il, L in enumerate(self.layers):
            x += self._attention(L, k.rmsnorm(x, L.attn_norm, c.norm_eps), pos, p0, cache, il)
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, c.norm_eps), x)
        cache.n_past = p0 + ids.shape[0]
        return self._head(x, all_logits)


def _mla(r, d: dict) -> dict:
    return deepseek2_keys(r, d["n_layer"], d["n_head"])


def deepseek2_keys(r, n_layer: int, n_head: int) -> dict:
    """deepseek2's MLA and routing fields (module docstring) plus "head_dim" (the q/k head width)."""
    kv_lora = r.positive("{arch}.attention.kv_lora_rank")
    q_lora = r.get("{arch}.attention.q_lora_rank", 0)
    split = any(r.key(k) in r.meta for k in ("{arch}.attention.key_length_mla",
                                                  "{arch}.attention.value_length_mla"))
    suffix = "_mla" if split else ""
    head_dim = r.positive("{arch}.attention.key_length" + suffix)
    v_dim = r.positive("{arch}.attention.value_length" + suffix, None if split else head_dim)
    lead = r.get("{arch}.leading_dense_block_count", 0)
    if not 0 <= lead <= n_layer or q_lora < 0:
        raise ModelFileError(f"{r.f.path}: leading_dense_block_count {lead} must be in 0..{n_layer} and "
                             f"q_lora_rank {q_lora} >= 0")
    if r.get("{arch}.attention.temperature_scale", 0.0, kind=float):
        raise UnsupportedError(f"{r.f.path}: deepseek2 files with attention temperature tuning are not supported")
    gating = r.get("{arch}.expert_gating_func", 0)
    if gating == 0:  # older V2 files carry no key: softmax (llama.cpp's GLM-4.7-Flash guess aside)
        gating = 2 if n_layer in (47, 48) and r.n_vocab() == 154880 else 1
    if gating not in (1, 2):
        raise UnsupportedError(f"{r.f.path}: {r.key('{arch}.expert_gating_func')} {gating} is not "
                               "supported (1 softmax, 2 sigmoid)")
    norm = r.meta.get(r.key("{arch}.expert_weights_norm"), False)
    if not isinstance(norm, bool):
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.expert_weights_norm')} should be a bool")
    scale = r.get("{arch}.expert_weights_scale", 0.0, kind=float)
    groups, used = r.get("{arch}.expert_group_count", 0), r.get("{arch}.expert_group_used_count", 0)
    n_expert = r.positive("{arch}.expert_count")
    if groups > 1 and (n_expert % groups or not 0 < used <= groups):
        raise ModelFileError(f"{r.f.path}: {n_expert} experts in {groups} groups with {used} used is not "
                             "a valid expert grouping")
    return {"head_dim": head_dim, "q_lora_rank": q_lora, "kv_lora_rank": kv_lora, "v_head_dim": v_dim,
            "mla_kv_split": split, "moe_layers": tuple(il >= lead for il in range(n_layer)),
            "expert_gating": "sigmoid" if gating == 2 else "softmax",
            "expert_weights_scale": scale if scale else 1.0,
            "n_expert_groups": groups if groups > 1 else 0, "n_expert_group_used": used if groups > 1 else 0,
            "_norm": norm, "_n_shared": r.get("{arch}.expert_shared_count", 0)}


def deepseek2_yarn(r, head_dim: int, rope_scale: float, yarn: bool) -> tuple[float, float]:
    """(rope_mscale, attn_scale) of a deepseek2 file: llama.cpp's YaRN for this arch (module docstring)."""
    if rope_scale != 1.0:
        raise UnsupportedError(f"{r.f.path}: linear RoPE scaling of a deepseek2 file is not supported")
    attn_factor = r.get("{arch}.rope.scaling.attn_factor", 1.0, kind=float)
    if not yarn:
        return attn_factor, attn_factor * attn_factor / math.sqrt(head_dim)
    ln_f = math.log(r.get("{arch}.rope.scaling.factor", kind=float))
    log_mul_key = "{arch}.rope.scaling.yarn_log_multiplier"
    log_mul = r.get(log_mul_key, 0.0, kind=float) / 0.1  # the converter stores 0.1 * mscale_all_dim
    a = attn_factor * (1.0 if r.key(log_mul_key) in r.meta else 1.0 + 0.1 * ln_f)
    m = a * (1.0 + 0.1 * log_mul * ln_f)
    return a, m * m / math.sqrt(head_dim)


def read_args(r, d: dict) -> None:
    """The renormalization and shared experts from their own keys; llama.cpp's YaRN for this arch."""
    d.update(expert_weights_norm=d.pop("_norm"), n_ff_shexp=d["n_ff_exp"] * d.pop("_n_shared"))
    d["rope_mscale"], d["attn_scale"] = deepseek2_yarn(r, d["head_dim"], d["rope_freq_scale"], bool(d["rope_factors"]))


def describe(c: dict) -> list[tuple[str, str]]:
    return [("deepseek2", f"latent attention (MLA): cache {c['kv_lora_rank']} + {c['n_rot']} per token; q rank "
             f"{c['q_lora_rank'] or 'full'}; router {c['expert_gating']}, x{c['expert_weights_scale']:g}"
             + (f", {c['n_expert_groups']} groups ({c['n_expert_group_used']} used)" if c["n_expert_groups"] else ""))]


SPEC = ArchSpec("deepseek2", model=DeepSeek2Model, expected=expected_tensors, yarn=True, moe=True, moe_norm=False,
                mla=_mla, describe=describe)  # moe_norm: read from {arch}.expert_weights_norm (read_args)
