"""Models: one module per architecture family, chosen by config.arch.

    build_model(config, tensors, kernels, sparse=None) -> Model
                                    (Model.forward(tokens, cache, all_logits=False), Model.new_cache(n_ctx),
                                     Model.sparsity: per-layer active-neuron counts or None)
    expected_tensors(config) -> {name: (shape numpy order, required)}   (for loader.load_weights)

`kernels` is a kernels.cpu.CpuKernels or kernels.ref.RefKernels; models call only the methods listed in
kernels/__init__.py, so every backend runs every model. `sparse` is an ffn.SparseSettings (mode, threshold);
None means ffn.resolve_sparse(config): predictor mode for PWRI files, dense otherwise, the file's threshold.
"""
from __future__ import annotations

from typing import Mapping

from ..config import ModelConfig
from ..errors import UnsupportedError
from ..ffn import SparseSettings
from ..tensor import Tensor
from . import bamboo, falcon, gemma, gemma3, llama, opt, phi3, qwen2, qwen3
from . import exaone4, olmo2, smollm3
from . import granite
from . import gpt_oss
from . import arcee
from . import ernie4_5
from . import deepseek2
from . import glm4
from . import lfm2
from . import mistral3
from . import gemma4
from . import gemma3n
from . import smallthinker
from . import qwen35, qwen3next
from . import nemotron_h
from . import granitehybrid
from . import command_r
from . import afmoe, bailingmoe2
from . import falcon_h1
from . import minicpm, olmoe
from . import apertus, hunyuan_dense, seed_oss
from . import llama4
from . import exaone, internlm2
from . import ln_decoder
from .base import Expected, Model

