"""The PowerInfer model repositories we know by short name (docs/FORMATS.md §4), for `-m bamboo-7b:q4_0` and
`powerinfer models`.

A short name stands for a ready-made PowerInfer GGUF repository; `name:q4_0` / `name:f16` picks the
quantization and `name:file.gguf` an exact file. Sizes are approximate download sizes in GB (10^9 bytes) of the
model file for each quantization the repository holds; they are for orientation, the Hub listing is the truth.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CatalogEntry:
    name: str                    # short name, lower case
    repo_id: str                 # ready-made PowerInfer GGUF repository
    arch: str                    # GGUF architecture the model file declares
    params: str                  # parameter count, as people say it ("7B")
    shape: str                   # d_model / layers / FFN width / activation
    description: str
    sizes_gb: dict[str, float] = field(default_factory=dict)  # quantization -> approx. model file size
    default_quant: str = "f16"
    activation_dir: str = "activation"   # folder of per-layer activation statistics in the repo
    source_repo: str | None = None       # original (HF) weights, input of `powerinfer convert`
    predictor_repo: str | None = None    # activation predictors for the original weights

    @property
    def quants(self) -> tuple[str, ...]:
        return tuple(self.sizes_gb)


CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        "relullama-7b", "PowerInfer/ReluLLaMA-7B-PowerInfer-GGUF", "llama", "7B", "d 4096, L 32, n_ff 11008, ReGLU",
        "LLaMA-2-7B fine-tuned to ReLU activations (SparseLLM), with predictors",
        {"f16": 15.1, "q4_0": 4.4},
        source_repo="SparseLLM/ReluLLaMA-7B", predictor_repo="PowerInfer/ReluLLaMA-7B-Predictor"),
    CatalogEntry(
        "relullama-13b", "PowerInfer/ReluLLaMA-13B-PowerInfer-GGUF", "llama", "13B",
        "d 5120, L 40, n_ff 13824, ReGLU",
        "LLaMA-2-13B fine-tuned to ReLU activations (SparseLLM), with predictors",
        {"f16": 28.0, "q4_0": 8.1},
        source_repo="SparseLLM/ReluLLaMA-13B", predictor_repo="PowerInfer/ReluLLaMA-13B-Predictor"),
    CatalogEntry(
        "relullama-70b", "PowerInfer/ReluLLaMA-70B-PowerInfer-GGUF", "llama", "70B",
        "d 8192, L 80, KV 8, n_ff 28672, ReGLU",
        "LLaMA-2-70B fine-tuned to ReLU activations; Q4 only (F16 exceeds the Hub's file limit: convert it)",
        {"q4_0": 40.0}, default_quant="q4_0",
        source_repo="SparseLLM/ReluLLaMA-70B", predictor_repo="PowerInfer/ReluLLaMA-70B-Predictor"),
    CatalogEntry(
        "relufalcon-40b", "PowerInfer/ReluFalcon-40B-PowerInfer-GGUF", "falcon", "40B",
        "d 8192, L 60, n_ff 32768, ReLU, parallel block",
        "Falcon-40B fine-tuned to ReLU activations; Q4 here, F16 by converting the original weights",
        {"q4_0": 24.0}, default_quant="q4_0",
        source_repo="SparseLLM/ReluFalcon-40B", predictor_repo="PowerInfer/ReluFalcon-40B-Predictor"),
    CatalogEntry(
        "prosparse-7b", "PowerInfer/prosparse-llama-2-7b-gguf", "llama", "7B",
        "d 4096, L 32, n_ff 11008, FATReLU 0.01",
        "ProSparse LLaMA-2-7B: ~89% FFN sparsity (FATReLU threshold), with predictors",
        {"f16": 14.4, "q4_0": 4.2},
        source_repo="SparseLLM/prosparse-llama-2-7b", predictor_repo="PowerInfer/prosparse-llama-2-7b-predictor"),
    CatalogEntry(
        "prosparse-13b", "PowerInfer/prosparse-llama-2-13b-gguf", "llama", "13B",
        "d 5120, L 40, n_ff 13824, FATReLU 0.01",
        "ProSparse LLaMA-2-13B: ~87% FFN sparsity (FATReLU threshold), with predictors",
        {"f16": 27.5, "q4_0": 7.9},
        source_repo="SparseLLM/prosparse-llama-2-13b", predictor_repo="PowerInfer/prosparse-llama-2-13b-predictor"),
    CatalogEntry(
        "bamboo-7b", "PowerInfer/Bamboo-base-v0.1-gguf", "bamboo", "7B", "d 4096, L 32, KV 8, n_ff 14336, dReLU",
        "Bamboo base v0.1: Mistral-shaped model trained with dReLU for high sparsity",
        {"f16": 15.0, "q4_0": 4.4},
        source_repo="PowerInfer/Bamboo-base-v0_1"),
    CatalogEntry(
        "bamboo-7b-dpo", "PowerInfer/Bamboo-DPO-v0.1-gguf", "bamboo", "7B", "d 4096, L 32, KV 8, n_ff 14336, dReLU",
        "Bamboo DPO v0.1: the chat (DPO-tuned) Bamboo",
        {"f16": 15.0, "q4_0": 4.4}, activation_dir="mistral_chat_activation"),
)

_BY_NAME = {e.name: e for e in CATALOG}
_BY_REPO = {e.repo_id.lower(): e for e in CATALOG}


def find(name: str) -> CatalogEntry | None:
    """The entry for a short name (case-insensitive, without any `:quant` suffix), or None."""
    return _BY_NAME.get(name.strip().lower())


def by_repo(repo_id: str) -> CatalogEntry | None:
    """The entry whose repository is `repo_id` (Hub ids are case-insensitive), or None."""
    return _BY_REPO.get(repo_id.strip().lower())
