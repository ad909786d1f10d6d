"""EXAONE 4.0 / 4.5 (GGUF arch "exaone4": EXAONE 4.0 1.2B and 32B, EXAONE 4.5).

OLMo 2's block (models/olmo2.py: no pre-norms, the attention and FFN outputs RMS-normed before the residual add)
with three differences, all as llama.cpp's exaone4 graph runs them:
  - q and k are RMS-normed per head (blk.N.attn_q_norm / attn_k_norm, f32 [head_dim]), not over their whole width;
  - RoPE is NeoX-style with the per-pair frequency divisors of rope_freqs.weight when the file has one (LLaMA 3
    style scaling, as the converter writes it for the 1.2B model);
  - 64-layer files (the 32B model) have sliding-window layers (3 of every 4 by default; attention.sliding_window,
    default 4096) and their global layers use no RoPE at all (config.no_rope_layers). llama.cpp gives windows to
    that depth only: a file of any other depth attends everywhere with RoPE on every layer, whatever its keys.
EXAONE 4.5 files end with nextn_predict_layers multi-token-prediction blocks, which are not run (config).
The output matrix is optional (tied to token_embd.weight when absent).

One-token steps run each attention block as one C call (step_attn.c) as olmo2's do, with per-head Q/K norms
and n_rot 0 on the layers without RoPE; same bits as the Python path (tests/test_exaone4.py).

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  exaone4 (EXAONE 4.0 / 4.5) olmo2's block with per-head Q/K norms, rope_freqs.weight factors and NeoX RoPE;
          64-layer files only (the 32B) get sliding windows (attention.sliding_window, default 4096, pattern as
          OLMo 3's) and no RoPE on their global layers; nextn_predict_layers trailing blocks are not run
"""
from __future__ import annotations

from ..config import ModelConfig
from . import olmo2
from .base import Expected
from .llama import rope_factors
from .olmo2 import Olmo2Model, olmo3_swa
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> Expected:
    e = olmo2.expected_tensors(c, head_norms=True)
    e["rope_freqs.weight"] = ((c.n_rot // 2,), False)
    return e


class Exaone4Model(Olmo2Model):
    """Olmo2Model with per-head Q/K norms (base.Model._qkv's QK_NORMS path), rope_freqs.weight and RoPE-less
    global layers."""

    QK_NORMS = True

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        ff = rope_factors(tensors)
        if ff is not None:
            self.rope_freqs = ff if self.rope_freqs is None else (ff * self.rope_freqs).astype(self.rope_freqs.dtype)

    def layer_attention(self) -> list[tuple[int, tuple]]:
        """olmo2's windows (plain RoPE there needs no change: exaone4 has no YaRN) with n_rot 0 on the layers
        config.no_rope_layers marks."""
        c, no_rope = self.config, self.config.no_rope_layers
        out = []
        for il, swa in enumerate(c.swa_layers):
            rope = self.rope_args()
            out.append((c.sliding_window if swa else 0, (0, *rope[1:]) if no_rope and no_rope[il] else rope))
        return out

    def _qkv(self, L, h, n):
        return super(Olmo2Model, self)._qkv(L, h, n)  # base.Model's: projections, then per-head norms

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        c = self.config
        kw = dict(super(Olmo2Model, self).attn_plan_kwargs(il, layer), post_norm=layer.post_attn_norm)
        if c.swa_layers[il]:
            kw["window"] = c.sliding_window
        if c.no_rope_layers and c.no_rope_layers[il]:
            kw["n_rot"] = 0
        return kw


EXAONE4_SWA_LAYERS = 64  # exaone4: only files of this depth (32B) get sliding windows in llama.cpp
EXAONE4_SLIDING_WINDOW = 4096  # their window when no key gives one


def exaone4_swa(r, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
    """exaone4: llama.cpp gives sliding windows to 64-layer files only (EXAONE 4.0 32B; default 4096 tokens,
    pattern as OLMo 3's); any other depth attends everywhere whatever the keys say (the 1.2B model)."""
    if n_layer != EXAONE4_SWA_LAYERS:
        return 0, (False,) * n_layer, rope_freq_base
    window, layers, base_swa = olmo3_swa(r, n_layer, rope_freq_base)
    if not window:  # no key: llama.cpp's default window with the default pattern
        window = EXAONE4_SLIDING_WINDOW
        layers = tuple(il % olmo2.OLMO3_SWA_PERIOD != olmo2.OLMO3_SWA_PERIOD - 1 for il in range(n_layer))
    return window, layers, base_swa


def exaone4_no_rope(r, n_layer: int) -> dict:
    """With windows, the global layers have no RoPE (ModelConfig.no_rope_layers); {} without."""
    window, layers, _ = exaone4_swa(r, n_layer, 0.0)
    return {"no_rope_layers": tuple(not swa for swa in layers)} if window else {}


def read_args(r, d: dict) -> None:
    d.update(exaone4_no_rope(r, d["n_layer"]))


SPEC = ArchSpec("exaone4", model=Exaone4Model, expected=expected_tensors, rope_neox=True, nextn=True,
                swa=exaone4_swa)
