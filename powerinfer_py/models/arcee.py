"""Arcee AFM (GGUF arch "arcee": AFM-4.5B): the llama block with an ungated squared-ReLU FFN.

Per layer:  n = rmsnorm(x) * attn_norm
            h = x + Wo · attn(rope(Wq · n), rope(Wk · n), Wv · n)     (normal RoPE, GQA, scale 1/sqrt(head_dim))
            u = Wup · m                                                m = rmsnorm(h) * ffn_norm
            y = h + Wdown · relu(u)^2
Logits: rmsnorm(x) * output_norm, then output.weight (or token_embd.weight when the file has none).

There is no ffn_gate: the FFN is one up projection, a ReLU whose output is squared, and the down projection
(llama.cpp's LLM_FFN_RELU_SQR with LLM_FFN_SEQ). RoPE is llama's: the normal layout (pairs 2i, 2i + 1; the
converter permutes the Q/K rows as for llama), rope_freqs.weight when the file has it, YaRN from
{arch}.rope.scaling.* (config.py). All of that is LlamaModel; the squared ReLU lives in the FFN objects
(ffn.py variant "relu2", chosen from the architecture).

Sparsity: relu(u)^2 is exactly zero wherever u <= 0, so a neuron is active iff relu(u) != 0, and
`--sparse exact` computes the up projection densely (it is the gating pre-activation) and the rest only for
the active neurons, bit for bit the dense result. On a dense GGUF file the down projection stays the dense
ffn_down matmul of the scattered h (ffn.py explains why), so the saving there is in the element-wise work only.

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  arcee   (Arcee AFM) the llama block (normal RoPE, optional rope_freqs.weight, YaRN from the metadata) with an
          ungated squared-ReLU FFN, relu(up·x)^2 (ffn.py "relu2", whatever powerinfer.hidden_act says)
"""
from __future__ import annotations

from ..config import ModelConfig
from .base import Expected
from .llama import LlamaModel
from .llama import expected_tensors as llama_expected
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's tensors (rope_freqs.weight optional) without ffn_gate."""
    e = llama_expected(c)
    for il in range(c.n_layer):
        e.pop(f"blk.{il}.ffn_gate.weight", None)
    return e


class ArceeModel(LlamaModel):
    """The llama forward pass; the squared ReLU is ffn.FFN's "relu2" variant (ffn.ffn_variant)."""


__all__ = ["ArceeModel", "expected_tensors"]


SPEC = ArchSpec("arcee", model=ArceeModel, expected=expected_tensors, yarn=True, hidden_act="relu",
                ffn_variant="relu2")
