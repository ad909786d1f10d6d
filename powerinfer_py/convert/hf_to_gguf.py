"""Hugging Face checkpoint (+ optional PowerInfer predictor) -> GGUF, or PWRI (docs/FORMATS.md §1), streamed.

Architectures (config.json "architectures"[0] -> general.architecture):
  LlamaForCausalLM, MistralForCausalLM  -> llama   hidden_act silu (LLaMA, Mistral) or relu (ReluLLaMA)
  SparseLlamaForCausalLM                -> llama   ProSparse: fatrelu(x) = x if x > hidden_act_param else 0
  BambooForCausalLM                     -> bamboo  Mistral shape, dReLU FFN
  Qwen2ForCausalLM                      -> qwen2   q/k/v biases, NeoX RoPE (no Q/K permutation)
  Qwen3ForCausalLM                      -> qwen3   no biases, per-head q_norm/k_norm, NeoX RoPE, config head_dim
  Qwen3MoeForCausalLM                   -> qwen3moe  qwen3 attention, mixture-of-experts FFN (router kept f32,
                                                     each projection's experts stacked into one 3-D tensor)
  Qwen2MoeForCausalLM                   -> qwen2moe  qwen2 attention, experts as qwen3moe, plus the shared expert
                                                     and its gate (shared_expert_gate [1, d] -> a vector [d])
  MixtralForCausalLM                    -> llama   with experts (block_sparse_moe: w1 gate, w3 up, w2 down)
  FalconForCausalLM, RWForCausalLM      -> falcon  fused QKV (regrouped to [all q | all k | all v]), NeoX RoPE
  OPTForCausalLM                        -> opt     biases, LayerNorm, learned positions
  Phi3ForCausalLM                       -> phi3    fused qkv and gate+up kept fused, partial NeoX RoPE, LongRoPE (phi3.py)
  GraniteForCausalLM                    -> granite llama layout; embedding/residual/attention multipliers and
                                                   logits_scaling -> {arch}.embedding_scale, residual_scale,
                                                   attention.scale, logit_scale (transformers' defaults: 1.0)
  SmolLM3ForCausalLM                    -> smollm3 llama layout; no_rope_layers must be NoPE every 4th layer
                                                   (llama.cpp's fixed step: no GGUF key holds it)
  Olmo2ForCausalLM                      -> olmo2   NeoX RoPE, no pre-norms; whole-width q_norm/k_norm, post-attention
                                                   and post-feedforward norms -> post_attention_norm, post_ffw_norm
  Olmo3ForCausalLM                      -> olmo2   as Olmo2, plus sliding_window + layer_types ->
                                                   attention.sliding_window(_pattern); YaRN rope_scaling
  ArceeForCausalLM                      -> arcee   llama layout without gate_proj (relu2 MLP); YaRN rope_scaling
  Glm4ForCausalLM                       -> glm4    q/k/v biases, four norms per block, gate_up_proj kept fused,
                                                   partial normal-layout RoPE (glm4.py)
A non-SiLU activation is recorded as powerinfer.hidden_act ("relu", "fatrelu") with powerinfer.hidden_act_param
(the fatrelu threshold), so the runtime can apply it; llama.cpp ignores these keys.

Tensor layout: a torch Linear weight [out, in] is already the ggml layout (ne0 = in, contiguous), so most
tensors are copied row block by row block. Three are rearranged:
  - llama/bamboo/granite/smollm3/arcee attn_q / attn_k: llama.cpp's RoPE row permutation (HF rotates the halves of each head,
    llama.cpp rotates adjacent pairs): within each head, output row 2a+b comes from input row b*head_dim/2 + a;
  - with a predictor, ffn_down_t = down_proj.T (row i = the n_embd weights of neuron i), replacing ffn_down;
  - opt position_embd drops HF's first 2 rows (OPT offsets positions by 2): row p is position p.
1-D tensors are F32; 2-D tensors take the output type (Q8_0/Q4_0 fall back to F16 for rows that are not a
multiple of 32).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

from ..errors import ModelFileError, UnsupportedError
from .archs import ARCHITECTURES, SPARSE_ARCHS
from .checkpoint import Checkpoint
from .output import TensorPlan, check_target, write_streamed
from .plan import IGNORED_SUFFIXES, FILE_TYPES, METADATA_TYPES, OUTTYPES, Builder, Plan, _rows
from .predictor import read_predictor
from .vocab import tokenizer_metadata

_LAYER = re.compile(r"\.(?:layers|h)\.(\d+)\.")


def _check_unused(ckpt: Checkpoint, used: set[str], n_layer: int, arch: str) -> None:
    """Every HF tensor must be part of the mapping: a leftover means a layer count mismatch or a variant
    of the architecture we would silently convert wrong."""
    for name, t in ckpt.tensors.items():
        if name in used or name.endswith(IGNORED_SUFFIXES):
            continue
        m = _LAYER.search(name)
        if m and int(m.group(1)) >= n_layer:
            raise ModelFileError(f"{t.path}: tensor {name!r} belongs to layer {m.group(1)}, but config.json says "
                                 f"{n_layer} layers: layer count mismatch")
        raise ModelFileError(f"{t.path}: tensor {name!r} is not part of the {arch} layout (unknown tensor)")


def plan_conversion(ckpt: Checkpoint, predictor_dir: str | os.PathLike | None = None,
                    outtype: str = "f16") -> Plan:
    """Metadata and tensor plans for converting `ckpt` (nothing is read but headers and small files)."""
    if outtype not in OUTTYPES:
        raise UnsupportedError(f"output type {outtype!r} is not supported; choose one of {', '.join(OUTTYPES)}")
    hf_arch = ckpt.architecture
    if hf_arch not in ARCHITECTURES:
        raise UnsupportedError(f"{ckpt.folder / 'config.json'}: architecture {hf_arch!r} is not supported; "
                               f"supported: {', '.join(ARCHITECTURES)}")
    arch, hparams, add_tensors = ARCHITECTURES[hf_arch]
    d, meta = hparams(ckpt, arch)
    predictor = None
    if predictor_dir is not None:
        if arch not in SPARSE_ARCHS:
            raise UnsupportedError(f"{ckpt.folder}: a predictor needs a sparse architecture "
                                   f"({', '.join(SPARSE_ARCHS)}), this is {arch}")
        predictor = read_predictor(predictor_dir, d.n_layer, d.n_embd, d.n_ff)
    b = Builder(ckpt, outtype)

    def add_predictor(il: int) -> None:
        if predictor is None:
            return
        for name, src in (("fc1", predictor.fc1[il]), ("fc2", predictor.fc2[il])):
            shape = tuple(src.shape)  # torch layout == ggml layout: fc1 (R, n_embd), fc2 (n_ff, R)
            b.add_plain(TensorPlan(f"blk.{il}.{name}.weight", b.type_for(shape), shape, _rows(src)))

    add_tensors(b, ckpt, arch, d, predictor is not None, add_predictor)
    _check_unused(ckpt, b.used, d.n_layer, arch)
    name = str(ckpt.config.get("_name_or_path") or ckpt.folder.resolve().name).rstrip("/").split("/")[-1]
    metadata = {"general.architecture": arch, "general.name": name, "general.file_type": FILE_TYPES[outtype]}
    metadata.update(meta)
    if predictor is not None:
        metadata["powerinfer.sparse_threshold"] = float(predictor.threshold or 0.0)
    metadata.update(tokenizer_metadata(ckpt.folder, ckpt.config, d.n_vocab, arch))
    return Plan(arch, "PWRI" if predictor is not None else "GGUF", metadata, b.plans)


def convert(hf_dir: str | os.PathLike, out: str | os.PathLike, *, predictor: str | os.PathLike | None = None,
            outtype: str = "f16", force: bool = False, n_threads: int | None = None,
            progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Convert the checkpoint folder `hf_dir` (with the predictor folder `predictor`: a PWRI file) to `out`."""
    out = Path(out)
    if not Path(hf_dir).is_dir():  # the input's problem first, then the output's
        raise ModelFileError(f"{hf_dir}: not a folder (expected a Hugging Face checkpoint folder)")
    check_target(out, force)  # before reading a large checkpoint
    ckpt = Checkpoint(hf_dir)
    plan = plan_conversion(ckpt, predictor, outtype)
    return write_streamed(out, plan.metadata, plan.tensors, magic=plan.magic, types=METADATA_TYPES,
                          force=force, n_threads=n_threads, progress=progress)
