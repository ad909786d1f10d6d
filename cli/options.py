"""Options that several commands share (run, bench, chat, perplexity): help texts, metavars and, for the options
that run and chat both take, the typer.Option objects themselves (one definition, the same flags everywhere)."""
from __future__ import annotations

import typer

SPARSE_METAVAR = "[predictor|exact|threshold|off]"
SPARSE_HELP = ('FFN mode: "predictor" (default for PowerInfer/PWRI files: only predicted-active neurons), '
               '"exact" (ReLU models: only non-zero neurons, bit-for-bit dense), "threshold" (SwiGLU/GeGLU models '
               'calibrated by `powerinfer calibrate`: skip neurons with small |act(gate)|; default for such files) or '
               '"off" (dense; default for other GGUF files).')
SPARSITY_HELP = ("--sparse threshold: fraction of FFN neurons to skip, in [0, 1) (default: the sparsity the file "
                 "was calibrated for; 0 = dense).")
BACKEND_HELP = ('"auto": hot FFN neurons of a PWRI model on the GPU when one is usable, else the CPU; "cpu"; '
                '"cuda"; "cpu-emulated": the hybrid executor on the CPU kernels (testing).')
TEMPLATE_HELP = ("Chat format: llama-2, llama-3, chatml, gemma, mistral, phi-3, plain (User:/Assistant:), or model (the "
                 "file's own). Default: the file's own, else one chosen by architecture.")
BUDGET_HELP = "GiB of GPU memory for the hybrid backend (default: 90% of the free memory)."

MODEL = typer.Option(..., "-m", "--model", help='GGUF or PWRI file, or "demo" (Gemma 3 270M).')
TEMP = typer.Option(0.8, "--temp", min=0.0, help="Temperature; 0 = greedy (argmax).")
TOP_K = typer.Option(40, "--top-k", min=0, help="Keep the k most likely tokens (0 = all).")
TOP_P = typer.Option(0.95, "--top-p", min=0.0, max=1.0, help="Nucleus mass to keep (1 = off).")
MIN_P = typer.Option(0.05, "--min-p", min=0.0, max=1.0, help="Drop tokens below min_p x the top probability (0 = off).")
REPEAT_PENALTY = typer.Option(1.0, "--repeat-penalty", min=0.0, help="Penalty for recently seen tokens (1 = off).")
REPEAT_LAST_N = typer.Option(64, "--repeat-last-n", min=-1, help="How many recent tokens the repeat, frequency and "
                             "presence penalties look at (0 = none, -1 = all, as llama.cpp).")


def _finite(value: float) -> float:
    if value != value or value in (float("inf"), float("-inf")):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


FREQUENCY_PENALTY = typer.Option(0.0, "--frequency-penalty", callback=_finite, help="Subtract this times a token's count among the "
                                 "recent tokens from its logit (0 = off; OpenAI's frequency_penalty).")
PRESENCE_PENALTY = typer.Option(0.0, "--presence-penalty", callback=_finite, help="Subtract this from the logit of every token among "
                                "the recent tokens (0 = off; OpenAI's presence_penalty).")
SEED = typer.Option(None, "-s", "--seed", min=-1,
                    help="Random seed: the same seed, the same text (-1: a random one, as without --seed).")
THREADS = typer.Option(None, "-t", "--threads", min=1,
                       help="CPU threads (default: every CPU this process may use).")
CTX_SIZE = typer.Option(None, "-c", "--ctx-size", min=1, help="Context window in tokens (default: the runtime's).")
SPARSE = typer.Option(None, "--sparse", metavar=SPARSE_METAVAR, help=SPARSE_HELP)
SPARSITY = typer.Option(None, "--sparsity", help=SPARSITY_HELP)
SPARSE_THRESHOLD = typer.Option(
    None, "--sparse-threshold", help="Predictor threshold: a neuron is active when its predictor logit is >= this "
    "(default: the file's powerinfer.sparse_threshold, or $LLAMA_SPARSE_PRED_THRESHOLD).")
BACKEND = typer.Option("auto", "--backend", metavar="[auto|cpu|cuda|cpu-emulated]", help=BACKEND_HELP)
VRAM_BUDGET = typer.Option(None, "--vram-budget", min=0.0, help=BUDGET_HELP)
NO_MMAP = typer.Option(False, "--no-mmap", help="Read the weights into memory instead of mapping the file "
                       "(llama.cpp's --no-mmap): RAM for the whole file and a slower start; decodes faster where "
                       "mapped file pages read slower (docs/performance.md).")
