"""`powerinfer serve`: the OpenAI-compatible HTTP server on a tiny synthetic model, driven with urllib.

The server runs in a thread on an ephemeral port. Its answers are compared with an independent LLM loaded
from the same file: completions with LLM.generate, chat replies with a ChatSession given the same messages
(and the prompt ids the server's model is fed with the ids of the ChatSession's rendered prompt).
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import numpy as np
import pytest

from powerinfer_py import load
from powerinfer_py.chat import ChatSession, template_for
from powerinfer_py.sampler import SamplingParams
from powerinfer_py.serve import make_server, serve_forever

N_CTX = 128
PROMPT = "once upon a time"
CONV = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hello world"},
        {"role": "assistant", "content": "the cat"}, {"role": "user", "content": "a dog and a house"}]


@pytest.fixture(scope="module")
def model_path(synthetic_model):
    return synthetic_model("llama")


@pytest.fixture(scope="module")
def ref(model_path):
    llm = load(model_path, threads=1, n_ctx=N_CTX)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def server(model_path):
    llm = load(model_path, threads=1, n_ctx=N_CTX)
    logs: list[str] = []
    srv = make_server(llm, "127.0.0.1", 0, template="plain", log=logs.append)
    srv.logs = logs
    thread = threading.Thread(target=serve_forever, args=(srv,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    thread.join(timeout=10)
    assert not thread.is_alive()
    llm.close()


def request(srv, path: str, body=None, method: str | None = None, raw: bytes | None = None):
    """(status, parsed JSON or the raw text of an event stream)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(srv.url + path, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode("utf-8")
            ctype = r.headers.get("Content-Type")
            return r.status, (text if ctype == "text/event-stream" else json.loads(text))
    except urllib.error.HTTPError as e:
        text = e.read().decode("utf-8")
        assert e.headers.get("Content-Type") == "application/json", text
        return e.code, json.loads(text)


def events(text: str) -> list:
    """The data of each Server-Sent Event: parsed JSON, or the string "[DONE]"."""
    assert text.endswith("\n\n")
    out = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def reference_chat(ref, conv, max_tokens, template="plain"):
    """ChatSession's reply (and its prompt ids) for a conversation ending with a user message."""
    system = conv[0]["content"] if conv[0]["role"] == "system" else None
    turns = conv[1:] if system else conv
    s = ChatSession(ref, template_for(ref, template), system, max_tokens=max_tokens,
                    sampling=SamplingParams(temperature=0))
    s.messages = [dict(m) for m in turns[:-1]]
    full, ids = s._prompt(s.conversation() + [turns[-1]])
    reply = s.send(turns[-1]["content"])
    return "".join(reply), ids, reply.stats


@contextmanager
def recorded_forward(srv, delay_s: float = 0.0):
    """Record the token ids of every forward pass of the server's model (optionally slowed down)."""
    model = srv.engine.llm.model
    calls: list[list[int]] = []
    forward = model.forward

    def recording(tokens, cache, *args, **kw):
        calls.append([int(t) for t in tokens])
        if delay_s:
            time.sleep(delay_s)
        return forward(tokens, cache, *args, **kw)

    model.forward = recording
    try:
        yield calls
    finally:
        with srv.engine.lock:  # a generation still in flight keeps the hook until it ends
            del model.forward


# ---- completions ---------------------------------------------------------------------------------------------

def test_health_and_models(server, model_path):
    assert request(server, "/health") == (200, {"status": "ok"})
    status, body = request(server, "/v1/models")
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [model_path.stem]
    assert request(server, f"/v1/models/{model_path.stem}")[1]["id"] == model_path.stem


def test_completion_at_temperature_0_is_generate(server, ref):
    want = "".join(ref.generate(PROMPT, max_tokens=10, temperature=0))
    n_gen = len(list(ref.generate_tokens(PROMPT, max_tokens=10, temperature=0)))
    status, body = request(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 10, "temperature": 0})
    assert status == 200, body
    assert body["object"] == "text_completion" and body["model"] == server.engine.model_id
    assert body["id"].startswith("cmpl-") and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["text"] == want and choice["index"] == 0
    assert choice["finish_reason"] == "length" and n_gen == 10
    assert body["usage"] == {"prompt_tokens": len(ref.tokenize(PROMPT)), "completion_tokens": 10,
                             "total_tokens": len(ref.tokenize(PROMPT)) + 10}
    ids = ref.tokenize(PROMPT)  # a prompt of token ids is used as it is
    status, body2 = request(server, "/v1/completions", {"prompt": ids, "max_tokens": 10, "temperature": 0})
    assert body2["choices"][0]["text"] == want and body2["usage"]["prompt_tokens"] == len(ids)


