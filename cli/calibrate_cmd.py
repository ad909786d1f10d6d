"""`powerinfer calibrate`: per-layer |act(gate)| cut-offs for threshold sparsity, written into a copy of the
model file (logic in powerinfer_py.tools.calibrate)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from . import options as O
from .shell import model_path, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer calibrate -m demo --sparsity 0.4 --text corpus.txt -o gemma-270m.t40.gguf
  powerinfer run -m gemma-270m.t40.gguf "Once upon a time" --sparse threshold -v
  powerinfer calibrate -m model.gguf --sparsity 0.5 -o model.t50.gguf      # text sampled from the model

Two stages by default: |act| times each neuron's scale picks the candidates whose ffn_up row is read (skipping
half as many rows as --sparsity, or --up-sparsity U of them), then the candidates with the smallest |act * up|
also count as zero, so that --sparsity of the neurons is skipped in all (their down rows too). --one-stage keeps
the single rule (the scaled |act| alone decides; the same fraction of up and down rows skipped, at a higher
perplexity cost). The copy holds every tensor of MODEL unchanged plus powerinfer.sparsity,
powerinfer.ffn_thresholds, powerinfer.ffn_threshold_quantiles (a run may ask for another --sparsity without
calibrating again), unless --plain powerinfer.ffn_neuron_scales.N per layer, and for two stages
powerinfer.up_sparsity, powerinfer.ffn_up_thresholds and powerinfer.ffn_up_threshold_quantiles.

  powerinfer calibrate -m demo --sparsity 0.4 --up-sparsity 0.3 --text corpus.txt -o gemma-270m.t40u30.gguf
  powerinfer calibrate -m demo --sparsity 0.3 --one-stage --text corpus.txt -o gemma-270m.t30.gguf

[bold]Model-wide sparsity[/] (--wide): --sparsity S in [0, 0.95] is then the fraction of the weight bytes of every
layer's q, k, v, o, gate, up and down projections not read per token. The copy stores those seven tensors
transposed (float types as they are, quantized ones as Q8 tiles: int8 codes with a scale per 32 x 32 tile) with
per-input cut-offs and tables (powerinfer.wide.*); --criterion auto measures plain |x|, WINA (|x| times the
weight column norms) and a greedy per-input allocation on the calibration text and keeps the one with the lowest
perplexity.

  powerinfer calibrate -m demo --wide --sparsity 0.4 --text corpus.txt -o gemma-270m.w40.gguf
  powerinfer run -m gemma-270m.w40.gguf "Once upon a time" -v --sparsity 0.25
"""


