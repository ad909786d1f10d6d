"""Log-probabilities of the tokens a generation reads and writes, for callers that score text.

A LogprobRecorder rides along a Generation (generate.py): for every generated token it records the token's
log-probability under the model and the `top_n` most likely tokens at that position; with `echo` it also
records them for every prompt token but the first (which nothing predicts), from logits computed for every
prompt position during prefill. This is what OpenAI's `logprobs` / `echo` fields report, and what evaluation
harnesses use to score a continuation (sum of its token log-probabilities, and whether each token was the
greedy choice).

The probabilities are the model's own: a log-softmax of the raw logits, before the sampler's penalties,
bias and temperature, as llama.cpp's server reports them by default. Computed in float64.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

MAX_TOP = 20  # OpenAI's limit for top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float | None              # None for the first prompt token: nothing before it predicts it
    top: tuple[tuple[int, float], ...]  # the most likely tokens at this position and their logprobs, best first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of a 1-D logits array (-inf stays -inf)."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x)
    return x - (m + np.log(np.sum(np.exp(x - m))))


def top_tokens(lp: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The n largest entries of lp as (id, value), largest first, ties by smaller id."""
    if n <= 0:
        return ()
    n = min(n, lp.shape[0])
    idx = np.argpartition(-lp, n - 1)[:n] if n < lp.shape[0] else np.arange(lp.shape[0])
    idx = idx[np.lexsort((idx, -lp[idx]))]
    return tuple((int(i), float(lp[i])) for i in idx)


def token_logprob(logits: np.ndarray, token: int, top_n: int) -> TokenLogprob:
    lp = log_softmax(logits)
    return TokenLogprob(int(token), float(lp[token]), top_tokens(lp, top_n))


@dataclass
class LogprobRecorder:
    """Entries in token order (prompt tokens first when echo is on); `take()` hands out the ones not yet taken,
    for a stream that sends them with the text they belong to."""
    top_n: int = 0
    echo: bool = False
    entries: list[TokenLogprob] = field(default_factory=list)
    _taken: int = 0

    def __post_init__(self):
        if not 0 <= self.top_n <= MAX_TOP:
            raise ValueError(f"top logprobs must be between 0 and {MAX_TOP}, got {self.top_n}")

    def on_token(self, logits: np.ndarray, token: int) -> None:
        self.entries.append(token_logprob(logits, token, self.top_n))

    def on_prompt_rows(self, prompt_ids: Sequence[int], rows: np.ndarray, start: int) -> None:
        """rows[i]: the logits after prompt token start + i, which predict prompt token start + i + 1."""
        if start == 0:
            self.entries.append(TokenLogprob(int(prompt_ids[0]), None, ()))
        for i in range(rows.shape[0]):
            j = start + i + 1
            if j < len(prompt_ids):
                self.entries.append(token_logprob(rows[i], int(prompt_ids[j]), self.top_n))

    def take(self) -> list[TokenLogprob]:
        new = self.entries[self._taken:]
        self._taken = len(self.entries)
        return new
