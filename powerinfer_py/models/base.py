"""Pieces every architecture shares: tensor lookup with clear errors, the expected-tensor table of a
llama-shaped transformer, and a Model base class (cache, input checks, K/V store, output head) whose forward
is the pre-norm decoder block of llama, bamboo, qwen2, qwen3, phi3, gemma, gemma2 and gemma3.

Each family's module states its math and holds only what differs from that block: flags (QKV_BIASES,
QK_NORMS) and small hooks (_embed, layer_attention, _attn_out, _ffn_out); falcon (parallel block) and opt
(learned positions, LayerNorm) write their own forward. Everything that can be resolved once (per-layer
tensors, RoPE parameters, window sizes) is resolved in __init__ into plain lists, so a decode step makes
kernel calls and almost nothing else.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..gguf.types import Tensor
from ..layers.cache import KVCache
from ..layers.ffn import FFN, FFNWeights, SparseSettings, SparsityStats, ffn_variant, resolve_sparse
from ..layers.moe import MoEFFN
from ..layers import wide as _wide
from ..layers.weights import Expected, get_tensor, layer_tensors, norm_weight  # noqa: F401 (the arch modules' imports)



def head_expected(c: ModelConfig, layer_norm: bool = False) -> Expected:
    """The tensors outside the layers: embeddings, the final norm (with its bias for LayerNorm models) and the
    output head (absent: tied to token_embd)."""
    e: Expected = {"token_embd.weight": ((c.n_vocab, c.n_embd), True), "output_norm.weight": ((c.n_embd,), True)}
    if layer_norm:
        e["output_norm.bias"] = ((c.n_embd,), True)
    e["output.weight"] = ((c.n_vocab, c.n_embd), False)
    return e


def llama_like_expected(c: ModelConfig, **moe) -> Expected:
    """Tensors of a pre-norm transformer with a gated FFN (llama, qwen2, qwen3, gemma3 add their extras); moe:
    moe_expected's options for the expert layers."""
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    e = head_expected(c)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_norm.weight"] = ((c.n_embd,), True)
        e[p + "attn_q.weight"] = ((q_dim, c.n_embd), True)
        e[p + "attn_k.weight"] = ((kv_dim, c.n_embd), True)
        e[p + "attn_v.weight"] = ((kv_dim, c.n_embd), True)
        e[p + "attn_output.weight"] = ((c.n_embd, q_dim), True)
        e[p + "ffn_norm.weight"] = ((c.n_embd,), True)
        e.update(ffn_expected(c, il, **moe))
    return e


def ffn_expected(c: ModelConfig, il: int, **moe) -> Expected:
    """Layer il's FFN tensors: the experts (moe_expected with the options moe) on a MoE layer (every layer of a MoE
    model, or those config.moe_layers marks: leading dense layers), else a dense gated FFN."""
    p = f"blk.{il}."
    if c.is_moe_layer(il):
        return moe_expected(c, p, **moe)
    return {p + "ffn_gate.weight": ((c.n_ff, c.n_embd), True), p + "ffn_up.weight": ((c.n_ff, c.n_embd), True),
            p + "ffn_down.weight": ((c.n_embd, c.n_ff), True)}


def moe_expected(c: ModelConfig, p: str, *, shared_gate: bool = True, select_bias: bool | None = None) -> Expected:
    """One layer's mixture-of-experts tensors (prefix p = "blk.N."): the router, the 3-D expert tensors and the
    shared expert (with qwen2moe's gate vector unless shared_gate is False: added ungated); select_bias: the
    expert selection bias exp_probs_b.bias, required (True), optional (False) or not part of the arch (None)."""
    E, F = c.n_expert, c.n_ff_exp
    e: Expected = {p + "ffn_gate_inp.weight": ((E, c.n_embd), True),
                   p + "ffn_gate_exps.weight": ((E, F, c.n_embd), True),
                   p + "ffn_up_exps.weight": ((E, F, c.n_embd), True),
                   p + "ffn_down_exps.weight": ((E, c.n_embd, F), True)}
    if select_bias is not None:
        e[p + "exp_probs_b.bias"] = ((E,), select_bias)
    if c.n_ff_shexp:
        if shared_gate:
            e[p + "ffn_gate_inp_shexp.weight"] = ((c.n_embd,), True)
        e.update({p + "ffn_gate_shexp.weight": ((c.n_ff_shexp, c.n_embd), True),
                  p + "ffn_up_shexp.weight": ((c.n_ff_shexp, c.n_embd), True),
                  p + "ffn_down_shexp.weight": ((c.n_embd, c.n_ff_shexp), True)})
    return e


