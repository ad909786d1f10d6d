"""Qwen3.5 (GGUF arch "qwen35"; "qwen35moe" with experts): gated delta-net layers mixed with gated attention.

  x = token_embd[ids]
  per layer (config.delta_layers says which kind; llama.cpp: every full_attention_interval-th layer attends):
    n = rmsnorm(x) * attn_norm
    gated delta net (Hk key heads and Hv = r * Hk value heads, all of width d = ssm.state_size):
        c_t = W_qkv · n_t                                        (attn_qkv: rows q | k | v, Hk*d + Hk*d + Hv*d)
        y_t = silu(sum_{j=0..K-1} w[:, j] * c_{t-K+1+j})         (ssm_conv1d [conv_dim, K], w[:, K-1] on the
                                                                   current token; c before position 0 is zero)
        q, k = l2norm per head of y's q and k parts (x / max(|x|, eps)), q scaled by 1/sqrt(d);  v = y's v part
        value head h reads key head h mod Hk                     (llama.cpp's tiling of q/k over the v heads)
        beta_t = sigmoid(W_beta · n_t)                           (ssm_beta, one per value head)
        g_t = ssm_a * softplus(W_alpha · n_t + ssm_dt.bias)      (ssm_a = -exp(A_log) in the file; g < 0)
        per value head, S a [d_v, d_k] matrix (zero at position 0), decay first, then the delta-rule write:
            S = exp(g_t) S;   S = S + beta_t (v_t - S k_t) k_t^T;   o_t = S q_t
        x = x + W_out · (rmsnorm_per_head(o) * ssm_norm * silu(W_gate · n))      (attn_gate = z, ssm_out)
    gated attention (W_q's rows per head: [query (hd) | gate (hd)]):
        q, k = rmsnorm per head (attn_q_norm, attn_k_norm) of the query part of W_q·n and of W_k·n;  v = W_v·n
        x = x + Wo · (sigmoid(gate) * attention(rope(q), rope(k), v))      (scale 1/sqrt(hd))
        rope: llama.cpp's interleaved M-RoPE; for text every section sits at the token's position, so pair i of
        the first n_rot dims turns by pos * base^(-2i/n_rot), NeoX pairing (i, i + n_rot/2): plain NeoX RoPE
    m = rmsnorm(x) * post_attention_norm
    x = x + Wdown · (silu(Wgate·m) * (Wup·m))        (qwen35moe: softmax-routed experts, weights renormalized, plus
                                                       a shared expert scaled by sigmoid(ffn_gate_inp_shexp · m))
  logits = output · (rmsnorm(x) * output_norm)      (output tied to token_embd when absent)
  All RMS norms use the file's layer_norm_rms_epsilon; so does the l2norm.

The recurrent state of a delta-net layer (the last K-1 conv inputs and S) lives in delta_cache.DeltaKVCache, so
a forward that starts at n_past continues both exactly. The recurrence runs in numpy: one token as written, a
prompt in chunks of CHUNK tokens in closed form (_chunk); the projections, all tokens at once, go through
kernels.matmul, so quantized files work. A decode token on the C kernels skips the numpy steps: conv, norms,
gates, recurrence and gated norm are one call (kernels.steps.delta_net_decode, csrc/step_delta_net.c) that updates the
cache's states in place; the numpy path stays the specification (tests/test_kernels_delta.py).

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  qwen35, qwen35moe  (Qwen3.5) a hybrid: layer il is a gated delta net unless (il + 1) % full_attention_interval
          == 0 (default 4, as llama.cpp), then gated full attention. ssm.conv_kernel (>= 2), ssm.state_size (the
          key and value head width), ssm.group_count (key heads), ssm.time_step_rank (value heads, a multiple of the
          key heads) and ssm.inner_size (= state_size x time_step_rank) are required. rope.dimension_sections (M-RoPE)
          must sum to at most rope.dimension_count / 2: with text positions (every section at the token's position)
          llama.cpp's interleaved M-RoPE is NeoX RoPE over the first dimension_count dims. qwen35moe: experts with
          softmax scores and renormalized weights plus a sigmoid-gated shared expert in every layer.
          attention.recurrent_layers (one flag per block, or one for all; newer converters) overrides the interval
          when present; nextn_predict_layers trailing multi-token-prediction blocks are in the file and in
          block_count but not run (as glm4moe's).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..layers.cache import DeltaKVCache
from ..errors import ModelFileError, UnsupportedError
from ..gguf.types import Tensor
from ..layers.ffn import SparseSettings
from ..kernels.ref import dequantize
from .base import Expected, Model, ffn_expected, get_tensor, head_expected, layer_tensors, norm_weight
from .spec import ArchSpec

SHARED = {"attn_norm": "attn_norm.weight", "ffn_norm": "post_attention_norm.weight"}
DELTA = {"wqkv": "attn_qkv.weight", "wg": "attn_gate.weight", "w_beta": "ssm_beta.weight",
         "w_alpha": "ssm_alpha.weight", "dt_bias": "ssm_dt.bias", "ssm_norm": "ssm_norm.weight", "w_out": "ssm_out.weight"}
ATTENTION = {"wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
             "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight"}


def delta_dims(c: ModelConfig) -> tuple[int, int, int, int]:
    """(d, Hk, Hv, conv_dim): head width, key heads, value heads, and the conv's channel count 2 Hk d + Hv d."""
    d, hk, hv = c.ssm_d_state, c.ssm_n_k_heads, c.ssm_n_v_heads
    return d, hk, hv, 2 * hk * d + hv * d


