"""Argument checks shared by the C ops (kernels/cpu.py) and the C steps (kernels/cpu_steps.py): each raises
ValueError naming the op and the argument, or returns the value as C takes it."""
from __future__ import annotations

BIG = 3.0e38  # finite-number test that also rejects NaN (comparisons with NaN are false)


def check_mscale(op: str, mscale) -> float:
    """A RoPE magnitude scale (YaRN's attention factor) as a float: finite and > 0."""
    if not 0 < float(mscale) < BIG:
        raise ValueError(f"{op}: mscale must be finite and > 0, got {mscale}")
    return float(mscale)


def check_softcap(op: str, softcap) -> float:
    """The attention soft-cap as a float: finite and >= 0 (0 = off)."""
    if not 0 <= float(softcap) < BIG:
        raise ValueError(f"{op}: softcap must be finite and >= 0 (0 = off), got {softcap}")
    return float(softcap)
