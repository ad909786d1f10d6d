"""`powerinfer perplexity`: perplexity of a model over a text file in any sparse mode
(powerinfer_py.tools.perplexity)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from powerinfer_py.options import LoadOptions

from . import options as O
from .shell import model_path, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer perplexity -m demo --text benchmarks/data/evaluation.txt
  powerinfer perplexity -m gemma-270m.t40.gguf --text eval.txt --sparse threshold --sparsity 0.4 -c 512

The text is cut into windows of -c tokens (each starting from BOS with an empty cache); every text token is
scored once. Prints the perplexity, the mean negative log-likelihood and (sparse modes) the skipped fraction.
"""


def perplexity(
    ctx: typer.Context,
    model: str = typer.Option(..., "-m", "--model", help='GGUF or PWRI file, or "demo".'),
    text: Path = typer.Option(..., "--text", help="The text file (UTF-8) to score."),
    n_ctx: int = O.flag("n_ctx", default=512, min=2, help="Window size in tokens."),
    max_tokens: Optional[int] = typer.Option(None, "--tokens", min=1, help="Score at most this many tokens."),
    batch: int = typer.Option(64, "-b", "--batch", min=1, help="Tokens per forward pass."),
    threads: Optional[int] = O.flag("threads"),
    sparse: Optional[str] = O.flag("sparse"),
    sparsity: Optional[float] = O.flag("sparsity"),
    predictor_dtype: str = O.flag("predictor_dtype"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Perplexity of MODEL over a text file, in any sparse mode."""
    from powerinfer_py import load
    from powerinfer_py.errors import PowerInferError
    from powerinfer_py.tools.perplexity import perplexity as measure

    with user_errors():
        try:
            body = text.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise PowerInferError(f"{text}: not UTF-8 text ({e.reason})") from None
        with load(model_path(model), **O.values(LoadOptions, ctx.params)) as llm:
            result = measure(llm, body, ctx=n_ctx, batch=batch, max_tokens=max_tokens,
                             on_window=lambda i, nll: stderr.print(f"window {i}: nll {nll:.4f}", style="dim"))
            st = llm.sparsity_stats
            skipped = st.skipped_fraction if st is not None and st.tokens.any() else None
            up_read = st.up_read_fraction if st is not None else None  # two-stage threshold files
            mode = llm.sparse.mode
            wide = st.to_json() if st is not None and st.mode == "wide" and st.tokens.any() else None
            wide_lines = st.lines() if wide is not None else []
    out = result.to_json()
    out.update(sparse=mode, skipped_fraction=skipped, up_read_fraction=up_read)
    if wide is not None:
        out["wide"] = wide
    if as_json:
        print(json.dumps(out))
        return
    what = "of the projection weight bytes (model-wide)" if wide is not None else "of FFN neurons"
    extra = f", skipped {100 * skipped:.1f}% {what}" if skipped is not None and mode != "off" else ""
    if extra and up_read is not None:
        extra += f" ({100 * (1 - up_read):.1f}% of ffn_up rows: two stages)"
    print(f"perplexity {result.perplexity:.4f} (nll {result.nll:.5f}) over {result.n_tokens} tokens in "
          f"{result.n_windows} windows of {result.ctx}, sparse mode {mode}{extra}")
    for line in wide_lines:  # per layer and projection input
        print(line)
