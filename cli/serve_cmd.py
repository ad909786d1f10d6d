"""`powerinfer serve`: an OpenAI-compatible HTTP API on one model (powerinfer_py.serve). Parse, load, serve."""
from __future__ import annotations

from typing import Optional

import typer

from . import options as O
from .shell import EXIT_INTERRUPTED, model_path, print_load_notes, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer serve -m demo
  powerinfer serve -m model.gguf --port 8000 -c 8192 --chat-template chatml
  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}'

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions (stream: true for
Server-Sent Events). One request runs at a time; the others wait. The sampling options below are the
defaults for requests that leave a field out.
"""


def serve(
    ctx: typer.Context,
    model: str = O.MODEL,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface; the "
                             "API has no authentication)."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="TCP port (0: any free port)."),
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

        try:
            llm = load(model_path(model), **O.load_options(ctx.params).kwargs())
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED)
        idle = True
        try:
            print_load_notes(llm)
            defaults = O.sampling_params(ctx.params)  # for the fields a request leaves out
            server = make_server(llm, host, port, template=chat_template, defaults=defaults,
                                 log=None if quiet else log_to_stderr)
            e = server.engine
            stderr.print(f"serving [bold]{e.model_id}[/] ({llm.config.arch}, {e.template.name} template, context "
                         f"{llm.n_ctx}) at {server.url}/v1", highlight=False)
            stderr.print("[dim]Ctrl-C stops the server.[/]")
            idle = serve_forever(server)
            stderr.print("stopped")
        finally:
            if idle:  # never free the weights under a generation that did not stop in time
                llm.close()
