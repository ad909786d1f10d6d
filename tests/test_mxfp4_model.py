"""An MXFP4 file written by llama.cpp's own quantizer (LLAMA_FTYPE_MOSTLY_MXFP4_MOE: MXFP4 expert stacks, as
gpt-oss ships them): loaded with no conversion (the kernels compute on MXFP4 directly), it gives llama.cpp's
logits on the same file, and one token at a time gives the batch's bits."""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits

from powerinfer_py import load
from powerinfer_py.gguf.reader import open_gguf
from powerinfer_py.tensor import GGMLType

TOKENS = [1, 5, 300, 301, 7, 88, 42, 260, 9, 100, 200, 33]
# Our logits against llama.cpp's, as a fraction of their spread: both quantize every matmul input to Q8_0
# blocks and pair them with the same MXFP4 weights (llama.cpp's vec_dot_mxfp4_q8_0), so the gap is the usual
# rounding drift between the engines: measured 0.064 (test_moe's Q4_K_M file passes under 0.12). The same model
# unquantized (f32) is 1.15 of the spread away from this file in llama.cpp, so a wrong table entry, exponent or
# nibble order could not pass.
TOL = 0.12


@pytest.fixture(scope="module")
def mxfp4_file(synthetic_model, tmp_path_factory):
    import llama_cpp

    src = synthetic_model("qwen3moe", "f32", n_embd=256, n_ff=256, n_head=4, n_head_kv=2, n_expert=4)
    path = tmp_path_factory.mktemp("mxfp4") / "moe-mxfp4.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(path).encode(), params) == 0
    return path


def _ours(path) -> tuple[np.ndarray, np.ndarray]:
    """(all logits of one batch, the logits of the same tokens fed one at a time)."""
    with load(path, threads=2) as llm:
        assert llm.conversions == []  # every tensor, the MXFP4 experts included, stays a view on the file
        net = llm.model
        batch = net.forward(np.array(TOKENS, np.int32), net.new_cache(64), all_logits=True)
        cache = net.new_cache(64)
        step = np.stack([net.forward(np.array([t], np.int32), cache) for t in TOKENS])
    return batch, step


def test_mxfp4_moe_file_from_llama_cpp_quantizer_matches_llama_cpp(mxfp4_file):
    with open_gguf(mxfp4_file) as f:
        types = {name: t.type for name, t in f.tensors.items()}
    experts = [name for name in types if "_exps." in name]
    assert experts and all(types[name] == GGMLType.MXFP4 for name in experts)
    batch, step = _ours(mxfp4_file)
    np.testing.assert_array_equal(step, batch)
    ref = llama_cpp_logits(mxfp4_file, TOKENS)
    err = np.abs(batch - ref).max() / ref.std()
    assert err < TOL, f"max |ours - llama.cpp| = {err:.3f} of the logits' spread"
