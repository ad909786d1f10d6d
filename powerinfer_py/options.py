"""The knobs of loading and of sampling, defined once: LoadOptions and SamplingParams.

Every front end derives its own spelling from these two dataclasses and their per-field metadata (a Knob):
- the Python API: powerinfer_py.load() / LLM(...) take LoadOptions' fields as keywords, LLM.generate_tokens()
  and LLM.generate() take SamplingParams' (tests/test_options.py holds the signatures to the fields);
- the CLI: cli/options.py builds each typer flag (names, default, help, bounds) from a field's Knob, and a
  command turns its parsed flags back into the dataclasses by field name;
- the server: serve/api.py reads the request fields a Knob's `api` names, with their JSON type and bounds.

The library's default and the CLI's may differ on purpose (Knob.cli_default): `load()` runs on the plain CPU
backend unless asked, the `powerinfer` commands try the hybrid one ("auto"). Bounds differ too: the CLI and the
API constructors accept what the sampler can run, while the server keeps to OpenAI's ranges (penalties in
[-2, 2]) and to positive seeds.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, Iterator, Mapping, Sequence

_SAME = object()  # Knob.cli_default: the CLI's default is the library's


@dataclass(frozen=True)
class ApiField:
    """A request field of the HTTP server (same name as the dataclass field): its JSON type and the range it
    must lie in ([lo, hi], or (lo, hi] with lo_open); per_request: absent means None, never the server's
    default (a server-wide seed would give every request the same draws)."""
    kind: str                        # "number" | "integer"
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    per_request: bool = False


@dataclass(frozen=True)
class Knob:
    """How the front ends show one option: its CLI flag names, help text and typer extras (min, max, metavar),
    the CLI's own default where it differs, and its server request field (None: not one)."""
    flags: tuple[str, ...]
    help: str
    cli: Mapping[str, Any] = field(default_factory=dict)
    cli_default: Any = _SAME
    cli_name: str | None = None      # the command parameter's name when it is not the field's
    cli_invert: bool = False         # the flag holds `not value` (--no-mmap for use_mmap)
    finite: bool = False             # the CLI refuses NaN and infinities
    api: ApiField | None = None


def _opt(default, *flags: str, help: str, **knob):
    return field(default=default, metadata={"knob": Knob(tuple(flags), help, **knob)})


def knob(cls, name: str) -> Knob:
    """The Knob of field `name` of LoadOptions or SamplingParams (KeyError for a field without one)."""
    for f in fields(cls):
        if f.name == name and "knob" in f.metadata:
            return f.metadata["knob"]
    raise KeyError(f"{cls.__name__} has no option {name!r} with CLI/server metadata")


def cli_default(cls, name: str) -> Any:
    """The default a CLI flag shows for field `name` (the library's unless its Knob says otherwise)."""
    k = knob(cls, name)
    if k.cli_default is not _SAME:
        return k.cli_default
    default = next(f.default for f in fields(cls) if f.name == name)
    return (not default) if k.cli_invert else default


def api_fields(cls=None) -> Iterator[tuple[str, ApiField]]:
    """(name, ApiField) of every SamplingParams field the server reads generically, in field order."""
    for f in fields(cls or SamplingParams):
        k = f.metadata.get("knob")
        if k is not None and k.api is not None:
            yield f.name, k.api


def pick(cls, values: Mapping[str, Any]):
    """An instance of cls from the entries of `values` named after its fields (the others are ignored)."""
    return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


BACKEND_HELP = ('"auto": hot FFN neurons of a PWRI model on the GPU when one is usable, else the CPU; "cpu"; '
                '"cuda"; "cpu-emulated": the hybrid executor on the CPU kernels (testing).')
SPARSE_HELP = ('FFN mode: "predictor" (default for PowerInfer/PWRI files: only predicted-active neurons), '
               '"exact" (ReLU models: only non-zero neurons, bit-for-bit dense), "threshold" (SwiGLU/GeGLU models '
               'calibrated by `powerinfer calibrate`: skip neurons with small |act(gate)|; default for such files), '
               '"wide" (files from `powerinfer calibrate --wide`: every projection skips the weights of its small '
               'inputs; default for such files) or "off" (dense; default for other GGUF files).')

