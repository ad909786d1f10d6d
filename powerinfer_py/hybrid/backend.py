"""Choosing the backend once, when the model is built: cpu, hybrid on a CUDA device, or hybrid emulated.

    auto          hybrid on the GPU when the CUDA library loads, a device answers and the model is a PWRI
                  file in predictor mode; else the CPU, with the reason kept for `run --verbose` / `info`
    cpu           the CPU kernels only
    cuda          as auto, but a missing device is worth a warning (the CPU still runs)
    cpu-emulated  the hybrid executor with the device half run by the CPU kernels (testing, no GPU needed)

The placement comes from, in order: an explicit .gpuidx (`placement`), the model's own sidecar
<model>.generated.gpuidx when no budget is given, or a fresh exact solve (placement.py) for the budget from
activation statistics (`activations`, else the activation/ folder beside the model, else a short profile of
the model on PROFILE_TOKENS random tokens). Default budget: 90% of the device's free memory (cuda), or the
fixed buffers plus half of the FFN weights (cpu-emulated). Whatever the source, the plan's device bytes must fit
the budget, or loading stops with the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import PowerInferError, UnsupportedError
from ..placement import (
    MIB,
    Footprint,
    Placement,
    budget_bytes,
    default_sidecar,
    footprint,
    plan_placement,
)
from .emulated import EmulatedDevice
from .split import HybridSplit

BACKENDS = ("auto", "cpu", "cuda", "cpu-emulated")
PROFILE_TOKENS = 128


@dataclass
class BackendReport:
    requested: str
    running: str  # "cpu", "hybrid cuda" or "hybrid cpu-emulated"
    reason: str
    warn: bool = False  # the user asked for something that is not what runs
    plan: Placement | None = None
    device: object | None = None
    splits: list = field(default_factory=list)

    def lines(self) -> list[str]:
        """What `run --verbose` prints about the backend."""
        out = [f"backend: {self.running} ({self.reason})"]
        p = self.plan
        if p is not None:
            out.append(f"placement: {sum(p.n_hot)} of {p.n_ff * len(p.hot)} FFN neurons on the device, "
                       f"{p.device_bytes / MIB:.1f} MiB of a {p.budget / MIB:.1f} MiB budget"
                       + (f", expected device share of activations {100 * p.gpu_share:.1f}%" if p.mass else ""))
        dev = sum(s.device_rows for s in self.splits)
        cpu = sum(s.cpu_rows for s in self.splits)
        if dev + cpu:
            out.append(f"active neurons computed on the device: {100 * dev / (dev + cpu):.1f}%")
        return out

    def close(self) -> None:
        if self.device is not None:
            self.device.close()
            self.device = None


def attach_backend(model, tensors, model_path, n_ctx: int, backend: str = "cpu", vram_budget: float | None = None,
                   placement: str | Path | None = None, activations: str | Path | None = None) -> BackendReport:
    """Set up `backend` for a built model (models.Model with .ffns) and return what runs and why."""
    if backend not in BACKENDS:
        raise UnsupportedError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}")
    if backend == "cpu":
        return BackendReport(backend, "cpu", "asked for")
    c = model.config
    if not c.is_sparse or model.sparse.mode != "predictor":  # checked first: dense runs never touch CUDA
        why = "a dense GGUF file" if not c.is_sparse else f"sparse mode {model.sparse.mode!r}"
        return BackendReport(backend, "cpu", f"hybrid execution needs a PWRI model in predictor mode, this is {why}",
                             warn=backend != "auto")
    status = None
    if backend in ("auto", "cuda"):
        from ..kernels.cuda import cuda_status
        status = cuda_status()
        if not status.available:
            return BackendReport(backend, "cpu", f"CUDA unavailable: {status.reason}", warn=backend == "cuda")
    fp = footprint(c, tensors, n_ctx)
    budget = budget_bytes(vram_budget) if vram_budget is not None else None
    if budget is None:
        if status is not None:
            from ..kernels.cuda import device_free_bytes
            budget = int(0.9 * device_free_bytes())
        elif placement is None:
            budget = fp.fixed_bytes + sum(fp.neuron_bytes) * c.n_ff // 2
    plan = _placement(model, fp, model_path, budget, placement, activations)
    try:
        return _attach(model, plan, fp, backend, status)
    except PowerInferError as e:
        from ..kernels.cuda import CudaError
        if backend != "auto" or not isinstance(e, CudaError):
            raise
        return BackendReport(backend, "cpu", f"the CUDA setup failed: {e}")


def _attach(model, plan: Placement, fp: Footprint, backend: str, status) -> BackendReport:
    """Build the device half (CUDA when `status` says a device answers, else emulated) and split every FFN."""
    c = model.config
    if status is not None:
        from .cuda_device import CudaDevice
        device = CudaDevice(plan.device_bytes, c.n_embd, c.n_ff)
    else:
        device = EmulatedDevice(model.kernels, plan.budget, fp.fixed_bytes)
    report = BackendReport(backend, f"hybrid {device.name}", status.reason if status else "CPU kernels play the device",
                           plan=plan, device=device)
    try:
        for il, ffn in enumerate(model.ffns):
            device.add_layer(il, ffn, plan.hot[il])
            report.splits.append(HybridSplit(device, il, c.n_ff, plan.hot[il]))
    except BaseException:
        report.close()
        raise
    for ffn, split in zip(model.ffns, report.splits):  # only once every layer is on the device
        ffn.split = split
    return report


def _placement(model, fp: Footprint, model_path, budget: int | None, placement, activations) -> Placement:
    c = model.config
    sidecar = Path(placement) if placement is not None else default_sidecar(model_path)
    if placement is not None or (budget is None and sidecar.is_file()):
        from ..gpuidx import read_gpuidx
        plan = read_gpuidx(sidecar, c.n_layer, c.n_ff)
        plan.footprint = fp
        budget = plan.budget if budget is None else budget
        if plan.device_bytes > budget:
            raise PowerInferError(f"{sidecar}: the placement needs {plan.device_bytes / MIB:.1f} MiB of device "
                                  f"memory, the budget is {budget / MIB:.1f} MiB")
        plan.budget = budget
        return plan
    return plan_placement(fp, activation_counts(model, model_path, activations), budget)


def activation_counts(model, model_path, activations=None, n_tokens: int = PROFILE_TOKENS) -> list[np.ndarray]:
    """Per-layer counts: from `activations`, the activation/ folder beside the model, or a profile."""
    from ..activations import find_activations, load_activations, profile_activations

    c = model.config
    source = Path(activations) if activations is not None else find_activations(model_path)
    if source is not None:
        return load_activations(source, c.n_layer, c.n_ff)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.n_vocab, n_tokens)
    cache = model.new_cache(min(n_tokens, c.n_ctx_train))
    return profile_activations(model, cache, tokens, batch=min(64, n_tokens))


def plan_for_file(path, vram_budget: float, n_ctx: int | None = None, activations=None,
                  threads: int | None = None) -> Placement:
    """The exact placement of a PWRI file for a budget in GiB (what `powerinfer place` prints). Reads only
    the header when statistics are found; otherwise loads the model on the CPU to profile it."""
    from ..activations import find_activations, load_activations
    from ..gguf import open_gguf
    from ..llm import DEFAULT_MAX_CTX
    from ..models import read_config

    f = open_gguf(path)
    try:
        c = read_config(f)
        n_ctx = n_ctx or min(c.n_ctx_train, DEFAULT_MAX_CTX)
        fp = footprint(c, f.tensors, n_ctx)
        source = Path(activations) if activations is not None else find_activations(path)
        counts = load_activations(source, c.n_layer, c.n_ff) if source is not None else None
    finally:
        f.close()
    if counts is None:
        from ..llm import load
        with load(path, threads=threads, n_ctx=min(n_ctx, PROFILE_TOKENS), backend="cpu") as llm:
            counts = activation_counts(llm.model, path)
    return plan_placement(fp, counts, budget_bytes(vram_budget))
