"""The feed-forward block of every model: the dense FFN and the sparse strategies, in one place.

FFN variants, chosen once from (arch, hidden_act) by ffn_variant():
  swiglu    h = silu(gate·x) * (up·x)            llama / Mistral / qwen2 (dense only)
  geglu     h = gelu(gate·x) * (up·x)            a gated GELU llama file (dense only)
  reglu     h = relu(gate·x) * (up·x)            ReluLLaMA (PWRI llama without hidden_act)
  fatreglu  h = fatrelu(gate·x) * (up·x)         ProSparse: fatrelu(a) = a if a > hidden_act_param else 0
  dreglu    h = relu(gate·x) * relu(up·x)        bamboo (dReLU)
  relu      h = relu(up·x + b_up)                falcon (ReluFalcon), opt
  relu2     h = relu(up·x)^2                     arcee (Arcee AFM; Python path only: no one-call C step)
  gelu      h = gelu(up·x + b_up)                falcon (dense only)
followed by the down projection: ffn_down · h for dense GGUF files, or  y = sum_i h_i * ffn_down_t[i, :]  (an
AXPY over rows of the transposed matrix) for PWRI files; + b_down for opt. The "gating" pre-activation is
gate·x for gated variants and up·x + b_up for the others: a neuron whose gating activation is 0 has h = 0.

Modes (docs/FORMATS.md section 2), chosen per model by resolve_sparse():
  off        everything dense. PWRI files have no ffn_down, so their down projection is the AXPY over every
             row of ffn_down_t (the kernel skips rows whose h is zero for every token; that is what makes
             `exact` bit-identical to `off`).
  exact      ReLU-family only: the gating pre-activation is dense, then up (gated variants) and the down
             projection only on neurons whose activation is non-zero. Bit-for-bit `off`: matmul_rows gives
             each row the bits matmul gives it, and the AXPY gives the same bits with zero rows left out.
             On a dense GGUF file the down projection stays the dense ffn_down matmul (inactive h = 0): a
             transposed copy would need re-quantization (Q4_0/Q8_0 blocks run along n_ff) and a different
             summation order, so it could not be exact; exact mode there saves the up rows only.
             Mixture-of-experts files with ReLU experts (smallthinker) run it inside each chosen expert (moe.py).
  threshold  SwiGLU/GeGLU models (threshold.py): the gate is dense, then up and the down projection only for
             neurons whose |act(gate·x)| (times a calibrated per-neuron scale) reaches the layer's calibrated
             cut-off (file metadata written by `powerinfer calibrate`); sparsity 0 is the dense FFN itself.
  predictor  PowerInfer (ReLU family; also swiglu/geglu with predictors trained on |act| >= a per-layer cut-off,
             predictor_train.py: the gate rows are then computed for predicted neurons only, act as in dense):
             p = the predictor input (pre-ffn_norm residual; falcon: the layer input),
             logits = fc2 · relu(fc1 · p) in f32, neuron i active iff logits[i] >= threshold, h computed for
             active neurons only (inactive neurons are exactly 0), then the down projection over them.
             One token of a gated ReLU-family FFN without biases runs as one C call (step_ffn.c, same
             kernels in the same order, so the same bits) unless a hybrid split or an observer is set;
             so does `exact` on PWRI files.
             Gated ReLU variants gather up rows only where the gate activation is non-zero (h = 0 elsewhere).
             The predictor's hidden layer relu(fc1 · p) is itself sparse (about half its units are 0): for one
             token with a float fc2 (F32/F16/BF16), fc2 · r is the AXPY over the non-zero r_k of a transposed
             copy fc2_t made at load (same values, another summation order), which reads only their rows; a
             Q4_0 / Q8_0 fc2 gets a copy by hidden unit instead (the same codes and scales moved so that each
             unit is one row: csrc/fc2t.c) read the same way (predictor_logits; the C step makes the same choice
             and calls, so the same bits).
             A float fc1/fc2 may run from a Q8_0 / Q4_0 copy made at load instead (predictor_copy, the
             predictor_dtype load option; by default Q8_0 on ReLU-family files, the file's own on SwiGLU/GeGLU
             ones: resolve_predictor), which then takes the quantized paths above.
Batches (prefill, N > 1 tokens) compute the union of the tokens' active sets once for all tokens and then
zero h[t, i] for the neurons token t did not select, so every token gets exactly its own per-token result;
when the union exceeds DENSE_FALLBACK of the neurons, the gated rows come from the dense matmul instead of the
row gather (same bits, contiguous reads).

Hybrid execution: an FFN whose `split` is set (hybrid/split.py) hands each predicted active set to it; the
split computes the hot neurons' part on a device and the rest here (partial()), and sums the two outputs.

Observers (profiling, calibration, predictor training): an FFN whose `observer` is set runs the dense path
and calls observer(layer, x, p, act) before its down projection, with x the normed FFN input, p the predictor
input (docs/FORMATS.md section 2: the pre-ffn_norm residual; falcon: the layer input) and act f32 [N, n_ff] the
activated gating values: act(gate·x) for gated variants (silu, gelu, relu, fatrelu; dReLU: relu(gate·x)), or
act(up·x + b_up) otherwise (relu2: relu(up·x), squared afterwards). A neuron is "active" for a token where act != 0 (ReLU family). The result is the
dense result, whatever the mode; the observer must not modify its arguments.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import PowerInferError, UnsupportedError
from ..kernels.ref import FC2T, FC2T_QUANT_TYPES
from ..models import archs_with, spec_for
from ..gguf.types import GGMLType, Tensor, row_bytes

MODES = ("predictor", "exact", "threshold", "wide", "off")
# how predictor mode stores a float (F32/F16/BF16) predictor: "exact" as the file has it, "q8_0" / "q4_0" a copy
# quantized at load (predictor_copy); "auto" is PREDICTOR_AUTO or PREDICTOR_AUTO_GLU (resolve_predictor).
# Quantized predictors in the file stay as they are.
PREDICTOR_TYPES = ("auto", "exact", "q8_0", "q4_0")
# What "auto" picks, from what each choice measurably changes (benchmarks/bench_predictor_quant.py on held-out
# text, benchmarks/data/evaluation.txt; docs/sparse.md has the tables and commands):
#   ReLU-family FFNs: Q8_0. On the synthetic F16 7B-shape file (rank 1024) it kept 99.58% of the exact
#   predictor's picks with 0.41% extra (active fraction 11.72% and recall of the truly active neurons 0.9006 ->
#   0.9005), moved the argmax at 2 of 256 teacher-forced positions (KL 1.1e-5 nats) and no greedy token of 128,
#   and took the predictor from 10.5% to 5.4% of an 8-layer decode (9.0% -> 4.9% on 4 layers). Q4_0 kept
#   95.6% of the picks and its greedy run diverged after 53 tokens: opt-in.
#   SwiGLU/GeGLU FFNs with trained predictors: exact. On Gemma 3 270M with an F16 rank-128 predictor from
#   `powerinfer train-predictor`, Q8_0 kept 97.75% of the picks (2.4% extra), perplexity 76.78 -> 77.37 (+0.8%,
#   KL 0.071 nats; a thread count of 1 instead of 2 moves it by 0.05% at KL 0.019) for about 1% of a token's
#   time (no decode speed-up measurable): a flip there drops a non-zero activation, and the predictor is a small
#   part of that model's bytes.
PREDICTOR_AUTO = "q8_0"  # ReLU family
PREDICTOR_AUTO_GLU = "exact"  # PREDICTED_GLU
THRESHOLD_ENV = "LLAMA_SPARSE_PRED_THRESHOLD"
FC2T_FLOAT_TYPES = ("F32", "F16", "BF16")  # fc2 types whose transposed copy holds the same values
DENSE_FALLBACK = 0.5  # batches whose union of active neurons exceeds this fraction use the dense gate/up
RELU_FAMILY = ("reglu", "fatreglu", "dreglu", "relu", "relu2")
PREDICTED_GLU = ("swiglu", "geglu")  # non-ReLU FFNs that predictor mode also runs (trained predictors skip the gate)
GATED = ("swiglu", "geglu", "reglu", "fatreglu", "dreglu")


def ffn_variant(config: ModelConfig) -> str:
    """The FFN variant of a model (see the module docstring): the arch's own (spec.ffn_variant: bamboo's dReLU,
    the Gemma family's GeGLU, ...) or the one hidden_act names; ungated archs run act(Wup·x) itself."""
    spec = spec_for(config.arch)
    act = config.hidden_act
    if spec.ffn_variant:
        return spec.ffn_variant
    if spec.ungated_ffn:
        if act in ("relu", "gelu"):
            return act
        raise UnsupportedError(f"{config.arch}: hidden_act {act!r} is not supported for this architecture "
                               "(relu, gelu)")
    return {"silu": "swiglu", "gelu": "geglu", "relu": "reglu", "fatrelu": "fatreglu"}[act]


