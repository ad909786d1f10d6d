"""`powerinfer calibrate`: per-layer |act(gate)| cut-offs for threshold sparsity, written into a copy of the
model file (logic in powerinfer_py.calibrate)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .shell import model_path, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer calibrate -m demo --sparsity 0.4 --text corpus.txt -o gemma-270m.t40.gguf
  powerinfer run -m gemma-270m.t40.gguf "Once upon a time" --sparse threshold -v
  powerinfer calibrate -m model.gguf --sparsity 0.5 -o model.t50.gguf      # text sampled from the model

The copy holds every tensor of MODEL unchanged plus powerinfer.sparsity, powerinfer.ffn_thresholds,
powerinfer.ffn_threshold_quantiles (a run may ask for another --sparsity without calibrating again) and, unless
--plain, powerinfer.ffn_neuron_scales.N per layer (the cut-offs apply to |act| times each neuron's scale).
With --up-sparsity U: powerinfer.up_sparsity and powerinfer.ffn_up_thresholds (candidates whose up row is read),
and the cut-offs apply to |act * up| among them (no quantile table: the file runs at its one --sparsity).

  powerinfer calibrate -m demo --sparsity 0.4 --up-sparsity 0.3 --text corpus.txt -o gemma-270m.t40u30.gguf
"""


def calibrate(
    model: str = typer.Option(..., "-m", "--model", help='GGUF file of a SwiGLU/GeGLU model, or "demo".'),
    sparsity: float = typer.Option(..., "--sparsity", help="Fraction of FFN neurons to skip, in [0, 1)."),
    out: Path = typer.Option(..., "-o", "--output", help="The calibrated copy to write."),
    text: Optional[Path] = typer.Option(None, "--text", help="Calibration text file (UTF-8). Default: text "
                                        "sampled from the model itself."),
    tokens: int = typer.Option(1024, "--tokens", min=1, help="Calibration tokens at most."),
    ctx_size: int = typer.Option(256, "-c", "--ctx-size", min=2, help="Window size in tokens."),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", min=1,
                                          help="CPU threads (default: every CPU this process may use)."),
    plain: bool = typer.Option(False, "--plain", help="Cut-offs on |act(gate)| alone, without per-neuron scales "
                               "(the mean |up·x| of each neuron; with them the perplexity cost is lower)."),
    up_sparsity: Optional[float] = typer.Option(None, "--up-sparsity", help="Two stages: skip this fraction of "
                                                "ffn_up rows by the score, then keep the candidates with the "
                                                "largest |act * up| (below --sparsity; README)."),
    as_json: bool = typer.Option(False, "--json", help="Print the thresholds as one JSON object."),
) -> None:
    """Calibrate threshold sparsity: run MODEL densely over text, pick per-layer cut-offs on |act(gate)| times
    per-neuron scales that skip the target fraction of neurons, write a copy of MODEL with them in its
    metadata."""
    from powerinfer_py.calibrate import calibrate as run_calibration
    from powerinfer_py.errors import PowerInferError

    with user_errors():
        body = None
        if text is not None:
            try:
                body = text.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise PowerInferError(f"{text}: not UTF-8 text ({e.reason})") from None
        result = run_calibration(model_path(model), out, sparsity, text=body, n_tokens=tokens, ctx=ctx_size,
                                 threads=threads, on_progress=lambda m: stderr.print(m, style="dim"),
                                 scales=not plain, up_sparsity=up_sparsity)
    if as_json:
        print(json.dumps(result.to_json()))
        return
    print(f"calibrated {result.n_tokens} tokens ({result.text_source}) for sparsity {result.sparsity:g}: "
          f"{result.path}")
    if result.up_skipped is not None:  # two stages: the candidates' cut-off and the up rows they skip
        print(f"up rows skipped: {100 * sum(result.up_skipped) / len(result.up_skipped):.1f}% (--up-sparsity "
              f"{result.up_sparsity:g}); the thresholds below apply to |act * up| among the candidates")
    print("layer  threshold  skipped on the text")
    for il, (t, s) in enumerate(zip(result.thresholds, result.skipped)):
        print(f"{il:5d}  {t:9.5f}  {100 * s:5.1f}%")
