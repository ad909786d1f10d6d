"""Chat templates: a conversation (system prompt + user/assistant messages) becomes one prompt text.

Two kinds, behind one interface (ChatTemplate.render(messages, add_generation_prompt) -> str, .stops):

  JinjaTemplate    the model's own `tokenizer.chat_template`, rendered the way Hugging Face transformers
                   renders it: a sandboxed Jinja environment with trim_blocks/lstrip_blocks and loop controls,
                   the variables messages, bos_token, eos_token, add_generation_prompt, and the helpers
                   raise_exception() and strftime_now().
  BuiltinTemplate  the well-known formats written out in Python (BUILTIN: llama-2, llama-3, chatml, gemma,
                   mistral, phi-3, plain), for files that carry no template or when --template asks for one.

`stops` are the texts that end a reply besides the vocabulary's end-of-generation tokens: the end-of-turn
marker of the format (<end_of_turn>, <|im_end|>, ...), or for the plain format the start of the next
"User:" line. The session turns single-token stops into token ids and matches the others in the text.

The templates write the BOS token as text where the format has one; the session tokenizes with special
tokens parsed and adds a BOS itself only when the vocabulary wants one and the text does not begin with it.
"""
from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ..errors import PowerInferError
from ..models import find_spec

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}

# End-of-turn markers of common formats: a Jinja template that mentions one stops on it.
KNOWN_TURN_ENDS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>",
                   "<|END_OF_TURN_TOKEN|>", "</s>")


class TemplateError(PowerInferError):
    """A chat template that cannot be rendered (a Jinja syntax error, raise_exception(), a bad message)."""


class ChatTemplate:
    """The interface: `name`, `stops` (texts that end a reply) and render()."""
    name: str
    stops: tuple[str, ...]

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        raise NotImplementedError


def split_system(messages: Sequence[Message]) -> tuple[str | None, list[Message]]:
    """(system text or None, the other messages), checking roles and alternation."""
    system, rest = None, []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "system":
            if i != 0:
                raise TemplateError("a system message may only come first")
            system = m.get("content", "")
        elif role in ("user", "assistant"):
            want = "user" if len(rest) % 2 == 0 else "assistant"
            if role != want:
                raise TemplateError(f"message {i}: expected a {want} message, got {role} (turns alternate, "
                                    "starting with the user)")
            rest.append(m)
        else:
            raise TemplateError(f"message {i}: unknown role {role!r} (system, user, assistant)")
    return system, rest


@dataclass(frozen=True)
class BuiltinTemplate(ChatTemplate):
    """A format written out in Python: `fn(system, messages, add_generation_prompt, bos, eos) -> str`."""
    name: str
    fn: Callable[..., str]
    stops: tuple[str, ...]
    bos: str = ""
    eos: str = ""

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        system, rest = split_system(messages)
        return self.fn(system, rest, add_generation_prompt, self.bos, self.eos)

    def with_tokens(self, bos: str, eos: str) -> "BuiltinTemplate":
        return BuiltinTemplate(self.name, self.fn, self.stops, bos, eos)


def _first_user_with_system(system: str | None, content: str) -> str:
    """Formats without a system role put the system text in front of the first user message."""
    return f"{system}\n\n{content}" if system else content


def _llama2(system, msgs, gen, bos, eos):
    out = []
    for i in range(0, len(msgs), 2):
        user = msgs[i]["content"]
        if i == 0 and system:
            user = f"<<SYS>>\n{system}\n<</SYS>>\n\n{user}"
        out.append(f"{bos}[INST] {user} [/INST]")
        if i + 1 < len(msgs):
            out.append(f" {msgs[i + 1]['content']} {eos}")
    return "".join(out)


def _llama3(system, msgs, gen, bos, eos):
    def block(role, text):
        return f"<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>"
    out = [bos]
    if system:
        out.append(block("system", system))
    out += [block(m["role"], m["content"]) for m in msgs]
    if gen:
        out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


def _chatml(system, msgs, gen, bos, eos):
    out = [f"<|im_start|>system\n{system}<|im_end|>\n"] if system else []
    out += [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs]
    if gen:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def _gemma(system, msgs, gen, bos, eos):
    out = [bos]
    for i, m in enumerate(msgs):
        role = "model" if m["role"] == "assistant" else "user"
        text = _first_user_with_system(system, m["content"]) if i == 0 else m["content"]
        out.append(f"<start_of_turn>{role}\n{text}<end_of_turn>\n")
    if gen:
        out.append("<start_of_turn>model\n")
    return "".join(out)