@dataclass(frozen=True)
class SparseSettings:
    mode: str  # one of MODES
    threshold: float  # predictor logits >= threshold are active (used in predictor mode only)
    sparsity: float | None = None  # threshold mode: the target fraction of neurons skipped
    thresholds: tuple[float, ...] = ()  # threshold mode: per-layer cut-offs on |act(gate)|
    down: str = "auto"  # threshold mode: down projection of dense files (threshold.DOWN_CHOICES)
    scales: tuple[tuple[float, ...], ...] = ()  # threshold mode: per-layer neuron scales of the score; () none
    up_cuts: tuple[float, ...] = ()  # threshold mode, two-stage files: per-layer candidate cut-offs; () one stage
    predictor: str = "exact"  # predictor mode: how float predictors are stored (PREDICTOR_TYPES less "auto")
    wide_cuts: tuple[float, ...] = ()  # wide mode: cut-offs per layer and input, n_layer * 4 (layers/wide.py)


def default_mode(config: ModelConfig) -> str:
    """The mode a file runs in when none is asked for: what its own metadata was written for. PWRI files carry
    predictors ("predictor"); a calibrated SwiGLU/GeGLU file carries threshold cut-offs ("threshold": the user
    calibrated it to run sparse, so it does, and `--sparse off` still runs it dense); anything else is dense."""
    if config.is_sparse:
        return "predictor"
    if config.wide_meta:  # a file `powerinfer calibrate --wide` wrote (layers/wide.py)
        return "wide"
    from .threshold import THRESHOLD_VARIANTS  # threshold.py builds on this module: imported when needed

    if config.calibrated_sparsity is not None and ffn_variant(config) in THRESHOLD_VARIANTS:
        return "threshold"
    return "off"


