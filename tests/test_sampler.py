"""Sampler: each filter against hand-computed examples, then the chained Sampler's behaviour."""
from __future__ import annotations

import numpy as np
import pytest

from llama_ref import llama_cpp_penalties
from powerinfer_py.sampler import (Sampler, SamplingParams, apply_frequency_presence, apply_logit_bias,
                                   apply_repetition_penalty, greedy, min_p, softmax, temperature, top_k, top_p)


def test_softmax_matches_definition():
    x = np.array([1.0, 2.0, 3.0, -np.inf], dtype=np.float32)
    e = np.exp([1.0, 2.0, 3.0])
    np.testing.assert_allclose(softmax(x), [*(e / e.sum()), 0.0], rtol=1e-12)
    # shift invariance: huge logits do not overflow
    np.testing.assert_allclose(softmax(x + 1000), softmax(x), rtol=1e-12)


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = np.array([2.0, -2.0, 0.0, 4.0, 1.0], dtype=np.float32)
    out = apply_repetition_penalty(logits, [0, 1, 2, 0], penalty=2.0, last_n=64)
    np.testing.assert_array_equal(out, [1.0, -4.0, 0.0, 4.0, 1.0])
    np.testing.assert_array_equal(logits, [2.0, -2.0, 0.0, 4.0, 1.0])  # input untouched


def test_repetition_penalty_only_looks_at_last_n():
    logits = np.array([2.0, 2.0, 2.0], dtype=np.float32)
    out = apply_repetition_penalty(logits, [0, 1, 2], penalty=4.0, last_n=2)
    np.testing.assert_array_equal(out, [2.0, 0.5, 0.5])
    np.testing.assert_array_equal(apply_repetition_penalty(logits, [0, 1, 2], 4.0, last_n=0), logits)
    np.testing.assert_array_equal(apply_repetition_penalty(logits, [0, 1, 2], 4.0, last_n=-1), [0.5] * 3)


def test_top_k_keeps_k_largest_sorted_and_breaks_ties_by_lower_id():
    logits = np.array([0.5, 3.0, 1.0, 3.0, 2.0, 1.0], dtype=np.float32)
    ids, vals = top_k(logits, 3)
    assert ids.tolist() == [1, 3, 4]
    assert vals.tolist() == [3.0, 3.0, 2.0]
    ids, _ = top_k(logits, 4)  # the 4th place is a tie between ids 2 and 5: the lower id wins
    assert ids.tolist() == [1, 3, 4, 2]
    ids, _ = top_k(logits, 0)  # disabled: everything, sorted
    assert ids.tolist() == [1, 3, 4, 2, 5, 0]


def test_top_k_on_a_large_vocabulary_matches_a_full_sort():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(262144).astype(np.float32)
    ids, vals = top_k(logits, 40)
    want = np.argsort(-logits, kind="stable")[:40]
    assert ids.tolist() == want.tolist()
    np.testing.assert_array_equal(vals, logits[want])


def test_top_p_keeps_the_token_that_crosses_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    ids, logits = np.arange(4), np.log(probs).astype(np.float32)
    assert top_p(ids, logits, 0.5)[0].tolist() == [0]         # 0.5 reaches 0.5
    assert top_p(ids, logits, 0.6)[0].tolist() == [0, 1]      # 0.5 < 0.6 <= 0.8
    assert top_p(ids, logits, 0.9)[0].tolist() == [0, 1, 2]   # 0.8 < 0.9 <= 0.95
    assert top_p(ids, logits, 0.99)[0].tolist() == [0, 1, 2, 3]
    assert top_p(ids, logits, 1.0)[0].tolist() == [0, 1, 2, 3]
    assert top_p(ids, logits, 0.01)[0].tolist() == [0]        # never empty


def test_min_p_is_relative_to_the_top_probability():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    ids, logits = np.arange(4), np.log(probs).astype(np.float32)
    assert min_p(ids, logits, 0.2)[0].tolist() == [0, 1, 2]   # threshold 0.1: 0.05 goes
    assert min_p(ids, logits, 0.5)[0].tolist() == [0, 1]      # threshold 0.25
    assert min_p(ids, logits, 0.0)[0].tolist() == [0, 1, 2, 3]
    assert min_p(ids, logits, 1.0)[0].tolist() == [0]