def _mistral(system, msgs, gen, bos, eos):
    out = [bos]
    for i in range(0, len(msgs), 2):
        user = _first_user_with_system(system, msgs[i]["content"]) if i == 0 else msgs[i]["content"]
        out.append(f"[INST] {user} [/INST]")
        if i + 1 < len(msgs):
            out.append(f"{msgs[i + 1]['content']}{eos}")
    return "".join(out)


def _phi3(system, msgs, gen, bos, eos):
    """Phi-3/3.5/4-mini: every message (the system one too) as <|role|>\n text <|end|>\n; no BOS text, as in
    Phi-3.5's own template and llama.cpp's built-in (the session adds a BOS if the vocabulary wants one)."""
    turns = ([{"role": "system", "content": system}] if system else []) + list(msgs)
    out = [f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in turns]
    if gen:
        out.append("<|assistant|>\n")
    return "".join(out)


def _plain(system, msgs, gen, bos, eos):
    out = [f"{system}\n\n"] if system else []
    for m in msgs:
        if m["role"] == "user":
            out.append(f"User: {m['content']}\n")
        else:
            out.append(f"Assistant: {m['content'].strip()}\n")
    if gen:
        out.append("Assistant:")
    return "".join(out)


BUILTIN: dict[str, BuiltinTemplate] = {
    "llama-2": BuiltinTemplate("llama-2", _llama2, ("</s>",)),
    "llama-3": BuiltinTemplate("llama-3", _llama3, ("<|eot_id|>",)),
    "chatml": BuiltinTemplate("chatml", _chatml, ("<|im_end|>",)),
    "gemma": BuiltinTemplate("gemma", _gemma, ("<end_of_turn>",)),
    "mistral": BuiltinTemplate("mistral", _mistral, ("</s>",)),
    "phi-3": BuiltinTemplate("phi-3", _phi3, ("<|end|>",)),
    "plain": BuiltinTemplate("plain", _plain, ("\nUser:",)),
}


# Where a template came from, for error messages, when the caller does not say.
DEFAULT_ORIGIN = "the model's chat template (tokenizer.chat_template)"
RENDER_SECONDS = 3.0  # a render's time budget; real chat templates render in milliseconds


class JinjaTemplate(ChatTemplate):
    """A Hugging Face style Jinja chat template (the text of tokenizer.chat_template).

    The template is input from the model file, so it renders in a bounded sandbox (chat/sandbox.py): at most
    `time_limit` seconds, and bounded value and output sizes. Every way a render can fail (a Jinja error,
    a Python exception such as 1/0 or 'a' + 1, an {% include %} without a loader, deep recursion, a budget
    exceeded) becomes a TemplateError naming `origin`, the template's source ("the chat template of
    model.gguf (tokenizer.chat_template)").
    """

    def __init__(self, source: str, bos: str = "", eos: str = "", name: str = "model", *,
                 origin: str = DEFAULT_ORIGIN, time_limit: float = RENDER_SECONDS):
        try:
            from jinja2 import TemplateError as JinjaError
            from jinja2.ext import loopcontrols

            from .sandbox import BoundedEnvironment
        except ImportError as e:  # jinja2 is a declared dependency; say so if it went missing
            raise TemplateError(f"the model's chat template needs jinja2, which cannot be imported: {e}") from None
        self.name, self.source, self.bos, self.eos = name, source, bos, eos
        self.origin, self.time_limit = origin, time_limit
        env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.add_filter("tojson", _tojson)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        try:
            self._template = env.compile_bounded(source)
        except JinjaError as e:
            raise TemplateError(f"{origin} does not parse: {_one_line(e)}") from None
        except Exception as e:  # too deep for jinja2's parser (RecursionError) or Python's compiler (SyntaxError)
            raise TemplateError(f"{origin} does not parse: {_describe(e)}") from None
        self.stops = tuple(s for s in KNOWN_TURN_ENDS if s in source or s == eos)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        from .sandbox import Budget, LimitError, active

        split_system(messages)  # the same checks as the built-in formats
        try:
            with active(Budget(self.time_limit)):
                return self._template.render(messages=[dict(m) for m in messages], bos_token=self.bos,
                                             eos_token=self.eos, add_generation_prompt=add_generation_prompt)
        except _Refusal as e:  # raise_exception(): the template's own words
            raise TemplateError(f"{self.origin} refused the conversation: {_one_line(e)}") from None
        except Exception as e:  # a budget exceeded, jinja2's errors, whatever Python raised in the template
            raise TemplateError(f"{self.origin} failed{_where(e)}: {_describe(e, LimitError)}") from None


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _describe(e: BaseException, *plain: type) -> str:
    """jinja2's messages (and those of the `plain` types) as they are; other exceptions with their type (a
    bare "division by zero" or "'x'" says little)."""
    from jinja2 import TemplateError as JinjaError

    text = _one_line(e)
    if isinstance(e, (JinjaError, *plain)):
        return text or type(e).__name__
    if isinstance(e, MemoryError):
        return "out of memory"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _where(e: BaseException) -> str:
    """' at line N' of the template, from the traceback jinja2 rewrites to point into the template."""
    tb, line = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" at line {line}" if line else ""


