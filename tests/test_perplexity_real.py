"""Our dense perplexity on Gemma 3 270M against llama.cpp's on the same tokens (llama-cpp-python, logits of
every position through powerinfer_py.bench.LlamaCppRef). The logits of the two engines differ by ~0.2 at
individual positions (f16 roundings, see test_real_model.py), which averages out over the text: the mean
NLL must agree within 0.01 nats (perplexity within 1%)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from powerinfer_py import load
from powerinfer_py.bench import LlamaCppRef
from powerinfer_py.perplexity import perplexity, token_nll

pytestmark = pytest.mark.real_model

N_TOKENS = 160
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
