"""Gemma 4 (GGUF arch "gemma4"), text part: the dense models (E2B, E4B, 31B) and the 26B-A4B mixture of experts.

Gemma 3's sandwich-normed block with per-layer shapes (config.gemma4, a Gemma4Layout) and four
additions. With e = token_embd[ids] * sqrt(n_embd) and x = e:
  per layer il (head dim, heads, KV heads, rotated dims, RoPE base and FFN width are the layer's own):
    n = rmsnorm(x) * attn_norm
    q = rope(rmsnorm_heads(Wq·n) * q_norm)
    layers with their own K/V:  k = rope(rmsnorm_heads(Wk·n) * k_norm);  v = rmsnorm_heads(Wv·n)   (no weight;
                                Wv absent: v comes from Wk·n, before the k norm); both go into the layer's cache
    layers sharing K/V (the last attention.shared_kv_layers): attend over layer kv_source[il]'s cache
    a = attention(q, K, V) with scale 1 (the q norm scales), within the window on sliding layers
    x = x + rmsnorm(Wo·a) * post_attention_norm
    x = x + rmsnorm(Wdown·(gelu(Wgate·m) * (Wup·m))) * post_ffw_norm,   m = rmsnorm(x) * ffn_norm
        layers with experts (those with ffn_gate_inp; 26B-A4B: all) run the experts beside that dense FFN:
        d = rmsnorm(Wdown·(gelu(Wgate·m) * (Wup·m))) * post_ffw_norm_1
        r = router · (rmsnorm(x) / sqrt(n_embd) * ffn_gate_inp.scale)     (the raw x, its own weightless norm)
        e = rmsnorm(moe(rmsnorm(x) * pre_ffw_norm_2, r)) * post_ffw_norm_2
        x = x + rmsnorm(d + e) * post_ffw_norm
        moe: softmax(r), the expert_used_count largest, weights renormalized to sum 1 (times ffn_down_exps.scale[e]
        where the file has it); GeGLU experts gelu(gate_e·z) * (up_e·z), gate and up merged in ffn_gate_up_exps
        (gate rows first) or apart (moe.py has the arithmetic)
    per-layer embeddings (E models):  x = x + rmsnorm(proj · (gelu(inp_gate·x) * pl[il])) * post_norm
    x = x * layer_output_scale                                       (a scalar per layer, when present)
  logits = cap * tanh((token_embd · (rmsnorm(x) * output_norm)) / cap)     (tied head, final soft-cap)
RoPE is NeoX; on full-attention layers rope_freqs.weight divides the frequencies ("proportional" RoPE: huge
factors stop the pairs past the rotated fraction). The per-layer inputs pl (one row of n_embd_per_layer per
layer and token) are, with P = n_embd_per_layer:
  pl = (rmsnorm_P(per_layer_model_proj · e / sqrt(n_embd)) * per_layer_proj_norm
        + per_layer_token_embd[ids] * sqrt(P)) / sqrt(2)
GGUF norm weights already hold Gemma's "+1". A decode step (one token, CPU kernels) runs each layer's attention
block as one C call (kernels.steps.attn_block_decode: the layer's own shapes, V norm, K/V sharing), with the same bits
as the Python path; the FFN, experts and per-layer embeddings stay in Python.

Metadata keys (config.read with SPEC and read_args):
The per-layer layout that config.ModelConfig holds as one Gemma4Layout (gemma4_keys).

Unlike the other architectures, Gemma 4 files describe layers that differ from one another, and llama.cpp
reads them so (keys are {arch}.*, arch = "gemma4"):
  attention.sliding_window_pattern   one bool per layer (or a period): True = sliding-window layer, attending to
                                     the last attention.sliding_window positions (required)
  attention.key_length(_swa)         head dim of full (sliding) layers; value_length(_swa) must equal them
  rope.dimension_count(_swa)         rotated dims of full (sliding) layers; the sliding one defaults to the full
                                     one, as in llama.cpp (so real files carry it)
  rope.freq_base(_swa)               RoPE base of full (sliding) layers; _swa defaults to the full base
  attention.head_count(_kv)          one value or one per layer
  feed_forward_length                one value or one per layer (the KV-sharing layers of E2B are twice as wide)
  attention.shared_kv_layers         the last N layers compute no K/V: a sliding one reads the cache of layer
                                     n_kv - 2, a full one that of layer n_kv - 1 (n_kv = block_count - N), which
                                     must be a sliding and a full layer of the same shape (llama.cpp's rule)
  embedding_length_per_layer_input   width of the per-layer embeddings (0: none; required key)
  final_logit_softcapping            logits -> cap * tanh(logits / cap); absent: llama.cpp's default 30
  expert_count, expert_used_count, expert_feed_forward_length   the 26B-A4B model's experts (config.MetaReader.experts
                                     reads them); as in llama.cpp, the layers with experts are those whose file has a
                                     blk.N.ffn_gate_inp.weight (ModelConfig.moe_layers; models/gemma4.py has the math)
The attention scale is 1 (the per-head Q norm does the scaling); embeddings are scaled by sqrt(n_embd).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError
from ..gguf.types import Tensor
from ..layers.cache import KVCache, lazy_zeros
from ..layers.ffn import FFN, FFNWeights, SparseSettings, ffn_variant
from ..layers.moe import MoEFFN
from .base import Expected, get_tensor, head_expected, norm_weight
from .gemma import GemmaModel
from .spec import ArchSpec

LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight",
    "ffn_norm": "ffn_norm.weight",
    "post_ffw_norm": "post_ffw_norm.weight",
    "inp_gate": "inp_gate.weight", "proj": "proj.weight", "post_norm": "post_norm.weight",
    "out_scale": "layer_output_scale.weight",
}
# K/V tensors: absent on the layers that share an earlier layer's cache (required on the others but attn_v);
# per-layer embedding tensors: only in files with embedding_length_per_layer_input > 0 (checked there)
OPTIONAL = ("wk", "wv", "k_norm", "inp_gate", "proj", "post_norm", "out_scale")


def expected_tensors(c: ModelConfig) -> Expected:
    g, P, E = c.gemma4, c.gemma4.n_embd_per_layer, c.n_embd
    e = head_expected(c)
    if not all(c.swa_layers):  # the full layers' proportional RoPE factors (llama.cpp requires them)
        e["rope_freqs.weight"] = ((c.head_dim // 2,), True)
    if P:
        e["per_layer_token_embd.weight"] = ((c.n_vocab, P * c.n_layer), True)
        e["per_layer_model_proj.weight"] = ((P * c.n_layer, E), True)
        e["per_layer_proj_norm.weight"] = ((P,), True)
    for il in range(c.n_layer):
        p, hd, F = f"blk.{il}.", g.head_dim[il], g.n_ff[il]
        q_dim, kv_dim, own = g.n_head[il] * hd, g.n_head_kv[il] * hd, g.has_kv(il)
        e.update({p + "attn_norm.weight": ((E,), True), p + "attn_q.weight": ((q_dim, E), True),
                  p + "attn_k.weight": ((kv_dim, E), own), p + "attn_v.weight": ((kv_dim, E), False),
                  p + "attn_output.weight": ((E, q_dim), True), p + "attn_q_norm.weight": ((hd,), True),
                  p + "attn_k_norm.weight": ((hd,), own), p + "post_attention_norm.weight": ((E,), True),
                  p + "ffn_norm.weight": ((E,), True), p + "ffn_gate.weight": ((F, E), True),
                  p + "ffn_up.weight": ((F, E), True), p + "ffn_down.weight": ((E, F), True),
                  p + "post_ffw_norm.weight": ((E,), True), p + "layer_output_scale.weight": ((1,), False)})
        if P:
            e.update({p + "inp_gate.weight": ((P, E), True), p + "proj.weight": ((E, P), True),
                      p + "post_norm.weight": ((E,), True)})
        if c.is_moe_layer(il):
            e.update(moe_expected(c, p))
    return e


def moe_expected(c: ModelConfig, p: str) -> Expected:
    """A layer's expert tensors (beside its dense FFN's): gate and up merged or apart (build_moe requires one)."""
    E, X, F = c.n_embd, c.n_expert, c.n_ff_exp
    return {p + "ffn_gate_inp.weight": ((X, E), True), p + "ffn_gate_inp.scale": ((E,), True),
            p + "pre_ffw_norm_2.weight": ((E,), True), p + "post_ffw_norm_1.weight": ((E,), True),
            p + "post_ffw_norm_2.weight": ((E,), True), p + "ffn_gate_up_exps.weight": ((X, 2 * F, E), False),
            p + "ffn_gate_exps.weight": ((X, F, E), False), p + "ffn_up_exps.weight": ((X, F, E), False),
            p + "ffn_down_exps.weight": ((X, E, F), True), p + "ffn_down_exps.scale": ((X,), False)}


GEMMA4_FINAL_SOFTCAP = 30.0  # llama.cpp's default when final_logit_softcapping is absent


@dataclass(frozen=True)
class Gemma4Layout:
    """Per layer (index il): head dim, query heads, KV heads, FFN width, rotated dims, RoPE base, and the layer
    whose K/V cache it attends over (il itself for the layers that compute K/V); n_embd_per_layer: width of the
    per-layer embeddings (0: none)."""

    head_dim: tuple[int, ...]
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    n_ff: tuple[int, ...]
    n_rot: tuple[int, ...]
    rope_base: tuple[float, ...]
    kv_source: tuple[int, ...]
    n_embd_per_layer: int = 0

    def has_kv(self, il: int) -> bool:
        return self.kv_source[il] == il


def _per_layer(reader, suffix: str, n_layer: int, default=None) -> tuple[int, ...]:
    """A key holding one positive int or one per layer, as a per-layer tuple."""
    key = reader.key(suffix)
    value = reader.meta.get(key, default)
    if value is None:
        raise ModelFileError(f"{reader.f.path}: missing required metadata key {key!r}")
    values = value if isinstance(value, list) else [value] * n_layer
    if len(values) != n_layer or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ModelFileError(f"{reader.f.path}: {key} must be a positive int or {n_layer} of them (one per "
                             f"layer), got {value!r}")
    return tuple(values)


def kv_sources(path, shared: int, swa: tuple[bool, ...], n_head_kv=None) -> list[int]:
    """Per layer, the layer whose K/V it attends to (gemma4, gemma3n): the last `shared` layers reuse those of the
    last sliding (n_kv - 2) or full (n_kv - 1) layer before them, which must be of the same kind (and, given
    n_head_kv, have as many KV heads); the others their own."""
    n_layer = len(swa)
    n_kv = n_layer - shared
    source = list(range(n_layer))
    if shared:
        if not 0 < shared <= n_layer - 2:
            raise ModelFileError(f"{path}: attention.shared_kv_layers {shared} must leave at least two layers "
                                 f"with their own K/V ({n_layer} layers)")
        for il in range(n_kv, n_layer):
            src = n_kv - 2 if swa[il] else n_kv - 1
            if swa[src] != swa[il] or (n_head_kv is not None and n_head_kv[src] != n_head_kv[il]):
                raise ModelFileError(f"{path}: layer {il} ({'sliding' if swa[il] else 'full'}) shares the K/V of "
                                     f"layer {src}, which is not a layer of the same kind and KV heads")
            source[il] = src
    return source


def gemma4_keys(reader, n_layer: int) -> dict:
    """ModelConfig fields of a gemma4 file (module docstring): "gemma4" (a Gemma4Layout), the final soft-cap and,
    in files with expert_count, the layers with experts ("moe_layers"); plus what config() pops: the window
    fields ("sliding_window", "swa_layers", "base_swa") and, for the uniform fields, the full layers' head dim
    and the largest head counts and FFN width ("_head_dim", "_n_head", "_n_head_kv", "_n_ff")."""
    path = reader.f.path
    window = reader.positive("{arch}.attention.sliding_window")
    key = reader.key("{arch}.attention.sliding_window_pattern")
    pattern = reader.meta.get(key)
    if isinstance(pattern, list) and len(pattern) == n_layer and all(isinstance(p, bool) for p in pattern):
        swa = tuple(pattern)
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        swa = tuple(il % pattern != pattern - 1 for il in range(n_layer))
    else:
        raise ModelFileError(f"{path}: {key} must be {n_layer} bools (one per layer) or a period, got {pattern!r}")
    hd_full = reader.positive("{arch}.attention.key_length")
    hd_swa = reader.positive("{arch}.attention.key_length_swa", hd_full)
    if (reader.positive("{arch}.attention.value_length", hd_full) != hd_full
            or reader.positive("{arch}.attention.value_length_swa", hd_swa) != hd_swa):
        raise ModelFileError(f"{path}: gemma4 needs value_length(_swa) equal to key_length(_swa)")
    rot_full = reader.get("{arch}.rope.dimension_count", hd_full)
    rot_swa = reader.get("{arch}.rope.dimension_count_swa", rot_full)
    for rot, hd, what in ((rot_full, hd_full, ""), (rot_swa, hd_swa, "_swa")):
        if not 0 <= rot <= hd or rot % 2:
            raise ModelFileError(f"{path}: rope.dimension_count{what} {rot} must be even and <= the head dim {hd}")
    base = reader.get("{arch}.rope.freq_base", 10_000.0, kind=float)
    base_swa = reader.get("{arch}.rope.freq_base_swa", base, kind=float)
    n_head = _per_layer(reader, "{arch}.attention.head_count", n_layer)
    n_head_kv = _per_layer(reader, "{arch}.attention.head_count_kv", n_layer, list(n_head))
    if any(h % kv for h, kv in zip(n_head, n_head_kv)):
        raise ModelFileError(f"{path}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    n_ff = _per_layer(reader, "{arch}.feed_forward_length", n_layer)
    source = kv_sources(path, reader.get("{arch}.attention.shared_kv_layers", 0), swa, n_head_kv)
    per_layer = reader.get("{arch}.embedding_length_per_layer_input")
    if per_layer < 0:
        raise ModelFileError(f"{path}: embedding_length_per_layer_input must be >= 0, got {per_layer}")
    cap = reader.get("{arch}.final_logit_softcapping", GEMMA4_FINAL_SOFTCAP, kind=float)
    if not cap >= 0:
        raise ModelFileError(f"{path}: final_logit_softcapping must be >= 0, got {cap}")
    layout = Gemma4Layout(
        head_dim=tuple(hd_swa if s else hd_full for s in swa), n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
        n_rot=tuple(rot_swa if s else rot_full for s in swa), rope_base=tuple(base_swa if s else base for s in swa),
        kv_source=tuple(source), n_embd_per_layer=per_layer)
    moe = {}
    if reader.get("{arch}.expert_count", 0):  # experts where the file has a router (llama.cpp's test)
        moe["moe_layers"] = tuple(f"blk.{il}.ffn_gate_inp.weight" in reader.f.tensors for il in range(n_layer))
    return {**moe, "gemma4": layout, "final_softcap": cap, "sliding_window": window, "swa_layers": swa, "base_swa": base_swa,
            "_head_dim": hd_full, "_n_head": max(n_head), "_n_head_kv": max(n_head_kv), "_n_ff": max(n_ff)}


class Gemma4Cache(KVCache):
    """A KVCache whose layers have their own shapes [n_head_kv, n_ctx, head_dim]; a layer that shares another's
    K/V holds that layer's very arrays (so nothing is stored twice, and nbytes counts them once)."""

    def __init__(self, layout, n_ctx: int):
        super().__init__(0, 1, n_ctx, 1)
        for il, src in enumerate(layout.kv_source):
            if src == il:
                shape = (layout.n_head_kv[il], self.n_ctx, layout.head_dim[il])
                self.k.append(lazy_zeros(shape))
                self.v.append(lazy_zeros(shape))
            else:
                self.k.append(self.k[src])
                self.v.append(self.v[src])

    @property
    def nbytes(self) -> int:
        unique = {id(a): a for a in self.k + self.v}
        return sum(a.nbytes for a in unique.values())