def calibrate(
    model: str = typer.Option(..., "-m", "--model", help='GGUF file of a SwiGLU/GeGLU model, or "demo".'),
    sparsity: float = typer.Option(..., "--sparsity", help="Fraction of FFN neurons to skip, in [0, 1)."),
    out: Path = typer.Option(..., "-o", "--output", help="The calibrated copy to write."),
    text: Optional[Path] = typer.Option(None, "--text", help="Calibration text file (UTF-8). Default: text "
                                        "sampled from the model itself."),
    tokens: int = typer.Option(1024, "--tokens", min=1, help="Calibration tokens at most."),
    ctx_size: int = typer.Option(256, "-c", "--ctx-size", min=2, help="Window size in tokens."),
    threads: Optional[int] = O.flag("threads"),
    plain: bool = typer.Option(False, "--plain", help="Cut-offs on |act(gate)| alone, without per-neuron scales "
                               "(the mean |up·x| of each neuron; with them the perplexity cost is lower)."),
    up_sparsity: Optional[float] = typer.Option(None, "--up-sparsity", help="Fraction of ffn_up rows the first "
                                                "stage skips, below --sparsity (default: half of it; docs/sparse.md)."),
    one_stage: bool = typer.Option(False, "--one-stage", help="One stage: the scaled |act(gate)| alone picks the "
                                   "computed neurons (up and down rows skipped alike; costs more perplexity)."),
    wide: bool = typer.Option(False, "--wide", help="Calibrate the model-wide mode (every projection's input "
                              "thresholded; --sparsity is the fraction of the layers' weight bytes skipped, at most 0.95)."),
    criterion: str = typer.Option("auto", "--criterion", help="--wide: auto, plain, wina or greedy (auto: the lowest "
                                  "perplexity on the calibration text)."),
    rotate: bool = typer.Option(False, "--rotate", help="--wide: store the FFN's normed input (ffn_in) rotated into "
                                "its principal directions (reads one n_embd x n_embd matrix more per layer; pays only "
                                "at high sparsities on the demo model, docs/sparse.md)."),
    as_json: bool = typer.Option(False, "--json", help="Print the thresholds as one JSON object."),
) -> None:
    """Calibrate threshold sparsity: run MODEL densely over text, pick per-layer cut-offs (on |act(gate)| times
    per-neuron scales, then by default on |act * up| among those) that skip the target fraction of neurons,
    write a copy of MODEL with them in its metadata. --wide: the model-wide mode (every projection)."""
    from powerinfer_py.tools.calibrate import calibrate as run_calibration
    from powerinfer_py.errors import PowerInferError

    with user_errors():
        body = None
        if text is not None:
            try:
                body = text.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise PowerInferError(f"{text}: not UTF-8 text ({e.reason})") from None
        if wide:
            if plain or one_stage or up_sparsity is not None:
                raise PowerInferError("--plain, --one-stage and --up-sparsity are options of the FFN threshold "
                                      "calibration, not of --wide (use --criterion)")
            from powerinfer_py.tools.wide_calibrate import calibrate_wide

            res = calibrate_wide(model_path(model), out, sparsity, text=body, n_tokens=tokens, ctx=ctx_size,
                                 threads=threads, on_progress=lambda m: stderr.print(m, style="dim"),
                                 criterion=criterion, rotate=rotate)
            _print_wide(res, as_json)
            return
        if criterion != "auto" or rotate:
            raise PowerInferError("--criterion and --rotate apply to --wide only")
        result = run_calibration(model_path(model), out, sparsity, text=body, n_tokens=tokens, ctx=ctx_size,
                                 threads=threads, on_progress=lambda m: stderr.print(m, style="dim"),
                                 scales=not plain, up_sparsity=up_sparsity, one_stage=one_stage)
    if as_json:
        print(json.dumps(result.to_json()))
        return
    print(f"calibrated {result.n_tokens} tokens ({result.text_source}) for sparsity {result.sparsity:g}: "
          f"{result.path}")
    if result.up_skipped is not None:  # two stages: the candidates' cut-off and the up rows they skip
        print(f"two stages: up rows skipped: {100 * sum(result.up_skipped) / len(result.up_skipped):.1f}% "
              f"(--up-sparsity {result.up_sparsity:g}); the thresholds below apply to |act * up| among the "
              "candidates (--one-stage: one rule)")
    print("layer  threshold  skipped on the text")
    for il, (t, s) in enumerate(zip(result.thresholds, result.skipped)):
        print(f"{il:5d}  {t:9.5f}  {100 * s:5.1f}%")


def _print_wide(res, as_json: bool) -> None:
    from powerinfer_py.layers.wide import INPUTS

    if as_json:
        print(json.dumps(res.to_json()))
        return
    print(f"calibrated {res.n_tokens} tokens ({res.text_source}) for model-wide sparsity {res.sparsity:g}, "
          f"criterion {res.criterion}: {res.path}")
    if res.selection:
        print("criteria (perplexity on " + f"{res.selection_tokens} calibration tokens): " +
              ", ".join(f"{k} {v:.3f}" for k, v in res.selection.items()))
    rot = (f", {res.rotation_bytes / 2**20:.1f} MiB of them the ffn_in rotations (read on every token)"
           if res.rotated else "")
    print(f"projections: {res.source_types} -> {res.stored_types}, {res.source_bpw:.2f} -> {res.stored_bpw:.2f} "
          f"bits per weight ({res.source_bytes / 2**20:.1f} -> {res.stored_bytes / 2**20:.1f} MiB{rot})")
    if res.stored_bytes > res.source_bytes:
        print(f"note: the transposed copy reads {res.stored_bytes / res.source_bytes:.2f}x the source's projection "
              "bytes at sparsity 0 (quantized sources are re-encoded as Q8 tiles, 8.03 bits per weight, plus any "
              "rotations); it reads fewer "
              f"only above a model-wide sparsity of {1 - res.source_bytes / res.stored_bytes:.2f}")
    print("layer  " + "  ".join(f"{n:>8}" for n in INPUTS) + "   (skipped on the text)")
    for il, row in enumerate(res.input_skipped):
        print(f"{il:5d}  " + "  ".join(f"{100 * v:7.1f}%" for v in row))
