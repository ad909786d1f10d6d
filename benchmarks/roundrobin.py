"""Timing for benchmarks on a shared machine, whose read bandwidth drifts by tens of percent within a minute:
every configuration is called once per round, in turn, so a drift hits all of them alike."""
from __future__ import annotations

import time
from typing import Callable, Hashable


def round_robin(fns: dict[Hashable, Callable[[], object]], repeat: int,
                before: Callable[[], object] | None = None) -> dict[Hashable, list[float]]:
    """Seconds of each fn over `repeat` rounds (after one warm-up call each); `before` (a cache flush, say)
    runs untimed before every timed call."""
    for fn in fns.values():
        fn()
    times: dict[Hashable, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            if before is not None:
                before()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times