def resolve_predictor(predictor: str | None, mode: str, variant: str | None = None) -> str:
    """The predictor storage a model runs with (PREDICTOR_TYPES less "auto"): None and "auto" give, in predictor
    mode, PREDICTOR_AUTO_GLU for the SwiGLU/GeGLU variants and PREDICTOR_AUTO otherwise (ReLU family; variant
    None); "exact" (the predictors as stored) fits every mode, while a quantized copy asked for outside predictor
    mode is refused (no predictor would run)."""
    if predictor is None:
        predictor = "auto"
    if not isinstance(predictor, str) or predictor.lower() not in PREDICTOR_TYPES:
        raise PowerInferError(f"unknown predictor dtype {predictor!r}; one of {', '.join(PREDICTOR_TYPES)}")
    predictor = predictor.lower()
    if predictor not in ("auto", "exact") and mode != "predictor":
        raise PowerInferError(f"a predictor dtype ({predictor!r}) applies to sparse mode 'predictor' only; this "
                              f"model runs in {mode!r}")
    if mode != "predictor":
        return "exact"
    if predictor != "auto":
        return predictor
    return PREDICTOR_AUTO_GLU if variant in PREDICTED_GLU else PREDICTOR_AUTO


def resolve_sparse(config: ModelConfig, mode: str | None = None, threshold: float | None = None,
                   environ: Mapping[str, str] | None = None, sparsity: float | None = None,
                   predictor: str | None = None) -> SparseSettings:
    """The sparse mode and threshold a model runs with.

    mode None: default_mode(config): "predictor" for PWRI files, "threshold" for SwiGLU/GeGLU files that
    `powerinfer calibrate` wrote, "off" otherwise. threshold: the explicit value, else
    $LLAMA_SPARSE_PRED_THRESHOLD from `environ` (the runtime passes os.environ; None reads no environment),
    else the file's powerinfer.sparse_threshold. sparsity: threshold mode only (None: the file's calibration).
    predictor: how predictor mode stores a float predictor (resolve_predictor; None: "auto")."""
    if mode is None:
        mode = default_mode(config)
    if mode not in MODES:
        raise UnsupportedError(f"unknown sparse mode {mode!r}; one of {', '.join(MODES)}")
    resolve_predictor(predictor, mode)  # a bad choice is refused before anything else is checked
    spec = spec_for(config.arch)
    if config.n_expert and mode != "off" and not (mode == "exact" and spec.relu_experts):
        raise UnsupportedError(f"sparse mode {mode!r} is for dense FFNs; this {config.arch} model is a mixture of "
                               f"experts (each token already runs only {config.n_expert_used} of its "
                               f"{config.n_expert} experts): use 'off' ('exact' also runs the ReLU experts of "
                               f"{', '.join(archs_with(lambda s: s.relu_experts))})")
    variant = ffn_variant(config)
    predictor = resolve_predictor(predictor, mode, variant)
    if mode == "predictor" and not config.is_sparse:
        raise UnsupportedError("sparse mode 'predictor' needs a PowerInfer (PWRI) file with predictors; this "
                               "is a dense GGUF file: use 'exact' (ReLU models) or 'off'")
    if sparsity is not None and mode not in ("threshold", "wide"):
        raise PowerInferError("a target sparsity applies to sparse modes 'threshold' and 'wide' only")
    if mode == "wide":
        from . import wide

        wide.check_wide_config(config, variant)
        if sparsity is not None:
            wide.check_sparsity(sparsity)
        if not config.wide_meta:
            raise PowerInferError(
                "this model file has no model-wide calibration (powerinfer.wide.*): run `powerinfer calibrate -m "
                f"MODEL --wide --sparsity {sparsity if sparsity is not None else 0.4} -o wide.gguf` once and run the "
                "calibrated file")
        cal = wide.parse_calibration(dict(config.wide_meta), config.n_layer, wide.layer_widths(config))
        target = sparsity if sparsity is not None else cal.sparsity
        return SparseSettings(mode, 0.0, float(target), wide_cuts=tuple(float(v) for v in cal.cuts(sparsity).reshape(-1)))
    if mode == "threshold":
        from .threshold import THRESHOLD_VARIANTS, layer_cuts

        if variant not in THRESHOLD_VARIANTS:
            raise UnsupportedError(f"sparse mode 'threshold' is for SwiGLU/GeGLU FFNs; this {config.arch} model's "
                                   f"FFN is {variant}: use 'exact' (ReLU models) or 'predictor'")
        cuts, up_cuts = layer_cuts(config, sparsity)
        target = sparsity if sparsity is not None else config.calibrated_sparsity or 0.0
        return SparseSettings(mode, 0.0, float(target), cuts, scales=config.ffn_neuron_scales, up_cuts=up_cuts)
    if (mode != "off" and variant not in RELU_FAMILY and not (mode == "predictor" and variant in PREDICTED_GLU)
            and not (mode == "exact" and spec.topk_ffn)):
        if config.ffn_layers and not any(config.ffn_layers):  # (mamba2: every layer a mixer, no FFN at all)
            raise UnsupportedError(f"sparse mode {mode!r} sparsifies FFNs; this {config.arch} model has none (its "
                                   f"{config.n_layer} layers are mixer or attention layers): use 'off'")
        hint = ("'threshold' (after `powerinfer calibrate`) or 'off'" if variant in ("swiglu", "geglu") else "'off'")
        raise UnsupportedError(f"sparse mode {mode!r} needs a ReLU-family FFN; this {config.arch} model's FFN "
                               f"is {variant}: use {hint}")
    if threshold is None and environ is not None and environ.get(THRESHOLD_ENV, "").strip():
        text = environ[THRESHOLD_ENV]
        try:
            threshold = float(text)
        except ValueError:
            raise PowerInferError(f"{THRESHOLD_ENV}={text!r} is not a number") from None
    if threshold is None:
        threshold = config.sparse_threshold
    threshold = float(threshold)
    if math.isnan(threshold):
        raise PowerInferError("the sparse threshold must be a number, got NaN")
    return SparseSettings(mode, threshold, predictor=predictor)


