"""Token sampling: small pure functions over logits, and a Sampler that chains them with its own RNG.

The chain runs in llama.cpp's default order, so the same settings mean the same thing in both tools:

    logit bias -> penalties (repetition, frequency, presence) -> top-k -> top-p -> min-p -> temperature -> draw

Top-k, top-p and min-p therefore look at the untempered distribution; temperature only reshapes what is
left. After top-k the work is on k candidates instead of the whole vocabulary (262144 for Gemma 3), which
is what keeps a sampling step well under a millisecond: top-k uses argpartition, never a full sort.

Candidates are kept as two arrays sorted by descending logit, ties broken by the lower token id:
`ids` int64 [n] and `logits` float32 [n].

LogprobRecorder (at the end) reports the log-probabilities of the tokens read and written, for callers that
score text; it reads the raw logits, never the sampler's chain.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .options import SamplingParams  # defined with the other knobs; imported from here too


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities (float64, same shape) of a 1-D logits array; -inf logits get probability 0."""
    x = np.asarray(logits, dtype=np.float64)
    e = np.exp(x - np.max(x))
    return e / e.sum()


def apply_repetition_penalty(logits: np.ndarray, history: Sequence[int], penalty: float,
                             last_n: int) -> np.ndarray:
    """llama.cpp's repetition penalty over the distinct tokens among the last `last_n` of `history`.

    A seen token's positive logit is divided by `penalty` and a negative (or zero) one multiplied by it, so
    penalty > 1 always makes the token less likely. Returns a new array; `logits` is left as it is.
    last_n = 0 disables the penalty, last_n = -1 looks at the whole history.
    """
    out = np.array(logits, dtype=np.float32, copy=True)
    if penalty == 1.0 or last_n == 0 or len(history) == 0:
        return out
    recent = history if last_n < 0 else history[-last_n:]
    seen = np.unique(np.asarray(recent, dtype=np.int64))
    seen = seen[(seen >= 0) & (seen < out.shape[0])]
    vals = out[seen]
    out[seen] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def apply_logit_bias(logits: np.ndarray, bias: Sequence[tuple[int, float]]) -> np.ndarray:
    """logits + bias for the listed (token id, bias) pairs, as OpenAI's logit_bias; -inf bans a token.
    Returns `logits` itself when there is nothing to add, else a new array."""
    if not bias:
        return logits
    out = np.array(logits, dtype=np.float32, copy=True)
    for token, b in bias:
        out[token] += np.float32(b)
    return out


def apply_frequency_presence(logits: np.ndarray, history: Sequence[int], frequency: float, presence: float,
                             last_n: int) -> np.ndarray:
    """OpenAI's (and llama.cpp's) frequency and presence penalties over the last `last_n` tokens of `history`
    (-1: all of it, 0: off): a token seen c times there loses c * frequency + presence from its logit.
    Modifies and returns `logits` (the caller passes its own copy)."""
    if (frequency == 0.0 and presence == 0.0) or last_n == 0 or len(history) == 0:
        return logits
    recent = np.asarray(history if last_n < 0 else history[-last_n:], dtype=np.int64)
    recent = recent[(recent >= 0) & (recent < logits.shape[0])]
    seen, counts = np.unique(recent, return_counts=True)
    logits[seen] -= counts.astype(np.float32) * np.float32(frequency) + np.float32(presence)  # f32, as llama.cpp
    return logits