PREDICTOR_HELP = ('--sparse predictor on a file with F32/F16/BF16 predictors: "exact" runs them as stored; "q8_0" '
                  'or "q4_0" runs a copy quantized at load, which reads 2-4x fewer predictor bytes per token. "auto" '
                  '(the default) picks "q8_0" for ReLU-family models and "exact" for SwiGLU/GeGLU models with trained '
                  'predictors (docs/sparse.md measures why). Quantized predictors run as stored.')

@dataclass(frozen=True)
class LoadOptions:
    """What powerinfer_py.load() / LLM(...) take besides the path (load()'s docstring says what each does)."""
    threads: int | None = _opt(None, "-t", "--threads", cli={"min": 1},
                               help="CPU threads (default: every CPU this process may use).")
    n_ctx: int | None = _opt(None, "-c", "--ctx-size", cli={"min": 1},
                             help="Context window in tokens (default: the runtime's).")
    backend: str = _opt("cpu", "--backend", cli={"metavar": "[auto|cpu|cuda|cpu-emulated]"}, cli_default="auto",
                        help=BACKEND_HELP)
    cache_dir: str | os.PathLike | None = None
    sparse: str | None = _opt(None, "--sparse", cli={"metavar": "[predictor|exact|threshold|wide|off]"}, help=SPARSE_HELP)
    sparse_threshold: float | None = _opt(
        None, "--sparse-threshold", help="Predictor threshold: a neuron is active when its predictor logit is >= "
        "this (default: the file's powerinfer.sparse_threshold, or $LLAMA_SPARSE_PRED_THRESHOLD).")
    sparsity: float | None = _opt(None, "--sparsity", help="--sparse threshold: fraction of FFN neurons to skip, "
                                  "in [0, 1); --sparse wide: fraction of the layers' projection weight bytes to skip, "
                                  "in [0, 0.95] (default: the sparsity the file was calibrated for; 0 = dense).")
    predictor_dtype: str = _opt("auto", "--predictor-dtype", cli={"metavar": "[auto|exact|q8_0|q4_0]"},
                                help=PREDICTOR_HELP)
    vram_budget: float | None = _opt(None, "--vram-budget", cli={"min": 0.0},
                                     help="GiB of GPU memory for the hybrid backend (default: 90% of the free memory).")
    placement: str | os.PathLike | None = None
    use_mmap: bool = _opt(True, "--no-mmap", cli_name="no_mmap", cli_invert=True,
                          help="Read the weights into memory instead of mapping the file (llama.cpp's --no-mmap): "
                          "RAM for the whole file and a slower start; decodes faster where mapped file pages read "
                          "slower (docs/performance.md).")

    def kwargs(self) -> dict[str, Any]:
        """The fields as keywords for load() / LLM(...)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def check_stops(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """Stop strings as a tuple (one string, several, or None for none); ValueError for an empty or non-string one."""
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if any(not isinstance(s, str) or not s for s in stops):
        raise ValueError(f"stop strings must be non-empty strings, got {stops!r}")
    return tuple(stops)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings; a value that disables a step: top_k 0, top_p 1.0, min_p 0.0, repeat_penalty 1.0,
    frequency_penalty and presence_penalty 0.0 (both look at the same last repeat_last_n tokens as the
    repetition penalty), logit_bias () (pairs of token id and the bias added to its logit; a {id: bias}
    mapping is accepted and stored as sorted pairs).

    temperature <= 0 means greedy decoding (argmax after the repetition penalty).
    seed None (or -1, llama.cpp's spelling) draws a fresh random seed; a seed >= 0 makes the token stream
    reproducible.
    max_tokens and stop end the text, not the draw (the Sampler ignores them): max_tokens < 0 runs until an
    end-of-generation token or a full context; stop strings end the text where one first appears.
    """
    temperature: float = _opt(0.8, "--temp", cli={"min": 0.0}, api=ApiField("number", lo=0.0),
                              help="Temperature; 0 = greedy (argmax).")
    top_k: int = _opt(40, "--top-k", cli={"min": 0}, api=ApiField("integer", lo=0),
                      help="Keep the k most likely tokens (0 = all).")
    top_p: float = _opt(0.95, "--top-p", cli={"min": 0.0, "max": 1.0},
                        api=ApiField("number", lo=0.0, hi=1.0, lo_open=True), help="Nucleus mass to keep (1 = off).")
    min_p: float = _opt(0.05, "--min-p", cli={"min": 0.0, "max": 1.0}, api=ApiField("number", lo=0.0, hi=1.0),
                        help="Drop tokens below min_p x the top probability (0 = off).")
    repeat_penalty: float = _opt(1.0, "--repeat-penalty", cli={"min": 0.0},
                                 api=ApiField("number", lo=0.0, lo_open=True),
                                 help="Penalty for recently seen tokens (1 = off).")
    repeat_last_n: int = _opt(64, "--repeat-last-n", cli={"min": -1},
                              help="How many recent tokens the repeat, frequency and presence penalties look at "
                              "(0 = none, -1 = all, as llama.cpp).")
    seed: int | None = _opt(None, "-s", "--seed", cli={"min": -1}, api=ApiField("integer", lo=0, per_request=True),
                            help="Random seed: the same seed, the same text (-1: a random one, as without --seed).")
    frequency_penalty: float = _opt(0.0, "--frequency-penalty", finite=True, api=ApiField("number", lo=-2.0, hi=2.0),
                                    help="Subtract this times a token's count among the recent tokens from its logit "
                                    "(0 = off; OpenAI's frequency_penalty).")
    presence_penalty: float = _opt(0.0, "--presence-penalty", finite=True, api=ApiField("number", lo=-2.0, hi=2.0),
                                   help="Subtract this from the logit of every token among the recent tokens (0 = "
                                   "off; OpenAI's presence_penalty).")
    logit_bias: tuple[tuple[int, float], ...] = ()   # the server parses it itself (an object of id -> bias)
    max_tokens: int = _opt(128, "-n", "--n-predict", cli={"min": -1},
                           help="Tokens to generate at most; -1 = until end of text or a full context.")
    stop: tuple[str, ...] = _opt((), "--stop", cli={"metavar": "TEXT", "show_default": False}, cli_default=None,
                                 help="End the text where this string appears (not printed); may be given several "
                                 "times. \\n, \\t and \\\\ stand for a newline, a tab and a backslash.")

    def __post_init__(self):
        if isinstance(self.logit_bias, Mapping):
            object.__setattr__(self, "logit_bias",
                               tuple(sorted((int(t), float(b)) for t, b in self.logit_bias.items())))
        elif self.logit_bias is None:
            object.__setattr__(self, "logit_bias", ())
        if not isinstance(self.stop, tuple) or any(not isinstance(s, str) or not s for s in self.stop):
            object.__setattr__(self, "stop", check_stops(self.stop))
        if self.seed is not None and self.seed < 0:
            if self.seed != -1:
                raise ValueError(f"seed must be >= 0, or -1 for a random one, got {self.seed}")
            object.__setattr__(self, "seed", None)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise ValueError(f"repeat_last_n must be -1 (all), 0 (off) or a count, got {self.repeat_last_n}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        for token, b in self.logit_bias:
            if token < 0 or math.isnan(b):
                raise ValueError(f"logit_bias: token ids are >= 0 and biases numbers, got {token}: {b}")

    def check_vocab(self, n_vocab: int) -> None:
        """ValueError naming the first logit_bias token id that is not in a vocabulary of n_vocab tokens."""
        wrong = [t for t, _ in self.logit_bias if t >= n_vocab]
        if wrong:
            raise ValueError(f"logit_bias: token id {wrong[0]} is outside the vocabulary (0 to {n_vocab - 1})")
