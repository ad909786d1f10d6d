"""The HTTP side: a ThreadingHTTPServer whose handler routes the OpenAI paths to the Engine.

Each connection gets a thread, but the model serves one request at a time (Engine.lock): a request that needs
the model waits for the one in progress; /health and /v1/models answer at once. Every response is JSON
(errors too: {"error": {"message", "type", "code"}}), or Server-Sent Events when a request asks for a stream:
one `data: {chunk}` event per piece of text, then `data: [DONE]`. Responses are HTTP/1.0 style: the
connection closes after each one, which also ends an event stream without chunked encoding.

A client that goes away stops its generation: mid-stream, a write fails (a broken pipe or a reset
connection); before a plain JSON answer, the socket is checked for a hang-up after each piece. The server
goes on. An unexpected exception becomes a 500 with a short message; its traceback goes to the
server's log, never to the client.

Hostile or broken clients are bounded: the request (line and headers, then the body) must arrive within
read_timeout seconds, whatever the pace of its bytes; a write that stays blocked for write_timeout seconds
(a client that stopped reading its stream) counts as the client gone, which stops the generation and frees
the model. At most max_connections connections are served at once; one more is answered 503 and closed.
guard.py decides who may send requests at all (Host, Origin, Content-Type, API key).
"""
from __future__ import annotations

import io
import json
import math
import select
import socket
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from ..errors import PowerInferError
from . import api
from .engine import Engine, Run, Stopping
from .guard import Access, check_json_body, is_loopback

Log = Callable[[str], None]
# a timed-out write is a client that stopped reading: treated as one that left
GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)

TIMEOUT_S = 30.0            # default read and write timeouts (see the module docstring)
MAX_CONNECTIONS = 64        # default cap on connections served at once
WRITE_CHUNK = 64 << 10      # bytes per blocking send: the write timeout bounds each one (a stall, not a size)
REFUSE_WAIT_S = 1.0         # how long an over-cap connection is given to read its 503 before it is closed
MAX_LOGGED = 200            # characters of a request path written to the log


class Server(ThreadingHTTPServer):
    """An HTTP server bound to (host, port) that serves `engine`; port 0 picks a free port (see .url).

    read_timeout / write_timeout (seconds), max_connections: the bounds in the module docstring.
    allow_hosts: extra Host names to accept ("*": any); api_key: require `Authorization: Bearer KEY`."""
    daemon_threads = True       # a request thread never keeps the process alive after Ctrl-C
    allow_reuse_address = True  # a restart right after a stop can bind the same port
    request_queue_size = 128    # the listen backlog: a burst of connections waits for accept() instead of a reset

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 8080, log: Log | None = None, *,
                 read_timeout: float = TIMEOUT_S, write_timeout: float = TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, allow_hosts=(), api_key: str | None = None):
        if not all(0 < t < math.inf for t in (read_timeout, write_timeout)):
            raise ValueError(f"timeouts must be positive and finite, got {read_timeout} and {write_timeout}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self.engine = engine
        self.log = log or (lambda line: None)
        self.read_timeout, self.write_timeout = float(read_timeout), float(write_timeout)
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._refusers = threading.BoundedSemaphore(max(1, min(16, max_connections)))
        super().__init__((host, port), Handler)
        self.access = Access(self.server_address[0], host, allow_hosts, api_key)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    @property
    def loopback_only(self) -> bool:
        """True when only this machine can connect (bound to a loopback address)."""
        return is_loopback(self.server_address[0])

    # -- the connection cap --------------------------------------------------------------------------------

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self._refuse(request, client_address)
            return
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except Exception:  # the thread could not start (a KeyboardInterrupt may come after it did)
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, sock: socket.socket, client_address) -> None:
        """Answer an over-cap connection 503 in a short-lived thread (at most 16 at once; beyond that the
        connection is closed at once), so the accept loop never waits on it."""
        self.log(f"{client_address[0]}: refused, {self.max_connections} connections open (the limit)")
        if not self._refusers.acquire(blocking=False):
            self.shutdown_request(sock)
            return
        try:
            threading.Thread(target=self._answer_busy, args=(sock,), daemon=True).start()
        except Exception:  # as in process_request: only when no thread started
            self._refusers.release()
            self.shutdown_request(sock)
            raise

    def _answer_busy(self, sock: socket.socket) -> None:
        try:
            err = api.ApiError(503, f"the server has {self.max_connections} connections open, its limit; "
                               "try again later", "too_many_connections")
            data = (json.dumps(err.body()) + "\n").encode("utf-8")
            head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
            deadline = time.monotonic() + REFUSE_WAIT_S
            sock.settimeout(REFUSE_WAIT_S)
            sock.sendall(head.encode("ascii") + data)
            sock.shutdown(socket.SHUT_WR)
            # read what the client sends until it closes: closing a socket with unread bytes would reset the
            # connection, and a reset can destroy the 503 before the client reads it
            while time.monotonic() < deadline:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                if not sock.recv(4096):
                    break
        except OSError:
            pass
        finally:
            sock.close()
            self._refusers.release()


