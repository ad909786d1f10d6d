"""Vision-language files run on text: qwen2vl (Qwen2-VL, Qwen2.5-VL), qwen3vl and qwen3vlmoe (Qwen3-VL) are the
qwen2 / qwen3 / qwen3moe text models under their own arch names (config.TEXT_ALIASES). Their RoPE is M-RoPE:
the rotated pairs are split into sections that each take one component of a multi-dimensional position; text
tokens have the same position in every component, so the rotation is the base arch's when the sections cover
every rotated pair. Checked here against llama.cpp on synthetic files relabelled from the base arch (same
tensors, keys renamed, rope.dimension_sections added): llama.cpp's own results for the relabelled and the
original file differ by 0.0008-0.0017 of the logits' spread (its M-RoPE kernel rounds differently); sections
that leave pairs out move qwen3vl by 0.17-0.36, and such files are refused. Images are not supported (the
projector is a separate file we do not read)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType
from model_checks import assert_matches_llama_cpp, info_text, relabel_gguf

from powerinfer_py import load
from powerinfer_py.errors import UnsupportedError
from powerinfer_py.synth import write_synthetic_model

TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322, 300, 310, 320, 330], dtype=np.int32)
TOL, QUANT_TOL = 0.01, 0.25  # as the other architecture tests
SECTIONS_TYPE = (GGUFValueType.ARRAY, GGUFValueType.INT32)
CASES = [("qwen2", "qwen2vl"), ("qwen3", "qwen3vl"), ("qwen3moe", "qwen3vlmoe")]


def vl_file(tmp_path, base, vl, dtype="f32", sections=None):
    src = write_synthetic_model(tmp_path / f"{base}-{dtype}.gguf", base, dtype=dtype, n_ctx_train=64)
    with load(src, threads=1) as llm:
        pairs = llm.config.n_rot // 2
    if sections is None:  # as the real files: t, h, w sections covering the pairs, none for the 4th component
        sections = [pairs // 2, pairs // 4, pairs - pairs // 2 - pairs // 4, 0]
    key = f"{vl}.rope.dimension_sections"
    return relabel_gguf(src, tmp_path / f"{vl}-{dtype}.gguf", vl, {key: sections}, {key: SECTIONS_TYPE})


@pytest.mark.parametrize("base,vl", CASES)
def test_text_matches_llama_cpp(tmp_path, base, vl):
    path = vl_file(tmp_path, base, vl)
    assert_matches_llama_cpp(path, TOKENS, TOL, same_top1=True)
    with load(path, threads=1) as llm:
        assert llm.config.arch == base
    assert vl in info_text(path)


@pytest.mark.parametrize("base,vl", CASES[:2])
def test_quantized_matches_llama_cpp(tmp_path, base, vl):
    assert_matches_llama_cpp(vl_file(tmp_path, base, vl, dtype="q8_0"), TOKENS, QUANT_TOL, same_top1=False)


def test_sections_leaving_pairs_out_are_refused(tmp_path):
    path = vl_file(tmp_path, "qwen3", "qwen3vl", sections=[2, 1, 1, 0])
    with pytest.raises(UnsupportedError, match="dimension_sections"):
        load(path, threads=1)