def sparsify_expected(c: ModelConfig, e: Expected) -> Expected:
    """For PWRI files: ffn_down(.bias) becomes ffn_down_t(.bias) (shape (n_ff, n_embd)), and every layer gets
    its predictor fc1 (R, n_embd) and fc2 (n_ff, R), R the layer's rank read from fc1. Dense files: as is."""
    if not c.is_sparse:
        return e
    for il in range(c.n_layer):
        p = f"blk.{il}."
        _, required = e.pop(p + "ffn_down.weight")
        e[p + "ffn_down_t.weight"] = ((c.n_ff, c.n_embd), required)
        if e.pop(p + "ffn_down.bias", None) is not None:
            e[p + "ffn_down_t.bias"] = ((c.n_embd,), True)
        rank = c.predictor_ranks[il]
        e[p + "fc1.weight"] = ((rank, c.n_embd), True)
        e[p + "fc2.weight"] = ((c.n_ff, rank), True)
    return e


def _stack_step(f) -> tuple[str, object] | None:
    """How one token of FFN f runs inside the one-call decode stack: (kind, its one-call plan) with kind "dense",
    "sparse" (predictor / exact) or "threshold"; None when it needs the Python path (another FFN class, an
    observer, a device split, a threshold layer without a cut-off, or no one-call step)."""
    if type(f) is not FFN or f.observer is not None or f.split is not None:
        return None
    if f.mode in ("predictor", "exact"):
        return ("sparse", f.fused) if f.fused is not None else None
    tp = f.threshold_path
    if tp is not None:
        return ("threshold", tp.fused) if tp.cut > 0 and tp.fused is not None else None
    return ("dense", f.fused_dense) if f.fused_dense is not None else None


