"""Chat: templates that turn a conversation into a prompt (templates.py) and a session that runs turns over one
KV cache, prefilling only what is new (session.py). The terminal front end is cli/chat.py."""
from ..generate import StopMatcher
from .session import ChatSession, Reply, TurnStats
from .templates import (BUILTIN, ChatTemplate, JinjaTemplate, TemplateError, choose_template,
                        looks_instruction_tuned)


def template_for(llm, name: str | None = None) -> ChatTemplate:
    """The chat template of a loaded model: --template NAME, else the file's own, else "plain" for what looks
    like a base model (no template and no instruction-tuning mark in its name), else one by architecture."""
    tok = llm.tokenizer
    bos = tok.piece(tok.bos_id, special=True).decode("utf-8", "replace") if tok.bos_id >= 0 else ""
    eos = tok.piece(tok.eos_id, special=True).decode("utf-8", "replace") if tok.eos_id >= 0 else ""

    def vocab_has(text: str) -> bool:
        return len(tok.encode(text, add_bos=False, special=True)) == 1

    metadata = llm.file.metadata
    embedded = metadata.get("tokenizer.chat_template")
    embedded = embedded if isinstance(embedded, str) and embedded.strip() else None
    base = embedded is None and not looks_instruction_tuned(metadata)
    return choose_template(name, embedded, llm.config.arch, bos, eos, vocab_has, base_model=base,
                           origin=f"the chat template of {llm.path.name} (tokenizer.chat_template)")


__all__ = ["BUILTIN", "ChatSession", "ChatTemplate", "JinjaTemplate", "Reply", "StopMatcher", "TemplateError",
           "TurnStats", "choose_template", "template_for"]
