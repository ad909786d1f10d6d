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
"""
from __future__ import annotations

import json
import select
import socket
import sys
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from ..errors import PowerInferError
from . import api
from .engine import Engine, Run, Stopping

Log = Callable[[str], None]
GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class Server(ThreadingHTTPServer):
    """An HTTP server bound to (host, port) that serves `engine`; port 0 picks a free port (see .url)."""
    daemon_threads = True       # a request thread never keeps the process alive after Ctrl-C
    allow_reuse_address = True  # a restart right after a stop can bind the same port

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 8080, log: Log | None = None):
        self.engine = engine
        self.log = log or (lambda line: None)
        super().__init__((host, port), Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"


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
            if methods is None:
                raise api.ApiError(404, f"unknown path {path!r}; this server has GET /health, GET /v1/models, "
                                   "POST /v1/completions and POST /v1/chat/completions", "not_found")
            if method not in methods:
                allowed = ", ".join(methods)
                raise api.ApiError(405, f"{method} is not allowed on {path}; use {allowed}", "method_not_allowed")
            getattr(self, methods[method])()
        except api.ApiError as e:
            try:
                self._send_json(e.status, e.body())
            except GONE:
                self.close_connection = True
        except GONE:
            self.close_connection = True
            self.server.log(f"{self.command} {self.path}: the client went away")
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

    def _start(self, status: int, content_type: str, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if length is not None:
            self.send_header("Content-Length", str(length))
        if content_type == "text/event-stream":
            self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self._headers_sent = True

    def _send_json(self, status: int, obj: dict) -> None:
        data = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")  # a newline for terminals
        self._log_line(status, obj.get("error", {}).get("message") if status >= 400 else None)
        self._start(status, "application/json", len(data))
        self.wfile.write(data)

    def _event(self, obj: dict | str) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
        self.wfile.write(f"data: {data}\n\n".encode("utf-8"))
        self.wfile.flush()

    def _log_line(self, status: int, note: str | None = None) -> None:
        t0 = getattr(self, "_t0", None)  # unset when http.server refused the request before routing it
        took = f" {(time.perf_counter() - t0) * 1000:.0f} ms" if t0 is not None else ""
        self.server.log(f"{self.command} {self.path} {status}{took}" + (f": {note}" if note else ""))

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
        return api.parse_body(self.rfile.read(n) if n > 0 else b"")

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
        except GONE:
            self.server.log(f"{self.command} {self.path}: the client went away after {run.completion_tokens} "
                            "tokens; generation stopped")
            self.close_connection = True
        except api.ApiError:
            raise
        except PowerInferError as e:  # the model failed mid-generation (non-finite logits, ...): say what
            self.server.log(f"{self.command} {self.path}: {e}")
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