def runtime_sparse(config: ModelConfig, mode: str | None, threshold: float | None,
                   sparsity: float | None = None, predictor: str | None = None) -> SparseSettings:
    """resolve_sparse with this process's environment (what LLM/load use)."""
    return resolve_sparse(config, mode, threshold, os.environ, sparsity, predictor)


class SparsityStats:
    """Per-layer neuron counts since the last reset(): `active` = neurons computed per token (predicted active,
    or non-zero gating activation in exact/off mode), `nonzero` = neurons whose h was non-zero, `up_read` (two-stage
    threshold files only, whose first stage reads more up rows than the second keeps) = up rows read."""

    def __init__(self, n_layer: int, n_ff, mode: str, threshold: float):
        self.n_ff, self.mode, self.threshold = n_ff, mode, threshold  # n_ff: one width, or one per layer (gemma4)
        self.widths = np.broadcast_to(np.asarray(n_ff, dtype=np.float64), (n_layer,))
        self.tokens = np.zeros(n_layer, dtype=np.int64)
        self.active = np.zeros(n_layer, dtype=np.int64)
        self.nonzero = np.zeros(n_layer, dtype=np.int64)
        self.up_read = np.zeros(n_layer, dtype=np.int64)
        self.two_stage = False  # set by the first record with an up row count

    def reset(self) -> None:
        for a in (self.tokens, self.active, self.nonzero, self.up_read):
            a[:] = 0

    def record(self, il: int, n_tok: int, n_active: int, n_nonzero: int, n_up: int | None = None) -> None:
        self.tokens[il] += n_tok
        self.active[il] += n_active
        self.nonzero[il] += n_nonzero
        if n_up is not None:
            self.up_read[il] += n_up
            self.two_stage = True

    @property
    def up_read_fraction(self) -> float | None:
        """Two-stage threshold files: mean fraction of the ffn_up rows read per token; None otherwise (the up rows
        read are then the computed neurons)."""
        total = float((self.tokens * self.widths).sum())
        return float(self.up_read.sum()) / total if self.two_stage and total else None

    def _fractions(self, counts: np.ndarray) -> list[float]:
        with np.errstate(invalid="ignore", divide="ignore"):
            return [float(f) for f in counts / (self.tokens * self.widths)]

    @property
    def fractions(self) -> list[float]:
        """Per layer: mean fraction of the n_ff neurons active per token (NaN before any token)."""
        return self._fractions(self.active)

    @property
    def nonzero_fractions(self) -> list[float]:
        return self._fractions(self.nonzero)

    @property
    def mean_fraction(self) -> float:
        total = float((self.tokens * self.widths).sum())
        return float(self.active.sum()) / total if total else float("nan")

    @property
    def skipped_fraction(self) -> float:
        """Mean fraction of the neurons not computed per token (threshold mode: below the cut-off)."""
        return 1.0 - self.mean_fraction


@dataclass
class FFNWeights:
    """One layer's FFN tensors. down (dense files, shape (n_embd, n_ff)) or down_t (PWRI, (n_ff, n_embd))."""
    up: Tensor
    gate: Tensor | None = None
    down: Tensor | None = None
    down_t: Tensor | None = None
    b_up: np.ndarray | None = None  # f32 [n_ff]
    b_down: np.ndarray | None = None  # f32 [n_embd]
    fc1: Tensor | None = None  # predictor, (R, n_embd)
    fc2: Tensor | None = None  # predictor, (n_ff, R)


