"""EmulatedDevice: the hybrid executor's device half, run by the CPU kernels (`--backend cpu-emulated`).

It does everything a real device half does except the arithmetic's location: it gathers each layer's hot
rows of ffn_gate / ffn_up / ffn_down_t (and ffn_up.bias) into compact tensors, charges them to a memory
arena of the plan's capacity exactly as the CUDA device would (fixed buffers first, then 32-row groups,
16-byte alignment: placement.py), refuses to go over it, and computes the hot half of each FFN call on the
compact tensors through the same FFN code the CPU half uses. So placement, gathering, splitting and merging
are exercised, and tested, on machines without a GPU.
"""
from __future__ import annotations

import numpy as np

from ..errors import PowerInferError
from ..layers.ffn import FFN, FFNWeights, SparseSettings
from .placement import GROUP, aligned
from .split import Done, gathered_rows


class EmulatedDevice:
    name = "cpu-emulated"

    def __init__(self, kernels, capacity: int, reserved: int = 0):
        """capacity: the arena's bytes (the VRAM budget); reserved: bytes of the fixed buffers (attention,
        norms, predictors, head, KV cache, scratch), charged first."""
        self.kernels, self.capacity = kernels, int(capacity)
        self.used = 0
        self.ffns: dict[int, FFN] = {}
        self._charge(reserved, "the fixed buffers")

    def _charge(self, n_bytes: int, what: str) -> None:
        n = aligned(n_bytes)
        if self.used + n > self.capacity:
            raise PowerInferError(f"device memory exhausted: {what} need {n} bytes, {self.capacity - self.used} "
                                  f"of {self.capacity} are left")
        self.used += n

    def add_layer(self, il: int, ffn: FFN, hot: np.ndarray) -> None:
        """Gather layer il's hot neurons (ascending int32) into compact device tensors."""
        w = ffn.w
        if w.down_t is None:
            raise PowerInferError("hybrid execution needs ffn_down_t (a PWRI file)")
        padded = -(-len(hot) // GROUP) * GROUP  # whole groups: the padding rows are allocated too
        for t in (w.gate, w.up, w.down_t):
            if t is not None:
                self._charge(padded * (t.nbytes // t.n_rows), f"layer {il}'s {t.name} rows")
        if w.b_up is not None:
            self._charge(padded * 4, f"layer {il}'s ffn_up.bias")
        dev = FFNWeights(up=gathered_rows(w.up, hot), down_t=gathered_rows(w.down_t, hot),
                         gate=gathered_rows(w.gate, hot) if w.gate is not None else None,
                         b_up=np.ascontiguousarray(w.b_up[hot]) if w.b_up is not None else None)
        self.ffns[il] = FFN(self.kernels, dev, ffn.variant, SparseSettings("off", 0.0), layer=il,
                            act_param=float(ffn.act_param))

    def submit(self, il: int, x: np.ndarray, hot: np.ndarray, keep, dense: bool) -> Done:
        """The hot half: y (without b_down) and its non-zero h count, over compact rows `hot`."""
        return Done(self.ffns[il].partial(x, hot, keep, dense, bias=False))

    def close(self) -> None:
        self.ffns.clear()
