"""generate.stream_text: token ids -> text pieces and stop reasons, the one text loop under LLM.generate, `run`,
chat replies and the server. Driven by a scripted generation over a byte-level vocabulary, so every piece
boundary is chosen by the test."""
from __future__ import annotations

from powerinfer_py.generate import STOP_STRING, GenerationStats, StopMatcher, stream_text
from powerinfer_py.sampler import TokenLogprob
from powerinfer_py.tokenizer import StreamDecoder


class ByteTokenizer:
    """Token i stands for the bytes given at construction (a piece of text, or part of a UTF-8 character)."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    def piece(self, token: int, special: bool = False) -> bytes:
        return self.pieces[token]

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self)


class Recorder:
    """What a LogprobRecorder hands out: entries not yet taken."""

    def __init__(self):
        self.entries: list[TokenLogprob] = []
        self._taken = 0

    def take(self) -> list[TokenLogprob]:
        new, self._taken = self.entries[self._taken:], len(self.entries)
        return new


class ScriptedGeneration:
    """Yields the given ids, then ends with `reason`, like generate.Generation (stats, logprobs, close)."""

    def __init__(self, ids: list[int], reason: str = "length", recorder: Recorder | None = None):
        self.stats = GenerationStats(n_prompt=1)
        self.logprobs = recorder
        self.closed = False
        self._it = self._run(ids, reason)

    def _run(self, ids, reason):
        for t in ids:
            if self.logprobs is not None:
                self.logprobs.entries.append(TokenLogprob(t, -0.5 * t, ()))
            self.stats.n_gen += 1
            yield t
        self.stats.stop_reason = reason

    def __iter__(self):
        return self

    def __next__(self) -> int:
        return next(self._it)

    def close(self) -> None:
        self.closed = True
        self._it.close()


def _stream(pieces: list[bytes], stops=(), reason="length", **kw):
    tok = ByteTokenizer(pieces)
    gen = ScriptedGeneration(list(range(len(pieces))), reason, kw.pop("recorder", None))
    return gen, stream_text(gen, tok, stops, **kw)


def test_one_piece_per_token_then_the_end_with_its_reason():
    gen, stream = _stream([b"Hello", b",", b" world"], reason="eos")
    pieces = list(stream)
    assert [p.text for p in pieces] == ["Hello", ",", " world", ""]
    assert [p.tokens for p in pieces] == [(0,), (1,), (2,), ()]
    assert [p.finish for p in pieces] == [None, None, None, "eos"]
    assert stream.finish == "eos" and gen.stats.stop_reason == "eos"
    assert stream.close() == ""  # an ended stream holds nothing back


def test_a_character_split_over_tokens_comes_out_whole_with_its_last_byte():
    e_acute = "é".encode()
    _, stream = _stream([b"caf", e_acute[:1], e_acute[1:] + b"!", b"\xf0\x9f"])
    pieces = list(stream)
    assert [p.text for p in pieces] == ["caf", "", "é!", "", "\ufffd"]  # a character cut off at the end: U+FFFD
    assert pieces[-1].finish == "length" and pieces[-1].raw == "\ufffd"


def test_a_stop_string_across_tokens_ends_the_text_before_it():
    gen, stream = _stream([b"Hel", b"lo <e", b"nd> more", b"never read"], stops=["<end>"], reason="eos")
    pieces = list(stream)
    assert [p.text for p in pieces] == ["Hel", "lo ", ""]  # "<e" was held back, then found to be the stop
    assert pieces[-1].tokens == (2,) and pieces[-1].raw == "nd> more"  # raw: what the model wrote
    assert pieces[-1].finish == STOP_STRING == gen.stats.stop_reason
    assert gen.closed and gen.stats.n_gen == 3  # the generation stopped at the token that completed the stop


def test_text_that_only_looked_like_a_stop_string_is_released():
    _, stream = _stream([b"a<", b"en", b"x", b"b<en"], stops=["<end>", "zz"], reason="eos")
    pieces = list(stream)
    assert [p.text for p in pieces] == ["a", "", "<enx", "b", "<en"]  # the held tail comes out at the end
    assert pieces[-1].finish == "eos"


def test_close_stops_the_generation_and_returns_what_was_held_back():
    gen, stream = _stream([b"one <", b"two", b"three"], stops=["<stop>"])
    assert next(stream).text == "one "
    assert stream.close() == "<"
    assert gen.closed and gen.stats.stop_reason is None and stream.finish is None
    assert list(stream) == []


def test_logprobs_ride_with_the_pieces_when_asked():
    rec = Recorder()
    _, stream = _stream([b"a", b"b<", b"c"], stops=["<x"], recorder=rec, logprobs=True)
    pieces = list(stream)
    assert [[e.token for e in p.logprobs] for p in pieces] == [[0], [1], [2], []]
    _, plain = _stream([b"a"], recorder=Recorder())
    assert all(p.logprobs is None for p in plain)  # not asked: the recorder is left to its owner


def test_stop_matcher_holds_the_longest_possible_start():
    m = StopMatcher(["abc", "bd"])
    assert m.feed("xab") == "x" and m.pending == "ab"
    assert m.feed("d") == "a" and m.stopped  # "abd": "bd" found at 1, the text before it comes out
    assert m.feed("more") == "" and m.finish("tail") == ""  # nothing after a stop


def test_llm_stream_matches_generate_and_generate_tokens(synthetic_model, tmp_path):
    import powerinfer_py
    from powerinfer_py.options import SamplingParams

    with powerinfer_py.load(synthetic_model("llama"), n_ctx=64, cache_dir=tmp_path) as llm:
        prompt = "the quick brown fox"
        ids = list(llm.generate_tokens(prompt, max_tokens=12, temperature=0))
        text = "".join(llm.generate(prompt, max_tokens=12, temperature=0))
        pieces = list(llm.stream(prompt, SamplingParams(max_tokens=12, temperature=0)))
        assert [t for p in pieces for t in p.tokens] == ids
        assert "".join(p.text for p in pieces) == text
        assert pieces[-1].finish == llm.last_stats.stop_reason in ("eos", "length")