class FFN:
    """One layer's feed-forward block in one mode: ffn(x, p) -> y f32 [N, n_embd] for x f32 [N, n_embd] (the
    normed FFN input) and p f32 [N, n_embd] (the predictor input; used in predictor mode only)."""

    def __init__(self, kernels, w: FFNWeights, variant: str, settings: SparseSettings, *, layer: int = 0,
                 act_param: float = 0.0, stats: SparsityStats | None = None):
        self.k, self.w, self.variant, self.layer, self.stats = kernels, w, variant, layer, stats
        self.mode, self.threshold = settings.mode, np.float32(settings.threshold)
        self.act_param = np.float32(act_param)
        self.n_ff = w.up.shape[0]
        self.gated = variant in GATED
        if self.gated != (w.gate is not None):
            raise ValueError(f"layer {layer}: FFN variant {variant} {'needs' if self.gated else 'has no'} ffn_gate")
        if (w.down is None) == (w.down_t is None):
            raise ValueError(f"layer {layer}: the FFN needs exactly one of ffn_down and ffn_down_t")
        if self.mode == "predictor" and (w.fc1 is None or w.fc2 is None):
            raise ValueError(f"layer {layer}: predictor mode without fc1/fc2")
        # the predictor this FFN runs: the file's fc1/fc2, or (settings.predictor q8_0 / q4_0) a quantized copy of
        # a float one made here (predictor_copy)
        self.fc1, self.fc2 = (predictor_copy(w.fc1, w.fc2, settings.predictor, getattr(kernels, "n_threads", 1))
                              if self.mode == "predictor" else (w.fc1, w.fc2))
        # fc2 transposed (rank, n_ff) or a Q4_0 / Q8_0 fc2's copy by hidden unit: one token's fc2 · r reads only
        # the rows of the predictor's non-zero hidden units
        self.fc2_t = transposed_predictor(self.fc2, kernels) if self.mode == "predictor" else None
        self.all_rows = np.arange(self.n_ff, dtype=np.int32)
        self.threshold_path = None
        if self.mode == "threshold":
            from .threshold import ThresholdPath

            self.threshold_path = ThresholdPath(self, settings.thresholds[layer], settings.sparsity or 0.0,
                                                settings.down, settings.scales[layer] if settings.scales else None,
                                                settings.up_cuts[layer] if settings.up_cuts else None)
        self.observer = None  # callable(layer, x, p, act): see the module docstring
        self.split = None  # hybrid.HybridSplit: predictor mode computes hot neurons on a device (hybrid/)
        # tier 2 (kernels.steps; models/base.py): one token of this FFN in one C call, where the step covers it
        steps = kernels.steps
        # dense SwiGLU/GeGLU files without biases
        self.fused_dense = None
        if (steps is not None and variant in ("swiglu", "geglu") and w.down is not None
                and w.b_up is None and w.b_down is None):
            self.fused_dense = steps.dense_ffn_plan("silu" if variant == "swiglu" else "gelu", w.gate, w.up, w.down)
        # predictor / exact mode: gated ReLU variants without biases
        self.fused = None
        if (steps is not None and self.mode in ("predictor", "exact") and w.down_t is not None
                and variant in steps.FUSED_VARIANTS and w.b_up is None and w.b_down is None):
            self.fused = steps.sparse_ffn_plan(variant, self.fc1, self.fc2, w.gate, w.up, w.down_t,
                                               float(self.threshold), float(self.act_param),
                                               exact=self.mode == "exact", fc2_t=self.fc2_t)

    def step_timing(self) -> np.ndarray | None:
        """The one-token C step's running sums in predictor / exact mode (kernels.cpu_steps.FfnStepPlan.timing:
        calls, predictor seconds, step seconds, summed non-zero share of the predictor's hidden units), a live
        view; None when this FFN has no such step (Python path, other modes, kernels without steps)."""
        return getattr(self.fused, "timing", None) if self.fused is not None else None

    def __call__(self, x: np.ndarray, p: np.ndarray | None = None) -> np.ndarray:
        if self.observer is not None:
            return self._observed(x, p)
        if self.mode == "predictor":
            return self._predictor(x, p)
        if self.mode == "exact":
            return self._exact(x)
        if self.threshold_path is not None:
            return self.threshold_path(x)
        return self._dense(x)

    # ---- activations (numpy, in place on fresh arrays) ---------------------------------------------------

    def _act(self, pre: np.ndarray) -> np.ndarray:
        """The activated gating values of a fresh pre-activation array, for every variant."""
        if self.variant == "swiglu":
            return self.k.silu(pre)
        if self.variant in ("geglu", "gelu"):
            return self.k.gelu(pre)
        return self._gate_act(pre)

    def _gate_act(self, a: np.ndarray) -> np.ndarray:
        """The gating activation of a fresh pre-activation array (ReLU family only)."""
        if self.variant == "fatreglu":
            a[~(a > self.act_param)] = 0  # x if x > param else 0 (NaN -> 0, as the comparison is false)
            return a
        return np.maximum(a, 0, out=a)

    def _combine(self, a: np.ndarray, u: np.ndarray | None) -> np.ndarray:
        """h from the activated gating values a and (gated variants) the up values u; relu2 squares a."""
        if not self.gated:
            if self.variant == "relu2":
                a *= a
            return a
        if self.variant == "dreglu":
            np.maximum(u, 0, out=u)
        a *= u
        return a

    def _pre(self, x: np.ndarray) -> np.ndarray:
        """Dense gating pre-activation f32 [N, n_ff]: gate·x, or up·x + b_up."""
        if self.gated:
            return self.k.matmul(self.w.gate, x)
        u = self.k.matmul(self.w.up, x)
        if self.w.b_up is not None:
            u += self.w.b_up
        return u

    # ---- modes -----------------------------------------------------------------------------------------

    def _dense(self, x: np.ndarray) -> np.ndarray:
        k, w = self.k, self.w
        if x.shape[0] == 1 and self.fused_dense is not None:  # the same kernels as below, in one C call
            return k.steps.dense_ffn_decode(self.fused_dense, np.ascontiguousarray(x[0]))[None, :]
        if self.variant in ("swiglu", "geglu"):
            glu = k.swiglu if self.variant == "swiglu" else k.geglu
            return self._down(glu(k.matmul(w.gate, x), k.matmul(w.up, x)), None)
        if self.variant == "gelu":
            return self._down(k.gelu(self._pre(x)), None)
        a = self._gate_act(self._pre(x))
        if self.stats is not None:
            n_active = int(np.count_nonzero(a))
        h = self._combine(a, k.matmul(w.up, x) if self.gated else None)
        if self.stats is not None:
            self.stats.record(self.layer, x.shape[0], n_active, int(np.count_nonzero(h)))
        return self._down(h, None)

    def _observed(self, x: np.ndarray, p: np.ndarray | None) -> np.ndarray:
        """The dense result, with the activated gating values shown to self.observer first."""
        k = self.k
        act = self._act(self._pre(x))
        self.observer(self.layer, x, p, act)
        h = self._combine(act.copy(), k.matmul(self.w.up, x) if self.gated else None)
        return self._down(h, None)

    def _exact(self, x: np.ndarray) -> np.ndarray:
        n_tok = x.shape[0]
        if n_tok == 1 and self.fused is not None:  # the same steps as below, in C
            x0 = np.ascontiguousarray(x[0])
            return self._one_token(*self.k.steps.sparse_ffn_decode(self.fused, x0, x0))
        a = self._gate_act(self._pre(x))
        if n_tok == 1:
            rows = self.k.select_nonzero(a[0])
        else:
            rows = np.flatnonzero((a != 0).any(axis=0)).astype(np.int32)
        n_active = int(np.count_nonzero(a))
        a = a[:, rows]  # a fresh compact copy [N, n_rows]
        dense = n_tok > 1 and len(rows) > DENSE_FALLBACK * self.n_ff
        u = self._up_rows(x, rows, dense) if self.gated else None
        h = self._combine(a, u)
        if self.stats is not None:
            self.stats.record(self.layer, n_tok, n_active, int(np.count_nonzero(h)))
        return self._down(h, rows)

    def _predictor(self, x: np.ndarray, p: np.ndarray) -> np.ndarray:
        k = self.k
        n_tok = x.shape[0]
        if n_tok == 1 and self.fused is not None and self.split is None:  # the same steps as below, in C
            return self._one_token(*k.steps.sparse_ffn_decode(self.fused, np.ascontiguousarray(x[0]),
                                                              np.ascontiguousarray(p[0])))
        logits = self.predict(p)
        if n_tok == 1:
            rows = k.select_active(logits[0], float(self.threshold))
            mask, n_active = None, len(rows)
        else:
            mask = logits >= self.threshold
            rows = np.flatnonzero(mask.any(axis=0)).astype(np.int32)
            n_active = int(np.count_nonzero(mask))
        dense = n_tok > 1 and len(rows) > DENSE_FALLBACK * self.n_ff
        keep = None if mask is None else mask[:, rows]
        if self.split is not None:  # hot rows on the device, cold rows here, partial outputs summed
            y, n_nonzero = self.split.run(self, x, rows, keep, dense)
        else:
            y, n_nonzero = self.partial(x, rows, keep, dense)
        if self.stats is not None:
            self.stats.record(self.layer, n_tok, n_active, n_nonzero)
        return y

    def predict(self, p: np.ndarray) -> np.ndarray:
        """The predictor logits f32 [N, n_ff] = fc2 · relu(fc1 · p) for p f32 [N, n_embd], computed as predictor
        mode computes them (one token: from fc2_t where that pays, predictor_logits); neuron i is predicted
        active for token t iff logits[t, i] >= self.threshold."""
        k = self.k
        r = k.matmul(self.fc1, p)  # [N, R]
        np.maximum(r, 0, out=r)
        logits = predictor_logits(k, self.fc2_t, r) if p.shape[0] == 1 and self.fc2_t is not None else None
        if logits is None:
            logits = k.matmul(self.fc2, r)  # [N, n_ff]
        return logits

    def partial(self, x: np.ndarray, rows: np.ndarray, keep: np.ndarray | None, dense: bool,
                bias: bool = True) -> tuple[np.ndarray, int]:
        """(y f32 [N, n_embd], non-zero h count) over the given neurons only (ascending int32 rows of this
        FFN's weights); keep bool [N, len(rows)] zeroes h where a token did not select a row. bias=False
        leaves b_down out (the hybrid split adds it once)."""
        w = self.w
        if self.gated:
            a = self._act(self._rows(w.gate, rows, x, dense))
            if not dense and self.variant in RELU_FAMILY:
                # a predicted neuron whose gate activation is 0 has h = 0 whatever its up value: gather up
                # rows (and run the AXPY) only where some token's activation is non-zero. Same bits: the
                # AXPY skips zero h anyway, and dropping zero rows from its list changes nothing.
                live = self.k.select_nonzero(a[0]) if a.shape[0] == 1 else \
                    np.flatnonzero((a != 0).any(axis=0)).astype(np.int32)
                if len(live) < len(rows):
                    rows, a = rows[live], a[:, live]
                    keep = None if keep is None else keep[:, live]
            h = self._combine(a, self._up_rows(x, rows, dense))
        else:
            h = self._combine(self._gate_act(self._up_rows(x, rows, dense)), None)
        if keep is not None:  # each token keeps only its own active neurons (exact zeros elsewhere)
            h = np.where(keep, h, np.float32(0))
        return self._down(h, rows, bias), int(np.count_nonzero(h))

    # ---- pieces ------------------------------------------------------------------------------------------

    def _one_token(self, y: np.ndarray, n_active: int, n_nonzero: int, n_up: int | None = None) -> np.ndarray:
        """The result of a one-token C step (y f32 [n_embd] and its counts) as FFN output [1, n_embd], counted."""
        if self.stats is not None:
            self.stats.record(self.layer, 1, n_active, n_nonzero, n_up)
        return y[None, :]

    def _rows(self, t: Tensor, rows: np.ndarray, x: np.ndarray, dense: bool) -> np.ndarray:
        """f32 [N, len(rows)] = x · t[rows].T, by the row gather or (dense) by the full matmul."""
        if dense:
            return np.ascontiguousarray(self.k.matmul(t, x)[:, rows])
        if len(rows) == 0:
            return np.zeros((x.shape[0], 0), dtype=np.float32)
        return self.k.matmul_rows(t, rows, x)

    def _up_rows(self, x: np.ndarray, rows: np.ndarray, dense: bool) -> np.ndarray:
        u = self._rows(self.w.up, rows, x, dense)
        if self.w.b_up is not None:
            u += self.w.b_up[rows]
        return u

    def _down(self, h: np.ndarray, rows: np.ndarray | None, bias: bool = True) -> np.ndarray:
        """y f32 [N, n_embd] from h f32 [N, len(rows)] (rows None: all n_ff neurons), + b_down (if bias)."""
        w = self.w
        n_tok = h.shape[0]
        if w.down_t is not None:
            rows = self.all_rows if rows is None else rows
            if len(rows) == 0:
                y = np.zeros((n_tok, w.down_t.shape[1]), dtype=np.float32)
            else:
                y = self.k.axpy_rows(w.down_t, rows, np.ascontiguousarray(h, dtype=np.float32))
        else:
            if rows is not None:  # dense down projection of the scattered h (inactive neurons exactly 0)
                full = np.zeros((n_tok, self.n_ff), dtype=np.float32)
                full[:, rows] = h
                h = full
            y = self.k.matmul(w.down, np.ascontiguousarray(h, dtype=np.float32))
        if bias and w.b_down is not None:
            y += w.b_down
        return y