def _sort_desc(ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort candidates by descending logit, ties by ascending id (lexsort: last key is primary)."""
    order = np.lexsort((ids, -logits))
    return ids[order], logits[order]


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k highest-logit tokens of a full logits array [n_vocab], as sorted candidates.

    k <= 0 or k >= n_vocab keeps every token (and then has to sort the whole vocabulary).
    """
    logits = np.asarray(logits, dtype=np.float32)
    n = logits.shape[0]
    if 0 < k < n:
        # argpartition puts the k largest last in O(n). Ties at the boundary are settled by the lower id,
        # so the kept set does not depend on argpartition's internal order.
        ids = np.argpartition(logits, n - k)[n - k:]
        kth = logits[ids].min()
        n_tied = int(np.count_nonzero(logits[ids] == kth))
        if n_tied < int(np.count_nonzero(logits == kth)):  # rare: the tie straddles the boundary
            above = ids[logits[ids] > kth]
            ids = np.concatenate([above, np.flatnonzero(logits == kth)[:n_tied]])
    else:
        ids = np.arange(n)
    return _sort_desc(ids.astype(np.int64), logits[ids])


def top_p(ids: np.ndarray, logits: np.ndarray, p: float, min_keep: int = 1,
          mass: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Nucleus filter on sorted candidates: keep the shortest head whose probability mass reaches p.

    The token that crosses p is kept (as llama.cpp does); p >= 1 keeps everything. `mass` is the softmax
    denominator sum(exp(l - logits[0])) over the whole candidate set when only a head of it is passed in.
    """
    if p >= 1.0 or ids.shape[0] <= min_keep:
        return ids, logits
    e = np.exp(logits.astype(np.float64) - float(logits[0]))
    cum = np.cumsum(e) / (e.sum() if mass is None else mass)
    n = int(np.searchsorted(cum, p, side="left")) + 1  # first index where the mass reaches p, inclusive
    n = min(max(n, min_keep), ids.shape[0])
    return ids[:n], logits[:n]


def min_p(ids: np.ndarray, logits: np.ndarray, p: float, min_keep: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Keep candidates whose probability is at least p times the top candidate's (p <= 0 keeps all).

    prob_i >= p * prob_max  <=>  logit_i >= logit_max + log(p), so no softmax is needed.
    """
    if p <= 0.0 or ids.shape[0] <= min_keep:
        return ids, logits
    threshold = logits[0] + np.log(p)
    n = max(int(np.count_nonzero(logits >= threshold)), min_keep)  # sorted, so the kept ones are a head
    return ids[:n], logits[:n]


def temperature(logits: np.ndarray, t: float) -> np.ndarray:
    """Logits divided by the temperature t > 0 (t < 1 sharpens, t > 1 flattens)."""
    if t <= 0:
        raise ValueError(f"temperature must be > 0 here (t <= 0 means greedy), got {t}")
    return np.asarray(logits, dtype=np.float32) / np.float32(t)


def greedy(logits: np.ndarray) -> int:
    """The highest-logit token; ties go to the lowest id."""
    return int(np.argmax(logits))


def _head_for_min_p(logits: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Without top-k: the sorted candidates that can survive min-p (all of them if p <= 0), and the softmax
    mass of the whole vocabulary for top-p. top-p and min-p both keep a head of the sorted list, so cutting
    to min-p's head first changes nothing, and it spares a full sort of the vocabulary."""
    top = float(np.max(logits))
    mass = float(np.exp(logits.astype(np.float64) - top).sum())
    if p > 0.0:
        ids = np.flatnonzero(logits >= top + np.log(p))
    else:
        ids = np.arange(logits.shape[0])
    ids, cand = _sort_desc(ids.astype(np.int64), logits[ids])
    return ids, cand, mass


class Sampler:
    """Picks the next token from logits [n_vocab]; owns its random generator (reproducible for a seed)."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token id. `history` holds the tokens so far (prompt and generated), for the penalty."""
        p = self.params
        logits = apply_logit_bias(logits, p.logit_bias)
        logits = apply_repetition_penalty(logits, history, p.repeat_penalty, p.repeat_last_n)
        logits = apply_frequency_presence(logits, history, p.frequency_penalty, p.presence_penalty, p.repeat_last_n)
        if p.temperature <= 0:
            return greedy(logits)
        if 0 < p.top_k < logits.shape[0]:
            ids, cand = top_k(logits, p.top_k)
            ids, cand = top_p(ids, cand, p.top_p)
        else:
            ids, cand, mass = _head_for_min_p(logits, p.min_p)
            ids, cand = top_p(ids, cand, p.top_p, mass=mass)
        ids, cand = min_p(ids, cand, p.min_p)
        probs = softmax(temperature(cand, p.temperature))
        # Inverse-CDF draw: one uniform number per token, so a seed fixes the whole stream.
        i = int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum(), side="right"))
        return int(ids[min(i, ids.shape[0] - 1)])


# ---- log-probabilities --------------------------------------------------------------------------------------
# Log-probabilities of the tokens a generation reads and writes, for callers that score text.
#
# A LogprobRecorder rides along a Generation (generate.py): for every generated token it records the token's
# log-probability under the model and the `top_n` most likely tokens at that position; with `echo` it also
# records them for every prompt token but the first (which nothing predicts), from logits computed for every
# prompt position during prefill. This is what OpenAI's `logprobs` / `echo` fields report, and what evaluation
# harnesses use to score a continuation (sum of its token log-probabilities, and whether each token was the
# greedy choice).
#
# The probabilities are the model's own: a log-softmax of the raw logits, before the sampler's penalties,
# bias and temperature, as llama.cpp's server reports them by default. Computed in float64.

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
