"""Options that several commands share (run, bench, chat, perplexity): help texts and metavars in one place."""
from __future__ import annotations

SPARSE_METAVAR = "[predictor|exact|threshold|off]"
SPARSE_HELP = ('FFN mode: "predictor" (default for PowerInfer/PWRI files: only predicted-active neurons), '
               '"exact" (ReLU models: only non-zero neurons, bit-for-bit dense), "threshold" (SwiGLU/GeGLU models '
               'calibrated by `powerinfer calibrate`: skip neurons with small |act(gate)|) or "off" (dense; '
               'default for GGUF).')
SPARSITY_HELP = ("--sparse threshold: fraction of FFN neurons to skip, in [0, 1) (default: the sparsity the file "
                 "was calibrated for; 0 = dense).")
BACKEND_HELP = ('"auto": hot FFN neurons of a PWRI model on the GPU when one is usable, else the CPU; "cpu"; '
                '"cuda"; "cpu-emulated": the hybrid executor on the CPU kernels (testing).')
BUDGET_HELP = "GiB of GPU memory for the hybrid backend (default: 90% of the free memory)."
