"""`powerinfer place`: solve the hot/cold neuron placement of a PWRI model for a VRAM budget, print it and
optionally write it as a .gpuidx sidecar (powerinfer_py/hybrid/placement.py, gpuidx.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from . import options as O
from .shell import model_path, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer place -m model.powerinfer.gguf --vram-budget 8
  powerinfer place -m model.powerinfer.gguf --vram-budget 8 --activations ./activation -o model.gpuidx
  powerinfer place -m model.powerinfer.gguf --vram-budget 4 -c 2048 --json
"""


def place(
    model: str = typer.Option(..., "-m", "--model", help="A PowerInfer (PWRI) model file."),
    vram_budget: float = typer.Option(..., "--vram-budget", min=0.0, help="Device memory to plan for, in GiB."),
    activations: Optional[Path] = typer.Option(
        None, "--activations", help="Activation statistics: a folder of activation_N.pt, or .npz/.json/.pt "
        "(default: activation/ beside the model, else a short profile of the model)."),
    ctx_size: Optional[int] = typer.Option(None, "-c", "--ctx-size", min=1,
                                           help="Context the KV cache is sized for (default: the runtime's)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the plan as a .gpuidx sidecar."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    threads: Optional[int] = O.flag("threads", help="CPU threads for a profile."),
) -> None:
    """Choose each layer's hot FFN neurons (on the GPU) under a VRAM budget, maximising the activations there."""
    from powerinfer_py.hybrid.gpuidx import write_gpuidx
    from powerinfer_py.tools.place import plan_for_file

    with user_errors():
        plan = plan_for_file(model_path(model), vram_budget, ctx_size, activations, threads)
        if output is not None:
            write_gpuidx(output, plan)
    fp = plan.footprint
    mib = 1 << 20
    if as_json:
        print(json.dumps({"budget_bytes": plan.budget, "device_bytes": plan.device_bytes,
                          "fixed_bytes": fp.fixed, "gpu_share": plan.gpu_share,
                          "layers": [{"layer": il, "hot": len(h), "bytes": fp.layer_bytes(len(h), il),
                                      "share": s} for il, (h, s) in enumerate(zip(plan.hot, plan.shares))],
                          "output": str(output) if output else None}))
        return
    print(f"budget {plan.budget / mib:.1f} MiB; fixed on the device first: {fp.fixed_bytes / mib:.1f} MiB")
    for name, n in fp.fixed.items():
        print(f"  {name:<20} {n / mib:10.2f} MiB")
    print(f"{'layer':>5} {'hot neurons':>12} {'of n_ff':>8} {'MiB':>9} {'activation share':>17}")
    for il, (hot, share) in enumerate(zip(plan.hot, plan.shares)):
        print(f"{il:>5} {len(hot):>12} {100 * len(hot) / plan.n_ff:>7.1f}% {fp.layer_bytes(len(hot), il) / mib:>9.2f} "
              f"{100 * share:>16.1f}%")
    print(f"device total {plan.device_bytes / mib:.1f} MiB of {plan.budget / mib:.1f} MiB; "
          f"expected share of activations on the device: {100 * plan.gpu_share:.1f}%")
    if output is not None:
        print(f"wrote {output}")
