"""Our dense perplexity on Gemma 3 270M against llama.cpp's on the same tokens (llama-cpp-python, logits of
every position through powerinfer_py.tools.bench.LlamaCppRef). The logits of the two engines differ by ~0.2 at
individual positions (f16 roundings, see test_real_model.py), which averages out over the text: the mean
NLL must agree within 0.01 nats (perplexity within 1%). Over 1000 tokens: at 160 the mean still carried ~0.01 nats
of noise (a change of f32 rounding order in the Q8_0 head moved it from +0.006 to -0.012; at 1000 tokens from +0.004
to +0.001)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from powerinfer_py import load
from powerinfer_py.tools.bench import LlamaCppRef
from powerinfer_py.tools.perplexity import perplexity, token_nll

pytestmark = pytest.mark.real_model

N_TOKENS = 1000
TEXT = (Path(__file__).parent.parent / "benchmarks" / "data" / "evaluation.txt").read_text(encoding="utf-8")


def test_dense_perplexity_matches_llama_cpp(real_model):
    with load(real_model, threads=2, n_ctx=N_TOKENS + 1) as llm:
        ids = llm.tokenize(TEXT, add_bos=False, special=False)[:N_TOKENS]
        bos = llm.tokenizer.bos_id
        ours = perplexity(llm, ids, ctx=N_TOKENS + 1)
    assert ours.n_tokens == N_TOKENS and ours.n_windows == 1
    ref = LlamaCppRef(real_model, n_ctx=N_TOKENS + 8, threads=2, n_batch=N_TOKENS + 1)
    try:
        seq = [bos] + ids
        logits = ref.decode(seq, all_logits=True)
    finally:
        ref.close()
    theirs = token_nll(logits[:-1], np.asarray(seq[1:]))
    assert abs(ours.nll - float(theirs.mean())) < 0.01, (ours.perplexity, float(np.exp(theirs.mean())))


def test_threshold_calibration_on_gemma(real_model, tmp_path):
    """Calibrated at 40% on 200 tokens of calibration.txt, threshold mode skips 40% +- 3 points on that text
    (it drifts a little from the dense calibration as earlier layers' skips change later activations), and its
    perplexity there stays within 30% of dense (the held-out numbers are in benchmarks/bench_threshold.py):
    one stage (worse than dense there), and the default two stages (which may even score that text a little
    better than dense; its outputs differ from dense all the same)."""
    from powerinfer_py.tools.calibrate import calibrate

    text = (Path(__file__).parent.parent / "benchmarks" / "data" / "calibration.txt").read_text(encoding="utf-8")
    one = calibrate(real_model, tmp_path / "t40.gguf", 0.4, text=text, n_tokens=200, ctx=101, threads=2,
                    one_stage=True)
    two = calibrate(real_model, tmp_path / "t40u20.gguf", 0.4, text=text, n_tokens=200, ctx=101, threads=2)
    assert one.n_tokens == 200 and len(one.thresholds) == 18 and one.up_sparsity is None
    assert two.up_sparsity == pytest.approx(0.2) and len(two.up_thresholds) == 18
    with load(one.path, threads=2, n_ctx=101, sparse="off") as llm:
        dense = perplexity(llm, text, ctx=101, max_tokens=200)
    for res in (one, two):
        with load(res.path, threads=2, n_ctx=101, sparse="threshold") as llm:
            sparse = perplexity(llm, text, ctx=101, max_tokens=200)
            skipped = llm.sparsity_stats.skipped_fraction
        assert abs(skipped - 0.4) <= 0.03, res.path
        assert abs(sparse.nll - dense.nll) > 1e-3  # the skips change the outputs
        assert sparse.perplexity < 1.3 * dense.perplexity
        if res is one:
            assert dense.perplexity < sparse.perplexity
