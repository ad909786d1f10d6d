"""The OpenAI wire format: request bodies checked and turned into plain requests, and the response shapes.

Nothing here touches a model. A request that cannot be served raises ApiError, which carries the HTTP status
and the OpenAI-style error body {"error": {"message", "type", "code"}}; the message names the field and what
was wrong with it, because the person reading it is debugging a client.

Supported fields (both endpoints): max_tokens (chat: max_completion_tokens too), temperature, top_p, top_k,
min_p, repeat_penalty, frequency_penalty and presence_penalty (-2 to 2), logit_bias (token id -> -100 to 100),
seed, stop (a string or a list of strings), stream, stream_options.include_usage, n (1 only). Fields that would
change what the reply must look like are refused rather than ignored: tools and functions (non-empty),
response_format other than text.
/v1/completions: prompt (a string, a list of token ids, or a one-element list of either), logprobs (0-20: each
token's log-probability and that many alternatives, in OpenAI's legacy shape: tokens, token_logprobs,
top_logprobs, text_offset) and echo (the prompt comes back before the completion, with its tokens' logprobs when
logprobs is set; max_tokens 0 is allowed then, to score a text without generating).
/v1/chat/completions: messages with roles system (or developer), user and assistant and string content (or a
list of text parts); logprobs (true / false) and top_logprobs (0-20). Unknown fields are ignored, as OpenAI
clients send many optional ones (user, ...).
Logprobs are the model's own (a log-softmax of its logits, before penalties, bias and temperature).
"""
from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..errors import PowerInferError
from ..options import SamplingParams, api_fields
from ..sampler import MAX_TOP, TokenLogprob

MAX_BODY_BYTES = 32 << 20  # a request body larger than this is refused (413) before it is read


class ApiError(PowerInferError):
    """A request the server answers with an error status and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, code: str | None = None, err_type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.type = err_type or ("server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}


def bad(message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code)


@dataclass
class Common:
    """What both endpoints share: sampling, limits, stops and streaming."""
    sampling: SamplingParams
    max_tokens: int | None          # None: the endpoint's default
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False     # stream_options.include_usage: a last chunk with the usage
    logprobs: int | None = None     # N: report each token's logprob and the N most likely tokens; None: off


@dataclass
class CompletionRequest:
    prompt: str | list[int]
    common: Common
    echo: bool = False


@dataclass
class ChatRequest:
    system: str | None              # the first message, when it is a system (or developer) message
    history: list[dict[str, str]]   # the user/assistant messages before the last one
    user: str                       # the last message, always a user's
    common: Common


# ---- parsing -------------------------------------------------------------------------------------------------

def parse_body(raw: bytes) -> dict:
    """The request body as a JSON object (400 for anything else)."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad(f"malformed JSON: the body is not UTF-8 ({e.reason} at byte {e.start})", "invalid_json") from None
    except json.JSONDecodeError as e:
        detail = "the body is empty" if not raw.strip() else str(e)
        raise bad(f"malformed JSON: {detail}", "invalid_json") from None
    except RecursionError:
        raise bad("malformed JSON: arrays or objects nested too deeply", "invalid_json") from None
    except ValueError:  # an integer past Python's digit limit (int() refuses it after the parse)
        raise bad("malformed JSON: an integer with too many digits", "invalid_json") from None
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {_kind(body)}", "invalid_json")
    return body


