"""Gemma 3n (GGUF arch "gemma3n": the on-device E2B / E4B models), text part.

The residual stream is held as A parallel copies ("AltUp" streams, A = 4; x_0 is the one the layer computes
on). With e = token_embd[ids] * sqrt(n_embd), rms(v) = ||v|| per token (no epsilon) and P the per-layer width:
  x_0 = e;  x_i = altup_proj[i-1]·e * rms(e) / rms(altup_proj[i-1]·e)            (i = 1..A-1)
  pl  = (rmsnorm(per_layer_model_proj·e / sqrt(n_embd)) * per_layer_proj_norm
         + per_layer_token_embd[ids] * sqrt(P)) / sqrt(2)                         (per layer, P wide)
  per layer il:
    router(v) = tanh(altup_router · (rmsnorm(v) * altup_router_norm / n_embd))    (A values per token)
    predict:  C = reshape(altup_predict_coef · router(x_0), A x A);  p_b = x_b + sum_a C[b, a] x_a
    n = rmsnorm(p_0) * attn_norm
    laurel = n + rmsnorm(laurel_r · (laurel_l · n)) * laurel_post_norm            (LAuReL: low-rank branch)
    q = rope(rmsnorm_heads(Wq·n) * q_norm);  layers with their own K/V: k = rope(rmsnorm_heads(Wk·n) * k_norm),
        v = rmsnorm_heads(Wv·n) (no weight); layers from n_kv on attend over layer kv_source[il]'s cache
    a = attention(q, K, V), scale 1, within the window on sliding layers (il % 5 != 4), RoPE NeoX with the
        layer's base
    h = (rmsnorm(Wo·a) * post_attention_norm + p_0 + laurel) / sqrt(2)
    m = rmsnorm(h) * ffn_norm;  g = Wgate·m
    top-k layers (std_mul k set, the first 10): g = max(0, g - (mean(g) + k * std(g)))   (std over n_ff with
        n - 1; about 95% of the neurons come out exactly 0, and gelu(0) = 0)
    o = rmsnorm(Wdown·(gelu(g) * (Wup·m))) * post_ffw_norm + h
    correct:  c = altup_correct_coef · router(o) + 1;  x_b = p_b + c_b (o - p_0)
    x_b += rmsnorm(proj · (gelu(inp_gate · (x_0 * altup_correct_scale)) * pl[il])) * post_norm  (b = 1..A-1)
  y = (x_0 + sum_i u_i * rms(x_0) / rms(u_i)) / A,  u_i = altup_unembd_proj[i-1]·x_i
  logits = cap * tanh(token_embd · (rmsnorm(y) * output_norm) / cap)            (tied head, cap 30)
GGUF norm weights already hold Gemma's "+1". `--sparse exact` computes the up rows of the top-k layers only for
the neurons the top-k keeps (the gate stays dense; the down projection is the dense matmul of h with exact zeros),
the same bits as `off`. A decode step (one token, CPU kernels) runs each layer's attention block (from the
normed p_0 to p_0 + rmsnorm(Wo·a) * post_attention_norm) as one C call, kernels.steps.attn_block_decode, with the same
bits as the Python path; AltUp, LAuReL, the FFN and the per-layer inputs stay in Python.

Metadata keys (config.read with SPEC and read_args):
Held by config.ModelConfig as one Gemma3nLayout (gemma3n_keys).

Keys (arch = "gemma3n"); llama.cpp fixes several of these in its code rather than reading them, so each one's
default here is llama.cpp's fixed value, which real E2B / E4B files also carry:
  attention.sliding_window           window of the sliding layers (required)
  attention.sliding_window_pattern   one bool per layer (True = sliding) or a period; default period 5
                                     (layers il % 5 != 4 slide)
  rope.freq_base(_swa)               RoPE base of the full / sliding layers (_swa default 10000)
  attention.shared_kv_layers         the last N layers compute no K/V: a sliding one attends over layer
                                     n_kv - 2's cache, a full one over layer n_kv - 1's (n_kv = block_count - N;
                                     llama.cpp: n_kv = 20 always, so the default N is block_count - 20)
  activation_sparsity_scale          per layer the std multiplier k of the Gaussian top-k FFN (the converter
                                     writes Normal.icdf(p): 1.6449 for p = 0.95, -inf for p = 0, a dense layer);
                                     default llama.cpp's: the first 10 layers at 1.6448533535003662
  altup.num_inputs, altup.active_idx AltUp streams (default 4) and the one that is computed (default 0; only 0
                                     is run here)
  embedding_length_per_layer_input   width of the per-layer embeddings (default 256)
  final_logit_softcapping            logits -> cap * tanh(logits / cap) (default 30)
The LAuReL rank is the width of blk.0.laurel_l.weight. The attention scale is 1 (the Q norm scales).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..gguf.types import Tensor
from ..layers.cache import KVCache
from ..layers.ffn import SparseSettings, SparsityStats
from .base import Expected, Model, get_tensor, head_expected, norm_weight
from .gemma4 import Gemma4Cache, kv_sources, per_layer_inputs
from .spec import ArchSpec

LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight",
    "ffn_norm": "ffn_norm.weight", "gate": "ffn_gate.weight", "up": "ffn_up.weight", "down": "ffn_down.weight",
    "post_ffw_norm": "post_ffw_norm.weight",
    "inp_gate": "inp_gate.weight", "proj": "proj.weight", "post_norm": "post_norm.weight",
    "correct_coef": "altup_correct_coef.weight", "correct_scale": "altup_correct_scale.weight",
    "predict_coef": "altup_predict_coef.weight", "router": "altup_router.weight",
    "router_norm": "altup_router_norm.weight",
    "laurel_l": "laurel_l.weight", "laurel_r": "laurel_r.weight", "laurel_norm": "laurel_post_norm.weight",
}
OPTIONAL = ("wk", "wv", "k_norm")  # required on the layers with their own K/V (checked in Gemma3nModel)
EXACT_MODES = ("off", "exact")


SWA_PERIOD = 5
FREQ_BASE_SWA = 10_000.0
N_LAYER_KV = 20  # llama.cpp: layers from 20 on share K/V
N_SPARSE_LAYERS = 10  # llama.cpp: the first 10 layers run the Gaussian top-k
SPARSITY_STD_MUL = 1.6448533535003662  # Normal(0, 1).icdf(0.95)
N_ALTUP = 4
N_EMBD_PER_LAYER = 256
FINAL_SOFTCAP = 30.0


@dataclass(frozen=True)
class Gemma3nLayout:
    """kv_source: per layer the layer whose K/V cache it attends over (itself for layers that compute K/V);
    std_mul: per layer the Gaussian top-k multiplier k, None for a dense FFN; n_altup: AltUp streams;
    n_embd_per_layer: per-layer embedding width; laurel_rank: LAuReL's low rank."""

    kv_source: tuple[int, ...]
    std_mul: tuple[float | None, ...]
    n_altup: int = N_ALTUP
    n_embd_per_layer: int = N_EMBD_PER_LAYER
    laurel_rank: int = 64

    def has_kv(self, il: int) -> bool:
        return self.kv_source[il] == il