def per_layer_inputs(model, P: int, ids: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Gemma 4's and Gemma 3n's per-layer inputs pl f32 [n_layer, N, P]: each token's rows of per_layer_token_embd
    times sqrt(P), plus the RMS-normed projection of its scaled embedding e [N, n_embd] (per_model_proj /
    sqrt(n_embd)), the sum times 1/sqrt(2). model holds the tables (per_layer_embd, per_layer_proj,
    per_layer_norm), config and kernels."""
    c, k, n = model.config, model.kernels, ids.shape[0]
    tok = k.get_rows(model.per_layer_embd, ids).reshape(n, c.n_layer, P)
    tok *= np.float32(math.sqrt(P))
    proj = k.matmul(model.per_layer_proj, e)
    proj *= np.float32(1.0 / math.sqrt(c.n_embd))
    out = k.rmsnorm(proj.reshape(n, c.n_layer, P), model.per_layer_norm, c.norm_eps)
    out += tok
    out *= np.float32(1.0 / math.sqrt(2.0))
    return np.ascontiguousarray(out.transpose(1, 0, 2))


class Gemma4Model(GemmaModel):
    """Gemma 4's dense model (module docstring); its own forward, as every layer has its own shapes."""

    LAYER_TENSORS = LAYER_TENSORS
    OPTIONAL_TENSORS = OPTIONAL

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                 sparse: SparseSettings | None = None):
        super().__init__(config, tensors, kernels, sparse)
        c, g = config, config.gemma4
        self.moe_side = self.__dict__.get("moe_side", {})  # layer -> what runs beside its experts (build_moe)
        if self.sparsity is not None:  # fractions of each layer's own FFN width
            self.sparsity.widths = np.asarray(g.n_ff, dtype=np.float64)
        for il, L in enumerate(self.layers):
            if g.has_kv(il) and (L.wk is None or L.k_norm is None):
                raise ModelFileError(f"layer {il} computes its own K/V but has no attn_k / attn_k_norm tensor")
            if not g.has_kv(il):  # K/V tensors a sharing layer's file may still hold are never used
                L.wk = L.wv = L.k_norm = None
            L.out_scale = float(norm_weight(L.out_scale)[0]) if L.out_scale is not None else None
        freqs = get_tensor(tensors, "rope_freqs.weight", required=not all(c.swa_layers))
        self.full_freqs = norm_weight(freqs)
        # per layer: (window, the arguments of kernels.rope after the positions)
        self.layer_attn = [(c.sliding_window if swa else 0,
                            (g.n_rot[il], g.rope_base[il], c.rope_freq_scale, True,
                             None if swa else self.full_freqs))
                           for il, swa in enumerate(c.swa_layers)]
        P = g.n_embd_per_layer
        self.per_layer_embd = get_tensor(tensors, "per_layer_token_embd.weight") if P else None
        self.per_layer_proj = get_tensor(tensors, "per_layer_model_proj.weight") if P else None
        self.per_layer_norm = norm_weight(get_tensor(tensors, "per_layer_proj_norm.weight")) if P else None

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        """Layer il's experts (its ffns entry, so that the usage counts and notes find them) and, in
        self.moe_side[il], what runs beside them: the dense FFN, the branch norms and the router's input scale."""
        c, p = self.config, f"blk.{il}."
        gate_up = get_tensor(tensors, p + "ffn_gate_up_exps.weight", required=False)
        gate = get_tensor(tensors, p + "ffn_gate_exps.weight", required=False)
        up = get_tensor(tensors, p + "ffn_up_exps.weight", required=False)
        if gate_up is None and (gate is None or up is None):
            raise ModelFileError(f"layer {il} has a router but no expert gate/up weights: it needs "
                                 f"{p}ffn_gate_up_exps.weight or both {p}ffn_gate_exps.weight and {p}ffn_up_exps.weight")
        if gate_up is not None:
            gate = up = None
        scales = norm_weight(get_tensor(tensors, p + "ffn_down_exps.scale", required=False))
        moe = MoEFFN(self.kernels, get_tensor(tensors, p + "ffn_gate_inp.weight"), gate, up,
                     get_tensor(tensors, p + "ffn_down_exps.weight"), c.n_expert_used, c.expert_weights_norm,
                     layer=il, act="geglu", gate_up=gate_up, expert_scales=scales)
        dense = FFN(self.kernels, FFNWeights(up=get_tensor(tensors, p + "ffn_up.weight"),
                                             gate=get_tensor(tensors, p + "ffn_gate.weight"),
                                             down=get_tensor(tensors, p + "ffn_down.weight")),
                    ffn_variant(c), self.sparse, layer=il)
        router_scale = norm_weight(get_tensor(tensors, p + "ffn_gate_inp.scale")) * np.float32(1 / math.sqrt(c.n_embd))
        side = {name: norm_weight(get_tensor(tensors, p + name + ".weight"))
                for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2")}
        # (build_ffns runs inside Model.__init__, before __init__ below sets anything)
        self.__dict__.setdefault("moe_side", {})[il] = SimpleNamespace(dense=dense, router_scale=router_scale, **side)
        return moe

    def ffn_block(self, il: int, L, x: np.ndarray, m: np.ndarray | None = None) -> np.ndarray:
        """What the FFN part of layer il adds to the residual x (module docstring): dense, or dense and experts.
        m: the FFN's input rmsnorm(x) * ffn_norm when the caller has it (the one-call attention step returns it)."""
        k, eps = self.kernels, self.config.norm_eps
        if m is None:
            m = k.rmsnorm(x, L.ffn_norm, eps)
        side = self.moe_side.get(il)
        if side is None:
            return k.rmsnorm(self.ffns[il](m, x), L.post_ffw_norm, eps)
        y = k.rmsnorm(side.dense(m, x), side.post_ffw_norm_1, eps)
        moe = self.ffns[il]
        logits = k.matmul(moe.router, k.rmsnorm(x, side.router_scale, eps))
        y += k.rmsnorm(moe(k.rmsnorm(x, side.pre_ffw_norm_2, eps), router_logits=logits), side.post_ffw_norm_2, eps)
        return k.rmsnorm(y, L.post_ffw_norm, eps)

    def new_cache(self, n_ctx: int | None = None) -> Gemma4Cache:
        return Gemma4Cache(self.config.gemma4, n_ctx or self.config.n_ctx_train)

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        """Layer il's own attention shape, RoPE and window for attn_block_plan (base.attn_plans passes its wk and
        wv: None on the layers sharing K/V, wv None where v is Wk h)."""
        g = self.config.gemma4
        window, (n_rot, base, scale, neox, freqs) = self.layer_attn[il]
        return dict(n_head=g.n_head[il], n_head_kv=g.n_head_kv[il], head_dim=g.head_dim[il], n_rot=n_rot,
                    rope_base=base, rope_scale=scale, rope_neox=neox, rope_freqs=freqs, rope_mscale=1.0,
                    attn_scale=1.0, attn_softcap=0.0, window=window, q_norm=layer.q_norm,
                    k_norm=layer.k_norm if g.has_kv(il) else None, post_norm=layer.post_attn_norm, v_norm=True)

    def layer_attention(self) -> list[tuple[int, tuple]]:
        return self.layer_attn

    def per_layer_inputs(self, ids: np.ndarray, e: np.ndarray) -> np.ndarray:
        """pl f32 [n_layer, N, P] (module docstring) of tokens ids with scaled embeddings e [N, n_embd]."""
        return per_layer_inputs(self, self.config.gemma4.n_embd_per_layer, ids, e)

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k, g = self.config, self.kernels, self.config.gemma4
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps = ids.shape[0], c.norm_eps
        x = self._embed(ids, pos)
        pl = self.per_layer_inputs(ids, x) if g.n_embd_per_layer else None
        plans = self.attn_plans() if n == 1 else None
        if plans is not None:
            return self._decode_step(plans, x, pl, p0, cache, all_logits)
        for il, (L, (window, rope)) in enumerate(zip(self.layers, self.layer_attn)):
            hd, H, Hkv = g.head_dim[il], g.n_head[il], g.n_head_kv[il]
            h = k.rmsnorm(x, L.attn_norm, eps)
            q = k.rmsnorm(k.matmul(L.wq, h).reshape(n, H, hd), L.q_norm, eps)
            k.rope(q, pos, *rope)
            if g.has_kv(il):
                kk = k.matmul(L.wk, h).reshape(n, Hkv, hd)
                v = k.matmul(L.wv, h).reshape(n, Hkv, hd) if L.wv is not None else kk
                v = k.rmsnorm(v, None, eps)
                kk = k.rmsnorm(kk, L.k_norm, eps)
                k.rope(kk, pos, *rope)
                self._store_kv(cache, il, p0, kk, v)
            src = g.kv_source[il]
            a = k.attention(q, cache.k[src], cache.v[src], p0, window, 1.0)
            x += k.rmsnorm(k.matmul(L.wo, a.reshape(n, H * hd)), L.post_attn_norm, eps)
            x += self.ffn_block(il, L, x)
            self._layer_end(il, L, x, pl)
        cache.n_past = p0 + n
        return self._head(x, all_logits)

    def _layer_end(self, il: int, L, x: np.ndarray, pl: np.ndarray | None) -> None:
        """The per-layer embedding's addition and the layer output scale, applied to x in place."""
        k = self.kernels
        if pl is not None:
            gate = k.gelu(k.matmul(L.inp_gate, x))
            gate *= pl[il]
            x += k.rmsnorm(k.matmul(L.proj, gate), L.post_norm, self.config.norm_eps)
        if L.out_scale is not None:
            x *= np.float32(L.out_scale)

    def _decode_step(self, plans: list, x: np.ndarray, pl: np.ndarray | None, p0: int, cache: KVCache,
                     all_logits: bool) -> np.ndarray:
        """One token x f32 [1, n_embd] at position p0 through every layer, each attention block one C call (a
        layer sharing K/V reads its source layer's cache planes, which that layer filled earlier in this step)."""
        k, src = self.kernels, self.config.gemma4.kv_source
        for il, (L, plan) in enumerate(zip(self.layers, plans)):
            m = k.steps.attn_block_decode(plan, x[0], p0, cache.k[src[il]], cache.v[src[il]])
            x += self.ffn_block(il, L, x, m[None, :])
            self._layer_end(il, L, x, pl)
        cache.n_past = p0 + 1
        return self._head(x, all_logits)


def _layout(r, d: dict) -> None:
    g4 = gemma4_keys(r, d["n_layer"])
    d.update(n_head=g4.pop("_n_head"), n_head_kv=g4.pop("_n_head_kv"), head_dim=g4.pop("_head_dim"),
             n_ff=g4.pop("_n_ff"), sliding_window=g4.pop("sliding_window"), swa_layers=g4.pop("swa_layers"),
             rope_freq_base_swa=g4.pop("base_swa"), attn_scale=1.0, _n_ff_layers=g4["gemma4"].n_ff)
    d.update(g4)


SPEC = ArchSpec("gemma4", model=Gemma4Model, expected=expected_tensors, rope_neox=True, sqrt_embd_scale=True,
                ffn_variant="geglu", moe_norm=True, layout=_layout)
