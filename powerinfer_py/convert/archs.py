"""Per-architecture mapping of a Hugging Face checkpoint: config.json -> hparams metadata, HF tensor names ->
GGUF tensor names (in llama.cpp's naming), with the shape each tensor must have. See hf_to_gguf.py for the
architectures and the layout rules; this module only spells the names and sizes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ModelFileError, UnsupportedError
from ..gguf.types import GGMLType
from .checkpoint import Checkpoint
from .common import Dims, LayerHook, activation_meta, common_meta, output_head
from .glm4 import glm4_hparams, glm4_tensors
from .output import TensorPlan
from .phi3 import phi3_hparams, phi3_tensors
from .plan import Builder, cfg_value, falcon_qkv_order, rope_permutation

# ---- llama, bamboo, qwen2, qwen3 ----------------------------------------------------------------------------

def llama_hparams(ckpt: Checkpoint, arch: str) -> tuple[Dims, dict[str, Any]]:
    d = Dims.from_config(ckpt)
    n_embd, n_head = d.n_embd, d.n_head
    meta = common_meta(arch, d, cfg_value(ckpt, "max_position_embeddings", default=4096),
                        "layer_norm_rms_epsilon", cfg_value(ckpt, "rms_norm_eps", default=1e-6))
    meta[f"{arch}.rope.dimension_count"] = d.head_dim
    meta[f"{arch}.rope.freq_base"] = float(cfg_value(ckpt, "rope_theta", default=10000.0))
    if d.head_dim != n_embd // n_head:
        meta[f"{arch}.attention.key_length"] = meta[f"{arch}.attention.value_length"] = d.head_dim
    kind = _rope_scaling_kind(ckpt, arch)
    if kind in ("linear", "yarn"):  # YaRN as llama.cpp's converter writes it: type, factor, original context
        meta[f"{arch}.rope.scaling.type"] = kind
        meta[f"{arch}.rope.scaling.factor"] = float(ckpt.config["rope_scaling"]["factor"])
    if kind == "yarn":
        meta[f"{arch}.rope.scaling.original_context_length"] = int(ckpt.config["rope_scaling"].get(
            "original_max_position_embeddings", cfg_value(ckpt, "max_position_embeddings")))
    if arch != "arcee":  # arcee's squared ReLU is implied by the architecture (hidden_act "relu2")
        meta.update(activation_meta(ckpt))
    meta.update(_experts(ckpt, arch))
    return d, meta


def _experts(ckpt: Checkpoint, arch: str) -> dict[str, Any]:
    """The mixture-of-experts hparams of a Qwen3-MoE or Mixtral config.json ({} for dense models). llama.cpp
    renormalizes the chosen experts' weights for both, which their configs must agree with."""
    if not _is_moe(ckpt, arch):
        return {}
    where = ckpt.folder / "config.json"
    n_expert = cfg_value(ckpt, "num_experts", "num_local_experts")
    meta = {f"{arch}.expert_count": int(n_expert), f"{arch}.expert_used_count": int(cfg_value(ckpt, "num_experts_per_tok"))}
    if arch in ("qwen2moe", "qwen3moe"):
        meta[f"{arch}.expert_feed_forward_length"] = int(cfg_value(ckpt, "moe_intermediate_size"))
        renorm = arch == "qwen3moe"  # what llama.cpp does for each, whatever the config says
        if bool(ckpt.config.get("norm_topk_prob", renorm)) != renorm:
            raise UnsupportedError(f"{where}: norm_topk_prob {not renorm} is not supported (llama.cpp's {arch} "
                                   f"{'renormalizes' if renorm else 'does not renormalize'} the chosen experts' "
                                   "weights)")
        if ckpt.config.get("mlp_only_layers") or ckpt.config.get("decoder_sparse_step", 1) != 1:
            raise UnsupportedError(f"{where}: dense layers among the expert layers (mlp_only_layers, "
                                   "decoder_sparse_step) are not supported")
    if arch == "qwen2moe":
        meta[f"{arch}.expert_shared_feed_forward_length"] = int(cfg_value(ckpt, "shared_expert_intermediate_size"))
    return meta