# rows per piece of predictor_copy: a piece's f32 values (at most 64 K of them) stay in the core's L2 between the
# dequantize and the quantize
_COPY_PIECE_VALUES = 1 << 16


def predictor_copy(fc1: Tensor | None, fc2: Tensor | None, kind: str,
                   threads: int = 1) -> tuple[Tensor | None, Tensor | None]:
    """(fc1, fc2) as predictor mode runs them for `kind` (PREDICTOR_TYPES less "auto"): "exact" the file's
    tensors; "q8_0" / "q4_0" a copy of each float (F32/F16/BF16) one quantized to that type (rows of a multiple
    of 32 values; others stay as they are), so that fc1 · p and fc2 · r run the quantized mat-vec and the
    fc2 copy by hidden unit (fc2t.c) instead of reading 16 or 32 bits per weight. A predictor quantized in the
    file is kept: re-quantizing it would only add error. The copy is made in pieces of rows on `threads` threads
    (the C codecs release the GIL); its bytes do not depend on the thread count."""
    if kind not in ("q8_0", "q4_0"):
        return fc1, fc2
    try:  # the C codecs when built; the numpy ones otherwise (the same values)
        from ..kernels.cpu import dequantize, quantize
    except ImportError:  # pragma: no cover - only without a built extension
        from ..kernels.ref import dequantize, quantize
    ty = GGMLType.Q8_0 if kind == "q8_0" else GGMLType.Q4_0

    def copy(t: Tensor | None) -> Tensor | None:
        if t is None or t.type.name not in FC2T_FLOAT_TYPES or len(t.shape) != 2 or t.shape[1] % 32:
            return t
        n_rows, n_cols = t.shape
        data = np.asarray(t.data).reshape(n_rows, -1)
        step = max(1, _COPY_PIECE_VALUES // n_cols)
        pieces = [(r, min(n_rows, r + step)) for r in range(0, n_rows, step)]
        out = np.empty((n_rows, row_bytes(ty, n_cols)), np.uint8)

        def piece(bounds: tuple[int, int]) -> None:
            r0, r1 = bounds
            out[r0:r1] = quantize(dequantize(Tensor(t.name, t.type, (r1 - r0, n_cols), data[r0:r1])), ty)

        if threads > 1 and len(pieces) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(threads, len(pieces))) as pool:
                list(pool.map(piece, pieces))
        else:
            for b in pieces:
                piece(b)
        return Tensor(t.name, ty, t.shape, out)

    return copy(fc1), copy(fc2)