def test_penalties_and_logit_bias_reach_the_sampler(server, ref):
    """frequency_penalty / presence_penalty give generate()'s tokens with the same settings (and differ from
    none), logit_bias +100 on a token makes greedy decoding repeat it, on both endpoints; an empty tools list
    and response_format text are accepted."""
    pen = dict(frequency_penalty=1.5, presence_penalty=0.5)
    want = "".join(ref.generate(PROMPT, max_tokens=10, temperature=0, **pen))
    assert want != "".join(ref.generate(PROMPT, max_tokens=10, temperature=0))
    got = request(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, **pen})[1]
    assert got["choices"][0]["text"] == want
    forced = ref.tokenize("x", add_bos=False)[-1]
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logit_bias": {str(forced): 100}}
    assert list(ref.generate_tokens(PROMPT, max_tokens=4, temperature=0, logit_bias={forced: 100})) == [forced] * 4
    status, out = request(server, "/v1/completions", body)
    assert status == 200
    assert out["choices"][0]["text"] == "".join(ref.generate(PROMPT, max_tokens=4, temperature=0,
                                                            logit_bias={forced: 100}))
    status, out = request(server, "/v1/chat/completions", {"messages": CONV[1:2], "max_tokens": 3, "temperature": 0,
                                                           "logit_bias": {str(forced): 100}, "tools": [],
                                                           "response_format": {"type": "text"}})
    assert status == 200 and out["choices"][0]["message"]["content"] == ref.detokenize([forced] * 3).strip()


