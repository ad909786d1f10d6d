"""SmolLM3 (GGUF arch "smollm3": SmolLM3-3B).

The llama block of models/llama.py, except that some layers use no position encoding at all ("NoPE"): on
layers with (il + 1) % 4 == 0 (il = 3, 7, 11, ...: a quarter of them) q and k go into the attention as the
projections left them; every other layer rotates them with llama's normal RoPE layout (pairs 2i, 2i + 1, as
llama.cpp's rope type for smollm3; the converter permutes the Q/K rows as for llama). The step 4 is hard-coded
in llama.cpp (no GGUF key carries it), NO_ROPE_STEP here; config.no_rope_layers holds the
per-layer flags.

Per layer:  n = rmsnorm(x) * attn_norm
            q = Wq·n, k = Wk·n, v = Wv·n;  q, k = rope(q), rope(k) unless the layer is a NoPE layer
            h = x + Wo · attn(q, k, v)                               (scale 1/sqrt(head_dim), GQA)
            y = h + Wdown · (silu(Wgate · m) * (Wup · m))            m = rmsnorm(h) * ffn_norm
Logits: rmsnorm(x) * output_norm, then output.weight, or token_embd.weight when the file has none (the 3B model
ties them). rope_freqs.weight is not read (llama.cpp's smollm3 graph passes no frequency factors).

A NoPE layer is a RoPE with n_rot = 0, so both the Python path and the one-call decode step (step_attn.c
skips RoPE when n_rot is 0) run it without a special case.

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  smollm3 the llama block (normal RoPE) where every 4th layer ((il + 1) % 4 == 0) skips RoPE (no_rope_layers);
          llama.cpp hard-codes the step 4 (no GGUF key holds it), and so do we
"""
from __future__ import annotations

from ..config import ModelConfig
from .base import Expected, Model, llama_like_expected
from .llama import LAYER_TENSORS
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> Expected:
    return llama_like_expected(c)


class SmolLM3Model(Model):
    """The pre-norm block of models/base.py with RoPE switched off (n_rot 0) on config.no_rope_layers."""

    LAYER_TENSORS = LAYER_TENSORS

    def layer_attention(self) -> list[tuple[int, tuple]]:
        rope = self.rope_args()
        nope = (0, *rope[1:])
        flags = self.config.no_rope_layers or (False,) * len(self.layers)
        return [(0, nope if off else rope) for off in flags]

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        kw = super().attn_plan_kwargs(il, layer)
        if self.config.no_rope_layers and self.config.no_rope_layers[il]:
            kw["n_rot"] = 0
        return kw


NO_ROPE_STEP = 4  # layers with (il + 1) % 4 == 0 use no RoPE (llama.cpp's n_no_rope_layer_step; no key)


def read_args(r, d: dict) -> None:
    d["no_rope_layers"] = tuple((il + 1) % NO_ROPE_STEP == 0 for il in range(d["n_layer"]))


SPEC = ArchSpec("smollm3", model=SmolLM3Model, expected=expected_tensors)
