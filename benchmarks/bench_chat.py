"""Time to first token per chat turn: with KV-cache reuse it follows the new tokens, not the conversation.

    python benchmarks/bench_chat.py [-m MODEL] [--turns 5] [--reply 48] [--repeats 3] [-t THREADS]

For turns 1..N of a growing conversation (greedy replies of at most --reply tokens) it prints, per turn: the
prompt size of the whole conversation, how many of its tokens came from the cache and how many were prefilled,
the time to first token (median over --repeats sessions), and for comparison the time to first token of a
fresh session given the same conversation at once (everything prefilled: what a chat without reuse pays).
"""
from __future__ import annotations

import argparse
import statistics
import time

from powerinfer_py import load
from powerinfer_py.chat import ChatSession, template_for
from powerinfer_py.demo import demo_model_path
from powerinfer_py.sampler import SamplingParams

QUESTIONS = [
    "Tell me about the history of the city of Paris, from the Romans to the present day.",
    "What are the most famous museums there, and what can one see in each of them?",
    "Which neighbourhoods would you recommend for a first visit, and why?",
    "How do the metro and the buses work for a visitor who speaks no French?",
    "Plan a three-day itinerary that covers the places we talked about.",
    "What should I eat, and where, on each of those days?",
    "Summarise everything we discussed in a short list.",
]


def _first_token_s(session: ChatSession, text: str) -> tuple[float, object]:
    reply = session.send(text)
    t0 = time.perf_counter()
    next(reply, None)
    ttft = time.perf_counter() - t0
    for _ in reply:
        pass
    return ttft, reply.stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the demo model, Gemma 3 270M)")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--reply", type=int, default=48, help="tokens per reply at most")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=None)
    a = ap.parse_args()
    path = a.model or demo_model_path()
    llm = load(path, threads=a.threads, n_ctx=4096)  # the chat session's model and cache
    cold = load(path, threads=a.threads, n_ctx=4096)  # a second cache for the from-scratch comparison
    template = template_for(llm)
    params = SamplingParams(temperature=0)
    print(f"model {path}, template {template.name}, replies <= {a.reply} tokens, median of {a.repeats}")

    reuse = [[] for _ in range(a.turns)]
    scratch = [[] for _ in range(a.turns)]
    stats = [None] * a.turns
    for _ in range(a.repeats):
        s = ChatSession(llm, template, "You are a helpful travel guide.", max_tokens=a.reply, sampling=params)
        for i in range(a.turns):
            question = QUESTIONS[i % len(QUESTIONS)]
            fresh = ChatSession(cold, template, s.system, max_tokens=1, sampling=params)
            fresh.messages = [dict(m) for m in s.messages]  # the same conversation, nothing cached
            scratch[i].append(_first_token_s(fresh, question)[0])
            ttft, stats[i] = _first_token_s(s, question)
            reuse[i].append(ttft)
    print(f"{'turn':>4} {'prompt':>7} {'reused':>7} {'new':>5} {'TTFT reuse ms':>14} {'TTFT scratch ms':>16} "
          f"{'ratio':>6}")
    for i in range(a.turns):
        st = stats[i]
        r, f = statistics.median(reuse[i]) * 1000, statistics.median(scratch[i]) * 1000
        print(f"{i + 1:>4} {st.n_prompt:>7} {st.n_reused:>7} {st.n_prefilled:>5} {r:>14.1f} {f:>16.1f} "
              f"{f / r:>6.2f}")
    llm.close()
    cold.close()


if __name__ == "__main__":
    main()
