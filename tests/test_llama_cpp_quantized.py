"""Q2_K, Q3_K_M and IQ4_XS files made by llama.cpp's own quantizer: loaded without conversion (the kernels
compute on them directly) and giving llama.cpp's logits on the same file."""
from __future__ import annotations

import llama_cpp
import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import unconverted_logits

from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.types import GGMLType

TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322], dtype=np.int32)
# file type -> (llama.cpp's ftype, the types every 2-D layer matrix must then have, one of them at least once)
FTYPES = {"Q2_K": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K, {GGMLType.Q2_K, GGMLType.Q3_K}),
          "Q3_K_M": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M, {GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K}),
          "IQ4_XS": (llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS, {GGMLType.IQ4_XS})}
# Our logits against llama.cpp's, as a fraction of their spread. Both round every matmul input to 8-bit Q8_K
# blocks; a ~1e-3 difference upstream (llama.cpp's f16 attention) flips a few of those roundings, and the flips
# compound over the layers. Measured on this model: 0.076 (Q2_K), 0.074 (Q3_K_M), 0.059 (IQ4_XS); the same
# model as Q8_0 gives 0.045 and as Q4_K_M 0.061. A wrong scale, bit, level or group in a kernel moves the
# logits by a large fraction of their spread.
TOL = 0.15


@pytest.fixture(scope="module")
def source(synthetic_model):
    return synthetic_model("llama", "f32", n_embd=256, n_ff=512)  # K-quants need rows of 256


@pytest.mark.parametrize("ftype", FTYPES)
def test_llama_cpp_quantized_file_matches_llama_cpp(source, tmp_path, cpu_kernels, ftype):
    path = tmp_path / f"model-{ftype}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, allowed = FTYPES[ftype]
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(path).encode(), params) == 0
    f = open_gguf(path)
    layer_types = {t.type for name, t in f.tensors.items() if name.startswith("blk.") and len(t.shape) == 2}
    assert layer_types <= allowed and GGMLType[ftype.split("_M")[0]] in layer_types, layer_types
    ours = unconverted_logits(f, cpu_kernels, TOKENS)
    theirs = llama_cpp_logits(path, TOKENS)
    assert (ours.argmax(1) == theirs.argmax(1)).all()
    assert np.abs(ours - theirs).max() / theirs.std() < TOL
