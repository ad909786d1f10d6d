"""MXFP4 files written by llama.cpp's own quantizer (LLAMA_FTYPE_MOSTLY_MXFP4_MOE: MXFP4 expert stacks, the rest
Q8_0, as gpt-oss ships): loaded with no conversion (the kernels compute on MXFP4 directly), they give llama.cpp's
logits on the same file, and one token at a time gives the batch's bits."""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import batch_and_steps

from powerinfer_py import load
from powerinfer_py.gguf.reader import open_gguf
from powerinfer_py.gguf.types import GGMLType

TOKENS = [1, 5, 300, 301, 7, 88, 42, 260, 9, 100, 200, 33]
# Our logits against llama.cpp's, as a fraction of their spread: both quantize every matmul input to Q8_0
# blocks and pair them with the same MXFP4 weights (llama.cpp's vec_dot_mxfp4_q8_0), so the gap is the usual
# rounding drift between the engines: measured 0.064 (qwen3moe) and 0.05-0.07 (gpt-oss). The same model
# unquantized (f32) is 1.15 of the spread away from its MXFP4 file in llama.cpp, so a wrong table entry,
# exponent or nibble order could not pass. Where a token's router has two experts within ROUTER_TIE of each
# other in some layer, that drift may pick the other one in either engine (gpt-oss, position 6: a margin of
# 0.009, 0.50 of the spread apart, every other position <= 0.074): those positions are compared by top-1 only.
TOL = 0.12
ROUTER_TIE = 0.05
CASES = {"qwen3moe": dict(n_embd=256, n_ff=256, n_head=4, n_head_kv=2, n_expert=4),
         "gpt-oss": dict(n_embd=256, n_ff=256, n_head=4, n_head_kv=2, n_layer=4)}


@pytest.fixture(scope="module", params=list(CASES))
def mxfp4_file(request, synthetic_model, tmp_path_factory):
    import llama_cpp

    src = synthetic_model(request.param, "f32", **CASES[request.param])
    path = tmp_path_factory.mktemp("mxfp4") / f"{request.param}-mxfp4.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(path).encode(), params) == 0
    return path


def router_margins(path, tokens) -> np.ndarray:
    """Per position, the smallest gap over the layers between the last chosen expert's router logit and the next
    one's, in our batch forward (all_logits: every layer then routes every row)."""
    gaps = []
    with load(path, threads=2) as llm:
        assert llm.conversions == []  # every tensor, the MXFP4 experts included, stays a view on the file
        for f in llm.model.ffns:
            def route(x, given=None, f=f, route=f.route):
                logits = f.k.matmul(f.router, x) + (f.router_bias if f.router_bias is not None else 0)
                top = np.sort(logits, axis=1)[:, ::-1]
                gaps.append(top[:, f.n_used - 1] - top[:, f.n_used])
                return route(x, given)
            f.route = route
        llm.model.forward(np.array(tokens, np.int32), llm.model.new_cache(64), all_logits=True)
    return np.min(gaps, axis=0)


def test_mxfp4_moe_file_from_llama_cpp_quantizer_matches_llama_cpp(mxfp4_file):
    with open_gguf(mxfp4_file) as f:
        types = {name: t.type for name, t in f.tensors.items()}
    experts = [name for name in types if "_exps.weight" in name]
    assert experts and all(types[name] == GGMLType.MXFP4 for name in experts)
    batch, step = batch_and_steps(mxfp4_file, TOKENS)
    np.testing.assert_array_equal(step, batch)
    ref = llama_cpp_logits(mxfp4_file, TOKENS)
    assert (batch.argmax(1) == ref.argmax(1)).all()
    clear = router_margins(mxfp4_file, TOKENS) > ROUTER_TIE
    assert clear.sum() >= len(TOKENS) // 2  # gpt-oss here: 9 of 12 (three layer-1/2 gaps below 0.01)
    err = np.abs(batch - ref)[clear].max() / ref.std()
    assert err < TOL, f"max |ours - llama.cpp| = {err:.3f} of the logits' spread"
