"""The generation loop: prefill the prompt in batches, then decode one token at a time with the KV cache.

generate() returns a Generation: an iterator of token ids (its generator does prefill, sample, forward,
sample, ...) that applies the stop rules (end-of-generation token, max_tokens, full context) and keeps
GenerationStats up to date as it goes. Text streaming is a layer above (LLM.generate with a StreamDecoder).

Timing counts only our own work (forward passes and sampling), never the time the consumer spends between
two tokens (printing, detokenizing), so tok/s figures do not depend on who reads the stream.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from .errors import ContextFullError, PowerInferError
from .sampler import LogprobRecorder
from .sampler import Sampler

StopReason = str  # "eos" | "length" | "context", or STOP_STRING
STOP_STRING = "stop string"  # the text ended at a stop string the caller gave (LLM.generate, `run --stop`)


@dataclass
class GenerationStats:
    n_prompt: int = 0        # prompt tokens prefilled
    prompt_s: float = 0.0    # seconds in prefill (the forward passes over the prompt)
    n_gen: int = 0           # tokens generated (yielded); an end-of-generation token is not counted
    n_decode: int = 0        # single-token forward passes (n_gen - 1, plus 1 if generation hit EOS)
    decode_s: float = 0.0    # seconds in those forward passes and in sampling
    stop_reason: StopReason | None = None  # None while generation is still running

    @property
    def prompt_tok_s(self) -> float:
        return self.n_prompt / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.n_decode / self.decode_s if self.decode_s > 0 else 0.0


def check_logits(logits: np.ndarray, position: int, first: int | None = None) -> np.ndarray:
    """logits, or a PowerInferError when they hold NaN or +Inf (-Inf is a masked token): sampling from them
    would print garbage that looks like model output. One max over the vocabulary per token (12 us at 262k)."""
    top = float(np.max(logits))
    if not np.isfinite(top) and not top == -np.inf:
        where = f"position {position}" if first is None or first == position else f"positions {first}-{position}"
        raise PowerInferError(f"the model's logits at {where} are not finite ({top}): NaN or infinite "
                              "values in the weights (a damaged file?) or an overflow in the computation")
    return logits


def prefill(model, cache, prompt_ids: Sequence[int], batch: int,
            on_rows: Callable[[np.ndarray, int], None] | None = None) -> np.ndarray:
    """Run the prompt through the model in batches of `batch` tokens; logits f32 [n_vocab] of the last.
    With on_rows, the logits of every position are computed too and handed over a batch at a time:
    on_rows(rows [n, n_vocab], start), rows[i] being the logits after prompt token start + i."""
    ids = np.asarray(prompt_ids, dtype=np.int32)
    logits = None
    for start in range(0, ids.shape[0], batch):
        chunk = ids[start:start + batch]
        if on_rows is None:
            logits = model.forward(chunk, cache)
            continue
        rows = model.forward(chunk, cache, all_logits=True).reshape(chunk.shape[0], -1)
        check_logits(rows, cache.n_past - 1, cache.n_past - chunk.shape[0])
        on_rows(rows, start)
        logits = rows[-1]
    return logits


class Generation:
    """An iterator of generated token ids with live statistics in `.stats`.

    Validation happens here, when generate() is called, not at the first next(): a prompt that cannot fit
    raises ContextFullError right away. With a LogprobRecorder (`logprobs`), every yielded token's
    log-probability is recorded before it is yielded (and the prompt's, when the recorder echoes). Stop rules, checked after each sampled token:
      "eos"     the token is an end-of-generation token (it is not yielded);
      "length"  max_tokens tokens were yielded (max_tokens < 0: no limit);
      "context" the cache is full, so the next token would have nowhere to go.
    """

    def __init__(self, model, cache, prompt_ids: Sequence[int], sampler: Sampler, max_tokens: int,
                 is_eog: Callable[[int], bool], prefill_batch: int = 256, logprobs: LogprobRecorder | None = None):
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise PowerInferError("empty prompt: generation needs at least one token (a BOS at least)")
        if prefill_batch < 1:
            raise ValueError(f"prefill_batch must be >= 1, got {prefill_batch}")
        room = cache.n_ctx - cache.n_past
        if len(prompt_ids) > room:
            raise ContextFullError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {cache.n_ctx} "
                f"({cache.n_past} already used): shorten the prompt or raise the context size (-c)")
        self.stats = GenerationStats(n_prompt=len(prompt_ids))
        self.logprobs = logprobs
        self._it = self._run(model, cache, prompt_ids, sampler, max_tokens, is_eog, prefill_batch)

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> int:
        return next(self._it)

    def close(self) -> None:
        """Stop early (e.g. the consumer broke out of the loop); the stop reason stays None."""
        self._it.close()

    def _run(self, model, cache, prompt_ids, sampler, max_tokens, is_eog, prefill_batch) -> Iterator[int]:
        st = self.stats
        history = list(prompt_ids)  # the repetition penalty sees the prompt too, as in llama.cpp
        t0 = time.perf_counter()
        rec = self.logprobs
        on_rows = None
        if rec is not None and rec.echo:
            def on_rows(rows, start):
                rec.on_prompt_rows(prompt_ids, rows, start)
        logits = prefill(model, cache, prompt_ids, prefill_batch, on_rows)
        t1 = time.perf_counter()
        st.prompt_s = t1 - t0
        if max_tokens == 0:
            st.stop_reason = "length"
            return
        token = sampler.sample(check_logits(logits, cache.n_past - 1), history)
        st.decode_s += time.perf_counter() - t1
        while True:
            if is_eog(token):
                st.stop_reason = "eos"
                return
            if rec is not None:
                rec.on_token(logits, token)
            history.append(token)
            st.n_gen += 1
            yield token
            if 0 <= max_tokens <= st.n_gen:
                st.stop_reason = "length"
                return
            if cache.n_past >= cache.n_ctx:
                st.stop_reason = "context"
                return
            t = time.perf_counter()
            logits = model.forward(np.array([token], dtype=np.int32), cache)
            token = sampler.sample(check_logits(logits, cache.n_past - 1), history)
            st.n_decode += 1
            st.decode_s += time.perf_counter() - t


def generate(model, cache, prompt_ids: Sequence[int], sampler: Sampler, max_tokens: int,
             is_eog: Callable[[int], bool], prefill_batch: int = 256,
             logprobs: LogprobRecorder | None = None) -> Generation:
    """Generate tokens after prompt_ids (written into `cache` from cache.n_past on).

    max_tokens < 0 generates until an end-of-generation token or a full context. Returns a Generation:
    iterate it for token ids; its .stats fill in as it runs (stop_reason once it has finished).
    """
    return Generation(model, cache, prompt_ids, sampler, max_tokens, is_eog, prefill_batch, logprobs)
