"""write_synthetic_model: a tiny random model as a standard GGUF file, for tests and demos.

The file is complete enough for llama.cpp itself to load and run (hparams metadata, every tensor its loader
requires, a SentencePiece-style "llama" vocabulary with <unk>/<s>/</s>, the 256 byte-fallback tokens and a
few hundred word pieces), so our results can be compared with llama.cpp's on the same file.

Weights are random but scaled so every activation stays O(1): matrices ~ N(0, 1/K) for K inputs, norm
weights ~ 1 + N(0, 0.1^2), embeddings ~ N(0, 1). Greedy outputs then depend on the input in a non-trivial way.
2-D weights take `dtype`; 1-D tensors (norms, biases) are always F32, as in real files.
"""
from __future__ import annotations

import os
from pathlib import Path

from .common import DTYPES
from .generic import write_generic_model

# written by synth.generic (llama's block and its few-tensor variants), in the order the tests grew
ARCHS = ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma", "gemma2", "gemma3", "phi3")
ARCHS += ("granite", "granitemoe")
ARCHS += ("smollm3", "olmo2", "exaone4")
ARCHS += ("gpt-oss",)
ARCHS += ("arcee",)
ARCHS += ("ernie4_5", "ernie4_5-moe")
ARCHS += ("deepseek2",)
ARCHS += ("glm4", "glm4moe")
ARCHS += ("lfm2", "lfm2moe")  # with synth.lfm2's conv layers
ARCHS += ("qwen35", "qwen35moe", "qwen3next")  # Qwen3.5, Qwen3-Next: written whole by synth.qwen35.write_qwen35
ARCHS += ("hunyuan-dense", "apertus", "seed_oss")  # llama variants: synth.llama_variants.write_llama_variant
ARCHS += ("nemotron_h", "mamba2", "granitehybrid", "nemotron_h_moe")  # Nemotron-H, Mamba-2, Granite 4.0-H: synth.nemotron_h.write_nemotron_h
ARCHS += ("command-r", "cohere2")  # Cohere: written whole by synth.command_r.write_cohere_model
ARCHS += ("bailingmoe2", "afmoe")  # Ling 2.0, Trinity: written whole by synth.bailingmoe2.write_ling_trinity
ARCHS += ("falcon-h1",)  # Falcon-H1: synth.falcon_h1.write_falcon_h1
ARCHS += ("phi2", "stablelm", "starcoder2", "gpt2")  # LayerNorm decoders: synth.ln_decoder.write_ln_decoder_model
ARCHS += ("minicpm", "minicpm3", "olmoe")  # written whole by synth.minicpm.write_minicpm_model
ARCHS += ("llama4",)  # Llama 4: written whole by synth.llama4.write_llama4_model
ARCHS += ("exaone", "internlm2")  # synth.generic again: llama's layers


