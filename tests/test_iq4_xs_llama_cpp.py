"""IQ4_XS files made by llama.cpp's own quantizer: loaded without conversion (the kernels compute on IQ4_XS
directly since matmul_k.c learned it) and giving llama.cpp's logits on the same file."""
from __future__ import annotations

import llama_cpp
import numpy as np
import pytest
from llama_ref import llama_cpp_logits

from powerinfer_py.gguf import open_gguf
from powerinfer_py.loader import load_weights
from powerinfer_py.models import build_model, expected_tensors
from powerinfer_py.tensor import GGMLType

TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322], dtype=np.int32)
# Our logits against llama.cpp's, as a fraction of their spread: both round every matmul input to 8-bit Q8_K
# blocks and a ~1e-3 difference upstream (llama.cpp's f16 attention) flips a few of those roundings, which
# compound over the layers (test_q2k_q3k_llama_cpp.py measured 0.074-0.076 for Q2_K / Q3_K_M, 0.061 for
# Q4_K_M). A wrong level, scale bit or sub-block order moves the logits by a large fraction of their spread.
TOL = 0.15


@pytest.fixture(scope="module")
def iq4_xs_file(synthetic_model, tmp_path_factory):
    source = synthetic_model("llama", "f32", n_embd=256, n_ff=512)  # IQ4_XS needs rows of 256
    path = tmp_path_factory.mktemp("iq4_xs") / "model-IQ4_XS.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(path).encode(), params) == 0
    return path


def test_iq4_xs_file_matches_llama_cpp(iq4_xs_file, cpu_kernels):
    f = open_gguf(iq4_xs_file)
    counts = {}
    for t in f.tensors.values():
        counts[t.type] = counts.get(t.type, 0) + 1
    # the file really holds IQ4_XS: every 2-D matrix of every layer (llama.cpp may pick another type for the
    # embeddings / output)
    blk = [t for name, t in f.tensors.items() if name.startswith("blk.") and len(t.shape) == 2]
    assert blk and all(t.type == GGMLType.IQ4_XS for t in blk), counts
    w = load_weights(f, expected_tensors)
    assert w.conversions == []  # every tensor stays a view on the file
    model = build_model(w.config, w.tensors, cpu_kernels)
    ours = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    step = model.new_cache(32)  # one token at a time (the decode mat-vec) gives the same bits as prefill
    singles = np.stack([model.forward(TOKENS[i:i + 1], step, all_logits=True)[-1] for i in range(len(TOKENS))])
    np.testing.assert_array_equal(singles, ours)
    theirs = llama_cpp_logits(iq4_xs_file, TOKENS)
    assert (ours.argmax(1) == theirs.argmax(1)).all()
    diff = np.abs(ours - theirs).max() / theirs.std()
    print(f"IQ4_XS: max |ours - llama.cpp| / std = {diff:.4f}")
    assert diff < TOL
