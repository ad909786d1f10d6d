"""llama.cpp's GBNF grammar sampler as the reference for grammar-constrained decoding in tests.

`LlamaGrammarRef(model_path, gbnf)` builds llama.cpp's own grammar sampler (llama_sampler_init_grammar through the
installed llama-cpp-python) over the vocabulary of a GGUF file, and answers the questions a test asks of it: which
tokens the grammar allows next (`allowed()`, a bool mask over the whole vocabulary), taking a token (`accept`), and
whether a text is a sentence of the grammar (`accepts_text`, token by token on the file's own tokenization, and
end-of-generation allowed at the end).

llama.cpp throws a C++ exception (which aborts the process) when it is made to accept a token its grammar forbids,
so `accept` checks the token first and raises a Python error instead.
"""
from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class GrammarRejected(AssertionError):
    """The reference grammar does not allow the token or text asked about."""


class LlamaGrammarRef:
    def __init__(self, model_path, gbnf: str, root: str = "root"):
        self.llm = llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.smpl = llama_cpp.llama_sampler_init_grammar(self.vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
        if not self.smpl:
            self.llm.close()
            raise ValueError("llama.cpp refused the grammar (it logs the reason to stderr)")

    def close(self) -> None:
        if self.smpl:
            llama_cpp.llama_sampler_free(self.smpl)
            self.smpl = None
        self.llm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _apply(self, ids: np.ndarray) -> np.ndarray:
        """Bool per id in `ids`: does the grammar leave its logit finite?"""
        data = np.zeros(len(ids), dtype=_TOKEN_DATA)
        data["id"] = ids
        cur = llama_cpp.llama_token_data_array(
            data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), len(ids), -1, False)
        llama_cpp.llama_sampler_apply(self.smpl, ctypes.byref(cur))
        assert cur.size == len(ids), "the grammar sampler is expected to mask, not drop, candidates"
        out = np.isfinite(data["logit"])
        mask = np.zeros(len(ids), dtype=bool)
        mask[np.searchsorted(ids, data["id"])] = out  # the sampler may reorder; put the answers back by id
        return mask

    def allowed(self) -> np.ndarray:
        """bool [n_vocab]: the tokens the grammar allows next."""
        return self._apply(np.arange(self.n_vocab, dtype=np.int32))

    def allows(self, token: int) -> bool:
        return bool(self._apply(np.array([token], dtype=np.int32))[0])

    def accept(self, token: int) -> None:
        if not self.allows(token):
            raise GrammarRejected(f"the grammar does not allow token {token} "
                                  f"({self.llm.detokenize([token])!r}) here")
        llama_cpp.llama_sampler_accept(self.smpl, int(token))

    def eog_allowed(self) -> bool:
        return self.allows(llama_cpp.llama_vocab_eos(self.vocab))

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def accepts_text(self, text: str) -> bool:
        """True iff every token of `text` is allowed in turn and the grammar may end after it. Leaves the
        sampler in the state after the accepted prefix: make a new LlamaGrammarRef per text."""
        for t in self.tokenize(text):
            if not self.allows(t):
                return False
            llama_cpp.llama_sampler_accept(self.smpl, int(t))
        return self.eog_allowed()
