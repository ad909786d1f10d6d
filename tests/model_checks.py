"""Checks several architecture test files share: one batch against one token at a time, the one-call decode
step (C attention block) against the Python path, logits against llama.cpp; and two helpers for bad-file and
`info` tests (rewrite_gguf, info_text)."""
from __future__ import annotations

import numpy as np

from powerinfer_py import load


def batch_and_steps(path, tokens, n_ctx: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(all logits of one batch of `tokens`, the logits of the same tokens fed one at a time) on the file."""
    with load(path, threads=2) as llm:
        net = llm.model
        batch = net.forward(np.array(tokens, np.int32), net.new_cache(n_ctx), all_logits=True)
        cache = net.new_cache(n_ctx)
        steps = np.stack([net.forward(np.array([t], np.int32), cache) for t in tokens])
    return batch, steps


def assert_fused_decode_equals_python(model, tokens, n_prompt: int = 3) -> None:
    """A prompt of n_prompt tokens, then one token at a time: the one-call C attention step gives the Python
    path's logits and KV cache bit for bit, and the steps agree with one prefill of all the tokens (the same
    arithmetic up to the order of sums)."""
    runs = []
    for fused in (True, False):
        model.fused_attention = fused
        assert (model.attn_plans() is not None) == fused
        cache = model.new_cache(32)
        out = [model.forward(tokens[:n_prompt], cache)]
        out += [model.forward(tokens[i:i + 1], cache) for i in range(n_prompt, len(tokens))]
        runs.append((out, cache))
    model.fused_attention = True
    (a, ca), (b, cb) = runs
    assert all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b))
    assert all(np.array_equal(ca.k[il], cb.k[il]) and np.array_equal(ca.v[il], cb.v[il])
               for il in range(model.config.n_layer))
    batch = model.forward(tokens, model.new_cache(32), all_logits=True)
    np.testing.assert_allclose(np.stack(a[1:]), batch[n_prompt:], rtol=0, atol=1e-3 * batch.std())
    np.testing.assert_allclose(a[0], batch[n_prompt - 1], rtol=0, atol=1e-3 * batch.std())


def assert_matches_llama_cpp(path, tokens, tol: float, same_top1: bool) -> None:
    """Our logits at every position within tol x the spread of llama.cpp's on the same file (and the same
    top-1 everywhere if same_top1); one token at a time gives the batch's logits."""
    from llama_ref import llama_cpp_logits

    ref = llama_cpp_logits(path, tokens)
    batch, steps = batch_and_steps(path, tokens)
    spread = float(ref.std())
    assert np.abs(batch - ref).max() < tol * spread
    if same_top1:
        assert (batch.argmax(1) == ref.argmax(1)).all()
    np.testing.assert_allclose(steps, batch, rtol=0, atol=1e-4 * spread)


