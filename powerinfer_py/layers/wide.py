"""Model-wide activation sparsity ("wide" sparse mode) for dense SwiGLU/GeGLU models.

Every projection of a layer reads only the weight columns of the inputs that survive a magnitude cut-off:

  input j   the vector                         feeds                       stored transposed as (rows = inputs)
  0 attn_in   rmsnorm(x) * attn_norm           q, k, v                     blk.N.attn_qkv_t.weight    (n_embd, nq+nk+nv)
  1 attn_out  the attention output             o                           blk.N.attn_output_t.weight (nq, n_embd)
  2 ffn_in    rmsnorm(x) * ffn_norm            gate, up                    blk.N.ffn_gate_up_t.weight (n_embd, 2 n_ff)
  3 ffn_mid   act(gate·m) * (up·m)             down                        blk.N.ffn_down_t.weight    (n_ff, n_embd)

Per token, input element i of input j is kept iff score_i = |x_i| * c_i >= t_j (c_i = 1 for the plain criterion;
the norm of row i of the transposed matrix, i.e. of W's column i, for the WINA-style criteria), and
  y = sum_{kept i} x_i * W_t[i, :]
which is an AXPY over the kept rows (pi_axpy_rows, or pi_axpy_q8t for Q8 tiles): a row of the stored transpose
is one input's contiguous weights, so every skipped input is a skipped row of bytes. q|k|v and gate|up share
their input and sit side by side in one row, so one AXPY serves each shared input with longer contiguous rows. A batch (prefill) takes the union of its
tokens' kept rows and zeroes each token's own skipped inputs, so every token gets its one-token result. An
input whose cut-off is <= 0 keeps every element: the dense product through the same layout (`--sparse off` on
a calibrated file, and sparsity 0).

The cut-offs come from `powerinfer calibrate --wide` (tools/wide_calibrate.py), which stores in the file's
metadata (docs/FORMATS.md section 5b) per layer and input the quantiles of the score on calibration text and
a table that maps a model-wide target S (the fraction of these layers' weight bytes not read per token) to a
per-input sparsity; another S at run time is interpolated from both tables. The file holds the transposed
tensors instead of attn_q/k/v/output and ffn_gate/up/down: float sources keep their type (the same values),
quantized ones become Q8 tiles (kernels/ref.py's Q8Tiles: the dequantized matrix transposed, as int8 codes
blk.N.<name>.weight (I8) with one f32 scale per tile of 32 inputs x 32 outputs in blk.N.<name>.scale (F32), 8.03
bits per weight; any row length). A scale shared by 32 inputs lets a tile row's products be summed in integers
(the activations quantized per token and per 32 inputs), so a batch sums over inputs as a dense prefill does.
Files written before the tiles hold Q8_0 transposes (one f16 scale per row and block of 32 outputs): they still
load and run through pi_axpy_rows.

Rotation (LaRoSA-style, `calibrate --rotate`; off by default, since on the demo model it lost at equal bytes
read, docs/sparse.md): the normed hidden states attn_in and ffn_in are Gaussian-like, so dropping their small
elements loses much of their energy. A file may
store per layer an orthogonal matrix R_j (the principal directions of input j on calibration text, by falling
variance) as blk.N.attn_in_rot.weight / blk.N.ffn_in_rot.weight (rows = columns of R_j, so matmul gives
x' = R_j^T x) and the transposed weights already multiplied by it (W_t' = R_j^T W_t, so x'·W_t' = x·W_t). In the
rotated basis the energy sits in few elements and the cut-off drops little of it: on Gemma 3 270M cutting 40% of
ffn_in (every layer, nothing else) cost +2.3% perplexity rotated against +20% unrotated. Each rotation is a dense
n_embd x n_embd mat-vec per token; its bytes count as read in every reported sparsity.

Which models: those whose layers run the shared pre-norm block of models/base.py unchanged (its forward, q/k/v
projections and FFN construction), with a SwiGLU or GeGLU FFN in every layer, no experts, no FFN biases, not a
PWRI file. Everything outside the seven projections (norms, RoPE, attention, post-norms, the output head and
the embeddings) is as in the dense model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..config import KEY_WIDE_PREFIX, QUANTILE_STEPS
from ..errors import ModelFileError, PowerInferError, UnsupportedError
from ..gguf.types import GGMLType, Tensor
from ..kernels.ref import Q8Tiles, q8_tiles_shape, quantize_q8_tiles

INPUTS = ("attn_in", "attn_out", "ffn_in", "ffn_mid")  # the order of every per-input table
WIDE_TENSORS = ("attn_qkv_t", "attn_output_t", "ffn_gate_up_t", "ffn_down_t")  # blk.N.<name>.weight, by input
# a Q8 tile matrix is blk.N.<name>.weight (I8 codes, rows = inputs) with its scales in blk.N.<name>.scale (F32)
TILES_TYPE_NAME = "Q8_TILES"  # the stored type of a Q8 tile matrix in reports (calibrate's stored_types)
REPLACED = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")  # not in a wide file
WIDE_VARIANTS = ("swiglu", "geglu")
MAX_SPARSITY = 0.95
CRITERIA = ("plain", "wina", "greedy")

KEY_SPARSITY = KEY_WIDE_PREFIX + "sparsity"  # f32: the model-wide target the stored cut-offs meet
KEY_CRITERION = KEY_WIDE_PREFIX + "criterion"  # string, one of CRITERIA
KEY_CUTOFFS = KEY_WIDE_PREFIX + "cutoffs"  # f32 [n_layer * 4]
KEY_QUANTILES = KEY_WIDE_PREFIX + "quantiles"  # f32 [n_layer * 4 * 101]: score quantiles on GRID
KEY_ALLOC = KEY_WIDE_PREFIX + "alloc"  # f32 [101 * n_layer * 4]: per-input sparsity for model-wide S on GRID
KEY_COL_NORMS = KEY_WIDE_PREFIX + "col_norms."  # + layer: f32 [n_embd + nq + n_embd + n_ff] (the 4 inputs)
KEY_SOURCE_TYPES = KEY_WIDE_PREFIX + "source_types"  # string: the source file's types of the replaced tensors
KEY_ROTATED = KEY_WIDE_PREFIX + "rotated"  # string: the rotated inputs, comma-separated (ROTATABLE), or absent
ROTATABLE = ("attn_in", "ffn_in")  # the normed hidden states: rotated by blk.N.<input>_rot.weight when KEY_ROTATED
GRID = np.linspace(0.0, 1.0, QUANTILE_STEPS + 1)
_SAME_TYPE = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


def check_sparsity(sparsity: float) -> float:
    s = float(sparsity)
    if math.isnan(s) or not 0.0 <= s <= MAX_SPARSITY:
        raise PowerInferError(f"--sparsity must be in [0, {MAX_SPARSITY}] for sparse mode 'wide' (the fraction of "
                              f"the layers' weight bytes not read per token), got {sparsity}")
    return s


def check_wide_config(config, variant: str, what: str = "sparse mode 'wide'") -> None:
    """Refuse, naming the arch, the files the mode does not cover (what the config and the FFN variant,
    ffn.ffn_variant's, tell)."""
    arch = config.arch
    if config.is_sparse:
        raise UnsupportedError(f"{what} is for dense GGUF files of SwiGLU/GeGLU models; this is a PowerInfer (PWRI) "
                               f"{arch} file: use its predictor mode ('predictor' or 'exact')")
    if config.n_expert:
        raise UnsupportedError(f"{what} covers dense FFNs; this {arch} model is a mixture of experts: use 'off'")
    if config.ffn_layers and not all(config.ffn_layers):
        raise UnsupportedError(f"{what} needs an attention block and a gated FFN in every layer; this {arch} model "
                               "has layers without an FFN: use 'off'")
    if variant not in WIDE_VARIANTS:
        raise UnsupportedError(f"{what} is for SwiGLU/GeGLU models; this {arch} model's FFN is {variant}: use "
                               "'off' (or 'exact' where the FFN is ReLU-family)")


def check_wide_model(model, base: type, variant: str) -> None:
    """Refuse models whose layers do not run the shared pre-norm block of `base` (models/base.py's Model)
    unchanged (the config checks first)."""
    check_wide_config(model.config, variant)
    cls = type(model)
    own = [name for name in ("forward", "_qkv", "build_ffns") if getattr(cls, name) is not getattr(base, name)]
    if own or cls.FFN_BIASES:
        why = f"its own {', '.join(own)}" if own else "FFN biases"
        raise UnsupportedError(f"sparse mode 'wide' covers models that run the standard attention + gated FFN "
                               f"block; this {model.config.arch} model has {why}: use 'off'")


# ---- the calibration metadata ----------------------------------------------------------------------------

@dataclass
class WideCalibration:
    sparsity: float  # the model-wide target of `cutoffs`
    criterion: str
    cutoffs: np.ndarray  # f32 [n_layer, 4]
    quantiles: np.ndarray  # f32 [n_layer, 4, 101]
    alloc: np.ndarray  # f32 [101, n_layer, 4]
    col_norms: list | None  # per layer, 4 arrays f32 [width]; None: the plain score
    source_types: str = ""
    rotated: tuple = ()  # the inputs (of ROTATABLE) the file stores rotated

    def cuts(self, sparsity: float | None) -> np.ndarray:
        """f32 [n_layer, 4] cut-offs for model-wide `sparsity` (None: the calibrated one)."""
        if sparsity is None or abs(sparsity - self.sparsity) < 1e-6:
            return self.cutoffs.copy()
        s = check_sparsity(sparsity)
        n_layer = self.cutoffs.shape[0]
        out = np.zeros((n_layer, len(INPUTS)), dtype=np.float32)
        if s == 0.0:
            return out
        for il in range(n_layer):
            for j in range(len(INPUTS)):
                sj = float(np.interp(s, GRID, self.alloc[:, il, j]))
                out[il, j] = cut_at(self.quantiles[il, j], sj)
        return out

    def input_sparsities(self, sparsity: float | None) -> np.ndarray:
        """f32 [n_layer, 4]: the per-input sparsity (on calibration text) behind cuts(sparsity)."""
        s = self.sparsity if sparsity is None else check_sparsity(sparsity)
        return np.stack([np.interp(s, GRID, self.alloc[:, il, j]) for il in range(self.alloc.shape[1])
                         for j in range(len(INPUTS))]).reshape(self.alloc.shape[1], len(INPUTS)).astype(np.float32)


def cut_at(quantile_row: np.ndarray, s: float) -> float:
    """The cut-off that skips the fraction s of an input's scores (0: keep all, the dense product)."""
    if s <= 0.0:
        return 0.0
    return float(max(np.interp(s, GRID, quantile_row), np.nextafter(np.float32(0), np.float32(1))))


def parse_calibration(meta: Mapping, n_layer: int, widths: list[tuple[int, int, int, int]],
                      path: str = "MODEL") -> WideCalibration:
    """The wide calibration of a file's metadata (config.wide_meta), checked against the model's shape:
    a missing key or a table of the wrong length is a ModelFileError naming it."""
    n_in, n_q = len(INPUTS), QUANTILE_STEPS + 1

    def floats(key: str, n: int) -> np.ndarray:
        if key not in meta:
            raise ModelFileError(f"{path}: wide calibration without {key}: calibrate the file again "
                                 "(`powerinfer calibrate --wide`)")
        a = np.asarray(meta[key], dtype=np.float32).reshape(-1)
        if a.shape[0] != n:
            raise ModelFileError(f"{path}: {key} holds {a.shape[0]} values, expected {n} for this model "
                                 f"({n_layer} layers): the metadata does not match the tensors")
        if not np.all(np.isfinite(a)):
            raise ModelFileError(f"{path}: {key} holds a value that is not finite")
        return a

    if KEY_SPARSITY not in meta:
        raise ModelFileError(f"{path}: wide calibration without {KEY_SPARSITY}: calibrate the file again")
    s = float(np.asarray(meta[KEY_SPARSITY]).reshape(-1)[0])
    if not 0.0 <= s <= MAX_SPARSITY:
        raise ModelFileError(f"{path}: {KEY_SPARSITY} must be in [0, {MAX_SPARSITY}], got {s}")
    crit = meta.get(KEY_CRITERION, "plain")
    if crit not in CRITERIA:
        raise ModelFileError(f"{path}: {KEY_CRITERION} {crit!r} is not one of {', '.join(CRITERIA)}")
    cut = floats(KEY_CUTOFFS, n_layer * n_in).reshape(n_layer, n_in)
    q = floats(KEY_QUANTILES, n_layer * n_in * n_q).reshape(n_layer, n_in, n_q)
    alloc = floats(KEY_ALLOC, n_q * n_layer * n_in).reshape(n_q, n_layer, n_in)
    if np.any((alloc < 0) | (alloc > 1)):
        raise ModelFileError(f"{path}: {KEY_ALLOC} holds a sparsity outside [0, 1]")
    norms = None
    if any(str(k).startswith(KEY_COL_NORMS) for k in meta):
        norms = []
        for il in range(n_layer):
            a = floats(f"{KEY_COL_NORMS}{il}", sum(widths[il]))
            if np.any(a < 0):
                raise ModelFileError(f"{path}: {KEY_COL_NORMS}{il} holds a negative norm")
            norms.append(np.split(a, np.cumsum(widths[il])[:-1]))
    rotated = tuple(r for r in str(meta.get(KEY_ROTATED, "")).split(",") if r)
    bad = [r for r in rotated if r not in ROTATABLE]
    if bad:
        raise ModelFileError(f"{path}: {KEY_ROTATED} names {bad[0]!r}; only {', '.join(ROTATABLE)} can be rotated")
    return WideCalibration(s, str(crit), cut, q, alloc, norms, str(meta.get(KEY_SOURCE_TYPES, "")), rotated)


def is_wide_file(config) -> bool:
    return bool(getattr(config, "wide_meta", ()))


def check_source_tensors(names, config) -> None:
    """Refuse a source file that lacks one of the seven projections of some layer (a fused attn_qkv or
    gate|up tensor, an ungated FFN), naming the arch and the tensor."""
    for il in range(config.n_layer):
        for r in REPLACED:
            if f"blk.{il}.{r}.weight" not in names:
                raise UnsupportedError(f"calibrate --wide covers separate q/k/v/o projections and a gated FFN; this "
                                       f"{config.arch} file has no blk.{il}.{r}.weight")


def wide_expected(config, e: dict) -> dict:
    """The expected-tensor table of a wide-calibrated file: per layer the seven projections give way to the
    four transposed tensors, their shapes derived from the dense ones. Other files: e as it is."""
    if not is_wide_file(config):
        return e
    for il in range(config.n_layer):
        p = f"blk.{il}."
        names = [p + r + ".weight" for r in REPLACED]
        missing = [n for n in names if n not in e]
        if missing:  # (fused attn_qkv, experts, ungated FFNs: not the block the mode covers)
            raise UnsupportedError(f"a wide-calibrated file of a {config.arch} model: the mode covers separate "
                                   f"q/k/v/o projections and a gated FFN, this one has no {missing[0]}")
        (nq, d), (nk, _), (nv, _), _, (n_ff, _), _, _ = (e.pop(n)[0] for n in names)
        for name, shape in zip(WIDE_TENSORS, ((d, nq + nk + nv), (nq, d), (d, 2 * n_ff), (n_ff, d))):
            e[f"{p}{name}.weight"] = (shape, True)
            e[f"{p}{name}.scale"] = (q8_tiles_shape(*shape), False)  # Q8 tiles only (required for an I8 weight)
        for r in rotated_inputs(config):
            e[f"{p}{r}_rot.weight"] = ((d, d), True)
    return e


def rotated_inputs(config) -> tuple[str, ...]:
    """The inputs a wide-calibrated file stores rotated (KEY_ROTATED), () for none."""
    value = dict(config.wide_meta).get(KEY_ROTATED, "")
    return tuple(r for r in str(value).split(",") if r in ROTATABLE)


def layer_widths(config) -> list[tuple[int, int, int, int]]:
    """Per layer the lengths of the four inputs (n_embd, q width, n_embd, n_ff)."""
    nq = config.n_head * config.head_dim
    return [(config.n_embd, nq, config.n_embd, config.n_ff)] * config.n_layer


# ---- transposed layouts ----------------------------------------------------------------------------------

def transposed_type(sources: list[Tensor]) -> GGMLType:
    """The type of a transposed tensor made of `sources`: their float type when they share one (the same
    values), F32 for mixed float types, else I8: Q8 tiles (int8 codes with their f32 tile scales)."""
    types = {t.type for t in sources}
    if types <= set(_SAME_TYPE):
        return types.pop() if len(types) == 1 else GGMLType.F32
    return GGMLType.I8


def _codecs():
    try:  # the C codecs when built (fast); the numpy ones otherwise (same values)
        from ..kernels.cpu import dequantize, quantize, transpose
    except ImportError:  # pragma: no cover - only without a built extension
        from ..kernels.ref import dequantize, quantize, transpose
    return dequantize, quantize, transpose


def transposed(name: str, sources: list[Tensor],
               rotation: np.ndarray | None = None) -> tuple[Tensor | Q8Tiles, np.ndarray]:
    """(the transposed tensor of the row-wise concatenation of `sources` (each (m_i, K)), its row norms f32
    [K]): the matrix [W_1; W_2; ...] (sum m_i, K) becomes K rows of sum m_i values; with `rotation` R f32
    [K, K] (orthogonal) the rows are those of R^T W_t. Quantized sources give Q8 tiles (a Q8Tiles named
    `name`), float ones a Tensor (transposed_type). The row norms are those of the float matrix."""
    dequantize, quantize, transpose = _codecs()
    full = np.concatenate([np.asarray(dequantize(t), dtype=np.float32).reshape(t.shape) for t in sources], axis=0)
    t = transpose(np.ascontiguousarray(full))
    if rotation is not None:
        t = np.ascontiguousarray((rotation.T.astype(np.float64) @ t).astype(np.float32))
    norms = np.sqrt(np.einsum("ij,ij->i", t, t, dtype=np.float64)).astype(np.float32)
    ty = transposed_type(sources)
    if ty == GGMLType.I8:
        return quantize_q8_tiles(t, name), norms
    data = t if ty == GGMLType.F32 else quantize(t, ty)
    return Tensor(name, ty, t.shape, data), norms


def rotation_tensor(name: str, rotation: np.ndarray, like: Tensor | Q8Tiles) -> Tensor:
    """R (orthogonal f32 [K, K]) stored for matmul as the rows of R^T, in the type `like` (the rotated weights'):
    Q8_0 where those are Q8 tiles (a quantized source; R is applied by a mat-vec, which takes no tiles)."""
    _, quantize, _ = _codecs()
    rt = np.ascontiguousarray(rotation.T, dtype=np.float32)
    ty = GGMLType.Q8_0 if isinstance(like, Q8Tiles) else like.type
    if ty == GGMLType.F32:
        return Tensor(name, GGMLType.F32, rt.shape, rt)
    return Tensor(name, ty, rt.shape, quantize(rt, ty))


def source_tensors(model, il: int) -> list[list[Tensor]]:
    """Layer il's dense projection tensors grouped by input (q, k, v | o | gate, up | down)."""
    L, w = model.layers[il], model.ffns[il].w
    return [[L.wq, L.wk, L.wv], [L.wo], [w.gate, w.up], [w.down]]


def tensor_bytes(t: Tensor | Q8Tiles) -> int:
    """The bytes a stored weight occupies (Q8 tiles: the codes and the scales)."""
    if isinstance(t, Q8Tiles):
        return t.nbytes
    return int(np.asarray(t.data).nbytes)


def stored_type_name(t: Tensor | Q8Tiles) -> str:
    return TILES_TYPE_NAME if isinstance(t, Q8Tiles) else t.type.name


def scale_name(weight_name: str) -> str:
    """blk.N.<name>.weight -> blk.N.<name>.scale (the tile scales of a Q8 tile matrix)."""
    return weight_name[:-len(".weight")] + ".scale" if weight_name.endswith(".weight") else weight_name + ".scale"


def file_tensors(t: Tensor | Q8Tiles) -> list[Tensor]:
    """The GGUF tensors of a stored weight: a Tensor as it is; Q8 tiles as the I8 codes blk.N.<name>.weight
    [n_in, n_cols] and the F32 scales blk.N.<name>.scale [ceil(n_in / 32), ceil(n_cols / 32)]."""
    if not isinstance(t, Q8Tiles):
        return [t]
    return [Tensor(t.name, GGMLType.I8, t.shape, t.q), Tensor(scale_name(t.name), GGMLType.F32, t.d.shape, t.d)]


def tiles_from_file(tensors: Mapping[str, Tensor], name: str) -> Tensor | Q8Tiles:
    """The stored weight `name` of a wide file: an I8 tensor and its `.scale` tensor as Q8 tiles (checked: the
    scale present, F32, of the tile grid's shape, finite and >= 0), any other type as its Tensor. A scale
    tensor next to a weight that is not I8 is refused too. ModelFileError naming the tensor otherwise."""
    from .weights import get_tensor

    t = get_tensor(tensors, name)
    sname = scale_name(name)
    s = tensors.get(sname)
    if t.type != GGMLType.I8:
        if s is not None:
            raise ModelFileError(f"tensor {sname!r} holds Q8 tile scales, but {name!r} is {t.type.name}, not I8: "
                                 "the file is inconsistent")
        return t
    if len(t.shape) != 2:
        raise ModelFileError(f"tensor {name!r} (I8, Q8 tile codes) must be 2-D, got shape {t.shape}")
    want = q8_tiles_shape(*t.shape)
    if s is None:
        raise ModelFileError(f"tensor {name!r} is I8 (Q8 tile codes) but the file has no {sname!r} (its F32 tile "
                             f"scales, shape {want})")
    if s.type != GGMLType.F32:
        raise ModelFileError(f"tensor {sname!r} (the tile scales of {name!r}) must be F32, got {s.type.name}")
    if tuple(s.shape) != want:
        raise ModelFileError(f"tensor {sname!r} has shape {tuple(s.shape)}, expected {want} for the "
                             f"{t.shape[0]} x {t.shape[1]} codes of {name!r}")
    d = np.ascontiguousarray(s.data, dtype=np.float32).reshape(want)
    if not np.all(np.isfinite(d)):
        raise ModelFileError(f"tensor {sname!r} (the tile scales of {name!r}) holds a value that is not finite")
    if np.any(d < 0):
        raise ModelFileError(f"tensor {sname!r} (the tile scales of {name!r}) holds a negative scale")
    q = np.ascontiguousarray(np.asarray(t.data).view(np.int8).reshape(t.shape))
    return Q8Tiles(name, q, d)


# ---- the runtime ---------------------------------------------------------------------------------------------

class WideStats:
    """Rows read per layer and input since the last reset(): `kept[il, j]` inputs kept over `tokens[il]` tokens.
    Fractions weight each input's rows by their bytes, so `fractions` (per layer) and `mean_fraction` are the
    share of the seven projections' weight bytes read per token."""

    mode = "wide"
    up_read_fraction = None  # (the field threshold mode's reports read)

    def __init__(self, widths: np.ndarray, row_bytes: np.ndarray, fixed_bytes: np.ndarray | None = None):
        self.widths = np.asarray(widths, dtype=np.float64)  # [n_layer, 4]
        self.row_bytes = np.asarray(row_bytes, dtype=np.float64)  # [n_layer, 4]
        # bytes every token reads besides the kept rows: the rotations (their share can make a sparsity negative)
        self.fixed_bytes = np.zeros(self.widths.shape[0]) if fixed_bytes is None else np.asarray(fixed_bytes, float)
        self.n_layer = self.widths.shape[0]
        self.tokens = np.zeros(self.n_layer, dtype=np.int64)
        self.kept = np.zeros((self.n_layer, len(INPUTS)), dtype=np.int64)

    def reset(self) -> None:
        self.tokens[:] = 0
        self.kept[:] = 0

    def record(self, il: int, j: int, n_tok: int, n_kept: int) -> None:
        if j == 0:
            self.tokens[il] += n_tok
        self.kept[il, j] += n_kept

    @property
    def input_fractions(self) -> list[list[float]]:
        """Per layer and input: mean fraction of the input's elements kept (its rows read) per token."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return (self.kept / (self.tokens[:, None] * self.widths)).tolist()

    @property
    def fractions(self) -> list[float]:
        """Per layer: mean fraction of the layer's projection weight bytes read per token."""
        with np.errstate(invalid="ignore", divide="ignore"):
            read = (self.kept * self.row_bytes).sum(axis=1) + self.tokens * self.fixed_bytes
            return [float(f) for f in read / (self.tokens * (self.widths * self.row_bytes).sum(axis=1))]

    @property
    def mean_fraction(self) -> float:
        total = float((self.tokens * (self.widths * self.row_bytes).sum(axis=1)).sum())
        read = float((self.kept * self.row_bytes).sum() + (self.tokens * self.fixed_bytes).sum())
        return read / total if total else float("nan")

    @property
    def skipped_fraction(self) -> float:
        """Mean fraction of the projections' weight bytes not read per token (the model-wide sparsity)."""
        return 1.0 - self.mean_fraction

    @property
    def input_skipped(self) -> list[float]:
        """Per input (over all layers): mean fraction of its elements skipped per token."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return [float(1 - f) for f in self.kept.sum(axis=0) / (self.tokens[:, None] * self.widths).sum(axis=0)]

    def lines(self) -> list[str]:
        """The per-layer report of `run -v`, `info -v`, `perplexity` and `bench`: skipped % per input."""
        rot = " (the rotations' bytes counted as read)" if self.fixed_bytes.any() else ""
        out = [f"model-wide sparsity: {100 * self.skipped_fraction:.1f}% of the projection weight bytes skipped "
               f"per token{rot}; by input " + ", ".join(f"{n} {100 * s:.1f}%" for n, s in zip(INPUTS, self.input_skipped))]
        fr = self.input_fractions
        for il in range(self.n_layer):
            out.append(f"  layer {il:2d}: " + " ".join(f"{n} {100 * (1 - f):5.1f}%" for n, f in zip(INPUTS, fr[il]))
                       + f" | bytes {100 * (1 - self.fractions[il]):5.1f}%")
        return out

    def to_json(self) -> dict:
        return {"skipped_fraction": self.skipped_fraction, "layers_skipped": [1 - f for f in self.fractions],
                "inputs": list(INPUTS), "input_skipped": self.input_skipped,
                "layer_input_skipped": [[1 - f for f in row] for row in self.input_fractions]}


class WideLayer:
    """One layer's four column-sparse projections (the module docstring)."""

    def __init__(self, kernels, il: int, weights: list[Tensor | Q8Tiles], q_split: tuple[int, int, int], n_ff: int,
                 variant: str, stats: WideStats | None):
        self.k, self.il, self.w, self.variant, self.stats = kernels, il, weights, variant, stats
        self.q_split, self.n_ff = q_split, n_ff
        self.cuts = np.zeros(len(INPUTS), dtype=np.float32)
        self.scales: list[np.ndarray | None] = [None] * len(INPUTS)
        self.all_rows = [np.arange(w.shape[0], dtype=np.int32) for w in weights]
        self.rot: list[Tensor | None] = [None] * len(INPUTS)  # per input: rows of R^T, or None (not rotated)
        self.observer = None  # calibration: observer(il, j, x) sees each input (rotated) before it is cut

    def set_cuts(self, cuts, scales=None) -> None:
        self.cuts = np.asarray(cuts, dtype=np.float32).reshape(len(INPUTS))
        self.scales = [None] * len(INPUTS) if scales is None else [
            None if s is None else np.asarray(s, dtype=np.float32) for s in scales]

    def project(self, j: int, x: np.ndarray) -> np.ndarray:
        """y f32 [N, n_out] = x [N, n_in] through input j's transposed weights, over its kept elements only."""
        k, n = self.k, x.shape[0]
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.rot[j] is not None:  # x' = R^T x, the basis the stored weights were rotated into
            x = k.matmul(self.rot[j], x)
        if self.observer is not None:
            self.observer(self.il, j, x)
        cut = float(self.cuts[j])
        if cut <= 0.0:
            rows, h, n_kept = self.all_rows[j], x, x.size
        else:
            score = np.abs(x)
            if self.scales[j] is not None:
                score *= self.scales[j]
            if n == 1:
                rows = k.select_active(score[0], cut)
                h, n_kept = x[:, rows], len(rows)
            else:
                mask = score >= np.float32(cut)
                rows = np.flatnonzero(mask.any(axis=0)).astype(np.int32)
                n_kept = int(np.count_nonzero(mask))
                h = np.where(mask[:, rows], x[:, rows], np.float32(0))
        if self.stats is not None:
            self.stats.record(self.il, j, n, n_kept)
        if len(rows) == 0:
            return np.zeros((n, self.w[j].shape[1]), dtype=np.float32)
        h = np.ascontiguousarray(h, dtype=np.float32)
        if isinstance(self.w[j], Q8Tiles):
            return k.axpy_tiles(self.w[j], rows, h)
        return k.axpy_rows(self.w[j], rows, h)

    def qkv(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        y = self.project(0, h)
        nq, nk, _ = self.q_split
        return (np.ascontiguousarray(y[:, :nq]), np.ascontiguousarray(y[:, nq:nq + nk]),
                np.ascontiguousarray(y[:, nq + nk:]))

    def o(self, a: np.ndarray) -> np.ndarray:
        return self.project(1, a)

    def ffn(self, m: np.ndarray) -> np.ndarray:
        y = self.project(2, m)
        g, u = np.ascontiguousarray(y[:, :self.n_ff]), np.ascontiguousarray(y[:, self.n_ff:])
        h = self.k.swiglu(g, u) if self.variant == "swiglu" else self.k.geglu(g, u)
        return self.project(3, h)


class WideFFN:
    """The FFN slot of a wide layer (models/base.py calls ffns[il](x, p)): the gate|up and down projections."""

    observer = None
    split = None

    def __init__(self, layer: WideLayer):
        self.layer, self.n_ff, self.stats = layer, layer.n_ff, None

    def __call__(self, x: np.ndarray, p: np.ndarray | None = None) -> np.ndarray:
        return self.layer.ffn(x)


def attach(model, base: type, variant: str, weights: list[list[Tensor]], cuts: np.ndarray | None = None,
           col_norms: list | None = None, rotations: list[list] | None = None) -> list[WideLayer]:
    """Switch `model` (an instance of a subclass of `base`, models/base.py's Model, checked by check_wide_model) to the wide forward: per layer the four transposed tensors
    `weights[il]` (by input), the cut-offs f32 [n_layer, 4] (None: all 0, dense) and the score factors (None:
    plain |x|); variant: the FFN's (swiglu or geglu); rotations: per layer 4 rotation tensors or None. Sets
    model.wide, each layer's `wide`, model.ffns and model.sparsity (a WideStats)."""
    check_wide_model(model, base, variant)
    c = model.config
    nq, nkv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    widths = np.array([[w.shape[0] for w in ws] for ws in weights])
    row_bytes = np.array([[tensor_bytes(w) / max(1, w.shape[0]) for w in ws] for ws in weights])
    fixed = np.array([sum(tensor_bytes(r) for r in rs if r is not None) for rs in rotations]) if rotations else None
    stats = WideStats(widths, row_bytes, fixed)
    layers = []
    for il, ws in enumerate(weights):
        lay = WideLayer(model.kernels, il, ws, (nq, nkv, nkv), c.n_ff, variant, stats)
        if rotations:
            lay.rot = list(rotations[il])
        if cuts is not None:
            lay.set_cuts(cuts[il], None if col_norms is None else col_norms[il])
        model.layers[il].wide = lay
        layers.append(lay)
    model.wide = layers
    model.ffns = [WideFFN(lay) for lay in layers]
    model.sparsity = stats
    return layers


def attach_from_file(model, base: type, variant: str, tensors: Mapping[str, Tensor], settings) -> list[WideLayer]:
    """attach() with a wide-calibrated file's own transposed tensors and `settings` (ffn.SparseSettings: mode
    'wide' with its cut-offs, or 'off': every cut-off 0)."""
    from .weights import get_tensor

    c = model.config
    cal = parse_calibration(dict(c.wide_meta), c.n_layer, layer_widths(c))
    weights = [[tiles_from_file(tensors, f"blk.{il}.{name}.weight") for name in WIDE_TENSORS]
               for il in range(c.n_layer)]
    cuts = np.asarray(settings.wide_cuts, dtype=np.float32).reshape(c.n_layer, len(INPUTS)) \
        if settings.mode == "wide" else None
    rot = [[get_tensor(tensors, f"blk.{il}.{n}_rot.weight") if n in cal.rotated else None for n in INPUTS]
           for il in range(c.n_layer)] if cal.rotated else None
    return attach(model, base, variant, weights, cuts, cal.col_norms, rot)
