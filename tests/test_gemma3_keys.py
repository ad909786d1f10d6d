"""gemma3 files as llama.cpp's converter may write them: without attention.sliding_window (a checkpoint whose
sliding_window_pattern is 1: no window layers at all) and with final_logit_softcapping (written when the
checkpoint sets it). llama.cpp runs the first with global attention everywhere and soft-caps the logits of the
second; so do we (measured on the same files: 0.0031 and 0.0043 of the spread of llama.cpp's logits), and each
key changes them visibly (the unedited file is 3.4 and 4.5 spreads off)."""
from __future__ import annotations

import numpy as np
from llama_ref import llama_cpp_logits
from model_checks import load_model, rel_err, rewrite_gguf

from powerinfer_py.models import read_config
from powerinfer_py.gguf import open_gguf

TOKENS = np.array([2, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322], dtype=np.int32)  # past the window of 4
TOL = 0.01


def logits(path, kernels):
    m = load_model(path, kernels)
    return m.forward(TOKENS, m.new_cache(32), all_logits=True)


def test_no_window_key_means_global_attention(synthetic_model, cpu_kernels, tmp_path):
    src = synthetic_model("gemma3", "f32")
    path = rewrite_gguf(src, tmp_path / "nowin.gguf", edit={"gemma3.attention.sliding_window": None})
    c = read_config(open_gguf(path))
    assert c.sliding_window == 0 and not any(c.swa_layers)
    ours, theirs = logits(path, cpu_kernels), llama_cpp_logits(path, TOKENS)
    assert rel_err(ours, theirs) < TOL
    assert rel_err(logits(src, cpu_kernels), theirs) > 10 * TOL  # the windowed file differs: the key matters


def test_final_logit_softcap_is_applied(synthetic_model, cpu_kernels, tmp_path):
    src = synthetic_model("gemma3", "f32")
    path = rewrite_gguf(src, tmp_path / "cap.gguf", edit={"gemma3.final_logit_softcapping": 2.0})
    assert read_config(open_gguf(path)).final_softcap == 2.0
    ours, theirs = logits(path, cpu_kernels), llama_cpp_logits(path, TOKENS)
    assert rel_err(ours, theirs) < TOL
    assert np.abs(theirs).max() < 2.0 and rel_err(logits(src, cpu_kernels), theirs) > 10 * TOL