# HF names of a MoE layer (below "model.layers.N."): router, expert prefix, and the gate / up / down projections
# (Mixtral is a llama file with experts, as llama.cpp writes it)
MOE_HF_NAMES = {"qwen3moe": ("mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj")),
                "qwen2moe": ("mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj")),
                "llama": ("block_sparse_moe.gate", "block_sparse_moe.experts", ("w1", "w3", "w2"))}


def _is_moe(ckpt: Checkpoint, arch: str) -> bool:
    return arch in ("qwen2moe", "qwen3moe") or (arch == "llama" and bool(ckpt.config.get("num_local_experts")))


def _moe_tensors(b: Builder, ckpt: Checkpoint, arch: str, d: Dims, hf: str, blk: str) -> None:
    """A MoE layer's router (kept f32) and its experts stacked into 3-D tensors, in llama.cpp's names."""
    router, experts, (gate, up, down) = MOE_HF_NAMES[arch]
    n_expert = int(cfg_value(ckpt, "num_experts", "num_local_experts"))
    n_ff = int(cfg_value(ckpt, "moe_intermediate_size", "intermediate_size"))
    b.add(blk + "ffn_gate_inp.weight", f"{hf}{router}.weight", (n_expert, d.n_embd), how="f32")
    for name, proj, shape in (("ffn_gate_exps", gate, (n_ff, d.n_embd)), ("ffn_up_exps", up, (n_ff, d.n_embd)),
                              ("ffn_down_exps", down, (d.n_embd, n_ff))):
        b.add_stack(f"{blk}{name}.weight", [f"{hf}{experts}.{e}.{proj}.weight" for e in range(n_expert)], shape)
    if arch == "qwen2moe":  # the shared expert, gated by sigmoid(shared_expert_gate . x)
        n_sh = int(cfg_value(ckpt, "shared_expert_intermediate_size"))
        b.add(blk + "ffn_gate_inp_shexp.weight", f"{hf}mlp.shared_expert_gate.weight", (1, d.n_embd), how="vector")
        for name, proj, shape in (("ffn_gate_shexp", "gate_proj", (n_sh, d.n_embd)),
                                  ("ffn_up_shexp", "up_proj", (n_sh, d.n_embd)),
                                  ("ffn_down_shexp", "down_proj", (d.n_embd, n_sh))):
            b.add(f"{blk}{name}.weight", f"{hf}mlp.shared_expert.{proj}.weight", shape)


def _rope_scaling_kind(ckpt: Checkpoint, arch: str) -> str | None:
    """config.json's rope_scaling type: None (none or "default"), "linear", or "llama3" (llama only: it becomes
    the rope_freqs.weight tensor); anything else is refused."""
    scaling = ckpt.config.get("rope_scaling")
    kind = (scaling.get("rope_type", scaling.get("type")) if scaling else None) or None
    supported = ("linear", "llama3") if arch == "llama" else ("linear", "yarn") if arch in ("arcee", "olmo2") else ("linear",)
    if kind in (None, "default") or kind in supported:
        return None if kind == "default" else kind
    raise UnsupportedError(f"{ckpt.folder / 'config.json'}: rope_scaling {kind!r} is not supported for {arch} "
                           f"({', '.join(supported)})")


def llama3_rope_factors(head_dim: int, base: float, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_ctx: int) -> np.ndarray:
    """LLaMA 3.1's RoPE frequency scaling as per-pair divisors (f32 [head_dim/2], rope_freqs.weight): pairs
    whose wavelength is short next to the original context (< original_ctx / high_freq_factor) keep their
    frequency (1), long ones (> original_ctx / low_freq_factor) are slowed by `factor`, and in between the
    new frequency blends freq / factor and freq linearly in original_ctx / wavelength."""
    if not (factor > 0 and high_freq_factor > low_freq_factor > 0 and original_ctx > 0):
        raise ValueError(f"llama3 rope_scaling: need factor > 0, high_freq_factor > low_freq_factor > 0 and "
                         f"original_max_position_embeddings > 0 (got {factor}, {low_freq_factor}, "
                         f"{high_freq_factor}, {original_ctx})")
    freq = float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freq
    blend = np.clip((original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor), 0.0, 1.0)
    return (1.0 / ((1.0 - blend) / factor + blend)).astype(np.float32)