def predictor_copies(model) -> list[tuple[Tensor, Tensor]]:
    """(file tensor, the copy that runs) for every predictor tensor of a model's FFNs that predictor_copy
    replaced; [] for a model without (exact predictors, other modes)."""
    out = []
    for f in getattr(model, "ffns", ()):
        w = getattr(f, "w", None)
        for old, new in ((getattr(w, "fc1", None), getattr(f, "fc1", None)),
                         (getattr(w, "fc2", None), getattr(f, "fc2", None))):
            if old is not None and new is not None and new is not old:
                out.append((old, new))
    return out


def transposed_predictor(fc2: Tensor | None, kernels=None):
    """fc2 (n_ff, R) transposed to (R, n_ff) with the same values, for float types (FC2T_FLOAT_TYPES); a Q4_0 / Q8_0
    fc2's copy by hidden unit (kernels.fc2t_pack, an op of kernels.Ops: the same codes and scales, one row per
    unit), None without kernels; None for other quantized types (they would need re-quantizing along the other
    axis: other values)."""
    if fc2 is None:
        return None
    if fc2.type in FC2T_QUANT_TYPES and len(fc2.shape) == 2 and fc2.shape[1] % 32 == 0:
        return kernels.fc2t_pack(fc2) if kernels is not None else None
    if fc2.type.name not in FC2T_FLOAT_TYPES:
        return None
    try:  # the C transpose when built: 5-7x numpy's strided copy (F16 7B fc2: 7-10 ms against 48-60)
        from ..kernels.cpu import transpose
    except ImportError:  # pragma: no cover - only without a built extension
        from ..kernels.ref import transpose
    data = np.asarray(fc2.data).reshape(fc2.shape)
    return Tensor(fc2.name.replace("fc2", "fc2_t"), fc2.type, (fc2.shape[1], fc2.shape[0]), transpose(data))


