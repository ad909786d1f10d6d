"""llama.cpp as the reference engine in tests: its logits for a token sequence on a file."""
from __future__ import annotations

import llama_cpp
import numpy as np


def llama_cpp_logits(path, tokens, n_ctx: int = 32) -> np.ndarray:
    """f32 [len(tokens), n_vocab]: llama.cpp's logits at every position of `tokens` fed from an empty cache."""
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=n_ctx, n_threads=2, verbose=False)
    try:
        llm.eval([int(t) for t in tokens])
        return np.array(llm.scores[:len(tokens)], dtype=np.float32)
    finally:
        llm.close()


def llama_cpp_penalties(logits, history, last_n: int, repeat: float, frequency: float, presence: float,
                        bias: dict[int, float] | None = None) -> np.ndarray:
    """logits [n_vocab] after llama.cpp's own logit-bias and penalties samplers (llama_sampler_init_logit_bias,
    llama_sampler_init_penalties) have seen `history`: the reference for our sampler's first steps."""
    import ctypes

    logits = np.asarray(logits, dtype=np.float32)
    n = logits.shape[0]
    chain = []
    if bias:
        arr = (llama_cpp.llama_logit_bias * len(bias))(*[llama_cpp.llama_logit_bias(t, b) for t, b in bias.items()])
        chain.append(llama_cpp.llama_sampler_init_logit_bias(n, len(bias), arr))
    chain.append(llama_cpp.llama_sampler_init_penalties(n, last_n, repeat, frequency, presence))
    data = (llama_cpp.llama_token_data * n)(*[llama_cpp.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits)])
    cur = llama_cpp.llama_token_data_array(data, n, -1, False)
    try:
        for smpl in chain:
            for t in history:
                llama_cpp.llama_sampler_accept(smpl, int(t))
            llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
    finally:
        for smpl in chain:
            llama_cpp.llama_sampler_free(smpl)
    out = np.empty(n, dtype=np.float32)
    for i in range(n):
        out[data[i].id] = data[i].logit
    return out
