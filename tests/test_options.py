"""options.py is the one definition of the load and sampling knobs: the Python API's keywords, the CLI's flags
and the server's request fields must all agree with it."""
from __future__ import annotations

import inspect
from dataclasses import MISSING, fields

import pytest
import typer

from powerinfer_cli import options as O
from powerinfer_cli.main import app
from powerinfer_py.llm import LLM, load
from powerinfer_py.options import LoadOptions, SamplingParams, api_fields, cli_default, knob, pick
from powerinfer_py.serve import api


def _keywords(func, skip=("self", "path", "prompt")) -> dict:
    return {n: p.default for n, p in inspect.signature(func).parameters.items() if n not in skip}


def test_load_and_llm_take_exactly_the_load_options_with_their_defaults():
    want = {f.name: f.default for f in fields(LoadOptions)}
    assert _keywords(LLM.__init__) == want
    assert _keywords(load) == want
    assert LoadOptions(threads=2, use_mmap=False).kwargs() == {**want, "threads": 2, "use_mmap": False}
    with pytest.raises(TypeError, match="no_such_option"):
        load("model.gguf", no_such_option=1)


def test_generate_keywords_are_sampling_params_fields_with_their_defaults():
    sampling = {f.name: f.default for f in fields(SamplingParams)}
    sampling["logit_bias"] = None  # the methods take a {id: bias} dict; SamplingParams stores sorted pairs
    sampling["stop"] = None
    for method, extra in ((LLM.generate_tokens, {"add_bos", "prefill_batch", "logprobs", "echo"}),
                          (LLM.generate, {"add_bos", "prefill_batch"})):
        kw = _keywords(method)
        assert set(kw) - set(sampling) == extra, method.__name__
        assert {n: kw[n] for n in kw if n in sampling} == {n: sampling[n] for n in kw if n in sampling}
    assert set(_keywords(LLM.generate)) - {"add_bos", "prefill_batch"} == set(sampling)


def test_sampling_params_normalise_bias_and_stops():
    p = SamplingParams(logit_bias={7: 1, 2: -3.5}, stop="END")
    assert p.logit_bias == ((2, -3.5), (7, 1.0)) and p.stop == ("END",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b") and SamplingParams(logit_bias=None).logit_bias == ()
    for bad in ("", [""], [3]):
        with pytest.raises(ValueError, match="stop strings must be non-empty strings"):
            SamplingParams(stop=bad)
    assert pick(SamplingParams, {"temperature": 0, "unrelated": 1}) == SamplingParams(temperature=0)


def _options(command: str) -> dict[str, click.Option]:
    cmd = typer.main.get_command(app).commands[command]
    return {p.name: p for p in cmd.params if p.param_type_name == "option"}


@pytest.mark.parametrize("command", ["run", "chat", "serve", "bench", "perplexity"])
def test_cli_flags_are_built_from_the_knobs(command):
    opts = _options(command)
    checked = 0
    sampling = command in ("run", "chat", "serve")  # perplexity's --tokens is its own max_tokens
    for cls in (LoadOptions, SamplingParams) if sampling else (LoadOptions,):
        for f in fields(cls):
            if "knob" not in f.metadata:
                continue
            k = knob(cls, f.name)
            param = opts.get(k.cli_name or f.name)
            if param is None:
                continue
            checked += 1
            assert set(param.opts) | set(param.secondary_opts) == set(k.flags), f.name
            if (command, f.name) not in {("chat", "max_tokens"), ("perplexity", "n_ctx")}:  # their own defaults
                assert param.default == cli_default(cls, f.name), f.name
                assert param.help == k.help or command == "bench", f.name
    assert checked == {"run": 20, "chat": 19, "serve": 17, "bench": 8, "perplexity": 5}[command]


def test_cli_values_map_flags_back_to_fields():
    got = O.values(LoadOptions, {"threads": 3, "n_ctx": 64, "no_mmap": True, "temperature": 0.1})
    assert got == {"threads": 3, "n_ctx": 64, "use_mmap": False}
    assert O.load_options({"backend": "auto"}) == LoadOptions(backend="auto")
    assert O.sampling_params({"temperature": 0.0, "max_tokens": 5, "stop": None}, stop=("x",)) == \
        SamplingParams(temperature=0.0, max_tokens=5, stop=("x",))
    from powerinfer_py.errors import PowerInferError
    with pytest.raises(PowerInferError, match="top_p"):
        O.sampling_params({"top_p": 0.0})


def test_the_server_reads_every_api_field_with_its_bounds():
    defaults = SamplingParams(temperature=0.3, top_k=7)
    common = api.parse_common({}, defaults)
    assert common.sampling == defaults  # absent fields: the server's defaults
    names = [n for n, _ in api_fields()]
    assert names == ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "frequency_penalty",
                     "presence_penalty"]
    for name, spec in api_fields():
        if spec.lo is not None:
            below = spec.lo if spec.lo_open else spec.lo - 1
            with pytest.raises(api.ApiError, match=f'"{name}" must'):
                api.parse_common({name: below}, defaults)
        if spec.hi is not None:
            with pytest.raises(api.ApiError, match=f'"{name}" must be in'):
                api.parse_common({name: spec.hi + 1}, defaults)
        value = 1 if spec.kind == "integer" else (spec.hi if spec.hi is not None else 1.5)
        assert getattr(api.parse_common({name: value}, defaults).sampling, name) == value
    # the seed is per request: a server-wide one is not applied to requests that leave it out
    assert api.parse_common({}, SamplingParams(seed=5)).sampling.seed is None
    # which field is reported first when several are wrong: the seed, then the rest in field order
    with pytest.raises(api.ApiError, match='"seed"'):
        api.parse_common({"temperature": -1, "seed": -1}, defaults)


def test_knob_defaults_differ_from_the_library_only_where_said():
    assert LoadOptions().backend == "cpu" and cli_default(LoadOptions, "backend") == "auto"
    assert cli_default(LoadOptions, "use_mmap") is False  # --no-mmap is off by default
    for cls in (LoadOptions, SamplingParams):
        for f in fields(cls):
            assert f.default is not MISSING