def _llama3_factors(ckpt: Checkpoint, d: Dims) -> np.ndarray:
    s, where = ckpt.config["rope_scaling"], ckpt.folder / "config.json"
    try:
        return llama3_rope_factors(d.head_dim, float(cfg_value(ckpt, "rope_theta", default=10000.0)),
                                   float(s["factor"]), float(s.get("low_freq_factor", 1.0)),
                                   float(s.get("high_freq_factor", 4.0)),
                                   int(s.get("original_max_position_embeddings", 8192)))
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{where}: bad llama3 rope_scaling {s!r}: {e}") from None


def llama_tensors(b: Builder, ckpt: Checkpoint, arch: str, d: Dims, sparse: bool, hook: LayerHook) -> None:
    moe = _is_moe(ckpt, arch)
    permute = arch in NORMAL_ROPE_ARCHS  # qwen* use NeoX RoPE: HF's layout is already llama.cpp's
    biases = arch in ("qwen2", "qwen2moe")
    qk_norms = arch in ("qwen3", "qwen3moe")  # per-head RMSNorm weights of Q and K, [head_dim] each
    q_rows, kv_rows = d.n_head * d.head_dim, d.n_head_kv * d.head_dim
    b.add("token_embd.weight", "model.embed_tokens.weight", (d.n_vocab, d.n_embd))
    if _rope_scaling_kind(ckpt, arch) == "llama3":  # baked into per-pair divisors, as llama.cpp reads them
        factors = _llama3_factors(ckpt, d)
        b.add_plain(TensorPlan("rope_freqs.weight", GGMLType.F32, factors.shape, lambda: iter([(factors, "F32")])))
    for il in range(d.n_layer):
        hf, blk = f"model.layers.{il}.", f"blk.{il}."
        b.add(blk + "attn_norm.weight", hf + "input_layernorm.weight", (d.n_embd,))
        for name, proj, rows, heads in (("attn_q", "q_proj", q_rows, d.n_head), ("attn_k", "k_proj", kv_rows, d.n_head_kv)):
            if permute:
                b.add(f"{blk}{name}.weight", f"{hf}self_attn.{proj}.weight", (rows, d.n_embd), how="gather",
                      index=rope_permutation(rows, heads))
            else:
                b.add(f"{blk}{name}.weight", f"{hf}self_attn.{proj}.weight", (rows, d.n_embd))
        b.add(blk + "attn_v.weight", hf + "self_attn.v_proj.weight", (kv_rows, d.n_embd))
        if biases:
            for name, proj, rows in (("attn_q", "q_proj", q_rows), ("attn_k", "k_proj", kv_rows), ("attn_v", "v_proj", kv_rows)):
                b.add(f"{blk}{name}.bias", f"{hf}self_attn.{proj}.bias", (rows,))
        if qk_norms:
            b.add(blk + "attn_q_norm.weight", hf + "self_attn.q_norm.weight", (d.head_dim,))
            b.add(blk + "attn_k_norm.weight", hf + "self_attn.k_norm.weight", (d.head_dim,))
        b.add(blk + "attn_output.weight", hf + "self_attn.o_proj.weight", (d.n_embd, q_rows))
        b.add(blk + "ffn_norm.weight", hf + "post_attention_layernorm.weight", (d.n_embd,))
        if moe:
            _moe_tensors(b, ckpt, arch, d, hf, blk)
            hook(il)
            continue
        if arch != "arcee":  # arcee's FFN is ungated: down(relu(up x)^2)
            b.add(blk + "ffn_gate.weight", hf + "mlp.gate_proj.weight", (d.n_ff, d.n_embd))
        b.add(blk + "ffn_up.weight", hf + "mlp.up_proj.weight", (d.n_ff, d.n_embd))
        if sparse:
            b.add(blk + "ffn_down_t.weight", hf + "mlp.down_proj.weight", (d.n_embd, d.n_ff), how="transpose")
        else:
            b.add(blk + "ffn_down.weight", hf + "mlp.down_proj.weight", (d.n_embd, d.n_ff))
        hook(il)
    b.add("output_norm.weight", "model.norm.weight", (d.n_embd,))
    output_head(b, ckpt, "lm_head.weight", d, tied_default=False)


