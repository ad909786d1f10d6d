"""Numpy reference kernels: the specification the C kernels are tested against.

Written for clarity, not speed. Quantized matmuls reproduce llama.cpp's arithmetic: activations are quantized
to Q8_0 blocks and each block's integer dot product is scaled by the two block scales.
"""
from __future__ import annotations

import numpy as np

from ..tensor import GGMLType, Tensor

# ==== quantization and matmul (owner: matmul helper) =====================================================

# ==== norms, rope, softmax, attention, activations (owner: ops helper) ====================================


class RefKernels:
    """The numpy kernels in the same shape as cpu.CpuKernels, so a model can run on either."""

    n_threads = 1

    def __getattr__(self, name):
        fn = globals().get(name)
        if fn is None or not callable(fn):
            raise AttributeError(name)
        return fn

    def close(self) -> None:
        pass
