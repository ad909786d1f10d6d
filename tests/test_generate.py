"""Generation loop: stop reasons, prefill batching and statistics; then the LLM object end to end."""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer_py.errors import ContextFullError, PowerInferError
from powerinfer_py.generate import generate
from powerinfer_py.layers.cache import KVCache
from powerinfer_py.sampler import Sampler, SamplingParams

GREEDY = SamplingParams(temperature=0)


class CountingModel:
    """A stand-in model whose greedy next token is (last token + 1) % n_vocab.

    It keeps the KVCache contract (check_room, write at n_past, advance n_past) and records the batch
    sizes it was called with and every token it saw at each position."""

    n_vocab = 32

    def __init__(self):
        self.batches: list[int] = []
        self.seen: dict[int, int] = {}

    def forward(self, tokens, cache: KVCache, all_logits: bool = False):
        tokens = np.asarray(tokens, dtype=np.int32)
        cache.check_room(len(tokens))
        for i, t in enumerate(tokens):
            self.seen[cache.n_past + i] = int(t)
        cache.n_past += len(tokens)
        self.batches.append(len(tokens))
        logits = np.zeros(self.n_vocab, dtype=np.float32)
        logits[(int(tokens[-1]) + 1) % self.n_vocab] = 1.0
        return logits


def _cache(n_ctx: int) -> KVCache:
    return KVCache(n_layer=1, n_head_kv=1, n_ctx=n_ctx, head_dim=2)


def never(_token: int) -> bool:
    return False


def test_stops_at_max_tokens():
    model, cache = CountingModel(), _cache(64)
    gen = generate(model, cache, [3], Sampler(GREEDY), max_tokens=5, is_eog=never)
    assert list(gen) == [4, 5, 6, 7, 8]
    st = gen.stats
    assert (st.stop_reason, st.n_prompt, st.n_gen, st.n_decode) == ("length", 1, 5, 4)
    assert cache.n_past == 5  # prompt + the 4 tokens fed back; the last one was never needed
    assert st.prompt_s > 0 and st.decode_s > 0 and st.prompt_tok_s > 0 and st.decode_tok_s > 0


def test_stops_at_an_end_of_generation_token_without_yielding_it():
    model, cache = CountingModel(), _cache(64)
    gen = generate(model, cache, [1, 2, 3], Sampler(GREEDY), max_tokens=-1, is_eog=lambda t: t == 7)
    assert list(gen) == [4, 5, 6]
    assert (gen.stats.stop_reason, gen.stats.n_gen, gen.stats.n_decode) == ("eos", 3, 3)


def test_stops_when_the_context_is_full():
    model, cache = CountingModel(), _cache(6)
    gen = generate(model, cache, [0, 1], Sampler(GREEDY), max_tokens=-1, is_eog=never)
    # positions 0-1 hold the prompt, 2-5 the first four generated tokens; the fifth fits nowhere
    assert list(gen) == [2, 3, 4, 5, 6]
    assert gen.stats.stop_reason == "context" and cache.n_past == cache.n_ctx == 6
    assert [model.seen[p] for p in range(6)] == [0, 1, 2, 3, 4, 5]


def test_max_tokens_wins_over_a_full_context_on_the_same_token():
    gen = generate(CountingModel(), _cache(4), [0, 1, 2], Sampler(GREEDY), max_tokens=2, is_eog=never)
    assert list(gen) == [3, 4] and gen.stats.stop_reason == "length"


def test_a_prompt_that_fills_the_context_exactly_gives_one_token():
    gen = generate(CountingModel(), _cache(4), [0, 1, 2, 3], Sampler(GREEDY), max_tokens=10, is_eog=never)
    assert list(gen) == [4] and gen.stats.stop_reason == "context"


def test_a_prompt_longer_than_the_context_raises_at_once():
    with pytest.raises(ContextFullError, match=r"prompt has 5 tokens but the context holds 4"):
        generate(CountingModel(), _cache(4), [0, 1, 2, 3, 4], Sampler(GREEDY), max_tokens=1, is_eog=never)
    cache = _cache(8)
    cache.n_past = 5
    with pytest.raises(ContextFullError, match="5 already used"):
        generate(CountingModel(), cache, [0, 1, 2, 3], Sampler(GREEDY), max_tokens=1, is_eog=never)