def test_streamed_completion_equals_the_plain_one(server):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    plain = request(server, "/v1/completions", body)[1]["choices"][0]["text"]
    status, text = request(server, "/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}))
    assert status == 200
    evs = events(text)
    assert evs[-1] == "[DONE]"
    chunks = [e for e in evs[:-1] if e["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert evs[-2]["choices"] == [] and evs[-2]["usage"]["completion_tokens"] == 12


def test_stop_strings_cut_the_text(server):
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    full = request(server, "/v1/completions", body)[1]["choices"][0]["text"]
    stop = full[6:9]
    cut = full[:full.find(stop)]
    for form in (stop, ["zzz-never", stop]):
        for stream in (False, True):
            status, out = request(server, "/v1/completions", dict(body, stop=form, stream=stream))
            assert status == 200
            if stream:
                chunks = [e for e in events(out)[:-1]]
                text = "".join(c["choices"][0]["text"] for c in chunks)
                finish = chunks[-1]["choices"][0]["finish_reason"]
            else:
                text, finish = out["choices"][0]["text"], out["choices"][0]["finish_reason"]
            assert (text, finish) == (cut, "stop")


# ---- chat ----------------------------------------------------------------------------------------------------

def test_chat_sees_the_prompt_chat_session_builds(server, ref):
    want, want_ids, st = reference_chat(ref, CONV, 8)
    with recorded_forward(server) as calls:
        status, body = request(server, "/v1/chat/completions", {"messages": CONV, "max_tokens": 8, "temperature": 0})
    assert status == 200, body
    assert calls[0] == want_ids  # a fresh session (the completions before reset the cache): the whole prompt
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": want}
    assert choice["finish_reason"] == ("length" if st.stop_reason == "length" else "stop")
    assert body["usage"]["prompt_tokens"] == len(want_ids) == st.n_prompt
    assert body["usage"]["completion_tokens"] == st.n_gen


def test_chat_follow_up_reuses_the_cache_and_matches_a_fresh_session(server, ref):
    first = request(server, "/v1/chat/completions", {"messages": CONV, "max_tokens": 8, "temperature": 0})[1]
    conv = CONV + [first["choices"][0]["message"], {"role": "user", "content": "the sun"}]
    want, want_ids, _ = reference_chat(ref, conv, 8)
    with recorded_forward(server) as calls:
        body = request(server, "/v1/chat/completions", {"messages": conv, "max_tokens": 8, "temperature": 0})[1]
    assert body["choices"][0]["message"]["content"] == want
    assert body["usage"]["prompt_tokens"] == len(want_ids)
    assert len(calls[0]) < len(want_ids)  # only the new part of the conversation was prefilled


def test_streamed_chat_equals_the_plain_one(server):
    body = {"messages": CONV[1:2], "max_tokens": 10, "temperature": 0}
    plain = request(server, "/v1/chat/completions", body)[1]
    status, text = request(server, "/v1/chat/completions", dict(body, stream=True))
    evs = events(text)
    assert status == 200 and evs[-1] == "[DONE]"
    assert evs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in evs[:-1])
    deltas = "".join(e["choices"][0]["delta"].get("content", "") for e in evs[:-1])
    assert deltas == plain["choices"][0]["message"]["content"]
    assert evs[-2]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]


def test_chat_stop_string(server):
    body = {"messages": CONV[1:2], "max_tokens": 16, "temperature": 0}
    full = request(server, "/v1/chat/completions", body)[1]["choices"][0]["message"]["content"]
    stop = full[5:8]
    out = request(server, "/v1/chat/completions", dict(body, stop=[stop]))[1]["choices"][0]
    assert out["message"]["content"] == full[:full.find(stop)] and out["finish_reason"] == "stop"


# ---- bad requests --------------------------------------------------------------------------------------------

LONG = "the " * 200
BAD = [
    ("POST", "/v1/completions", b"{not json", 400, ["malformed JSON"]),
    ("POST", "/v1/completions", b"", 400, ["malformed JSON", "empty"]),
    ("POST", "/v1/completions", b"[1, 2]", 400, ["JSON object", "array"]),
    ("POST", "/v1/completions", {"max_tokens": 4}, 400, ['"prompt" is required']),
    ("POST", "/v1/completions", {"prompt": 5}, 400, ['"prompt" must be', "a number"]),
    ("POST", "/v1/completions", {"prompt": ["a", "b"]}, 400, ["2 prompts"]),
    ("POST", "/v1/completions", {"prompt": [1, 10 ** 9]}, 400, ["token id 1000000000", "vocabulary"]),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400, ['"max_tokens" must be an integer']),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, ['"max_tokens": 0', '"echo": true']),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, ['"max_tokens" must be at least 0']),
    ("POST", "/v1/chat/completions", {"messages": CONV[1:2], "max_tokens": 0}, 400, ['"max_tokens" must be at least 1']),
    ("POST", "/v1/completions", {"prompt": "hi", "temperature": -1}, 400, ['"temperature"', "-1"]),
    ("POST", "/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, ['"top_p"', "1.5"]),
    ("POST", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', 400, ['"temperature" must be a finite']),
    ("POST", "/v1/completions", {"prompt": "hi", "seed": -1}, 400, ['"seed" must be at least 0']),
    ("POST", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, ['"stream" must be true or false']),
    ("POST", "/v1/completions", {"prompt": "hi", "stop": 5}, 400, ['"stop" must be']),
    ("POST", "/v1/completions", {"prompt": "hi", "n": 2}, 400, ['"n" must be 1', "got 2"]),
    ("POST", "/v1/completions", {"prompt": "hi", "echo": "yes"}, 400, ['"echo" must be true or false']),
    ("POST", "/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, ['"logprobs" must be at most 20']),
    ("POST", "/v1/completions", {"prompt": "hi", "logprobs": -1}, 400, ['"logprobs" must be at least 0']),
    ("POST", "/v1/completions", {"prompt": "hi", "logprobs": True}, 400, ['"logprobs" for /v1/completions']),
    ("POST", "/v1/chat/completions", {"messages": CONV[1:2], "top_logprobs": 2}, 400, ['needs "logprobs": true']),
    ("POST", "/v1/chat/completions", {"messages": CONV[1:2], "logprobs": True, "top_logprobs": 30}, 400,
     ['"top_logprobs" must be at most 20']),
    ("POST", "/v1/chat/completions", {"messages": CONV[1:2], "logprobs": 2}, 400, ['"logprobs" must be true or']),
    ("POST", "/v1/completions", {"prompt": LONG}, 400, ["202 tokens", str(N_CTX)]),
    ("POST", "/v1/completions", {"prompt": "hi", "frequency_penalty": 2.5}, 400, ['"frequency_penalty"', "2.5"]),
    ("POST", "/v1/completions", {"prompt": "hi", "presence_penalty": "x"}, 400, ['"presence_penalty" must be a num']),
    ("POST", "/v1/completions", {"prompt": "hi", "logit_bias": [1]}, 400, ['"logit_bias" must be an object']),
    ("POST", "/v1/completions", {"prompt": "hi", "logit_bias": {"a": 1}}, 400, ['"logit_bias": keys', "'a'"]),
    ("POST", "/v1/completions", {"prompt": "hi", "logit_bias": {"1": 101}}, 400, ['"logit_bias.1" must be in']),
    ("POST", "/v1/completions", {"prompt": "hi", "logit_bias": {"99999": 1}}, 400, ["token id 99999", "vocabulary"]),
    ("POST", "/v1/chat/completions", {"messages": CONV[1:2], "logit_bias": {"99999": 1}}, 400, ["token id 99999"]),
    ("POST", "/v1/chat/completions", {"messages": CONV[1:2], "tools": [{"type": "function"}]}, 400,
     ['"tools" (function calling) is not supported']),
    ("POST", "/v1/chat/completions", {"messages": CONV[1:2], "response_format": {"type": "json_object"}}, 400,
     ['"response_format" json_object is not supported']),
    ("POST", "/v1/chat/completions", {"max_tokens": 4}, 400, ['"messages" is required']),
    ("POST", "/v1/chat/completions", {"messages": []}, 400, ['"messages" must be a non-empty array']),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, ["unknown role 'tool'"]),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400, ["messages[0].content"]),
    ("POST", "/v1/chat/completions", {"messages": CONV[:3]}, 400, ["last message must be a user message"]),
    ("POST", "/v1/chat/completions", {"messages": [CONV[1], CONV[1]]}, 400, ["messages[1]", "expected a assistant"]),
    ("POST", "/v1/chat/completions", {"messages": CONV[1:2], "n": 3}, 400, ['"n" must be 1']),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400,
     ["does not fit", str(N_CTX)]),
    ("GET", "/v1/nothing", None, 404, ["unknown path '/v1/nothing'"]),
    ("POST", "/v1/embeddings", {"input": "x"}, 404, ["unknown path"]),
    ("GET", "/v1/models/other", None, 404, ["unknown model 'other'"]),
    ("GET", "/v1/completions", None, 405, ["GET is not allowed on /v1/completions", "POST"]),
    ("POST", "/health", {}, 405, ["POST is not allowed on /health"]),
    ("DELETE", "/v1/models", None, 405, ["DELETE is not allowed"]),
]