def llama_cpp_quantized(src, dst, ftype):
    """dst: llama.cpp's own quantization of the GGUF file src (llama_cpp.LLAMA_FTYPE_*), which we must load
    with every tensor a view on the file (no conversion)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) == 0
    with load(dst, threads=1) as llm:
        assert llm.conversions == []
    return dst


def rewrite_gguf(src, dst, edit=None, drop=(), extra=(), types=None):
    """A copy of GGUF file src at dst with metadata keys changed (edit: key -> value, None removes the key),
    the tensors named in drop left out and the Tensors in extra added; returns dst. Keys left as they were keep
    their value types (llama.cpp insists on e.g. INT32 token types); types: value types of edited keys."""
    from powerinfer_py.gguf.reader import open_gguf
    from powerinfer_py.gguf.writer import write_gguf

    f = open_gguf(src)
    meta = dict(f.metadata)
    kept_types = {k: t for k, t in f.metadata_types.items() if k not in (edit or {})}
    for key, value in (edit or {}).items():
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value
    return write_gguf(dst, meta, [t for name, t in f.tensors.items() if name not in drop] + list(extra),
                      types={**kept_types, **(types or {})})


def assert_threshold_after_calibration(path, out, tokens) -> None:
    """A SwiGLU/GeGLU file calibrated at 50% (written to out): threshold mode at sparsity 0 gives the dense logits
    of `tokens`, and the calibrated file runs in threshold mode by default at about its sparsity."""
    from powerinfer_py.tools.calibrate import calibrate

    calibrate(path, out, 0.5, text="once upon a time the cat sat on the mat and the dog ran", n_tokens=40, ctx=32,
              threads=1)
    ids = np.asarray(tokens, np.int32)
    with load(path, threads=1) as llm:
        dense = llm.model.forward(ids, llm.model.new_cache(32), all_logits=True)
    with load(out, threads=1, sparse="threshold", sparsity=0.0) as llm:
        zero = llm.model.forward(ids, llm.model.new_cache(32), all_logits=True)
        np.testing.assert_allclose(zero, dense, rtol=0, atol=1e-4 * dense.std())
    with load(out, threads=1) as llm:
        assert llm.sparse.mode == "threshold" and 0.3 < llm.sparse.sparsity < 0.7


def with_qkv_biases(src, dst, seed=0):
    """src with random attn_q/k/v biases on every layer at dst (for archs whose llama.cpp loader takes them)."""
    from powerinfer_py.gguf.reader import open_gguf
    from powerinfer_py.gguf.types import GGMLType, Tensor

    f, rng = open_gguf(src), np.random.default_rng(seed)
    extra = [Tensor(f"blk.{il}.attn_{x}.bias", GGMLType.F32, (n,), rng.normal(0, 0.5, n).astype(np.float32))
             for il in range(f.metadata[f"{f.metadata['general.architecture']}.block_count"])
             for x in "qkv" for n in [f.tensors[f"blk.{il}.attn_{x}.weight"].shape[0]]]
    return rewrite_gguf(src, dst, extra=extra)


def relabel_gguf(src, dst, arch, extra=None, extra_types=None):
    """The GGUF file src under another general.architecture at dst: every key of the old arch renamed (with its
    value type) and the keys in extra added (extra_types: their value types where the default would not do)."""
    from powerinfer_py.gguf.reader import open_gguf

    f = open_gguf(src)
    old = f.metadata["general.architecture"]
    edit, types = {"general.architecture": arch}, {}
    for key, value in f.metadata.items():
        if key.startswith(old + "."):
            edit[key] = None
            edit[arch + key[len(old):]] = value
            types[arch + key[len(old):]] = f.metadata_types[key]
    edit.update(extra or {})
    types.update(extra_types or {})
    return rewrite_gguf(src, dst, edit, types=types)


def info_text(path, width: int = 220) -> str:
    """`powerinfer info`'s table for path, as plain text."""
    from rich.console import Console

    from powerinfer_cli.info import _table
    from powerinfer_py.tools.info import model_info

    console = Console(width=width, record=True)
    console.print(_table(model_info(path)))
    return console.export_text()


def unconverted_logits(f, kernels, tokens) -> np.ndarray:
    """All logits of tokens for the opened GGUF f, asserting that no tensor was converted at load (each stays a
    view on the file) and that one token at a time (the decode mat-vecs) gives the bits of the batch (prefill)."""
    from powerinfer_py.gguf.load import load_weights
    from powerinfer_py.models import build_model, expected_tensors

    w = load_weights(f, expected_tensors)
    assert w.conversions == []
    model = build_model(w.config, w.tensors, kernels)
    ours = model.forward(tokens, model.new_cache(32), all_logits=True)
    step = model.new_cache(32)
    singles = np.stack([model.forward(tokens[i:i + 1], step, all_logits=True)[-1] for i in range(len(tokens))])
    np.testing.assert_array_equal(singles, ours)
    return ours


SAME_ARITHMETIC = 1e-4  # x spread: one call and many compute the same sums, in another order at most
# x spread, where a prefill computes the recurrence in another form than a decode step (the delta nets' closed-form
# chunks against the token-by-token rule: the same values up to f32 rounding, 1e-6 of them). The K/V cache is f16,
# so a difference in an f32 value's last bit can round a cached K/V value to the neighbouring f16 value, 2^-11 =
# 4.9e-4 of it, and the later layers carry that on. Measured (synthetic qwen35, qwen35moe, qwen3next f32 files,
# steps and split against one prefill): 2e-5 to 8e-5 on an AVX2 and on a scalar build, except qwen3next at 2.7e-4
# (AVX2) and 7.5e-4 (scalar): one or two f16 roundings that went the other way. Every mistake the tests measure
# (a state not carried, a wrong head order, a missing gate) is 0.7 x spread or more.
F16_ROUNDING = 2e-3


