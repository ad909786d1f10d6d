"""`powerinfer calibrate --wide`: calibrate the model-wide sparse mode (layers/wide.py) and write a copy of the
model whose seven projections per layer are stored transposed, with the cut-offs and tables in its metadata.

Steps:
 1. Load the source densely, build each layer's four transposed tensors (q|k|v, o, gate|up, down; float types
    keep their values, quantized types become Q8 tiles: int8 codes, one f32 scale per 32 x 32 tile) and switch
    the model to the wide forward with every cut-off at 0: the dense product through the new layout.
 2. Run that dense forward over the calibration text (perplexity.py's windows, BOS rows left out) and keep a
    uniform sample of at most MAX_ROWS token rows of every (layer, input) vector.
 3. From the samples, per input: the quantiles of the plain score |x_i| and of the WINA score |x_i| * ||W_t[i]||
    (the norm of the weights that input i multiplies), on the 101-point grid.
 4. Three criteria, each a (score, allocation) pair; the allocation maps a model-wide target S (the fraction of
    the seven projections' weight bytes not read per token) to per-input sparsities:
      plain   |x|,        every input at sparsity S
      wina    |x| * norm, every input at sparsity S
      greedy  |x|,        per-kind sparsities chosen greedily (as TEAL does, here on the model's loss): the mean
              NLL on GREEDY_TOKENS calibration tokens is measured with one input kind (attn_in, attn_out,
              ffn_in or ffn_mid, in every layer) cut to each of GREEDY_LEVELS; then, from 0, the sparsity of
              the kind whose loss grows least per byte saved is raised 1% at a time; the path gives the
              allocation for every S (the same in every layer). An earlier version ranked inputs by their own
              output error ||W (x - x_cut)||^2 / ||W x||^2 instead: it under-rated the normed hidden states
              and cost much more perplexity (docs/sparse.md).
 5. `criterion="auto"` measures the perplexity of each at the target S on the calibration tokens and keeps the
    lowest (the three numbers are returned and printed); otherwise the one asked for.
 6. Write the copy (atomically): every other tensor unchanged, the transposed tensors instead of the seven (a Q8
    tile matrix as its I8 codes .weight and F32 scales .scale), the keys of docs/FORMATS.md section 5b;
    threshold-mode keys of the source are dropped (its tensors are gone).

Memory: the samples take at most MAX_VALUES floats in all (fewer rows for wide models). The transposed tensors
are built in memory before the file is written. Time: the dense pass, plus for the greedy 1 + 4 * 4 perplexity
runs of GREEDY_TOKENS tokens, plus for auto three of SELECT_TOKENS.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..config import KEY_FFN_NEURON_SCALES, KEY_SPARSITY, KEY_WIDE_PREFIX
from ..errors import PowerInferError
from ..layers import wide as W
from .perplexity import DEFAULT_BATCH, windows

MAX_ROWS = 768  # sampled token rows per (layer, input)
MAX_VALUES = 1 << 26  # floats of samples in all (256 MiB)
GREEDY_LEVELS = (0.25, 0.5, 0.75, 0.95)  # sparsities at which the greedy measures each input kind's loss
GREEDY_TOKENS = 384  # calibration tokens behind each of those measurements
SELECT_TOKENS = 1024  # calibration tokens scored per criterion by criterion="auto"
CRITERION_CHOICES = ("auto", *W.CRITERIA)
# the inputs --rotate rotates: ffn_in only. A rotation costs an n_embd x n_embd mat-vec per token, which pays
# where the input feeds many bytes (gate|up: 2 n_ff columns); rotating attn_in too (q|k|v, fewer columns) read
# more bytes than its extra sparsity saved on Gemma 3 270M (docs/sparse.md)
ROTATE_DEFAULT = ("ffn_in",)


@dataclass
class WideResult:
    path: Path
    sparsity: float
    criterion: str
    n_tokens: int
    text_source: str
    selection: dict = field(default_factory=dict)  # criterion -> perplexity on the calibration tokens (auto)
    selection_tokens: int = 0
    greedy_curves: list | None = None  # [4][1 + len(GREEDY_LEVELS)] NLL increase per input kind (greedy only)
    input_skipped: list = field(default_factory=list)  # [n_layer][4] fraction below the cut-off on the samples
    source_types: str = ""
    stored_types: str = ""
    n_weights: int = 0  # elements of the seven projections, all layers
    source_bytes: int = 0
    stored_bytes: int = 0
    rotated: bool = False
    rotation_bytes: int = 0  # included in stored_bytes

    @property
    def source_bpw(self) -> float:
        return 8.0 * self.source_bytes / max(1, self.n_weights)

    @property
    def stored_bpw(self) -> float:
        return 8.0 * self.stored_bytes / max(1, self.n_weights)

    def to_json(self) -> dict:
        return {"path": str(self.path), "sparsity": self.sparsity, "criterion": self.criterion,
                "n_tokens": self.n_tokens, "text_source": self.text_source, "selection_perplexity": self.selection,
                "selection_tokens": self.selection_tokens, "inputs": list(W.INPUTS),
                "greedy_levels": list(GREEDY_LEVELS), "greedy_curves": self.greedy_curves,
                "input_skipped": self.input_skipped, "source_types": self.source_types,
                "stored_types": self.stored_types, "source_bits_per_weight": self.source_bpw,
                "stored_bits_per_weight": self.stored_bpw, "source_bytes": self.source_bytes,
                "stored_bytes": self.stored_bytes, "rotated": self.rotated, "rotation_bytes": self.rotation_bytes}


def build_transposed(model) -> tuple[list[list], list[list[np.ndarray]], set, int, int]:
    """(per layer the four transposed tensors (Tensor or, for quantized sources, wide.Q8Tiles), their row norms,
    the source types, elements, source bytes)."""
    weights, norms, types, n_el, n_bytes = [], [], set(), 0, 0
    for il in range(model.config.n_layer):
        groups = W.source_tensors(model, il)
        ws, ns = [], []
        for name, src in zip(W.WIDE_TENSORS, groups):
            t, nrm = W.transposed(f"blk.{il}.{name}.weight", src)
            ws.append(t)
            ns.append(nrm)
            for s in src:
                types.add(s.type.name)
                n_el += int(np.prod(s.shape))
                n_bytes += W.tensor_bytes(s)
        weights.append(ws)
        norms.append(ns)
    return weights, norms, types, n_el, n_bytes


class _Sampler:
    """observer(il, j, x) of WideLayer: keeps a uniform sample of the rows (BOS rows left out) and, for the
    inputs in `cov_inputs`, the sum of x^T x over every row (the covariance behind a rotation)."""

    def __init__(self, n_layer: int, keep: float, seed: int = 0, cov_inputs: tuple[int, ...] = ()):
        self.rows = [[[] for _ in W.INPUTS] for _ in range(n_layer)]
        self.cov_inputs = cov_inputs
        self.cov = [[None] * len(W.INPUTS) for _ in range(n_layer)]
        self.n_cov = np.zeros(n_layer, dtype=np.int64)
        self.keep, self.rng = keep, np.random.default_rng(seed)
        self.skip_first = False
        self._pick = None

    def __call__(self, il: int, j: int, x: np.ndarray) -> None:
        if il == 0 and j == 0:  # one choice of rows per forward call, the same for every input
            n = x.shape[0]
            pick = np.flatnonzero(self.rng.random(n) < self.keep)
            self._pick = pick[pick >= 1] if self.skip_first else pick
        if len(self._pick):
            self.rows[il][j].append(x[self._pick].copy())
        if j in self.cov_inputs:
            xs = x[1:] if self.skip_first else x
            xtx = xs.T @ xs
            self.cov[il][j] = xtx if self.cov[il][j] is None else self.cov[il][j] + xtx
            if j == self.cov_inputs[0]:
                self.n_cov[il] += xs.shape[0]

    def samples(self) -> list[list[np.ndarray]]:
        return [[np.concatenate(r) if r else np.zeros((0, 0), np.float32) for r in lay] for lay in self.rows]


def _quantiles(x: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    s = np.abs(x) if scale is None else np.abs(x) * scale
    return np.quantile(s.astype(np.float64).reshape(-1), W.GRID).astype(np.float32)


def loss_curves(eval_nll: Callable[[np.ndarray], float], quantiles: np.ndarray,
                levels: tuple[float, ...] = GREEDY_LEVELS) -> np.ndarray:
    """f [4, 1 + len(levels)]: the increase of the mean NLL on calibration tokens when only input kind j (in
    every layer) is cut to each sparsity of `levels` (column 0: sparsity 0, no increase). eval_nll(cuts) runs
    the model with cut-offs f32 [n_layer, 4]."""
    n_layer = quantiles.shape[0]
    base = eval_nll(np.zeros((n_layer, len(W.INPUTS)), np.float32))
    out = np.zeros((len(W.INPUTS), 1 + len(levels)))
    for j in range(len(W.INPUTS)):
        for k, lv in enumerate(levels):
            cuts = np.zeros((n_layer, len(W.INPUTS)), np.float32)
            cuts[:, j] = [W.cut_at(quantiles[il, j], lv) for il in range(n_layer)]
            out[j, k + 1] = eval_nll(cuts) - base
    return out


def greedy_alloc(curves: np.ndarray, kind_bytes: np.ndarray, n_layer: int,
                 levels: tuple[float, ...] = GREEDY_LEVELS) -> np.ndarray:
    """alloc f32 [101, n_layer, 4] from the loss curves of the four input kinds (loss_curves) and their bytes
    [4]: starting from 0, repeatedly raise by 1% the sparsity of the kind whose (interpolated, made
    non-decreasing) loss grows least per byte saved; the path read at each grid S, the same for every layer."""
    fine = np.round(np.arange(0.0, W.MAX_SPARSITY + 1e-9, 0.01), 6)
    xs = np.array([0.0, *levels])
    f = np.stack([np.interp(fine, xs, np.maximum.accumulate(np.maximum(c, 0.0))) for c in curves])
    frac = np.asarray(kind_bytes, dtype=np.float64) / float(np.sum(kind_bytes))
    at = np.zeros(len(W.INPUTS), dtype=np.int64)
    states_s, states_a = [0.0], [np.zeros(len(W.INPUTS))]
    total = 0.0
    while np.any(at < len(fine) - 1):
        room = at < len(fine) - 1
        nxt = np.minimum(at + 1, len(fine) - 1)
        cost = f[np.arange(len(W.INPUTS)), nxt] - f[np.arange(len(W.INPUTS)), at]
        ratio = np.where(room, cost / np.maximum(frac * 0.01, 1e-12), np.inf)
        j = int(np.argmin(np.where(ratio == ratio.min(), -frac, np.inf)))  # ties: the kind with more bytes
        total += 0.01 * frac[j]
        at[j] += 1
        states_s.append(total)
        states_a.append(fine[at].copy())
    s_arr, a_arr = np.asarray(states_s), np.stack(states_a)
    out = np.zeros((len(W.GRID), n_layer, len(W.INPUTS)), dtype=np.float32)
    for g, s in enumerate(W.GRID):
        for j in range(len(W.INPUTS)):
            out[g, :, j] = np.interp(s, s_arr, a_arr[:, j])
    return out


def uniform_alloc(n_layer: int) -> np.ndarray:
    return np.broadcast_to(np.minimum(W.GRID, W.MAX_SPARSITY)[:, None, None].astype(np.float32),
                           (len(W.GRID), n_layer, len(W.INPUTS))).copy()


def shift_alloc(alloc: np.ndarray, shift: float) -> np.ndarray:
    """The allocation for net model-wide targets when every token also reads `shift` (a fraction of the
    projection bytes: the rotations): row S holds the rows' allocation at S + shift."""
    if shift <= 0:
        return alloc
    out = np.empty_like(alloc)
    for il in range(alloc.shape[1]):
        for j in range(alloc.shape[2]):
            out[:, il, j] = np.interp(np.minimum(W.GRID + shift, 1.0), W.GRID, alloc[:, il, j])
    return out


