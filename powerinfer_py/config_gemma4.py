"""Gemma 4 (GGUF arch "gemma4") metadata: the per-layer layout that config.ModelConfig holds as one Gemma4Layout.

Unlike the other architectures, Gemma 4 files describe layers that differ from one another, and llama.cpp
reads them so (keys are {arch}.*, arch = "gemma4"):
  attention.sliding_window_pattern   one bool per layer (or a period): True = sliding-window layer, attending to
                                     the last attention.sliding_window positions (required)
  attention.key_length(_swa)         head dim of full (sliding) layers; value_length(_swa) must equal them
  rope.dimension_count(_swa)         rotated dims of full (sliding) layers; the sliding one defaults to the full
                                     one, as in llama.cpp (so real files carry it)
  rope.freq_base(_swa)               RoPE base of full (sliding) layers; _swa defaults to the full base
  attention.head_count(_kv)          one value or one per layer
  feed_forward_length                one value or one per layer (the KV-sharing layers of E2B are twice as wide)
  attention.shared_kv_layers         the last N layers compute no K/V: a sliding one reads the cache of layer
                                     n_kv - 2, a full one that of layer n_kv - 1 (n_kv = block_count - N), which
                                     must be a sliding and a full layer of the same shape (llama.cpp's rule)
  embedding_length_per_layer_input   width of the per-layer embeddings (0: none; required key)
  final_logit_softcapping            logits -> cap * tanh(logits / cap); absent: llama.cpp's default 30
  expert_count, expert_used_count, expert_feed_forward_length   the 26B-A4B model's experts (config.experts reads
                                     them); as in llama.cpp, the layers with experts are those whose file has a
                                     blk.N.ffn_gate_inp.weight (ModelConfig.moe_layers; models/gemma4.py has the math)
The attention scale is 1 (the per-head Q norm does the scaling); embeddings are scaled by sqrt(n_embd).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelFileError

GEMMA4_FINAL_SOFTCAP = 30.0  # llama.cpp's default when final_logit_softcapping is absent


@dataclass(frozen=True)
class Gemma4Layout:
    """Per layer (index il): head dim, query heads, KV heads, FFN width, rotated dims, RoPE base, and the layer
    whose K/V cache it attends over (il itself for the layers that compute K/V); n_embd_per_layer: width of the
    per-layer embeddings (0: none)."""

    head_dim: tuple[int, ...]
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    n_ff: tuple[int, ...]
    n_rot: tuple[int, ...]
    rope_base: tuple[float, ...]
    kv_source: tuple[int, ...]
    n_embd_per_layer: int = 0

    def has_kv(self, il: int) -> bool:
        return self.kv_source[il] == il


def _per_layer(reader, suffix: str, n_layer: int, default=None) -> tuple[int, ...]:
    """A key holding one positive int or one per layer, as a per-layer tuple."""
    key = reader.key(suffix)
    value = reader.meta.get(key, default)
    if value is None:
        raise ModelFileError(f"{reader.f.path}: missing required metadata key {key!r}")
    values = value if isinstance(value, list) else [value] * n_layer
    if len(values) != n_layer or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ModelFileError(f"{reader.f.path}: {key} must be a positive int or {n_layer} of them (one per "
                             f"layer), got {value!r}")
    return tuple(values)


def kv_sources(path, shared: int, swa: tuple[bool, ...], n_head_kv=None) -> list[int]:
    """Per layer, the layer whose K/V it attends to (gemma4, gemma3n): the last `shared` layers reuse those of the
    last sliding (n_kv - 2) or full (n_kv - 1) layer before them, which must be of the same kind (and, given
    n_head_kv, have as many KV heads); the others their own."""
    n_layer = len(swa)
    n_kv = n_layer - shared
    source = list(range(n_layer))
    if shared:
        if not 0 < shared <= n_layer - 2:
            raise ModelFileError(f"{path}: attention.shared_kv_layers {shared} must leave at least two layers "
                                 f"with their own K/V ({n_layer} layers)")
        for il in range(n_kv, n_layer):
            src = n_kv - 2 if swa[il] else n_kv - 1
            if swa[src] != swa[il] or (n_head_kv is not None and n_head_kv[src] != n_head_kv[il]):
                raise ModelFileError(f"{path}: layer {il} ({'sliding' if swa[il] else 'full'}) shares the K/V of "
                                     f"layer {src}, which is not a layer of the same kind and KV heads")
            source[il] = src
    return source


def gemma4_keys(reader, n_layer: int) -> dict:
    """ModelConfig fields of a gemma4 file (module docstring): "gemma4" (a Gemma4Layout), the final soft-cap and,
    in files with expert_count, the layers with experts ("moe_layers"); plus what config() pops: the window
    fields ("sliding_window", "swa_layers", "base_swa") and, for the uniform fields, the full layers' head dim
    and the largest head counts and FFN width ("_head_dim", "_n_head", "_n_head_kv", "_n_ff")."""
    path = reader.f.path
    window = reader.positive("{arch}.attention.sliding_window")
    key = reader.key("{arch}.attention.sliding_window_pattern")
    pattern = reader.meta.get(key)
    if isinstance(pattern, list) and len(pattern) == n_layer and all(isinstance(p, bool) for p in pattern):
        swa = tuple(pattern)
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        swa = tuple(il % pattern != pattern - 1 for il in range(n_layer))
    else:
        raise ModelFileError(f"{path}: {key} must be {n_layer} bools (one per layer) or a period, got {pattern!r}")
    hd_full = reader.positive("{arch}.attention.key_length")
    hd_swa = reader.positive("{arch}.attention.key_length_swa", hd_full)
    if (reader.positive("{arch}.attention.value_length", hd_full) != hd_full
            or reader.positive("{arch}.attention.value_length_swa", hd_swa) != hd_swa):
        raise ModelFileError(f"{path}: gemma4 needs value_length(_swa) equal to key_length(_swa)")
    rot_full = reader.get("{arch}.rope.dimension_count", hd_full)
    rot_swa = reader.get("{arch}.rope.dimension_count_swa", rot_full)
    for rot, hd, what in ((rot_full, hd_full, ""), (rot_swa, hd_swa, "_swa")):
        if not 0 <= rot <= hd or rot % 2:
            raise ModelFileError(f"{path}: rope.dimension_count{what} {rot} must be even and <= the head dim {hd}")
    base = reader.get("{arch}.rope.freq_base", 10_000.0, kind=float)
    base_swa = reader.get("{arch}.rope.freq_base_swa", base, kind=float)
    n_head = _per_layer(reader, "{arch}.attention.head_count", n_layer)
    n_head_kv = _per_layer(reader, "{arch}.attention.head_count_kv", n_layer, list(n_head))
    if any(h % kv for h, kv in zip(n_head, n_head_kv)):
        raise ModelFileError(f"{path}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    n_ff = _per_layer(reader, "{arch}.feed_forward_length", n_layer)
    source = kv_sources(path, reader.get("{arch}.attention.shared_kv_layers", 0), swa, n_head_kv)
    per_layer = reader.get("{arch}.embedding_length_per_layer_input")
    if per_layer < 0:
        raise ModelFileError(f"{path}: embedding_length_per_layer_input must be >= 0, got {per_layer}")
    cap = reader.get("{arch}.final_logit_softcapping", GEMMA4_FINAL_SOFTCAP, kind=float)
    if not cap >= 0:
        raise ModelFileError(f"{path}: final_logit_softcapping must be >= 0, got {cap}")
    layout = Gemma4Layout(
        head_dim=tuple(hd_swa if s else hd_full for s in swa), n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
        n_rot=tuple(rot_swa if s else rot_full for s in swa), rope_base=tuple(base_swa if s else base for s in swa),
        kv_source=tuple(source), n_embd_per_layer=per_layer)
    moe = {}
    if reader.get("{arch}.expert_count", 0):  # experts where the file has a router (llama.cpp's test)
        moe["moe_layers"] = tuple(f"blk.{il}.ffn_gate_inp.weight" in reader.f.tensors for il in range(n_layer))
    return {**moe, "gemma4": layout, "final_softcap": cap, "sliding_window": window, "swa_layers": swa, "base_swa": base_swa,
            "_head_dim": hd_full, "_n_head": max(n_head), "_n_head_kv": max(n_head_kv), "_n_ff": max(n_ff)}
