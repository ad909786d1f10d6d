"""Models: one module per architecture, found by its GGUF name.

    read_config(f) -> ModelConfig   (config.read with the arch's spec and its read_args)
    build_model(config, tensors, kernels, sparse=None) -> Model
                                    (Model.forward(tokens, cache, all_logits=False), Model.new_cache(n_ctx),
                                     Model.sparsity: per-layer active-neuron counts or None)
    expected_tensors(config) -> {name: (shape numpy order, required)}   (for loader.load_weights)
    spec_for(arch) -> ArchSpec      (models/spec.py: the flags and hooks of one architecture)

The module of an architecture is models/<arch>.py with "-" written "_" (gpt-oss: gpt_oss.py), or the one that
ALIASES names when several archs share a module; that module's SPEC or VARIANTS holds the arch's ArchSpec.
Modules are imported when an arch is first asked for. The supported archs are the specs those modules hold
(supported_archs()): no list here to keep in step with them.

`kernels` is a kernels.cpu.CpuKernels or kernels.ref.RefKernels; models call only the methods listed in
kernels/__init__.py, so every backend runs every model. `sparse` is an ffn.SparseSettings (mode, threshold);
None means ffn.resolve_sparse(config): predictor mode for PWRI files, dense otherwise, the file's threshold.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Callable

from .. import config as _config
from ..config import MetaReader, ModelConfig
from ..errors import UnsupportedError
from .spec import ArchSpec

# arch -> module stem, where several archs share one module (the others: the arch with "-" -> "_")
ALIASES = {
    "qwen2moe": "qwen2", "qwen2vl": "qwen2",
    "qwen3moe": "qwen3", "qwen3vl": "qwen3", "qwen3vlmoe": "qwen3",
    "gemma2": "gemma",
    "granitemoe": "granite",
    "ernie4_5-moe": "ernie4_5",
    "glm4moe": "glm4",
    "lfm2moe": "lfm2",
    "qwen35moe": "qwen35",
    "nemotron_h_moe": "nemotron_h", "mamba2": "nemotron_h",
    "cohere2": "command_r",
    "minicpm3": "minicpm",
    "phi2": "ln_decoder", "stablelm": "ln_decoder", "starcoder2": "ln_decoder", "gpt2": "ln_decoder",
}
_STEM = re.compile(r"[a-z][a-z0-9_]*\Z")  # a module name an arch string may map to (no dots, no dunders)
_SPECS: dict[str, ArchSpec | None] = {}


def module_for(arch: str):
    """The module that runs `arch`, or None when models/ has none of that name."""
    stem = ALIASES.get(arch, arch.replace("-", "_"))
    if not _STEM.match(stem):
        return None
    name = f"{__name__}.{stem}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return None
        raise


def _module_specs(mod) -> dict[str, ArchSpec]:
    specs = (getattr(mod, "SPEC", None), *getattr(mod, "VARIANTS", ()))
    return {s.name: s for s in specs if isinstance(s, ArchSpec)}


def find_spec(arch: str) -> ArchSpec | None:
    """The spec of `arch`, or None when no module of models/ runs it."""
    if arch not in _SPECS:
        mod = module_for(arch) if isinstance(arch, str) else None
        _SPECS[arch] = None if mod is None else _module_specs(mod).get(arch)
    return _SPECS[arch]


def supported_archs() -> tuple[str, ...]:
    """Every arch some module of models/ runs, sorted (each reached through module_for)."""
    names = set()
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            names.update(_module_specs(importlib.import_module(f"{__name__}.{info.name}")))
    return tuple(sorted(a for a in names if find_spec(a) is not None))


def archs_with(test: Callable[[ArchSpec], bool]) -> list[str]:
    """The supported archs whose spec passes `test` (for messages that list them); text_of files count as the
    arch they name, not on their own."""
    return [a for a in supported_archs() if not find_spec(a).text_of and test(find_spec(a))]


def spec_for(arch: str) -> ArchSpec:
    """The spec of a runnable arch; an UnsupportedError naming the runnable ones otherwise."""
    spec = find_spec(arch)
    if spec is None or spec.model is None or spec.text_of:  # (a config's arch is never a text_of one)
        raise UnsupportedError(f"no model for architecture {arch!r}; runnable: "
                               f"{', '.join(archs_with(lambda s: s.model is not None))}")
    return spec


def read_config(f) -> ModelConfig:
    """The ModelConfig of GGUF file `f`; an architecture no module runs is an UnsupportedError."""
    arch = MetaReader(f).get("general.architecture", kind=str)
    spec = find_spec(arch)
    if spec is None:
        raise UnsupportedError(f"{f.path}: architecture {arch!r} is not supported; supported: "
                               f"{', '.join(supported_archs())}")
    return _config.read(f, spec, getattr(module_for(arch), "read_args", None), archs_with)


def build_model(config: ModelConfig, tensors, kernels, sparse=None):
    """Every family builds its FFNs from ffn.FFN, so every model accepts the sparse modes its FFN variant
    supports (ffn.resolve_sparse says which); only the PWRI archs (spec.pwri) read predictor files."""
    spec = spec_for(config.arch)
    if config.is_sparse and not spec.pwri:
        raise UnsupportedError(f"architecture {config.arch!r} has no PowerInfer (PWRI) variant; PWRI files "
                               f"exist for {', '.join(archs_with(lambda s: s.pwri))}")
    return spec.model(config, tensors, kernels, sparse)


def expected_tensors(config: ModelConfig):
    """The arch's table; for a wide-calibrated file its transposed projections in place of the dense ones."""
    from ..layers.wide import wide_expected

    return wide_expected(config, spec_for(config.arch).expected(config))


__all__ = ["ALIASES", "ArchSpec", "archs_with", "build_model", "expected_tensors", "find_spec", "module_for",
           "read_config", "spec_for", "supported_archs"]
