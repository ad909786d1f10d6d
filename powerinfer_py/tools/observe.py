"""Run a model over calibration tokens and show every layer's FFN activations to a callback.

Profiling (profile.py) and predictor training (predictor_train.py) both need the same thing: the model's real
forward pass over some text, with each layer's FFN observer (ffn.FFN.observer) reporting the predictor input
p and the activated gating values act of every token. This module owns that loop:

  - calibration_tokens(): the token ids of a text, or, without text, tokens sampled from the model itself;
  - chunks(): those ids cut into context-sized sequences, each starting with the vocabulary's BOS (if any);
  - observe(): every chunk through the model (fresh KV cache per chunk, prefill batches of `batch` tokens),
    calling callback(layer, p, act) with p f32 [n, n_embd] and act f32 [n, n_ff] for the n tokens of a batch.

The BOS token of each chunk is shown to the model but not to the callback: its activations (the attention
sink) are unlike those of text tokens, and it is not part of the calibration text.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import PowerInferError

Callback = Callable[[int, np.ndarray, np.ndarray], None]  # (layer, p [n, n_embd], act [n, n_ff])


@dataclass
class CalibrationTokens:
    """Token ids to calibrate on (without BOS) and where they came from."""
    ids: list[int]
    source: str  # "text" or "sampled"
    text: str  # the calibration text (for "sampled": the detokenized samples)


def calibration_tokens(llm, text: str | None, n_tokens: int | None, *, seed: int = 0, temperature: float = 0.8,
                       sample_len: int = 256) -> CalibrationTokens:
    """The first n_tokens (all if None) token ids of `text`; without text, n_tokens (default 1024) ids sampled
    from the model, in sequences of sample_len tokens each started from BOS alone (no BOS: a newline)."""
    if text is not None:
        ids = llm.tokenize(text, add_bos=False)
        if not ids:
            raise PowerInferError("the calibration text is empty (no tokens)")
        return CalibrationTokens(ids[:n_tokens] if n_tokens else ids, "text", text)
    want = n_tokens or 1024
    start = _bos(llm) or llm.tokenize("\n", add_bos=False)  # models without BOS start from a newline
    ids: list[int] = []
    texts = []
    rep = 0
    while len(ids) < want:
        n = min(sample_len, want - len(ids))
        gen = llm.generate_tokens(start, max_tokens=n, temperature=temperature, seed=seed + rep, add_bos=False)
        got = list(gen)
        rep += 1
        if not got:
            if rep > 8:
                raise PowerInferError("the model produced no tokens to calibrate on; give a text with --text")
            continue
        ids += got
        texts.append(llm.detokenize(got))
    return CalibrationTokens(ids[:want], "sampled", "\n\n".join(texts))


def _bos(llm) -> list[int]:
    """[BOS] if the vocabulary puts one at the start of a text, else []."""
    return llm.tokenize("", add_bos=True)


def chunks(ids: Sequence[int], ctx: int, bos: Sequence[int]) -> Iterator[list[int]]:
    """ids cut into sequences of at most ctx tokens, each being bos + the next ctx - len(bos) ids."""
    step = ctx - len(bos)
    if step < 1:
        raise PowerInferError(f"the context of {ctx} tokens is too small")
    for i in range(0, len(ids), step):
        yield list(bos) + list(ids[i:i + step])


def observe(llm, ids: Sequence[int], callback: Callback, *, ctx: int = 512, batch: int = 256,
            add_bos: bool = True, progress: Callable[[int, int], None] | None = None) -> int:
    """Run the model over ids (in chunks of ctx tokens, see chunks()) with every FFN observed; callback(layer,
    p, act) sees each batch's text tokens (BOS rows left out; add_bos=False: chunks get no BOS). Returns the
    number of tokens shown. progress(done, total) is called after every batch. The FFN observers are removed
    afterwards."""
    model = llm.model
    ctx = min(ctx, llm.n_ctx)
    bos = _bos(llm) if add_bos else []
    skip = [0]  # rows of the current batch to leave out (the chunk's BOS)

    def observer(layer: int, x: np.ndarray, p: np.ndarray, act: np.ndarray) -> None:
        s = skip[0]
        if act.shape[0] > s:
            callback(layer, p[s:], act[s:])

    for f in model.ffns:
        f.observer = observer
    seen, total = 0, len(ids)
    try:
        for chunk in chunks(ids, ctx, bos):
            cache = model.new_cache(len(chunk))
            for b0 in range(0, len(chunk), batch):
                part = chunk[b0:b0 + batch]
                skip[0] = len(bos) if b0 == 0 else 0
                model.forward(part, cache)
                seen += len(part) - skip[0]
                if progress:
                    progress(seen, total)
    finally:
        for f in model.ffns:
            f.observer = None
    return seen