def assert_steps_and_split_match_prefill(model, tokens, split: int, n_ctx: int = 32,
                                         rel_tol: float = SAME_ARITHMETIC) -> None:
    """For models with recurrent state (lfm2, qwen35, qwen3next): one token at a time, and a prefill in two parts
    (tokens[:split], then the rest), carry the state across calls and give the single prefill's logits (within
    rel_tol x their spread: SAME_ARITHMETIC where the paths compute the same sums, F16_ROUNDING where they do
    not); the cache ends at len(tokens)."""
    batch = model.forward(tokens, model.new_cache(n_ctx), all_logits=True)
    tol = rel_tol * batch.std()
    cache = model.new_cache(n_ctx)
    steps = np.stack([model.forward(tokens[i:i + 1], cache) for i in range(len(tokens))])
    np.testing.assert_allclose(steps, batch, rtol=0, atol=tol)
    cache = model.new_cache(n_ctx)
    two = np.concatenate([model.forward(tokens[:split], cache, all_logits=True),
                          model.forward(tokens[split:], cache, all_logits=True)])
    np.testing.assert_allclose(two, batch, rtol=0, atol=tol)
    assert cache.n_past == len(tokens) and getattr(cache, "state_pos", len(tokens)) == len(tokens)


def assert_chat_reuse_matches_fresh_prefill(path) -> None:
    """For models whose cache cannot be rewound (recurrent state: lfm2, qwen35): turn 2 of a chat continues the
    cache (only the new tokens run); after an edit of the earlier reply the prompt diverges inside the cached
    text, the session starts over from 0, and the prompt's logits are a fresh prefill's either way."""
    from powerinfer_py.chat import ChatSession, template_for
    from powerinfer_py.sampler import SamplingParams

    llm = load(path, threads=1, n_ctx=256)
    s = ChatSession(llm, template_for(llm, "chatml"), "Be kind.", max_tokens=6, sampling=SamplingParams(temperature=0))
    seen, forward = [], llm.model.forward

    def recording(tokens, cache, all_logits=False):
        out = forward(tokens, cache, all_logits)
        seen.append(out.copy())
        return out

    try:
        list(s.send("hello world"))
        held = list(s.tokens)
        llm.model.forward = recording
        for edit in (False, True):
            if edit:
                s.messages[-1]["content"] = "the sun " + s.messages[-1]["content"]
                held = list(s.tokens)
            seen.clear()
            r = s.send("the cat")
            list(r)
            ids = s.tokens[:r.stats.n_prompt]
            assert r.stats.n_reused == (0 if edit else len(held))
            assert (ids[:len(held)] == held) != edit
            fresh = forward(ids, llm.model.new_cache(256))
            np.testing.assert_allclose(seen[0], fresh, rtol=0, atol=1e-4 * fresh.std())
    finally:
        llm.close()


def load_model(path, kernels, cls=None, **config_changes):
    """The model of GGUF file path on kernels, its config changed by config_changes (a mutation), built as
    class cls when given (a subclass that does one thing wrong), else the arch's own class."""
    import dataclasses

    from powerinfer_py.gguf import open_gguf
    from powerinfer_py.gguf.load import load_weights
    from powerinfer_py.models import build_model, expected_tensors

    w = load_weights(open_gguf(path), expected_tensors)
    config = dataclasses.replace(w.config, **config_changes) if config_changes else w.config
    return build_model(config, w.tensors, kernels) if cls is None else cls(config, w.tensors, kernels)


def rel_err(ours: np.ndarray, want: np.ndarray) -> float:
    """Largest |ours - want| relative to the spread (std) of want: the measure every architecture test quotes."""
    return float(np.abs(ours - want).max() / want.std())