class _Reader(io.RawIOBase):
    """The read side of a connection with one deadline per phase (the request line and headers, then the
    body): a client that sends a byte now and then cannot hold its connection past the read timeout, as it
    could with a per-recv socket timeout."""

    def __init__(self, sock: socket.socket, timeout: float):
        self.sock, self.timeout = sock, timeout
        self.deadline = time.monotonic() + timeout
        self.timed_out = False

    def readable(self) -> bool:
        return True

    def restart(self) -> None:
        """A new phase: the next read_timeout seconds are its own."""
        self.deadline = time.monotonic() + self.timeout

    def readinto(self, buf) -> int:
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError("the request did not arrive in time")
            self.sock.settimeout(left)
            return self.sock.recv_into(buf)
        except TimeoutError:
            self.timed_out = True
            raise


class Handler(BaseHTTPRequestHandler):
    server: Server

    def version_string(self) -> str:
        from .. import __version__
        return f"powerinfer/{__version__}"

    # path -> {method: handler name}; paths are also accepted without the /v1 prefix, as llama.cpp does
    ROUTES = {
        "/health": {"GET": "_health"},
        "/v1/models": {"GET": "_models"},
        "/v1/completions": {"POST": "_completions"},
        "/v1/chat/completions": {"POST": "_chat"},
    }

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # http.server's reader: replaced by one that keeps the read deadline
        self._reader = _Reader(self.connection, self.server.read_timeout)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        super().handle_one_request()  # a request that timed out is dropped there, unanswered
        if self._reader.timed_out and not getattr(self, "_headers_sent", False):
            self.close_connection = True
            err = api.ApiError(408, f"the request did not arrive within {self.server.read_timeout:g} s",
                               "request_timeout")
            try:
                self._send_json(408, err.body())
            except GONE:
                pass

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_PATCH(self):
        self._dispatch("PATCH")

    # -- routing and errors --------------------------------------------------------------------------------

    def _route(self) -> tuple[str, dict[str, str] | None]:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path.startswith("/v1/models/"):  # one model: /v1/models/{id}
            return path, {"GET": "_model"}
        for route, methods in self.ROUTES.items():
            if path in (route, route.removeprefix("/v1")):
                return path, methods
        return path, None

    def _dispatch(self, method: str) -> None:
        self._t0 = time.perf_counter()
        self._headers_sent = False  # per request: a kept-alive connection brings several
        try:
            path, methods = self._route()
            self._check_access(method, path)
            if methods is None:
                raise api.ApiError(404, f"unknown path {path!r}; this server has GET /health, GET /v1/models, "
                                   "POST /v1/completions and POST /v1/chat/completions", "not_found")
            if method not in methods:
                allowed = ", ".join(methods)
                raise api.ApiError(405, f"{method} is not allowed on {path}; use {allowed}", "method_not_allowed")
            if method == "POST":
                check_json_body(self.headers.get("Content-Type"))
            getattr(self, methods[method])()
        except api.ApiError as e:
            try:
                self._send_json(e.status, e.body(), {"WWW-Authenticate": "Bearer"} if e.status == 401 else None)
            except GONE:
                self.close_connection = True
        except GONE:
            self.close_connection = True
            self.server.log(f"{self._request_name()}: the client went away")
        except Stopping:
            self.close_connection = True
        except Exception:  # a bug: the client gets a short message, the log the traceback
            self.server.log("".join(traceback.format_exc()))
            err = api.ApiError(500, "internal server error (the server log has the details)", "internal_error")
            if not getattr(self, "_headers_sent", False):
                try:
                    self._send_json(500, err.body())
                except GONE:
                    pass

    def _check_access(self, method: str, path: str) -> None:
        """guard.py's checks: Host, Origin, then the API key (all but GET /health need it)."""
        access, host = self.server.access, self.headers.get("Host")
        access.check_host(host)
        access.check_origin(self.headers.get("Origin"), host)
        if not (method == "GET" and path == "/health"):
            access.check_key(self.headers.get("Authorization"))

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (a malformed request line, an unsupported method) as JSON too."""
        status = HTTPStatus(code)
        if code == 501:  # a method no handler exists for (HEAD, OPTIONS, ...): a wrong method for any path
            status = HTTPStatus.METHOD_NOT_ALLOWED
        text = f"{message or status.phrase}" + (f": {explain}" if explain and code != 501 else "")
        if code == 501:
            text = f"{self.command} is not allowed; this server takes GET and POST"
        self.close_connection = True
        try:
            self._send_json(status.value, api.ApiError(status.value, text, status.phrase.lower().replace(" ", "_"))
                            .body())
        except GONE:
            pass

    def log_message(self, format, *args):  # http.server's request lines: ours are written by _send_json
        pass

    def log_request(self, code="-", size="-"):
        pass

    # -- writing -------------------------------------------------------------------------------------------

    def _start(self, status: int, content_type: str, length: int | None = None,
               headers: dict[str, str] | None = None) -> None:
        self.connection.settimeout(self.server.write_timeout)  # each blocking send gets this long
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            # http.server's default for a request line it could not parse (or "GET /"): it would then send
            # the body alone, with no status line; every client that may reach this server speaks HTTP/1.x
            self.request_version = "HTTP/1.0"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if length is not None:
            self.send_header("Content-Length", str(length))
        if content_type == "text/event-stream":
            self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self._headers_sent = True

    def _send_json(self, status: int, obj: dict, headers: dict[str, str] | None = None) -> None:
        data = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")  # a newline for terminals
        self._log_line(status, obj.get("error", {}).get("message") if status >= 400 else None)
        self._start(status, "application/json", len(data), headers)
        self._write(data)

    def _event(self, obj: dict | str) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
        self._write(f"data: {data}\n\n".encode("utf-8"))

    def _write(self, data: bytes) -> None:
        """Send in pieces, so that the write timeout measures a stall (no progress) rather than the time a
        large answer takes; raises TimeoutError (one of GONE) when the client stops reading."""
        view = memoryview(data)
        for i in range(0, len(view), WRITE_CHUNK):
            self.wfile.write(view[i:i + WRITE_CHUNK])

    def _request_name(self) -> str:
        """'METHOD /path' for the log, with control characters escaped and long paths cut (both come from
        the client); what there is when http.server refused the request line before parsing it."""
        command, path = getattr(self, "command", None), getattr(self, "path", None)
        if path is None:
            raw = getattr(self, "raw_requestline", b"") or b""
            line = raw.decode("iso-8859-1").rstrip("\r\n")
            return f"(request line {ascii(line[:MAX_LOGGED])})" if line else "(no request line)"
        path = ascii(path)[1:-1] if not path.isprintable() or not path.isascii() else path
        return f"{command} {path if len(path) <= MAX_LOGGED else path[:MAX_LOGGED] + '...'}"

    def _log_line(self, status: int, note: str | None = None) -> None:
        t0 = getattr(self, "_t0", None)  # unset when http.server refused the request before routing it
        took = f" {(time.perf_counter() - t0) * 1000:.0f} ms" if t0 is not None else ""
        self.server.log(f"{self._request_name()} {status}{took}" + (f": {note}" if note else ""))

    def _body(self) -> dict:
        length = self.headers.get("Content-Length")
        try:
            n = int(length) if length is not None else 0
        except ValueError:
            raise api.ApiError(400, f"bad Content-Length header {length!r}", "invalid_request") from None
        if n > api.MAX_BODY_BYTES:
            self.close_connection = True
            raise api.ApiError(413, f"the request body has {n} bytes; this server takes at most "
                               f"{api.MAX_BODY_BYTES}", "body_too_large")
        self._reader.restart()  # the body gets read_timeout seconds of its own
        try:
            raw = self.rfile.read(n) if n > 0 else b""
        except TimeoutError:
            self.close_connection = True
            raise api.ApiError(408, f"the request body ({n} bytes) did not arrive within "
                               f"{self.server.read_timeout:g} s", "request_timeout") from None
        return api.parse_body(raw)

    def _client_left(self) -> bool:
        """True when the client has closed its side: the request is read (one per connection), so a socket
        that turns readable can only be at end of file (or a reset)."""
        try:
            if not select.select([self.connection], [], [], 0)[0]:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- endpoints -----------------------------------------------------------------------------------------

    def _health(self) -> None:
        self._send_json(200, {"status": "ok"})

    def _models(self) -> None:
        e = self.server.engine
        self._send_json(200, {"object": "list", "data": [api.model_card(e.model_id, e.created)]})

    def _model(self) -> None:
        e = self.server.engine
        name = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if name != e.model_id:
            raise api.ApiError(404, f"unknown model {name!r}; this server has {e.model_id!r}", "model_not_found")
        self._send_json(200, api.model_card(e.model_id, e.created))

    def _completions(self) -> None:
        engine = self.server.engine
        req = api.parse_completion(self._body(), engine.defaults)
        with engine.lock:
            run = engine.complete(req)
            self._respond(run, req.common, "cmpl", chat=False)

    def _chat(self) -> None:
        engine = self.server.engine
        req = api.parse_chat(self._body(), engine.defaults)
        with engine.lock:
            run = engine.chat(req)
            self._respond(run, req.common, "chatcmpl", chat=True)

    def _respond(self, run: Run, common: api.Common, prefix: str, chat: bool) -> None:
        """Write the run as one JSON response or as an event stream; close it whatever happens."""
        engine = self.server.engine
        rid, created, model = api.new_id(prefix), int(time.time()), engine.model_id
        try:
            if not common.stream:
                pieces = []
                for piece in run:  # nothing is written until the end: watch the socket for a hang-up
                    pieces.append(piece)
                    if self._client_left():
                        raise ConnectionResetError("the client closed the connection")
                text = "".join(pieces)
                use = api.usage(run.prompt_tokens, run.completion_tokens)
                lp = run.take_logprobs()
                body = (api.chat_completion(rid, created, model, text, run.finish_reason, use, lp) if chat else
                        api.completion(rid, created, model, text, run.finish_reason, use, logprobs=lp))
                self._send_json(200, body)
                return
            self._start(200, "text/event-stream")
            if chat:
                self._event(api.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None))
            for piece in run:  # each chunk carries the logprobs of the tokens generated since the last one
                lp = run.take_logprobs(stream=True)
                self._event(api.chat_chunk(rid, created, model, {"content": piece}, None, logprobs=lp) if chat else
                            api.completion(rid, created, model, piece, None, None, chunk=True, logprobs=lp))
            lp = run.take_logprobs(stream=True)  # tokens whose text was held back (a stop string) or not shown
            self._event(api.chat_chunk(rid, created, model, {}, run.finish_reason, logprobs=lp) if chat else
                        api.completion(rid, created, model, "", run.finish_reason, None, chunk=True, logprobs=lp))
            if common.include_usage:
                use = api.usage(run.prompt_tokens, run.completion_tokens)
                self._event(api.chat_chunk(rid, created, model, None, None, use) if chat else
                            {"id": rid, "object": "text_completion", "created": created, "model": model,
                             "choices": [], "usage": use})
            self._event("[DONE]")
            self._log_line(200, f"streamed {run.completion_tokens} tokens, {run.finish_reason}")
        except GONE as e:
            why = (f" (it read nothing for {self.server.write_timeout:g} s)" if isinstance(e, TimeoutError) else "")
            self.server.log(f"{self._request_name()}: the client went away{why} after {run.completion_tokens} "
                            "tokens; generation stopped")
            self.close_connection = True
        except api.ApiError:
            raise
        except PowerInferError as e:  # the model failed mid-generation (non-finite logits, ...): say what
            self.server.log(f"{self._request_name()}: {e}")
            err = api.ApiError(500, str(e), "model_error")
            if not getattr(self, "_headers_sent", False):
                raise err from None
            self.close_connection = True
            try:  # a stream has sent its 200 already: an error event ends it, as OpenAI's streams do
                self._event(err.body())
            except GONE:
                pass
        finally:
            run.close()


def log_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