def test_temperature_scales_logits():
    np.testing.assert_allclose(temperature(np.array([1.0, -2.0]), 0.5), [2.0, -4.0])
    with pytest.raises(ValueError):
        temperature(np.array([1.0]), 0.0)


def test_greedy_ties_go_to_the_lowest_id():
    assert greedy(np.array([0.0, 5.0, 1.0, 5.0])) == 1
    s = Sampler(SamplingParams(temperature=0.0))
    assert s.sample(np.array([0.0, 5.0, 1.0, 5.0], dtype=np.float32)) == 1


def test_greedy_applies_the_repetition_penalty():
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0))
    logits = np.array([3.0, 2.0, 0.0], dtype=np.float32)
    assert s.sample(logits, history=[]) == 0
    assert s.sample(logits, history=[0]) == 1  # 3 / 2 = 1.5 < 2


def test_frequency_and_presence_penalties_count_the_recent_tokens():
    logits = np.array([1.0, 1.0, 1.0, 1.0], dtype=np.float32)
    out = apply_frequency_presence(logits.copy(), [0, 1, 1, 3, 1], frequency=0.5, presence=0.25, last_n=4)
    # the last 4 tokens: 1, 1, 3, 1 -> token 1 seen 3 times, token 3 once, token 0 fell out of the window
    np.testing.assert_array_equal(out, [1.0, 1.0 - 1.5 - 0.25, 1.0, 1.0 - 0.5 - 0.25])
    whole = apply_frequency_presence(logits.copy(), [0, 1, 1, 3, 1], 0.5, 0.25, last_n=-1)
    assert whole[0] == 1.0 - 0.75
    for off in (dict(frequency=0.0, presence=0.0, last_n=64), dict(frequency=1.0, presence=1.0, last_n=0)):
        np.testing.assert_array_equal(apply_frequency_presence(logits.copy(), [0, 1], **off), logits)
    # negative penalties make repeats more likely, as OpenAI's do
    assert apply_frequency_presence(logits.copy(), [2], -1.0, 0.0, 64)[2] == 2.0


def test_logit_bias_adds_to_the_listed_tokens_only():
    logits = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(apply_logit_bias(logits, [(0, 5.0), (2, -100.0)]), [5.0, 1.0, -98.0])
    np.testing.assert_array_equal(logits, [0.0, 1.0, 2.0])  # input untouched
    assert apply_logit_bias(logits, ()) is logits
    s = Sampler(SamplingParams(temperature=0, logit_bias=((0, 5.0),)))
    assert s.sample(logits) == 0
    s = Sampler(SamplingParams(temperature=1.0, seed=1, logit_bias=((2, -float("inf")), (1, -float("inf")))))
    assert {s.sample(logits) for _ in range(20)} == {0}  # banned tokens are never drawn


def test_penalties_and_bias_equal_llama_cpp_samplers_bit_for_bit():
    """Our logit bias, then repetition, frequency and presence penalties, against llama.cpp's own samplers
    (the same chain order as its defaults) on random logits, histories, windows and settings."""
    rng = np.random.default_rng(0)
    for _ in range(100):
        n = 64
        history = [int(t) for t in rng.integers(0, n, size=int(rng.integers(0, 50)))]
        last_n = int(rng.integers(1, 40))
        rep, freq, pres = (float(np.float32(v)) for v in (rng.uniform(0.5, 2), rng.uniform(-2, 2), rng.uniform(-2, 2)))
        bias = {int(t): float(np.float32(rng.uniform(-100, 100))) for t in rng.integers(0, n, size=3)}
        logits = (rng.standard_normal(n) * 3).astype(np.float32)
        want = llama_cpp_penalties(logits, history, last_n, rep, freq, pres, bias)
        got = apply_logit_bias(logits, sorted(bias.items()))
        got = apply_repetition_penalty(got, history, rep, last_n)
        got = apply_frequency_presence(got, history, freq, pres, last_n)
        np.testing.assert_array_equal(got, want)


