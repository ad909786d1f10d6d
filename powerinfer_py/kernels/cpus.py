"""How many CPUs this process may run on: the default thread count everywhere."""
from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs in this process's affinity mask (a container or `taskset` may allow fewer than the machine
    has, and threads beyond them only wait for each other); os.cpu_count() where the OS has no mask."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1
