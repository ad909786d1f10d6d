"""CudaDevice: the hybrid executor's device half on a CUDA GPU (`--backend cuda` / `auto` with a device).

Per layer, the hot rows of ffn_gate / ffn_up / ffn_down_t are gathered on the host, converted to the planar
device layout (kernels/cuda.py) and uploaded once into one arena. Per FFN call and token:

    upload x [n_embd] and the hot compact rows the token selected (int32)
    matvec_rows(gate), matvec_rows(up)      the row gather over the compact rows
    ffn_act                                 h = act(g) * u (variant of the model)
    axpy_rows(down_t)                       y = sum_j h_j * down_t[j], split over neurons, deterministic
and, in wait(), the copy of y and h back (h only to count its non-zeros for the sparsity statistics). The
launches are asynchronous, so the CPU half (HybridSplit) runs while the device works.

Status: written against pi_cuda.h and compiled, but NOT RUN: the machine it was written on has no GPU
(the runtime answers error 35). tests/test_cuda.py holds the checks to run on one (`pytest -m cuda`).
Attention, norms and the predictor stay on the CPU in this executor even though the placement reserves
device memory for them (their kernels exist: pi_cuda_rmsnorm / rope / attention / predictor). gemma2's attention
logit soft-cap is therefore right on this backend; pi_cuda_attention itself has no soft-cap, so a device
attention path must refuse configs with attn_softcap != 0 until it gets one.
"""
from __future__ import annotations

import numpy as np

from ..errors import PowerInferError
from ..kernels import cuda as C
from ..layers.ffn import FFN
from .placement import AXPY_SPLITS, GROUP
from .split import gathered_rows


class CudaDevice:
    name = "cuda"

    def __init__(self, capacity: int, n_embd: int, n_ff: int):
        self.arena = C.Arena(capacity)
        self.n_embd, self.n_ff = n_embd, n_ff
        a = self.arena
        self.x, self.y = a.alloc(4 * n_embd), a.alloc(4 * n_embd)
        self.rows = a.alloc(4 * (n_ff + 1))
        self.g, self.u, self.h = a.alloc(4 * n_ff), a.alloc(4 * n_ff), a.alloc(4 * n_ff)
        self.partials = a.alloc(4 * AXPY_SPLITS * n_embd)
        self.layers: dict[int, dict] = {}

    def add_layer(self, il: int, ffn: FFN, hot: np.ndarray) -> None:
        w, a = ffn.w, self.arena
        padded = -(-len(hot) // GROUP) * GROUP
        pad = np.concatenate([hot, np.full(padded - len(hot), hot[-1] if len(hot) else 0, dtype=np.int32)])
        layer = {"n": len(hot), "rows": padded, "variant": C.VARIANTS.get(ffn.variant),
                 "param": float(ffn.act_param)}
        if layer["variant"] is None:
            raise PowerInferError(f"the CUDA FFN has no {ffn.variant} variant")
        for key, t in (("gate", w.gate), ("up", w.up), ("down_t", w.down_t)):
            if t is None:
                layer[key] = None
                continue
            compact = gathered_rows(t, pad)  # padding rows repeat a hot row; they are never listed as active
            layer[key] = (int(t.type), a.upload(C.planar(compact)), t.n_cols)
        layer["b_up"] = a.upload(np.ascontiguousarray(w.b_up[pad], dtype=np.float32)) if w.b_up is not None else None
        self.layers[il] = layer

    def submit(self, il: int, x: np.ndarray, hot: np.ndarray, keep, dense: bool):
        return _Pending(self, il, x, hot, keep)

    @property
    def used(self) -> int:
        return self.arena.used

    def close(self) -> None:
        self.arena.close()


class _Pending:
    """One FFN call's device half. Decode (one token): the uploads and launches are enqueued at submit and the
    CPU half runs while they execute; wait() copies y and h back. Batches run token by token in wait()."""

    def __init__(self, dev: CudaDevice, il: int, x: np.ndarray, hot: np.ndarray, keep):
        self.dev, self.il, self.x, self.hot, self.keep = dev, il, x, hot, keep
        self.n_sel = self._enqueue(0) if x.shape[0] == 1 else None

    def _enqueue(self, t: int) -> int:
        """Upload token t's input and selected rows, launch its kernels; returns the number of rows."""
        d, a, L = self.dev, self.dev.arena, self.dev.layers[self.il]
        lib, ffi, s = a.lib, a.ffi, a.stream
        rows = self.hot if self.keep is None else np.ascontiguousarray(self.hot[self.keep[t]])
        n = len(rows)
        if n == 0:
            return 0
        a.upload(np.ascontiguousarray(self.x[t], dtype=np.float32), d.x)
        a.upload(rows.astype(np.int32), d.rows)
        f32 = lambda p: ffi.cast("float *", p)
        i32 = ffi.cast("int32_t *", d.rows)
        for key, out in (("gate", d.g), ("up", d.u)):
            if L[key] is not None:
                ty, ptr, n_cols = L[key]
                a.check(lib.pi_cuda_matvec_rows(ty, ptr, L["rows"], n_cols, i32, n, ffi.NULL, f32(d.x), f32(out),
                                                s), f"matvec_rows {key}")
        gated = L["gate"] is not None
        b = ffi.cast("float *", L["b_up"]) if L["b_up"] is not None else ffi.NULL
        a.check(lib.pi_cuda_ffn_act(L["variant"], f32(d.g if gated else d.u), f32(d.u), b, f32(d.h), n, ffi.NULL,
                                    float(L["param"]), s), "ffn_act")
        ty, ptr, n_embd = L["down_t"]
        splits = max(1, min(AXPY_SPLITS, n // 16))
        a.check(lib.pi_cuda_axpy_rows(ty, ptr, L["rows"], n_embd, i32, n, ffi.NULL, f32(d.h), splits,
                                      f32(d.partials), f32(d.y), s), "axpy_rows")
        return n

    def _collect(self, n: int, y_out: np.ndarray) -> int:
        """y of the enqueued token into y_out; returns its non-zero h count."""
        if n == 0:
            y_out[:] = 0
            return 0
        a, h = self.dev.arena, np.empty(n, dtype=np.float32)
        a.download(self.dev.y, y_out)
        a.download(self.dev.h, h)
        a.sync()
        return int(np.count_nonzero(h))

    def wait(self) -> tuple[np.ndarray, int]:
        y = np.zeros((self.x.shape[0], self.dev.n_embd), dtype=np.float32)
        if self.n_sel is not None:
            return y, self._collect(self.n_sel, y[0])
        nnz = sum(self._collect(self._enqueue(t), y[t]) for t in range(self.x.shape[0]))
        return y, nnz
