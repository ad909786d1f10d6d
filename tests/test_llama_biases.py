"""llama-arch files with attention biases, as llama.cpp's converter writes them for checkpoints with
attention_bias: true (blk.N.attn_q/k/v.bias, attn_output.bias): llama.cpp adds every bias it finds, and so must
we (before this, they were silently ignored: logits 2.6 spreads away from llama.cpp's). FFN biases are refused."""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import batch_and_steps, rel_err, rewrite_gguf

from powerinfer_py import load
from powerinfer_py.errors import UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.types import GGMLType, Tensor

TOKENS = [1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322]


def _biases(src, names, seed=0):
    f, rng = open_gguf(src), np.random.default_rng(seed)
    out = []
    for il in range(f.metadata["llama.block_count"]):
        for name in names:
            w = f.tensors[f"blk.{il}.{name}.weight"]
            n = w.shape[0]  # numpy shape (rows, cols): one bias per output row
            out.append(Tensor(f"blk.{il}.{name}.bias", GGMLType.F32, (n,), rng.normal(0, 0.5, n).astype(np.float32)))
    return out


@pytest.mark.parametrize("names", [("attn_q", "attn_k", "attn_v"), ("attn_q", "attn_k", "attn_v", "attn_output")])
def test_attention_biases_match_llama_cpp(synthetic_model, tmp_path, names):
    src = synthetic_model("llama", "f32")
    path = rewrite_gguf(src, tmp_path / "bias.gguf", extra=_biases(src, names))
    ref = llama_cpp_logits(path, TOKENS)
    batch, steps = batch_and_steps(path, TOKENS)  # the batch (Python) and one-token (C step) paths
    assert rel_err(batch, ref) < 5e-3
    assert rel_err(steps, ref) < 5e-3
    assert rel_err(batch_and_steps(src, TOKENS)[0], ref) > 0.1  # the biases matter at this tolerance


def test_ffn_biases_are_refused(synthetic_model, tmp_path):
    src = synthetic_model("llama", "f32")
    path = rewrite_gguf(src, tmp_path / "ffn-bias.gguf", extra=_biases(src, ("ffn_up",)))
    with pytest.raises(UnsupportedError, match="FFN biases.*blk.0.ffn_up.bias"):
        load(path, threads=1)