def test_empty_prompt_and_zero_tokens():
    with pytest.raises(PowerInferError, match="empty prompt"):
        generate(CountingModel(), _cache(4), [], Sampler(GREEDY), max_tokens=1, is_eog=never)
    model, cache = CountingModel(), _cache(8)
    gen = generate(model, cache, [1, 2], Sampler(GREEDY), max_tokens=0, is_eog=never)
    assert list(gen) == [] and gen.stats.stop_reason == "length" and cache.n_past == 2


def test_prefill_runs_in_batches():
    model, cache = CountingModel(), _cache(64)
    gen = generate(model, cache, list(range(10)), Sampler(GREEDY), max_tokens=3, is_eog=never, prefill_batch=4)
    assert list(gen) == [10, 11, 12]
    assert model.batches == [4, 4, 2, 1, 1]
    assert [model.seen[p] for p in range(12)] == list(range(12))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_logits_stop_generation_with_a_named_error(bad):
    """A damaged file (NaN weights) used to sample garbage that looked like text; -inf (a masked token) is fine."""
    class Poisoned(CountingModel):
        def forward(self, tokens, cache, all_logits=False):
            logits = super().forward(tokens, cache, all_logits)
            logits[(int(np.asarray(tokens)[-1]) + 5) % self.n_vocab] = -np.inf
            if cache.n_past == 5:
                logits[7] = bad
            return logits

    gen = generate(Poisoned(), _cache(16), [1, 2], Sampler(GREEDY), 10, never)
    got = []
    with pytest.raises(PowerInferError, match=r"logits at position 4 are not finite \((nan|inf)\)"):
        for t in gen:
            got.append(t)
    assert got == [3, 4, 5]  # the tokens before the bad step came out as usual


def test_breaking_out_early_leaves_no_stop_reason():
    gen = generate(CountingModel(), _cache(64), [0], Sampler(GREEDY), max_tokens=100, is_eog=never)
    assert next(gen) == 1 and next(gen) == 2
    gen.close()
    assert gen.stats.stop_reason is None and gen.stats.n_gen == 2
    assert list(gen) == []


def test_repetition_penalty_sees_the_prompt():
    class Flat(CountingModel):
        def forward(self, tokens, cache, all_logits=False):
            super().forward(tokens, cache)
            return np.array([1.0, 0.9, 0.0], dtype=np.float32)  # token 0 is always the favourite
    p = SamplingParams(temperature=0, repeat_penalty=2.0)
    assert list(generate(Flat(), _cache(16), [0], Sampler(p), max_tokens=1, is_eog=never)) == [1]
    assert list(generate(Flat(), _cache(16), [2], Sampler(p), max_tokens=1, is_eog=never)) == [0]


# -- the LLM object on a tiny synthetic model ----------------------------------------------------------------

def _backend() -> str:
    """The C kernels when they are built, else the numpy reference: the runtime logic is what is tested."""
    try:
        import powerinfer_py.kernels.cpu  # noqa: F401
        return "cpu"
    except ImportError:
        return "ref"


@pytest.fixture(scope="module")
def llm(synthetic_model, tmp_path_factory):
    import powerinfer_py
    model = powerinfer_py.load(synthetic_model("llama"), threads=2, n_ctx=48, backend=_backend(),
                               cache_dir=tmp_path_factory.mktemp("vocab"))
    yield model
    model.close()


PROMPT = "the quick brown fox jumps over the lazy dog and then"


def test_llm_prefill_batch_size_does_not_change_the_tokens(llm):
    n_prompt = len(llm.tokenize(PROMPT))
    assert n_prompt > 8
    runs = {b: list(llm.generate_tokens(PROMPT, max_tokens=10, temperature=0, prefill_batch=b))
            for b in (1, 3, n_prompt)}
    assert runs[1] == runs[3] == runs[n_prompt]
    assert llm.last_stats.n_prompt == n_prompt


