"""Chat: templates against expected strings, stop-text matching, KV-cache reuse between turns, context
trimming, save/load, and the `powerinfer chat` command in a pipe."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from powerinfer_py import load
from powerinfer_py.chat import BUILTIN, ChatSession, JinjaTemplate, StopMatcher, TemplateError, template_for
from powerinfer_py.chat.templates import choose_template, looks_instruction_tuned
from powerinfer_py.errors import ContextFullError, PowerInferError
from powerinfer_py.sampler import SamplingParams

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Name a colour."},
]

EXPECTED = {
    "llama-2": "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Name a colour. [/INST]",
    "llama-3": ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nName a colour.<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "chatml": ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
               "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n"
               "<|im_start|>assistant\n"),
    "gemma": ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
              "<start_of_turn>user\nName a colour.<end_of_turn>\n<start_of_turn>model\n"),
    "mistral": "<s>[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] Name a colour. [/INST]",
    "plain": "Be brief.\n\nUser: Hi\nAssistant: Hello!\nUser: Name a colour.\nAssistant:",
}
BOS = {"llama-2": "<s>", "llama-3": "<|begin_of_text|>", "chatml": "", "gemma": "<bos>", "mistral": "<s>",
       "plain": "<s>"}
EOS = {"llama-2": "</s>", "llama-3": "<|end_of_text|>", "chatml": "<|endoftext|>", "gemma": "<eos>",
       "mistral": "</s>", "plain": "</s>"}

CHATML_JINJA = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                "{% endif %}")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_templates_render_the_known_format(name):
    t = BUILTIN[name].with_tokens(BOS[name], EOS[name])
    assert t.render(CONV) == EXPECTED[name]
    assert t.stops  # every format has a way to end a turn


def test_templates_check_the_conversation():
    t = BUILTIN["chatml"]
    with pytest.raises(TemplateError, match="expected a user message"):
        t.render([{"role": "assistant", "content": "x"}])
    with pytest.raises(TemplateError, match="unknown role"):
        t.render([{"role": "tool", "content": "x"}])
    with pytest.raises(TemplateError, match="only come first"):
        t.render([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}])


def test_jinja_chatml_renders_like_hugging_face():
    t = JinjaTemplate(CHATML_JINJA, bos="<s>", eos="</s>")
    assert t.render(CONV) == EXPECTED["chatml"]
    assert t.render(CONV[:2], add_generation_prompt=False) == "<|im_start|>system\nBe brief.<|im_end|>\n" \
                                                              "<|im_start|>user\nHi<|im_end|>\n"
    assert "<|im_end|>" in t.stops


def test_jinja_helpers_and_errors():
    t = JinjaTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('users first') }}{% endif %}"
                      "{{ bos_token }}{{ messages | length }}{{ messages[0] | tojson }}")
    assert t.render([{"role": "user", "content": "é"}]) == '1{"role": "user", "content": "é"}'
    with pytest.raises(TemplateError, match="users first"):
        t.render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    with pytest.raises(TemplateError, match="does not parse"):
        JinjaTemplate("{% for %}")


def test_template_choice():
    has = {"<|im_start|>", "<|eot_id|>", "[INST]"}.__contains__
    assert choose_template(None, CHATML_JINJA, "llama", "", "", has).name == "model"
    assert choose_template("gemma", CHATML_JINJA, "llama", "", "", has).name == "gemma"
    assert choose_template(None, None, "gemma3", "", "", has).name == "gemma"
    assert choose_template(None, None, "qwen2", "", "", lambda s: False).name == "chatml"
    assert choose_template(None, None, "qwen3", "", "", lambda s: False).name == "chatml"
    assert choose_template(None, None, "llama", "", "", {"<|eot_id|>"}.__contains__).name == "llama-3"
    assert choose_template(None, None, "llama", "", "", lambda s: False).name == "plain"
    assert choose_template(None, None, "gemma3", "", "", has, base_model=True).name == "plain"
    with pytest.raises(TemplateError, match="unknown chat template 'nope'"):
        choose_template("nope", None, "llama", "", "", has)
    with pytest.raises(TemplateError, match="has no chat template"):
        choose_template("model", None, "llama", "", "", has)
    assert looks_instruction_tuned({"general.name": "Gemma 3 270m It"})
    assert looks_instruction_tuned({"general.finetune": "Instruct"})
    assert not looks_instruction_tuned({"general.name": "Gemma 3 270m", "general.basename": "gemma-3"})


def test_stop_matcher_holds_back_partial_stops():
    m = StopMatcher(["\nUser:"])
    assert m.feed("Hello") == "Hello"
    assert m.feed("\nUs") == ""  # could be the stop: held back
    assert m.feed("ually") == "\nUsually"
    assert m.feed(" fine.\nUser: next") == " fine."
    assert m.stopped and m.feed("more") == ""
    m2 = StopMatcher(["<end>"])
    assert m2.feed("a<e") == "a" and m2.flush() == "<e"
    # finish(): the stream's last piece, then what was held back; nothing once a stop has appeared
    m3 = StopMatcher(["<end>"])
    assert m3.feed("b<en") == "b" and m3.finish("x") == "<enx"
    m4 = StopMatcher(["<end>"])
    assert m4.feed("c<en") == "c" and m4.finish("d> tail") == "" and m4.stopped
    assert StopMatcher([]).finish("all") == "all"


# ---- sessions on tiny synthetic models ----------------------------------------------------------------------

def _session(path, n_ctx=256, max_tokens=6, template="plain", system="Be kind.", threads=1):
    llm = load(path, threads=threads, n_ctx=n_ctx)
    t = template_for(llm, template)
    return ChatSession(llm, t, system, max_tokens=max_tokens, sampling=SamplingParams(temperature=0))


@pytest.mark.parametrize("arch,template", [("llama", "plain"), ("gemma3", "gemma"), ("qwen2", "chatml")])
def test_turn_two_prefills_only_new_tokens_and_matches_a_fresh_run(synthetic_model, arch, template):
    s = _session(synthetic_model(arch), template=template)
    try:
        r1 = s.send("hello world")
        list(r1)
        held, text_before = list(s.tokens), s._text
        assert len(held) == s.cache.n_past == r1.stats.n_prompt + r1.stats.n_gen
        seen = []
        forward = s.llm.model.forward

        def recording(tokens, cache, all_logits=False):
            out = forward(tokens, cache, all_logits)
            seen.append(out.copy())
            return out

        s.llm.model.forward = recording
        r2 = s.send("the cat")
        list(r2)
        prompt_logits = seen[0]  # the prefill of the new tokens (one batch): the prompt's last logits
        st = r2.stats
        new_text = s.template.render(s.conversation()[:-1])[len(text_before):]
        new_ids = s.llm.tokenize(new_text, add_bos=False)
        assert st.n_reused == len(held)
        assert st.n_prefilled == st.n_prompt - st.n_reused == len(new_ids)
        full_ids = s.tokens[:st.n_prompt]
        assert full_ids[:len(held)] == held
        fresh = forward(full_ids, s.llm.model.new_cache(256))
        np.testing.assert_allclose(prompt_logits, fresh, rtol=1e-4, atol=1e-4)
        assert int(np.argmax(prompt_logits)) == int(np.argmax(fresh))
    finally:
        s.llm.close()


def test_interrupted_reply_is_kept_and_the_next_turn_reuses_the_cache(synthetic_model):
    s = _session(synthetic_model("llama"), max_tokens=20)
    try:
        r = s.send("hello world")
        next(r)
        next(r)
        r.close()
        assert r.stats.stop_reason == "interrupted"
        assert s.messages[-1] == {"role": "assistant", "content": r.text}
        assert len(s.tokens) == s.cache.n_past
        r2 = s.send("the cat")
        list(r2)
        assert r2.stats.n_reused > 0
        assert len(s.messages) == 4
    finally:
        s.llm.close()


def test_a_full_context_drops_the_oldest_turns_but_keeps_the_system_prompt(synthetic_model):
    s = _session(synthetic_model("llama"), n_ctx=64, max_tokens=8, system="Be kind.")
    try:
        dropped = 0
        for i in range(8):
            r = s.send(f"tell me about the {['cat', 'dog', 'sun', 'tree'][i % 4]} and the house")
            list(r)
            dropped += r.stats.dropped_turns
            assert r.stats.n_prompt + s.reserve <= s.n_ctx
            assert s.cache.n_past <= s.n_ctx
        assert dropped > 0
        assert s.conversation()[0] == {"role": "system", "content": "Be kind."}
        assert s.messages[0]["role"] == "user"
        with pytest.raises(ContextFullError, match="does not fit"):
            s.send("the cat " * 80)
        assert s.messages[-1]["role"] == "assistant"  # the refused message is not kept
    finally:
        s.llm.close()


def test_save_and_load_restore_the_conversation(synthetic_model, tmp_path):
    s = _session(synthetic_model("llama"))
    try:
        list(s.send("hello world"))
        saved = [dict(m) for m in s.messages]
        path = s.save(tmp_path / "sub" / "conv.json")
        assert json.loads(path.read_text())["messages"] == saved
        assert [p.name for p in path.parent.iterdir()] == ["conv.json"]  # no temporary file left
        s.reset()
        s.set_system("Other.")
        assert s.messages == []
        assert s.load(path) == 2
        assert s.messages == saved and s.system == "Be kind."
        r = s.send("the cat")
        list(r)
        assert r.stats.n_reused > 0  # the loaded conversation was still in the cache
        bad = tmp_path / "bad.json"
        for text, match in [("{", "not JSON"), ('{"format": "x"}', "not a saved conversation"),
                            ('{"format": "powerinfer-chat", "messages": [{"role": "assistant", "content": "a"}]}',
                             "expected a user message"),
                            ('{"format": "powerinfer-chat", "messages": 3}', "must be a list")]:
            bad.write_text(text)
            with pytest.raises(PowerInferError, match=match):
                s.load(bad)
        with pytest.raises(PowerInferError, match="cannot read"):
            s.load(tmp_path / "missing.json")
        assert s.messages[-1]["role"] == "assistant"  # failed loads change nothing
    finally:
        s.llm.close()


def test_embedded_jinja_template_is_used(synthetic_model):
    path = synthetic_model("llama", chat_template=CHATML_JINJA)
    with load(path, threads=1) as llm:
        t = template_for(llm)
        assert isinstance(t, JinjaTemplate)
        assert t.render(CONV) == EXPECTED["chatml"]
        assert template_for(llm, "plain").name == "plain"


def test_pipe_mode_prints_one_reply_per_line(synthetic_model, tmp_path):
    path = synthetic_model("llama")
    s = _session(path, max_tokens=6, system=None)
    try:
        want = []
        for msg in ("hello world", "the cat"):
            r = s.send(msg)
            list(r)
            want.append(r.text)
        n_prompt = len(s.llm.tokenize(s.template.render([{"role": "user", "content": "hello world"}])))
    finally:
        s.llm.close()
    env = dict(os.environ, POWERINFER_CACHE=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "powerinfer_cli", "chat", "-m", str(path), "--template", "plain",
                           "--temp", "0", "-n", "6", "-t", "1"], input="hello world\n\nthe cat\n",
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "".join(w + "\n" for w in want)
    assert "\x1b" not in proc.stdout and ">>>" not in proc.stdout
    single = subprocess.run([sys.executable, "-m", "powerinfer_cli", "chat", "-m", str(path), "--template",
                             "plain", "--temp", "0", "-n", "6", "-t", "1", "--single"],
                            input="hello world\n", capture_output=True, text=True, env=env, timeout=120)
    assert single.returncode == 0 and single.stdout == want[0] + "\n"
    # a reply cut by a full context says so on stderr (interactive mode says it too)
    cut = subprocess.run([sys.executable, "-m", "powerinfer_cli", "chat", "-m", str(path), "--template", "plain",
                          "--temp", "0", "-n", "6", "-t", "1", "-c", str(n_prompt + 2)],
                         input="hello world\n", capture_output=True, text=True, env=env, timeout=120)
    assert cut.returncode == 0, cut.stderr
    assert cut.stdout == want[0][:len(cut.stdout) - 1] + "\n" and len(cut.stdout) < len(want[0]) + 1
    assert f"context full ({n_prompt + 2} tokens): the reply was cut" in cut.stderr
