"""ArchSpec: what the runtime knows about one GGUF architecture, as data, in one place.

Every module of models/ that runs an architecture defines SPEC (the architecture of its own name) and, when it
runs more than one, VARIANTS (the others: gemma.py runs gemma and gemma2); models/__init__.py finds them by
name. Code outside models/ never tests an architecture's name: it reads a field of its spec
(models.spec_for(config.arch)).

The hooks let an architecture read its own metadata keys at the point of config.read where they are needed;
each gets the config.MetaReader r and the draft d (a dict of ModelConfig fields read so far, which it may
change and add to; keys starting with "_" are handed between an architecture's own hooks and are not fields):
    layout(r, d)           after n_embd and n_layer: per-layer kinds and head counts (lfm2, qwen35, mamba2, ...);
                           may set n_head, n_head_kv, head_dim, n_ff, n_rot, attn_scale and the window fields
                           sliding_window, swa_layers, rope_freq_base_swa before the shared readers default them
    mla(r, d) -> dict      latent attention (deepseek2, minicpm3): ModelConfig fields plus "head_dim", the q/k
                           head width; the cache then holds one latent "KV head"
    rope_base(r, base, head_dim) -> float   the RoPE base from the file's base (hunyuan-dense's NTK alpha)
    swa(r, n_layer, base) -> (window, per-layer flags, RoPE base of the window layers)
    read_args(r, d)        (a function of the module, not a field) after every shared field: the rest
    describe(c) -> [(label, text)]   extra rows of `powerinfer info` for a config dict (cli/info.py)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ArchSpec:
    name: str  # general.architecture of the files it runs
    model: type | None = None  # the models.base.Model subclass that runs it
    expected: Callable | None = None  # expected_tensors(config) -> {name: (shape, required)} (loader.check_expected)
    text_of: str = ""  # a vision-language file whose text model is this arch's (qwen3vl: "qwen3"); keys stay {name}.*
    mrope_check: bool = False  # text_of files: refuse M-RoPE sections that leave rotated pairs out (config.read)
    # attention, positions and norms
    rope_neox: bool = False  # llama.cpp's NeoX rope type: pairs (i, i + n_rot/2); else (2i, 2i + 1)
    rope: bool = True  # False: learned positions, rope.dimension_count defaults to 0 (opt, gpt2)
    rope_base: float = 10_000.0  # default of {arch}.rope.freq_base
    yarn: bool = False  # rope.scaling.type "yarn" is accepted (per-pair factors and a scale: models/base.py)
    longrope: bool = False  # rope.scaling.type "longrope" is accepted (its factors are tensors: minicpm)
    layer_norm: bool = False  # LayerNorm: the eps is attention.layer_norm_epsilon (else layer_norm_rms_epsilon)
    sqrt_embd_scale: bool = False  # embeddings multiplied by sqrt(n_embd) (the Gemma family)
    nextn: bool = False  # {arch}.nextn_predict_layers trailing multi-token-prediction blocks are in the file, not run
    # FFN
    hidden_act: str = "silu"  # default of powerinfer.hidden_act (config.HIDDEN_ACTS)
    hidden_act_pwri: str = ""  # the default in a PowerInfer (PWRI) file ("": hidden_act)
    ffn_variant: str = ""  # the FFN variant whatever hidden_act says (ffn.ffn_variant); "": from hidden_act
    ungated_ffn: bool = False  # act(Wup·x) without a gate: hidden_act must be relu or gelu
    pwri: bool = False  # PowerInfer (PWRI) files of this arch exist and run (predictors, ffn_down_t)
    relu_experts: bool = False  # its experts are ReLU-gated: sparse mode "exact" runs them (moe.py)
    topk_ffn: bool = False  # GeGLU FFNs with their own Gaussian top-k: "exact" skips the zeroed up rows (gemma3n)
    # mixture of experts (config.MetaReader.experts)
    moe: bool = False  # every file has experts (else only files with {arch}.expert_count > dense_experts_max)
    moe_norm: bool | None = None  # the chosen experts' router weights are renormalized; None: experts not supported
    expert_width_key: str = "{arch}.expert_feed_forward_length"  # one expert's FFN width
    shared_expert: str = ""  # {arch}.expert_shared_feed_forward_length: "required", "optional" or "" (not read)
    dense_experts_max: int = 0  # an expert_count up to this means a dense FFN (hunyuan-dense: 1)
    # chat: the built-in format this arch suggests (chat/templates.default_builtin weighs it with the vocabulary)
    chat_format: str = ""
    # hooks (module docstring)
    layout: Callable | None = None
    mla: Callable | None = None
    rope_base_of: Callable | None = None
    swa: Callable | None = None
    describe: Callable | None = None
    parallel_mixer: bool = False  # every layer runs attention and a Mamba-2 mixer side by side (falcon-h1)

