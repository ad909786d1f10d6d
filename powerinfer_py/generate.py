"""The generation loop: prefill the prompt in batches, then decode one token at a time with the KV cache.

generate() returns a Generation: an iterator of token ids (its generator does prefill, sample, forward,
sample, ...) that applies the stop rules (end-of-generation token, max_tokens, full context) and keeps
GenerationStats up to date as it goes.

stream_text() is the one layer above it that every front end reads text through (LLM.generate, `run`, chat
replies, the server): it turns the token ids into TextPieces, holding back the bytes of a UTF-8 character
split over tokens and any text that may be the start of a stop string (StopMatcher), and ends the text at
the first stop string.

Timing counts only our own work (forward passes and sampling), never the time the consumer spends between
two tokens (printing, detokenizing), so tok/s figures do not depend on who reads the stream.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from .errors import ContextFullError, PowerInferError
from .sampler import LogprobRecorder, TokenLogprob
from .sampler import Sampler

StopReason = str  # "eos" | "length" | "context", or STOP_STRING
STOP_STRING = "stop string"  # the text ended at a stop string (LLM.generate's stop=, `run --stop`, templates)


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


# ---- text ------------------------------------------------------------------------------------------------

class StopMatcher:
    """Finds stop texts in streamed text. feed() returns the text safe to show: anything that could still be
    the start of a stop text is held back until it is decided."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        self.pending += piece
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self.pending = self.pending[:min(hits)], ""
            return out
        hold = 0
        for s in self.stops:  # the longest tail of pending that begins some stop text
            for n in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(s[:n]):
                    hold = n
                    break
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out

    def finish(self, tail: str = "") -> str:
        """The text left to show when the stream ends: `tail` (e.g. a detokenizer's last bytes) fed in, then
        what was held back, unless a stop text has appeared (then nothing after it)."""
        out = self.feed(tail)
        return out if self.stopped else out + self.flush()


@dataclass
class TextPiece:
    """One step of a text stream. A piece per generated token (tokens == (id,)), whose text is often "" while
    it is held back; when the generation ends by itself, one last piece without a token brings what was held.
    text: what may be shown now; raw: the tokens' own decoded text, before stop strings were cut out (the
    last piece adds the decoder's held bytes); logprobs: the TokenLogprob entries recorded since the last
    piece (prompt ones too, when echoed), when the stream was asked for them; finish: set on the last piece
    only, the Generation's stop reason ("eos", "length", "context") or STOP_STRING."""
    text: str
    tokens: tuple[int, ...] = ()
    raw: str = ""
    logprobs: list[TokenLogprob] | None = None
    finish: StopReason | None = None


class TextStream:
    """Iterator of the TextPieces of a Generation (see stream_text). `finish` is the stop reason once the last
    piece is out; close() ends it early and returns the text that was still held back."""

    def __init__(self, gen: Generation, tokenizer, stops: Sequence[str] = (), *, logprobs: bool = False):
        self.gen = gen
        self.finish: StopReason | None = None
        self._decoder = tokenizer.stream()  # holds back the bytes of a character split over tokens
        self._matcher = StopMatcher(stops)   # holds back text that may be the start of a stop string
        self._recorder = gen.logprobs if logprobs else None
        self._done = False

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> TextPiece:
        if self._done:
            raise StopIteration
        try:
            token = next(self.gen)
        except StopIteration:  # the generation ended by itself: out with what was held back
            tail = self._decoder.flush()
            return self._last(TextPiece(self._matcher.finish(tail), (), tail, self._take()))
        raw = self._decoder.feed(token)
        piece = TextPiece(self._matcher.feed(raw), (token,), raw, self._take())
        if self._matcher.stopped:
            piece.raw += self._decoder.flush()
            self.gen.close()
            return self._last(piece)
        return piece

    def _take(self) -> list[TokenLogprob] | None:
        return self._recorder.take() if self._recorder is not None else None

    def _last(self, piece: TextPiece) -> TextPiece:
        self._done = True
        if self._matcher.stopped:
            self.gen.stats.stop_reason = STOP_STRING
        piece.finish = self.finish = self.gen.stats.stop_reason
        return piece

    def close(self) -> str:
        """Stop the generation where it is (its stop reason stays None) and return the text that was held back
        and never shown ("" once the stream has ended): the start of a possible stop string, and a split
        character's first bytes as U+FFFD."""
        if self._done:
            return ""
        self._done = True
        self.gen.close()
        return self._matcher.finish(self._decoder.flush())


def stream_text(gen: Generation, tokenizer, stops: Sequence[str] = (), *, logprobs: bool = False) -> TextStream:
    """The text of `gen` as TextPieces: tokens decoded with `tokenizer.stream()` (a UTF-8 character split over
    tokens comes out whole, with the token that completes it), text that may still become one of `stops`
    held back until decided, and the text ended before the first stop string (the Generation is then closed
    and its stats.stop_reason set to STOP_STRING). logprobs: each piece carries the Generation's recorded
    logprobs since the previous piece (the recorder's take(); nothing else should take from it then)."""
    return TextStream(gen, tokenizer, stops, logprobs=logprobs)