NORMAL_ROPE_ARCHS = ("llama", "bamboo", "granite", "smollm3", "arcee")  # Q/K rows get rope_permutation


# ---- granite, smollm3, arcee (llama tensors), olmo2 ---------------------------------------------------------

def granite_hparams(ckpt: Checkpoint, arch: str) -> tuple[Dims, dict[str, Any]]:
    """llama's hparams plus Granite's four scalars, under llama.cpp's names; the defaults are transformers'
    (1.0 each: an absent attention_multiplier means a scale of 1, not 1/sqrt(head_dim))."""
    d, meta = llama_hparams(ckpt, arch)
    if d.head_dim != d.n_embd // d.n_head:
        raise UnsupportedError(f"{ckpt.folder / 'config.json'}: granite with head_dim {d.head_dim} != hidden_size "
                               f"/ num_attention_heads is not supported")
    for key, hf in (("embedding_scale", "embedding_multiplier"), ("residual_scale", "residual_multiplier"),
                    ("attention.scale", "attention_multiplier"), ("logit_scale", "logits_scaling")):
        value = float(cfg_value(ckpt, hf, default=1.0))
        if not value > 0:
            raise UnsupportedError(f"{ckpt.folder / 'config.json'}: {hf} must be > 0, got {value}")
        meta[f"{arch}.{key}"] = value
    return d, meta


def smollm3_hparams(ckpt: Checkpoint, arch: str) -> tuple[Dims, dict[str, Any]]:
    """llama's hparams; the RoPE-less layers must be every 4th one, the pattern llama.cpp (and config.py)
    hard-code, as no GGUF key holds it. config.json's no_rope_layers has 1 where a layer uses RoPE."""
    d, meta = llama_hparams(ckpt, arch)
    step = int(cfg_value(ckpt, "no_rope_layer_interval", default=4))
    want = [int((il + 1) % 4 != 0) for il in range(d.n_layer)]
    got = ckpt.config.get("no_rope_layers") or [int((il + 1) % step != 0) for il in range(d.n_layer)]
    if [int(v) for v in got[:d.n_layer]] != want:
        raise UnsupportedError(f"{ckpt.folder / 'config.json'}: smollm3 without RoPE in layers other than every 4th "
                               f"(no_rope_layers {got[:d.n_layer]}) is not supported")
    return d, meta


def arcee_hparams(ckpt: Checkpoint, arch: str) -> tuple[Dims, dict[str, Any]]:
    """llama's hparams (no activation key: the squared ReLU comes with the architecture; YaRN as llama.cpp
    writes it: type, factor, original context)."""
    act = ckpt.config.get("hidden_act", "relu2")
    if act != "relu2":
        raise UnsupportedError(f"{ckpt.folder / 'config.json'}: arcee hidden_act {act!r} is not supported (relu2)")
    return llama_hparams(ckpt, arch)