def _kind(value: Any) -> str:
    """A JSON type name for messages ("string", "number", "array", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _number(body: dict, name: str, default: float, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f'"{name}" must be a number, got {_kind(value)}')
    if not math.isfinite(value):  # Python's json reads NaN and Infinity
        raise bad(f'"{name}" must be a finite number, got {value}')
    if (lo is not None and (value < lo or (lo_open and value == lo))) or (hi is not None and value > hi):
        left = "(" if lo_open else "["
        raise bad(f'"{name}" must be in {left}{lo if lo is not None else "-inf"}, {hi if hi is not None else "inf"}]'
                  f", got {value}")
    return float(value)


def _integer(body: dict, name: str, default: int | None, lo: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f'"{name}" must be an integer, got {_kind(value)}')
    if lo is not None and value < lo:
        raise bad(f'"{name}" must be at least {lo}, got {value}')
    return value


def _boolean(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f'"{name}" must be true or false, got {_kind(value)}')
    return value


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise bad(f'"stop" must be a string or an array of strings, got {_kind(value)}')


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} object as sorted pairs (ids checked against the vocabulary by the engine)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad(f'"logit_bias" must be an object mapping token ids to numbers, got {_kind(value)}')
    pairs = []
    for key, b in value.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if token < 0 or str(token) != key.strip():
            raise bad(f'"logit_bias": keys are token ids (non-negative integers), got {key!r}')
        pairs.append((token, _number({f"logit_bias.{key}": b}, f"logit_bias.{key}", 0.0, lo=-100.0, hi=100.0)))
    return tuple(sorted(pairs))


def _refuse_output_formats(body: dict) -> None:
    """Fields a client sends when it relies on the reply's form: silently ignoring them would hand it text it
    cannot parse."""
    for name in ("tools", "functions"):
        if body.get(name) not in (None, []):
            raise bad(f'"{name}" (function calling) is not supported by this server', "unsupported")
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind != "text":
            raise bad(f'"response_format" {kind or _kind(fmt)!s} is not supported by this server (only "text")',
                      "unsupported")


def _sampling(body: dict, defaults: SamplingParams) -> SamplingParams:
    """The request's sampling fields over the server's defaults: the fields, their JSON types and ranges are
    SamplingParams' `api` metadata (options.py); logit_bias has its own shape, the rest (repeat_last_n) are
    the server's settings. Seed first, as the per-request field it is."""
    fields = sorted(api_fields(), key=lambda f: not f[1].per_request)
    values: dict[str, Any] = {}
    for name, spec in fields:
        default = None if spec.per_request else getattr(defaults, name)
        if spec.kind == "integer":
            values[name] = _integer(body, name, default, lo=spec.lo)
        else:
            values[name] = _number(body, name, default, lo=spec.lo, hi=spec.hi, lo_open=spec.lo_open)
    values["logit_bias"] = _logit_bias(body.get("logit_bias")) or defaults.logit_bias
    return replace(defaults, **values)


def parse_common(body: dict, defaults: SamplingParams, max_tokens_names: Sequence[str] = ("max_tokens",),
                 min_tokens: int = 1) -> Common:
    """Sampling fields (the server's defaults where a field is absent or null), limits, stops, streaming."""
    n = _integer(body, "n", 1)
    if n != 1:
        raise bad(f'"n" must be 1: this server returns one choice per request, got {n}', "unsupported")
    _refuse_output_formats(body)
    max_tokens = None
    for name in max_tokens_names:
        max_tokens = _integer(body, name, max_tokens, lo=min_tokens)
    sampling = _sampling(body, defaults)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad(f'"stream_options" must be an object, got {_kind(options)}')
    include_usage = _boolean(options or {}, "include_usage")
    return Common(sampling, max_tokens, _stops(body.get("stop")), _boolean(body, "stream"), include_usage)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_completion(body: dict, defaults: SamplingParams) -> CompletionRequest:
    if "prompt" not in body:
        raise bad('"prompt" is required (a string or an array of token ids)', "missing_field")
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and (isinstance(prompt[0], (str, list))):
        if len(prompt) != 1:  # a batch of prompts
            raise bad(f'"prompt" holds {len(prompt)} prompts: this server takes one prompt per request',
                      "unsupported")
        prompt = prompt[0]
    if not isinstance(prompt, str) and not _is_ids(prompt):
        raise bad(f'"prompt" must be a string or an array of token ids (integers), got {_kind(prompt)}')
    echo = _boolean(body, "echo")
    if body.get("suffix") not in (None, ""):
        raise bad('"suffix" is not supported by this server', "unsupported")
    common = parse_common(body, defaults, min_tokens=0)
    if common.max_tokens == 0 and not echo:
        raise bad('"max_tokens": 0 generates nothing; it is allowed only with "echo": true (to score the prompt)')
    value = body.get("logprobs")
    if value is not None and value is not False:
        if isinstance(value, bool):
            raise bad(f'"logprobs" for /v1/completions is a count of alternatives (0 to {MAX_TOP}), got true')
        common.logprobs = _integer(body, "logprobs", None, lo=0)
        if common.logprobs > MAX_TOP:
            raise bad(f'"logprobs" must be at most {MAX_TOP}, got {common.logprobs}')
    return CompletionRequest(prompt, common, echo)


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text ones can be read by a text model
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                what = part.get("type") if isinstance(part, dict) else _kind(part)
                raise bad(f"messages[{i}].content: only text parts are supported, got {what!r}")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"messages[{i}].content must be a string or an array of text parts, got {_kind(content)}")


