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
    model: str = O.MODEL,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface; the "
                             "API has no authentication)."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="TCP port (0: any free port)."),
    threads: Optional[int] = O.THREADS,
    ctx_size: Optional[int] = O.CTX_SIZE,
    chat_template: Optional[str] = typer.Option(None, "--chat-template", "--template", help=O.TEMPLATE_HELP),
    temp: float = O.TEMP,
    top_k: int = O.TOP_K,
    top_p: float = O.TOP_P,
    min_p: float = O.MIN_P,
    repeat_penalty: float = O.REPEAT_PENALTY,
    repeat_last_n: int = O.REPEAT_LAST_N,
    frequency_penalty: float = O.FREQUENCY_PENALTY,
    presence_penalty: float = O.PRESENCE_PENALTY,
    sparse: Optional[str] = O.SPARSE,
    sparse_threshold: Optional[float] = O.SPARSE_THRESHOLD,
    sparsity: Optional[float] = O.SPARSITY,
    backend: str = O.BACKEND,
    vram_budget: Optional[float] = O.VRAM_BUDGET,
    no_mmap: bool = O.NO_MMAP,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not log one line per request on stderr."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks of errors at start-up."),
) -> None:
    """Serve MODEL over HTTP with OpenAI's completions and chat completions API."""
    with user_errors(verbose):
        from powerinfer_py import load
        from powerinfer_py.sampler import SamplingParams
        from powerinfer_py.serve import log_to_stderr, make_server, serve_forever

        try:
            llm = load(model_path(model), threads=threads, n_ctx=ctx_size, sparse=sparse,
                       sparse_threshold=sparse_threshold, sparsity=sparsity, backend=backend,
                       vram_budget=vram_budget, use_mmap=not no_mmap)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED)
        idle = True
        try:
            print_load_notes(llm)
            defaults = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                                      repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                      frequency_penalty=frequency_penalty,
                                      presence_penalty=presence_penalty)
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