def olmo3_hparams(ckpt: Checkpoint, arch: str) -> tuple[Dims, dict[str, Any]]:
    """Olmo3ForCausalLM: olmo2's hparams (YaRN included) plus the sliding window as llama.cpp's converter writes it
    (the window and one bool per layer, from layer_types or, without them, all but every 4th layer)."""
    d, meta = llama_hparams(ckpt, arch)
    window = int(ckpt.config.get("sliding_window") or 0)
    if window > 0:
        types = ckpt.config.get("layer_types")
        if types is not None and len(types) != d.n_layer:
            raise ModelFileError(f"{ckpt.folder / 'config.json'}: layer_types has {len(types)} entries for "
                                 f"{d.n_layer} layers")
        meta[f"{arch}.attention.sliding_window"] = window
        meta[f"{arch}.attention.sliding_window_pattern"] = (
            [t == "sliding_attention" for t in types] if types is not None
            else [(il + 1) % 4 != 0 for il in range(d.n_layer)])
    return d, meta


def olmo2_tensors(b: Builder, ckpt: Checkpoint, arch: str, d: Dims, sparse: bool, hook: LayerHook) -> None:
    """No pre-norms; whole-width q_norm / k_norm and the norms of the attention and FFN outputs. NeoX RoPE."""
    q_rows, kv_rows = d.n_head * d.head_dim, d.n_head_kv * d.head_dim
    b.add("token_embd.weight", "model.embed_tokens.weight", (d.n_vocab, d.n_embd))
    for il in range(d.n_layer):
        hf, blk = f"model.layers.{il}.", f"blk.{il}."
        for name, src, shape in (
                ("attn_q", "self_attn.q_proj", (q_rows, d.n_embd)), ("attn_k", "self_attn.k_proj", (kv_rows, d.n_embd)),
                ("attn_v", "self_attn.v_proj", (kv_rows, d.n_embd)), ("attn_q_norm", "self_attn.q_norm", (q_rows,)),
                ("attn_k_norm", "self_attn.k_norm", (kv_rows,)), ("attn_output", "self_attn.o_proj", (d.n_embd, q_rows)),
                ("post_attention_norm", "post_attention_layernorm", (d.n_embd,)),
                ("ffn_gate", "mlp.gate_proj", (d.n_ff, d.n_embd)), ("ffn_up", "mlp.up_proj", (d.n_ff, d.n_embd)),
                ("ffn_down", "mlp.down_proj", (d.n_embd, d.n_ff)),
                ("post_ffw_norm", "post_feedforward_layernorm", (d.n_embd,))):
            b.add(f"{blk}{name}.weight", f"{hf}{src}.weight", shape)
        hook(il)
    b.add("output_norm.weight", "model.norm.weight", (d.n_embd,))
    output_head(b, ckpt, "lm_head.weight", d, tied_default=False)


# ---- falcon ------------------------------------------------------------------------------------------------

