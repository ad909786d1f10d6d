"""ModelConfig: the hyperparameters of a model, read from GGUF metadata by read() with one architecture's spec.

This module reads the keys every architecture shares and names no architecture: what differs per arch comes
from its models.spec.ArchSpec (flags such as rope_neox, layer_norm, yarn, moe_norm and hooks for its own keys)
and from the read_args function of its module in models/, whose docstring lists the keys it reads.
models.read_config(f) picks the spec by general.architecture and calls read().

Keys follow llama.cpp's names ({arch} is general.architecture); defaults are llama.cpp's where it has one.
Mixture of experts (MetaReader.experts): {arch}.expert_count experts, of which {arch}.expert_used_count run per
token; each expert's FFN width is spec.expert_width_key ({arch}.expert_feed_forward_length, or
feed_forward_length in llama-style files such as Mixtral); a shared expert is
{arch}.expert_shared_feed_forward_length wide where spec.shared_expert says the arch has one. Router weights are
renormalized over the chosen experts where spec.moe_norm says so, as llama.cpp does per arch (moe.py has the
arithmetic).
PowerInfer files (magic PWRI) add is_sparse, powerinfer.sparse_threshold and per-layer predictor ranks.
FFN activation (hidden_act, written by our converter as powerinfer.hidden_act / powerinfer.hidden_act_param):
"silu", "relu", "fatrelu" (x if x > hidden_act_param else 0) or "gelu". The default when the key is absent is the
spec's hidden_act, or its hidden_act_pwri in a PWRI file (upstream PowerInfer llama and falcon files carry no key
and are ReLU models); some archs fix the FFN whatever the key says (spec.ffn_variant: bamboo's dReLU, ...).
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
from typing import TYPE_CHECKING, Any, Callable

from .errors import ModelFileError, UnsupportedError
from .gguf.reader import GGUFFile

if TYPE_CHECKING:  # the per-arch layouts live in their modules, which import this one
    from .models.gemma3n import Gemma3nLayout
    from .models.gemma4 import Gemma4Layout
    from .models.llama4 import Llama4Layout

HIDDEN_ACTS = ("silu", "relu", "fatrelu", "gelu")
KEY_SPARSITY = "powerinfer.sparsity"
KEY_FFN_THRESHOLDS = "powerinfer.ffn_thresholds"
KEY_FFN_QUANTILES = "powerinfer.ffn_threshold_quantiles"
KEY_FFN_NEURON_SCALES = "powerinfer.ffn_neuron_scales."  # + layer index: f32 [n_ff] per layer
KEY_UP_SPARSITY = "powerinfer.up_sparsity"
KEY_FFN_UP_THRESHOLDS = "powerinfer.ffn_up_thresholds"
KEY_FFN_UP_QUANTILES = "powerinfer.ffn_up_threshold_quantiles"
MAX_BLOCKS = 512  # llama.cpp's LLAMA_MAX_LAYERS: a larger block_count needs the tensors to back it
KEY_WIDE_PREFIX = "powerinfer.wide."  # model-wide sparsity calibration (layers/wide.py reads the keys)
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
    logit_mul: float = 1.0  # command-r, cohere2: logits are multiplied by it (1: none; models/command_r.py)
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
    gemma4: Gemma4Layout | None = None  # gemma4: the per-layer shapes, RoPE and K/V sharing (models/gemma4.py)
    mamba_layers: tuple[bool, ...] = ()  # nemotron_h: per layer True = a Mamba-2 mixer (models/nemotron_h.py)
    ffn_layers: tuple[bool, ...] = ()  # nemotron_h: per layer True = an FFN-only layer (neither mixer nor attention)
    ssm_d_inner: int = 0  # Mamba-2: the mixer's inner width (heads x head width)
    ssm_n_group: int = 0  # Mamba-2: groups of B and C (each serves ssm_n_v_heads / ssm_n_group heads)
    gemma3n: Gemma3nLayout | None = None  # gemma3n: AltUp, K/V sharing, top-k sparsity (models/gemma3n.py)
    xielu: tuple[tuple[float, float, float, float], ...] = ()  # apertus: per layer xIELU (alpha_n, alpha_p, beta, eps)
    llama4: Llama4Layout | None = None  # llama4: chunked / NoPE layers, q/k norm, temperature (models/llama4.py)
    wide_meta: tuple = ()  # (key, value) of every KEY_WIDE_PREFIX key: a wide-calibrated file (layers/wide.py)

    def is_moe_layer(self, il: int) -> bool:
        """Whether layer il's FFN is a mixture of experts (ernie4_5-moe's leading layers are dense)."""
        return bool(self.n_expert) and (not self.moe_layers or self.moe_layers[il])


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


class MetaReader:
    """Typed access to one file's metadata, with errors that name the file and the key. arch: the architecture
    whose behaviour runs (a spec's text_of where it has one); key_arch: the file's general.architecture, which
    names its keys."""

    def __init__(self, f: GGUFFile, spec=None):
        self.f = f
        self.meta = f.metadata
        self.arch = (spec.text_of or spec.name) if spec is not None else ""
        self.key_arch = spec.name if spec is not None and spec.text_of else ""

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

    def nextn_blocks(self, n_layer: int) -> int:
        """{arch}.nextn_predict_layers: trailing multi-token-prediction blocks (spec.nextn; llama.cpp's converter
        writes them by default). They are in the file and in block_count, but the main pass never runs them."""
        nextn = self.get("{arch}.nextn_predict_layers", 0)
        if not 0 <= nextn < n_layer:
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.nextn_predict_layers')} {nextn} must be in "
                                 f"0..{n_layer - 1} (block_count {n_layer})")
        return nextn

    def no_swa(self, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
        """(sliding_window, swa_layers, rope_freq_base_swa) of a model without sliding-window layers."""
        return 0, (False,) * n_layer, rope_freq_base

    def rope_scaling(self, spec, n_rot: int, freq_base: float, n_ctx_train: int,
                     archs_with: Callable) -> tuple[float, tuple, float]:
        """(rope_freq_scale, rope_factors, rope_mscale) from {arch}.rope.scaling.*: none and linear scale the
        frequencies; yarn (spec.yarn) becomes per-pair factors and a scale of the rotated dims; longrope
        (spec.longrope) keeps its factor tensors for the model (rope_factors_long/short.weight)."""
        scaling = self.get("{arch}.rope.scaling.type", "none", kind=str)
        if scaling == "linear" or scaling == "yarn":
            factor = self.get("{arch}.rope.scaling.factor", kind=float)
        elif scaling == "longrope" and spec.longrope:
            factor = self.get("{arch}.rope.scaling.factor", 1.0, kind=float)
        elif scaling == "none":
            factor = self.get("{arch}.rope.scale_linear", 1.0, kind=float)  # older files
        else:
            raise UnsupportedError(f"{self.f.path}: RoPE scaling {scaling!r} is not supported (none, linear, yarn)")
        if not factor > 0:
            raise ModelFileError(f"{self.f.path}: RoPE scaling factor must be positive, got {factor}")
        if scaling != "yarn":
            return 1.0 / factor, (), 1.0
        if not spec.yarn:
            raise UnsupportedError(f"{self.f.path}: YaRN RoPE scaling is supported for "
                                   f"{', '.join(archs_with(lambda s: s.yarn))}, not {self.arch}")
        factors, mscale = yarn_rope(
            n_rot, freq_base, factor, self.positive("{arch}.rope.scaling.original_context_length", n_ctx_train),
            self.get("{arch}.rope.scaling.attn_factor", 1.0, kind=float),
            self.get("{arch}.rope.scaling.yarn_beta_fast", 32.0, kind=float),
            self.get("{arch}.rope.scaling.yarn_beta_slow", 1.0, kind=float))
        return 1.0, factors, mscale

    def expert_weights(self) -> tuple[bool, float]:
        """({arch}.expert_weights_norm, {arch}.expert_weights_scale): whether the chosen experts' weights are
        renormalized (default False) and their scale (default 0, which the callers read as 1, as llama.cpp)."""
        norm = self.meta.get(self.key("{arch}.expert_weights_norm"), False)
        if not isinstance(norm, bool):
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.expert_weights_norm')} should be a bool")
        scale = self.get("{arch}.expert_weights_scale", 0.0, kind=float)
        if not (math.isfinite(scale) and scale >= 0):
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.expert_weights_scale')} must be >= 0, got {scale}")
        return norm, scale

    def experts(self, spec, archs_with: Callable) -> dict:
        """The mixture-of-experts fields of ModelConfig (n_expert ...), or {} for a dense FFN."""
        n_expert = self.get("{arch}.expert_count", 0)
        if not spec.moe and (n_expert == 0 or spec.dense_experts_max and n_expert <= spec.dense_experts_max):
            return {}
        if spec.moe_norm is None:
            raise UnsupportedError(f"{self.f.path}: mixture-of-experts {self.arch} files are not supported "
                                   f"(experts run for {', '.join(archs_with(lambda s: s.moe_norm is not None))})")
        if self.f.is_sparse:
            raise UnsupportedError(f"{self.f.path}: a PowerInfer (PWRI) file with experts is not supported")
        n_expert = self.positive("{arch}.expert_count")
        n_used = self.positive("{arch}.expert_used_count")
        if n_used > n_expert:
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.expert_used_count')} {n_used} exceeds "
                                 f"{self.key('{arch}.expert_count')} {n_expert}")
        shexp_key = "{arch}.expert_shared_feed_forward_length"
        shexp = (self.positive(shexp_key) if spec.shared_expert == "required" else
                 self.get(shexp_key, 0) if spec.shared_expert == "optional" else 0)
        return {"n_expert": n_expert, "n_expert_used": n_used, "n_ff_exp": self.positive(spec.expert_width_key),
                "n_ff_shexp": shexp, "expert_weights_norm": spec.moe_norm}

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

    def hidden_act(self, spec) -> tuple[str, float]:
        """(activation, fatrelu parameter) of the FFN; absent key: the spec's default (module docstring)."""
        default = spec.hidden_act_pwri if self.f.is_sparse and spec.hidden_act_pwri else spec.hidden_act
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


def read(f: GGUFFile, spec, read_args: Callable | None = None,
         archs_with: Callable = lambda test: []) -> ModelConfig:
    """The ModelConfig of `f`, a file of the architecture `spec` (a models.spec.ArchSpec: flags, and hooks that
    read the arch's own keys where the shared readers need them). read_args(r, d), from the arch's module, reads
    the rest after every shared field is in the draft d; archs_with(test) lists the archs whose spec passes
    test (for messages). models.read_config(f) calls this with the spec of general.architecture."""
    r = MetaReader(f, spec)
    d = _shape(r, spec)
    _positions(r, spec, d)
    _ffn(r, spec, d, archs_with)
    d["rope_freq_scale"], d["rope_factors"], d["rope_mscale"] = r.rope_scaling(
        spec, d["n_rot"], d["rope_freq_base"], d["n_ctx_train"], archs_with)
    d["embd_scale"] = math.sqrt(d["n_embd"]) if spec.sqrt_embd_scale else 1.0
    _file_fields(r, spec, d)
    if read_args is not None:
        read_args(r, d)
    r.real("{arch}.rope.freq_base_swa", d["rope_freq_base_swa"], positive=True)
    return ModelConfig(**{k: v for k, v in d.items() if not k.startswith("_")})


def _shape(r: MetaReader, spec) -> dict:
    """The draft's widths and head counts: n_embd, n_layer (without trailing MTP blocks), n_head, n_head_kv,
    head_dim, and what the arch's layout and mla hooks add."""
    d: dict = {"arch": r.arch, "n_embd": r.positive("{arch}.embedding_length")}
    n_layer = r.block_count()
    if spec.nextn:  # trailing multi-token-prediction blocks: not run
        d["n_nextn"] = r.nextn_blocks(n_layer)
        n_layer -= d["n_nextn"]
    d["n_layer"] = n_layer
    if spec.layout is not None:
        spec.layout(r, d)
    if "n_head" not in d:
        d["n_head"] = r.positive("{arch}.attention.head_count")
    n_head = d["n_head"]
    n_head_kv = d["n_head_kv"] if "n_head_kv" in d else r.positive("{arch}.attention.head_count_kv", n_head)
    if n_head % n_head_kv:
        raise ModelFileError(f"{r.f.path}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    head_dim = d["head_dim"] if "head_dim" in d else r.positive("{arch}.attention.key_length", d["n_embd"] // n_head)
    value_dim = r.positive("{arch}.attention.value_length", head_dim)
    if spec.mla is not None:  # q/k heads of nope + rope dims; one latent "kv head" in the cache
        mla = spec.mla(r, d)
        head_dim = value_dim = mla.pop("head_dim")  # (the value width is mla's v_head_dim)
        n_head_kv = 1
        d.update(mla)
    if value_dim != head_dim:
        raise UnsupportedError(f"{r.f.path}: value_length {value_dim} != key_length {head_dim}")
    d["n_head_kv"], d["head_dim"] = n_head_kv, head_dim
    return d


def _positions(r: MetaReader, spec, d: dict) -> None:
    """RoPE base, sliding windows, rotated dims and the attention scale (before the arch's own changes)."""
    n_layer, head_dim = d["n_layer"], d["head_dim"]
    freq_base = r.real("{arch}.rope.freq_base", r.get("{arch}.rope.freq_base", spec.rope_base, kind=float),
                       positive=True)
    if spec.rope_base_of is not None:
        freq_base = spec.rope_base_of(r, freq_base, head_dim)
    d["rope_freq_base"] = freq_base
    if "sliding_window" not in d:  # (a layout hook may have set the three window fields)
        window = spec.swa(r, n_layer, freq_base) if spec.swa is not None else r.no_swa(n_layer, freq_base)
        d["sliding_window"], d["swa_layers"], d["rope_freq_base_swa"] = window
    n_rot = r.get("{arch}.rope.dimension_count", head_dim if spec.rope else 0)
    n_rot = d.get("n_rot", n_rot)
    if not 0 <= n_rot <= head_dim or n_rot % 2:
        raise ModelFileError(f"{r.f.path}: rope.dimension_count {n_rot} must be even and <= {head_dim}")
    d["n_rot"] = n_rot
    if spec.mrope_check:
        _mrope_sections(r, n_rot)
    d.setdefault("attn_scale", 1.0 / math.sqrt(head_dim))
    d["rope_neox"] = spec.rope_neox


def _mrope_sections(r: MetaReader, n_rot: int) -> None:
    """Text-only input of a text_of file: refuse M-RoPE sections that leave rotated pairs out (llama.cpp then
    rotates those by another position component, which the arch of its text model cannot)."""
    sections = r.meta.get(r.key("{arch}.rope.dimension_sections"))
    if isinstance(sections, list) and sum(int(v) for v in sections) != n_rot // 2:
        raise UnsupportedError(f"{r.f.path}: {r.key('{arch}.rope.dimension_sections')} {sections} does not "
                               f"cover the {n_rot // 2} rotated pairs of a head")


def _ffn(r: MetaReader, spec, d: dict, archs_with: Callable) -> None:
    """Activation, sparse threshold and calibration, the experts and the FFN width; the training context."""
    f, n_layer = r.f, d["n_layer"]
    d["sparse_threshold"] = r.get("powerinfer.sparse_threshold", 0.0, kind=float) if f.is_sparse else 0.0
    d["hidden_act"], d["hidden_act_param"] = r.hidden_act(spec)
    d["calibrated_sparsity"], d["ffn_thresholds"], d["ffn_quantiles"] = r.calibration(n_layer)
    moe = r.experts(spec, archs_with)
    if spec.mla is not None and not 0 < d["n_rot"] < d["head_dim"]:
        raise ModelFileError(f"{f.path}: rope.dimension_count {d['n_rot']} must leave 1..{d['head_dim'] - 1} "
                             f"unrotated dims of the {d['head_dim']}-wide q/k heads")
    d.update(moe)
    # MoE files may leave out the dense width (unused there): the experts' width stands in for it
    if "n_ff" not in d:
        d["n_ff"] = r.positive("{arch}.feed_forward_length", moe.get("n_ff_exp") or None)
    d["n_ctx_train"] = r.positive("{arch}.context_length")


def _file_fields(r: MetaReader, spec, d: dict) -> None:
    """Name, vocabulary, norm eps, output head, PWRI predictors and the per-neuron calibration arrays."""
    f, n_layer = r.f, d["n_layer"]
    eps_key = "layer_norm_epsilon" if spec.layer_norm else "layer_norm_rms_epsilon"
    d.update(name=r.get("general.name", "", kind=str), n_vocab=r.n_vocab(),
             norm_eps=r.real("{arch}.attention." + eps_key, r.get("{arch}.attention." + eps_key, kind=float),
                             positive=False),
             tied_output="output.weight" not in f.tensors, is_sparse=f.is_sparse,
             predictor_ranks=r.predictor_ranks(n_layer))
    calibrated = d["calibrated_sparsity"] is not None
    widths = d.pop("_n_ff_layers", d["n_ff"])  # per-layer FFN widths where they differ (gemma4)
    d["ffn_neuron_scales"] = r.neuron_scales(n_layer, widths) if calibrated else ()
    d["ffn_up_thresholds"] = r.up_thresholds(n_layer) if calibrated else ()
    d["ffn_up_quantiles"] = r.up_quantiles(n_layer) if calibrated else ()
    d["wide_meta"] = tuple((k, v) for k, v in f.metadata.items() if k.startswith(KEY_WIDE_PREFIX))
