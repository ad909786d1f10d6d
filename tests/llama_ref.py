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