def expected_tensors(c: ModelConfig) -> Expected:
    E, hd = c.n_embd, c.head_dim
    d, _, hv, conv_dim = delta_dims(c)
    e = head_expected(c)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_norm.weight"] = ((E,), True)
        e[p + "post_attention_norm.weight"] = ((E,), True)
        if c.delta_layers[il]:
            e.update({p + "attn_qkv.weight": ((conv_dim, E), True), p + "attn_gate.weight": ((hv * d, E), True),
                      p + "ssm_conv1d.weight": ((conv_dim, c.conv_kernel), True), p + "ssm_dt.bias": ((hv,), True),
                      p + "ssm_a": ((hv,), True), p + "ssm_beta.weight": ((hv, E), True),
                      p + "ssm_alpha.weight": ((hv, E), True), p + "ssm_norm.weight": ((d,), True),
                      p + "ssm_out.weight": ((E, hv * d), True)})
        else:
            e.update({p + "attn_q.weight": ((2 * c.n_head * hd, E), True),
                      p + "attn_k.weight": ((c.n_head_kv * hd, E), True),
                      p + "attn_v.weight": ((c.n_head_kv * hd, E), True),
                      p + "attn_output.weight": ((E, c.n_head * hd), True),
                      p + "attn_q_norm.weight": ((hd,), True), p + "attn_k_norm.weight": ((hd,), True)})
        e.update(ffn_expected(c, il))
    return e