def write_synthetic_model(path: str | os.PathLike, arch: str, *, dtype: str = "f32", n_layer: int | None = None,
                          n_embd: int = 64, n_ff: int = 128, n_head: int = 4, n_head_kv: int = 2,
                          n_vocab: int = 512, seed: int = 0, **overrides) -> Path:
    """Write a tiny random `arch` model to `path` (a GGUF file) and return the path.

    n_layer defaults to 2, and to 6 for gemma3 so that one of its layers is global (llama.cpp makes every
    6th gemma3 layer global; gemma2 alternates window / global from layer 0), 4 for smollm3 so that one layer
    (il = 3) has no RoPE. olmo2 files have no pre-norms (models/olmo2.py). Overrides: head_dim (default
    n_embd / n_head; twice that for gemma, gemma2, gemma3 and qwen3), n_ctx_train, norm_eps, rope_freq_base,
    sliding_window (gemma2, gemma3; default 4 tokens), attn_softcap and final_softcap (gemma2: the values of
    its soft-cap keys, default 50 and 30 as in real files; None leaves the key out), tied (default: untied
    for llama, tied otherwise), bias_std (qwen2), chat_template (a Jinja text stored as tokenizer.chat_template),
    rope_freqs (llama: head_dim / 2 RoPE frequency factors, stored as rope_freqs.weight as LLaMA 3.1+ files
    have them), rope_scaling (a dict written as {arch}.rope.scaling.<key>, e.g. type "yarn", factor,
    original_context_length); phi3: n_rot (rotated dims per head, default 3/4 of head_dim as on Phi-4-mini),
    rope_factors ((short, long), n_rot / 2 each, stored as rope_factors_short/long.weight), orig_ctx
    (rope.scaling.original_context_length, default 16), attn_factor (default 1.0), fused_qkv (default True: one
    attn_qkv tensor; False: attn_q/k/v); mixture of experts (qwen2moe, qwen3moe, and llama as Mixtral): n_expert
    (default 4 for the moe archs, 0 = dense), n_expert_used (default 2), n_ff_exp (an expert's width, default
    n_ff; llama and granitemoe files store it as feed_forward_length), n_ff_shexp (qwen2moe's shared expert, default
    n_ff; granitemoe's, ungated, default 0 = none); arcee: as llama without ffn_gate; granite, granitemoe: embedding_scale, residual_scale,
    attention_scale, logit_scale (defaults synth.common.GRANITE_SCALES; None leaves the key out), rope_finetuned;
    ernie4_5-moe: dense_lead, moe_step, probs_bias (synth.generic._ernie_options; n_ff_shexp defaults to
    n_ff_exp); lfm2 (4 layers by default, layer 2 attends): attn_layers, conv_kernel (synth.lfm2.lfm2_options)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; synthetic models exist for {', '.join(ARCHS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    n_layer = n_layer if n_layer is not None else {"gemma3": 6, "smollm3": 4, "lfm2": 4, "lfm2moe": 4,
                                                   "qwen35": 6, "qwen35moe": 6, "qwen3next": 6, "nemotron_h": 6, "nemotron_h_moe": 6, "granitehybrid": 6,
                                                   "mamba2": 4, "bailingmoe2": 4, "afmoe": 4}.get(arch, 2)
    if arch == "llama4":  # interleaved dense / expert layers, chunked + NoPE attention (4 layers by default)
        from .llama4 import write_llama4_model
        return write_llama4_model(path, dtype=dtype, n_layer=n_layer if n_layer is not None else 4, n_embd=n_embd,
                                  n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv, n_vocab=n_vocab, seed=seed,
                                  **overrides)
    if arch in ("bailingmoe2", "afmoe"):  # dense lead + expert layers (synth/bailingmoe2.py lists the options)
        from .bailingmoe2 import write_ling_trinity
        return write_ling_trinity(path, arch, dtype=dtype, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                                  n_head_kv=n_head_kv, n_vocab=n_vocab, seed=seed, **overrides)
    if arch in ("qwen35", "qwen35moe", "qwen3next"):  # delta-net and gated attention layers (synth/qwen35.py lists the options)
        from .qwen35 import write_qwen35
        return write_qwen35(path, arch, dtype=dtype, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                            n_head_kv=n_head_kv, n_vocab=n_vocab, seed=seed, **overrides)
    if arch == "falcon-h1":  # attention and a Mamba-2 mixer on every layer (synth/falcon_h1.py lists the options)
        from .falcon_h1 import write_falcon_h1
        return write_falcon_h1(path, dtype=dtype, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                               n_head_kv=n_head_kv, n_vocab=n_vocab, seed=seed, **overrides)
    if arch in ("nemotron_h", "mamba2", "granitehybrid", "nemotron_h_moe"):  # Mamba-2, attention and FFN layers (synth/nemotron_h.py lists the options)
        from .nemotron_h import write_nemotron_h
        return write_nemotron_h(path, arch, dtype=dtype, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                                n_head_kv=n_head_kv, n_vocab=n_vocab, seed=seed, **overrides)
    if arch in ("command-r", "cohere2"):  # parallel LayerNorm blocks (synth/command_r.py lists the options)
        from .command_r import write_cohere_model
        return write_cohere_model(path, arch, dtype=dtype, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                                  n_head_kv=n_head_kv, n_vocab=n_vocab, seed=seed, **overrides)
    if arch in ("minicpm", "minicpm3", "olmoe"):  # synth/minicpm.py lists the options
        from .minicpm import write_minicpm_model
        # olmoe: llama.cpp's k norm spans the whole K projection, so its files have as many K/V heads as heads
        return write_minicpm_model(path, arch, dtype=dtype, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                                   n_head_kv=n_head if arch == "olmoe" else n_head_kv, n_vocab=n_vocab, seed=seed,
                                   **overrides)
    if arch in ("phi2", "stablelm", "starcoder2", "gpt2"):  # LayerNorm decoders with biases (synth/ln_decoder.py lists the options)
        from .ln_decoder import write_ln_decoder_model
        return write_ln_decoder_model(path, arch, dtype=dtype, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                                      n_head_kv=n_head_kv, n_vocab=n_vocab, seed=seed, **overrides)
    if arch in ("hunyuan-dense", "apertus", "seed_oss"):  # synth/llama_variants.py lists the options
        from .llama_variants import write_llama_variant
        return write_llama_variant(path, arch, dtype=dtype, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                                   n_head_kv=n_head_kv, n_vocab=n_vocab, seed=seed, **overrides)
    return write_generic_model(path, arch, dtype, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, seed, overrides)
