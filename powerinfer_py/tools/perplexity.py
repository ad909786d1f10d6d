"""Perplexity of a model over a text, in any sparse mode: what sparsity costs in quality.

The text is tokenized without BOS and cut into consecutive windows of at most ctx - 1 tokens; each window is
run from an empty cache as [BOS] + window (models without a BOS token: the window alone, its first token
unscored), and every position predicts the next token. Each text token is thus scored exactly once, with the
context of the tokens before it in its window:
    NLL = mean over scored tokens of  -log softmax(logits[i])[token[i + 1]]        perplexity = exp(NLL)
Logits are computed for every position (all_logits) `batch` tokens at a time, so memory stays at
batch x n_vocab floats; the log-softmax is summed in f64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import PowerInferError
from ..generate import check_logits

DEFAULT_CTX = 512
DEFAULT_BATCH = 64


@dataclass
class PerplexityResult:
    n_tokens: int  # scored tokens
    n_windows: int
    ctx: int
    nll: float  # mean negative log-likelihood per scored token (nats)
    window_nll: list[float] = field(default_factory=list)  # per window

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    def to_json(self) -> dict:
        return {"perplexity": self.perplexity, "nll": self.nll, "n_tokens": self.n_tokens,
                "n_windows": self.n_windows, "ctx": self.ctx, "window_nll": self.window_nll}


def windows(ids: Sequence[int], ctx: int, bos: int | None) -> Iterator[list[int]]:
    """The token windows the module docstring describes (each at most ctx tokens, BOS first when bos)."""
    if ctx < 2:
        raise PowerInferError(f"the perplexity window needs at least 2 tokens, got ctx={ctx}")
    body = ctx - 1 if bos is not None else ctx
    step = body if bos is not None else ctx - 1  # without BOS, windows overlap by one (its first is unscored)
    ids = [int(t) for t in ids]
    start = 0
    while start < len(ids) - (0 if bos is not None else 1):
        piece = ids[start:start + body]
        yield ([bos] + piece) if bos is not None else piece
        start += step


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]] in f64 for logits f32 [N, n_vocab], targets int [N]."""
    lg = np.asarray(logits, dtype=np.float32)
    m = lg.max(axis=1)
    lse = m.astype(np.float64) + np.log(np.exp(lg - m[:, None]).sum(axis=1, dtype=np.float64))
    return lse - lg[np.arange(len(targets)), targets].astype(np.float64)


def window_nll(model, cache, ids: Sequence[int], batch: int = DEFAULT_BATCH) -> np.ndarray:
    """NLL f64 [len(ids) - 1] of ids[1:] given the prefix, running `model` over ids from an empty cache."""
    ids = np.asarray(ids, dtype=np.int32)
    cache.clear()
    out = []
    for s in range(0, len(ids), batch):
        chunk = ids[s:s + batch]
        logits = model.forward(chunk, cache, all_logits=True).reshape(len(chunk), -1)
        targets = ids[s + 1:s + 1 + len(chunk)]
        check_logits(logits, s + len(chunk) - 1, s)  # NaN or +Inf anywhere in the chunk: a named error, not "nan"
        out.append(token_nll(logits[:len(targets)], targets))
    return np.concatenate(out) if out else np.zeros(0)


def perplexity(llm, text: str | Sequence[int], ctx: int = DEFAULT_CTX, batch: int = DEFAULT_BATCH,
               max_tokens: int | None = None, on_window: Callable[[int, float], None] | None = None
               ) -> PerplexityResult:
    """Perplexity of `llm` (an LLM, in whatever sparse mode it was loaded) over `text` (a string, tokenized
    without BOS, or token ids). ctx: window size in tokens (at most llm.n_ctx); max_tokens: score at most
    this many text tokens; on_window(index, nll) is called after each window."""
    ids = llm.tokenize(text, add_bos=False, special=False) if isinstance(text, str) else [int(t) for t in text]
    ctx = min(int(ctx), llm.n_ctx)
    bos = llm.tokenizer.bos_id if llm.tokenizer.bos_id is not None and llm.tokenizer.bos_id >= 0 else None
    if max_tokens is not None:  # with BOS every text token is scored; without, the first one is context
        ids = ids[:max_tokens + (0 if bos is not None else 1)]
    if len(ids) < (1 if bos is not None else 2):
        raise PowerInferError("the text is too short to measure perplexity (it needs at least 2 tokens)")
    if batch < 1:
        raise PowerInferError(f"batch must be at least 1, got {batch}")
    cache = llm.model.new_cache(ctx)
    total, n, per_window = 0.0, 0, []
    for i, w in enumerate(windows(ids, ctx, bos)):
        nll = window_nll(llm.model, cache, w, batch)
        total += float(nll.sum())
        n += len(nll)
        per_window.append(float(nll.mean()))
        if on_window is not None:
            on_window(i, per_window[-1])
    return PerplexityResult(n, len(per_window), ctx, total / n, per_window)
