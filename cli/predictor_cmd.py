"""`powerinfer train-predictor`: train per-layer activation predictors for a ReLU-family model and write them
into a PowerInfer (PWRI) file or a model_N.pt folder (powerinfer_py.tools.predictor_train / predictor_out).

Register with `app.command("train-predictor", epilog=predictor_cmd.EPILOG)(predictor_cmd.train_predictor)`."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from . import options as O
from .shell import fail, model_path, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer train-predictor -m relu-llama.gguf --text calib.txt -o relu-llama.powerinfer.gguf
  powerinfer train-predictor -m model.pwri --text calib.txt --rank 128 --recall 0.9 -o model-newpred.pwri
  powerinfer train-predictor -m model.gguf --text calib.txt --format pt -o predictor/

The model runs densely over the text; per layer, fc2 · relu(fc1 · p) is trained on the predictor input p
(the residual before ffn_norm) to flag the neurons with a non-zero activation. Neuron i counts as predicted
active when its logit is >= 0 (the threshold written into the file). ReLU-family FFNs are labelled by their
exact zeros; SwiGLU/GeGLU models (qwen2, gemma3, llama-3) by |act(gate)| >= the cut-offs of a file calibrated
with `powerinfer calibrate`, and the trained file then skips the gate too in `--sparse predictor` mode:

  powerinfer calibrate -m demo --sparsity 0.5 -o gemma.cal.gguf
  powerinfer train-predictor -m gemma.cal.gguf --text calib.txt -o gemma.pwri
"""


