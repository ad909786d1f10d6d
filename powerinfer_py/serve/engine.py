"""The server's one model, and the runs that turn a request into streamed text.

There is one LLM with one KV cache, so requests take turns: the HTTP layer holds `Engine.lock` from the
moment a request starts a run until its last piece is written, and the other requests wait for it.

Chat requests go through one ChatSession (powerinfer_py.chat), the same code as `powerinfer chat`: the
conversation is rendered with the same template, tokenized and stopped the same way. The session is kept
from request to request, so a client that sends the conversation again with one more message prefills only
the new tokens (ChatSession reuses the longest common prefix of the cached ids). A completion request resets
the cache (LLM.stream), so the session is dropped then and made afresh by the next chat request.

A Run yields text pieces; when it ends, `finish_reason` is "stop" (the model ended its text, or a stop
string or end-of-turn marker was met) or "length" (max_tokens reached, or the context window is full) and
`prompt_tokens` / `completion_tokens` hold the usage. close() stops it early (a client went away).
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Iterator

from ..chat import ChatSession, template_for
from ..errors import ContextFullError, PowerInferError
from ..generate import StopMatcher, TextStream
from ..options import SamplingParams
from ..sampler import Sampler
from . import api
from .api import ApiError, ChatRequest, CompletionRequest, bad

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat replies run to the end of the turn


class Stopping(Exception):
    """The server is shutting down: a run in progress ends without a finish reason."""


class Run:
    """Text pieces of one response, with its finish reason and usage once exhausted."""

    def __init__(self, prompt_tokens: int, pieces, logprobs=None):
        """pieces(run) -> the generator of text pieces, which fills in the run's usage and finish reason;
        logprobs() -> the logprobs object of the tokens generated since its last call (None: not asked for)."""
        self._pieces = pieces(self)
        self._logprobs = logprobs
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.finish_reason: str | None = None

    def take_logprobs(self, stream: bool = False) -> dict | None:
        """The logprobs of the tokens not reported yet, in the endpoint's shape; None when not asked for, or
        in a stream when there are none (a chunk without new tokens)."""
        if self._logprobs is None:
            return None
        body, n = self._logprobs()
        return None if stream and n == 0 else body

    def __iter__(self) -> Iterator[str]:
        return self._pieces

    def close(self) -> None:
        self._pieces.close()


def _finish(reason: str | None) -> str:
    """Our stop reasons in OpenAI's terms: the text ended by itself ("stop") or was cut ("length")."""
    return "length" if reason in ("length", "context") else "stop"


