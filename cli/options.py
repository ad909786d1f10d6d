"""The typer flags of the load and sampling options, built from their one definition (powerinfer_py/options.py),
and the way back: a command's parsed flags into LoadOptions / SamplingParams.

A command declares each flag it takes as a parameter named after the option's field, in the order its --help
lists them (`temperature: float = O.flag("temperature")` is --temp), and reads them back with load_options() /
sampling_params() from typer's context, so the list of options is not written again in the command's body.
A command whose flag means something narrower (bench's "our engine", perplexity's window) passes its own
help or default to flag().
"""
from __future__ import annotations

from typing import Any, Mapping

import typer

from powerinfer_py.errors import PowerInferError
from powerinfer_py.options import LoadOptions, SamplingParams, cli_default, knob

TEMPLATE_HELP = ("Chat format: llama-2, llama-3, chatml, gemma, mistral, phi-3, plain (User:/Assistant:), or model (the "
                 "file's own). Default: the file's own, else one chosen by architecture.")

MODEL = typer.Option(..., "-m", "--model", help='GGUF or PWRI file, or "demo" (Gemma 3 270M).')


def _finite(value: float) -> float:
    if value != value or value in (float("inf"), float("-inf")):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


def _owner(name: str):
    return LoadOptions if name in LoadOptions.__dataclass_fields__ else SamplingParams


def flag(name: str, **override: Any):
    """The typer.Option of option `name` (a LoadOptions or SamplingParams field): its flag names, the CLI's
    default, help and bounds; `override` replaces any of them (default=..., help=..., min=...)."""
    cls = _owner(name)
    k = knob(cls, name)
    extra = dict(k.cli)
    if k.finite:
        extra["callback"] = _finite
    extra["help"] = k.help
    extra.update(override)
    default = extra.pop("default", cli_default(cls, name))
    return typer.Option(default, *k.flags, **extra)


def values(cls, params: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of cls (LoadOptions or SamplingParams) among a command's parsed flags (typer's ctx.params),
    as keywords: --no-mmap comes back as use_mmap; the options the command does not take are left out (so
    they keep the library's default)."""
    out = {}
    for name, f in cls.__dataclass_fields__.items():
        k = f.metadata.get("knob")
        key = k.cli_name if k is not None and k.cli_name else name
        if key in params:
            out[name] = (not params[key]) if k is not None and k.cli_invert else params[key]
    return out


def load_options(params: Mapping[str, Any]) -> LoadOptions:
    """LoadOptions from a command's parsed flags."""
    return LoadOptions(**values(LoadOptions, params))


def sampling_params(params: Mapping[str, Any], **given: Any) -> SamplingParams:
    """SamplingParams from a command's parsed flags; `given` sets fields the command prepares itself (stop).
    A combination the sampler refuses (--top-p 0, --repeat-penalty 0) is a user error, not a traceback."""
    try:
        return SamplingParams(**{**values(SamplingParams, params), **given})
    except ValueError as e:
        raise PowerInferError(str(e)) from None
