"""ModelConfig: the hyperparameters of a model, read from GGUF metadata. With config_archs.py, the only place
metadata keys are spelled.

Keys follow llama.cpp's names ({arch} is general.architecture); defaults are llama.cpp's where it has one.
Per architecture: config_archs.py (its docstring lists every architecture and the keys it reads).
Mixture of experts (qwen3moe, qwen2moe, and llama files with experts: Mixtral): {arch}.expert_count experts, of
which {arch}.expert_used_count run per token; each expert's FFN width is {arch}.expert_feed_forward_length
(llama files: feed_forward_length); qwen2moe's shared expert is {arch}.expert_shared_feed_forward_length wide.
Router weights are renormalized over the chosen experts for llama, qwen3moe and granitemoe, not for qwen2moe, as
llama.cpp does (moe.py has the arithmetic).
PowerInfer files (magic PWRI) add is_sparse, powerinfer.sparse_threshold and per-layer predictor ranks.
FFN activation (hidden_act, written by our converter as powerinfer.hidden_act / powerinfer.hidden_act_param):
"silu", "relu", "fatrelu" (x if x > hidden_act_param else 0) or "gelu". Defaults when the key is absent:
llama "relu" in a PWRI file (upstream PowerInfer files carry no key and are ReLU models) else "silu";
falcon "relu" in a PWRI file (ReluFalcon) else "gelu" (llama.cpp's Falcon); opt, bamboo and arcee "relu"
(bamboo's FFN is dReLU and arcee's squared ReLU whatever the key says).
The sparse threshold here is the file's; the runtime applies the LLAMA_SPARSE_PRED_THRESHOLD environment
variable and the caller's override on top of it (ffn.resolve_sparse).
Threshold calibration (written by `powerinfer calibrate`, any file; read by the "threshold" sparse mode, see
threshold.py): KEY_SPARSITY (f32, the fraction of FFN neurons the stored thresholds skip),
KEY_FFN_THRESHOLDS (f32 [n_layer], per-layer cut-offs on |act(gate)|) and KEY_FFN_QUANTILES (f32
[n_layer * (QUANTILE_STEPS + 1)], per layer the |act(gate)| quantiles at 0, 1/QUANTILE_STEPS, ..., 1, from
which a run at another sparsity interpolates its thresholds). Files calibrated with neuron scales also hold
KEY_FFN_NEURON_SCALES + "<layer>" (f32 [n_ff] per layer): the per-neuron factor c_i of the score |act_i| * c_i
that the thresholds and quantiles then apply to (threshold.py); without them the score is |act_i| itself.
Two-stage files (`calibrate`'s default, or `--up-sparsity`) also hold KEY_UP_SPARSITY (f32, the fraction of up
rows skipped) and KEY_FFN_UP_THRESHOLDS (f32 [n_layer], cut-offs on that score picking the candidates whose up row
is read); their KEY_FFN_THRESHOLDS then cut |h_i| = |act_i * (up_i·x)| among the candidates. Their quantile
table, when present, holds per layer and grid sparsity s the |h| cut-off and KEY_FFN_UP_QUANTILES (same shape) the
candidate cut-off for up sparsity s * KEY_UP_SPARSITY / KEY_SPARSITY; files written before those tables run at
their one sparsity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import ModelFileError, UnsupportedError
from .config_archs import GLM_ARCHS, GPTOSS_SWA_PERIOD, ArchKeys
from .config_cohere import cohere2_swa, cohere_keys
from .config_bailing import afmoe_swa, ling_trinity_keys
from .config_gemma3n import Gemma3nLayout, gemma3n_keys
from .config_gemma4 import Gemma4Layout, gemma4_keys
from .config_mamba2 import mamba2_keys, nemotron_moe_keys
from .config_minicpm import MINICPM_ARCHS, minicpm3_mla, minicpm_keys
from .config_llama_variants import apertus_keys, hunyuan_rope_base
from .config_llama4 import Llama4Layout, llama4_keys
from .gguf.reader import GGUFFile

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma", "gemma2", "gemma3", "bamboo", "falcon",
                   "opt", "phi3", "granite", "granitemoe", "gpt-oss", "ernie4_5", "ernie4_5-moe", "deepseek2", "arcee",
                   "glm4", "glm4moe", "smollm3", "olmo2", "lfm2", "lfm2moe", "mistral3", "gemma4", "smallthinker", "qwen35",
                   "qwen35moe", "qwen3next",
                   "exaone4",
                   "nemotron_h", "mamba2", "granitehybrid", "nemotron_h_moe", "falcon-h1",
                   "gemma3n",
                   "command-r", "cohere2",
                   "bailingmoe2", "afmoe",
                   "minicpm", "minicpm3", "olmoe",
                   "hunyuan-dense", "apertus", "seed_oss",  # config_llama_variants.py
                   "llama4",
                   "exaone", "internlm2",  # exaone, internlm2: llama blocks under their own names
                   "phi2", "stablelm", "starcoder2", "gpt2")  # models/ln_decoder.py
# always mixture-of-experts (llama files are when they carry expert_count; ernie4_5-moe, deepseek2 and glm4moe
# have leading dense layers: ModelConfig.moe_layers)
MOE_ARCHS = ("qwen2moe", "qwen3moe", "granitemoe", "gpt-oss", "ernie4_5-moe", "deepseek2", "glm4moe", "lfm2moe",
             "smallthinker", "qwen35moe", "qwen3next", "nemotron_h_moe", "bailingmoe2", "afmoe", "olmoe", "llama4")
# whether the chosen experts' router weights are renormalized (as llama.cpp does per arch); gpt-oss's weights are a
# softmax over the chosen logits (moe.py); deepseek2 and glm4moe read it from {arch}.expert_weights_norm
_MOE_NORM_WEIGHTS = {"llama": True, "mistral3": True, "qwen3moe": True, "qwen2moe": False, "granitemoe": True, "granitehybrid": True, "gpt-oss": False,
                     "ernie4_5-moe": True, "deepseek2": False, "glm4moe": False,
                     "lfm2moe": True, "smallthinker": True, "qwen35moe": True,
                     "qwen3next": True, "gemma4": True, "nemotron_h_moe": False,
                     "bailingmoe2": False, "afmoe": False,
                     "minicpm": True, "olmoe": False, "llama4": False}  # nemotron_h_moe, bailingmoe2, afmoe: a key
# vision-language models whose GGUF text model is an existing arch under its own name: with text-only input every
# M-RoPE section rotates by the same position, which is that arch's RoPE when the sections cover the rotated
# pairs (checked against llama.cpp: tests/test_vl_text.py). Keys are read under the file's name ({arch}).
TEXT_ALIASES = {"qwen2vl": "qwen2", "qwen3vl": "qwen3", "qwen3vlmoe": "qwen3moe"}
GEMMA_ARCHS = ("gemma", "gemma2", "gemma3", "gemma4", "gemma3n")  # scaled embeddings, GeGLU FFN, the "gemma" chat format
# llama.cpp's NeoX rope type (pairs (i, i + n_rot/2)); the others rotate pairs (2i, 2i + 1)
_NEOX_ARCHS = {"qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma", "gemma2", "gemma3", "falcon", "phi3", "olmo2",
               "gpt-oss", "glm4moe", "lfm2", "lfm2moe", "gemma4", "smallthinker", "exaone4", "gemma3n",
               "qwen35", "qwen35moe", "qwen3next", "bailingmoe2", "afmoe",
               "falcon-h1", "minicpm3", "olmoe",
               "hunyuan-dense", "apertus", "seed_oss", "exaone",
               "phi2", "stablelm", "starcoder2"}  # qwen35: text M-RoPE is NeoX RoPE (config_archs.qwen35)
# their models take per-pair RoPE factors and a scale (models/base.py)
_YARN_ARCHS = ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gpt-oss", "arcee", "deepseek2", "mistral3",
               "olmo2", "hunyuan-dense", "apertus", "seed_oss", "exaone", "internlm2")
# layer_norm_epsilon instead of layer_norm_rms_epsilon
_LAYERNORM_ARCHS = {"falcon", "opt", "command-r", "cohere2", "phi2", "stablelm", "starcoder2", "gpt2"}
_DEFAULT_FREQ_BASE = {"qwen2": 1_000_000.0, "qwen2moe": 1_000_000.0}
HIDDEN_ACTS = ("silu", "relu", "fatrelu", "gelu")
GEMMA3_SWA_PERIOD = 6  # every 6th layer (il % 6 == 5) is global
GEMMA3_FREQ_BASE_SWA = 10_000.0
GEMMA2_SWA_PERIOD = 2  # layers il % 2 == 0 attend within the window, odd layers globally
GEMMA2_SLIDING_WINDOW = 4096
GEMMA2_ATTN_SOFTCAP = 50.0
GEMMA2_FINAL_SOFTCAP = 30.0
KEY_SPARSITY = "powerinfer.sparsity"
KEY_FFN_THRESHOLDS = "powerinfer.ffn_thresholds"
KEY_FFN_QUANTILES = "powerinfer.ffn_threshold_quantiles"
KEY_FFN_NEURON_SCALES = "powerinfer.ffn_neuron_scales."  # + layer index: f32 [n_ff] per layer
KEY_UP_SPARSITY = "powerinfer.up_sparsity"
KEY_FFN_UP_THRESHOLDS = "powerinfer.ffn_up_thresholds"
KEY_FFN_UP_QUANTILES = "powerinfer.ffn_up_threshold_quantiles"
MAX_BLOCKS = 512  # llama.cpp's LLAMA_MAX_LAYERS: a larger block_count needs the tensors to back it
QUANTILE_STEPS = 100  # quantile grid of KEY_FFN_QUANTILES: 101 points per layer


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    name: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    norm_eps: float
    rope_freq_base: float
    rope_freq_scale: float  # 1 / linear scaling factor; for gemma3 it applies to the global layers only
    n_rot: int  # leading dims of each head that RoPE rotates (0: no RoPE, as in opt)
    rope_neox: bool  # True: rotate pairs (i, i + n_rot/2); False: pairs (2i, 2i + 1)
    rope_freq_base_swa: float  # RoPE base of the sliding-window layers (equals rope_freq_base when none)
    sliding_window: int  # tokens a sliding-window layer attends to (0 = none)
    swa_layers: tuple[bool, ...]  # per layer: True = sliding-window layer
    attn_scale: float
    embd_scale: float
    tied_output: bool  # no output.weight: logits use token_embd.weight
    is_sparse: bool
    sparse_threshold: float
    predictor_ranks: tuple[int, ...]  # per layer rows of blk.N.fc1.weight; () for dense models
    hidden_act: str = "silu"  # FFN activation, one of HIDDEN_ACTS (see the module docstring)
    hidden_act_param: float = 0.0  # fatrelu's cut-off: the activation is x if x > param else 0
    calibrated_sparsity: float | None = None  # KEY_SPARSITY; None: the file has no threshold calibration
    ffn_thresholds: tuple[float, ...] = ()  # KEY_FFN_THRESHOLDS, per layer
    ffn_quantiles: tuple[tuple[float, ...], ...] = ()  # KEY_FFN_QUANTILES, per layer QUANTILE_STEPS + 1 values
    ffn_neuron_scales: tuple[tuple[float, ...], ...] = ()  # KEY_FFN_NEURON_SCALES, per layer n_ff values; () none
    ffn_up_thresholds: tuple[float, ...] = ()  # KEY_FFN_UP_THRESHOLDS, per layer (two-stage files); () none
    ffn_up_quantiles: tuple[tuple[float, ...], ...] = ()  # KEY_FFN_UP_QUANTILES, per layer as ffn_quantiles; () none
    rope_factors: tuple[float, ...] = ()  # YaRN: per-pair divisors of the RoPE frequencies [n_rot/2]; () none
    rope_mscale: float = 1.0  # YaRN: scale of the rotated dims of q and k (1: none)
    rope_orig_ctx: int = 0  # phi3, minicpm(3) LongRoPE: rope.scaling.original_context_length (default n_ctx_train); 0 for others
    rope_attn_factor: float = 1.0  # phi3: rope.scaling.attn_factor, multiplies the rotated dims of q and k
    attn_softcap: float = 0.0  # gemma2: attention scores s -> cap * tanh(s / cap) before the softmax; 0 = off
    final_softcap: float = 0.0  # gemma2: output logits l -> cap * tanh(l / cap); 0 = off
    n_expert: int = 0  # mixture of experts: experts per layer (0: a dense FFN)
    n_expert_used: int = 0  # experts each token runs
    n_ff_exp: int = 0  # one expert's FFN width
    n_ff_shexp: int = 0  # qwen2moe: the shared expert's FFN width (0: none)
    expert_weights_norm: bool = False  # the chosen experts' router weights are divided by their sum
    attn_temp_scale: float = 0.0  # mistral3: q scaled by 1 + attn_temp_scale * ln(floor(pos / attn_temp_floor) + 1)
    attn_temp_floor: int = 0  # mistral3: the position unit of that scaling (0: no scaling)
    no_rope_layers: tuple[bool, ...] = ()  # smollm3: per layer, True = no RoPE on q and k; () = RoPE everywhere
    residual_scale: float = 1.0  # granite: attention and FFN outputs are multiplied by it before the add (1: none)
    logit_scale: float = 1.0  # granite: logits are divided by it (1: none)
    logit_mul: float = 1.0  # command-r, cohere2: logits are multiplied by it (1: none; config_cohere.py)
    moe_layers: tuple[bool, ...] = ()  # per layer True = experts, False = a dense FFN; () = all experts (n_expert)
    q_lora_rank: int = 0  # deepseek2: rank of the low-rank q (attn_q_a -> norm -> attn_q_b); 0 = a plain attn_q
    kv_lora_rank: int = 0  # deepseek2: width of the latent that attn_kv_a_mqa makes (the cache holds it)
    v_head_dim: int = 0  # deepseek2: per-head value width (head_dim is the q/k width)
    mla_kv_split: bool = False  # deepseek2: the file has attn_k_b / attn_v_b (True) or one attn_kv_b (False)
    expert_gating: str = "softmax"  # "softmax" or "sigmoid" (deepseek2 V3): router scores (moe.py)
    expert_weights_scale: float = 1.0  # the chosen experts' weights are multiplied by it (deepseek2)
    n_expert_groups: int = 0  # deepseek2 group-limited routing: groups of experts (0: none)
    n_expert_group_used: int = 0  # groups whose experts may be chosen
    moe_latent_size: int = 0  # nemotron_h_moe: the experts' input/output width when the layer has latent projections
    n_nextn: int = 0  # glm4, glm4moe, qwen35(moe): trailing next-token-prediction blocks in the file, not run (not in n_layer)
    conv_layers: tuple[bool, ...] = ()  # lfm2: per layer True = gated short convolution, False = attention
    conv_kernel: int = 0  # lfm2, qwen35: the convolution's length in tokens (shortconv.l_cache, ssm.conv_kernel)
    delta_layers: tuple[bool, ...] = ()  # qwen35: per layer True = gated delta net, False = gated attention
    ssm_d_state: int = 0  # qwen35: the width of a delta-net key head and value head (ssm.state_size)
    ssm_n_k_heads: int = 0  # qwen35: delta-net query/key heads (ssm.group_count)
    ssm_n_v_heads: int = 0  # qwen35: delta-net value heads (ssm.time_step_rank), a multiple of ssm_n_k_heads
    gemma4: Gemma4Layout | None = None  # gemma4: the per-layer shapes, RoPE and K/V sharing (config_gemma4.py)
    mamba_layers: tuple[bool, ...] = ()  # nemotron_h: per layer True = a Mamba-2 mixer (config_mamba2.py)
    ffn_layers: tuple[bool, ...] = ()  # nemotron_h: per layer True = an FFN-only layer (neither mixer nor attention)
    ssm_d_inner: int = 0  # Mamba-2: the mixer's inner width (heads x head width)
    ssm_n_group: int = 0  # Mamba-2: groups of B and C (each serves ssm_n_v_heads / ssm_n_group heads)
    gemma3n: Gemma3nLayout | None = None  # gemma3n: AltUp, K/V sharing, top-k sparsity (config_gemma3n.py)
    xielu: tuple[tuple[float, float, float, float], ...] = ()  # apertus: per layer xIELU (alpha_n, alpha_p, beta, eps)
    llama4: Llama4Layout | None = None  # llama4: chunked / NoPE layers, q/k norm, temperature (config_llama4.py)

    def is_moe_layer(self, il: int) -> bool:
        """Whether layer il's FFN is a mixture of experts (ernie4_5-moe's leading layers are dense)."""
        return bool(self.n_expert) and (not self.moe_layers or self.moe_layers[il])

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "ModelConfig":
        """Read the config of `f`; an architecture outside SUPPORTED_ARCHS is an UnsupportedError."""
        return _Reader(f).config()


def yarn_rope(n_rot: int, freq_base: float, factor: float, n_ctx_orig: int, attn_factor: float = 1.0,
              beta_fast: float = 32.0, beta_slow: float = 1.0) -> tuple[tuple[float, ...], float]:
    """YaRN as llama.cpp computes it, in the form our RoPE takes: (per-pair divisors of the frequencies,
    scale of the rotated dims). Pairs that turn many times within the original context (those before the
    pair where a wavelength spans n_ctx_orig / beta_fast) keep their angle, pairs past the one where it spans
    n_ctx_orig / beta_slow are interpolated (angle / factor), and a linear ramp over the pairs in between
    blends the two; the angle is linear in the position either way, so each pair's blend is a fixed divisor.
    The rotated dims of q and k are scaled by attn_factor * (1 + 0.1 ln factor)."""
    if not (n_rot > 0 and freq_base > 0 and factor > 0 and n_ctx_orig > 0 and attn_factor > 0):
        raise ModelFileError(f"bad YaRN settings: n_rot {n_rot}, base {freq_base}, factor {factor}, "
                             f"original context {n_ctx_orig}, attn_factor {attn_factor}")

    def pair_at(n_turns: float) -> float:  # the (fractional) pair index whose wavelength is n_ctx_orig / n_turns
        return n_rot * math.log(n_ctx_orig / (n_turns * 2 * math.pi)) / (2 * math.log(freq_base))

    lo = max(0.0, math.floor(pair_at(beta_fast)))
    hi = min(n_rot - 1.0, math.ceil(pair_at(beta_slow)))
    scale = 1.0 / factor
    factors = []
    for i in range(n_rot // 2):
        keep = 1.0 - min(1.0, max(0.0, (i - lo) / max(0.001, hi - lo)))  # 1: original angle, 0: interpolated
        factors.append(1.0 / (scale * (1.0 - keep) + keep))
    return tuple(factors), attn_factor * (1.0 + 0.1 * math.log(factor))


class _Reader(ArchKeys):
    """Typed access to one file's metadata, with errors that name the file and the key."""

    def __init__(self, f: GGUFFile):
        self.f = f
        self.meta = f.metadata
        self.arch = ""  # the architecture whose behaviour runs (TEXT_ALIASES mapped)
        self.key_arch = ""  # the file's general.architecture, which names its keys

    def key(self, suffix: str) -> str:
        return suffix.format(arch=self.key_arch or self.arch)

    def get(self, suffix: str, default: Any = None, *, kind: type = int) -> Any:
        """The value of key `suffix` ({arch} filled in) as `kind`; `default` when absent (None = required).
        Per-layer arrays (some files store head counts or n_ff per layer) must hold one value."""
        key = self.key(suffix)
        if key not in self.meta:
            if default is None:
                raise ModelFileError(f"{self.f.path}: missing required metadata key {key!r}")
            return default
        value = self.meta[key]
        if isinstance(value, list) and value and kind is not str:
            if len(set(value)) != 1:
                raise UnsupportedError(f"{self.f.path}: {key} differs between layers ({value[:8]}...); "
                                       "per-layer values are not supported")
            value = value[0]
        ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              str: lambda v: isinstance(v, str)}[kind](value)
        if not ok:
            raise ModelFileError(f"{self.f.path}: metadata key {key!r} should be {kind.__name__}, got {value!r}")
        return kind(value)

    def positive(self, suffix: str, default: Any = None) -> int:
        value = self.get(suffix, default)
        if value <= 0:
            raise ModelFileError(f"{self.f.path}: metadata key {self.key(suffix)!r} must be positive, got {value}")
        return value

    def block_count(self) -> int:
        """{arch}.block_count, refused when it exceeds both the blocks present (1 + the highest N of the blk.N
        tensors) and llama.cpp's own limit of MAX_BLOCKS: per-layer tables are sized by it before any tensor is
        looked up, so a count like 2**32 - 1 would exhaust memory first. A smaller shortfall is left to the
        tensor checks, which name the first missing tensor."""
        n_layer = self.positive("{arch}.block_count")
        present = 1 + max((int(name.split(".", 2)[1]) for name in self.f.tensors
                           if name.startswith("blk.") and name.split(".", 2)[1].isdigit()), default=-1)
        if n_layer > max(present, MAX_BLOCKS):
            held = f"tensors for blocks 0..{present - 1} only" if present else "no blk.N tensors"
            raise ModelFileError(f"{self.f.path}: metadata key {self.key('{arch}.block_count')!r} is {n_layer}, "
                                 f"but the file holds {held}")
        return n_layer

    def real(self, suffix: str, value: float, *, positive: bool) -> float:
        """`value`, read from key `suffix`, if finite and > 0 (positive) or >= 0; else a ModelFileError naming the
        key. A RoPE base of 0 or NaN, or a NaN or negative norm epsilon, would otherwise fail deep in the
        kernels (the frequencies are base ** (-2i / n_rot); the norms divide by sqrt(mean + eps))."""
        if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
            raise ModelFileError(f"{self.f.path}: metadata key {self.key(suffix)!r} must be a finite number "
                                 f"{'> 0' if positive else '>= 0'}, got {value}")
        return value

    def architecture(self) -> str:
        arch = self.get("general.architecture", kind=str)
        if arch in TEXT_ALIASES:
            self.key_arch = arch
            return TEXT_ALIASES[arch]
        if arch not in SUPPORTED_ARCHS:
            raise UnsupportedError(f"{self.f.path}: architecture {arch!r} is not supported; supported: "
                                   f"{', '.join(SUPPORTED_ARCHS + tuple(TEXT_ALIASES))}")
        return arch

    def mrope_sections(self, n_rot: int) -> None:
        """Text-only input of a TEXT_ALIASES file: refuse M-RoPE sections that leave rotated pairs out (llama.cpp
        then rotates those by another position component, which the aliased arch cannot)."""
        sections = self.meta.get(self.key("{arch}.rope.dimension_sections"))
        if self.key_arch in ("qwen3vl", "qwen3vlmoe") and isinstance(sections, list) and \
                sum(int(v) for v in sections) != n_rot // 2:
            raise UnsupportedError(f"{self.f.path}: {self.key('{arch}.rope.dimension_sections')} {sections} does not "
                                   f"cover the {n_rot // 2} rotated pairs of a head")

    def n_vocab(self) -> int:
        tokens = self.meta.get("tokenizer.ggml.tokens")
        if self.key("{arch}.vocab_size") in self.meta:
            n_vocab = self.positive("{arch}.vocab_size")
            # the tokenizer would produce ids that token_embd.weight (n_vocab rows, checked) has no row for
            if isinstance(tokens, list) and len(tokens) > n_vocab:
                raise ModelFileError(f"{self.f.path}: the vocabulary (tokenizer.ggml.tokens) has {len(tokens)} "
                                     f"tokens, more than {self.key('{arch}.vocab_size')} = {n_vocab}, the rows of "
                                     "token_embd.weight")
            return n_vocab
        if isinstance(tokens, list) and tokens:
            return len(tokens)
        embd = self.f.tensors.get("token_embd.weight")
        if embd is not None:
            return embd.shape[0]
        raise ModelFileError(f"{self.f.path}: cannot tell the vocabulary size: no {self.key('{arch}.vocab_size')}, "
                             "tokenizer.ggml.tokens or token_embd.weight")

    def rope_scaling(self, n_rot: int, freq_base: float, n_ctx_train: int) -> tuple[float, tuple, float]:
        """(rope_freq_scale, rope_factors, rope_mscale) from {arch}.rope.scaling.*: none and linear scale the
        frequencies; yarn (llama, qwen2, qwen3) becomes per-pair factors and a scale of the rotated dims."""
        scaling = self.get("{arch}.rope.scaling.type", "none", kind=str)
        if scaling == "linear" or scaling == "yarn":
            factor = self.get("{arch}.rope.scaling.factor", kind=float)
        elif scaling == "longrope" and self.arch in MINICPM_ARCHS:  # factors are tensors (config_minicpm.py)
            factor = self.get("{arch}.rope.scaling.factor", 1.0, kind=float)
        elif scaling == "none":
            factor = self.get("{arch}.rope.scale_linear", 1.0, kind=float)  # older files
        else:
            raise UnsupportedError(f"{self.f.path}: RoPE scaling {scaling!r} is not supported (none, linear, yarn)")
        if not factor > 0:
            raise ModelFileError(f"{self.f.path}: RoPE scaling factor must be positive, got {factor}")
        if scaling != "yarn":
            return 1.0 / factor, (), 1.0
        if self.arch not in _YARN_ARCHS:
            raise UnsupportedError(f"{self.f.path}: YaRN RoPE scaling is supported for {', '.join(_YARN_ARCHS)}, "
                                   f"not {self.arch}")
        factors, mscale = yarn_rope(
            n_rot, freq_base, factor, self.positive("{arch}.rope.scaling.original_context_length", n_ctx_train),
            self.get("{arch}.rope.scaling.attn_factor", 1.0, kind=float),
            self.get("{arch}.rope.scaling.yarn_beta_fast", 32.0, kind=float),
            self.get("{arch}.rope.scaling.yarn_beta_slow", 1.0, kind=float))
        return 1.0, factors, mscale

    def swa(self, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
        """(sliding_window, swa_layers, rope_freq_base_swa) of gemma2 and gemma3 (see the module docstring)."""
        if self.arch == "gpt-oss":
            base_swa = self.get("{arch}.rope.freq_base_swa", rope_freq_base, kind=float)
            if base_swa != rope_freq_base:
                raise UnsupportedError(f"{self.f.path}: a gpt-oss file whose sliding-window layers have their own "
                                       f"RoPE base ({base_swa} vs {rope_freq_base}) is not supported")
            return (self.positive("{arch}.attention.sliding_window"),
                    tuple(il % GPTOSS_SWA_PERIOD != GPTOSS_SWA_PERIOD - 1 for il in range(n_layer)), rope_freq_base)
        if self.arch == "smallthinker":
            return self.smallthinker_swa(n_layer, rope_freq_base)
        if self.arch == "olmo2":  # OLMo 3: a window on 3 of every 4 layers (llama.cpp's default pattern), if any
            return self.olmo3_swa(n_layer, rope_freq_base)
        if self.arch == "cohere2":  # config_cohere.py
            return cohere2_swa(self, n_layer, rope_freq_base)
        if self.arch == "exaone4":  # windows on the 64-layer (32B) files only, as llama.cpp decides
            return self.exaone4_swa(n_layer, rope_freq_base)
        if self.arch == "afmoe":  # Trinity: 3 windowed layers, then 1 global (config_bailing.py)
            return afmoe_swa(self, n_layer, rope_freq_base)
        if self.arch not in ("gemma2", "gemma3"):
            return 0, (False,) * n_layer, rope_freq_base
        gemma2 = self.arch == "gemma2"
        if not gemma2 and self.get("{arch}.attention.sliding_window", 0) <= 0:  # gemma3 without windows (as llama.cpp)
            return 0, (False,) * n_layer, rope_freq_base
        window = self.positive("{arch}.attention.sliding_window", GEMMA2_SLIDING_WINDOW if gemma2 else None)
        pattern = self.meta.get(self.key("{arch}.attention.sliding_window_pattern"))
        if isinstance(pattern, list) and len(pattern) == n_layer:
            layers = tuple(bool(p) for p in pattern)
        else:
            default = GEMMA2_SWA_PERIOD if gemma2 else GEMMA3_SWA_PERIOD
            period = pattern if isinstance(pattern, int) and pattern > 0 else default
            layers = tuple(il % period != period - 1 for il in range(n_layer))
        base_swa = rope_freq_base if gemma2 else GEMMA3_FREQ_BASE_SWA
        return window, layers, self.get("{arch}.rope.freq_base_swa", base_swa, kind=float)

    def softcaps(self) -> dict:
        """gemma2's attention and final logit soft-caps (ModelConfig.attn_softcap, final_softcap), gemma3's optional
        final one; {} otherwise."""
        if self.arch == "gemma3":  # optional here (llama.cpp: absent or 0 = none; released files have none)
            cap = self.get("{arch}.final_logit_softcapping", 0.0, kind=float)
            if not (math.isfinite(cap) and cap >= 0):
                raise ModelFileError(f"{self.f.path}: {self.key('{arch}.final_logit_softcapping')} must be a finite "
                                     f"number >= 0, got {cap}")
            return {"final_softcap": cap} if cap else {}
        if self.arch != "gemma2":
            return {}
        out = {}
        for field, suffix, default in (("attn_softcap", "{arch}.attn_logit_softcapping", GEMMA2_ATTN_SOFTCAP),
                                       ("final_softcap", "{arch}.final_logit_softcapping", GEMMA2_FINAL_SOFTCAP)):
            cap = self.get(suffix, default, kind=float)
            if not (math.isfinite(cap) and cap > 0):
                raise ModelFileError(f"{self.f.path}: metadata key {self.key(suffix)!r} must be a finite number > 0, "
                                     f"got {cap}")
            out[field] = cap
        return out

    def experts(self) -> dict:
        """The mixture-of-experts fields of ModelConfig (n_expert ...), or {} for a dense FFN."""
        n_expert = self.get("{arch}.expert_count", 0)
        if self.arch not in MOE_ARCHS and (n_expert == 0 or self.arch == "hunyuan-dense" and n_expert <= 1):
            return {}
        if self.arch not in _MOE_NORM_WEIGHTS:
            raise UnsupportedError(f"{self.f.path}: mixture-of-experts {self.arch} files are not supported "
                                   f"(experts run for {', '.join(_MOE_NORM_WEIGHTS)})")
        if self.f.is_sparse:
            raise UnsupportedError(f"{self.f.path}: a PowerInfer (PWRI) file with experts is not supported")
        n_expert = self.positive("{arch}.expert_count")
        n_used = self.positive("{arch}.expert_used_count")
        if n_used > n_expert:
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.expert_used_count')} {n_used} exceeds "
                                 f"{self.key('{arch}.expert_count')} {n_expert}")
        width_key = ("{arch}.feed_forward_length" if self.arch in ("llama", "mistral3", "granitemoe", "granitehybrid",
                                                                   "minicpm", "olmoe")
                     else "{arch}.expert_feed_forward_length")
        shexp = (self.positive("{arch}.expert_shared_feed_forward_length") if self.arch in ("qwen2moe", "qwen35moe", "qwen3next") else
                 self.get("{arch}.expert_shared_feed_forward_length", 0)
                 if self.arch in ("granitemoe", "granitehybrid", "ernie4_5-moe") else 0)
        return {"n_expert": n_expert, "n_expert_used": n_used, "n_ff_exp": self.positive(width_key),
                "n_ff_shexp": shexp,
                "expert_weights_norm": _MOE_NORM_WEIGHTS[self.arch]}

    def predictor_ranks(self, n_layer: int) -> tuple[int, ...]:
        if not self.f.is_sparse:
            return ()
        ranks = []
        for il in range(n_layer):
            fc1 = self.f.tensors.get(f"blk.{il}.fc1.weight")
            if fc1 is None:
                raise ModelFileError(f"{self.f.path}: sparse (PWRI) model without predictor tensor "
                                     f"'blk.{il}.fc1.weight'")
            if len(fc1.shape) != 2 or fc1.shape[0] == 0:
                raise ModelFileError(f"{self.f.path}: predictor tensor 'blk.{il}.fc1.weight' has shape "
                                     f"{fc1.shape}: expected (rank, n_embd) with a rank of at least 1")
            ranks.append(fc1.shape[0])  # ne [n_embd, R] -> numpy shape (R, n_embd)
        return tuple(ranks)

    def hidden_act(self) -> tuple[str, float]:
        """(activation, fatrelu parameter) of the FFN, with the per-arch defaults of the module docstring."""
        defaults = {"llama": "relu" if self.f.is_sparse else "silu", "falcon": "relu" if self.f.is_sparse else "gelu",
                    "bamboo": "relu", "opt": "relu", "arcee": "relu", "phi2": "gelu", "starcoder2": "gelu", "gpt2": "gelu"}
        default = defaults.get(self.arch, "silu")
        act = self.get("powerinfer.hidden_act", default, kind=str)
        if act not in HIDDEN_ACTS:
            raise UnsupportedError(f"{self.f.path}: powerinfer.hidden_act {act!r} is not supported "
                                   f"({', '.join(HIDDEN_ACTS)})")
        param = self.get("powerinfer.hidden_act_param", 0.0, kind=float) if act == "fatrelu" else 0.0
        return act, param

    def calibration(self, n_layer: int) -> tuple[float | None, tuple[float, ...], tuple[tuple[float, ...], ...]]:
        """(calibrated sparsity, per-layer thresholds, per-layer quantile rows) or (None, (), ())."""
        if KEY_SPARSITY not in self.meta:
            return None, (), ()
        sparsity = self.get(KEY_SPARSITY, kind=float)
        if not 0.0 <= sparsity < 1.0:
            raise ModelFileError(f"{self.f.path}: {KEY_SPARSITY} must be in [0, 1), got {sparsity}")
        thresholds = self._floats(KEY_FFN_THRESHOLDS, n_layer)
        n_q = QUANTILE_STEPS + 1
        flat = self._floats(KEY_FFN_QUANTILES, n_layer * n_q) if KEY_FFN_QUANTILES in self.meta else ()
        return sparsity, thresholds, tuple(flat[i * n_q:(i + 1) * n_q] for i in range(len(flat) // n_q))

    def neuron_scales(self, n_layer: int, n_ff: int | tuple[int, ...]) -> tuple[tuple[float, ...], ...]:
        """Per-layer neuron scales of a threshold calibration (KEY_FFN_NEURON_SCALES), or () when absent; n_ff:
        the FFN width, or one per layer (gemma4)."""
        if not any(k.startswith(KEY_FFN_NEURON_SCALES) for k in self.meta):
            return ()
        widths = n_ff if isinstance(n_ff, tuple) else (n_ff,) * n_layer
        out = tuple(self._floats(f"{KEY_FFN_NEURON_SCALES}{il}", widths[il]) for il in range(n_layer))
        if any(v < 0 for row in out for v in row):
            raise ModelFileError(f"{self.f.path}: {KEY_FFN_NEURON_SCALES}* holds a negative scale")
        return out

    def up_thresholds(self, n_layer: int) -> tuple[float, ...]:
        """Per-layer candidate cut-offs of a two-stage calibration (KEY_FFN_UP_THRESHOLDS), or () when absent."""
        if KEY_FFN_UP_THRESHOLDS not in self.meta:
            return ()
        return self._floats(KEY_FFN_UP_THRESHOLDS, n_layer)

    def up_quantiles(self, n_layer: int) -> tuple[tuple[float, ...], ...]:
        """Per-layer candidate cut-off rows of a two-stage quantile table (KEY_FFN_UP_QUANTILES), or ()."""
        if KEY_FFN_UP_QUANTILES not in self.meta or KEY_FFN_UP_THRESHOLDS not in self.meta:
            return ()
        n_q = QUANTILE_STEPS + 1
        flat = self._floats(KEY_FFN_UP_QUANTILES, n_layer * n_q)
        return tuple(flat[i * n_q:(i + 1) * n_q] for i in range(n_layer))

    def _floats(self, key: str, n: int) -> tuple[float, ...]:
        value = self.meta.get(key)
        if (not isinstance(value, list) or len(value) != n
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise ModelFileError(f"{self.f.path}: metadata key {key!r} must be an array of {n} numbers"
                                 + ("" if key in self.meta else " (missing)"))
        out = tuple(float(v) for v in value)
        if not all(math.isfinite(v) for v in out):
            raise ModelFileError(f"{self.f.path}: metadata key {key!r} holds a non-finite value")
        return out

    def config(self) -> ModelConfig:
        self.arch = self.architecture()
        n_embd = self.positive("{arch}.embedding_length")
        n_layer = self.block_count()
        n_layer, glm = self.glm4(n_layer) if self.arch in GLM_ARCHS else (n_layer, {})
        if self.arch in ("qwen35", "qwen35moe", "qwen3next", "exaone4", "nemotron_h_moe", "bailingmoe2"):  # trailing MTP blocks: not run
            n_nextn = self.nextn_blocks(n_layer)
            n_layer, glm = n_layer - n_nextn, {"n_nextn": n_nextn}
        g4 = gemma4_keys(self, n_layer) if self.arch == "gemma4" else {}  # per-layer shapes: config_gemma4.py
        g3n = gemma3n_keys(self, n_layer) if self.arch == "gemma3n" else {}  # config_gemma3n.py
        # mamba2 files have no attention (head_count 0): one placeholder head
        n_head = g4.pop("_n_head") if g4 else (self.get("{arch}.attention.head_count", 0) or 1) if (
            self.arch == "mamba2") else self.positive("{arch}.attention.head_count")
        lfm2 = self.lfm2(n_layer, n_head)  # per-layer head counts: 0 marks a convolution layer
        qwen35 = self.qwen35(n_layer)  # delta-net layers and their sizes
        lfm2 = lfm2 or qwen35
        mamba2 = mamba2_keys(self, n_layer, n_head)  # mixer / attention / FFN layers and the mixer sizes
        lfm2 = lfm2 or mamba2
        n_head_kv = lfm2.pop("_n_head_kv") if lfm2 else g4.pop("_n_head_kv") if g4 else self.positive(
            "{arch}.attention.head_count_kv", n_head)
        if n_head % n_head_kv:
            raise ModelFileError(f"{self.f.path}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
        head_dim = g4.pop("_head_dim") if g4 else self.positive("{arch}.attention.key_length", n_embd // n_head)
        value_dim = self.positive("{arch}.attention.value_length", head_dim)
        mla = (self.deepseek2(n_layer, n_head) if self.arch == "deepseek2" else
               minicpm3_mla(self, n_embd, n_head) if self.arch == "minicpm3" else {})
        if mla:  # q/k heads of nope + rope dims; one latent "kv head" in the cache
            head_dim = value_dim = mla.pop("head_dim")  # (the value width is mla's v_head_dim)
            n_head_kv = 1
        if value_dim != head_dim:
            raise UnsupportedError(f"{self.f.path}: value_length {value_dim} != key_length {head_dim}")
        eps_key = "layer_norm_epsilon" if self.arch in _LAYERNORM_ARCHS else "layer_norm_rms_epsilon"
        freq_base = self.real("{arch}.rope.freq_base", self.get(
            "{arch}.rope.freq_base", _DEFAULT_FREQ_BASE.get(self.arch, 10_000.0), kind=float), positive=True)
        freq_base = hunyuan_rope_base(self, freq_base, head_dim) if self.arch == "hunyuan-dense" else freq_base
        window, swa_layers, freq_base_swa = self.swa(n_layer, freq_base)
        if g4:
            window, swa_layers, freq_base_swa = g4.pop("sliding_window"), g4.pop("swa_layers"), g4.pop("base_swa")
        if g3n:
            window, swa_layers, freq_base_swa = g3n.pop("sliding_window"), g3n.pop("swa_layers"), g3n.pop("base_swa")
        n_rot = self.get("{arch}.rope.dimension_count", 0 if self.arch in ("opt", "gpt2") else head_dim)
        if mamba2 and self.arch not in ("granitehybrid", "falcon-h1"):  # nemotron_h's attention: no RoPE
            n_rot = 0
            attn_scale_key = self.get("{arch}.attention.scale", 0.0, kind=float)
        if not 0 <= n_rot <= head_dim or n_rot % 2:
            raise ModelFileError(f"{self.f.path}: rope.dimension_count {n_rot} must be even and <= {head_dim}")
        self.mrope_sections(n_rot)
        attn_scale = 1.0 / math.sqrt(head_dim)
        if (self.arch, n_layer) in (("gemma3", 62), ("gemma2", 46)):  # the 27B models: 1/sqrt(n_embd / n_head)
            attn_scale = 1.0 / math.sqrt(n_embd / n_head)
        if g4 or g3n:  # the per-head Q norm scales the scores
            attn_scale = 1.0
        if mamba2 and self.arch not in ("granitehybrid", "falcon-h1") and attn_scale_key:
            attn_scale = attn_scale_key
        threshold = self.get("powerinfer.sparse_threshold", 0.0, kind=float) if self.f.is_sparse else 0.0
        hidden_act, hidden_act_param = self.hidden_act()
        calibrated, ffn_thresholds, ffn_quantiles = self.calibration(n_layer)
        moe = self.experts()
        if mla:  # deepseek2's renormalization and shared experts come from their own keys
            if self.arch == "deepseek2":
                moe.update(expert_weights_norm=mla.pop("_norm"), n_ff_shexp=moe["n_ff_exp"] * mla.pop("_n_shared"))
            if not 0 < n_rot < head_dim:
                raise ModelFileError(f"{self.f.path}: rope.dimension_count {n_rot} must leave 1..{head_dim - 1} "
                                     f"unrotated dims of the {head_dim}-wide q/k heads")
        if self.arch == "nemotron_h_moe":  # sigmoid routing, its own keys (config_mamba2.py)
            moe.update(nemotron_moe_keys(self), moe_layers=mamba2["ffn_layers"])
        if self.arch == "llama4":  # interleaved dense / MoE layers, chunked + NoPE attention (config_llama4.py)
            moe.update(llama4_keys(self, n_layer, moe["n_expert"], moe["n_ff_exp"]))
        if self.arch in ("bailingmoe2", "afmoe"):  # Ling / Trinity: routing, shared expert, afmoe's scale and NoPE
            moe.update(ling_trinity_keys(self, n_layer, n_embd, n_head, head_dim))
        if glm.get("_n_shared") is not None:  # glm4moe: shared experts of the routed width
            moe.update(expert_weights_norm=glm.pop("_norm"), n_ff_shexp=moe["n_ff_exp"] * glm.pop("_n_shared"))
        # MoE files may leave out the dense width (unused there): the experts' width stands in for it
        n_ff = g4.pop("_n_ff") if g4 else mamba2.pop("_n_ff") if mamba2 else self.positive(
            "{arch}.feed_forward_length", moe.get("n_ff_exp") or None)
        n_ctx_train = self.positive("{arch}.context_length")
        rope_scale, rope_factors, rope_mscale = self.rope_scaling(n_rot, freq_base, n_ctx_train)
        if self.arch == "deepseek2":
            rope_mscale, attn_scale = self.deepseek2_yarn(head_dim, rope_scale, bool(rope_factors))
        m3 = self.mistral3(n_ctx_train, bool(rope_factors)) if self.arch == "mistral3" else {}
        rope_mscale = m3.pop("rope_mscale", rope_mscale)
        granite = self.granite_scales() or minicpm_keys(self, n_embd, n_layer, n_ctx_train)
        rope_mscale = granite.pop("rope_mscale", rope_mscale)
        embd_scale = math.sqrt(n_embd) if self.arch in GEMMA_ARCHS else granite.pop("embd_scale", moe.pop("embd_scale", 1.0))
        if granite and self.arch not in MINICPM_ARCHS:
            attn_scale = granite.pop("attn_scale") or attn_scale
            n_rot = n_rot if granite.pop("rope") else 0
        self.real("{arch}.rope.freq_base_swa", freq_base_swa, positive=True)
        eps_key = "{arch}.attention." + eps_key
        norm_eps = self.real(eps_key, self.get(eps_key, kind=float), positive=False)
        return ModelConfig(
            arch=self.arch,
            name=self.get("general.name", "", kind=str),
            n_vocab=self.n_vocab(),
            n_ctx_train=n_ctx_train,
            n_embd=n_embd,
            n_layer=n_layer,
            n_ff=n_ff,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            norm_eps=norm_eps,
            rope_freq_base=freq_base,
            rope_freq_scale=rope_scale,
            n_rot=n_rot,
            rope_neox=self.arch in _NEOX_ARCHS,
            rope_freq_base_swa=freq_base_swa,
            sliding_window=window,
            swa_layers=swa_layers,
            attn_scale=attn_scale,
            embd_scale=embd_scale,
            tied_output="output.weight" not in self.f.tensors,
            is_sparse=self.f.is_sparse,
            sparse_threshold=threshold,
            predictor_ranks=self.predictor_ranks(n_layer),
            hidden_act=hidden_act,
            hidden_act_param=hidden_act_param,
            calibrated_sparsity=calibrated,
            ffn_thresholds=ffn_thresholds,
            ffn_quantiles=ffn_quantiles,
            ffn_neuron_scales=self.neuron_scales(n_layer, g4["gemma4"].n_ff if g4 else n_ff)
            if calibrated is not None else (),
            ffn_up_thresholds=self.up_thresholds(n_layer) if calibrated is not None else (),
            ffn_up_quantiles=self.up_quantiles(n_layer) if calibrated is not None else (),
            rope_factors=rope_factors,
            rope_mscale=rope_mscale,
            **self.phi3_rope(),
            **self.softcaps(),
            **moe,
            **self.smollm3_olmo2(n_layer),
            **self.smallthinker(n_layer, n_rot, head_dim),
            **self.ernie(n_layer, n_rot, head_dim),
            **mla,
            **granite,
            **glm,
            **lfm2,
            **m3,
            **g4,
            **g3n,
            **cohere_keys(self, n_layer),
            **(apertus_keys(self, n_layer) if self.arch == "apertus" else {}),
        )