def test_llm_seeded_sampling_is_reproducible(llm):
    kw = dict(max_tokens=12, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = list(llm.generate_tokens(PROMPT, seed=1, **kw))
    b = list(llm.generate_tokens(PROMPT, seed=1, **kw))
    c = list(llm.generate_tokens(PROMPT, seed=2, **kw))
    assert a == b and a != c


def test_llm_text_stream_matches_the_token_stream(llm):
    ids = list(llm.generate_tokens(PROMPT, max_tokens=16, temperature=0))
    stats = llm.last_stats
    text = "".join(llm.generate(PROMPT, max_tokens=16, temperature=0))
    dec = llm.tokenizer.stream()
    assert text == "".join(dec.feed(i) for i in ids) + dec.flush()
    assert llm.last_stats.n_gen == stats.n_gen == len(ids)
    assert llm.last_stats.stop_reason in ("eos", "length")
    assert (len(ids) == 16) == (llm.last_stats.stop_reason == "length")


def test_llm_stop_strings_end_the_text_before_them(llm):
    full = "".join(llm.generate(PROMPT, max_tokens=24, temperature=0))
    n_full = llm.last_stats.n_gen
    assert len(full) >= 6, full
    stop = full[len(full) // 2:len(full) // 2 + 2]  # text of this random model: any two characters of it
    cut = full.index(stop)
    assert cut > 0
    for stops in (stop, [stop], ["never there", stop]):
        pieces = list(llm.generate(PROMPT, max_tokens=24, temperature=0, stop=stops))
        assert "".join(pieces) == full[:cut]
        assert all(stop not in p for p in pieces)
        assert llm.last_stats.stop_reason == "stop string" and llm.last_stats.n_gen < n_full
    # a stop that never appears changes nothing; empty or non-string stops are refused at the call
    assert "".join(llm.generate(PROMPT, max_tokens=24, temperature=0, stop="zzz not there")) == full
    assert llm.last_stats.stop_reason in ("eos", "length", "context")  # this fixture's context is 48
    for bad in ("", [""], [3]):
        with pytest.raises(ValueError, match="stop strings"):
            llm.generate(PROMPT, max_tokens=4, stop=bad)


def test_llm_context_limit(llm):
    long_prompt = " ".join(["fox"] * 60)
    with pytest.raises(ContextFullError, match=r"context holds 48"):
        llm.generate(long_prompt, max_tokens=4)  # raised at the call, before any iteration
    ids = list(llm.generate_tokens([llm.tokenizer.bos_id] + [300] * 40, max_tokens=-1, temperature=0))
    st = llm.last_stats
    assert st.stop_reason in ("context", "eos")
    if st.stop_reason == "context":
        assert len(ids) == 48 - 41 + 1


def test_llm_defaults_and_close(synthetic_model, tmp_path):
    import powerinfer_py
    with powerinfer_py.load(synthetic_model("llama"), backend=_backend(), cache_dir=tmp_path) as m:
        assert m.n_ctx == min(m.config.n_ctx_train, 4096)
        assert m.detokenize(m.tokenize("hello world")) == "hello world"
        assert m.last_stats is None
    # after close: clear errors, not a crash in llama.cpp on a freed vocabulary
    for call in (lambda: m.tokenize("hi"), lambda: m.detokenize([1, 5]), lambda: m.generate_tokens([1, 5]),
                 lambda: m.generate("hi"), lambda: m.tokenizer.is_eog(2)):
        with pytest.raises(ValueError, match="closed"):
            call()
    m.close()  # twice is fine


def test_llm_a_new_generation_ends_the_previous_one(llm):
    first = llm.generate_tokens(PROMPT, max_tokens=10, temperature=0)
    head = [next(first), next(first)]
    second = list(llm.generate_tokens(PROMPT, max_tokens=10, temperature=0))
    assert list(first) == [] and first.stats.stop_reason is None
    assert second[:2] == head
