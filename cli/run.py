"""`powerinfer run`: load a model, generate from one prompt, stream the text (or print one JSON object)."""
from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import List, Optional

import typer

from powerinfer_py.errors import PowerInferError
from powerinfer_py.options import LoadOptions, SamplingParams

from . import options as O
from .shell import EXIT_INTERRUPTED, model_path, print_load_notes, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer run -m demo "The capital of France is" -n 32
  powerinfer run -m demo -p "The capital of France is" -n 32 --stop "\\n"
  powerinfer run -m model.gguf -f prompt.txt -n 256
  powerinfer run -m model.gguf "Once upon a time" --temp 0.8 --top-p 0.95 --seed 42
  echo "Write a haiku about the sea." | powerinfer run -m model.gguf - -n 64
  powerinfer run -m model.gguf "2 + 2 =" -n 8 --json
  powerinfer run -m model.powerinfer.gguf "Once upon a time" --sparse exact -v
  powerinfer run -m model.powerinfer.gguf "Once upon a time" --sparse-threshold 0.2
  powerinfer run -m calibrated.gguf "Once upon a time" --sparse threshold --sparsity 0.4 -v
"""


def run(
    ctx: typer.Context,
    prompt: Optional[str] = typer.Argument(None, metavar="PROMPT", show_default=False,
                                           help='The prompt text; "-" reads it from standard input. Or give it '
                                                'with -p or -f.'),
    model: str = O.MODEL,
    prompt_opt: Optional[str] = typer.Option(None, "-p", "--prompt", show_default=False, metavar="TEXT",
                                             help="The prompt text (instead of PROMPT, as llama.cpp takes it)."),
    prompt_file: Optional[str] = typer.Option(None, "-f", "--file", show_default=False, metavar="FILE",
                                              help='Read the prompt from this UTF-8 text file ("-": standard '
                                                   "input); one final line break is dropped (as llama.cpp's -f "
                                                   "drops a final newline)."),
    stop: Optional[List[str]] = O.flag("stop"),
    max_tokens: int = O.flag("max_tokens"),
    temperature: float = O.flag("temperature"),
    top_k: int = O.flag("top_k"),
    top_p: float = O.flag("top_p"),
    min_p: float = O.flag("min_p"),
    repeat_penalty: float = O.flag("repeat_penalty"),
    repeat_last_n: int = O.flag("repeat_last_n"),
    frequency_penalty: float = O.flag("frequency_penalty"),
    presence_penalty: float = O.flag("presence_penalty"),
    seed: Optional[int] = O.flag("seed"),
    threads: Optional[int] = O.flag("threads"),
    n_ctx: Optional[int] = O.flag("n_ctx"),
    sparse: Optional[str] = O.flag("sparse"),
    sparsity: Optional[float] = O.flag("sparsity"),
    sparse_threshold: Optional[float] = O.flag("sparse_threshold"),
    predictor_dtype: str = O.flag("predictor_dtype"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming."),
    backend: str = O.flag("backend"),
    vram_budget: Optional[float] = O.flag("vram_budget"),
    no_mmap: bool = O.flag("use_mmap"),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="Show loading details, per-layer active neurons and tracebacks."),
) -> None:
    """Generate text from PROMPT and stream it to stdout; timings go to stderr."""
    sources = [given for given in (prompt, prompt_opt, prompt_file) if given is not None]
    if len(sources) != 1:
        raise typer.BadParameter("give the prompt once: as PROMPT, with -p/--prompt TEXT or with -f/--file FILE"
                                 if sources else "no prompt: give PROMPT, -p/--prompt TEXT or -f/--file FILE "
                                 '("-" reads standard input)', param_hint="PROMPT")
    stops = [unescape_stop(s) for s in stop or ()]
    if any(not s for s in stops):
        raise typer.BadParameter("a stop string cannot be empty", param_hint="--stop")
    with user_errors(verbose):
        try:
            text = read_prompt_file(prompt_file) if prompt_file is not None else (
                sys.stdin.read() if sources[0] == "-" else sources[0])
            code = _run(text, model, as_json, verbose, O.load_options(ctx.params),
                        O.sampling_params(ctx.params, stop=tuple(stops)))
        except KeyboardInterrupt:  # Ctrl-C while loading: nothing generated yet
            code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        stderr.print("interrupted")
        raise typer.Exit(code)


STOP_ESCAPES = {"\\n": "\n", "\\t": "\t", "\\\\": "\\"}


def unescape_stop(value: str) -> str:
    """--stop's text with \\n, \\t and \\\\ turned into a newline, a tab and a backslash (a shell passes
    "\\n" as two characters); any other backslash stays as it is."""
    out, i = [], 0
    while i < len(value):
        pair = value[i:i + 2]
        if pair in STOP_ESCAPES:
            out.append(STOP_ESCAPES[pair])
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def read_prompt_file(name: str) -> str:
    """The prompt in file `name` ("-": standard input), without one final newline (an editor's)."""
    if name == "-":
        text = sys.stdin.read()
    else:
        path = Path(name)
        if path.is_dir():
            raise PowerInferError(f"prompt file {name} is a directory")
        data = path.read_bytes()  # FileNotFoundError / PermissionError: a one-line error (user_errors)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PowerInferError(f"prompt file {name} is not UTF-8 text (byte {e.start}: "
                                  f"0x{data[e.start]:02x})") from None
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def _run(text: str, model: str, as_json: bool, verbose: bool, load_opts: LoadOptions,
         sampling: SamplingParams) -> int:
    """Load, generate from the prompt text (sampling: with max_tokens and the stop strings, which end the text
    where they first appear and are not printed), print. Returns 0, or EXIT_INTERRUPTED when Ctrl-C stopped
    the generation."""
    from powerinfer_py import load

    path = model_path(model)
    t0 = time.perf_counter()
    llm = load(path, **load_opts.kwargs())
    load_s = time.perf_counter() - t0
    if verbose:
        _print_load(llm, path, load_s)
    print_load_notes(llm, verbose)
    stream = llm.stream(text, sampling)
    tokens, pieces, interrupted = [], [], False
    try:
        for piece in stream:
            tokens.extend(piece.tokens)
            pieces.append(piece.text)
            if not as_json:
                sys.stdout.write(piece.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        interrupted = True
    pieces.append(stream.close())  # what was held back when Ctrl-C came ("" when the stream ended)
    stats = stream.gen.stats
    reason = "interrupted" if interrupted else stats.stop_reason
    if as_json:
        result = _json_result("".join(pieces), tokens, stats, reason, load_s)
        result["sparse"] = _sparsity_json(llm)
        print(json.dumps(result, ensure_ascii=False))
    else:
        sys.stdout.write(pieces[-1] + "\n")
        sys.stdout.flush()
        _print_timings(stats, reason)
        if verbose:
            _print_sparsity(llm)
            for line in (llm.backend.lines()[1:] if llm.backend is not None else []):
                stderr.print(line, style="dim")
    if reason == "context":
        stderr.print(f"context full: the context window of {llm.n_ctx} tokens is used up (prompt "
                     f"{stats.n_prompt} + generated {stats.n_gen}); a larger -c/--ctx-size leaves more room")
    llm.close()
    return EXIT_INTERRUPTED if interrupted else 0


def _json_result(text: str, tokens: list[int], stats, reason: str, load_s: float) -> dict:
    return {
        "text": text,
        "tokens": [int(t) for t in tokens],
        "n_prompt_tokens": stats.n_prompt,
        "n_tokens": stats.n_gen,
        "stop_reason": reason,
        "timings": {
            "load_s": load_s,
            "prompt_s": stats.prompt_s,
            "decode_s": stats.decode_s,
            "prompt_tok_s": stats.prompt_tok_s,
            "decode_tok_s": stats.decode_tok_s,
        },
    }


def _sparsity_json(llm) -> dict:
    """Sparse mode, threshold (predictor mode: and the predictor dtype) and (ReLU-family models) the per-layer fraction of active neurons per token."""
    out = {"mode": llm.sparse.mode, "threshold": llm.sparse.threshold}
    if llm.sparse.mode == "predictor":
        out["predictor_dtype"] = llm.sparse.predictor
    if llm.sparse.mode in ("threshold", "wide"):
        out["sparsity"] = llm.sparse.sparsity
    st = llm.sparsity_stats
    if st is not None and st.tokens.any():
        out["active_fraction"] = st.mean_fraction
        out["layers"] = st.fractions
        if st.mode == "wide":  # per layer and projection input (layers/wide.py)
            out["wide"] = st.to_json()
    return out


def _print_sparsity(llm) -> None:
    st = llm.sparsity_stats
    mode = f"sparse mode: {llm.sparse.mode}"
    if llm.sparse.mode == "predictor":
        mode += f", threshold {llm.sparse.threshold:g}, predictor dtype {llm.sparse.predictor}"
    if llm.sparse.mode in ("threshold", "wide"):
        mode += f", target sparsity {llm.sparse.sparsity:g}"
    if llm.config.n_expert:
        from powerinfer_py.layers.moe import usage_note

        stderr.print(f"{mode} ({usage_note(llm.config, llm.model.ffns)})", style="dim")
        return
    if st is None or not st.tokens.any():
        stderr.print(mode + " (no ReLU-family FFN: nothing to count)" if st is None else mode, style="dim")
        return
    if st.mode == "wide":  # the model-wide mode: bytes skipped per layer and projection input
        stderr.print(mode, style="dim")
        for line in st.lines():
            stderr.print(line, style="dim")
        return
    what = {"predictor": "predicted active", "threshold": "computed (above the cut-off)"}.get(st.mode, "non-zero")
    up = st.up_read_fraction
    up_note = f" (two stages: ffn_up rows read {100 * up:.1f}%)" if up is not None else ""
    stderr.print(f"{mode}; {what} neurons per token: {100 * st.mean_fraction:.1f}% of {st.n_ff}{up_note}", style="dim")
    per_layer = " ".join(f"{il}:{100 * f:.1f}" for il, f in enumerate(st.fractions))
    stderr.print(f"active % per layer: {per_layer}", style="dim")


def _print_timings(stats, reason: str) -> None:
    stderr.print(f"prompt: {stats.n_prompt} tokens, {stats.prompt_tok_s:.1f} tok/s | "
                 f"decode: {stats.n_gen} tokens, {stats.decode_tok_s:.1f} tok/s | "
                 f"stop: {reason}", style="dim")


def _print_load(llm, path, load_s: float) -> None:
    c = llm.config
    stderr.print(f"model: {path} ({c.arch}, {c.n_layer} layers, d {c.n_embd}, vocab {c.n_vocab}); "
                 f"loaded in {load_s:.2f} s", style="dim")
    counts = Counter((conv.from_type.name, conv.to_type.name) for conv in llm.conversions)
    for (src, dst), n in sorted(counts.items()):
        stderr.print(f"converted at load: {n} tensors {src} -> {dst}", style="dim")