def parse_chat(body: dict, defaults: SamplingParams) -> ChatRequest:
    messages = body.get("messages")
    if messages is None:
        raise bad('"messages" is required (an array of {"role", "content"} objects)', "missing_field")
    if not isinstance(messages, list) or not messages:
        raise bad(f'"messages" must be a non-empty array, got {_kind(messages) if messages != [] else "[]"}')
    turns: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object with \"role\" and \"content\", got {_kind(m)}")
        role = m.get("role")
        if not isinstance(role, str):
            raise bad(f'messages[{i}].role must be a string, got {_kind(role)}', "missing_field" if role is None
                      else "invalid_value")
        if role not in ROLES:
            raise bad(f"messages[{i}]: unknown role {role!r} (this server takes system, user and assistant)")
        turns.append({"role": ROLES[role], "content": _content(m, i)})
    system = turns.pop(0)["content"] if turns[0]["role"] == "system" else None
    for i, t in enumerate(turns):
        want = "user" if i % 2 == 0 else "assistant"
        if t["role"] != want:
            at = i + (system is not None)
            raise bad(f"messages[{at}]: expected a {want} message, got {t['role']} (after an optional system "
                      "message, turns alternate user, assistant, ..., and end with the user)")
    if not turns or turns[-1]["role"] != "user":
        raise bad("the last message must be a user message")
    common = parse_common(body, defaults, ("max_tokens", "max_completion_tokens"))
    top = _integer(body, "top_logprobs", None, lo=0)
    if top is not None and top > MAX_TOP:
        raise bad(f'"top_logprobs" must be at most {MAX_TOP}, got {top}')
    if _boolean(body, "logprobs"):
        common.logprobs = top or 0
    elif top:
        raise bad('"top_logprobs" needs "logprobs": true')
    return ChatRequest(system, turns[:-1], turns[-1]["content"], common)


# ---- responses -----------------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(rid: str, created: int, model: str, text: str, finish: str | None, use: dict | None,
               chunk: bool = False, logprobs: dict | None = None) -> dict:
    """A /v1/completions response (chunk=True: one streamed piece, without usage unless given)."""
    out = {"id": rid, "object": "text_completion", "created": created, "model": model,
           "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
    if use is not None or not chunk:
        out["usage"] = use
    return out


def chat_completion(rid: str, created: int, model: str, text: str, finish: str, use: dict,
                    logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                         "finish_reason": finish}],
            "usage": use}


def chat_chunk(rid: str, created: int, model: str, delta: dict | None, finish: str | None,
               use: dict | None = None, logprobs: dict | None = None) -> dict:
    """One streamed chat piece: choices[0].delta; delta None makes the usage-only chunk (choices empty)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
    out = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}
    if use is not None:
        out["usage"] = use
    return out


def model_card(model_id: str, created: int) -> dict:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "powerinfer"}


# ---- logprobs ------------------------------------------------------------------------------------------------

def token_text(piece: bytes) -> str:
    """A token's text for a logprobs entry: the text when its bytes are whole UTF-8, else OpenAI's
    "bytes:\\xNN..." form (a token that holds part of a character)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in piece)


def completion_logprobs(entries: Sequence[TokenLogprob], piece, plain, offset: int) -> tuple[dict, int]:
    """OpenAI's legacy logprobs object for /v1/completions, and the offset after it. piece(id) -> the token's
    bytes as shown in the entries (special tokens by name), plain(id) -> the characters it completes in the
    response text (a stateful decoder: a token holding part of a character adds nothing, the one that
    completes it adds the character);
    offset: where the first entry's text starts in the response text (text_offset counts characters; a negative
    start stands for characters of the first pieces that the text leaves out, such as a leading space)."""
    tokens, values, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(token_text(piece(e.token)))
        values.append(e.logprob)
        tops.append(None if e.logprob is None else {token_text(piece(t)): lp for t, lp in e.top})
        offsets.append(max(offset, 0))
        offset += len(plain(e.token))
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}, offset


def chat_logprobs(entries: Sequence[TokenLogprob], piece) -> dict:
    """OpenAI's chat logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    def one(token: int, lp: float) -> dict:
        b = piece(token)
        return {"token": token_text(b), "logprob": lp, "bytes": list(b)}
    return {"content": [dict(one(e.token, e.logprob), top_logprobs=[one(t, lp) for t, lp in e.top])
                        for e in entries]}
