"""Llama 4 (GGUF arch "llama4": Scout 17B-16E, Maverick 17B-128E) metadata, as llama.cpp reads it; models/llama4.py
has the math. config.py calls llama4_keys and merges what it returns into the mixture-of-experts fields.

Keys (under llama4.):
  expert_count (> 0: llama.cpp refuses files without experts), expert_used_count, expert_feed_forward_length
      the routed experts; the shared expert of a MoE layer has the same width (no key of its own)
  interleave_moe_layer_step S (required)   layers with (il + 1) % S == 0 have experts, the others a dense SwiGLU
      FFN feed_forward_length wide (S = 1: Scout, all MoE; S = 2: Maverick, alternating)
  attention.sliding_window                 absent (the real Scout / Maverick files): the chunked layout below;
      present and 0 (MobileLLM conversions) is refused: llama.cpp's graph then applies the attention temperature
      on its last layer with a zero position unit, which its input code asserts against. Any other value is
      ignored (llama.cpp fixes the chunk at 8192).
  attention.sliding_window_pattern P (default 4, or a per-layer array)   chunked layers: il % P < P - 1
  rope.freq_base_swa                       the chunked layers' RoPE base (default: rope.freq_base)
The chunked layout (fixed in llama.cpp, no keys): chunk 8192 (a chunked layer's query at position p sees the
keys of positions chunk_start(p) = (p // 8192) * 8192 .. p); layers with (il + 1) % 4 == 0 use no RoPE and scale
q by 1 + 0.1 * ln(floor((p + 1) / 8192) + 1) (attention temperature); the RoPE layers RMS-normalize q and k per
head (no weight) after RoPE, except on the 128-expert model (Maverick), as llama.cpp decides by expert count.
Routing: sigmoid of the router logits, the top n_used by logit, weights not renormalized, and the weight
multiplies the expert's input (models/llama4.py); expert_weights_scale is not read for this arch.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelFileError, UnsupportedError

LLAMA4_CHUNK = 8192  # llama.cpp's chunk size whenever the file has no sliding_window = 0
LLAMA4_NO_ROPE_STEP = 4  # layers (il + 1) % 4 == 0 skip RoPE (llama.cpp's default step; no key sets it)
LLAMA4_CHUNK_PERIOD = 4  # default of {arch}.attention.sliding_window_pattern: 3 chunked layers, then 1 global
LLAMA4_TEMP_SCALE, LLAMA4_TEMP_FLOOR, LLAMA4_TEMP_OFFSET = 0.1, 8192, 1.0  # the NoPE layers' q temperature
LLAMA4_NO_KQ_NORM_EXPERTS = 128  # llama.cpp: the 17B-128E model (Maverick) has no q/k norm


@dataclass(frozen=True)
class Llama4Layout:
    """Per-layer attention of a llama4 file: chunked (attends within its chunk) and rope (RoPE, then the q/k
    RMS norm when kq_norm); the chunk length and the NoPE layers' temperature (scale, position unit, offset)."""

    chunked: tuple[bool, ...]
    rope: tuple[bool, ...]
    kq_norm: bool
    chunk: int = LLAMA4_CHUNK
    temp_scale: float = LLAMA4_TEMP_SCALE
    temp_floor: int = LLAMA4_TEMP_FLOOR
    temp_offset: float = LLAMA4_TEMP_OFFSET
    rope_base_chunked: float = 0.0  # {arch}.rope.freq_base_swa: the chunked layers' RoPE base (0: the global one)


def llama4_keys(r, n_layer: int, n_expert: int, n_ff_exp: int) -> dict:
    """The ModelConfig fields of a llama4 file beyond the shared expert keys (module docstring); r: config's
    metadata reader."""
    path = r.f.path
    if r.meta.get(r.key("{arch}.attention.sliding_window")) == 0:
        raise UnsupportedError(f"{path}: llama4 files with attention.sliding_window = 0 (all layers global, e.g. "
                               "MobileLLM conversions) are not supported: llama.cpp's graph cannot run them either")
    step = r.positive("{arch}.interleave_moe_layer_step")
    pattern = r.meta.get(r.key("{arch}.attention.sliding_window_pattern"), LLAMA4_CHUNK_PERIOD)
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise ModelFileError(f"{path}: {r.key('{arch}.attention.sliding_window_pattern')} has {len(pattern)} "
                                 f"entries for {n_layer} layers")
        chunked = tuple(bool(p) for p in pattern)
    elif isinstance(pattern, int) and pattern >= 0:
        chunked = tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(n_layer))
    else:
        raise ModelFileError(f"{path}: {r.key('{arch}.attention.sliding_window_pattern')} must be a period >= 0 "
                             f"or one flag per layer, got {pattern!r}")
    layout = Llama4Layout(chunked=chunked,
                          rope=tuple((il + 1) % LLAMA4_NO_ROPE_STEP != 0 for il in range(n_layer)),
                          kq_norm=n_expert != LLAMA4_NO_KQ_NORM_EXPERTS,
                          rope_base_chunked=r.get("{arch}.rope.freq_base_swa", 0.0, kind=float))
    return {"llama4": layout, "moe_layers": tuple((il + 1) % step == 0 for il in range(n_layer)),
            "n_ff_shexp": n_ff_exp, "expert_gating": "sigmoid", "expert_weights_norm": False,
            "no_rope_layers": tuple(not rope for rope in layout.rope)}
