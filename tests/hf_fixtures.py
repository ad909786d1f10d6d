"""Synthetic Hugging Face checkpoints for the converter tests: config.json, weights in the real layouts
(single or sharded safetensors with an index, F32/F16/BF16, pytorch_model.bin), a SentencePiece
tokenizer.model, and PowerInfer predictor folders (model_N.pt).

The weights returned to the caller are the values actually stored (BF16/F16-rounded) as float32, so a numpy
reference of the HF model computes exactly what the checkpoint says.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from powerinfer_py.convert.safetensors import write_safetensors
from powerinfer_py.convert.torch_pt import save_pt
from powerinfer_py.synth.common import synthetic_vocab


# ---- SentencePiece model (protobuf) ------------------------------------------------------------------------

def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _field(num: int, wire: int, payload: bytes | int) -> bytes:
    key = _varint(num << 3 | wire)
    if wire == 0:
        return key + _varint(payload)
    if wire == 5:
        return key + payload
    return key + _varint(len(payload)) + payload


def write_tokenizer_model(path: Path, n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece ModelProto with the synthetic vocabulary (BPE model type, unk 0, bos 1, eos 2)."""
    tokens, scores, types = synthetic_vocab(n_vocab)
    body = b"".join(_field(1, 2, _field(1, 2, t.encode()) + _field(2, 5, struct.pack("<f", s)) + _field(3, 0, k))
                    for t, s, k in zip(tokens, scores, types))
    trainer = _field(3, 0, 2) + _field(40, 0, 0) + _field(41, 0, 1) + _field(42, 0, 2) + _field(43, 0, -1)
    normalizer = _field(1, 2, b"identity") + _field(3, 0, 1)
    path.write_bytes(body + _field(2, 2, trainer) + _field(3, 2, normalizer))
    return tokens, scores, types


# ---- weights -----------------------------------------------------------------------------------------------

def bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def stored(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(raw array as stored for dtype, its exact float32 value)."""
    if dtype == "BF16":
        raw = bf16_bits(x)
        return raw, (raw.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        raw = x.astype(np.float16)
        return raw, raw.astype(np.float32)
    raw = x.astype(np.float32)
    return raw, raw


def _embeddings_and_head(rng, n_vocab: int, n_embd: int, tied: bool) -> dict:
    """The HF tensors outside the layers: embeddings, final norm and (unless tied) lm_head."""
    w = {"model.embed_tokens.weight": rng.standard_normal((n_vocab, n_embd)),
         "model.norm.weight": 1 + 0.1 * rng.standard_normal(n_embd)}
    if not tied:
        w["lm_head.weight"] = rng.standard_normal((n_vocab, n_embd)) / np.sqrt(n_embd)
    return w


def llama_weights(rng, *, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, tied=False, qkv_bias=False,
                  head_dim=None, qk_norm=False):
    """HF-named random LLaMA weights (float32), scaled so activations stay O(1). Qwen3: head_dim (default
    n_embd / n_head) and qk_norm (per-head self_attn.q_norm / k_norm weights [head_dim])."""
    hd = head_dim or n_embd // n_head
    w = _embeddings_and_head(rng, n_vocab, n_embd, tied)
    for il in range(n_layer):
        p = f"model.layers.{il}."
        shapes = {"self_attn.q_proj.weight": (n_head * hd, n_embd), "self_attn.k_proj.weight": (n_head_kv * hd, n_embd),
                  "self_attn.v_proj.weight": (n_head_kv * hd, n_embd), "self_attn.o_proj.weight": (n_embd, n_head * hd),
                  "mlp.gate_proj.weight": (n_ff, n_embd), "mlp.up_proj.weight": (n_ff, n_embd),
                  "mlp.down_proj.weight": (n_embd, n_ff)}
        for k, s in shapes.items():
            w[p + k] = rng.standard_normal(s) / np.sqrt(s[1])
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(n_embd)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(n_embd)
        if qkv_bias:
            for k in ("q_proj", "k_proj", "v_proj"):
                w[f"{p}self_attn.{k}.bias"] = 0.1 * rng.standard_normal(w[f"{p}self_attn.{k}.weight"].shape[0])
        if qk_norm:
            w[p + "self_attn.q_norm.weight"] = 1 + 0.2 * rng.standard_normal(hd)
            w[p + "self_attn.k_norm.weight"] = 1 + 0.2 * rng.standard_normal(hd)
    return {k: v.astype(np.float32) for k, v in w.items()}


def write_checkpoint(folder: Path, config: dict, weights: dict[str, np.ndarray], *, dtype: str = "F32",
                     layout: str = "single", n_vocab_tokenizer: int | None = None) -> dict[str, np.ndarray]:
    """Write config.json, the weights (layout: single | sharded | bin | bin-sharded) and tokenizer.model.
    Returns the stored values as float32. 1-D tensors are stored as F32 when dtype is F32, else as dtype."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    raw, exact = {}, {}
    for k, v in weights.items():
        raw[k], exact[k] = stored(v, dtype)
    names = list(raw)
    if layout in ("single", "sharded"):
        if layout == "single":
            write_safetensors(folder / "model.safetensors", {k: (dtype, raw[k]) for k in names})
        else:
            half = len(names) // 2
            shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
            for fname, part in shards.items():
                write_safetensors(folder / fname, {k: (dtype, raw[k]) for k in part})
            index = {"metadata": {}, "weight_map": {k: f for f, part in shards.items() for k in part}}
            (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    elif layout == "bin":
        if dtype == "BF16":
            raise ValueError("save_pt cannot write BF16")
        save_pt(folder / "pytorch_model.bin", {k: raw[k] for k in names})
    elif layout == "bin-sharded":
        half = len(names) // 2
        shards = {"pytorch_model-00001-of-00002.bin": names[:half], "pytorch_model-00002-of-00002.bin": names[half:]}
        for fname, part in shards.items():
            save_pt(folder / fname, {k: raw[k] for k in part})
        index = {"metadata": {}, "weight_map": {k: f for f, part in shards.items() for k in part}}
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    else:
        raise ValueError(layout)
    write_tokenizer_model(folder / "tokenizer.model", n_vocab_tokenizer or config["vocab_size"])
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
         "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}))
    return exact


def llama_config(*, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, act="silu", arch="LlamaForCausalLM",
                 tied=False, **extra):
    cfg = {"architectures": [arch], "hidden_size": n_embd, "intermediate_size": n_ff, "num_hidden_layers": n_layer,
           "num_attention_heads": n_head, "num_key_value_heads": n_head_kv, "vocab_size": n_vocab,
           "hidden_act": act, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 128,
           "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2}
    cfg.update(extra)
    return cfg


def write_predictor(folder: Path, ranks: list[int], n_embd: int, n_ff: int, rng, *, threshold=None,
                    dtype=np.float32) -> list[tuple[np.ndarray, np.ndarray]]:
    """model_N.pt files with fc1.weight [R_N, n_embd], fc2.weight [n_ff, R_N]; returns the weights."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for il, r in enumerate(ranks):
        fc1 = (rng.standard_normal((r, n_embd)) / np.sqrt(n_embd)).astype(dtype)
        fc2 = (rng.standard_normal((n_ff, r)) / np.sqrt(r)).astype(dtype)
        save_pt(folder / f"model_{il}.pt", {"fc1.weight": fc1, "fc2.weight": fc2})
        out.append((fc1, fc2))
    if threshold is not None:
        (folder / "config.json").write_text(json.dumps({"sparse_threshold": threshold}))
    return out


# ---- numpy reference of the HF LLaMA forward pass ----------------------------------------------------------

def _rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _hf_rope(x, pos, theta, inv_freq=None):
    """HF LLaMA RoPE: rotate the two halves of each head (x [T, H, D]); inv_freq overrides the frequencies
    (a scaled RoPE such as LLaMA 3.1's)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d) if inv_freq is None else inv_freq
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + np.concatenate([-x2, x1], -1) * sin


MOE_NAMES = {"Qwen3MoeForCausalLM": ("mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj")),
             "Qwen2MoeForCausalLM": ("mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj")),
             "MixtralForCausalLM": ("block_sparse_moe.gate", "block_sparse_moe.experts", ("w1", "w3", "w2"))}


def moe_weights(w: dict[str, np.ndarray], rng, arch: str, *, n_layer, n_embd, n_expert, n_ff, n_ff_shared=0) -> dict:
    """llama_weights with each layer's MLP replaced by a router and n_expert SwiGLU experts of width n_ff (and,
    n_ff_shared > 0, Qwen2-MoE's shared expert with its gate)."""
    router, experts, (g, u, d) = MOE_NAMES[arch]
    w = {k: v for k, v in w.items() if ".mlp." not in k}
    for il in range(n_layer):
        p = f"model.layers.{il}."
        w[f"{p}{router}.weight"] = (2 * rng.standard_normal((n_expert, n_embd)) / np.sqrt(n_embd)).astype(np.float32)
        for e in range(n_expert):
            for proj, shape in ((g, (n_ff, n_embd)), (u, (n_ff, n_embd)), (d, (n_embd, n_ff))):
                w[f"{p}{experts}.{e}.{proj}.weight"] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        if n_ff_shared:
            for proj, shape in (("gate_proj", (n_ff_shared, n_embd)), ("up_proj", (n_ff_shared, n_embd)),
                                ("down_proj", (n_embd, n_ff_shared))):
                w[f"{p}mlp.shared_expert.{proj}.weight"] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
            w[f"{p}mlp.shared_expert_gate.weight"] = (rng.standard_normal((1, n_embd)) / np.sqrt(n_embd)).astype(np.float32)
    return w


def _hf_moe(w, p, h, cfg) -> np.ndarray:
    """The HF mixture-of-experts MLP (Qwen3-MoE, Qwen2-MoE, Mixtral): softmax router, top-k, weights
    renormalized where config norm_topk_prob says so (Mixtral always), plus Qwen2-MoE's gated shared expert."""
    router, experts, (g, u, d) = MOE_NAMES[cfg["architectures"][0]]
    logits = h @ w[f"{p}{router}.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(len(h)):
        top = np.argsort(-probs[t])[:cfg["num_experts_per_tok"]]
        weights = probs[t, top] / (probs[t, top].sum() if cfg.get("norm_topk_prob", True) else 1.0)
        for e, we in zip(top, weights):
            q = f"{p}{experts}.{e}."
            gate = w[q + g + ".weight"] @ h[t]
            out[t] += we * (w[q + d + ".weight"] @ (gate / (1 + np.exp(-gate)) * (w[q + u + ".weight"] @ h[t])))
    if f"{p}mlp.shared_expert_gate.weight" in w:
        q = f"{p}mlp.shared_expert."
        gate = h @ w[q + "gate_proj.weight"].T
        shared = (gate / (1 + np.exp(-gate)) * (h @ w[q + "up_proj.weight"].T)) @ w[q + "down_proj.weight"].T
        out += shared / (1 + np.exp(-(h @ w[f"{p}mlp.shared_expert_gate.weight"].T)))
    return out


def variant_weights(w: dict[str, np.ndarray], rng, arch: str, *, n_layer: int) -> dict[str, np.ndarray]:
    """llama_weights reshaped into another architecture's HF tensors: ArceeForCausalLM drops gate_proj (its MLP
    is down(relu(up x)^2)); Olmo2ForCausalLM (and Olmo3) drops input_layernorm and adds whole-width self_attn.q_norm /
    k_norm and post_feedforward_layernorm (post_attention_layernorm then norms the attention output)."""
    w = dict(w)
    for il in range(n_layer):
        p = f"model.layers.{il}."
        if arch == "ArceeForCausalLM":
            del w[p + "mlp.gate_proj.weight"]
        if arch in ("Olmo2ForCausalLM", "Olmo3ForCausalLM"):
            n_embd = w.pop(p + "input_layernorm.weight").shape[0]
            for name, proj in (("q_norm", "q_proj"), ("k_norm", "k_proj")):
                rows = w[f"{p}self_attn.{proj}.weight"].shape[0]
                w[f"{p}self_attn.{name}.weight"] = (1 + 0.2 * rng.standard_normal(rows)).astype(np.float32)
            w[p + "post_feedforward_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32)
    return w


def _rope_layers(cfg: dict) -> list[bool]:
    """Per layer, whether it applies RoPE: SmolLM3's no_rope_layers (1 = RoPE; default: none every
    no_rope_layer_interval-th layer), True everywhere for the other architectures."""
    n = cfg["num_hidden_layers"]
    if cfg["architectures"][0] != "SmolLM3ForCausalLM":
        return [True] * n
    step = cfg.get("no_rope_layer_interval", 4)
    return [bool(v) for v in (cfg.get("no_rope_layers") or [(il + 1) % step != 0 for il in range(n)])]


def hf_llama_forward(w: dict[str, np.ndarray], cfg: dict, tokens, inv_freq=None) -> np.ndarray:
    """Logits [T, n_vocab] of the HF LLaMA/Qwen2/Qwen3 model (float64), causal attention from position 0.
    Qwen3's per-head q_norm / k_norm (when the weights have them) apply to each head before RoPE. inv_freq: the
    RoPE frequencies when they are scaled (default: theta^(-2i/d)). Also, by config.json's architecture:
    Granite multiplies the embeddings by embedding_multiplier and each block's output by residual_multiplier,
    scales attention scores by attention_multiplier (not 1/sqrt(head_dim)) and divides the logits by
    logits_scaling; SmolLM3 skips RoPE where no_rope_layers says 0; OLMo 2 has no pre-norms, RMSNorms the
    whole Q and K projections (self_attn.q_norm / k_norm [rows]) and the attention and MLP outputs; Arcee's
    MLP is down(relu(up x)^2) (hidden_act relu2)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    hf_arch = cfg["architectures"][0]
    granite, olmo2 = hf_arch == "GraniteForCausalLM", hf_arch in ("Olmo2ForCausalLM", "Olmo3ForCausalLM")
    mult = {k: cfg.get(k, 1.0) if granite else 1.0 for k in
            ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")}
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    act = {"silu": lambda g: g / (1 + np.exp(-g)), "relu": lambda g: np.maximum(g, 0),
           "fatrelu": lambda g: np.where(g > cfg.get("hidden_act_param", 0.0), g, 0.0),
           "relu2": lambda g: np.maximum(g, 0) ** 2}[cfg["hidden_act"]]
    tokens = np.asarray(tokens)
    T = len(tokens)
    pos = np.arange(T)
    x = w["model.embed_tokens.weight"][tokens] * mult["embedding_multiplier"]
    for il, use_rope in enumerate(_rope_layers(cfg)):
        p = f"model.layers.{il}."
        h = x if olmo2 else _rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        qkv = []
        for proj, nh in (("q_proj", n_head), ("k_proj", n_kv), ("v_proj", n_kv)):
            y = h @ w[f"{p}self_attn.{proj}.weight"].T + w.get(f"{p}self_attn.{proj}.bias", 0.0)
            if olmo2 and proj != "v_proj":  # whole-width norm, before the split into heads
                y = _rmsnorm(y, w[f"{p}self_attn.{proj[0]}_norm.weight"], eps)
            qkv.append(y.reshape(T, nh, -1))
        if p + "self_attn.q_norm.weight" in w and not olmo2:
            qkv[0] = _rmsnorm(qkv[0], w[p + "self_attn.q_norm.weight"], eps)
            qkv[1] = _rmsnorm(qkv[1], w[p + "self_attn.k_norm.weight"], eps)
        q, k, v = qkv
        if use_rope:
            q, k = _hf_rope(q, pos, theta, inv_freq), _hf_rope(k, pos, theta, inv_freq)
        hd = q.shape[-1]
        rep = n_head // n_kv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        scale = cfg.get("attention_multiplier", 1.0) if granite else 1 / np.sqrt(hd)
        scores = np.einsum("thd,shd->hts", q, k) * scale
        scores = np.where(np.tril(np.ones((T, T), bool))[None], scores, -np.inf)
        prob = np.exp(scores - scores.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", prob, v).reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
        if olmo2:
            x = x + _rmsnorm(attn, w[p + "post_attention_layernorm.weight"], eps)
            h = x
        else:
            x = x + attn * mult["residual_multiplier"]
            h = _rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        if p + "mlp.down_proj.weight" not in w:  # a mixture-of-experts layer
            x = x + _hf_moe(w, p, h, cfg)
            continue
        if p + "mlp.gate_proj.weight" in w:
            ff = act(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        else:  # Arcee: ungated
            ff = act(h @ w[p + "mlp.up_proj.weight"].T)
        ff = ff @ w[p + "mlp.down_proj.weight"].T
        if olmo2:
            ff = _rmsnorm(ff, w[p + "post_feedforward_layernorm.weight"], eps)
        x = x + ff * mult["residual_multiplier"]
    x = _rmsnorm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T / mult["logits_scaling"]


# ---- byte-level BPE tokenizer.json -------------------------------------------------------------------------

def byte_level_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table (bytes that are printable map to themselves)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_bpe_tokenizer_json(folder: Path, merges: list[tuple[str, str]], specials: list[str],
                             pre_tokenizer: dict | None = None) -> dict[str, int]:
    """tokenizer.json with a byte-level BPE model: 256 byte tokens, one token per merge, then special
    added tokens; pre_tokenizer: the file's pre_tokenizer (default: a plain ByteLevel). Returns the vocabulary."""
    vocab = {c: i for i, c in enumerate(byte_level_alphabet())}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    added = [{"id": len(vocab) + i, "content": s, "special": True} for i, s in enumerate(specials)]
    tok = {"version": "1.0", "added_tokens": added,
           "pre_tokenizer": pre_tokenizer or {"type": "ByteLevel", "add_prefix_space": False},
           "model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}}
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    return vocab


# ---- Phi-3: weights, config and a numpy reference of the HF forward pass -----------------------------------

def phi3_weights(rng, *, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, tied=False):
    """HF-named random Phi-3 weights (float32): fused self_attn.qkv_proj (rows q | k | v) and mlp.gate_up_proj
    (rows gate | up), as Phi3ForCausalLM stores them."""
    hd = n_embd // n_head
    w = _embeddings_and_head(rng, n_vocab, n_embd, tied)
    for il in range(n_layer):
        p = f"model.layers.{il}."
        shapes = {"self_attn.qkv_proj.weight": ((n_head + 2 * n_head_kv) * hd, n_embd),
                  "self_attn.o_proj.weight": (n_embd, n_head * hd), "mlp.gate_up_proj.weight": (2 * n_ff, n_embd),
                  "mlp.down_proj.weight": (n_embd, n_ff)}
        for k, s in shapes.items():
            w[p + k] = rng.standard_normal(s) / np.sqrt(s[1])
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(n_embd)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(n_embd)
    return {k: v.astype(np.float32) for k, v in w.items()}


def phi3_config(*, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, tied=False, **extra):
    """A Phi3ForCausalLM config.json (the keys Phi-3-mini's has; extra overrides/adds, e.g. rope_scaling)."""
    cfg = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": n_embd,
           "intermediate_size": n_ff, "num_hidden_layers": n_layer, "num_attention_heads": n_head,
           "num_key_value_heads": n_head_kv, "vocab_size": n_vocab, "hidden_act": "silu", "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
           "rope_scaling": None, "sliding_window": 2047, "attention_bias": False, "tie_word_embeddings": tied,
           "bos_token_id": 1, "eos_token_id": 2}
    cfg.update(extra)
    return cfg


def hf_phi3_forward(w: dict[str, np.ndarray], cfg: dict, tokens, factors: str = "short",
                    kv_f16: bool = False) -> np.ndarray:
    """Logits [T, n_vocab] (float64) of Phi3ForCausalLM as transformers computes it, written from the HF
    tensors and config.json alone: split qkv_proj into q | k | v and gate_up_proj into gate | up; rotate-half
    RoPE over the first int(head_dim * partial_rotary_factor) dims of each head; with LongRoPE the frequencies
    are divided by rope_scaling.{factors}_factor and cos/sin multiplied by the attention factor
    (rope_scaling.attention_factor, else sqrt(1 + ln(s)/ln(orig)), s = max_pos / original_max_pos).
    HF picks the factor set by the sequence length, llama.cpp by its context size: the caller names it.
    Causal attention from position 0; the sequence must fit the sliding window (no window is applied).
    kv_f16: round K (after RoPE) and V to float16, the precision of the KV cache of llama.cpp and our engine."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    n_embd, n_head, n_kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, n_ff = n_embd // n_head, cfg["rms_norm_eps"], cfg["intermediate_size"]
    rot = int(hd * cfg.get("partial_rotary_factor", 1.0))
    exponent = np.arange(0, rot, 2, dtype=np.float64) / rot
    inv_freq, mscale = 1.0 / cfg["rope_theta"] ** exponent, 1.0
    scaling = cfg.get("rope_scaling")
    if scaling:
        inv_freq = inv_freq / np.asarray(scaling[f"{factors}_factor"], np.float64)
        orig = cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        s = cfg["max_position_embeddings"] / orig
        mscale = scaling.get("attention_factor") or (np.sqrt(1 + np.log(s) / np.log(orig)) if s > 1 else 1.0)
    tokens = np.asarray(tokens)
    T = len(tokens)
    if cfg.get("sliding_window") and T > cfg["sliding_window"]:
        raise ValueError("this reference applies no sliding window: keep the sequence within it")
    ang = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = (np.concatenate([np.cos(ang)] * 2, -1) * mscale)[:, None, :]
    sin = (np.concatenate([np.sin(ang)] * 2, -1) * mscale)[:, None, :]

    def rope(x):  # x [T, H, hd]: rotate-half on x[..., :rot], the rest passes through
        xr, rest = x[..., :rot], x[..., rot:]
        x1, x2 = xr[..., :rot // 2], xr[..., rot // 2:]
        return np.concatenate([xr * cos + np.concatenate([-x2, x1], -1) * sin, rest], -1)

    x = w["model.embed_tokens.weight"][tokens]
    for il in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{il}."
        qkv = _rmsnorm(x, w[p + "input_layernorm.weight"], eps) @ w[p + "self_attn.qkv_proj.weight"].T
        q = qkv[:, :n_head * hd].reshape(T, n_head, hd)
        k = qkv[:, n_head * hd:(n_head + n_kv) * hd].reshape(T, n_kv, hd)
        v = qkv[:, (n_head + n_kv) * hd:].reshape(T, n_kv, hd)
        q, k = rope(q), rope(k)
        if kv_f16:
            k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
        k, v = np.repeat(k, n_head // n_kv, axis=1), np.repeat(v, n_head // n_kv, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        scores = np.where(np.tril(np.ones((T, T), bool))[None], scores, -np.inf)
        prob = np.exp(scores - scores.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", prob, v).reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
        gu = _rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps) @ w[p + "mlp.gate_up_proj.weight"].T
        gate, up = gu[:, :n_ff], gu[:, n_ff:]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = _rmsnorm(x, w["model.norm.weight"], eps)
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
