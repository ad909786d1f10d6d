"""Hostile chat templates: every render failure is one TemplateError naming the template, and a render's time
and memory are bounded (chat/sandbox.py). Checked directly, under an address-space limit in a child process,
through `powerinfer chat` (one `error:` line, exit 1) and through the server (a 400 JSON error, and the next
request is answered)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request

import pytest

from powerinfer_py import load
from powerinfer_py.chat import JinjaTemplate, TemplateError, template_for
from powerinfer_py.chat.sandbox import MAX_WRITTEN
from powerinfer_py.serve import make_server, serve_forever

MESSAGES = [{"role": "user", "content": "hi"}]
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
DOUBLE = "{{% set ns = namespace(x=[0]) %}}{{% for i in range(40) %}}{{% set ns.x = {} %}}{{% endfor %}}"

# name -> (template, what the error says). Each used to raise something other than a TemplateError or to run
# without bound (memory, time, or both).
CASES = {
    "division-by-zero": ("{{ 1/0 }}", "ZeroDivisionError: division by zero"),
    "str-plus-int": ("{{ 'a' + 1 }}", 'TypeError: can only concatenate str (not "int") to str'),
    "include": ("{% include 'other.jinja' %}", "no loader for this environment"),
    "import": ("{% import 'macros.jinja' as m %}{{ m.x() }}", "no loader for this environment"),
    "extends": ("{% extends 'base.jinja' %}", "no loader for this environment"),
    "self-calling-macro": ("{% macro again() %}{{ again() }}{% endmacro %}{{ again() }}", "RecursionError"),
    "range-too-big": ("{{ range(10**9)|list }}", "OverflowError: Range too big"),
    "unsafe-attribute": ("{{ ''.__class__.__mro__ }}", "is unsafe"),
    "undefined-call": ("{{ nothing_here() }}", "'nothing_here' is undefined"),
    "int-too-long-for-str": ("{{ 7 ** 6000 }}", "ValueError: Exceeds the limit"),
    "string-repeat": ("{{ 'x' * 10**10 }}", "str * 10000000000 would hold 10000000000 characters"),
    "list-repeat": ("{{ ([0] * 10**10)|length }}", "list * 10000000000 would hold"),
    "tojson-float-indent": ("{{ messages|tojson(indent=5e7) }}", "tojson's indent must be a number from 0 to 64"),
    "tojson-int-indent": ("{{ messages|tojson(indent=50000000) }}", "50000000"),
    "tojson-separators": ("{{ messages|tojson(separators=(',' * 10**6, ':')) }}", "tojson's separators"),
    "doubling-concat": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s }}", "a '~' concatenation would hold"),
    "doubling-plus": ("{% set ns = namespace(s=[0]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                      "{% endfor %}{{ ns.s|length }}", "the result of '+' would hold"),
    "center-method": ("{{ 'x'.center(10**10) }}", "the width of center() is 10000000000"),
    "center-filter": ("{{ 'x'|center(10**10) }}", "the center filter's width is 10000000000"),
    "indent-filter": ("{{ ('\\n' * 1000)|indent(4000000) }}", "an indented string would hold"),
    "format-width": ("{{ '{:>10000000000}'.format(1) }}", "a format's widths would hold"),
    "format-repeated-field": ("{{ ('{0}' * 1000).format('x' * 100000) }}", "a formatted string would hold"),
    "percent-width": ("{{ '%10000000000s' % 'x' }}", "a '%' format's widths would hold"),
    "percent-star": ("{{ '%*s' % (10**10, 'x') }}", "'*' width"),
    "format-filter": ("{{ '%10000000000s'|format('x') }}", "a '%' format's widths would hold"),
    "power": ("{{ 10 ** (10 ** 10) }}", "bits"),
    "join-filter": ("{{ ('x' * 1000000)|list|join('y' * 100) }}", "a joined string would hold"),
    "replace-method": ("{{ ('x' * 1000000).replace('', 'y' * 10) }}", "a replaced string would hold"),
    "expandtabs": ("{{ ('\t' * 1000).expandtabs(100000) }}", "expandtabs() would hold"),
    "lipsum": ("{{ lipsum(10**6) }}", "lipsum() takes at most"),
    "sum-of-lists": ("{{ ([[0] * 1000] * 1000)|sum(start=[]) }}", "the sum filter adds numbers only"),
    # lists that share their children: 41 objects, 2**41 items for str(), tojson, == or hash() to walk
    "shared-list-printed": (DOUBLE.format("[ns.x, ns.x]") + "{{ ns.x }}", "a list would hold"),
    "shared-list-compared": (DOUBLE.format("[ns.x, ns.x]") + "{{ ns.x == ns.x|list }}", "a list would hold"),
    "shared-list-tojson": (DOUBLE.format("[ns.x, ns.x]") + "{{ ns.x|tojson }}", "a list would hold"),
    "shared-list-repeat": (DOUBLE.format("[ns.x] * 2") + "{{ ns.x }}", "would hold"),
    "shared-dict": (DOUBLE.format("{'a': ns.x, 'b': ns.x}") + "{{ ns.x }}", "a dict would hold"),
    "shared-tuple-hashed": (DOUBLE.format("(ns.x, ns.x)") + "{{ {ns.x: 1} }}", "a tuple would hold"),
    "shared-via-filter": (DOUBLE.format("[ns.x, ns.x]|list") + "{{ ns.x }}", "a list would hold"),
    "shared-via-groupby": (DOUBLE.format("[ns.x, ns.x]|groupby(0)|list") + "{{ ns.x }}", "would hold"),
    "tojson-deep-indent": ("{% set ns = namespace(x=[]) %}{% for i in range(200) %}{% set ns.x = [ns.x, [0] * 1000] %}"
                           "{% endfor %}{{ ns.x|tojson(indent=64) }}", "tojson's text would exceed"),
    "pprint-large": ("{{ range(100000)|list|pprint }}", "the pprint filter lays out"),
    "output-flood": ("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
                     f"the output exceeds {MAX_WRITTEN} characters"),
    "nested-loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "rendering took longer than"),
    "nested-loops-output": (LOOPS, "took longer than|the output exceeds"),
    "nested-loops-in-macro": ("{% macro m() %}" + LOOPS + "{% endmacro %}{{ m() }}",
                              "took longer than|the output exceeds"),
    "exponential-macro": ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
                          "rendering took longer than"),
}
SLOW = {"nested-loops", "nested-loops-output", "nested-loops-in-macro", "exponential-macro"}  # stopped by the clock


def _time_limit(case: str) -> float:
    """1 s for the cases the clock stops; plenty for the others, so that their own check is what stops them
    even on a loaded machine."""
    return 1.0 if case in SLOW else 60.0


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_template_is_one_clear_error(case):
    source, says = CASES[case]
    t = JinjaTemplate(source, origin="the chat template of x.gguf (tokenizer.chat_template)",
                      time_limit=_time_limit(case))
    t0 = time.monotonic()
    with pytest.raises(TemplateError) as err:
        t.render(MESSAGES)
    elapsed = time.monotonic() - t0
    message = str(err.value)
    assert message.startswith("the chat template of x.gguf (tokenizer.chat_template) failed at line 1: "), message
    assert any(s in message for s in says.split("|")), message
    assert "\n" not in message and len(message) < 500
    assert elapsed < 10.0, elapsed  # refused within seconds (the clock's cases: the 1 s budget, then out)


def test_a_chain_of_namespaces_prints_in_bounded_size():
    """A namespace holding [previous, previous], 40 times: printing it shows no attributes (it would double with
    every link); the lists in it are weighed like any other."""
    chain = ("{% set o = namespace(p=none) %}{% for i in range(40) %}{% set o.p = namespace(x=[o.p, o.p]) %}"
             "{% endfor %}")
    t0 = time.monotonic()
    assert JinjaTemplate(chain + "{{ o.p }}|{{ o.p.x }}").render(MESSAGES) == "<Namespace>|[<Namespace>, <Namespace>]"
    assert time.monotonic() - t0 < 3


def test_the_default_time_budget_stops_a_render_within_seconds():
    t = JinjaTemplate(CASES["nested-loops"][0])
    t0 = time.monotonic()
    with pytest.raises(TemplateError, match=r"the model's chat template \(tokenizer.chat_template\) failed at "
                                            r"line 1: rendering took longer than 3 s"):
        t.render(MESSAGES)
    assert time.monotonic() - t0 < 10


def test_raise_exception_and_syntax_errors_name_the_template():
    t = JinjaTemplate("{{ raise_exception('only user messages') }}", origin="the chat template file t.jinja")
    with pytest.raises(TemplateError, match="^the chat template file t.jinja refused the conversation: only user"):
        t.render(MESSAGES)
    with pytest.raises(TemplateError, match="^the chat template file t.jinja does not parse: "):
        JinjaTemplate("{% for %}", origin="the chat template file t.jinja")
    with pytest.raises(TemplateError, match="does not parse: .*RecursionError"):  # nested 10000 deep
        JinjaTemplate("{{ " + "(" * 10000 + "1" + ")" * 10000 + " }}")
    with pytest.raises(TemplateError, match="does not parse: SyntaxError: too many statically nested blocks"):
        JinjaTemplate("{% for a in [1] %}" * 30 + "x" + "{% endfor %}" * 30)  # Python's own compiler limit


_CHILD = r"""
import json, resource, sys, time
from powerinfer_py.chat import JinjaTemplate, TemplateError
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
out = {}
for name, (source, seconds) in json.loads(sys.argv[1]).items():
    t0 = time.monotonic()
    try:
        JinjaTemplate(source, time_limit=seconds).render([{"role": "user", "content": "hi"}])
        out[name] = ["rendered", time.monotonic() - t0]
    except TemplateError as e:
        out[name] = [str(e), time.monotonic() - t0]
