"""HybridSplit: one layer's predicted active set, cut into the device half (hot neurons) and the CPU half.

For one FFN call in predictor mode (ffn.py hands over `rows`, the ascending active neurons, and `keep`, which
token selected which row):

    pos   = dev_pos[rows]                 compact device row of each active neuron, -1 if it is cold
    hot   = pos[pos >= 0]                 ascending (the compact rows keep the neurons' order)
    cold  = rows[pos < 0]
    pending = device.submit(layer, x, hot, keep[:, hot part])     the device starts on its half
    y, nnz  = ffn.partial(x, cold, keep[:, cold part])             the CPU computes its half meanwhile (+ b_down)
    y      += pending.wait()                                       the two partial outputs are summed

Same semantics as the CPU-only FFN: each neuron's h is computed from the same bytes by the same kind of
kernel; only the summation of the down projection is regrouped (hot part + cold part instead of one ordered
sum), so results agree to float rounding, and bit for bit when one half is empty. The split also counts how
many active neurons each half computed (`device_rows`, `cpu_rows`), for `run --verbose`.
"""
from __future__ import annotations

import numpy as np


class HybridSplit:
    def __init__(self, device, layer: int, n_ff: int, hot: np.ndarray):
        hot = np.asarray(hot, dtype=np.int32)
        if len(hot) and (hot[0] < 0 or hot[-1] >= n_ff or np.any(hot[1:] <= hot[:-1])):
            raise ValueError(f"layer {layer}: hot neurons must be ascending distinct indices below {n_ff}")
        self.device, self.layer = device, layer
        self.dev_pos = np.full(n_ff, -1, dtype=np.int32)
        self.dev_pos[hot] = np.arange(len(hot), dtype=np.int32)
        self.device_rows = 0
        self.cpu_rows = 0

    def run(self, ffn, x: np.ndarray, rows: np.ndarray, keep: np.ndarray | None,
            dense: bool) -> tuple[np.ndarray, int]:
        """(y f32 [N, n_embd], non-zero h count) of `ffn` over `rows`, computed by both halves."""
        pos = self.dev_pos[rows]
        on_dev = pos >= 0
        hot = np.ascontiguousarray(pos[on_dev])
        cold = np.ascontiguousarray(rows[~on_dev])
        k_hot = None if keep is None else np.ascontiguousarray(keep[:, on_dev])
        k_cold = None if keep is None else np.ascontiguousarray(keep[:, ~on_dev])
        pending = self.device.submit(self.layer, x, hot, k_hot, dense)
        y, nnz = ffn.partial(x, cold, k_cold, dense)
        y_dev, nnz_dev = pending.wait()
        y += y_dev
        self.device_rows += len(hot) * x.shape[0]
        self.cpu_rows += len(cold) * x.shape[0]
        return y, nnz + nnz_dev


class Done:
    """A device result that is already there (the emulated device computes at submit)."""

    def __init__(self, result):
        self.result = result

    def wait(self):
        return self.result


def gathered_rows(t, hot: np.ndarray):
    """The hot rows of a weight as a compact Tensor (a copy: what goes to the device)."""
    from ..gguf.types import Tensor

    data = np.ascontiguousarray(t.data[hot])
    return Tensor(f"{t.name}[hot]", t.type, (len(hot), t.n_cols), data)
