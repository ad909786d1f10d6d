"""LG EXAONE 3.0 / 3.5 (GGUF arch "exaone": EXAONE 3.0 7.8B, EXAONE 3.5 2.4B / 7.8B / 32B, EXAONE Deep).

The llama block under its own name, with NeoX RoPE (pairs (i, i + head_dim/2); the converter does not permute
the Q/K rows for this arch):

Per layer:  n = rmsnorm(x) * attn_norm
            h = x + Wo · attn(rope(Wq · n), rope(Wk · n), Wv · n)     (GQA, scale 1/sqrt(head_dim))
            y = h + Wdown · (silu(Wgate · m) * (Wup · m))             m = rmsnorm(h) * ffn_norm
Logits: rmsnorm(x) * output_norm, then output.weight (or token_embd.weight: the 2.4B model ties them).

EXAONE 3.5's checkpoints use LLaMA-3 style RoPE scaling, which the converter bakes into rope_freqs.weight
(per-pair divisors of the frequencies); llama.cpp divides every layer's angles by them, and so does LlamaModel.
Optional q/k/v biases are added as llama.cpp's loader takes them; llama.cpp's exaone graph has no output bias, so
attn_output.bias is not read. llama.cpp requires the whole head to rotate (rope.dimension_count = head_dim);
a file that says otherwise is refused here rather than half-rotated.
"""
from __future__ import annotations

from ..config import ModelConfig
from ..errors import ModelFileError
from .base import Expected
from .llama import ATTN_BIASES, LAYER_TENSORS, LlamaModel
from .llama import expected_tensors as llama_expected
from .spec import ArchSpec

QKV_BIASES = {k: v for k, v in ATTN_BIASES.items() if k != "bo"}


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's tensors (rope_freqs.weight and q/k/v biases optional) without the output bias."""
    e = llama_expected(c)
    for il in range(c.n_layer):
        e.pop(f"blk.{il}.attn_output.bias", None)
    return e


def check_full_rotation(c: ModelConfig) -> None:
    """exaone and internlm2 rotate whole heads in llama.cpp (it asserts n_rot == head_dim)."""
    if c.n_rot != c.head_dim:
        raise ModelFileError(f"{c.arch} files must rotate whole heads: rope.dimension_count is {c.n_rot}, "
                             f"the head width {c.head_dim}")


class ExaoneModel(LlamaModel):
    """LlamaModel with NeoX RoPE (config) and no output bias."""

    LAYER_TENSORS = {**LAYER_TENSORS, **QKV_BIASES}
    OPTIONAL_TENSORS = tuple(QKV_BIASES)

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        check_full_rotation(config)
        super().__init__(config, tensors, kernels, sparse)


__all__ = ["ExaoneModel", "check_full_rotation", "expected_tensors"]


SPEC = ArchSpec("exaone", model=ExaoneModel, expected=expected_tensors, rope_neox=True, yarn=True)