def train_predictor(
    model: str = typer.Option(..., "-m", "--model", help="GGUF or PWRI file of a ReLU-family model."),
    out: Path = typer.Option(..., "-o", "--out", help="Output PWRI file, or folder with --format pt."),
    text: Optional[Path] = typer.Option(None, "--text", help="Calibration text file (UTF-8). Default: text "
                                        "sampled from the model itself."),
    tokens: Optional[int] = typer.Option(None, "--tokens", min=2, help="Train on at most this many tokens "
                                         "[default: the whole text; 1024 when sampling]."),
    rank: str = typer.Option("auto", "--rank", help='Predictor rank per layer, or "auto": the smallest of '
                                                    '16, 32, 64, ... that reaches --recall on held-out tokens.'),
    max_rank: Optional[int] = typer.Option(None, "--max-rank", min=1, help="Largest rank --rank auto tries."),
    sparsity: Optional[float] = typer.Option(None, "--sparsity", min=0.0, max=0.99,
                                             help="SwiGLU/GeGLU models (calibrated with `powerinfer calibrate`): "
                                                  "label neurons by the cut-offs of this sparsity [default: the "
                                                  "file's calibrated one]."),
    recall: float = typer.Option(0.95, "--recall", min=0.0, max=1.0, help="Recall target (held-out tokens)."),
    fmt: str = typer.Option("pwri", "--format", help="pwri (a PowerInfer model file) or pt (model_N.pt files)."),
    fc_type: str = typer.Option("f16", "--fc-type", help="Type of the fc1/fc2 tensors: f16 or f32."),
    epochs: int = typer.Option(20, "--epochs", min=1, help="Passes over the training tokens."),
    batch: int = typer.Option(128, "--batch", min=1, help="Tokens per optimizer step."),
    lr: float = typer.Option(3e-3, "--lr", min=0.0, help="Adam learning rate."),
    balance: float = typer.Option(1.0, "--balance", min=0.0, help="Weight of active neurons in the loss, "
                                  "relative to the layer's inactive/active ratio (more: higher recall)."),
    backend: str = typer.Option("auto", "--backend", help="auto (torch if installed, else numpy), numpy, torch."),
    ctx: int = typer.Option(512, "--ctx", min=2, help="Tokens per chunk (each chunk starts a fresh context)."),
    seed: int = typer.Option(0, "--seed", help="Seed for initialisation, batches and sampled text."),
    threads: Optional[int] = O.flag("threads"),
    as_json: bool = typer.Option(False, "--json", help="Print the per-layer results as one JSON object."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks."),
) -> None:
    """Train PowerInfer activation predictors fc2(relu(fc1(p))) per layer and write them out."""
    if fmt not in ("pwri", "pt"):
        raise fail(f"--format must be pwri or pt, got {fmt!r}")
    with user_errors(verbose):
        from powerinfer_py import load
        from powerinfer_py.layers.moe import require_dense_ffn
        from powerinfer_py.tools.observe import calibration_tokens
        from powerinfer_py.tools.predictor_fit import FitConfig, resolve_backend
        from powerinfer_py.tools.predictor_out import write_pt, write_pwri
        from powerinfer_py.tools.predictor_train import collect, label_cuts, parse_rank, train

        the_rank = parse_rank(rank)
        content = text.read_text(encoding="utf-8") if text is not None else None
        path = model_path(model)
        cfg = FitConfig(epochs=epochs, batch=batch, lr=lr, balance=balance, recall_target=recall, seed=seed,
                        backend=resolve_backend(backend), threads=threads)
        t0 = time.perf_counter()
        with load(path, threads=threads, sparse="off") as llm:
            require_dense_ffn(llm.config, "train-predictor")
            cuts = label_cuts(llm.config, sparsity, model)
            if cuts is not None:
                stderr.print(f"{llm.config.arch}: no exact zeros; a neuron counts as active where |act(gate)| >= the "
                             f"layer's calibrated cut-off ({min(cuts):.3g} .. {max(cuts):.3g})")
            if content is None:
                stderr.print(f"no --text: sampling {tokens or 1024} calibration tokens from the model itself "
                             f"(temperature 0.8, seed {seed})")
            cal = calibration_tokens(llm, content, tokens, seed=seed)
            data = collect(llm, cal.ids, ctx=ctx, sparsity=sparsity)
        n_tok = sum(len(p) for p in data[0].p_parts)
        stderr.print(f"collected {n_tok} tokens x {len(data)} layers in {time.perf_counter() - t0:.1f} s; "
                     f"training with {cfg.backend}, rank {the_rank}, recall target {recall:g}")
        if not as_json:
            print("layer  rank  recall  precision  pred.sparsity  true sparsity  epoch")
        t1 = time.perf_counter()

        def done(res) -> None:
            m = res.metrics
            if not as_json:
                print(f"{res.layer:5d}  {res.predictor.rank:4d}  {m.recall:6.3f}  {m.precision:9.3f}  "
                      f"{m.predicted_sparsity:13.3f}  {m.true_sparsity:13.3f}  {res.predictor.epoch:5d}", flush=True)

        results = train(data, the_rank, cfg, max_rank=max_rank, layer_done=done)
        train_s = time.perf_counter() - t1
        preds = [r.predictor for r in results]
        if fmt == "pt":
            written = write_pt(out, preds, threshold=cfg.threshold, fc_type=fc_type, force=force)
        else:
            written = write_pwri(path, preds, out, threshold=cfg.threshold, fc_type=fc_type, force=force)
        _report(results, n_tok, train_s, as_json)
        stderr.print(f"wrote {escape(str(written))} (threshold {cfg.threshold:g}: active iff logit >= it)")


def _report(results, n_tok: int, train_s: float, as_json: bool) -> None:
    ms = [r.metrics for r in results]
    mean = {k: sum(getattr(m, k) for m in ms) / len(ms)
            for k in ("recall", "precision", "predicted_sparsity", "true_sparsity")}
    if as_json:
        layers = [{"layer": r.layer, "rank": r.predictor.rank, "epoch": r.predictor.epoch,
                   **{k: getattr(r.metrics, k) for k in mean},
                   "tried": [{"rank": rk, "recall": m.recall, "predicted_sparsity": m.predicted_sparsity}
                             for rk, m in r.tried]} for r in results]
        print(json.dumps({"tokens": n_tok, "train_s": train_s, "mean": mean, "layers": layers}))
        return
    print(f"mean   {'':4}  {mean['recall']:6.3f}  {mean['precision']:9.3f}  {mean['predicted_sparsity']:13.3f}  "
          f"{mean['true_sparsity']:13.3f}   (held-out tokens; trained in {train_s:.1f} s)")
    sys.stdout.flush()
