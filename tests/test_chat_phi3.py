"""The built-in "phi-3" chat format: its exact text, agreement with Phi-3.5-mini-instruct's own Jinja template,
the choice by architecture / vocabulary, and a converted tiny Phi-3 checkpoint without a template getting it."""
from __future__ import annotations

import json

import numpy as np
from hf_fixtures import phi3_config, phi3_weights, write_checkpoint

from powerinfer_py import load
from powerinfer_py.chat import BUILTIN, JinjaTemplate, template_for
from powerinfer_py.chat.templates import choose_template, default_builtin
from powerinfer_py.convert import convert

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Name a colour."},
]
EXPECTED = ("<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
            "<|user|>\nName a colour.<|end|>\n<|assistant|>\n")
# Phi-3.5-mini-instruct's tokenizer_config.json chat_template (the format the built-in writes out)
PHI35_JINJA = ("{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
               "{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}"
               "{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}"
               "{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")
PHI3_SPECIALS = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"]


def test_phi3_renders_the_exact_format():
    t = BUILTIN["phi-3"].with_tokens("<s>", "<|endoftext|>")
    assert t.render(CONV) == EXPECTED
    assert t.stops == ("<|end|>",)
    assert t.render(CONV[1:2]) == "<|user|>\nHi<|end|>\n<|assistant|>\n"  # no system: no system block
    assert t.render([{"role": "system", "content": ""}] + CONV[1:2]) == "<|user|>\nHi<|end|>\n<|assistant|>\n"
    assert t.render(CONV[:3], add_generation_prompt=False) == EXPECTED[:EXPECTED.index("<|user|>\nName")]


def test_phi3_equals_the_models_own_template():
    own = JinjaTemplate(PHI35_JINJA, bos="<s>", eos="<|endoftext|>")
    mine = BUILTIN["phi-3"].with_tokens("<s>", "<|endoftext|>")
    for n in (2, 4):
        assert mine.render(CONV[:n]) == own.render(CONV[:n])
    assert "<|end|>" in own.stops


def test_default_builtin_picks_phi3():
    none = lambda s: False
    phi_vocab = {"<|assistant|>", "<|end|>", "<|user|>"}.__contains__
    assert default_builtin("phi3", none) == "phi-3"
    assert default_builtin("llama", phi_vocab) == "phi-3"
    assert default_builtin("llama", {"<|end|>"}.__contains__) == "plain"  # one marker alone is not enough
    assert default_builtin("phi3", {"<|im_start|>", "<|im_end|>"}.__contains__) == "chatml"  # Phi-4 (14B)
    assert choose_template(None, None, "phi3", "", "", none).name == "phi-3"
    assert choose_template(None, PHI35_JINJA, "phi3", "", "", none).name == "model"  # the file's own wins


def test_converted_phi3_without_a_template_chats_in_phi3_format(tmp_path):
    """An instruct-named tiny Phi-3 checkpoint with Phi-3's special tokens but no chat_template, converted and
    loaded: the session's template is phi-3 and its markers are single tokens."""
    dims = {"n_layer": 1, "n_embd": 64, "n_ff": 128, "n_head": 4, "n_head_kv": 2, "n_vocab": 512}
    folder = tmp_path / "hf"
    cfg = phi3_config(**dims, _name_or_path="tiny-phi-instruct")
    write_checkpoint(folder, cfg, phi3_weights(np.random.default_rng(0), **dims), n_vocab_tokenizer=500)
    added = {str(500 + i): {"content": s, "special": True} for i, s in enumerate(PHI3_SPECIALS)}
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": False, "bos_token": "<s>", "eos_token": "<|endoftext|>", "added_tokens_decoder": added}))
    out = convert(folder, tmp_path / "model.gguf", outtype="f32")
    with load(str(out)) as llm:
        t = template_for(llm)
        assert t.name == "phi-3" and t.stops == ("<|end|>",)
        ids = list(llm.tokenizer.encode(t.render(CONV), add_bos=False, special=True))
        for marker, tid in (("<|system|>", 503), ("<|end|>", 502), ("<|assistant|>", 501), ("<|user|>", 504)):
            assert ids.count(tid) == EXPECTED.count(marker)
