"""Models: one module per architecture family, chosen by config.arch.

    build_model(config, tensors, kernels) -> Model    (Model.forward(tokens, cache, all_logits=False),
                                                        Model.new_cache(n_ctx))
    expected_tensors(config) -> {name: (shape numpy order, required)}   (for loader.load_weights)

`kernels` is a kernels.cpu.CpuKernels or kernels.ref.RefKernels; models call only the methods listed in
kernels/__init__.py, so every backend runs every model.
"""
from __future__ import annotations

from typing import Mapping

from ..config import ModelConfig
from ..errors import UnsupportedError
from ..tensor import Tensor
from . import gemma3, llama, qwen2
from .base import Expected, Model

_FAMILIES = {
    "llama": (llama.LlamaModel, llama.expected_tensors),
    "qwen2": (qwen2.Qwen2Model, qwen2.expected_tensors),
    "gemma3": (gemma3.Gemma3Model, gemma3.expected_tensors),
}


def _family(config: ModelConfig):
    try:
        return _FAMILIES[config.arch]
    except KeyError:
        raise UnsupportedError(f"no model for architecture {config.arch!r}; runnable: "
                               f"{', '.join(_FAMILIES)}") from None


def build_model(config: ModelConfig, tensors: Mapping[str, Tensor], kernels) -> Model:
    return _family(config)[0](config, tensors, kernels)


def expected_tensors(config: ModelConfig) -> Expected:
    return _family(config)[1](config)


__all__ = ["Model", "build_model", "expected_tensors"]
