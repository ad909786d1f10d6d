"""`powerinfer serve` against hostile and broken clients (issue 35, points 3, 4 and 8a).

Each test starts the real server on 127.0.0.1 (an ephemeral port) on a tiny synthetic model, with timeouts
of about a second so that the stalls it provokes end quickly, and checks the outcome a client sees plus that
the server goes on answering. Every loop is bounded in count and in time.
"""
from __future__ import annotations

import errno
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest

from powerinfer_py import load
from powerinfer_py.serve import make_server, serve_forever

N_CTX = 128
PROMPT = "once upon a time"
TIMEOUT = 1.0  # seconds: the read and write timeouts of the servers here


@pytest.fixture(scope="module")
def model_path(synthetic_model):
    return synthetic_model("llama")


@pytest.fixture(scope="module")
def llm(model_path):
    model = load(model_path, threads=1, n_ctx=N_CTX)
    yield model
    model.close()


@contextmanager
def running(llm, **kw):
    """A server on 127.0.0.1 serving `llm` in a thread (make_server's keywords in kw); stopped afterwards."""
    logs: list[str] = []
    kw.setdefault("timeout", TIMEOUT)
    srv = make_server(llm, "127.0.0.1", 0, template="plain", log=logs.append, **kw)
    srv.logs = logs
    thread = threading.Thread(target=serve_forever, args=(srv,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        thread.join(timeout=30)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def server(llm):
    with running(llm) as srv:
        yield srv


def call(srv, method: str, path: str, body=None, headers: dict | None = None, timeout: float = 30):
    """(status, response headers, parsed JSON body) over http.client. headers: added to (or, with None as the
    value, removed from) the default {"Content-Type": "application/json"}; a "Host" replaces http.client's."""
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    hdrs = {k: v for k, v in hdrs.items() if v is not None}
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=timeout)
    try:
        data = json.dumps(body) if body is not None else None
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        text = resp.read().decode("utf-8")
        assert resp.getheader("Content-Type") == "application/json", text
        return resp.status, resp.headers, json.loads(text)
    finally:
        conn.close()


def assert_error(status, out, want_status, code, *words):
    assert status == want_status, out
    err = out["error"]
    assert set(err) == {"message", "type", "code"} and err["code"] == code, err
    for w in words:
        assert w in err["message"], (w, err["message"])


def healthy(srv) -> bool:
    return call(srv, "GET", "/health")[::2] == (200, {"status": "ok"})


def raw_exchange(srv, data: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes on a fresh connection and read until the server closes it (or `timeout` passes)."""
    with socket.create_connection(srv.server_address[:2], timeout=timeout) as s:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
        return out


def parse_raw(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"Content-Type: application/json" in head, head
    return status, json.loads(body)


# ---- point 3: timeouts, the connection cap, the backlog ------------------------------------------------------

def test_a_stalled_stream_reader_does_not_hold_the_model(server):
    """A client opens a long stream (logprobs make each chunk ~1 KB) with small socket buffers and never
    reads: once the socket buffers are full the server's write blocks; after the write timeout the client
    counts as gone, its generation stops and a second client's completion is served."""
    accept = server.get_request

    def small_send_buffer():  # the kernel grows a loopback send buffer to MBs; keep it at a few KB here
        sock, addr = accept()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return sock, addr

    server.get_request = small_send_buffer
    stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: sets the TCP window
        stalled.settimeout(10)
        stalled.connect(server.server_address[:2])
        eos = server.engine.llm.tokenizer.eos_id  # banned: the answer runs its 100 tokens, ~100 KB of chunks
        body = json.dumps({"prompt": PROMPT, "max_tokens": 100, "temperature": 0, "stream": True,
                           "logprobs": 20, "echo": True, "logit_bias": {str(eos): -100}}).encode()
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 10
        while not server.engine.lock.locked() and time.monotonic() < deadline:  # it is generating
            time.sleep(0.01)
        assert server.engine.lock.locked()
        t0 = time.monotonic()
        status, _, out = call(server, "POST", "/v1/completions", {"prompt": "hello", "max_tokens": 3,
                                                                 "temperature": 0}, timeout=30)
        took = time.monotonic() - t0
        assert status == 200 and out["usage"]["completion_tokens"] == 3, out
        assert took < TIMEOUT + 10, took
        stalls = [line for line in server.logs if f"it read nothing for {TIMEOUT:g} s" in line]
        assert len(stalls) == 1 and "generation stopped" in stalls[0], server.logs
    finally:
        server.get_request = accept
        stalled.close()
    assert healthy(server)


def _drain(sock: socket.socket) -> bytes:
    """What a closed connection still holds unread, up to its end or reset."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return out
        if not chunk:
            return out
        out += chunk


def test_slow_headers_are_dropped_after_the_read_timeout(server):
    """Three connections send a header line every 0.2 s and never finish: each is answered 408 (or cut) and
    closed about TIMEOUT seconds after it connected, whatever the trickle."""
    socks = [socket.create_connection(server.server_address[:2], timeout=5) for _ in range(3)]
    t0 = time.monotonic()
    got = {i: b"" for i in range(3)}
    closed_at: dict[int, float] = {}
    try:
        for s in socks:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(50):  # 50 ticks of 0.2 s at most: 10 s
            open_ = [i for i in range(3) if i not in closed_at]
            if not open_ or time.monotonic() - t0 > 10:
                break
            for i in open_:
                try:
                    socks[i].sendall(b"X-Trickle: 1\r\n")
                except OSError:  # torn down: what it had answered may still wait unread (the 408's body)
                    closed_at[i] = time.monotonic() - t0
                    got[i] += _drain(socks[i])
            readable = select.select([socks[i] for i in open_ if i not in closed_at], [], [], 0.2)[0]
            for s in readable:
                i = socks.index(s)
                try:
                    chunk = s.recv(65536)
                except OSError:
                    chunk = b""
                got[i] += chunk
                if not chunk:
                    closed_at[i] = time.monotonic() - t0
    finally:
        for s in socks:
            s.close()
    assert sorted(closed_at) == [0, 1, 2], (closed_at, got)
    assert all(TIMEOUT * 0.5 < t < TIMEOUT + 5 for t in closed_at.values()), closed_at
    for data in got.values():  # a 408 when it arrived before the connection was torn down
        if data:
            status, out = parse_raw(data)
            assert_error(status, out, 408, "request_timeout", "did not arrive within 1 s")
    assert sum(" 408" in line for line in server.logs) >= 3, server.logs
    assert healthy(server)


def test_a_slow_body_gets_408(server):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    t0 = time.monotonic()
    status, out = parse_raw(raw_exchange(server, head + b"Content-Length: 100\r\n\r\n{\"prompt\": ", timeout=10))
    assert_error(status, out, 408, "request_timeout", "100 bytes", "did not arrive")
    assert time.monotonic() - t0 < TIMEOUT + 5
    assert healthy(server)


def test_connections_over_the_cap_get_503_and_the_server_answers_after(llm):
    # read timeout 5 s: the idle connections hold their slots for the whole test
    with running(llm, max_connections=3, timeout=5.0) as srv:
        idle = [socket.create_connection(srv.server_address[:2], timeout=5) for _ in range(3)]
        try:
            # accept() takes connections in arrival order: the idle ones get the 3 slots first
            status, headers, out = call(srv, "GET", "/health", timeout=10)
            assert_error(status, out, 503, "too_many_connections", "3 connections")
            assert out["error"]["type"] == "server_error" and headers["Retry-After"] == "1"
            status, _, out = call(srv, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
            assert status == 503, out
            assert sum("refused" in line for line in srv.logs) == 2, srv.logs
        finally:
            for s in idle:
                s.close()
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:  # the idle connections' threads end at their EOF
            status, _, out = call(srv, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
            if status == 200:
                break
            time.sleep(0.05)
        assert status == 200 and out["usage"]["completion_tokens"] == 2


def test_fifty_connections_at_once_all_connect_and_get_answers(server):
    """50 connections opened while the accept loop is held up: all complete their handshake at once (the
    listen backlog holds them; with a backlog of 5, most would wait for SYN retries or be reset), then each
    gets its answer."""
    gate = threading.Event()
    handle = server._handle_request_noblock

    def held():
        gate.wait(10)
        handle()

    server._handle_request_noblock = held
    socks = []
    try:
        for _ in range(50):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            assert s.connect_ex(server.server_address[:2]) in (0, errno.EINPROGRESS)
            socks.append(s)
        # while accept() is held, a connection beyond the backlog stays unestablished however long one waits
        pending, deadline = set(socks), time.monotonic() + 3
        while pending and time.monotonic() < deadline:
            for s in select.select([], list(pending), [], 0.05)[1]:
                assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                pending.discard(s)
        assert not pending, f"{len(pending)} of 50 connections not established while accept() was held"
        for s in socks:
            s.setblocking(True)
            s.settimeout(30)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    finally:
        server._handle_request_noblock = handle
        gate.set()
    try:
        for s in socks:
            data = b""
            for _ in range(100):  # until EOF (the server closes after each answer)
                chunk = s.recv(65536)  # a reset raises here and fails the test
                if not chunk:
                    break
                data += chunk
            assert parse_raw(data) == (200, {"status": "ok"})
    finally:
        for s in socks:
            s.close()


# ---- point 4: Host, Origin, Content-Type, API key ------------------------------------------------------------

COMPLETION = {"prompt": "hi", "max_tokens": 2, "temperature": 0}


def test_the_probes_cross_origin_request_is_refused(server):
    status, _, out = call(server, "POST", "/v1/completions", COMPLETION,
                          {"Host": "evil.example", "Origin": "http://evil.example", "Content-Type": "text/plain"})
    assert 400 <= status < 500 and "error" in out, out
    assert healthy(server)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "10.1.2.3"])
def test_a_foreign_host_is_refused(server, host):
    status, _, out = call(server, "POST", "/v1/completions", COMPLETION, {"Host": host})
    assert_error(status, out, 403, "host_not_allowed", repr(host), "--allow-host")
    status, _, out = call(server, "GET", "/health", headers={"Host": host})
    assert status == 403
    assert healthy(server)


def test_a_malformed_host_is_400(server):
    status, _, out = call(server, "GET", "/v1/models", headers={"Host": "a:b:c"})
    assert_error(status, out, 400, "invalid_host", "malformed Host header")


def test_own_host_names_are_served(server):
    port = server.server_address[1]
    for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", f"LocalHost:{port}", f"[::1]:{port}"):
        status, _, out = call(server, "POST", "/v1/completions", COMPLETION, {"Host": host})
        assert status == 200 and out["usage"]["completion_tokens"] == 2, (host, out)


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:1", "http://127.0.0.1",
                                    "file://", "http://evil.example:{port}"])
def test_a_foreign_origin_is_403(server, origin):
    origin = origin.format(port=server.server_address[1])
    status, _, out = call(server, "POST", "/v1/completions", COMPLETION, {"Origin": origin})
    assert_error(status, out, 403, "origin_not_allowed", "cross-origin")
    assert healthy(server)


def test_a_same_origin_page_is_served(server):
    port = server.server_address[1]
    for host, origin in ((f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"),
                         (f"localhost:{port}", f"http://localhost:{port}")):
        status, _, out = call(server, "POST", "/v1/completions", COMPLETION, {"Host": host, "Origin": origin})
        assert status == 200, (origin, out)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                   None])
def test_a_body_that_is_not_declared_json_is_415(server, ctype):
    status, _, out = call(server, "POST", "/v1/completions", COMPLETION, {"Content-Type": ctype})
    assert_error(status, out, 415, "unsupported_media_type", "application/json")
    assert healthy(server)


def test_json_with_a_charset_is_accepted(server):
    status, _, out = call(server, "POST", "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                          {"Content-Type": "application/json; charset=utf-8"})
    assert status == 200, out


def test_the_api_key(llm):
    with running(llm, api_key="sk-local-123") as srv:
        for auth, why in ((None, "needs an API key"), ("Bearer sk-local-124", "incorrect API key"),
                          ("Bearer sk-local-12", "incorrect"), ("sk-local-123", "incorrect"),
                          ("Basic sk-local-123", "incorrect")):
            status, headers, out = call(srv, "POST", "/v1/completions", COMPLETION, {"Authorization": auth})
            assert_error(status, out, 401, "invalid_api_key", why)
            assert headers["WWW-Authenticate"] == "Bearer"
        assert call(srv, "GET", "/v1/models")[0] == 401
        assert healthy(srv)  # /health needs no key (load balancers, scripts)
        good = {"Authorization": "Bearer sk-local-123"}
        status, _, out = call(srv, "POST", "/v1/completions", COMPLETION, good)
        assert status == 200 and out["usage"]["completion_tokens"] == 2
        assert call(srv, "GET", "/v1/models", headers=good)[0] == 200
        # with a key, any Host may be used (a name of the machine); foreign Origins are still refused
        status, _, out = call(srv, "POST", "/v1/completions", COMPLETION, {**good, "Host": "gpu-box.lan:8080"})
        assert status == 200, out
        status, _, out = call(srv, "POST", "/v1/completions", COMPLETION, {**good, "Origin": "http://evil.example"})
        assert status == 403


def test_allow_host_adds_names(llm):
    with running(llm, allow_hosts=["gpu-box.lan"]) as srv:
        assert call(srv, "POST", "/v1/completions", COMPLETION, {"Host": "GPU-box.lan:8080"})[0] == 200
        assert call(srv, "POST", "/v1/completions", COMPLETION, {"Host": "other.lan"})[0] == 403
    with running(llm, allow_hosts=["*"]) as srv:
        assert call(srv, "POST", "/v1/completions", COMPLETION, {"Host": "anything.example"})[0] == 200


@pytest.mark.parametrize("kw,words", [({"api_key": ""}, "API key is empty"),
                                      ({"api_key": "two words"}, "printable ASCII"),
                                      ({"timeout": 0}, "timeout"), ({"max_connections": 0}, "max_connections")])
def test_bad_server_options_are_named(llm, kw, words):
    from powerinfer_py.errors import PowerInferError
    with pytest.raises(PowerInferError, match=words):
        make_server(llm, "127.0.0.1", 0, **kw)


# ---- point 8a: a malformed request line ----------------------------------------------------------------------

@pytest.mark.parametrize("line,words", [(b"GARBAGE", "Bad request syntax"),
                                        (b"GET / HTTP/9x", "Bad request version"),
                                        (b"GET /\x1b[31m HTTP/1.1 x", "Bad request")])
def test_a_malformed_request_line_is_400_and_the_server_goes_on(server, line, words):
    status, out = parse_raw(raw_exchange(server, line + b"\r\n\r\n"))
    assert_error(status, out, 400, "bad_request", words)
    logged = [entry for entry in server.logs if "(request line" in entry and " 400" in entry]
    assert logged and "\x1b" not in logged[-1], server.logs  # client bytes are escaped in the log
    assert healthy(server)


# ---- the command ---------------------------------------------------------------------------------------------

def _cli_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env.update(extra)
    return env


def test_serve_takes_the_api_key_from_the_environment(model_path):
    proc = subprocess.Popen([sys.executable, "-m", "powerinfer_cli", "serve", "-m", str(model_path), "--port", "0",
                             "-t", "1", "-c", "64", "--timeout", "5"], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_cli_env(POWERINFER_API_KEY="sk-env"))
    try:
        line = ""
        deadline = time.time() + 60
        while "serving" not in line and time.time() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the server exited early"
        url = line.split(" at ")[-1].strip()
        req = urllib.request.Request(url + "/models")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 401
        req.add_header("Authorization", "Bearer sk-env")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "warning" not in err  # loopback: nothing to warn about
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_refuses_an_empty_api_key(model_path):
    res = subprocess.run([sys.executable, "-m", "powerinfer_cli", "serve", "-m", str(model_path), "--port", "0",
                          "-t", "1", "-c", "64", "--api-key", ""], capture_output=True, text=True,
                         env=_cli_env(), timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == "error: the API key is empty", res.stderr


def test_binding_beyond_loopback_warns(capsys):
    """The warning itself (a test must not listen beyond 127.0.0.1): a stand-in for a server on 0.0.0.0."""
    from powerinfer_cli.serve_cmd import _warn_if_exposed

    class Exposed:
        loopback_only = False
        server_address = ("0.0.0.0", 8080)

        class access:
            api_key = None

    _warn_if_exposed(Exposed, "0.0.0.0")
    err = capsys.readouterr().err
    assert "warning: listening on 0.0.0.0 (every interface) without an API key" in err and "--api-key" in err
    Exposed.access.api_key = "k"
    _warn_if_exposed(Exposed, "0.0.0.0")
    assert "requests need the API key, but plain HTTP" in capsys.readouterr().err
    Exposed.loopback_only = True
    _warn_if_exposed(Exposed, "127.0.0.1")
    assert capsys.readouterr().err == ""
