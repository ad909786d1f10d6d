"""Ministral 3 / arch "mistral3": synthetic llama files relabelled as mistral3 (same tensors, the keys renamed,
plus mistral3's own keys) against llama.cpp on the same file, and the config readers.

What the arch adds (models/mistral3.py) and how far off each wrong reading would be (max |logit difference| /
std of llama.cpp's logits, 16 tokens, measured with the mutants below): the attention temperature left out
0.85; applied with a +1 position offset (llama4's form) 0.35; with YaRN and yarn_log_multiplier, the rotated
dims scaled by llama's 1 + 0.1 ln F instead of mistral3's own factor 0.58 (multiplier 1.0). The correct model is
within 0.0014 on every f32 file here (tolerance 0.01).
"""
from __future__ import annotations


import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import assert_fused_decode_equals_python, assert_matches_llama_cpp, info_text, load_model, relabel_gguf

from powerinfer_py.config import ModelConfig
from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.kernels.cpu import CpuKernels
from powerinfer_py.models.mistral3 import Mistral3Model
from powerinfer_py.synth import write_synthetic_model

# <s> then word pieces; 16 positions, so a temperature unit of 4 positions covers t(pos) for floor 0..3
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322, 300, 310, 320, 330], dtype=np.int32)
TOL = 0.01  # f32: llama.cpp's f16 rounding in attention (as the other architecture tests)
QUANT_TOL = 0.25  # q8_0 files (tests/test_models.py's bound)
TEMP = {"mistral3.attention.temperature_scale": 0.5, "mistral3.rope.scaling.original_context_length": 4}
YARN = {"type": "yarn", "factor": 4.0, "original_context_length": 8}


def config_of(path) -> ModelConfig:
    return read_config(open_gguf(path))


def as_mistral3(src, dst, extra=None):
    """The llama GGUF file src relabelled as mistral3 (every llama.* key renamed), with extra keys added."""
    return relabel_gguf(src, dst, "mistral3", extra)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mistral3")
    plain = write_synthetic_model(d / "llama.gguf", "llama", n_ctx_train=64)
    yarn = write_synthetic_model(d / "llama-yarn.gguf", "llama", n_ctx_train=64, rope_scaling=YARN)
    moe = write_synthetic_model(d / "llama-moe.gguf", "llama", n_ctx_train=64, n_expert=4)
    q8 = write_synthetic_model(d / "llama-q8.gguf", "llama", n_ctx_train=64, dtype="q8_0")
    return {
        "plain": as_mistral3(plain, d / "plain.gguf"),
        "temp": as_mistral3(plain, d / "temp.gguf", TEMP),
        "yarn": as_mistral3(yarn, d / "yarn.gguf"),
        "yarn-m0.1": as_mistral3(yarn, d / "yarn-m0.1.gguf", {"mistral3.rope.scaling.yarn_log_multiplier": 0.1}),
        "yarn-m1": as_mistral3(yarn, d / "yarn-m1.gguf", {"mistral3.rope.scaling.yarn_log_multiplier": 1.0}),
        "moe-temp": as_mistral3(moe, d / "moe-temp.gguf", TEMP),
        "q8-temp": as_mistral3(q8, d / "q8-temp.gguf", TEMP),
    }


@pytest.mark.parametrize("name", ["plain", "temp", "yarn", "yarn-m0.1", "yarn-m1", "moe-temp"])
def test_matches_llama_cpp(files, name):
    assert_matches_llama_cpp(files[name], TOKENS, TOL, same_top1=True)


def test_quantized_matches_llama_cpp(files):
    assert_matches_llama_cpp(files["q8-temp"], TOKENS, QUANT_TOL, same_top1=False)


def test_config(files):
    c = config_of(files["temp"])
    assert (c.arch, c.attn_temp_scale, c.attn_temp_floor) == ("mistral3", 0.5, 4)
    assert config_of(files["plain"]).attn_temp_scale == 0.0
    # YaRN factor 4: (1 + 0.1 ln 4) / (1 + 0.01 ln 4) with the multiplier 0.1; llama's 1 + 0.1 ln 4 without it
    assert config_of(files["yarn-m0.1"]).rope_mscale == pytest.approx(1.1386294 / 1.0138629)
    assert config_of(files["yarn"]).rope_mscale == pytest.approx(1.1386294)
    text = info_text(files["temp"])
    assert "mistral3" in text and "from position 4 on" in text


def test_bad_temperature_scale(files, tmp_path):
    bad = as_mistral3(files["plain"], tmp_path / "bad.gguf", {"mistral3.attention.temperature_scale": -1.0})
    with pytest.raises(ModelFileError, match="temperature_scale"):
        config_of(bad)


@pytest.fixture(scope="module")
def kern():
    k = CpuKernels(n_threads=2)
    yield k
    k.close()


def test_temperature_only_past_its_unit(files, kern):
    """t(pos) = 1 below L (the fused C step runs there, bit for bit the Python path); past L the Python path
    applies it, and one token at a time equals one batch (assert_matches_llama_cpp checked that on the file)."""
    m = load_model(files["temp"], kern, Mistral3Model)
    assert m.q_temperature(np.arange(4, dtype=np.int32)) is None
    t = m.q_temperature(np.arange(16, dtype=np.int32))
    want = 1 + 0.5 * np.log(np.floor(np.arange(16) / 4) + 1)
    np.testing.assert_allclose(t, want, rtol=1e-6)
    assert_fused_decode_equals_python(m, TOKENS[:4], n_prompt=2)


class OffsetTemperature(Mistral3Model):
    """A wrong mistral3: llama4's +1 position offset inside the floor."""

    def q_temperature(self, pos):
        return super().q_temperature(pos + 1)


class NoTemperature(Mistral3Model):
    def q_temperature(self, pos):
        return None


@pytest.mark.parametrize("file,cls,changes,least", [
    ("temp", NoTemperature, {}, 0.5),
    ("temp", OffsetTemperature, {}, 0.2),
    ("yarn-m1", Mistral3Model, {"rope_mscale": 1.1386294}, 0.3),
])
def test_mistakes_are_visible(files, kern, file, cls, changes, least):
    """Each wrong reading is far outside TOL, so the agreement above tells them apart."""
    ref = llama_cpp_logits(files[file], TOKENS)
    m = load_model(files[file], kern, cls, **changes)
    out = m.forward(TOKENS, m.new_cache(32), all_logits=True)
    assert np.abs(out - ref).max() / ref.std() > least