# the hidden layer's non-zero share up to which reading fc2_t's rows beats the dense mat-vec of fc2 (F16, 7B
# shape, cold: 368 us at 50% against 616 us dense; the copies by hidden unit, 2 threads (bench_fc2_qt.py):
# Q4_0 1.9x at 50%, 1.0-1.2x at 80%, 0.9-1.0x at 90-100%; Q8_0 1.8-2.3x at 50%, 1.0-1.2x at 80%, 0.8-0.9x at 90%):
# the same bound as PI_FC2_AXPY_MAX_PERCENT in csrc/pi.h
FC2_AXPY_MAX_PERCENT = 80


def step_timing_sums(ffns) -> np.ndarray | None:
    """The one-token C steps' timing sums (FFN.step_timing: calls, predictor s, step s, summed non-zero hidden
    share) added over the given layers; None when none of them has such a step."""
    parts = [f.step_timing() for f in ffns if hasattr(f, "step_timing")]
    parts = [t for t in parts if t is not None]
    return np.sum(parts, axis=0) if parts else None


def predictor_logits(k, fc2_t, r: np.ndarray) -> np.ndarray | None:
    """One token's predictor logits f32 [1, n_ff] = fc2 · r as the AXPY over the non-zero r_k of fc2_t (or from
    a quantized fc2's copy by hidden unit: k.fc2t_logits), or None when too many r_k are non-zero for that to pay
    (then the caller runs the dense mat-vec). The C step (step_ffn.c) makes the same choice and calls."""
    rank = r.shape[1]
    nz = k.select_nonzero(r[0])
    if len(nz) * 100 > rank * FC2_AXPY_MAX_PERCENT:
        return None
    if isinstance(fc2_t, FC2T):  # a Q4_0 / Q8_0 fc2's copy by hidden unit
        return k.fc2t_logits(fc2_t, np.ascontiguousarray(r[0]))[None]
    if len(nz) == 0:
        return np.zeros((1, fc2_t.shape[1]), dtype=np.float32)
    return k.axpy_rows(fc2_t, nz, np.ascontiguousarray(r[:, nz]))