class Model:
    """Base class: holds config, kernels, the sparse settings, the global tensors and, per layer, `layers`
    (LAYER_TENSORS as attributes, OPTIONAL_TENSORS may be absent) and `ffns` (ffn.FFN, with biases when
    FFN_BIASES); subclasses name their tensors and set the flags and hooks of the pre-norm forward() (or
    write their own). `sparsity` (ffn.SparsityStats, None for FFNs that count nothing) counts active neurons
    per layer."""

    LAYER_TENSORS: Mapping[str, str] = {}
    OPTIONAL_TENSORS: tuple[str, ...] = ()
    FFN_BIASES = False
    LAYER_NORM = False  # the final norm is a LayerNorm with output_norm.bias (falcon, opt), not an RMSNorm
    QKV_BIASES = False  # the layers' bq, bk, bv are added to the Q, K, V projections (qwen2, opt)
    QK_NORMS = False  # each head of Q and K goes through an RMSNorm by q_norm, k_norm before RoPE (qwen3, gemma3)

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                 sparse: SparseSettings | None = None):
        self.config = config
        self.kernels = kernels
        self.sparse = sparse if sparse is not None else resolve_sparse(config)
        self.sparsity: SparsityStats | None = None
        self.token_embd = get_tensor(tensors, "token_embd.weight")
        self.output_norm = norm_weight(get_tensor(tensors, "output_norm.weight"))
        self.output_norm_b = norm_weight(get_tensor(tensors, "output_norm.bias")) if self.LAYER_NORM else None
        output = get_tensor(tensors, "output.weight", required=False)
        self.output = output if output is not None else self.token_embd  # tied head
        self.n_vocab = self.output.shape[0]
        # a wide-calibrated file (layers/wide.py) holds the projections transposed instead of attn_q/k/v/output
        wide_file = _wide.is_wide_file(config)
        replaced = tuple(a for a, suffix in self.LAYER_TENSORS.items()
                         if suffix.split(".")[0] in _wide.REPLACED) if wide_file else ()
        self.layers = [layer_tensors(tensors, il, self.LAYER_TENSORS, optional=self.OPTIONAL_TENSORS + replaced)
                       for il in range(config.n_layer)]
        self.wide: list | None = None  # per layer a wide.WideLayer in the model-wide mode (and `off` on its files)
        if wide_file:
            _wide.attach_from_file(self, Model, ffn_variant(config), tensors, self.sparse)
        else:
            self.ffns = self.build_ffns(tensors, biases=self.FFN_BIASES)
        # RoPE beyond base and linear scale (llama, qwen2, qwen3 pass them on): per-pair divisors of the
        # frequencies (YaRN from the metadata; llama multiplies in its rope_freqs.weight) and a scale of the
        # rotated dims (YaRN)
        self.rope_freqs = np.array(config.rope_factors, dtype=np.float32) if config.rope_factors else None
        self.rope_mscale = config.rope_mscale

    def build_ffns(self, tensors: Mapping[str, Tensor], biases: bool = False) -> list[FFN]:
        """Every layer's FFN (ffn.py) in this model's sparse mode; sets self.sparsity for ReLU-family FFNs."""
        c = self.config
        variant = ffn_variant(c)
        if variant in ("reglu", "fatreglu", "dreglu", "relu", "relu2") or self.sparse.mode in ("threshold", "predictor"):
            self.sparsity = SparsityStats(c.n_layer, c.n_ff, self.sparse.mode, self.sparse.threshold)
        down = "ffn_down_t" if c.is_sparse else "ffn_down"
        ffns = []
        for il in range(c.n_layer):
            if c.is_moe_layer(il):  # every layer of a MoE model, or those config.moe_layers marks
                ffns.append(self.build_moe(tensors, il))
                continue
            p = f"blk.{il}."
            gated = variant not in ("relu", "gelu", "relu2")
            w = FFNWeights(
                up=get_tensor(tensors, p + "ffn_up.weight"),
                gate=get_tensor(tensors, p + "ffn_gate.weight") if gated else None,
                b_up=norm_weight(get_tensor(tensors, p + "ffn_up.bias")) if biases else None,
                b_down=norm_weight(get_tensor(tensors, f"{p}{down}.bias")) if biases else None,
                fc1=get_tensor(tensors, p + "fc1.weight") if c.is_sparse else None,
                fc2=get_tensor(tensors, p + "fc2.weight") if c.is_sparse else None)
            if c.is_sparse:
                w.down_t = get_tensor(tensors, p + "ffn_down_t.weight")
            else:
                w.down = get_tensor(tensors, p + "ffn_down.weight")
            ffns.append(FFN(self.kernels, w, variant, self.sparse, layer=il, act_param=c.hidden_act_param,
                            stats=self.sparsity))
        return ffns

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        """Layer il's mixture-of-experts FFN (moe.py), with a shared expert (qwen2moe, some granitemoe files) as a
        dense SwiGLU FFN, added through its sigmoid gate where the file has one."""
        c, p = self.config, f"blk.{il}."
        shared = shared_gate = None
        if c.n_ff_shexp:
            w = FFNWeights(up=get_tensor(tensors, p + "ffn_up_shexp.weight"),
                           gate=get_tensor(tensors, p + "ffn_gate_shexp.weight"),
                           down=get_tensor(tensors, p + "ffn_down_shexp.weight"))
            shared = FFN(self.kernels, w, "swiglu", self.sparse, layer=il)
            # qwen2moe gates it (a required tensor there, moe_expected); granitemoe's has no gate
            shared_gate = norm_weight(get_tensor(tensors, p + "ffn_gate_inp_shexp.weight", required=False))
        return MoEFFN(self.kernels, get_tensor(tensors, p + "ffn_gate_inp.weight"),
                      get_tensor(tensors, p + "ffn_gate_exps.weight"), get_tensor(tensors, p + "ffn_up_exps.weight"),
                      get_tensor(tensors, p + "ffn_down_exps.weight"), c.n_expert_used, c.expert_weights_norm,
                      layer=il, shared=shared, shared_gate=shared_gate)

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        c = self.config
        return KVCache(c.n_layer, c.n_head_kv, n_ctx or c.n_ctx_train, c.head_dim)

    def _begin(self, tokens, cache: KVCache) -> tuple[np.ndarray, np.ndarray, int]:
        """(tokens int32 [N], positions int32 [N], first position) after checking ids and room."""
        ids = np.asarray(tokens, dtype=np.int32).reshape(-1)
        n = ids.shape[0]
        if n == 0:
            raise ValueError("forward() needs at least one token")
        if int(ids.min()) < 0 or int(ids.max()) >= self.n_vocab:
            bad = int(ids[(ids < 0) | (ids >= self.n_vocab)][0])
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})")
        cache.check_room(n)
        p0 = cache.n_past
        return ids, np.arange(p0, p0 + n, dtype=np.int32), p0

    def _store_kv(self, cache: KVCache, il: int, p0: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write k, v f32 [N, Hkv, D] into the f16 cache planes [Hkv, p0:p0+N, D]."""
        self.kernels.store_kv(cache.k[il], p0, k)
        self.kernels.store_kv(cache.v[il], p0, v)

    def _head(self, x: np.ndarray, all_logits: bool) -> np.ndarray:
        """Final norm and output projection: x f32 [N, n_embd] -> logits f32 [n_vocab] (last token) or
        [N, n_vocab]. Only the rows asked for go through the (large) output matmul. Models with a final
        soft-cap (gemma2) squash the logits to cap * tanh(logit / cap), in f32 as llama.cpp does."""
        if all_logits:
            logits = self.kernels.matmul(self.output, self._final_norm(x))
        else:
            logits = self.kernels.matmul(self.output, self._final_norm(x[-1:])[0])
        cap = self.config.final_softcap
        if cap:
            np.tanh(logits * np.float32(1.0 / cap), out=logits)
            logits *= np.float32(cap)
        return logits

    def _final_norm(self, x: np.ndarray) -> np.ndarray:
        """output_norm applied to x f32 [N, n_embd]: RMSNorm, or LayerNorm with output_norm_b (LAYER_NORM)."""
        if self.LAYER_NORM:
            return self.kernels.layernorm(x, self.output_norm, self.output_norm_b, self.config.norm_eps)
        return self.kernels.rmsnorm(x, self.output_norm, self.config.norm_eps)

    # ---- the pre-norm decoder block ---------------------------------------------------------------------------
    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Logits of tokens (the last, or all rows with all_logits) after appending their K/V to cache. Per layer:
            n = rmsnorm(x) * attn_norm;   q, k, v = _qkv(n)          (projections, biases, per-head norms)
            x = x + _attn_out(Wo · attention(rope(q), rope(k), v))   (the layer's RoPE and window)
            x = x + _ffn_out(ffn(rmsnorm(x) * ffn_norm, x))          (the predictor reads the residual x)
        This loop is tier 1, the spec; one token on kernels with steps takes tier 2 or 3 (kernel tiers, below)."""
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps = ids.shape[0], c.norm_eps

        x = self._embed(ids, pos)  # [N, n_embd]
        temp = self.q_temperature(pos)
        plans = self.attn_plans() if n == 1 and temp is None else None  # None: tier 1
        if plans is not None:  # tier 2 or 3
            return self._fused_decode(plans, x, p0, cache, all_logits)
        last = self._trimmed_layer(n, all_logits)
        for il, (L, (window, rope)) in enumerate(zip(self.layers, self.layer_attention())):
            q, kk, v = self._qkv(L, k.rmsnorm(x, L.attn_norm, eps), n)
            k.rope(q, pos, *rope)
            k.rope(kk, pos, *rope)
            if temp is not None:
                q *= temp[:, None, None]
            self._store_kv(cache, il, p0, kk, v)
            q, x, qp = self._past_kv(il, last, q, x, p0)
            a = k.attention(q, cache.k[il], cache.v[il], qp, window, c.attn_scale, c.attn_softcap)  # [N, H, hd]
            a = a.reshape(x.shape[0], c.n_head * c.head_dim)
            x += self._attn_out(il, L.wide.o(a) if self.wide is not None else k.matmul(L.wo, a))
            x += self._ffn_out(il, self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x))

        cache.n_past = p0 + n
        return self._head(x, all_logits)

    def _trimmed_layer(self, n: int, all_logits: bool) -> int:
        """The layer whose rest (past its K/V store) a forward() of n tokens runs for the last row alone: the last
        one where _last_row_only allows it, else -1 (none)."""
        return len(self.layers) - 1 if n > 1 and not all_logits and self._last_row_only() else -1

    @staticmethod
    def _past_kv(il: int, trimmed: int, q: np.ndarray, x: np.ndarray, p0: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(q, x, position of q's first row) for layer il after its K/V store: the last row of each, at its own
        position, in the trimmed layer (_trimmed_layer), else q, x and p0 as they are."""
        if il != trimmed:
            return q, x, p0
        return np.ascontiguousarray(q[-1:]), x[-1:].copy(), p0 + x.shape[0] - 1

    def _last_row_only(self) -> bool:
        """Whether forward() without all_logits may run the last layer past its K/V for the last token's row
        alone, as llama.cpp's graph does: only that row reaches the logits, and the kernels give a row the same
        bits alone or in a batch (attention, norms, RoPE, and the mat-muls by the one-chain-per-lane rule), so
        the logits stay bit for bit those of the whole batch while an 8-layer model skips about an eighth of its
        prompt work. Not while anything counts or watches every layer's rows: the sparsity statistics of the
        sparse modes and ReLU-family models (their per-layer token counts), and the observers of calibration and
        profiling (tools/calibrate.py, observe.py, wide_calibrate.py, hybrid/activations.py)."""
        if self.sparsity is not None:
            return False
        return not any(getattr(f, "observer", None) is not None for f in self.ffns) and \
            not any(getattr(w, "observer", None) is not None for w in (self.wide or ()))

    def _embed(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The input rows f32 [N, n_embd] of token ids at positions pos (gemma3 scales them)."""
        return self.kernels.get_rows(self.token_embd, ids)

    def q_temperature(self, pos: np.ndarray) -> np.ndarray | None:
        """Per-token factors f32 [N] that scale q after RoPE (mistral3's attention temperature), or None for
        none (the one-call decode step has no such factor: tokens that need one take the Python path)."""
        return None

    def layer_attention(self) -> list[tuple[int, tuple]]:
        """Per layer (attention window, 0 for all positions; the arguments of kernels.rope after the positions)."""
        return [(0, self.rope_args())] * len(self.layers)

    def _qkv(self, L, h: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q f32 [N, n_head, head_dim] and k, v [N, n_head_kv, head_dim] of layer L's normed input h, before
        RoPE: the projections, plus the biases (QKV_BIASES), then the per-head norms of q and k (QK_NORMS)."""
        c, k = self.config, self.kernels
        if self.wide is not None:  # the model-wide sparse mode: one AXPY over the kept rows of q|k|v transposed
            q, kk, v = L.wide.qkv(h)
        else:
            q, kk, v = k.matmul(L.wq, h), k.matmul(L.wk, h), k.matmul(L.wv, h)
        if self.QKV_BIASES:  # broadcast over the N rows (matmul returns fresh arrays, so += is safe)
            q += L.bq
            kk += L.bk
            v += L.bv
        q = q.reshape(n, c.n_head, c.head_dim)
        kk = kk.reshape(n, c.n_head_kv, c.head_dim)
        v = v.reshape(n, c.n_head_kv, c.head_dim)
        if self.QK_NORMS:
            q = k.rmsnorm(q, L.q_norm, c.norm_eps)
            kk = k.rmsnorm(kk, L.k_norm, c.norm_eps)
        return q, kk, v

    def _attn_out(self, il: int, y: np.ndarray) -> np.ndarray:
        """What the attention adds to the residual: its output projection (gemma3 norms it first)."""
        return y

    # ---- kernel tiers: the three ways one layer runs ------------------------------------------------------------
    # tier 1, ops: forward's loop of per-op kernel calls (kernels.Ops), the specification. Every batch (prefill)
    #   takes it, and every token on kernels without steps (kernels.steps is None: the numpy reference).
    # tier 2, one C call per block: one token, kernels.steps present, fused_attention on: attn_plans() describes
    #   each attention block once and _fused_decode calls steps.attn_block_decode per layer; each FFN takes its
    #   own step where it made one at load (layers/ffn.py fused_dense / fused, layers/threshold.py fused: the
    #   variant, mode and biases decide), else its Python path.
    # tier 3, one C call for the whole stack: tier 2 where every FFN has a step and _ffn_out is at most a norm
    #   (_decode_stack; steps.decode_stack).
    # The choice is made per token here: forward -> attn_plans (tier 1 or not) -> _fused_decode -> _decode_stack
    # (tier 3 or 2). Tiers 2 and 3 give tier 1's bits (tests/test_attn_block.py, test_sparse_ffn_fused.py,
    # test_decode_stack.py, model_checks.assert_fused_decode_equals_python).
    fused_attention = True  # False: tier 1 always (the tiers give the same bits; tests compare them)

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        """attn_block_plan's RoPE/norm/window arguments for layer il (architectures add their extras)."""
        c = self.config
        kw = dict(rope_base=c.rope_freq_base, rope_scale=c.rope_freq_scale, rope_freqs=self.rope_freqs,
                  rope_mscale=self.rope_mscale)
        if self.QKV_BIASES:
            kw.update(bq=layer.bq, bk=layer.bk, bv=layer.bv)
        if self.QK_NORMS:
            kw.update(q_norm=layer.q_norm, k_norm=layer.k_norm)
        return kw

    def rope_args(self) -> tuple:
        """The arguments of kernels.rope after the positions, for the models that use one RoPE for all layers."""
        c = self.config
        return (c.n_rot, c.rope_freq_base, c.rope_freq_scale, c.rope_neox, self.rope_freqs, self.rope_mscale)

    def _fused_decode(self, plans: list, x: np.ndarray, p0: int, cache: KVCache, all_logits: bool) -> np.ndarray:
        """One token through every layer of a pre-norm block (attention, then FFN; llama, bamboo, qwen2, qwen3,
        gemma3): x f32 [1, n_embd] the embedded token at position p0. The attention block is one C call, which
        also returns the FFN's normed input."""
        steps = self.kernels.steps
        stack = self._decode_stack(plans)
        if stack is not None:  # tier 3: the same calls as below in one C call (step_stack.c)
            steps.decode_stack(stack, x[0], p0, cache.k, cache.v)
            for il in stack.counted_layers:  # what FFN._one_token records
                f = self.ffns[il]
                if f.stats is not None:
                    tp = f.threshold_path
                    n_up = int(tp.fused.up_read[0]) if tp is not None and tp.up_cut is not None else None
                    f.stats.record(il, 1, int(stack.n_active[il]), int(stack.n_nonzero[il]), n_up)
        else:  # tier 2
            for il, plan in enumerate(plans):
                m = steps.attn_block_decode(plan, x[0], p0, cache.k[il], cache.v[il])
                x += self._ffn_out(il, self.ffns[il](m[None, :], x))
        cache.n_past = p0 + 1
        return self._head(x, all_logits)

    FFN_OUT_NORM: str | None = None  # the layer weight of an rmsnorm on the FFN's output (gemma2/3, olmo2)

    def _ffn_out(self, il: int, y: np.ndarray) -> np.ndarray:
        """What the FFN adds to the residual: its output, or rmsnorm(output) * the FFN_OUT_NORM weight."""
        if self.FFN_OUT_NORM is None:
            return y
        return self.kernels.rmsnorm(y, getattr(self.layers[il], self.FFN_OUT_NORM), self.config.norm_eps)

    def post_ffn_norms(self) -> list | None:
        """Per layer what _ffn_out applies to the FFN's output, for the one-call decode stack: the FFN_OUT_NORM
        weight, or None entries for none; None when a subclass's _ffn_out does something else (no stack then)."""
        if type(self)._ffn_out is not Model._ffn_out:
            return None
        return [None if self.FFN_OUT_NORM is None else getattr(L, self.FFN_OUT_NORM) for L in self.layers]

    def _decode_stack(self, plans: list):
        """Tier 3's plan (kernels.cpu_steps.DecodeStackPlan) for _fused_decode when every layer is an attention
        block followed by an FFN whose one token is one C call (dense SwiGLU/GeGLU, predictor / exact mode,
        threshold mode with a cut-off) with no observer or device split, and _ffn_out is at most a norm; else None
        (tier 2). The plan is made once per attention plan list; each token checks the FFNs' current state."""
        steps = [_stack_step(f) for f in self.ffns]
        if None in steps:
            return None  # other FFN classes (MoE, xIELU, ...) and the FFN's Python paths
        kinds = [kind for kind, _ in steps]
        made = self.__dict__.setdefault("_stack_plans", {})  # per attention plan list (phi3 has one per context)
        entry = made.get(id(plans))
        if entry is None or entry[0] is not plans or entry[1] is not None and entry[1].kinds != kinds:
            if len(made) >= 8:  # attn_plans returns cached lists; a model making new ones would not grow this
                made.clear()
            norms = self.post_ffn_norms()
            ks = self.kernels.steps
            ok = norms is not None and ks is not None and all(p is not None for p in plans)
            entry = made[id(plans)] = (plans, ks.decode_stack_plan(
                plans, [plan for _, plan in steps], norms, self.config.norm_eps, kinds) if ok else None)
        return entry[1]

    def attn_plans(self) -> list | None:
        """Per-layer descriptions of the attention blocks for the one-call decode step (tier 2), made on first
        use; None (tier 1) when the kernels have no steps (kernels.steps is None) or fused_attention is switched
        off. Only the forward passes that call it (llama, bamboo, qwen2, qwen3, gemma3) use it."""
        steps = self.kernels.steps
        if not self.fused_attention or steps is None or self.wide is not None:  # (wide mode: tier 1 only)
            return None
        plans = self.__dict__.get("_attn_plans")
        if plans is None:
            c = self.config
            shape = dict(n_head=c.n_head, n_head_kv=c.n_head_kv, head_dim=c.head_dim, n_rot=c.n_rot,
                         rope_neox=c.rope_neox, eps=c.norm_eps, attn_scale=c.attn_scale, attn_softcap=c.attn_softcap)
            # attn_plan_kwargs may override any of these per layer (smollm3: n_rot 0 on its RoPE-less layers)
            plans = self._attn_plans = [
                steps.attn_block_plan(L.wq, L.wk, L.wv, L.wo, L.attn_norm, L.ffn_norm,
                                      **{**shape, **self.attn_plan_kwargs(il, L)})
                if self.has_attention(il) else None
                for il, L in enumerate(self.layers)]
        return plans

    def has_attention(self, il: int) -> bool:
        """Whether layer il is an attention layer (lfm2's convolution layers are not: their plan is None)."""
        return True