def l2norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / max(|x|, eps) over the last dim (ggml_l2_norm)."""
    n = np.sqrt(np.einsum("...i,...i->...", x, x, dtype=np.float32))[..., None]
    return x / np.maximum(n, np.float32(eps))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0), x).astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


CHUNK = 64  # tokens per closed-form chunk of the delta rule (prefill)


def _chunk(S: np.ndarray, q, k, v, beta, g) -> np.ndarray:
    """The delta rule over one chunk of C tokens in closed form; S [H, d_v, d_k] updated in place, q, k, v
    [C, H, d], beta, g [C, H]; returns o [C, H, d_v].

    With G_t = g_1 + ... + g_t (so exp(G_t) is the decay since the chunk began) and S0 the state before it, every
    S_t is exp(G_t) S0 + sum_{s<=t} exp(G_t - G_s) u_s k_s^T, where u_s is what token s writes. The write of
    token t, u_t = beta_t (v_t - S'_t k_t) with S'_t the decayed state before it, is then a lower-triangular
    system:  u_t + beta_t sum_{s<t} exp(G_t - G_s) (k_t . k_s) u_s = beta_t (v_t - exp(G_t) S0 k_t), and
        o_t = exp(G_t) S0 q_t + sum_{s<=t} exp(G_t - G_s) (q_t . k_s) u_s
        S_C = exp(G_C) S0 + sum_s exp(G_C - G_s) u_s k_s^T.
    Only differences G_t - G_s with s <= t are exponentiated (all <= 0), so nothing overflows."""
    q, k, v = (np.ascontiguousarray(x.transpose(1, 0, 2)) for x in (q, k, v))  # [H, C, d]
    G = np.cumsum(g.T, axis=1, dtype=np.float32)  # [H, C]
    C = G.shape[1]
    diff = G[:, :, None] - G[:, None, :]  # [H, t, s]
    lower = np.tril(np.ones((C, C), dtype=bool))
    decay = np.where(lower, np.exp(np.where(lower, diff, 0)), 0).astype(np.float32)  # exp(G_t - G_s), s <= t
    bt = beta.T[:, :, None]  # [H, C, 1]
    eG = np.exp(G)[:, :, None]
    St = S.transpose(0, 2, 1)  # [H, d_k, d_v]: x @ St = (S x^T)^T
    rhs = bt * (v - eG * (k @ St))
    A = bt * (decay * (k @ k.transpose(0, 2, 1)))
    A[:, np.arange(C), np.arange(C)] = 1.0  # I + strictly-lower part (the diagonal of decay * k.k is replaced)
    u = np.linalg.solve(A, rhs).astype(np.float32)  # [H, C, d_v]
    o = eG * (q @ St) + (decay * (q @ k.transpose(0, 2, 1))) @ u
    last = np.exp(G[:, -1:] - G)[:, :, None]  # [H, C, 1]: exp(G_C - G_s)
    S *= np.exp(G[:, -1])[:, None, None]
    S += (u * last).transpose(0, 2, 1) @ k
    return o.transpose(1, 0, 2)


# the numpy steps of a delta-net layer that the one-token C step (kernels.steps.delta_net_decode) also implements
_STEP_METHODS = ("_conv", "_delta_qkv", "_key_heads", "_recur")


class Qwen35Model(Model):
    """The qwen35 block (module docstring). Per layer, `layers[il]` holds the shared norms plus either the
    delta-net tensors (conv_w f32 [conv_dim, K], ssm_a f32 [Hv] besides DELTA) or the attention tensors."""

    LAYER_TENSORS = SHARED
    QK_NORMS = True

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                 sparse: SparseSettings | None = None):
        super().__init__(config, tensors, kernels, sparse)
        _, _, _, conv_dim = delta_dims(config)
        for il, L in enumerate(self.layers):
            if config.delta_layers[il]:
                vars(L).update(vars(layer_tensors(tensors, il, DELTA)))
                w = get_tensor(tensors, f"blk.{il}.ssm_conv1d.weight")
                L.conv_w = np.ascontiguousarray(dequantize(w).reshape(conv_dim, config.conv_kernel))
                L.ssm_a = norm_weight(get_tensor(tensors, f"blk.{il}.ssm_a"))
            else:
                vars(L).update(vars(layer_tensors(tensors, il, ATTENTION)))

    def new_cache(self, n_ctx: int | None = None) -> DeltaKVCache:
        c = self.config
        d, _, hv, conv_dim = delta_dims(c)
        return DeltaKVCache(c.delta_layers, c.n_head_kv, n_ctx or c.n_ctx_train, c.head_dim, conv_dim,
                            c.conv_kernel, hv, d)

    def has_attention(self, il: int) -> bool:
        return not self.config.delta_layers[il]

    def attn_plans(self) -> None:
        """No one-call attention step: the gated attention layers run the Python path."""
        return None

    def forward(self, tokens, cache: DeltaKVCache, all_logits: bool = False) -> np.ndarray:
        """Logits of tokens (the last, or all rows with all_logits), continuing the cache's K/V and delta states."""
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        eps = c.norm_eps
        x = self._embed(ids, pos)  # [N, n_embd]
        cache.begin(p0)
        for il, L in enumerate(self.layers):
            h = k.rmsnorm(x, L.attn_norm, eps)
            if c.delta_layers[il]:
                x += self._delta_net(il, L, h, cache, p0)
            else:
                x += self._gated_attention(il, L, h, cache, p0, pos)
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x)
        cache.end(p0 + ids.shape[0])
        return self._head(x, all_logits)

    def _gated_attention(self, il: int, L, h: np.ndarray, cache: DeltaKVCache, p0: int, pos: np.ndarray) -> np.ndarray:
        c, k = self.config, self.kernels
        n, H, hd = h.shape[0], c.n_head, c.head_dim
        qg = k.matmul(L.wq, h).reshape(n, H, 2 * hd)
        q = k.rmsnorm(np.ascontiguousarray(qg[:, :, :hd]), L.q_norm, c.norm_eps)
        gate = qg[:, :, hd:]
        kk = k.rmsnorm(k.matmul(L.wk, h).reshape(n, c.n_head_kv, hd), L.k_norm, c.norm_eps)
        v = k.matmul(L.wv, h).reshape(n, c.n_head_kv, hd)
        rope = self.rope_args()
        k.rope(q, pos, *rope)
        k.rope(kk, pos, *rope)
        self._store_kv(cache, il, p0, kk, v)
        a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)  # [N, H, hd]
        return k.matmul(L.wo, self._output_gate(a, gate).reshape(n, H * hd))

    def _output_gate(self, a: np.ndarray, gate: np.ndarray) -> np.ndarray:
        """The attention output a [N, H, hd] times sigmoid of its gate (the second half of each head's q rows)."""
        a *= sigmoid(gate)
        return a

    def _key_heads(self, x: np.ndarray) -> np.ndarray:
        """q or k [N, Hk, d] spread over the Hv value heads: value head h reads key head h mod Hk."""
        reps = self.config.ssm_n_v_heads // self.config.ssm_n_k_heads
        return np.tile(x, (1, reps, 1)) if reps > 1 else x

    def _conv(self, il: int, L, c_in: np.ndarray, cache: DeltaKVCache, p0: int) -> np.ndarray:
        """silu of the causal depthwise conv of the projections c_in f32 [N, conv_dim]; updates the conv state."""
        K, n = self.config.conv_kernel, c_in.shape[0]
        s = np.concatenate([cache.conv_state(il, p0), c_in])  # [K-1+N, conv_dim]: the state, then the new inputs
        y = s[0:n] * L.conv_w[:, 0]
        for j in range(1, K):
            y += s[j:j + n] * L.conv_w[:, j]
        cache.set_conv_state(il, s[n:])
        return self.kernels.silu(np.ascontiguousarray(y, dtype=np.float32))

    def _delta_qkv(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, k, v f32 [N, Hv, d] of the conv output y [N, conv_dim]: q and k L2-normed per head (q also scaled
        by 1/sqrt(d)) and spread over the value heads."""
        c = self.config
        d, hk, hv, _ = delta_dims(c)
        n = y.shape[0]
        q = l2norm(y[:, :hk * d].reshape(n, hk, d), c.norm_eps) * np.float32(1.0 / np.sqrt(d))
        kk = l2norm(y[:, hk * d:2 * hk * d].reshape(n, hk, d), c.norm_eps)
        return self._key_heads(q), self._key_heads(kk), y[:, 2 * hk * d:].reshape(n, hv, d)

    @staticmethod
    def _recur(S: np.ndarray, q, k, v, beta, g) -> np.ndarray:
        """Run the delta rule over N tokens from state S [Hv, d_v, d_k] (updated in place): q, k, v [N, Hv, d],
        beta and the log-decay g [N, Hv]. Per token the decay first, then the write of the error v - S k;
        returns o [N, Hv, d_v] = S q after each token's write. One token: the recurrence as written; more:
        chunks of CHUNK tokens in closed form (_chunk), the same values up to rounding."""
        n = v.shape[0]
        if n == 1:
            S *= np.exp(g[0])[:, None, None]
            err = v[0] - np.einsum("hvk,hk->hv", S, k[0])
            S += (beta[0, :, None] * err)[:, :, None] * k[0][:, None, :]
            return np.einsum("hvk,hk->hv", S, q[0])[None]
        o = np.empty(v.shape, dtype=np.float32)
        for a in range(0, n, CHUNK):
            b = min(a + CHUNK, n)
            o[a:b] = _chunk(S, q[a:b], k[a:b], v[a:b], beta[a:b], g[a:b])
        return o

    def _delta_plan(self, L):
        """Layer L's one-token C step (tier 2: kernels.steps.delta_net_plan, kernels/delta_step.py; made once), or
        None where the kernels have no steps (ref) or a subclass changes one of the numpy steps it implements
        (_STEP_METHODS)."""
        plan = getattr(L, "delta_plan", False)
        if plan is False:
            plan = None
            steps = self.kernels.steps
            if steps is not None and all(getattr(type(self), m) is getattr(Qwen35Model, m) for m in _STEP_METHODS):
                d, hk, hv, _ = delta_dims(self.config)
                plan = steps.delta_net_plan(d, hk, hv, L.conv_w, L.ssm_a, L.dt_bias, L.ssm_norm, self.config.norm_eps)
            L.delta_plan = plan
        return plan

    def _delta_net(self, il: int, L, h: np.ndarray, cache: DeltaKVCache, p0: int) -> np.ndarray:
        """The gated delta net of layer il on its normed input h f32 [N, n_embd] (module docstring); updates the
        layer's conv and delta states in cache."""
        c, k = self.config, self.kernels
        d, _, hv, _ = delta_dims(c)
        n = h.shape[0]
        plan = self._delta_plan(L) if n == 1 and p0 else None
        if plan is not None:  # one token: the steps below in one C call, the cache's states updated in place
            x = h[0]
            o = k.steps.delta_net_decode(plan, k.matmul(L.wqkv, x), k.matmul(L.wg, x), k.matmul(L.w_beta, x),
                                         k.matmul(L.w_alpha, x), cache.conv[il], cache.delta[il])
            return k.matmul(L.w_out, o)[None]
        q, kk, v = self._delta_qkv(self._conv(il, L, k.matmul(L.wqkv, h), cache, p0))
        beta = sigmoid(k.matmul(L.w_beta, h))  # [N, Hv]
        g = L.ssm_a * softplus(k.matmul(L.w_alpha, h) + L.dt_bias)  # [N, Hv] log-decay, < 0
        S = cache.delta_state(il, p0)  # [Hv, d_v, d_k]
        o = self._recur(S, q, kk, v, beta, g)
        cache.set_delta_state(il, S)
        gated = k.rmsnorm(o, L.ssm_norm, c.norm_eps) * k.silu(k.matmul(L.wg, h).reshape(n, hv, d))
        return k.matmul(L.w_out, gated.reshape(n, hv * d))


def layout(r, d: dict) -> None:
    """The delta-net and attention layers and the delta-net sizes (qwen35, qwen35moe, qwen3next)."""
    d["n_head"] = r.positive("{arch}.attention.head_count")
    out = qwen35_keys(r, d["n_layer"])
    d["n_head_kv"] = out.pop("_n_head_kv")
    d.update(out)


def qwen35_keys(r, n_layer: int) -> dict:
    """qwen35's layer kinds and delta-net sizes (module docstring) for the layout hook."""
    path, key = r.f.path, r.key
    interval = r.get("{arch}.full_attention_interval", 4)
    if interval < 1:
        raise ModelFileError(f"{path}: {key('{arch}.full_attention_interval')} must be at least 1, got {interval}")
    kernel = r.get("{arch}.ssm.conv_kernel")
    if kernel < 2:
        raise ModelFileError(f"{path}: {key('{arch}.ssm.conv_kernel')} must be at least 2, got {kernel}")
    d_state, n_k, n_v = (r.positive(f"{{arch}}.ssm.{k}") for k in ("state_size", "group_count", "time_step_rank"))
    if n_v % n_k:
        raise ModelFileError(f"{path}: ssm.time_step_rank {n_v} (value heads) is not a multiple of ssm.group_count "
                             f"{n_k} (key heads)")
    inner = r.positive("{arch}.ssm.inner_size")
    if inner != d_state * n_v:
        raise UnsupportedError(f"{path}: ssm.inner_size {inner} != ssm.state_size {d_state} x time_step_rank {n_v} "
                               "(value heads as wide as key heads)")
    sections = r.meta.get(key("{arch}.rope.dimension_sections"), [])
    n_rot = r.get("{arch}.rope.dimension_count", 0)
    if not isinstance(sections, list) or sum(int(v) for v in sections) * 2 > n_rot:
        raise ModelFileError(f"{path}: {key('{arch}.rope.dimension_sections')} {sections!r} must be a list whose "
                             f"sum is at most rope.dimension_count / 2 = {n_rot // 2}")
    kv = r.meta.get(key("{arch}.attention.head_count_kv"))
    if isinstance(kv, list):  # a per-layer array: the attention layers' count (0 or the same on the others)
        kv = max(kv) if kv else None
    delta = tuple((il + 1) % interval != 0 for il in range(n_layer))
    flags = r.meta.get(key("{arch}.attention.recurrent_layers"))  # newer converters; llama.cpp reads it first
    if flags is not None:
        n_all = n_layer + r.get("{arch}.nextn_predict_layers", 0)
        flags = flags if isinstance(flags, list) else [flags] * n_all  # one flag for all blocks
        if len(flags) != n_all or not all(isinstance(v, (bool, int)) for v in flags):
            raise ModelFileError(f"{path}: {key('{arch}.attention.recurrent_layers')} must hold one flag per "
                                 f"block ({n_all}), got {flags!r:.80}")
        delta = tuple(bool(v) for v in flags[:n_layer])
        if any(flags[n_layer:]):
            raise ModelFileError(f"{path}: {key('{arch}.attention.recurrent_layers')} marks a multi-token-"
                                 "prediction block as recurrent (they are full-attention blocks)")
    return {"delta_layers": delta, "conv_kernel": kernel,
            "ssm_d_state": d_state, "ssm_n_k_heads": n_k, "ssm_n_v_heads": n_v,
            "_n_head_kv": kv if isinstance(kv, int) and kv > 0 else r.positive("{arch}.attention.head_count")}


SPEC = ArchSpec("qwen35", model=Qwen35Model, expected=expected_tensors, rope_neox=True, nextn=True, layout=layout)
VARIANTS = (replace(SPEC, name="qwen35moe", moe=True, moe_norm=True, shared_expert="required"),)
