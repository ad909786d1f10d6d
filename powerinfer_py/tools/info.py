"""model_info: what `powerinfer info` shows about a model file, computed from the header alone (cheap)."""
from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any

import numpy as np

from ..config import KEY_UP_SPARSITY
from ..errors import PowerInferError
from ..gguf.reader import open_gguf
from ..gguf.load import check_expected, conversion_target
from ..models import expected_tensors, read_config


def model_info(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON-ready dict: path, file_size, magic, gguf_version, sparse, arch, name, runnable, problem (why it
    cannot run, else None), tokenizer, config (ModelConfig fields, or None), n_tensors, n_params,
    tensor_types ({type: {count, bytes}}, largest first), predictor_ranks, conversions ([{from, to, count}]:
    what load_weights would convert), rope_scaling ({linear, freq_factors} or None), calibration (threshold
    sparsity, see _calibration; None when the file has none) and cuda ({available, reason}: the CUDA backend
    here). The config's bulky calibration arrays (per-neuron scales, quantile tables: about a megabyte of JSON
    for Gemma 3 270M) are left out of "config"; "calibration" summarizes them. Nothing is dequantized: only
    the header (and rope_freqs.weight, a few dozen values) is read.
    Raises ModelFileError only when the file itself cannot be parsed."""
    f = open_gguf(path)
    try:
        # A file we cannot run is still worth describing: keep the reason instead of failing.
        try:
            config = read_config(f)
        except PowerInferError as e:
            config, runnable, problem = None, False, str(e)
        else:
            try:  # tensor names and shapes, from the header alone
                check_expected(f, expected_tensors(config))
                runnable, problem = True, None
            except PowerInferError as e:
                runnable, problem = False, str(e)

        types: dict[str, dict[str, int]] = {}
        planned: Counter[tuple[str, str]] = Counter()
        for t in f.tensors.values():
            entry = types.setdefault(t.type.name, {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += t.nbytes
            target = conversion_target(t)
            if target is not None:
                planned[(t.type.name, target.name)] += 1

        info: dict[str, Any] = {
            "path": str(f.path),
            "file_size": f.file_size,
            "magic": f.magic,
            "gguf_version": f.version,
            "sparse": f.is_sparse,
            "arch": f.arch,
            "name": f.metadata.get("general.name", ""),
            "runnable": runnable,
            "problem": problem,
            "tokenizer": f.metadata.get("tokenizer.ggml.model"),
            "config": _config_facts(config),
            "n_tensors": len(f.tensors),
            "n_params": sum(_n_elems(t.shape) for t in f.tensors.values()),
            "tensor_types": dict(sorted(types.items(), key=lambda kv: -kv[1]["bytes"])),
            "predictor_ranks": list(config.predictor_ranks) if config is not None else [],
            "conversions": [{"from": a, "to": b, "count": n} for (a, b), n in sorted(planned.items())],
            "rope_scaling": _rope_scaling(f, config),
            "calibration": _calibration(f, config),
            "wide": _wide_calibration(f),
            "cuda": _cuda(),
        }
        return info
    finally:
        f.close()


def _rope_scaling(f, config) -> dict[str, Any] | None:
    """How the file scales RoPE: {"linear": factor or None, "freq_factors": [min, max] of rope_freqs.weight
    or None, "yarn": {"factors": [min, max], "mscale": m} or None, and for phi3 files with long/short factors
    "longrope": {orig_ctx, attn_factor}}; None when it does not (or the config could not be read)."""
    if config is None:
        return None
    linear = 1.0 / config.rope_freq_scale if config.rope_freq_scale not in (0.0, 1.0) else None
    t = f.tensors.get("rope_freqs.weight")
    factors = None
    if t is not None and t.type.name in ("F32", "F16"):  # a few dozen values: read them from the map
        v = np.asarray(t.data, dtype=np.float64)
        factors = [float(v.min()), float(v.max())] if v.size else None
    yarn = ({"factors": [min(config.rope_factors), max(config.rope_factors)], "mscale": config.rope_mscale}
            if config.rope_factors else None)
    longrope = None  # phi3's long-context factors (rope_factors_long/short.weight, picked by n_ctx)
    if "rope_factors_long.weight" in f.tensors and config.rope_orig_ctx:
        # phi3 keeps the attn_factor as rope_attn_factor, minicpm(3) as rope_mscale; the other one is 1 there
        longrope = {"orig_ctx": config.rope_orig_ctx, "attn_factor": config.rope_attn_factor * config.rope_mscale}
    if linear is None and factors is None and yarn is None and longrope is None:
        return None
    return {"linear": linear, "freq_factors": factors, "yarn": yarn, **({"longrope": longrope} if longrope else {})}


_BULKY = ("ffn_neuron_scales", "ffn_quantiles", "ffn_up_quantiles")  # per-neuron / per-quantile arrays: summarized, not listed


def _config_facts(config) -> dict[str, Any] | None:
    if config is None:
        return None
    return {k: v for k, v in _jsonable(dataclasses.asdict(config)).items() if k not in _BULKY}


def _calibration(f, config) -> dict[str, Any] | None:
    """What `powerinfer calibrate` stored for `--sparse threshold`: {sparsity (fraction of FFN neurons that
    count as zero), up_sparsity (two-stage files: fraction of ffn_up rows skipped, else None), thresholds (the
    per-layer cut-offs), neuron_scales (whether scores are scaled per neuron), other_sparsities (whether a
    quantile table lets --sparsity ask for another fraction)}; None for a file without calibration."""
    if config is None or config.calibrated_sparsity is None:
        return None
    up = f.metadata.get(KEY_UP_SPARSITY) if config.ffn_up_thresholds else None
    return {
        "sparsity": round(float(config.calibrated_sparsity), 6),  # stored as f32
        "up_sparsity": round(float(up), 6) if up is not None else None,
        "thresholds": list(config.ffn_thresholds),
        "neuron_scales": bool(config.ffn_neuron_scales),
        # two-stage files need both tables (files written before the up table run at their one sparsity)
        "other_sparsities": bool(config.ffn_quantiles) and (not config.ffn_up_thresholds
                                                            or bool(config.ffn_up_quantiles)),
    }


def _wide_calibration(f) -> dict[str, Any] | None:
    """What `powerinfer calibrate --wide` stored for `--sparse wide` (layers/wide.py reads it): {sparsity (the
    model-wide target of the stored cut-offs), criterion, rotated (the inputs stored rotated), other_sparsities
    (whether the tables let --sparsity ask for another fraction)}; None for a file without it."""
    from ..layers.wide import KEY_ALLOC, KEY_CRITERION, KEY_QUANTILES, KEY_ROTATED, KEY_SPARSITY

    m = f.metadata
    if KEY_SPARSITY not in m:
        return None
    rotated = m.get(KEY_ROTATED)
    return {
        "sparsity": round(float(m[KEY_SPARSITY]), 6),  # stored as f32
        "criterion": str(m.get(KEY_CRITERION, "")),
        "rotated": [r for r in str(rotated).split(",") if r] if rotated else [],
        "other_sparsities": KEY_QUANTILES in m and KEY_ALLOC in m,
    }


def _cuda() -> dict[str, Any]:
    """Whether the CUDA backend could run here, and why not (kernels/cuda.py)."""
    from ..kernels.cuda import cuda_status

    st = cuda_status()
    return {"available": st.available, "reason": st.reason}


def _n_elems(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


# A short, ordinary English paragraph for measuring how many FFN neurons fire (our own text).
SAMPLE_TEXT = (
    "The old lighthouse stood at the end of a narrow path, where the grass gave way to grey rock and the wind "
    "never quite stopped. Every evening the keeper climbed the ninety steps, cleaned the glass, and lit the "
    "lamp, writing the time and the weather in a small book that nobody else ever read. Ships passed far out "
    "at sea, and on clear nights he could count their lights moving slowly along the horizon."
)


def measure_activity(path: str | os.PathLike, threads: int | None = None, n_decode: int = 16,
                     text: str = SAMPLE_TEXT) -> dict[str, Any]:
    """Run the model on `text` (one batched prefill) and then n_decode greedy tokens in its default sparse mode
    and count the FFN neurons it computes per token. Returns {mode, threshold, tokens, active_fraction,
    layers: [per-layer fraction], nonzero_fraction, nonzero_layers, up_read_fraction (two-stage threshold files:
    the ffn_up rows read per token, else None)}; for models whose FFN is not
    ReLU-family (every neuron runs) {mode, tokens, note}."""
    from ..llm import load

    with load(path, threads=threads) as llm:
        gen = llm.generate_tokens(text, max_tokens=n_decode, temperature=0)
        for _ in gen:
            pass
        st = llm.sparsity_stats
        out: dict[str, Any] = {"mode": llm.sparse.mode, "threshold": llm.sparse.threshold,
                               "tokens": gen.stats.n_prompt + gen.stats.n_gen}
        c = llm.config
        if c.n_expert:
            from ..layers.moe import usage_note

            out["note"] = usage_note(c, llm.model.ffns)
            out["expert_counts"] = [f.counts.tolist() for f in llm.model.ffns if hasattr(f, "counts")]  # MoE layers
            return out
        if st is None:
            out["note"] = "the FFN is not ReLU-family: every neuron is computed for every token"
            return out
        if st.mode == "wide":  # model-wide mode: the bytes read of every projection (layers/wide.py)
            out.update(active_fraction=st.mean_fraction, layers=st.fractions, sparsity=llm.sparse.sparsity,
                       wide=st.to_json(), wide_lines=st.lines())
            return out
        out.update(active_fraction=st.mean_fraction, layers=st.fractions,
                   nonzero_fraction=float(st.nonzero.sum()) / max(1.0, float(st.tokens.sum()) * st.n_ff),
                   nonzero_layers=st.nonzero_fractions, up_read_fraction=st.up_read_fraction)
        return out