@pytest.mark.parametrize("method,path,body,status,words", BAD, ids=[f"{b[0]} {b[1]} {b[3]} {b[4][0]}" for b in BAD])
def test_bad_requests_get_an_openai_error_and_the_server_goes_on(server, method, path, body, status, words):
    raw = body if isinstance(body, bytes) else None
    got, out = request(server, path, None if raw is not None else body, method=method, raw=raw)
    assert got == status, out
    err = out["error"]
    assert set(err) == {"message", "type", "code"} and err["type"] == "invalid_request_error"
    for w in words:
        assert w in err["message"], (w, err["message"])
    assert "Traceback" not in err["message"]
    assert request(server, "/health") == (200, {"status": "ok"})


def test_a_bug_is_a_500_without_traceback_and_the_server_goes_on(server, monkeypatch):
    def broken(req):
        raise RuntimeError("a bug")

    monkeypatch.setattr(server.engine, "complete", broken)
    status, out = request(server, "/v1/completions", {"prompt": "hi"})
    assert status == 500 and out["error"]["type"] == "server_error"
    assert "internal server error" in out["error"]["message"] and "a bug" not in out["error"]["message"]
    assert any("RuntimeError: a bug" in line and "Traceback" in line for line in server.logs)
    monkeypatch.undo()
    assert request(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2})[0] == 200


def test_a_model_that_fails_mid_generation_is_a_named_500_and_the_server_goes_on(server):
    """Non-finite logits (a damaged file) after two tokens: a plain request gets a 500 naming the problem, a
    stream that has sent its 200 ends with an error event; the next request is served normally."""
    model = server.engine.llm.model
    forward = model.forward
    n_calls = []

    def poisoned(tokens, cache, *args, **kw):
        logits = forward(tokens, cache, *args, **kw)
        n_calls.append(1)
        return logits * np.float32("nan") if len(n_calls) % 3 == 0 else logits

    model.forward = poisoned
    try:
        status, out = request(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
        assert status == 500 and out["error"]["code"] == "model_error" and out["error"]["type"] == "server_error"
        assert "logits at position" in out["error"]["message"] and "not finite (nan)" in out["error"]["message"]
        n_calls.clear()
        status, text = request(server, "/v1/chat/completions", {"messages": CONV[1:2], "max_tokens": 8,
                                                                 "temperature": 0, "stream": True})
        evs = events(text)
        assert status == 200 and "[DONE]" not in evs
        assert evs[-1]["error"]["code"] == "model_error" and "not finite" in evs[-1]["error"]["message"]
        assert [e["choices"][0]["delta"] for e in evs[:-1]][0] == {"role": "assistant", "content": ""}
    finally:
        with server.engine.lock:
            del model.forward
    assert request(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0})[0] == 200