def falcon_hparams(ckpt: Checkpoint, arch: str) -> tuple[Dims, dict[str, Any]]:
    cfg = ckpt.config
    if cfg.get("alibi") or cfg.get("parallel_attn", True) is False or cfg.get("bias"):
        raise UnsupportedError(f"{ckpt.folder / 'config.json'}: Falcon variants with alibi, bias or a "
                               "non-parallel block are not supported")
    n_embd = cfg_value(ckpt, "hidden_size", "n_embed")
    n_head = cfg_value(ckpt, "num_attention_heads", "n_head")
    if cfg.get("new_decoder_architecture"):
        n_kv = cfg_value(ckpt, "num_kv_heads", "n_head_kv")
    else:
        n_kv = 1 if cfg.get("multi_query", True) else n_head
    d = Dims(n_layer=cfg_value(ckpt, "num_hidden_layers", "n_layer"), n_embd=n_embd,
             n_ff=cfg_value(ckpt, "ffn_hidden_size", default=4 * n_embd), n_head=n_head, n_head_kv=n_kv,
             head_dim=n_embd // n_head, n_vocab=cfg_value(ckpt, "vocab_size")).check(ckpt)
    meta = common_meta(arch, d, cfg_value(ckpt, "max_position_embeddings", default=2048),
                        "layer_norm_epsilon", cfg_value(ckpt, "layer_norm_epsilon", default=1e-5))
    if cfg.get("hidden_act", "gelu") != "gelu":  # ReluFalcon; plain Falcon's GELU is llama.cpp's default
        meta.update(activation_meta(ckpt))
    return d, meta


def falcon_tensors(b: Builder, ckpt: Checkpoint, arch: str, d: Dims, sparse: bool, hook: LayerHook) -> None:
    new_arch = bool(ckpt.config.get("new_decoder_architecture"))
    b.add("token_embd.weight", "transformer.word_embeddings.weight", (d.n_vocab, d.n_embd))
    qkv_rows = (d.n_head + 2 * d.n_head_kv) * d.head_dim
    for il in range(d.n_layer):
        hf, blk = f"transformer.h.{il}.", f"blk.{il}."
        if ckpt.has(hf + "ln_attn.weight"):  # 40B: separate norms for attention and MLP
            for gg, hh in (("attn_norm", "ln_attn"), ("attn_norm_2", "ln_mlp")):
                b.add(f"{blk}{gg}.weight", f"{hf}{hh}.weight", (d.n_embd,))
                b.add(f"{blk}{gg}.bias", f"{hf}{hh}.bias", (d.n_embd,))
        else:
            b.add(blk + "attn_norm.weight", hf + "input_layernorm.weight", (d.n_embd,))
            b.add(blk + "attn_norm.bias", hf + "input_layernorm.bias", (d.n_embd,))
        qkv = hf + "self_attention.query_key_value.weight"
        if new_arch:
            b.add(blk + "attn_qkv.weight", qkv, (qkv_rows, d.n_embd), how="gather",
                  index=falcon_qkv_order(d.n_head, d.n_head_kv, d.head_dim))
        else:
            b.add(blk + "attn_qkv.weight", qkv, (qkv_rows, d.n_embd))
        b.add(blk + "attn_output.weight", hf + "self_attention.dense.weight", (d.n_embd, d.n_embd))
        b.add(blk + "ffn_up.weight", hf + "mlp.dense_h_to_4h.weight", (d.n_ff, d.n_embd))
        down = hf + "mlp.dense_4h_to_h.weight"
        if sparse:
            b.add(blk + "ffn_down_t.weight", down, (d.n_embd, d.n_ff), how="transpose")
        else:
            b.add(blk + "ffn_down.weight", down, (d.n_embd, d.n_ff))
        hook(il)
    b.add("output_norm.weight", "transformer.ln_f.weight", (d.n_embd,))
    b.add("output_norm.bias", "transformer.ln_f.bias", (d.n_embd,))
    output_head(b, ckpt, "lm_head.weight", d, tied_default=True)


# ---- opt ---------------------------------------------------------------------------------------------------

def _opt_prefix(ckpt: Checkpoint) -> str:
    return "model.decoder." if ckpt.has("model.decoder.embed_tokens.weight") else "decoder."


def opt_hparams(ckpt: Checkpoint, arch: str) -> tuple[Dims, dict[str, Any]]:
    cfg = ckpt.config
    n_embd = cfg_value(ckpt, "hidden_size")
    if cfg.get("word_embed_proj_dim", n_embd) != n_embd or cfg.get("do_layer_norm_before", True) is False:
        raise UnsupportedError(f"{ckpt.folder / 'config.json'}: OPT with projected embeddings or post-norm "
                               "(OPT-350m) is not supported")
    if cfg.get("activation_function", "relu") != "relu":
        raise UnsupportedError(f"{ckpt.folder / 'config.json'}: OPT activation "
                               f"{cfg.get('activation_function')!r} is not supported (relu)")
    n_head = cfg_value(ckpt, "num_attention_heads")
    d = Dims(n_layer=cfg_value(ckpt, "num_hidden_layers"), n_embd=n_embd, n_ff=cfg_value(ckpt, "ffn_dim"),
             n_head=n_head, n_head_kv=n_head, head_dim=n_embd // n_head,
             n_vocab=cfg_value(ckpt, "vocab_size")).check(ckpt)
    meta = common_meta(arch, d, cfg_value(ckpt, "max_position_embeddings"), "layer_norm_epsilon", 1e-5)
    return d, meta


def opt_tensors(b: Builder, ckpt: Checkpoint, arch: str, d: Dims, sparse: bool, hook: LayerHook) -> None:
    pre = _opt_prefix(ckpt)
    n_ctx = cfg_value(ckpt, "max_position_embeddings")
    b.add("token_embd.weight", pre + "embed_tokens.weight", (d.n_vocab, d.n_embd))
    b.source(pre + "embed_positions.weight", (n_ctx + 2, d.n_embd))
    b.add("position_embd.weight", pre + "embed_positions.weight", first_row=2)  # OPT's position offset of 2

    def pair(gguf: str, hf: str, shape: tuple[int, ...]) -> None:
        b.add(gguf + ".weight", hf + ".weight", shape)
        b.add(gguf + ".bias", hf + ".bias", shape[:1])

    for il in range(d.n_layer):
        hf, blk = f"{pre}layers.{il}.", f"blk.{il}."
        pair(blk + "attn_norm", hf + "self_attn_layer_norm", (d.n_embd,))
        for name, proj in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "out_proj")):
            pair(blk + name, f"{hf}self_attn.{proj}", (d.n_embd, d.n_embd))
        pair(blk + "ffn_norm", hf + "final_layer_norm", (d.n_embd,))
        pair(blk + "ffn_up", hf + "fc1", (d.n_ff, d.n_embd))
        if sparse:
            b.add(blk + "ffn_down_t.weight", hf + "fc2.weight", (d.n_embd, d.n_ff), how="transpose")
            b.add(blk + "ffn_down_t.bias", hf + "fc2.bias", (d.n_embd,))
        else:
            pair(blk + "ffn_down", hf + "fc2", (d.n_embd, d.n_ff))
        hook(il)
    pair("output_norm", pre + "final_layer_norm", (d.n_embd,))
    output_head(b, ckpt, "lm_head.weight", d, tied_default=True)


