"""Token log-probabilities: LogprobRecorder through LLM.generate_tokens, and the server's `logprobs` / `echo`.

The reference is llama.cpp: a log-softmax (float64) of its logits for the same tokens on the same synthetic
F32 file. The server's answers are checked against the Python API and against the text they come with.
Mutations tried and caught: prompt entries shifted by one position (the logits after token j scored against
token j instead of j + 1), the top list sorted ascending, text_offset counted in bytes per token (the test
prompt has a non-ASCII character that the synthetic vocabulary splits into byte tokens).
"""
from __future__ import annotations

import numpy as np
import pytest

from llama_ref import llama_cpp_logits
from powerinfer_py import load
from powerinfer_py.sampler import LogprobRecorder, log_softmax, top_tokens
from powerinfer_py.serve.api import token_text
from test_server import CONV, N_CTX, events, model_path, request, server  # noqa: F401 (fixtures)

PROMPT = "once upon a time, über"


def test_token_text():
    assert token_text(" über".encode()) == " über"
    assert token_text(b"\xc3") == "bytes:\\xc3"  # part of a character: OpenAI's form


def test_log_softmax_and_top_tokens():
    rng = np.random.default_rng(0)
    x = rng.normal(size=1000).astype(np.float32) * 5
    x[[3, 7]] = 30.0  # a tie at the top: the smaller id first
    lp = log_softmax(x)
    ref = x.astype(np.float64) - np.log(np.sum(np.exp(x.astype(np.float64))))
    assert np.allclose(lp, ref, atol=1e-12)
    assert np.isclose(np.logaddexp.reduce(lp), 0.0)
    top = top_tokens(lp, 5)
    assert [t for t, _ in top[:2]] == [3, 7]
    assert [t for t, _ in top] == list(np.lexsort((np.arange(1000), -lp))[:5])
    assert top_tokens(lp, 0) == () and len(top_tokens(lp[:3], 5)) == 3
    with pytest.raises(ValueError, match="between 0 and 20"):
        LogprobRecorder(top_n=21)


@pytest.fixture(scope="module")
def llm(model_path):  # noqa: F811
    m = load(model_path, threads=1, n_ctx=N_CTX)
    yield m
    m.close()


def test_generated_and_echoed_logprobs_match_llama_cpp(llm, model_path):  # noqa: F811
    gen = llm.generate_tokens(PROMPT, max_tokens=6, temperature=0, logprobs=4, echo=True, prefill_batch=3)
    out = list(gen)
    ids = llm.tokenize(PROMPT)
    entries = gen.logprobs.entries
    assert [e.token for e in entries] == ids + out
    assert entries[0].logprob is None and entries[0].top == ()
    ref = llama_cpp_logits(model_path, ids + out, n_ctx=64)
    want = np.array([log_softmax(ref[i])[t] for i, t in enumerate((ids + out)[1:])])
    got = np.array([e.logprob for e in entries[1:]])
    assert np.max(np.abs(got - want)) < 2e-3, np.abs(got - want)
    spread = np.std([log_softmax(r) for r in ref])
    assert spread > 0.5  # the comparison above is far tighter than what a wrong position would give
    for e in entries[len(ids):]:  # greedy: the chosen token is the most likely one, listed first
        assert len(e.top) == 4 and e.top[0][0] == e.token and e.top[0][1] == e.logprob
        assert all(a[1] >= b[1] for a, b in zip(e.top, e.top[1:]))
    # the same prompt in one prefill batch: the same entries, bit for bit
    again = llm.generate_tokens(PROMPT, max_tokens=6, temperature=0, logprobs=4, echo=True)
    assert list(again) == out and again.logprobs.entries == entries
    # without echo only the generated tokens are recorded, without logprobs nothing is
    plain = llm.generate_tokens(PROMPT, max_tokens=6, temperature=0, logprobs=0)
    list(plain)
    assert [e.token for e in plain.logprobs.entries] == out and all(e.top == () for e in plain.logprobs.entries)
    assert [e.logprob for e in plain.logprobs.entries] == [e.logprob for e in entries[len(ids):]]
    assert llm.generate_tokens(PROMPT, max_tokens=2).logprobs is None


def test_server_completion_echo_scores_a_text(server, llm):  # noqa: F811
    status, body = request(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0, "echo": True,
                                                       "logprobs": 2})
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    ids = llm.tokenize(PROMPT)
    gen = llm.generate_tokens(PROMPT, max_tokens=0, logprobs=2, echo=True)
    list(gen)
    assert lp["token_logprobs"] == [e.logprob for e in gen.logprobs.entries]
    assert len(lp["tokens"]) == len(ids) and lp["top_logprobs"][0] is None
    assert all(len(t) <= 2 for t in lp["top_logprobs"][1:])
    # text_offset: each token's text sits at its offset in the returned text (characters, not bytes); the
    # first word's piece carries the space the tokenizer put in front of the text, which the text lacks
    pieces = [llm.tokenizer.piece(i).decode("utf-8", errors="replace") for i in ids]
    first = next(k for k, p in enumerate(pieces) if p)
    assert pieces[first] == " " + PROMPT[:len(pieces[first]) - 1] and lp["text_offset"][first] == 0
    whole = [k for k in range(first + 1, len(ids)) if "\ufffd" not in pieces[k]]
    assert len(whole) < len(ids) - first - 1  # the prompt's "ü" is split into byte tokens on this vocabulary
    for k in whole:
        off = lp["text_offset"][k]
        assert choice["text"][off:off + len(pieces[k])] == pieces[k], k
    assert lp["text_offset"] == sorted(lp["text_offset"])
    assert lp["text_offset"][-1] + len(pieces[-1]) == len(PROMPT)
    assert body["usage"]["completion_tokens"] == 0


def test_server_completion_logprobs_stream_and_whole_agree(server):  # noqa: F811
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 3}
    status, whole = request(server, "/v1/completions", body)
    assert status == 200
    lp = whole["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == whole["usage"]["completion_tokens"] == 5
    assert "".join(lp["tokens"]) == whole["choices"][0]["text"]
    assert lp["text_offset"][0] == len(PROMPT)  # offsets count from the start of the prompt
    for value, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert max(top.values()) == value  # greedy
    status, text = request(server, "/v1/completions", dict(body, stream=True))
    chunks = [e for e in events(text) if e != "[DONE]"]
    merged = {k: sum(((c["choices"][0]["logprobs"] or {k: []})[k] for c in chunks), []) for k in lp}
    assert merged == lp
    status, other = request(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
    assert other["choices"][0]["logprobs"] is None


def test_server_chat_logprobs(server):  # noqa: F811
    body = {"messages": CONV, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    status, whole = request(server, "/v1/chat/completions", body)
    assert status == 200, whole
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"]
    for e in content:
        assert token_text(bytes(e["bytes"])) == e["token"]
        assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] == e["logprob"]
    status, text = request(server, "/v1/chat/completions", dict(body, stream=True))
    chunks = [e for e in events(text) if e != "[DONE]" and e["choices"]]
    streamed = sum(((c["choices"][0]["logprobs"] or {"content": []})["content"] for c in chunks), [])
    assert streamed == content
    assert chunks[0]["choices"][0]["logprobs"] is None  # the role chunk
    assert all(c["choices"][0]["logprobs"] is None or c["choices"][0]["logprobs"]["content"] for c in chunks)
    status, off = request(server, "/v1/chat/completions", dict(body, logprobs=False, top_logprobs=None))
    assert off["choices"][0]["logprobs"] is None