print(json.dumps(out))
"""


def test_memory_stays_bounded_under_an_address_space_limit():
    """Each case in a child process limited to 1 GiB of address space (the unbounded ones asked for 10 GB and
    more): refused by its own size check, not by running out of memory."""
    sources = {name: (src, _time_limit(name)) for name, (src, _) in CASES.items()}
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(sources), str(1 << 30)], capture_output=True,
                          text=True,
                          timeout=300, env=dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    for name, (message, seconds) in results.items():
        assert any(s in message for s in CASES[name][1].split("|")), (name, message)
        assert "out of memory" not in message and seconds < 10.0, (name, message, seconds)


# -- through the CLI and the server, from a model file's tokenizer.chat_template --------------------------------

_DISPATCH = ["division-by-zero", "str-plus-int", "include", "self-calling-macro", "range-too-big", "string-repeat",
             "tojson-float-indent", "doubling-concat", "nested-loops", "exponential-macro"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _dispatching_template() -> str:
    """One template that turns hostile when the last message names a case, and is ChatML otherwise."""
    macros = ("{% macro again() %}{{ again() }}{% endmacro %}"
              "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}")
    branches = []
    for name in _DISPATCH:
        body = CASES[name][0]
        body = body.replace("{% macro again() %}{{ again() }}{% endmacro %}", "")
        body = body.replace("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}", "")
        branches.append(f"{{% {'if' if not branches else 'elif'} messages[-1]['content'] == '{name}' %}}{body}")
    return macros + "".join(branches) + "{% endif %}" + CHATML


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory):
    from powerinfer_py.synth import write_synthetic_model

    return write_synthetic_model(tmp_path_factory.mktemp("hostile") / "hostile.gguf", "llama",
                                 chat_template=_dispatching_template())


def test_template_for_names_the_file_and_key(hostile_model):
    llm = load(hostile_model, threads=1, n_ctx=64)
    try:
        t = template_for(llm)
        assert t.render([{"role": "user", "content": "hello"}]).startswith("<|im_start|>user\nhello<|im_end|>")
        with pytest.raises(TemplateError, match=rf"^the chat template of {hostile_model.name} "
                                                r"\(tokenizer.chat_template\) failed at line \d+: ZeroDivisionError"):
            t.render([{"role": "user", "content": "division-by-zero"}])
    finally:
        llm.close()


@pytest.mark.parametrize("case", ["division-by-zero", "string-repeat", "nested-loops"])
def test_chat_prints_one_error_line_and_exits_1(case, hostile_model, tmp_path):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "powerinfer_cli", "chat", "-m", str(hostile_model), "-n", "2"],
                          input=case + "\n", capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, POWERINFER_CACHE=str(tmp_path)))
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: the chat template of {hostile_model.name} "
                                                   "(tokenizer.chat_template) failed at line "), proc.stderr
    assert any(s in lines[0] for s in CASES[case][1].split("|")), lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert time.monotonic() - t0 < 120


def _post(url: str, content: str):
    body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 2, "temperature": 0})
    req = urllib.request.Request(url + "/v1/chat/completions", data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        assert e.headers.get("Content-Type") == "application/json"
        return e.code, json.loads(e.read())


def test_server_answers_400_and_then_the_next_request(hostile_model):
    llm = load(hostile_model, threads=1, n_ctx=64)
    srv = make_server(llm, "127.0.0.1", 0, log=lambda line: None)
    thread = threading.Thread(target=serve_forever, args=(srv,), daemon=True)
    thread.start()
    try:
        for case in _DISPATCH:
            t0 = time.monotonic()
            status, body = _post(srv.url, case)
            assert status == 400, (case, body)
            message = body["error"]["message"]
            assert message.startswith(f"the chat template of {hostile_model.name} (tokenizer.chat_template) "
                                      "failed at line "), (case, message)
            assert any(s in message for s in CASES[case][1].split("|")), (case, message)
            assert time.monotonic() - t0 < 30, case
            status, body = _post(srv.url, "hello")  # the lock was released and the server carries on
            assert status == 200 and body["choices"][0]["message"]["role"] == "assistant", (case, body)
    finally:
        srv.shutdown()
        thread.join(timeout=10)
        llm.close()


# -- real templates render as before ---------------------------------------------------------------------------

REAL_LIKE = textwrap.dedent("""\
    {%- set ns = namespace(system='', n=0) -%}
    {%- macro say(role, text) -%}<|{{ role }}|>{{ text | trim }}{{ '<|end|>' }}{%- endmacro -%}
    {{ bos_token }}
    {%- for m in messages -%}
      {%- if m.role == 'system' -%}{%- set ns.system = m.content -%}{%- continue -%}{%- endif -%}
      {%- set ns.n = ns.n + 1 -%}
      {{ say(m.role, (ns.system ~ '\\n' if loop.first and ns.system else '') ~ m.content) }}
      {{- loop.cycle('', '') -}}{{ '%s:%d' % (m.role, loop.index) if m.role == 'user' else '' }}
    {%- endfor -%}
    {{ messages | map(attribute='role') | join(',') }}{{ {'n': ns.n, 'roles': messages|length} | tojson }}
    {{- '{0}/{1}'.format(ns.n, messages|length) }}{{ 'x'|center(9) }}{{ [1, 2, 3]|sum }}{{ 'ab' * 3 }}
    {%- if add_generation_prompt %}<|assistant|>{% endif %}""")


# in the manner of tool-calling templates: tojson with an indent, tests, selectattr, loop.last, raise_exception
TOOLISH = textwrap.dedent("""\
    {%- if messages[0]['role'] == 'system' -%}{%- set sys = messages[0]['content'] -%}{%- set rest = messages[1:] -%}
    {%- else -%}{%- set sys = 'You are helpful.' -%}{%- set rest = messages -%}{%- endif -%}
    {{- '<start_of_turn>system\\n' + sys + '\\n' + {'tools': [], 'max': 3} | tojson(indent=4) + '<end_of_turn>\\n' -}}
    {%- for m in rest -%}
      {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{- raise_exception('turns must alternate') -}}
      {%- endif -%}
      {%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}
      {{- '<start_of_turn>' ~ role ~ '\\n' ~ (m['content'] | trim) ~ '<end_of_turn>\\n' -}}
      {%- if loop.last and m.name is defined %}{{ m.name }}{% endif -%}
    {%- endfor -%}
    {{- rest | selectattr('role', 'equalto', 'user') | list | length -}}
    {%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}""")


def test_templates_render_exactly_as_plain_jinja_does():
    """The instrumented sandbox changes no output: templates using macros, namespaces, loop controls, `~`, `%`,
    str.format, filters, tests and tojson, and the test suite's ChatML and Phi-3.5 templates, against jinja2's
    sandbox as it is."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from test_chat import CHATML_JINJA
    from test_chat_phi3 import PHI35_JINJA

    from powerinfer_py.chat.templates import _tojson

    def plain(source, messages, gen):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = lambda m: 1 / 0
        return env.from_string(source).render(messages=messages, bos_token="<s>", eos_token="</s>",
                                              add_generation_prompt=gen)

    conversations = [[{"role": "user", "content": "Hello 🤗"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " a\nb "},
                      {"role": "assistant", "content": "ok"}, {"role": "user", "content": "%s {0} ~"}]]
    for source in (REAL_LIKE, TOOLISH, CHATML_JINJA, PHI35_JINJA):
        for conv in conversations:
            for gen in (True, False):
                got = JinjaTemplate(source, bos="<s>", eos="</s>").render(conv, add_generation_prompt=gen)
                assert got and got == plain(source, conv, gen)
