"""`powerinfer info`: what a model file holds, from its header alone (nothing is loaded or dequantized)."""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from . import options as O
from .shell import model_path, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer info demo
  powerinfer info model.gguf
  powerinfer info model.gguf --json
  powerinfer info -m calibrated.gguf      (-m as in run/chat/bench; shows a threshold calibration too)
  powerinfer info model.powerinfer.gguf --verbose     (also runs it briefly: active neurons per layer)
"""

_CONFIG_ROWS = (  # (label, ModelConfig field) shown in the table, in this order
    ("vocabulary", "n_vocab"), ("layers", "n_layer"), ("embedding dim", "n_embd"), ("FFN dim", "n_ff"),
    ("heads / KV heads", None), ("head dim", "head_dim"), ("trained context", "n_ctx_train"),
    ("RoPE base", "rope_freq_base"), ("RoPE dims", "n_rot"), ("sliding window", "sliding_window"), ("tied output", "tied_output"),
)


def info(
    model: Optional[str] = typer.Argument(None, metavar="MODEL", help='GGUF or PWRI file, or "demo" (Gemma 3 270M).'),
    model_opt: Optional[str] = typer.Option(None, "-m", "--model", metavar="MODEL",
                                            help="The same as MODEL (as run, chat and bench spell it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the facts as one JSON object."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also load the model and run a short sample "
                                 "text, to measure the fraction of FFN neurons active per layer."),
    threads: Optional[int] = O.flag("threads", help="CPU threads for --verbose."),
) -> None:
    """Describe a model file: architecture, dimensions, tensor types, sparsity, and what loading converts."""
    from powerinfer_py.tools.info import measure_activity, model_info

    if (model is None) == (model_opt is None):
        raise typer.BadParameter("give the model once: `powerinfer info MODEL` or `powerinfer info -m MODEL`")
    with user_errors(verbose):
        path = model_path(model if model is not None else model_opt)
        facts = _printable(model_info(path))
        if verbose and facts["runnable"]:
            facts["activity"] = measure_activity(path, threads=threads)
    if as_json:
        print(json.dumps(facts, indent=2))
        return
    Console(highlight=False).print(_table(facts))


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7f]}
_CONTROL_CHARS = frozenset(map(chr, _CONTROL))


def _printable(value):
    """Strings of a damaged file can hold bytes that are not UTF-8 (kept as surrogates by the reader) or control
    characters: shown as \\xNN escapes rather than written to the terminal raw."""
    if isinstance(value, str):
        text = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return text.translate(_CONTROL) if any(c in _CONTROL_CHARS for c in text) else text
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_printable(v) for v in value)
    return value


def _size(n_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n_bytes < 1024 or unit == "GiB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    return str(n_bytes)


def _calibration_text(cal: dict) -> str:
    """One line for a threshold-calibrated file: what it skips and how to run it."""
    if cal["up_sparsity"] is not None:
        what = (f"{100 * cal['sparsity']:.0f}% of FFN neurons zeroed, {100 * cal['up_sparsity']:.0f}% of ffn_up rows "
                "skipped (two stages)")
    else:
        what = f"{100 * cal['sparsity']:.0f}% of FFN neurons skipped"
    how = ["scores scaled per neuron" if cal["neuron_scales"] else "plain |act| scores"]
    if cal["other_sparsities"]:
        how.append("--sparsity may ask for another fraction")
    return f"{what}; {', '.join(how)}; run with --sparse threshold"


def _wide_text(w: dict) -> str:
    """One line for a wide-calibrated file: its target, how the inputs were scored, what --sparsity may ask."""
    parts = [f"target {w['sparsity']:g} of the projection weight bytes skipped per token",
             f"criterion {w['criterion'] or '?'}"]
    if w["rotated"]:
        parts.append(f"rotated inputs: {', '.join(w['rotated'])}")
    parts.append("--sparsity may ask for another fraction" if w["other_sparsities"] else "one sparsity only")
    return "; ".join(parts)


def _table(f: dict) -> Table:
    from powerinfer_py.models import find_spec

    t = Table(title=f["path"], show_header=False, title_justify="left", box=None, padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("architecture", f"{f['arch']}" + (f"  ({f['name']})" if f["name"] else ""))
    t.add_row("format", f"{f['magic']} v{f['gguf_version']}, {_size(f['file_size'])}")
    wide = f.get("wide")
    t.add_row("sparse", "yes (PowerInfer PWRI)" if f["sparse"] else
              "model-wide calibration (calibrate --wide): run with --sparse wide" if wide else "no (dense)")
    t.add_row("runnable", "yes" if f["runnable"] else f"[red]no[/]: {f['problem']}")
    t.add_row("tokenizer", str(f["tokenizer"]))
    c = f["config"]
    if c is not None:
        for label, key in _CONFIG_ROWS:
            value = f"{c['n_head']} / {c['n_head_kv']}" if key is None else c[key]
            t.add_row(label, str(value))
        if c.get("n_expert"):
            t.add_row("experts", f"{c['n_expert_used']} of {c['n_expert']} per token, {c['n_ff_exp']} wide"
                      + (f", plus a shared expert {c['n_ff_shexp']} wide" if c["n_ff_shexp"] else "")
                      + ("; router weights renormalized" if c["expert_weights_norm"] else ""))
        if c.get("moe_layers") and not all(c["moe_layers"]) and not c.get("mamba_layers"):  # ernie4_5-moe: dense lead
            dense = [il for il, moe in enumerate(c["moe_layers"]) if not moe]
            t.add_row("dense FFN layers", f"{', '.join(map(str, dense))} ({c['n_ff']} wide); experts on the others")
        spec = find_spec(c["arch"])  # the arch's own rows (ArchSpec.describe in its models/ module)
        for row in (spec.describe(c) if spec is not None and spec.describe is not None else ()):
            t.add_row(*row)
        if c.get("conv_layers"):  # lfm2: which layers are gated short convolutions
            conv = [il for il, is_conv in enumerate(c["conv_layers"]) if is_conv]
            t.add_row("conv layers", f"{', '.join(map(str, conv)) or 'none'} (gated short convolution over "
                      f"{c['conv_kernel']} tokens); attention on the others")
        if c.get("delta_layers"):  # qwen35: gated delta nets and gated attention (models/qwen35.py)
            delta = [il for il, is_delta in enumerate(c["delta_layers"]) if is_delta]
            t.add_row("delta-net layers", f"{', '.join(map(str, delta)) or 'none'} ({c['ssm_n_k_heads']} key / "
                      f"{c['ssm_n_v_heads']} value heads of {c['ssm_d_state']}, conv over {c['conv_kernel']} tokens); "
                      "gated attention on the others")
        if c.get("mamba_layers") and not (spec is not None and spec.parallel_mixer):  # each layer one kind
            kinds = {"Mamba-2 mixers": [il for il, m in enumerate(c["mamba_layers"]) if m],
                     "attention": [il for il, (m, f) in enumerate(zip(c["mamba_layers"], c["ffn_layers"] or
                                                                      (False,) * len(c["mamba_layers"])))
                                   if not m and not f],
                     "expert FFN" if c.get("n_expert") else "FFN": [il for il, f in enumerate(c["ffn_layers"]) if f]}
            heads = c["ssm_n_v_heads"]
            t.add_row("layer kinds", "; ".join(f"{name} {', '.join(map(str, ils))}" for name, ils in kinds.items() if ils)
                      + f" (mixers: {heads} heads of {c['ssm_d_inner'] // heads}, {c['ssm_n_group']} group(s), "
                      f"state {c['ssm_d_state']}, conv over {c['conv_kernel']} tokens)")
        if c.get("gemma3n"):  # AltUp, LAuReL, per-layer inputs, top-k sparse FFNs, shared K/V (models/gemma3n.py)
            g = c["gemma3n"]
            topk = [il for il, m in enumerate(g["std_mul"]) if m is not None]
            shared = [il for il, src in enumerate(g["kv_source"]) if src != il]
            sparse = (f"; top-k FFN (gate > mean + {g['std_mul'][topk[0]]:.3f} std) on layers {_ranges(topk)}"
                      if topk else "")
            t.add_row("gemma3n", f"{g['n_altup']} AltUp streams; LAuReL rank {g['laurel_rank']}; per-layer inputs of "
                      f"{g['n_embd_per_layer']}{sparse}; K/V shared on layers {_ranges(shared) or 'none'}")
        if c.get("xielu"):  # apertus: the raw per-layer xIELU parameters (models/apertus.py)
            an, ap, beta = (list(v) for v in list(zip(*c["xielu"]))[:3])
            t.add_row("xIELU FFN", f"ungated, dense only; raw alpha_n {min(an):.3g}..{max(an):.3g}, alpha_p "
                      f"{min(ap):.3g}..{max(ap):.3g}, beta {min(beta):.3g}..{max(beta):.3g} over the layers")
        if c.get("llama4"):  # chunked and NoPE attention layers (models/llama4.py)
            lay = c["llama4"]
            t.add_row("llama4", f"chunked attention ({lay['chunk']} positions) on layers "
                      f"{_ranges([i for i, x in enumerate(lay['chunked']) if x]) or 'none'}; NoPE + q temperature on "
                      f"{_ranges([i for i, x in enumerate(lay['rope']) if not x]) or 'none'}; q/k RMS norm after "
                      f"RoPE: {'yes' if lay['kq_norm'] else 'no'}; sigmoid router weight on the expert input")
        if c.get("attn_temp_scale"):  # mistral3
            t.add_row("attention temperature", f"q x (1 + {c['attn_temp_scale']:g} ln(floor(pos / "
                      f"{c['attn_temp_floor']}) + 1)): from position {c['attn_temp_floor']} on")
        if c.get("n_nextn"):  # glm4(moe), qwen35(moe), qwen3next, exaone4, nemotron_h_moe, bailingmoe2
            t.add_row("MTP blocks", f"{c['n_nextn']} next-token-prediction block(s) in the file, not run")
        if c.get("attn_softcap") or c.get("final_softcap"):
            t.add_row("soft-capping", f"attention scores {c['attn_softcap']:g}, output logits {c['final_softcap']:g}")
        rs = f.get("rope_scaling")
        if rs:
            parts = ([f"linear x{rs['linear']:g}"] if rs["linear"] else []) + (
                [f"frequency factors {rs['freq_factors'][0]:g}-{rs['freq_factors'][1]:g} (rope_freqs.weight)"]
                if rs["freq_factors"] else []) + (
                [f"YaRN, frequency factors {rs['yarn']['factors'][0]:.3g}-{rs['yarn']['factors'][1]:.3g}, rotated "
                 f"dims x{rs['yarn']['mscale']:.3g}"] if rs.get("yarn") else []) + (
                [f"short/long factors (long when n_ctx > {rs['longrope']['orig_ctx']}), attn_factor "
                 f"{rs['longrope']['attn_factor']:g}"] if rs.get("longrope") else [])
            t.add_row("RoPE scaling", ", ".join(parts))
        cal = f.get("calibration")
        if cal:
            t.add_row("threshold sparsity", _calibration_text(cal))
        if wide:
            t.add_row("model-wide sparsity", _wide_text(wide))
        if f["predictor_ranks"]:
            t.add_row("predictor ranks", ", ".join(map(str, f["predictor_ranks"])))
    t.add_row("tensors", f"{f['n_tensors']} ({f['n_params'] / 1e6:.1f} M parameters)")
    for type_name, tt in f["tensor_types"].items():
        t.add_row(f"  {type_name}", f"{tt['count']} tensor{'s' if tt['count'] != 1 else ''}, {_size(tt['bytes'])}")
    conv = ", ".join(f"{c['count']} {c['from']} -> {c['to']}" for c in f["conversions"])
    t.add_row("converted at load", conv or "nothing (every tensor type runs as it is)")
    t.add_row("CUDA backend", ("yes: " if f["cuda"]["available"] else "no: ") + f["cuda"]["reason"])
    a = f.get("activity")
    if a is not None:
        if "expert_counts" in a:
            t.add_row("experts run", f"{a['note']} ({a['tokens']} tokens of sample text)")
        elif "note" in a:
            t.add_row("active neurons", f"all ({a['note']}; {a['tokens']} tokens run)")
        elif "wide" in a:  # the model-wide mode: skipped bytes per layer and projection input
            t.add_row("model-wide sparsity", f"mode {a['mode']}, target {a['sparsity']:g} ({a['tokens']} tokens of "
                      "sample text)")
            for line in a["wide_lines"]:
                t.add_row("", line.strip())
        else:
            what = {"predictor": "predicted active", "threshold": "computed (above the cut-off)"}.get(a["mode"], "non-zero")
            t.add_row("active neurons", f"{100 * a['active_fraction']:.1f}% {what} per token, mode {a['mode']} "
                      f"({a['tokens']} tokens of sample text)")
            t.add_row("  per layer %", " ".join(f"{il}:{100 * x:.1f}" for il, x in enumerate(a["layers"])))
            if a["mode"] == "predictor":
                t.add_row("  non-zero %", f"{100 * a['nonzero_fraction']:.1f}% of neurons had a non-zero output")
            if a.get("up_read_fraction") is not None:
                t.add_row("  ffn_up rows", f"{100 * a['up_read_fraction']:.1f}% read per token (two stages)")
    return t


def _ranges(ils: list[int]) -> str:
    """Layer numbers as runs: [0, 1, 2, 5] -> "0-2, 5"."""
    out, i = [], 0
    while i < len(ils):
        j = i
        while j + 1 < len(ils) and ils[j + 1] == ils[j] + 1:
            j += 1
        out.append(f"{ils[i]}-{ils[j]}" if j > i else str(ils[i]))
        i = j + 1
    return ", ".join(out)
