"""`powerinfer place`'s plan for a file: the exact hot/cold neuron placement of a PWRI model for a VRAM budget,
from its header and activation statistics, or from a short profile of the model when none are found.

This needs the whole runtime (it may load the model), so it lives here rather than in hybrid/, which the runtime
itself imports to attach a backend."""
from __future__ import annotations

from pathlib import Path

from ..models import read_config
from ..gguf import open_gguf
from ..hybrid.activations import find_activations, load_activations
from ..hybrid.backend import PROFILE_TOKENS, activation_counts
from ..hybrid.placement import Placement, budget_bytes, footprint, plan_placement
from ..llm import DEFAULT_MAX_CTX, load


def plan_for_file(path, vram_budget: float, n_ctx: int | None = None, activations=None,
                  threads: int | None = None) -> Placement:
    """The exact placement of a PWRI file for a budget in GiB (what `powerinfer place` prints). Reads only
    the header when statistics are found; otherwise loads the model on the CPU to profile it."""
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
        with load(path, threads=threads, n_ctx=min(n_ctx, PROFILE_TOKENS), backend="cpu") as llm:
            counts = activation_counts(llm.model, path)
    return plan_placement(fp, counts, budget_bytes(vram_budget))
