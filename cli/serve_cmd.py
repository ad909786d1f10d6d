"""`powerinfer serve`: an OpenAI-compatible HTTP API on one model (powerinfer_py.serve). Parse, load, serve."""
from __future__ import annotations

from typing import List, Optional

import typer
from rich.markup import escape

from . import options as O
from .shell import EXIT_INTERRUPTED, fail, model_path, print_load_notes, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer serve -m demo
  powerinfer serve -m model.gguf --port 8000 -c 8192 --chat-template chatml
  POWERINFER_API_KEY=my-secret powerinfer serve -m demo --host 0.0.0.0    # other machines, with a key
  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}'

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions (stream: true for
Server-Sent Events). One request runs at a time; the others wait. The sampling options below are the
defaults for requests that leave a field out.

Access: POST bodies must be sent as Content-Type: application/json (415 otherwise). Requests whose Host
header is not this server's (localhost, 127.0.0.1, [::1], the --host address; any IP address when bound to
0.0.0.0) are refused with 403, and so are requests from a web page of another origin: a web site you visit
cannot use the model. With --api-key, every request but GET /health needs "Authorization: Bearer KEY" (what
OpenAI clients send as their api_key), and any Host is accepted.

Limits: a client has --timeout seconds (default 30) to send its request; a client that stops reading for
that long is dropped, which stops its generation and frees the model for the next request. At most
--max-connections connections (default 64) are served at once; more get a 503.
"""


def serve(
    ctx: typer.Context,
    model: str = O.MODEL,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface; "
                             "use --api-key then, or anyone who can reach the port can use the model)."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="TCP port (0: any free port)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="POWERINFER_API_KEY", show_default=False,
                                          metavar="KEY", help="Require 'Authorization: Bearer KEY' on every "
                                          "request but GET /health (401 otherwise). Default: $POWERINFER_API_KEY "
                                          "if set, else no key (prefer the variable: a command line is visible "
                                          "to other users of the machine)."),
    allow_host: Optional[List[str]] = typer.Option(None, "--allow-host", show_default=False, metavar="NAME",
                                                   help="Also accept requests whose Host header is NAME (a "
                                                   "name this machine is reached by; repeatable; '*': any "
                                                   "name, which lets web pages on other sites reach the "
                                                   "model through DNS rebinding)."),
    timeout: float = typer.Option(30.0, "--timeout", min=0.001, metavar="SECONDS", help="How long a client may "
                                  "take to send its request (headers, then body: 408 after that), and how long "
                                  "a client may stop reading its answer before it counts as gone."),
    max_connections: int = typer.Option(64, "--max-connections", min=1, metavar="N", help="Connections served "
                                        "at once (including those waiting for the model); more get a 503."),
    threads: Optional[int] = O.flag("threads"),
    n_ctx: Optional[int] = O.flag("n_ctx"),
    chat_template: Optional[str] = typer.Option(None, "--chat-template", "--template", help=O.TEMPLATE_HELP),
    temperature: float = O.flag("temperature"),
    top_k: int = O.flag("top_k"),
    top_p: float = O.flag("top_p"),
    min_p: float = O.flag("min_p"),
    repeat_penalty: float = O.flag("repeat_penalty"),
    repeat_last_n: int = O.flag("repeat_last_n"),
    frequency_penalty: float = O.flag("frequency_penalty"),
    presence_penalty: float = O.flag("presence_penalty"),
    sparse: Optional[str] = O.flag("sparse"),
    sparse_threshold: Optional[float] = O.flag("sparse_threshold"),
    sparsity: Optional[float] = O.flag("sparsity"),
    predictor_dtype: str = O.flag("predictor_dtype"),
    backend: str = O.flag("backend"),
    vram_budget: Optional[float] = O.flag("vram_budget"),
    no_mmap: bool = O.flag("use_mmap"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not log one line per request on stderr."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks of errors at start-up."),
) -> None:
    """Serve MODEL over HTTP with OpenAI's completions and chat completions API."""
    with user_errors(verbose):
        from powerinfer_py import load
        from powerinfer_py.serve import log_to_stderr, make_server, serve_forever
        from powerinfer_py.serve.guard import check_api_key

        try:  # before loading the model: a bad key is a typo to fix at once
            api_key = check_api_key(api_key)
        except ValueError as e:
            raise fail(str(e)) from None

        try:
            llm = load(model_path(model), **O.load_options(ctx.params).kwargs())
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED)
        idle = True
        try:
            print_load_notes(llm)
            defaults = O.sampling_params(ctx.params)  # for the fields a request leaves out
            server = make_server(llm, host, port, template=chat_template, defaults=defaults,
                                 log=None if quiet else log_to_stderr, timeout=timeout,
                                 max_connections=max_connections, allow_hosts=allow_host or (),
                                 api_key=api_key)
            _warn_if_exposed(server, host)
            e = server.engine
            stderr.print(f"serving [bold]{e.model_id}[/] ({llm.config.arch}, {e.template.name} template, context "
                         f"{llm.n_ctx}) at {server.url}/v1", highlight=False)
            stderr.print("[dim]Ctrl-C stops the server.[/]")
            idle = serve_forever(server)
            stderr.print("stopped")
        finally:
            if idle:  # never free the weights under a generation that did not stop in time
                llm.close()


def _warn_if_exposed(server, host: str) -> None:
    """A server other machines can reach: say so, more loudly without an API key."""
    if server.loopback_only:
        return
    where = escape(host) + (" (every interface)" if server.server_address[0] in ("0.0.0.0", "::") else "")
    port = server.server_address[1]
    if server.access.api_key is None:
        stderr.print(f"warning: listening on {where} without an API key: anyone who can reach port {port} can "
                     "use the model; --api-key KEY (or $POWERINFER_API_KEY) requires a key", style="yellow")
    else:
        stderr.print(f"warning: listening on {where}: requests need the API key, but plain HTTP carries it "
                     "and the answers unencrypted", style="yellow")
