"""Timing for benchmarks on a shared machine, whose read bandwidth drifts by tens of percent within a minute:
every configuration is called once per round, in turn, so a drift hits all of them alike."""
from __future__ import annotations

import time
from typing import Callable, Hashable


def round_robin(fns: dict[Hashable, Callable[[], object]], repeat: int,
                before: Callable[[], object] | None = None, self_timed: bool = False) -> dict[Hashable, list[float]]:
    """Seconds of each fn over `repeat` rounds (after one warm-up call each); `before` (a cache flush, say)
    runs untimed before every timed call. self_timed: each fn returns its own time in seconds (a C kernel
    timed in C: csrc/bench.c), which is taken instead of the time of the Python call around it."""
    for fn in fns.values():
        fn()
    times: dict[Hashable, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            if before is not None:
                before()
            t0 = time.perf_counter()
            own = fn()
            times[name].append(float(own) if self_timed else time.perf_counter() - t0)
    return times