def _sparsity(reader, n_layer: int) -> tuple[float | None, ...]:
    key = reader.key("{arch}.activation_sparsity_scale")
    value = reader.meta.get(key)
    if value is None:
        return tuple(SPARSITY_STD_MUL if il < N_SPARSE_LAYERS else None for il in range(n_layer))
    if (not isinstance(value, list) or len(value) != n_layer
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise ModelFileError(f"{reader.f.path}: {key} must be {n_layer} numbers (one per layer), got {value!r}")
    if any(math.isnan(v) or v == math.inf for v in value):
        raise ModelFileError(f"{reader.f.path}: {key} holds NaN or +inf")
    return tuple(None if v == -math.inf else float(v) for v in value)


def gemma3n_keys(reader, n_layer: int) -> dict:
    """ModelConfig fields of a gemma3n file (module docstring): "gemma3n" (a Gemma3nLayout) and the final
    soft-cap, plus what config() pops: "sliding_window", "swa_layers", "base_swa"."""
    path = reader.f.path
    window = reader.positive("{arch}.attention.sliding_window")
    key = reader.key("{arch}.attention.sliding_window_pattern")
    pattern = reader.meta.get(key, SWA_PERIOD)
    if isinstance(pattern, list) and len(pattern) == n_layer and all(isinstance(p, bool) for p in pattern):
        swa = tuple(pattern)
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        swa = tuple(il % pattern != pattern - 1 for il in range(n_layer))
    else:
        raise ModelFileError(f"{path}: {key} must be {n_layer} bools (one per layer) or a period, got {pattern!r}")
    source = kv_sources(path, reader.get("{arch}.attention.shared_kv_layers", max(0, n_layer - N_LAYER_KV)), swa)
    n_altup = reader.positive("{arch}.altup.num_inputs", N_ALTUP)
    if n_altup < 2:
        raise ModelFileError(f"{path}: altup.num_inputs must be >= 2, got {n_altup}")
    if reader.get("{arch}.altup.active_idx", 0) != 0:
        raise UnsupportedError(f"{path}: gemma3n files whose active AltUp stream is not 0 are not supported")
    per_layer = reader.positive("{arch}.embedding_length_per_layer_input", N_EMBD_PER_LAYER)
    laurel = reader.f.tensors.get("blk.0.laurel_l.weight")
    if laurel is None:
        raise ModelFileError(f"{path}: missing required tensor 'blk.0.laurel_l.weight'")
    cap = reader.get("{arch}.final_logit_softcapping", FINAL_SOFTCAP, kind=float)
    if not (math.isfinite(cap) and cap > 0):
        raise ModelFileError(f"{path}: final_logit_softcapping must be a finite number > 0, got {cap}")
    layout = Gemma3nLayout(kv_source=tuple(source), std_mul=_sparsity(reader, n_layer), n_altup=n_altup,
                           n_embd_per_layer=per_layer, laurel_rank=int(laurel.shape[0]))
    return {"gemma3n": layout, "final_softcap": cap, "sliding_window": window, "swa_layers": swa,
            "base_swa": reader.get("{arch}.rope.freq_base_swa", FREQ_BASE_SWA, kind=float)}


def expected_tensors(c: ModelConfig) -> Expected:
    g, E, F = c.gemma3n, c.n_embd, c.n_ff
    A, P, R, L = g.n_altup, g.n_embd_per_layer, g.laurel_rank, c.n_layer
    q_dim, kv_dim, hd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.head_dim
    e = head_expected(c)
    e.update({"altup_proj.weight": ((A - 1, E, E), True), "altup_unembd_proj.weight": ((A - 1, E, E), True),
              "per_layer_token_embd.weight": ((c.n_vocab, P * L), True),
              "per_layer_model_proj.weight": ((P * L, E), True), "per_layer_proj_norm.weight": ((P,), True)})
    for il in range(L):
        p, own = f"blk.{il}.", g.has_kv(il)
        e.update({p + "attn_norm.weight": ((E,), True), p + "attn_q.weight": ((q_dim, E), True),
                  p + "attn_k.weight": ((kv_dim, E), own), p + "attn_v.weight": ((kv_dim, E), own),
                  p + "attn_output.weight": ((E, q_dim), True), p + "attn_q_norm.weight": ((hd,), True),
                  p + "attn_k_norm.weight": ((hd,), own), p + "post_attention_norm.weight": ((E,), True),
                  p + "ffn_norm.weight": ((E,), True), p + "ffn_gate.weight": ((F, E), True),
                  p + "ffn_up.weight": ((F, E), True), p + "ffn_down.weight": ((E, F), True),
                  p + "post_ffw_norm.weight": ((E,), True), p + "inp_gate.weight": ((P, E), True),
                  p + "proj.weight": ((E, P), True), p + "post_norm.weight": ((E,), True),
                  p + "altup_correct_coef.weight": ((A, A), True), p + "altup_correct_scale.weight": ((E,), True),
                  p + "altup_predict_coef.weight": ((A * A, A), True), p + "altup_router.weight": ((A, E), True),
                  p + "altup_router_norm.weight": ((E,), True), p + "laurel_l.weight": ((R, E), True),
                  p + "laurel_r.weight": ((E, R), True), p + "laurel_post_norm.weight": ((E,), True)})
    return e


class Gemma3nModel(Model):
    """Gemma 3n (module docstring): its own forward over the AltUp streams."""

    LAYER_TENSORS = LAYER_TENSORS
    OPTIONAL_TENSORS = OPTIONAL

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                 sparse: SparseSettings | None = None):
        if sparse is not None and sparse.mode not in EXACT_MODES:
            raise UnsupportedError(f"gemma3n runs --sparse off or exact (its own top-k sparsity), not {sparse.mode!r}")
        super().__init__(config, tensors, kernels, sparse)
        g = config.gemma3n
        for il, L in enumerate(self.layers):
            if g.has_kv(il) and (L.wk is None or L.wv is None or L.k_norm is None):
                raise ModelFileError(f"layer {il} computes its own K/V but lacks attn_k / attn_v / attn_k_norm")
            if not g.has_kv(il):  # K/V tensors a sharing layer's file may still hold are never used
                L.wk = L.wv = L.k_norm = None
            L.correct_scale = norm_weight(L.correct_scale)
        self.exact = self.sparse.mode == "exact"
        self.sparsity = SparsityStats(config.n_layer, config.n_ff, self.sparse.mode, 0.0)
        self.layer_attn = [(config.sliding_window if swa else 0,
                            (config.n_rot, config.rope_freq_base_swa if swa else config.rope_freq_base,
                             1.0 if swa else config.rope_freq_scale, True))
                           for swa in config.swa_layers]
        self.altup_proj = _matrices(get_tensor(tensors, "altup_proj.weight"))
        self.altup_unembd = _matrices(get_tensor(tensors, "altup_unembd_proj.weight"))
        self.per_layer_embd = get_tensor(tensors, "per_layer_token_embd.weight")
        self.per_layer_proj = get_tensor(tensors, "per_layer_model_proj.weight")
        self.per_layer_norm = norm_weight(get_tensor(tensors, "per_layer_proj_norm.weight"))

    def build_ffns(self, tensors, biases: bool = False) -> list:
        return [None] * self.config.n_layer  # the FFN is part of the layer (top-k): Gemma3nModel.ffn

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        c = self.config
        layout = SimpleNamespace(kv_source=c.gemma3n.kv_source, n_head_kv=(c.n_head_kv,) * c.n_layer,
                                 head_dim=(c.head_dim,) * c.n_layer)
        return Gemma4Cache(layout, n_ctx or c.n_ctx_train)

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        """Layer il's RoPE and window, the weightless V norm, and its K/V source (base.attn_plans passes wk and wv:
        None on the layers sharing K/V) for attn_block_plan."""
        window, (n_rot, base, scale, neox) = self.layer_attn[il]
        return dict(n_rot=n_rot, rope_base=base, rope_scale=scale, rope_neox=neox, rope_freqs=None, rope_mscale=1.0,
                    attn_scale=1.0, attn_softcap=0.0, window=window, q_norm=layer.q_norm, k_norm=layer.k_norm,
                    post_norm=layer.post_attn_norm, v_norm=True)

    # ---- pieces ------------------------------------------------------------------------------------------
    def _rescaled(self, ws: list[Tensor], xs: list[np.ndarray], target: np.ndarray) -> list[np.ndarray]:
        """ws[i]·xs[i] scaled per token to the magnitude target [N, 1]."""
        out = []
        for w, x in zip(ws, xs):
            y = self.kernels.matmul(w, x)
            y *= target / np.sqrt(np.sum(np.square(y, dtype=np.float32), axis=-1, keepdims=True))
            out.append(y)
        return out

    def per_layer_inputs(self, ids: np.ndarray, e: np.ndarray) -> np.ndarray:
        """pl f32 [n_layer, N, P] (module docstring; Gemma 4's computation)."""
        return per_layer_inputs(self, self.config.gemma3n.n_embd_per_layer, ids, e)

    def router(self, L, v: np.ndarray) -> np.ndarray:
        c = self.config
        r = self.kernels.rmsnorm(v, L.router_norm, c.norm_eps)
        r *= np.float32(1.0 / c.n_embd)
        return np.tanh(self.kernels.matmul(L.router, r))  # [N, A]

    def ffn(self, il: int, L, m: np.ndarray) -> np.ndarray:
        """The FFN output before post_ffw_norm; the top-k on layers with a std multiplier (module docstring)."""
        k, mul = self.kernels, self.config.gemma3n.std_mul[il]
        g = k.matmul(L.gate, m)
        if mul is None:
            return k.matmul(L.down, k.geglu(g, k.matmul(L.up, m)))
        n_ff = g.shape[-1]
        mean = (g.sum(axis=-1, dtype=np.float64) / n_ff).astype(np.float32)[:, None]
        d = g - mean
        var = np.float32(np.sum(np.square(d), axis=-1, dtype=np.float64)) * np.float32(1.0 / (n_ff - 1))
        cut = mean + np.sqrt(var)[:, None] * np.float32(mul)
        g -= cut
        np.maximum(g, 0, out=g)
        if not self.exact:
            h = k.gelu(g)
            h *= k.matmul(L.up, m)
            n_active = int(np.count_nonzero(g))
        else:
            rows = np.flatnonzero((g != 0).any(axis=0)).astype(np.int32)
            n_active = int(np.count_nonzero(g))
            h = np.zeros_like(g)
            if len(rows):
                part = k.gelu(np.ascontiguousarray(g[:, rows]))
                part *= k.matmul_rows(L.up, rows, m)
                h[:, rows] = part
        self.sparsity.record(il, m.shape[0], n_active, int(np.count_nonzero(h)))
        return k.matmul(L.down, h)

    def laurel(self, L, h: np.ndarray) -> np.ndarray:
        """LAuReL: h plus its normed low-rank image."""
        out = self.kernels.rmsnorm(self.kernels.matmul(L.laurel_r, self.kernels.matmul(L.laurel_l, h)),
                                   L.laurel_norm, self.config.norm_eps)
        out += h
        return out

    def altup_correct(self, L, pred: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
        """The corrected streams x_b = p_b + c_b (y - p_0), c = altup_correct_coef · router(y) + 1."""
        cc = self.kernels.matmul(L.correct_coef, self.router(L, y)) + np.float32(1.0)  # [N, A]
        innov = y - pred[0]
        return [pred[b] + innov * cc[:, b:b + 1] for b in range(len(pred))]

    def _attention(self, il: int, L, h: np.ndarray, pos: np.ndarray, p0: int, cache: KVCache, window: int,
                   rope: tuple) -> np.ndarray:
        """The attention block's output rmsnorm(Wo·a) * post_attention_norm for the normed input h f32 [N, n_embd]
        (the Python path; it stores the layer's K/V, if it has its own, into cache)."""
        c, k, g, eps, n = self.config, self.kernels, self.config.gemma3n, self.config.norm_eps, h.shape[0]
        q = k.rmsnorm(k.matmul(L.wq, h).reshape(n, c.n_head, c.head_dim), L.q_norm, eps)
        k.rope(q, pos, *rope)
        if g.has_kv(il):
            kk = k.rmsnorm(k.matmul(L.wk, h).reshape(n, c.n_head_kv, c.head_dim), L.k_norm, eps)
            v = k.rmsnorm(k.matmul(L.wv, h).reshape(n, c.n_head_kv, c.head_dim), None, eps)
            k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, v)
        src = g.kv_source[il]
        a = k.attention(q, cache.k[src], cache.v[src], p0, window, 1.0)
        return k.rmsnorm(k.matmul(L.wo, a.reshape(n, c.n_head * c.head_dim)), L.post_attn_norm, eps)

    # ---- forward -----------------------------------------------------------------------------------------
    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k, g = self.config, self.kernels, self.config.gemma3n
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps, A = ids.shape[0], c.norm_eps, g.n_altup
        e = k.get_rows(self.token_embd, ids)
        e *= np.float32(c.embd_scale)
        pl = self.per_layer_inputs(ids, e)
        mag = np.sqrt(np.sum(np.square(e), axis=-1, keepdims=True))
        xs = [e] + self._rescaled(self.altup_proj, [e] * (A - 1), mag)
        inv2 = np.float32(1.0 / math.sqrt(2.0))
        plans = self.attn_plans() if n == 1 else None
        for il, (L, (window, rope)) in enumerate(zip(self.layers, self.layer_attn)):
            # AltUp predict: p_b = x_b + sum_a C[b, a] x_a
            coef = k.matmul(L.predict_coef, self.router(L, xs[0])).reshape(n, A, A)
            stack = np.stack(xs)  # [A, N, E]
            pred = stack + np.einsum("nba,ane->bne", coef, stack).astype(np.float32)
            act = np.ascontiguousarray(pred[0])
            h = k.rmsnorm(act, L.attn_norm, eps)
            laurel = self.laurel(L, h)
            src = g.kv_source[il]
            if plans is not None:  # one C call: o = act + rmsnorm(Wo·a) * post_attention_norm (act + o, same bits)
                o = act.copy()  # act may be a view of pred, which altup_correct reads
                k.steps.attn_block_decode(plans[il], o[0], p0, cache.k[src], cache.v[src])
            else:
                o = self._attention(il, L, h, pos, p0, cache, window, rope)
                o += act
            o += laurel
            o *= inv2
            y = k.rmsnorm(self.ffn(il, L, k.rmsnorm(o, L.ffn_norm, eps)), L.post_ffw_norm, eps)
            y += o
            xs = self.altup_correct(L, pred, y)
            first = xs[0] * L.correct_scale
            gate = k.gelu(k.matmul(L.inp_gate, first))
            gate *= pl[il]
            extra = k.rmsnorm(k.matmul(L.proj, gate), L.post_norm, eps)
            for b in range(1, A):
                xs[b] += extra
        cache.n_past = p0 + n
        mag = np.sqrt(np.sum(np.square(xs[0]), axis=-1, keepdims=True))
        out = xs[0].copy()
        for u in self._rescaled(self.altup_unembd, xs[1:], mag):
            out += u
        out *= np.float32(1.0 / A)
        return self._head(out, all_logits)



def _matrices(t: Tensor) -> list[Tensor]:
    """The [E, E] matrices of a 3-D [A-1, E, E] tensor, each a view on the file."""
    return [Tensor(f"{t.name}[{i}]", t.type, t.shape[1:], t.data[i]) for i in range(t.shape[0])]


def _layout(r, d: dict) -> None:
    g3n = gemma3n_keys(r, d["n_layer"])
    d.update(sliding_window=g3n.pop("sliding_window"), swa_layers=g3n.pop("swa_layers"),
             rope_freq_base_swa=g3n.pop("base_swa"), attn_scale=1.0)  # the per-head Q norm scales the scores
    d.update(g3n)


SPEC = ArchSpec("gemma3n", model=Gemma3nModel, expected=expected_tensors, rope_neox=True, sqrt_embd_scale=True,
                ffn_variant="geglu", topk_ffn=True, layout=_layout)
