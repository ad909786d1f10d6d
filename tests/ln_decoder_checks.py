"""Shared pieces of tests/test_phi2.py, test_stablelm.py and test_starcoder2.py (models/ln_decoder.py): the
token sequence, the llama.cpp comparison, and the "wrong model" subclasses whose distance from llama.cpp's
logits shows that each detail of the block is needed."""
from __future__ import annotations

import numpy as np
from llama_ref import llama_cpp_logits
from model_checks import batch_and_steps, load_model, rel_err

from powerinfer_py.models.ln_decoder import LnDecoderModel

TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322], dtype=np.int32)
TOL, QUANT_TOL = 0.01, 0.25  # max |logit difference| / std of llama.cpp's logits, at F32 and Q8_0


def check_against_llama_cpp(path, dtype: str) -> float:
    """Every position's logits within TOL (QUANT_TOL at Q8_0) of llama.cpp's spread, the same top-1 at F32, and
    one token at a time giving the batch's logits; returns the relative error."""
    theirs = llama_cpp_logits(path, TOKENS)
    batch, steps = batch_and_steps(path, TOKENS)
    err = rel_err(batch, theirs)
    assert err < (TOL if dtype == "f32" else QUANT_TOL), err
    if dtype == "f32":
        assert (batch.argmax(1) == theirs.argmax(1)).all()
    np.testing.assert_allclose(steps, batch, rtol=0, atol=1e-4 * batch.std())
    return err


def all_logits(model) -> np.ndarray:
    return model.forward(TOKENS, model.new_cache(32), all_logits=True)


def without(*attrs: str):
    """A model class that drops the named per-layer tensors ("bo", "bq", "q_norm", ...; "output_b" the head's
    bias; "ffn_biases" the FFN's up and down biases): a converter or loader that forgot them."""

    class Without(LnDecoderModel):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            for name in attrs:
                if name == "output_b":
                    self.output_b = None
                elif name == "ffn_biases":
                    for f in self.ffns:
                        f.w.b_up = f.w.b_down = None
                else:
                    for L in self.layers:
                        setattr(L, name, None)

    return Without


class Sequential(LnDecoderModel):
    """Wrong for phi2 and parallel stablelm: the FFN after the attention, on attn_norm of the updated residual."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        for L in self.layers:
            if L.ffn_norm is None:
                L.ffn_norm, L.ffn_norm_b = L.attn_norm, L.attn_norm_b


class Parallel(LnDecoderModel):
    """Wrong for starcoder2 and sequential stablelm: the FFN reads the attention's normed input."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        for L in self.layers:
            L.ffn_norm = L.ffn_norm_b = None


def distances(path, kernels, mutations: dict) -> tuple[float, dict[str, float]]:
    """(the right model's error, {name: a wrong model's error}) against llama.cpp on path; mutations maps a name
    to (model class or None, config changes)."""
    theirs = llama_cpp_logits(path, TOKENS)
    right = rel_err(all_logits(load_model(path, kernels)), theirs)
    wrong = {name: rel_err(all_logits(load_model(path, kernels, cls, **changes)), theirs)
             for name, (cls, changes) in mutations.items()}
    print(f"right {right:.4f}", {k: round(v, 3) for k, v in wrong.items()})
    return right, wrong
