"""LLM: the high-level object a script or the CLI holds: file, weights, kernels, model, tokenizer and cache.

    llm = powerinfer_py.load("model.gguf", threads=4)
    for piece in llm.generate("The capital of France is", max_tokens=32, temperature=0):
        print(piece, end="", flush=True)
    print(llm.last_stats.decode_tok_s)
    print(llm.sparsity_stats.fractions)   # ReLU-family models: per-layer fraction of active neurons

PowerInfer (PWRI) files run in sparse mode "predictor" by default; load(..., sparse="exact" | "off") picks
another mode and sparse_threshold (or $LLAMA_SPARSE_PRED_THRESHOLD) overrides the file's threshold (ffn.py).
SwiGLU/GeGLU models calibrated by `powerinfer calibrate` run with sparse="threshold" by default (and
optionally sparsity=S, default the calibrated one; threshold.py); sparse="off" runs them dense. Files written by
`powerinfer calibrate --wide` run with sparse="wide" by default (sparsity=S: the model-wide share of projection
bytes skipped, in [0, 0.95]; layers/wide.py).

load()'s keywords are options.LoadOptions' fields, generate()'s SamplingParams'; stream() takes a
SamplingParams and yields generate.TextPieces (text, token ids, the stop reason), the stream generate() reads.
Each generate() call starts from an empty context (the cache is reset), prefills the prompt and streams.
There is one cache, so starting a generation ends the one before it (its iterator simply stops).
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Iterator, Sequence

from .generate import Generation, GenerationStats, TextStream, generate, stream_text
from .options import SamplingParams, check_stops, pick
from .sampler import LogprobRecorder, Sampler

DEFAULT_MAX_CTX = 4096  # default context: min(n_ctx_train, this), keeps the KV cache small by default


def _make_kernels(backend: str, threads: int | None):
    if backend in ("cpu", "auto", "cuda", "cpu-emulated"):  # the hybrid backends run on the CPU kernels too
        from .kernels.cpu import CpuKernels
        return CpuKernels(threads)
    if backend == "ref":  # the numpy specification: slow, for tests and debugging
        from .kernels.ref import RefKernels
        return RefKernels()
    raise ValueError(f"unknown backend {backend!r}; available: auto, cpu, cuda, cpu-emulated, ref")


class LLM:
    """A loaded model ready to generate. Build it with powerinfer_py.load(); close() releases it."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None, n_ctx: int | None = None, *,
                 backend: str = "cpu", cache_dir: str | os.PathLike | None = None, sparse: str | None = None,
                 sparse_threshold: float | None = None, sparsity: float | None = None,
                 predictor_dtype: str = "auto", vram_budget: float | None = None,
                 placement: str | os.PathLike | None = None, use_mmap: bool = True):
        from . import models
        from .gguf import open_gguf
        from .gguf.load import Conversion, load_weights
        from .layers.ffn import predictor_copies, runtime_sparse
        from .tokenizer import Tokenizer

        self.path = Path(path)
        self.file = open_gguf(self.path, use_mmap=use_mmap)
        try:
            # file -> config (the arch's module reads its keys) -> checked weights -> model
            self.config = models.read_config(self.file)
            weights = load_weights(self.file, expected=models.expected_tensors, config=self.config)
            self.conversions = weights.conversions
            if n_ctx is not None and n_ctx < 1:
                raise ValueError(f"n_ctx must be at least 1, got {n_ctx}")
            self.n_ctx = int(n_ctx) if n_ctx else min(self.config.n_ctx_train, DEFAULT_MAX_CTX)
            self.sparse = runtime_sparse(self.config, sparse, sparse_threshold, sparsity,  # mode + threshold
                                         predictor_dtype)
            self.kernels = _make_kernels(backend, threads)
            self.model = models.build_model(self.config, weights.tensors, self.kernels, self.sparse)
            # the predictors copied into another type at load (--predictor-dtype) count as conversions too
            self.conversions = self.conversions + [
                Conversion(new.name, old.type, new.type) for old, new in predictor_copies(self.model)]
            self.backend = None
            if backend != "ref":  # what runs where (hybrid/backend.py); .lines() explains it
                from .hybrid import attach_backend
                self.backend = attach_backend(self.model, weights.tensors, self.path, self.n_ctx, backend,
                                              vram_budget, placement)
            self.tokenizer = Tokenizer(self.file, cache_dir=cache_dir)
        except BaseException:
            self.file.close()
            raise
        self._cache = None  # allocated by the first generate()
        self._closed = False
        self._active: Generation | None = None  # the generation that owns the cache right now
        self.last_stats: GenerationStats | None = None

    @property
    def context_note(self) -> str | None:
        """A warning when the context is longer than the model was trained for (llama.cpp warns too), else None."""
        if self.n_ctx <= self.config.n_ctx_train:
            return None
        return (f"the context ({self.n_ctx} tokens) is longer than the {self.config.n_ctx_train} the model was "
                "trained on: text past that point may come out garbled")

    # -- tokens ------------------------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, ids: Sequence[int], special: bool = False) -> str:
        return self.tokenizer.decode(ids, special=special)

    # -- generation --------------------------------------------------------------------------------------

    @property
    def sparsity_stats(self):
        """ffn.SparsityStats of the last generation (per-layer .fractions of active neurons per token, prompt
        and generated tokens together), or None for models whose FFN is not ReLU-family (unless they run in
        threshold mode, where .skipped_fraction is the share of neurons below the cut-offs)."""
        return self.model.sparsity

    @property
    def cache(self):
        if self._cache is None:
            self._cache = self.model.new_cache(self.n_ctx)
        return self._cache

    def reset(self) -> None:
        """Forget the context (the cache keeps its memory for the next generation)."""
        if self._cache is not None:
            self._cache.clear()

    def generate_tokens(self, prompt: str | Sequence[int], max_tokens: int = 128, temperature: float = 0.8,
                        top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
                        repeat_last_n: int = 64, seed: int | None = None, add_bos: bool = True,
                        prefill_batch: int = 256, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                        logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
                        echo: bool = False) -> Generation:
        """Generated token ids for a prompt (text, or token ids used as they are). temperature <= 0 is
        greedy; max_tokens < 0 runs until an end-of-generation token or a full context. The returned
        Generation's .stats (also self.last_stats) fill in as it runs. Raises ContextFullError if the
        prompt does not fit. The sampling keywords are SamplingParams' fields (options.py).

        logprobs N (0-20) records each generated token's log-probability and the N most likely tokens at its
        position in the Generation's .logprobs (a LogprobRecorder); echo records them for the prompt's tokens
        too (all but the first), at the cost of the logits of every prompt position."""
        given = dict(locals())  # this method's sampling keywords are named after SamplingParams' fields
        ids = self._prompt_ids(prompt, add_bos)
        return self._start(ids, pick(SamplingParams, given), prefill_batch, logprobs, echo)

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, temperature: float = 0.8,
                 top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
                 repeat_last_n: int = 64, seed: int | None = None, add_bos: bool = True,
                 prefill_batch: int = 256, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 logit_bias: dict[int, float] | None = None, stop: str | Sequence[str] | None = None) -> Iterator[str]:
        """Generated text, streamed in pieces that never split a UTF-8 character (arguments as in
        generate_tokens). stop: a string or strings that end the text where one first appears (it is not
        yielded; text that could still become one is held back until decided; last_stats.stop_reason is then
        "stop string"). The prompt is checked, and a ContextFullError raised, at the call, not lazily."""
        given = dict(locals())
        check_stops(stop)
        ids = self._prompt_ids(prompt, add_bos)
        params = pick(SamplingParams, given)
        return _texts(self._stream(ids, params, prefill_batch))

    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *, add_bos: bool = True,
               prefill_batch: int = 256, logprobs: int | None = None, echo: bool = False) -> TextStream:
        """The generation as generate.TextPieces (text, token ids, logprobs when asked, the stop reason on the
        last): what generate() yields the texts of, for callers that also want the tokens or the reason.
        params: sampling, max_tokens and stop strings (default SamplingParams()); the rest as in
        generate_tokens (logprobs N puts each piece's entries in piece.logprobs)."""
        ids = self._prompt_ids(prompt, add_bos)
        return self._stream(ids, params or SamplingParams(), prefill_batch, logprobs, echo)

    def _prompt_ids(self, prompt: str | Sequence[int], add_bos: bool) -> list[int]:
        if self._closed:
            raise ValueError(f"this LLM ({self.path}) has been closed")
        return self.tokenize(prompt, add_bos=add_bos) if isinstance(prompt, str) else [int(t) for t in prompt]

    def _stream(self, ids: list[int], params: SamplingParams, prefill_batch: int, logprobs: int | None = None,
                echo: bool = False) -> TextStream:
        gen = self._start(ids, params, prefill_batch, logprobs, echo)
        return stream_text(gen, self.tokenizer, params.stop, logprobs=gen.logprobs is not None)

    def _start(self, ids: list[int], params: SamplingParams, prefill_batch: int, logprobs: int | None,
               echo: bool) -> Generation:
        params.check_vocab(self.tokenizer.n_vocab)
        if self._active is not None:  # one cache, one generation: end the previous one before reusing it
            self._active.close()
        self.reset()
        if self.model.sparsity is not None:
            self.model.sparsity.reset()
        recorder = None
        if logprobs is not None or echo:
            recorder = LogprobRecorder(top_n=logprobs or 0, echo=echo)
        gen = self._active = generate(self.model, self.cache, ids, Sampler(params), params.max_tokens,
                                      self.tokenizer.is_eog, prefill_batch=prefill_batch, logprobs=recorder)
        self.last_stats = gen.stats
        return gen

    # -- lifetime ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the tokenizer, the kernels' thread pool and the file map. The LLM is unusable after."""
        for part in ("backend", "tokenizer", "kernels", "file"):
            obj = getattr(self, part, None)
            if obj is not None and hasattr(obj, "close"):
                obj.close()
        self._cache = None
        self._closed = True

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.config
        return f"LLM({self.path.name!r}, arch={c.arch}, n_layer={c.n_layer}, n_embd={c.n_embd}, n_ctx={self.n_ctx})"


