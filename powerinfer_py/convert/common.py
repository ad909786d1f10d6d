"""What every architecture's mapping in archs.py, glm4.py and phi3.py shares: the checkpoint's sizes (Dims), the
hparams every file carries, the activation keys and the output head (absent when tied)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ModelFileError, UnsupportedError
from .checkpoint import Checkpoint
from .plan import Builder, cfg_value

ACTIVATIONS = ("silu", "relu", "fatrelu")


@dataclass(frozen=True)
class Dims:
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int

    def check(self, ckpt: Checkpoint) -> "Dims":
        """Sizes and counts are whole numbers (config.json may write them as 4096.0); anything else is named."""
        for name, value in vars(self).items():
            if isinstance(value, float) and value.is_integer():
                object.__setattr__(self, name, int(value))
            elif not isinstance(value, int):
                raise ModelFileError(f"{ckpt.folder / 'config.json'}: {name} must be a whole number, got {value!r}")
        if not (self.head_dim >= 1 and 1 <= self.n_head_kv <= self.n_head and self.n_head * self.head_dim <= 64 * self.n_embd):
            raise ModelFileError(f"{ckpt.folder / 'config.json'}: inconsistent attention sizes: {self.n_head} heads "
                                 f"({self.n_head_kv} for K/V) of {self.head_dim} dimensions for hidden_size {self.n_embd}")
        return self

    @classmethod
    def from_config(cls, ckpt: Checkpoint) -> "Dims":
        """The usual config.json names (hidden_size, num_hidden_layers, intermediate_size, heads, head_dim)."""
        n_embd = cfg_value(ckpt, "hidden_size")
        n_head = cfg_value(ckpt, "num_attention_heads")
        return cls(n_layer=cfg_value(ckpt, "num_hidden_layers"), n_embd=n_embd,
                   n_ff=cfg_value(ckpt, "intermediate_size"), n_head=n_head,
                   n_head_kv=cfg_value(ckpt, "num_key_value_heads", default=n_head),
                   head_dim=cfg_value(ckpt, "head_dim", default=n_embd // n_head),
                   n_vocab=cfg_value(ckpt, "vocab_size")).check(ckpt)


LayerHook = Callable[[int], None]  # called after each layer's tensors (adds the predictor's fc1/fc2)


def common_meta(arch: str, d: Dims, n_ctx: int, eps_key: str, eps: float) -> dict[str, Any]:
    return {f"{arch}.context_length": int(n_ctx), f"{arch}.embedding_length": d.n_embd,
            f"{arch}.block_count": d.n_layer, f"{arch}.feed_forward_length": d.n_ff,
            f"{arch}.attention.head_count": d.n_head, f"{arch}.attention.head_count_kv": d.n_head_kv,
            f"{arch}.attention.{eps_key}": float(eps)}


def activation_meta(ckpt: Checkpoint, default: str = "silu") -> dict[str, Any]:
    act = ckpt.config.get("hidden_act", default)
    if act not in ACTIVATIONS:
        raise UnsupportedError(f"{ckpt.folder / 'config.json'}: hidden_act {act!r} is not supported "
                               f"({', '.join(ACTIVATIONS)})")
    if act == "silu":
        return {}
    meta: dict[str, Any] = {"powerinfer.hidden_act": act}
    if act == "fatrelu":
        meta["powerinfer.hidden_act_param"] = float(ckpt.config.get("hidden_act_param", 0.0))
    return meta


def output_head(b: Builder, ckpt: Checkpoint, hf_name: str, d: Dims, tied_default: bool) -> None:
    """output.weight, unless the embeddings are tied (llama.cpp then reuses token_embd.weight)."""
    if ckpt.config.get("tie_word_embeddings", tied_default):
        if ckpt.has(hf_name):
            b.used.add(hf_name)  # a saved copy of the tied matrix: not needed
        return
    b.add("output.weight", hf_name, (d.n_vocab, d.n_embd))