def cutoffs(alloc: np.ndarray, quantiles: np.ndarray, sparsity: float) -> np.ndarray:
    """f32 [n_layer, 4] cut-offs at model-wide `sparsity` (wide.WideCalibration.cuts' rule)."""
    cal = W.WideCalibration(-1.0, "plain", np.zeros(quantiles.shape[:2], np.float32), quantiles, alloc, None)
    return cal.cuts(sparsity)


def calibrate_wide(model: str | os.PathLike, out: str | os.PathLike, sparsity: float, text: str | None = None,
                   n_tokens: int = 1024, ctx: int = 256, threads: int | None = None,
                   on_progress: Callable[[str], None] | None = None, criterion: str = "auto",
                   select_tokens: int = SELECT_TOKENS, batch: int = DEFAULT_BATCH,
                   rotate: bool = False) -> WideResult:
    """Calibrate `model` for model-wide `sparsity` (in [0, 0.95]) on `text` (None: sampled from the model) and
    write the copy `out` (module docstring). rotate: store ffn_in rotated (ROTATE_DEFAULT; off by default: on the
    demo's evaluation text it lost to the unrotated file up to ~40%, docs/sparse.md; float sources then no longer
    keep their exact values)."""
    from ..gguf import open_gguf
    from ..gguf.writer import check_free_space, write_gguf
    from ..layers.ffn import ffn_variant
    from ..llm import load
    from ..models.base import Model
    from .calibrate import sample_text
    from .perplexity import perplexity

    sparsity = W.check_sparsity(sparsity)
    if criterion not in CRITERION_CHOICES:
        raise PowerInferError(f"--criterion must be one of {', '.join(CRITERION_CHOICES)}, got {criterion!r}")
    if n_tokens < 1:
        raise PowerInferError(f"--tokens must be at least 1, got {n_tokens}")
    out = Path(out)
    if not out.parent.is_dir():
        raise PowerInferError(f"output folder does not exist: {out.parent}")
    if out.is_dir():
        raise PowerInferError(f"output path is a folder: {out}")
    say = on_progress or (lambda msg: None)
    with load(model, threads=threads, n_ctx=max(ctx, 2), sparse="off") as llm:
        c, net = llm.config, llm.model
        if W.is_wide_file(c):
            raise PowerInferError(f"{model} is already a wide-calibrated file (its projections are stored "
                                  "transposed): calibrate its source file")
        variant = ffn_variant(c)
        W.check_wide_config(c, variant, "calibrate --wide")
        W.check_wide_model(net, Model, variant)
        W.check_source_tensors(llm.file.tensors, c)
        check_free_space(out, int(1.1 * Path(model).stat().st_size))
        say("building the transposed projections")
        groups = [W.source_tensors(net, il) for il in range(c.n_layer)]  # (attach replaces net.ffns)
        weights, norms, src_types, n_el, src_bytes = build_transposed(net)
        rot_j = tuple(W.INPUTS.index(r) for r in ROTATE_DEFAULT) if rotate else ()
        layers = W.attach(net, Model, variant, weights)
        if text is None:
            say(f"no --text: sampling {n_tokens} calibration tokens from the model itself")
            ids, source = sample_text(llm, n_tokens), "sampled from the model"
        else:
            ids, source = llm.tokenize(text, add_bos=False, special=False)[:n_tokens], "file"
            if not ids:
                raise PowerInferError("the calibration text is empty")
        say(f"calibrating on {len(ids)} tokens ({source})")
        width = sum(w.shape[0] for w in weights[0])
        rows = max(16, min(MAX_ROWS, MAX_VALUES // max(1, width * c.n_layer)))
        sampler = _Sampler(c.n_layer, min(1.0, rows / max(1, len(ids))), cov_inputs=rot_j)
        bos = llm.tokenizer.bos_id if llm.tokenizer.bos_id is not None and llm.tokenizer.bos_id >= 0 else None
        for lay in layers:
            lay.observer = sampler
        try:
            cache = net.new_cache(min(ctx, llm.n_ctx))
            for w in windows(ids, min(ctx, llm.n_ctx), bos):
                cache.clear()
                arr = np.asarray(w, dtype=np.int32)
                for s in range(0, len(arr), batch):
                    sampler.skip_first = s == 0 and bos is not None
                    net.forward(arr[s:s + batch], cache)
        finally:
            for lay in layers:
                lay.observer = None
        samples = sampler.samples()
        if samples[0][0].shape[0] == 0:
            raise PowerInferError("no activations were sampled: give a longer calibration text (--tokens)")
        rotations = None
        if rot_j:
            say(f"rotating {', '.join(ROTATE_DEFAULT)} into its principal directions")
            rotations = [[None] * 4 for _ in range(c.n_layer)]
            for il in range(c.n_layer):
                for j in rot_j:
                    _, vec = np.linalg.eigh(sampler.cov[il][j].astype(np.float64) / max(1, sampler.n_cov[il]))
                    r = np.ascontiguousarray(vec[:, ::-1])  # columns by falling variance
                    t, norms[il][j] = W.transposed(weights[il][j].name, groups[il][j], r)
                    weights[il][j] = layers[il].w[j] = t
                    rotations[il][j] = layers[il].rot[j] = W.rotation_tensor(
                        f"blk.{il}.{W.INPUTS[j]}_rot.weight", r, t)
                    samples[il][j] = (samples[il][j].astype(np.float64) @ r).astype(np.float32)
            layers[0].stats.fixed_bytes = np.array([sum(W.tensor_bytes(x) for x in rs if x is not None)
                                                    for rs in rotations], dtype=np.float64)
            sampler.cov = None
        proj_bytes = sum(W.tensor_bytes(w) for ws in weights for w in ws)
        rot_bytes = 0 if rotations is None else sum(W.tensor_bytes(x) for rs in rotations for x in rs if x is not None)
        shift = rot_bytes / proj_bytes  # the rotations are read on every token: skip that much more to break even
        q_plain = np.stack([[_quantiles(samples[il][j], None) for j in range(4)] for il in range(c.n_layer)])
        q_wina = np.stack([[_quantiles(samples[il][j], norms[il][j]) for j in range(4)] for il in range(c.n_layer)])
        uni = shift_alloc(uniform_alloc(c.n_layer), shift)
        want = list(W.CRITERIA) if criterion == "auto" else [criterion]
        if sparsity == 0.0:
            want = [criterion if criterion != "auto" else "plain"]
        candidates, greedy_curves = {}, None
        for crit in want:
            if crit == "greedy":
                say(f"greedy allocation: {1 + 4 * len(GREEDY_LEVELS)} perplexity runs on "
                    f"{min(GREEDY_TOKENS, len(ids))} calibration tokens")
                g_ids = ids[:GREEDY_TOKENS]

                def eval_nll(cuts: np.ndarray) -> float:
                    for il, lay in enumerate(layers):
                        lay.set_cuts(cuts[il])
                    return perplexity(llm, g_ids, ctx=min(ctx, llm.n_ctx), batch=batch).nll

                curves = loss_curves(eval_nll, q_plain)
                kind_bytes = np.array([[W.tensor_bytes(w) for w in ws] for ws in weights], dtype=np.float64).sum(0)
                candidates[crit] = (q_plain, shift_alloc(greedy_alloc(curves, kind_bytes, c.n_layer), shift), None)
                greedy_curves = curves
            else:
                candidates[crit] = (q_plain if crit == "plain" else q_wina, uni, None if crit == "plain" else norms)
        selection, n_sel = {}, 0
        if len(candidates) > 1:
            sel_ids = ids[:select_tokens]
            for crit, (q, alloc, nrm) in candidates.items():
                cuts = cutoffs(alloc, q, sparsity)
                for il, lay in enumerate(layers):
                    lay.set_cuts(cuts[il], None if nrm is None else nrm[il])
                res = perplexity(llm, sel_ids, ctx=min(ctx, llm.n_ctx), batch=batch)
                selection[crit], n_sel = float(np.exp(res.nll)), res.n_tokens
                say(f"criterion {crit}: perplexity {selection[crit]:.4f} on {res.n_tokens} calibration tokens "
                    f"at sparsity {sparsity:g}")
            chosen = min(selection, key=selection.get)
        else:
            chosen = want[0]
        q, alloc, nrm = candidates[chosen]
        cuts = cutoffs(alloc, q, sparsity)
        skipped = []
        for il in range(c.n_layer):
            row = []
            for j in range(4):
                sc = np.abs(samples[il][j]) * (1.0 if nrm is None else nrm[il][j])
                row.append(float(np.mean(sc < cuts[il, j])) if cuts[il, j] > 0 else 0.0)
            skipped.append(row)
        del samples
    stored_types = sorted({W.stored_type_name(w) for ws in weights for w in ws})
    stored_bytes = proj_bytes + rot_bytes
    with open_gguf(model) as src:
        meta = dict(src.metadata)
        types = dict(src.metadata_types)
        from ..config import (KEY_FFN_QUANTILES, KEY_FFN_THRESHOLDS, KEY_FFN_UP_QUANTILES, KEY_FFN_UP_THRESHOLDS,
                              KEY_UP_SPARSITY)

        drop = [k for k in meta if k.startswith((KEY_WIDE_PREFIX, KEY_FFN_NEURON_SCALES))]
        for key in (KEY_SPARSITY, KEY_FFN_THRESHOLDS, KEY_FFN_QUANTILES, KEY_UP_SPARSITY, KEY_FFN_UP_THRESHOLDS,
                    KEY_FFN_UP_QUANTILES, *drop):
            meta.pop(key, None)
            types.pop(key, None)
        meta[W.KEY_SPARSITY] = np.float32(sparsity)
        meta[W.KEY_CRITERION] = chosen
        meta[W.KEY_CUTOFFS] = cuts.astype(np.float32).reshape(-1)
        meta[W.KEY_QUANTILES] = q.astype(np.float32).reshape(-1)
        meta[W.KEY_ALLOC] = alloc.astype(np.float32).reshape(-1)
        meta[W.KEY_SOURCE_TYPES] = ",".join(sorted(src_types))
        if rotations is not None:
            meta[W.KEY_ROTATED] = ",".join(ROTATE_DEFAULT)
        if nrm is not None:
            for il in range(c.n_layer):
                meta[f"{W.KEY_COL_NORMS}{il}"] = np.concatenate(nrm[il]).astype(np.float32)
        replaced = {f"blk.{il}.{r}.weight": il for il in range(c.n_layer) for r in W.REPLACED}
        tensors, placed = [], set()
        for name, t in src.tensors.items():
            il = replaced.get(name)
            if il is None:
                tensors.append(t)
            elif il not in placed:
                tensors.extend(x for w in weights[il] for x in W.file_tensors(w))
                if rotations is not None:
                    tensors.extend(x for x in rotations[il] if x is not None)
                placed.add(il)
        write_gguf(out, meta, tensors, types=types, magic=src.magic, alignment=src.alignment)
    say(f"wrote {out}")
    return WideResult(out, sparsity, chosen, len(ids), source, selection, n_sel,
                      None if greedy_curves is None else greedy_curves.tolist(), skipped, ",".join(sorted(src_types)),
                      ",".join(stored_types), n_el, src_bytes, stored_bytes, rotations is not None, rot_bytes)