class _Refusal(Exception):
    """raise_exception() called by a template."""


def _raise_exception(message: str):
    raise _Refusal(message)


def _tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
    """HF's tojson. indent and separators are inserted at every item and level: kept small."""
    from .sandbox import MAX_SMALL_ARG, MAX_VALUE, LimitError, check_size

    if indent is not None and not (isinstance(indent, int) and 0 <= indent <= MAX_SMALL_ARG
                                   or isinstance(indent, str) and len(indent) <= MAX_SMALL_ARG):
        raise LimitError(f"tojson's indent must be a number from 0 to {MAX_SMALL_ARG} or a short string, "
                         f"got {_short_repr(indent)}")
    if separators is not None and not (isinstance(separators, (list, tuple)) and len(separators) == 2 and all(
            isinstance(s, str) and len(s) <= MAX_SMALL_ARG for s in separators)):
        raise LimitError(f"tojson's separators must be two strings of at most {MAX_SMALL_ARG} characters")
    check_size(value, "tojson's value")
    encoder = json.JSONEncoder(indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys,
                               separators=tuple(separators) if separators is not None else None)
    if indent is None:  # no indentation: the text is a few characters per unit of the value's weight
        return encoder.encode(value)
    # indented: each item repeats its depth's indentation, so a deep value multiplies it; piece by piece
    chunks, total = [], 0
    for chunk in encoder.iterencode(value):
        total += len(chunk)
        if total > MAX_VALUE:
            raise LimitError(f"tojson's text would exceed {MAX_VALUE} characters")
        chunks.append(chunk)
    return "".join(chunks)


def _short_repr(value, limit: int = 40) -> str:
    text = repr(value) if isinstance(value, (int, float, str)) else type(value).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def default_builtin(arch: str, vocab_has: Callable[[str], bool]) -> str:
    """The built-in format for a model without its own template, from the format its architecture suggests
    (ArchSpec.chat_format) and its vocabulary."""
    spec = find_spec(arch)
    hint = spec.chat_format if spec is not None else ""
    if hint == "gemma":
        return "gemma"
    if (hint == "phi-3" or (vocab_has("<|assistant|>") and vocab_has("<|end|>"))) and not vocab_has("<|im_start|>"):
        return "phi-3"  # Phi-4 (14B) is arch phi3 too, with a ChatML-like vocabulary
    if hint == "chatml" or vocab_has("<|im_start|>"):
        return "chatml"
    if vocab_has("<|eot_id|>"):
        return "llama-3"
    if hint == "mistral" and vocab_has("[INST]"):
        return "mistral"
    return "plain"


_TUNED_WORDS = {"it", "instruct", "chat", "sft", "dpo", "rlhf", "assistant"}


def looks_instruction_tuned(metadata: Mapping[str, object]) -> bool:
    """Whether the file's general.finetune/name/basename mark an instruction-tuned model (Gemma "-it",
    "Instruct", "chat", ...). Used only for files without a chat template."""
    words = set()
    for key in ("general.finetune", "general.name", "general.basename"):
        value = metadata.get(key)
        if isinstance(value, str):
            words |= set(re.split(r"[^a-z0-9]+", value.lower()))
    return bool(words & _TUNED_WORDS)


def choose_template(name: str | None, embedded: str | None, arch: str, bos: str, eos: str,
                    vocab_has: Callable[[str], bool], base_model: bool = False,
                    origin: str = DEFAULT_ORIGIN) -> ChatTemplate:
    """--template NAME (a built-in name, or "model" for the file's own), else the file's template, else
    "plain" for a base model (base_model: no instruction tuning, so no chat format to follow), else the
    built-in chosen by architecture (default_builtin). `origin` names the embedded template in errors."""
    if name is not None and name not in BUILTIN and name != "model":
        raise TemplateError(f"unknown chat template {name!r}; built-in: {', '.join(BUILTIN)}, or 'model' "
                            "for the one in the model file")
    if name == "model" or (name is None and embedded):
        if not embedded:
            raise TemplateError("this model file has no chat template (tokenizer.chat_template); choose a "
                                f"built-in one with --template ({', '.join(BUILTIN)})")
        return JinjaTemplate(embedded, bos, eos, origin=origin)
    if name is None:
        name = "plain" if base_model else default_builtin(arch, vocab_has)
    return BUILTIN[name].with_tokens(bos, eos)