class Engine:
    """The loaded model behind the HTTP server: its id, chat template, sampling defaults and the lock."""

    def __init__(self, llm, template: str | None = None, defaults: SamplingParams | None = None,
                 model_id: str | None = None):
        self.llm = llm
        self.template = template_for(llm, template)  # a bad --chat-template fails at start, not per request
        self.defaults = defaults or SamplingParams()
        self.model_id = model_id or llm.path.stem
        self.created = int(time.time())
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._session: ChatSession | None = None

    # -- /v1/completions -----------------------------------------------------------------------------------

    def complete(self, req: CompletionRequest) -> Run:
        """Start a completion (hold self.lock). Raises ApiError for a prompt the model cannot take."""
        llm, c = self.llm, req.common
        if isinstance(req.prompt, list):
            n_vocab = llm.tokenizer.n_vocab
            wrong = [t for t in req.prompt if not 0 <= t < n_vocab]
            if wrong:
                raise bad(f'"prompt": token id {wrong[0]} is outside the vocabulary (0 to {n_vocab - 1})')
        self._check_bias(c.sampling)
        self._session = None  # a completion resets the cache the chat session relied on
        max_tokens = c.max_tokens if c.max_tokens is not None else COMPLETION_MAX_TOKENS
        try:
            stream = llm.stream(req.prompt, replace(c.sampling, max_tokens=max_tokens, stop=tuple(c.stop)),
                                logprobs=c.logprobs, echo=req.echo and c.logprobs is not None)
        except ContextFullError as e:
            raise self._too_long(str(e)) from None
        except PowerInferError as e:
            raise bad(str(e)) from None
        prompt_text = req.prompt if isinstance(req.prompt, str) else llm.tokenizer.decode(req.prompt)
        echo = prompt_text if req.echo else None
        logprobs, pending = None, []  # pending: the entries of the pieces not reported yet
        if stream.gen.logprobs is not None:
            tok = llm.tokenizer
            # text_offset counts characters from the prompt's start. The echoed prompt is its pieces joined,
            # less the space a SentencePiece vocabulary puts before the first word: start that far below 0.
            offset = [len(prompt_text)]
            if req.echo:
                ids = llm.tokenize(req.prompt) if isinstance(req.prompt, str) else req.prompt
                offset[0] -= len(b"".join(tok.piece(t) for t in ids).decode("utf-8", errors="replace"))

            plain = tok.stream()

            def logprobs():
                entries = pending[:]
                del pending[:]
                body, offset[0] = api.completion_logprobs(entries, lambda t: tok.piece(t, special=True),
                                                          plain.feed, offset[0])
                return body, len(entries)
        return Run(stream.gen.stats.n_prompt, lambda run: self._completion_pieces(run, stream, echo, pending),
                   logprobs)

    def _completion_pieces(self, run: Run, stream: TextStream, echo: str | None, pending: list) -> Iterator[str]:
        try:
            if echo:  # the prompt comes back first; in a stream its logprobs come with the next chunk (the
                yield echo  # prefill that makes them runs after this piece is sent)
            for piece in stream:
                if piece.tokens:
                    self._check_stopping()
                    run.completion_tokens += 1
                pending.extend(piece.logprobs or ())
                if piece.text:
                    yield piece.text
            run.finish_reason = _finish(stream.finish)
        finally:
            stream.close()

    # -- /v1/chat/completions ------------------------------------------------------------------------------

    def chat(self, req: ChatRequest) -> Run:
        """Start a chat reply (hold self.lock). Raises ApiError for a conversation the model cannot take."""
        c = req.common
        self._check_bias(c.sampling)
        # The session is kept only once its reply has run to its end (or been closed) and the session knows
        # again which ids the cache holds; a run dropped before its first piece leaves it unset.
        session, self._session = self._session, None
        if session is None:
            session = ChatSession(self.llm, self.template)
        session.system = req.system or None
        session.messages = [dict(m) for m in req.history]
        session.max_tokens = c.max_tokens if c.max_tokens is not None else -1
        session.sampler = Sampler(c.sampling)
        session.logprobs = c.logprobs
        try:
            reply = session.send(req.user)
        except ContextFullError as e:  # send() changed nothing: the session still matches the cache
            self._session = session
            raise self._too_long(str(e)) from None
        except PowerInferError as e:  # a template that refuses the conversation
            self._session = session
            raise bad(str(e)) from None
        logprobs = None
        if reply.gen.logprobs is not None:
            tok = self.llm.tokenizer

            def logprobs():
                entries = reply.take_logprobs()
                return api.chat_logprobs(entries, lambda t: tok.piece(t, special=True)), len(entries)
        return Run(reply.stats.n_prompt, lambda run: self._chat_pieces(run, session, reply, c.stop), logprobs)

    def _chat_pieces(self, run: Run, session: ChatSession, reply, stops: list[str]) -> Iterator[str]:
        # The request's stops are matched in the reply as shown (its leading and trailing whitespace trimmed by
        # the Reply, which matched the template's own stop texts in the raw text before that).
        matcher = StopMatcher(stops)
        try:
            for piece in reply:
                self._check_stopping()
                run.completion_tokens = reply.gen.stats.n_gen
                shown = matcher.feed(piece)
                if shown:
                    yield shown
                if matcher.stopped:
                    break
            if not matcher.stopped:
                tail = matcher.finish()
                if tail:
                    yield tail
        finally:
            reply.close()
            run.completion_tokens = reply.stats.n_gen
            self._session = session
        run.finish_reason = "stop" if matcher.stopped else _finish(reply.stats.stop_reason)

    # -- shared --------------------------------------------------------------------------------------------

    def _check_bias(self, sampling: SamplingParams) -> None:
        try:
            sampling.check_vocab(self.llm.tokenizer.n_vocab)
        except ValueError as e:
            raise bad(str(e)) from None

    def _check_stopping(self) -> None:
        if self.stopping.is_set():
            raise Stopping("the server is shutting down")

    @staticmethod
    def _too_long(message: str) -> ApiError:
        """The runtime's ContextFullError already names the prompt's length and the context window."""
        return ApiError(400, message, "context_length_exceeded")
