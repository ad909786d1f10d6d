"""An OpenAI-compatible HTTP server on one loaded model, with the standard library only.

    llm = powerinfer_py.load("model.gguf")
    server = make_server(llm, port=0)        # port 0: a free port; server.url says which
    serve_forever(server)                    # until Ctrl-C (KeyboardInterrupt), then a clean stop

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions (api.py says which
fields). The model serves one request at a time; the others wait (engine.py). http.py is the HTTP side, with
its timeouts and connection cap; guard.py the checks on who may send requests (Host, Origin, Content-Type,
the optional API key).
"""
from __future__ import annotations

import errno
import math

from ..errors import PowerInferError
from ..sampler import SamplingParams
from .api import ApiError
from .engine import Engine
from .guard import check_api_key
from .http import MAX_CONNECTIONS, TIMEOUT_S, Log, Server, log_to_stderr

SHUTDOWN_WAIT_S = 30.0  # how long a stop waits for the request in progress to notice it


def make_server(llm, host: str = "127.0.0.1", port: int = 8080, *, template: str | None = None,
                defaults: SamplingParams | None = None, log: Log | None = None, timeout: float = TIMEOUT_S,
                max_connections: int = MAX_CONNECTIONS, allow_hosts=(), api_key: str | None = None,
                read_timeout: float | None = None, write_timeout: float | None = None) -> Server:
    """Bind a server for `llm` (not yet serving). template: a chat template name as in `powerinfer chat
    --template` (default: the model's own). defaults: sampling for the fields a request leaves out.
    timeout: seconds a client may take to send its request, and may leave a write to it blocked (read_timeout
    and write_timeout set them apart); max_connections: connections served at once (more get a 503);
    allow_hosts: Host names accepted besides this server's own ("*": any); api_key: required as
    `Authorization: Bearer KEY` (see guard.py).
    Raises PowerInferError when the address cannot be bound (in use, not an address of this machine) or an
    option is out of range."""
    try:
        key = check_api_key(api_key)
    except ValueError as e:
        raise PowerInferError(str(e)) from None
    if not (timeout > 0 and math.isfinite(timeout)):
        raise PowerInferError(f"the timeout must be a positive, finite number of seconds, got {timeout}")
    if max_connections < 1:
        raise PowerInferError(f"max_connections must be at least 1, got {max_connections}")
    engine = Engine(llm, template, defaults)
    try:
        return Server(engine, host, port, log, read_timeout=read_timeout or timeout,
                      write_timeout=write_timeout or timeout, max_connections=max_connections,
                      allow_hosts=allow_hosts, api_key=key)
    except ValueError as e:  # read_timeout / write_timeout out of range
        raise PowerInferError(str(e)) from None
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise PowerInferError(f"port {port} on {host} is in use; choose another with --port") from None
        raise PowerInferError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def serve_forever(server: Server) -> bool:
    """Serve until KeyboardInterrupt (Ctrl-C) or server.shutdown(); then stop a generation in progress and
    close the socket. Returns True when the model is idle afterwards (safe to close the LLM)."""
    try:
        server.serve_forever(poll_interval=0.25)
    except KeyboardInterrupt:
        pass
    finally:
        server.engine.stopping.set()  # a run in progress stops at its next token
        server.server_close()
    try:
        return server.engine.lock.acquire(timeout=SHUTDOWN_WAIT_S)  # kept: no request may start after this
    except KeyboardInterrupt:  # a second Ctrl-C: leave without waiting (the caller must not free the model)
        return False


__all__ = ["ApiError", "Engine", "Server", "log_to_stderr", "make_server", "serve_forever"]
