"""A multi-turn conversation over one model and one KV cache, reusing the cache from turn to turn.

    session = ChatSession(llm, template, system="Be brief.")
    reply = session.send("Hello!")
    for piece in reply:             # text as it is generated (stop markers never shown)
        print(piece, end="")
    reply.stats.n_prefilled         # tokens actually run through the model for this turn's prompt

Cache reuse. The session remembers which token ids its cache holds (`tokens`) and the template text they
stand for (`_text`). A new turn renders the whole conversation; when that text extends `_text`, only the
extension is tokenized and appended (the reply keeps the very ids the model generated, so nothing is
re-tokenized differently); otherwise (the system prompt changed, a conversation was loaded, turns were dropped)
the whole text is tokenized. Either way the cache is cut back to the longest common prefix of its ids and the
new prompt ids, and only the rest is prefilled.

Context. Before a turn the prompt must leave room for a reply (`reserve` tokens: a quarter of the context, or
the reply limit when it is smaller). If it does not, the oldest user/assistant pairs are dropped (never the
system prompt, never the new message) and the reply's stats say how many (`dropped_turns`); a message that
cannot fit even alone raises ContextFullError and is not kept.

Stops. A reply ends on the vocabulary's end-of-generation tokens, on the template's end-of-turn markers that
are single tokens, and on the template's other stop texts (matched in the streamed text, never shown).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import ContextFullError, PowerInferError
from ..generate import STOP_STRING, Generation, stream_text
from ..options import SamplingParams
from ..outfile import atomic_output
from ..sampler import LogprobRecorder, Sampler, TokenLogprob
from .templates import ChatTemplate, TemplateError, split_system

SAVE_FORMAT = "powerinfer-chat"
SAVE_VERSION = 1


@dataclass
class TurnStats:
    n_prompt: int = 0        # prompt ids of the whole conversation this turn
    n_reused: int = 0        # of those, already in the cache
    n_prefilled: int = 0     # run through the model now (n_prompt - n_reused)
    n_gen: int = 0           # reply tokens
    ttft_s: float = 0.0      # from send() to the first reply token (prefill + first sample)
    decode_s: float = 0.0
    n_decode: int = 0
    stop_reason: str | None = None  # "eos" | "stop" (a template stop) | "length" | "context" | "interrupted"
    dropped_turns: int = 0   # oldest user/assistant pairs dropped to make room before this turn
    context_used: int = 0    # cache positions held after the turn

    @property
    def decode_tok_s(self) -> float:
        return self.n_decode / self.decode_s if self.decode_s > 0 else 0.0


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ChatSession:
    """A conversation: the system prompt, the messages, and the ids held in the LLM's cache."""

    def __init__(self, llm, template: ChatTemplate, system: str | None = None, *, max_tokens: int = -1,
                 sampling: SamplingParams | None = None, prefill_batch: int = 256):
        self.llm, self.template = llm, template
        self.system = system or None
        self.messages: list[dict[str, str]] = []
        self.max_tokens = max_tokens  # a reply's limit (sampling's max_tokens and stop are not read: the
        self.sampler = Sampler(sampling or SamplingParams())  # template's end-of-turn markers end a reply)
        self.prefill_batch = prefill_batch
        self.logprobs: int | None = None  # N: each reply records its tokens' logprobs (reply.take_logprobs())
        self.cache = llm.cache
        self.cache.clear()
        self.tokens: list[int] = []  # the ids whose K/V the cache holds, in order (len == cache.n_past)
        self._text: str | None = ""  # the template text those ids stand for, when known exactly
        tok = llm.tokenizer
        self._stop_ids = set()
        for s in template.stops:
            ids = tok.encode(s, add_bos=False, special=True)
            if len(ids) == 1:
                self._stop_ids.add(ids[0])
        self._stop_texts = [s for s in template.stops if len(tok.encode(s, add_bos=False, special=True)) != 1]
        self.last: TurnStats | None = None

    # -- conversation state --------------------------------------------------------------------------------

    def conversation(self) -> list[dict[str, str]]:
        """The messages as the template sees them (the system prompt first, when there is one)."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [dict(m) for m in self.messages]

    def reset(self) -> None:
        """Forget the messages (the system prompt stays; its cached ids are reused by the next turn)."""
        self.messages = []

    def set_system(self, text: str | None) -> None:
        self.system = text or None

    @property
    def n_ctx(self) -> int:
        return self.cache.n_ctx

    @property
    def reserve(self) -> int:
        """Room a prompt must leave for the reply."""
        quarter = max(1, self.n_ctx // 4)
        return min(quarter, self.max_tokens) if self.max_tokens > 0 else quarter

    def save(self, path: str | os.PathLike) -> Path:
        """Write the conversation as JSON (atomically: a temporary file renamed into place)."""
        path = Path(path)
        data = {"format": SAVE_FORMAT, "version": SAVE_VERSION, "template": self.template.name,
                "system": self.system, "messages": self.messages}
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
            f.write("\n")
        return path

    def load(self, path: str | os.PathLike) -> int:
        """Replace the conversation with one saved by save(); returns its number of messages. The cache is
        brought up to date lazily, by the next turn (only what differs is prefilled)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise PowerInferError(f"cannot read {path}: {e.strerror or e}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PowerInferError(f"{path} is not a saved conversation (not JSON: {e})") from None
        except RecursionError:
            raise PowerInferError(f"{path} is not a saved conversation (JSON nested too deeply)") from None
        except ValueError:  # an integer past Python's digit limit
            raise PowerInferError(f"{path} is not a saved conversation (an integer with too many digits)") from None
        if not isinstance(data, dict) or data.get("format") != SAVE_FORMAT:
            raise PowerInferError(f"{path} is not a saved conversation (no \"format\": \"{SAVE_FORMAT}\")")
        messages, system = data.get("messages"), data.get("system")
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise PowerInferError(f"{path}: \"messages\" must be a list of {{role, content}} strings")
        if system is not None and not isinstance(system, str):
            raise PowerInferError(f"{path}: \"system\" must be a string or null")
        try:
            split_system(messages)
        except TemplateError as e:
            raise PowerInferError(f"{path}: {e}") from None
        if any(m["role"] == "system" for m in messages):
            raise PowerInferError(f"{path}: the system prompt belongs in \"system\", not in \"messages\"")
        self.system = system or None
        self.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        return len(self.messages)

    # -- a turn --------------------------------------------------------------------------------------------

    def _encode(self, text: str, first: bool) -> list[int]:
        tok = self.llm.tokenizer
        ids = tok.encode(text, add_bos=False, special=True)
        if first and tok.add_bos and tok.bos_id >= 0 and (not ids or ids[0] != tok.bos_id):
            ids.insert(0, tok.bos_id)
        return ids

    def _prompt(self, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
        full = self.template.render(messages, add_generation_prompt=True)
        if self._text is not None and self.tokens and full.startswith(self._text):
            return full, self.tokens + self._encode(full[len(self._text):], first=False)
        return full, self._encode(full, first=True)

    def _fit(self, user: dict[str, str]) -> tuple[str, list[int], int]:
        """The prompt for the conversation plus `user`, dropping the oldest pairs until it leaves room. The
        conversation changes only if the message then fits; otherwise ContextFullError and nothing is lost."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        kept = [dict(m) for m in self.messages]
        dropped = 0
        while True:
            full, ids = self._prompt(head + kept + [user])
            if len(ids) + self.reserve <= self.n_ctx or len(kept) < 2:
                break
            del kept[:2]
            dropped += 1
        if len(ids) >= self.n_ctx:
            raise ContextFullError(
                f"the message does not fit: the prompt would be {len(ids)} tokens and the context holds "
                f"{self.n_ctx}; shorten it, or raise the context size (-c)")
        self.messages = kept
        return full, ids, dropped

    def send(self, text: str) -> "Reply":
        """Start the assistant's reply to a user message. The user message joins the conversation at once;
        the reply joins it when the returned Reply finishes (or is interrupted: the partial reply is kept)."""
        t0 = time.perf_counter()
        user = {"role": "user", "content": text}
        full, ids, dropped = self._fit(user)
        reuse = _common_prefix(self.tokens, ids)
        if reuse == len(ids):  # everything cached: run the last token again for its logits
            reuse -= 1
        self.cache.truncate(reuse)
        reuse = self.cache.n_past  # a cache with a recurrent (conv) state keeps all or nothing (conv_cache.py)
        self.tokens = self.tokens[:reuse]
        self.messages.append(user)
        if self.llm.model.sparsity is not None:
            self.llm.model.sparsity.reset()
        stats = TurnStats(n_prompt=len(ids), n_reused=reuse, n_prefilled=len(ids) - reuse, dropped_turns=dropped)
        tok = self.llm.tokenizer
        recorder = None if self.logprobs is None else LogprobRecorder(top_n=self.logprobs)
        gen = Generation(self.llm.model, self.cache, ids[reuse:], self.sampler, self.max_tokens,
                         lambda t: tok.is_eog(t) or t in self._stop_ids, self.prefill_batch, recorder)
        self.last = stats
        return Reply(self, gen, full, ids, stats, t0)

    def _finish(self, full: str, ids: list[int], reply_ids: list[int], raw: str, shown: str) -> None:
        """Record the reply and what the cache now holds (see the module docstring)."""
        self.messages.append({"role": "assistant", "content": shown})
        all_ids = ids + reply_ids
        gap = len(all_ids) - self.cache.n_past
        if gap == 1 and self.cache.n_past < self.n_ctx and len(ids) <= self.cache.n_past:
            # the last reply token was sampled but not yet run (a length or text stop): run it, so the cache
            # matches the text exactly and the next turn appends to it
            self.llm.model.forward(all_ids[-1:], self.cache)
            gap = 0
        self.tokens = all_ids[:self.cache.n_past]
        self._text = full + raw if gap == 0 else None


class Reply:
    """The assistant's reply being generated: iterate it for text pieces. `text` is what was shown so far,
    `stats` a TurnStats, `stop_reason` is "interrupted" when the consumer stopped iterating early (Ctrl-C)."""

    def __init__(self, session: ChatSession, gen: Generation, full: str, ids: list[int], stats: TurnStats,
                 t0: float):
        self.session, self.gen, self.stats = session, gen, stats
        self.text = ""
        self._full, self._ids, self._t0 = full, ids, t0
        self._logprobs: list[TokenLogprob] = []
        self._it = self._run()

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._it)

    def close(self) -> None:
        """Stop early; the partial reply stays in the conversation."""
        self._it.close()

    def _show(self, shown: str, final: bool = False) -> str:
        """The part of `shown` to print now: a reply starts at its first visible character, and whitespace
        at its end is held back until more text follows (a reply does not end in blank lines)."""
        text = self._held + shown
        if not self.text:
            text = text.lstrip()
        if final:
            self._held = ""
            return ""
        body = text.rstrip()
        self._held = text[len(body):]
        self.text += body
        return body

    def take_logprobs(self) -> list[TokenLogprob]:
        """The logprob entries of the reply tokens generated since the last call (session.logprobs set)."""
        out, self._logprobs = self._logprobs, []
        return out

    def _run(self) -> Iterator[str]:
        s, st, gen = self.session, self.stats, self.gen
        # the template's stop texts are matched in the reply's own text, before _show trims its whitespace
        stream = stream_text(gen, s.llm.tokenizer, s._stop_texts, logprobs=gen.logprobs is not None)
        reply_ids: list[int] = []
        raw: list[str] = []  # the reply as generated, stop text included: what the cache now holds
        self._held = ""
        try:
            for piece in stream:
                if piece.tokens and not reply_ids:
                    st.ttft_s = time.perf_counter() - self._t0
                reply_ids.extend(piece.tokens)
                raw.append(piece.raw)
                self._logprobs.extend(piece.logprobs or ())
                shown = self._show(piece.text)
                if shown:
                    yield shown
        finally:
            if not reply_ids:
                st.ttft_s = time.perf_counter() - self._t0
            self._show("", final=True)
            stream.close()  # an interrupted reply keeps what was shown; held-back text is dropped
            gs = gen.stats
            st.stop_reason = ("stop" if gs.stop_reason == STOP_STRING else
                              gs.stop_reason if gs.stop_reason is not None else "interrupted")
            st.n_gen, st.n_decode, st.decode_s = len(reply_ids), gs.n_decode, gs.decode_s
            s._finish(self._full, self._ids, reply_ids, "".join(raw), self.text)
            st.context_used = s.cache.n_past

    def __repr__(self) -> str:
        return f"Reply({self.text!r}, stop={self.stats.stop_reason})"