# config.json architectures[0] -> (general.architecture, hparams, tensors)
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", llama_hparams, llama_tensors),
    "MistralForCausalLM": ("llama", llama_hparams, llama_tensors),
    "SparseLlamaForCausalLM": ("llama", llama_hparams, llama_tensors),
    "BambooForCausalLM": ("bamboo", llama_hparams, llama_tensors),
    "Qwen2ForCausalLM": ("qwen2", llama_hparams, llama_tensors),
    "Qwen3ForCausalLM": ("qwen3", llama_hparams, llama_tensors),
    "Qwen3MoeForCausalLM": ("qwen3moe", llama_hparams, llama_tensors),
    "Qwen2MoeForCausalLM": ("qwen2moe", llama_hparams, llama_tensors),
    "MixtralForCausalLM": ("llama", llama_hparams, llama_tensors),  # a llama file with experts
    "FalconForCausalLM": ("falcon", falcon_hparams, falcon_tensors),
    "RWForCausalLM": ("falcon", falcon_hparams, falcon_tensors),
    "OPTForCausalLM": ("opt", opt_hparams, opt_tensors),
    "Phi3ForCausalLM": ("phi3", phi3_hparams, phi3_tensors),
    "GraniteForCausalLM": ("granite", granite_hparams, llama_tensors),
    "SmolLM3ForCausalLM": ("smollm3", smollm3_hparams, llama_tensors),
    "Olmo2ForCausalLM": ("olmo2", llama_hparams, olmo2_tensors),
    "Olmo3ForCausalLM": ("olmo2", olmo3_hparams, olmo2_tensors),
    "ArceeForCausalLM": ("arcee", arcee_hparams, llama_tensors),
    "Glm4ForCausalLM": ("glm4", glm4_hparams, glm4_tensors),
}
SPARSE_ARCHS = ("llama", "bamboo", "falcon", "opt")  # what a PWRI file may hold (docs/FORMATS.md §1)