_FAMILIES = {
    "llama": (llama.LlamaModel, llama.expected_tensors),
    "qwen2": (qwen2.Qwen2Model, qwen2.expected_tensors),
    "qwen3": (qwen3.Qwen3Model, qwen3.expected_tensors),
    "qwen2moe": (qwen2.Qwen2Model, qwen2.expected_tensors),  # the same blocks with experts (base.build_moe)
    "qwen3moe": (qwen3.Qwen3Model, qwen3.expected_tensors),
    "gemma": (gemma.GemmaModel, gemma.expected_tensors),
    "gemma2": (gemma.Gemma2Model, gemma.expected_tensors),
    "gemma3": (gemma3.Gemma3Model, gemma3.expected_tensors),
    "bamboo": (bamboo.BambooModel, bamboo.expected_tensors),
    "falcon": (falcon.FalconModel, falcon.expected_tensors),
    "opt": (opt.OptModel, opt.expected_tensors),
    "phi3": (phi3.Phi3Model, phi3.expected_tensors),
    "smollm3": (smollm3.SmolLM3Model, smollm3.expected_tensors),
    "olmo2": (olmo2.Olmo2Model, olmo2.expected_tensors),
    "exaone4": (exaone4.Exaone4Model, exaone4.expected_tensors),
    "granite": (granite.GraniteModel, granite.expected_tensors),
    "granitemoe": (granite.GraniteModel, granite.expected_tensors),  # with experts (GraniteModel.build_moe)
    "gpt-oss": (gpt_oss.GptOssModel, gpt_oss.expected_tensors),
    "arcee": (arcee.ArceeModel, arcee.expected_tensors),
    "ernie4_5": (ernie4_5.ErnieModel, ernie4_5.expected_tensors),
    "ernie4_5-moe": (ernie4_5.ErnieModel, ernie4_5.expected_tensors),  # leading dense layers, then experts
    "deepseek2": (deepseek2.DeepSeek2Model, deepseek2.expected_tensors),  # MLA + leading dense layers, experts
    "glm4": (glm4.Glm4Model, glm4.expected_tensors),  # sandwich norms, fused gate+up, partial RoPE
    "glm4moe": (glm4.Glm4Model, glm4.expected_tensors),  # leading dense layers, sigmoid-routed experts
    "lfm2": (lfm2.Lfm2Model, lfm2.expected_tensors),  # gated short-convolution layers + attention layers
    "lfm2moe": (lfm2.Lfm2Model, lfm2.expected_tensors),  # the same with leading dense layers, then experts
    "mistral3": (mistral3.Mistral3Model, mistral3.expected_tensors),  # llama + attention temperature
    "gemma4": (gemma4.Gemma4Model, gemma4.expected_tensors),  # per-layer shapes, shared K/V, per-layer embeddings
    "smallthinker": (smallthinker.SmallThinkerModel, smallthinker.expected_tensors),  # ReLU experts, NoPE + SWA
    "qwen35": (qwen35.Qwen35Model, qwen35.expected_tensors),  # gated delta-net layers + gated attention layers
    "qwen35moe": (qwen35.Qwen35Model, qwen35.expected_tensors),  # the same with experts and a shared expert
    "qwen3next": (qwen3next.Qwen3NextModel, qwen3next.expected_tensors),  # qwen35moe with fused projections
    "nemotron_h": (nemotron_h.NemotronHModel, nemotron_h.expected_tensors),  # Mamba-2 mixers + attention + FFNs
    "nemotron_h_moe": (nemotron_h.NemotronHModel, nemotron_h.expected_tensors),  # the same, expert FFN layers
    "mamba2": (nemotron_h.NemotronHModel, nemotron_h.expected_tensors),  # the same with every layer a mixer
    "granitehybrid": (granitehybrid.GraniteHybridModel, granitehybrid.expected_tensors),  # mixers + attention, granite FFNs
    "falcon-h1": (falcon_h1.FalconH1Model, falcon_h1.expected_tensors),  # attention + Mamba-2 mixer on every layer
    "gemma3n": (gemma3n.Gemma3nModel, gemma3n.expected_tensors),  # AltUp streams, LAuReL, top-k sparse FFNs
    "command-r": (command_r.CohereModel, command_r.expected_tensors),  # LayerNorm, parallel attention + FFN, logit scale
    "cohere2": (command_r.CohereModel, command_r.expected_tensors),  # the same, windowed RoPE layers + NoPE global ones
    "bailingmoe2": (bailingmoe2.BailingMoe2Model, bailingmoe2.expected_tensors),  # Ling 2.0: fused QKV, grouped sigmoid experts
    "afmoe": (afmoe.AfmoeModel, afmoe.expected_tensors),  # Trinity: gated attention, post-norms, SWA + NoPE, experts
    "minicpm": (minicpm.MiniCPMModel, minicpm.expected_tensors),  # granite's scalars (MiniCPM defaults), LongRoPE
    "minicpm3": (minicpm.MiniCPM3Model, minicpm.expected_tensors_3),  # deepseek2's MLA, dense FFN, fixed scalars
    "olmoe": (olmoe.OlmoeModel, olmoe.expected_tensors),  # whole-width Q/K norms, softmax experts
    "hunyuan-dense": (hunyuan_dense.HunyuanDenseModel, hunyuan_dense.expected_tensors),  # Q/K norms after RoPE
    "apertus": (apertus.ApertusModel, apertus.expected_tensors),  # Q/K norms, xIELU FFN (ungated)
    "seed_oss": (seed_oss.SeedOssModel, seed_oss.expected_tensors),  # q/k/v biases, post_attention_norm as FFN norm
    "llama4": (llama4.Llama4Model, llama4.expected_tensors),  # chunked + NoPE attention, interleaved MoE layers
    "exaone": (exaone.ExaoneModel, exaone.expected_tensors),  # llama block, NeoX RoPE, optional rope_freqs
    "internlm2": (internlm2.InternLM2Model, internlm2.expected_tensors),  # llama block, untied head
    "phi2": (ln_decoder.LnDecoderModel, ln_decoder.expected_tensors),  # LayerNorm + biases, parallel, partial RoPE
    "stablelm": (ln_decoder.LnDecoderModel, ln_decoder.expected_tensors),  # LayerNorm, SwiGLU, optional Q/K norms
    "starcoder2": (ln_decoder.LnDecoderModel, ln_decoder.expected_tensors),  # LayerNorm + biases, GELU, sequential
    "gpt2": (ln_decoder.LnDecoderModel, ln_decoder.expected_tensors),  # starcoder2's block, learned positions, no RoPE
}
# families that read PWRI files (predictors, down_t); the qwen2, qwen3 and gemma ones come from
# `powerinfer train-predictor` (SwiGLU/GeGLU predictors, ffn.py predictor mode)
_SPARSE_FAMILIES = ("llama", "bamboo", "falcon", "opt", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "lfm2")


def _family(config: ModelConfig):
    try:
        return _FAMILIES[config.arch]
    except KeyError:
        raise UnsupportedError(f"no model for architecture {config.arch!r}; runnable: "
                               f"{', '.join(_FAMILIES)}") from None


def build_model(config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                sparse: SparseSettings | None = None) -> Model:
    """Every family builds its FFNs from ffn.FFN, so every model accepts the sparse modes its FFN variant
    supports (ffn.resolve_sparse says which); only the PWRI families read predictor files."""
    cls = _family(config)[0]
    if config.is_sparse and config.arch not in _SPARSE_FAMILIES:
        raise UnsupportedError(f"architecture {config.arch!r} has no PowerInfer (PWRI) variant; PWRI files "
                               f"exist for {', '.join(_SPARSE_FAMILIES)}")
    return cls(config, tensors, kernels, sparse)


def expected_tensors(config: ModelConfig) -> Expected:
    return _family(config)[1](config)


__all__ = ["Model", "build_model", "expected_tensors"]
