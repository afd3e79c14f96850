"""Measurements taken side by side, in rounds: the benches' way to a figure that can be trusted
on a shared, noisy machine (gradexp/bench/run.py, gradexp/bench/sweeps.py).

In every round each variant takes its turn, so a busy moment slows all of them alike; a ratio
is computed round by round, from the two variants' measurements of that round, and reported as
the median over the rounds with its spread (the smallest and largest round):

    ratio_r = a_r / b_r,   figure = median_r(ratio_r),   spread = [min_r, max_r]

`steady(figure)`: the spread lies within ±10% of the median.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

SPREAD = 0.10  # a figure is steady when every round lies within this share of the median
ROUNDS = 5  # the full bench's rounds


def side_by_side(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, list]:
    """Each variant's measurement in each of `rounds` rounds; in every round all variants
    take a turn, in order in even rounds and in reverse order in odd ones (a variant that
    follows another, or comes first, is not always the same one)."""
    measured: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name in list(variants)[::-1 if r % 2 else 1]:
            measured[name].append(variants[name]())
    return measured


def figure(name: str, values: list[float]) -> dict[str, float]:
    """`name`: the median of `values`; `name_min`, `name_max`: their spread."""
    return {name: statistics.median(values), f"{name}_min": min(values),
            f"{name}_max": max(values)}


def ratio(name: str, a: list[float], b: list[float]) -> dict[str, float]:
    """The figure of a_r / b_r, round by round."""
    return figure(name, [x / y for x, y in zip(a, b, strict=True)])


def medians(name: str, measured: dict[str, list[float]]) -> dict[str, float]:
    """`name_<variant>` (`<variant>` when name is ""): each variant's median."""
    return {"_".join(filter(None, (name, variant))): statistics.median(v)
            for variant, v in measured.items()}


def steady(figures: dict[str, float], name: str) -> bool:
    """Whether a figure's spread lies within ±SPREAD of its median."""
    middle = figures[name]
    return (1 - SPREAD) * middle <= figures[f"{name}_min"] <= figures[f"{name}_max"] <= (
        1 + SPREAD) * middle


def shown(figures: dict[str, float]) -> str:
    """`name median (min–max)` for each figure with a spread; other values as they are."""
    parts = []
    for name, value in figures.items():
        if name.endswith(("_min", "_max")) and name[:-4] in figures:
            continue
        spread = (f" ({figures[name + '_min']:.3g}–{figures[name + '_max']:.3g})"
                  if name + "_min" in figures else "")
        parts.append(f"{name} {value:.3g}{spread}")
    return ", ".join(parts)
