"""powerinfer_py: local LLM inference on GGUF and PowerInfer (PWRI) models with C kernels.

    import powerinfer_py
    with powerinfer_py.load("model.gguf", threads=4) as llm:
        for piece in llm.generate("Once upon a time", max_tokens=64, temperature=0.7, seed=1):
            print(piece, end="", flush=True)

The names below are imported on first use, so `import powerinfer_py` stays fast (no numpy, cffi or
llama.cpp until something needs them).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS = {
    "load": "llm",
    "LLM": "llm",
    "LoadOptions": "options",
    "SamplingParams": "options",
    "Sampler": "sampler",
    "Tokenizer": "tokenizer",
    "GenerationStats": "generate",
    "PowerInferError": "errors",
    "ModelFileError": "errors",
    "UnsupportedError": "errors",
    "ContextFullError": "errors",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports lazily
    from .errors import ContextFullError, ModelFileError, PowerInferError, UnsupportedError
    from .generate import GenerationStats
    from .llm import LLM, load
    from .options import LoadOptions, SamplingParams
    from .sampler import Sampler
    from .tokenizer import Tokenizer


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'powerinfer_py' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