def load(path: str | os.PathLike, *args, **options) -> LLM:
    """Open a GGUF or PWRI model file and get it ready to generate.

    threads: CPU threads for the kernels (default: all cores). n_ctx: context size in tokens (default:
    min(training context, 4096)). backend: "cpu" (C kernels), "ref" (numpy reference, slow), or a hybrid
    backend for PWRI files: "auto", "cuda" (hot neurons on the GPU, falling back to the CPU when there is
    none) or "cpu-emulated" (the hybrid executor on the CPU kernels); vram_budget (GiB) and placement (a
    .gpuidx file) size and place the hot set (powerinfer_py/hybrid/backend.py).
    cache_dir: folder for the tokenizer's vocab-only copies of PWRI files (default
    $POWERINFER_CACHE/vocab or ~/.cache/powerinfer/vocab).
    sparse: "predictor" (default for PowerInfer PWRI files), "exact" (ReLU-family models: bit-for-bit dense,
    computing only non-zero neurons) or "off" (dense; the default for GGUF files). sparse_threshold: the
    predictor threshold, overriding $LLAMA_SPARSE_PRED_THRESHOLD and the file's powerinfer.sparse_threshold.
    sparse="threshold" (SwiGLU/GeGLU models with `powerinfer calibrate` metadata, and their default) skips the
    neurons whose |act(gate)| is below the per-layer cut-off; sparsity: the fraction to skip (default: the
    calibrated one).
    predictor_dtype: how predictor mode runs a float (F32/F16/BF16) predictor: "exact" as stored, "q8_0" or
    "q4_0" a copy quantized at load; "auto" (the default): "q8_0" for ReLU-family models, "exact" for SwiGLU/GeGLU
    models with trained predictors (ffn.resolve_predictor; docs/sparse.md has the measurements behind it).
    Quantized predictors run as stored.
    use_mmap=False reads the file into memory instead of mapping it (llama.cpp's --no-mmap; see open_gguf).
    """
    return LLM(path, *args, **options)


# load() takes exactly LLM(...)'s arguments (options.LoadOptions' fields); its signature says so for help()
load.__signature__ = inspect.signature(LLM).replace(return_annotation=LLM)


def _texts(stream: TextStream) -> Iterator[str]:
    """The non-empty texts of a stream; leaving early (or a new generation) stops it."""
    try:
        for piece in stream:
            if piece.text:
                yield piece.text
    finally:
        stream.close()