def test_seed_reproducibility():
    logits = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    a = [Sampler(p).sample(logits) for _ in range(3)]  # a fresh sampler restarts the stream
    s1, s2 = Sampler(p), Sampler(p)
    seq1 = [s1.sample(logits) for _ in range(50)]
    seq2 = [s2.sample(logits) for _ in range(50)]
    assert seq1 == seq2
    assert a == [seq1[0]] * 3
    s3 = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=43))
    assert [s3.sample(logits) for _ in range(50)] != seq1
    assert len(set(seq1)) > 10  # it really samples


def test_sampled_frequencies_match_probabilities():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    logits = np.log(probs).astype(np.float32)
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7))
    n = 20000
    counts = np.bincount([s.sample(logits) for _ in range(n)], minlength=4)
    # 4.5 standard deviations of a binomial: fails by chance with probability ~1e-5 (and the seed is fixed)
    tol = 4.5 * np.sqrt(probs * (1 - probs) / n)
    assert np.all(np.abs(counts / n - probs) < tol), counts / n


def test_temperature_and_filters_change_the_distribution():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    logits = np.log(probs).astype(np.float32)
    n = 20000
    # temperature 0.5 squares the probabilities: p^2 / sum(p^2)
    s = Sampler(SamplingParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0, seed=8))
    freq = np.bincount([s.sample(logits) for _ in range(n)], minlength=4) / n
    want = probs**2 / np.sum(probs**2)
    assert np.all(np.abs(freq - want) < 4.5 * np.sqrt(want * (1 - want) / n) + 1e-9), freq
    # top_k 2: only tokens 0 and 1, renormalised to 4/7 and 3/7
    s = Sampler(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=9))
    freq = np.bincount([s.sample(logits) for _ in range(n)], minlength=4) / n
    assert freq[2] == freq[3] == 0
    assert abs(freq[0] - 4 / 7) < 0.02


def test_sampler_never_picks_a_filtered_token_on_a_big_vocabulary():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(262144).astype(np.float32) * 3
    top = set(np.argsort(-logits)[:5].tolist())
    s = Sampler(SamplingParams(temperature=1.5, top_k=5, top_p=1.0, min_p=0.0, seed=1))
    picks = {s.sample(logits, history=list(range(64))) for _ in range(200)}
    assert picks <= top and len(picks) > 1


def test_params_validation():
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingParams(min_p=1.5)
    with pytest.raises(ValueError):
        SamplingParams(repeat_penalty=0.0)
    with pytest.raises(ValueError, match="frequency_penalty"):
        SamplingParams(frequency_penalty=float("nan"))
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=((-1, 1.0),))
    with pytest.raises(ValueError, match="seed must be >= 0, or -1"):
        SamplingParams(seed=-2)
    assert SamplingParams(seed=-1).seed is None  # llama.cpp's "random seed"


def _reference_sample(logits, p: SamplingParams, u: float) -> int:
    """The chain written the slow, obvious way: full sort, then each filter, then an inverse-CDF draw."""
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    if p.top_k > 0:
        order = order[: p.top_k]
    probs = np.exp(logits[order].astype(np.float64) - logits[order[0]])
    probs /= probs.sum()
    n = int(np.argmax(np.cumsum(probs) >= p.top_p)) + 1 if p.top_p < 1 else len(order)
    order, probs = order[:n], probs[:n]
    keep = probs >= p.min_p * probs[0]
    order = order[keep]
    q = np.exp((logits[order].astype(np.float64) - logits[order[0]]) / p.temperature)
    return int(order[np.searchsorted(np.cumsum(q), u * q.sum(), side="right")])


@pytest.mark.parametrize("top_k,top_p,min_p", [(40, 0.95, 0.05), (0, 0.9, 0.05), (0, 0.8, 0.0), (5, 1.0, 0.0),
                                              (0, 1.0, 0.2)])
def test_sampler_matches_a_straightforward_chain(top_k, top_p, min_p):
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(5000) * 2).astype(np.float32)
    p = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p, min_p=min_p, seed=11)
    s, draws = Sampler(p), np.random.default_rng(11)
    for _ in range(30):
        assert s.sample(logits) == _reference_sample(logits, p, draws.random())