def test_the_long_prompt_error_names_its_real_length(server, ref):
    n = len(ref.tokenize(LONG))
    assert n == 202  # the number BAD expects
    out = request(server, "/v1/completions", {"prompt": LONG})[1]
    assert out["error"]["code"] == "context_length_exceeded"


# ---- connections ---------------------------------------------------------------------------------------------

def _open_stream(srv, body):
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    return conn, resp


def test_a_client_leaving_mid_stream_stops_the_generation(server):
    body = {"prompt": PROMPT, "max_tokens": 100, "temperature": 0, "stream": True}
    with recorded_forward(server, delay_s=0.05) as calls:
        conn, resp = _open_stream(server, body)
        assert resp.readline().startswith(b"data: ")
        # the model is busy: /health still answers at once
        assert request(server, "/health") == (200, {"status": "ok"})
        resp.close()  # the response holds the socket too: both must go for the connection to close
        conn.close()
        deadline = time.time() + 20
        while not any("went away" in line for line in server.logs) and time.time() < deadline:
            time.sleep(0.05)
        assert any("went away" in line for line in server.logs), server.logs
        n_calls = len(calls)
    assert n_calls < 20  # stopped within a few tokens (this prompt runs 38 tokens to its end)
    status, out = request(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    assert status == 200 and out["usage"]["completion_tokens"] == 4


def test_a_client_leaving_before_a_plain_answer_stops_the_generation(server):
    body = {"prompt": PROMPT, "max_tokens": 100, "temperature": 0}
    n_before = sum("went away" in line for line in server.logs)
    with recorded_forward(server, delay_s=0.05) as calls:
        host, port = server.server_address[:2]
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        deadline = time.time() + 20
        while len(calls) < 3 and time.time() < deadline:  # generating
            time.sleep(0.01)
        conn.close()
        while sum("went away" in line for line in server.logs) == n_before and time.time() < deadline:
            time.sleep(0.05)
        assert sum("went away" in line for line in server.logs) == n_before + 1, server.logs
        n_calls = len(calls)
    assert n_calls < 20  # this prompt runs 38 tokens to its end
    assert request(server, "/health") == (200, {"status": "ok"})


def test_requests_take_turns_on_the_model(server):
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    want = request(server, "/v1/completions", body)[1]["choices"][0]["text"]
    results = []
    with recorded_forward(server, delay_s=0.01):
        threads = [threading.Thread(target=lambda: results.append(request(server, "/v1/completions", body)))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert [(s, b["choices"][0]["text"]) for s, b in results] == [(200, want)] * 3


# ---- the command ---------------------------------------------------------------------------------------------

def _cli_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return env


def test_serve_help_lists_the_options():
    res = subprocess.run([sys.executable, "-m", "powerinfer_cli", "serve", "--help"], capture_output=True,
                         text=True, env=_cli_env(), timeout=60)
    assert res.returncode == 0, res.stderr
    for opt in ("--model", "--host", "--port", "--threads", "--ctx-size", "--sparse", "--chat-template", "--temp",
                "--api-key", "--allow-host", "--timeout", "--max-connections"):
        assert opt in res.stdout, opt
    assert "powerinfer serve -m demo" in res.stdout
    assert "POWERINFER_API_KEY" in res.stdout and "default 30" in res.stdout and "default 64" in res.stdout


def test_serve_command_answers_and_stops_on_ctrl_c(model_path):
    proc = subprocess.Popen([sys.executable, "-m", "powerinfer_cli", "serve", "-m", str(model_path), "--port", "0",
                             "-t", "1", "-c", "64"], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=_cli_env())
    try:
        line = ""
        deadline = time.time() + 60
        while "serving" not in line and time.time() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the server exited early"
        url = line.split(" at ")[-1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        with urllib.request.urlopen(url[:-3] + "/health", timeout=30) as r:
            assert json.loads(r.read()) == {"status": "ok"}
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "stopped" in err and "Traceback" not in err
        assert "GET /health 200" in err
    finally:
        if proc.poll() is None:
            proc.kill()
