"""The search space of `hydra/sweeper=optuna`, read from `hydra.sweeper` and the command line.

    hydra.sweeper.params:                    (a command-line override of the same key wins)
      clip: tag(log, interval(0.001, 10))    searched, on a log scale: 10^u, u uniform
      clipping.max_norm: interval(0.1, 10)   searched, on a linear scale
      model.width: range(8, 65, 8)           searched: an integer in 8, 16, ..., 64
      optimizer: choice(sgd, adam)           searched: one of these
      seed: 0,1,2                            not searched: every trial runs each seed
      trainer.steps: 500                     fixed: every job gets it

A trial is one point of the space run once per seed; its jobs' overrides are the fixed ones,
the trial's values and the seed. Everything here is checked when the search starts and raises
ConfigError (one line naming the bad key); the configs at the corners of the space are then
composed and validated like a sweep's (gradexp.sweeps.callbacks.Checks), before any run.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from omegaconf import DictConfig, OmegaConf

from gradexp.config import ConfigError

OBJECTIVES = ("final_loss", "val_loss")  # summary.json's figures a search can minimize
SAMPLERS = ("tpe", "random")
SETTINGS = ("_target_", "n_trials", "n_jobs", "objective", "sampler", "sampler_seed",
            "enqueue", "params")
SEED_KEY = "seed"
TAGS = {"log"}


@dataclass(frozen=True)
class Dimension:
    """One searched key: a float in [low, high] (`interval`), an integer in low, low + step,
    ..., high (`range`), or one of `choices` (their command-line spelling)."""

    key: str  # as written on the command line, with its + or ++ if any
    kind: str  # "float" | "int" | "choice"
    low: float | None = None
    high: float | None = None
    step: int = 1
    log: bool = False
    choices: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.key.lstrip("+")

    def extremes(self) -> list:
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]

    def contains(self, value: Any) -> bool:
        if self.kind == "choice":
            return str(value) in self.choices
        return isinstance(value, (int, float)) and self.low <= value <= self.high

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.name} in {{{', '.join(self.choices)}}}"
        scale = "log scale" if self.log else "linear scale"
        step = f", step {self.step}" if self.kind == "int" and self.step != 1 else ""
        return f"{self.name} in [{self.low:g}, {self.high:g}] ({scale}{step})"


@dataclass(frozen=True)
class SearchSpace:
    dimensions: list[Dimension]
    fixed: list[str]  # overrides every job gets
    seeds: list[str] = field(default_factory=list)  # [] : the config's seed, no override
    n_trials: int = 20
    n_jobs: int = 1
    objective: str = "final_loss"
    sampler: str = "tpe"
    sampler_seed: int | None = 0
    enqueue: list[dict[str, Any]] = field(default_factory=list)

    def jobs(self, values: dict[str, Any]) -> list[list[str]]:
        """The overrides of a trial's jobs (one per seed) at `values` (name → value)."""
        # a float in full: Python writes a float as the shortest string that reads back as it
        point = [f"{d.key}={values[d.name]}" for d in self.dimensions]
        if not self.seeds:
            return [self.fixed + point]
        return [self.fixed + point + [f"{SEED_KEY}={s}"] for s in self.seeds]

    def corner_jobs(self) -> list[list[str]]:
        """The jobs at every combination of each dimension's extremes (each choice of a
        choice), and at each enqueued point: composed and validated before the search starts."""
        names = [d.name for d in self.dimensions]
        corners = [dict(zip(names, corner, strict=True)) for corner in
                   itertools.product(*(d.extremes() for d in self.dimensions))]
        return [job for point in corners + self.enqueue for job in self.jobs(point)]

    def describe(self) -> str:
        seeds = f"seeds {', '.join(self.seeds)}" if self.seeds else "one seed"
        return (f"{self.n_trials} trials of {'; '.join(d.describe() for d in self.dimensions)}"
                f", each over {seeds}; objective {self.objective} (lower is better; a "
                "diverged run ranks last)")


def is_search(config: DictConfig) -> bool:
    """Whether the sweep is a search (`hydra/sweeper=optuna`: gradexp's search sweeper)."""
    target = OmegaConf.select(config, "hydra.sweeper._target_") or ""
    return target.endswith(".SearchSweeper")


def from_config(sweeper: DictConfig, arguments: list[str]) -> SearchSpace:
    """The checked search space of `hydra.sweeper` and the command line's `arguments`."""
    unknown = sorted(set(sweeper) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"hydra.sweeper.{unknown[0]}: no such setting of the search; "
                          f"allowed: {', '.join(s for s in SETTINGS if s != '_target_')}")
    params = _plain(sweeper.get("params")) or {}
    lines = [f"{k}={v}" for k, v in params.items()] + list(arguments)
    try:
        parsed = OverridesParser.create().parse_overrides(lines)
    except Exception as exc:
        raise ConfigError(f"hydra.sweeper.params: {str(exc).splitlines()[0]}") from None
    by_key: dict[str, Override] = {}
    for override in parsed:  # a command-line override replaces the config's, key by key
        by_key[override.key_or_group] = override
    dimensions, fixed, seeds = [], [], []
    for name, override in by_key.items():
        if name == SEED_KEY and override.is_discrete_sweep():
            seeds = list(override.sweep_string_iterator())
        elif override.is_sweep_override():
            dimensions.append(dimension(override))
        else:
            fixed.append(f"{override.get_key_element()}={override.get_value_element_as_str()}")
    if not dimensions:
        raise ConfigError("hydra.sweeper.params: nothing to search; give a key a range, e.g. "
                          "clip: tag(log, interval(0.001, 10))")
    space = SearchSpace(
        dimensions, fixed, seeds,
        n_trials=_count(sweeper, "n_trials", 20), n_jobs=_count(sweeper, "n_jobs", 1),
        objective=_one_of(sweeper, "objective", OBJECTIVES),
        sampler=_one_of(sweeper, "sampler", SAMPLERS),
        sampler_seed=sweeper.get("sampler_seed", 0),
        enqueue=_plain(sweeper.get("enqueue")) or [])
    _check_enqueued(space)
    return space


def dimension(override: Override) -> Dimension:
    """A searched key from its override: interval(a, b), range(a, b[, step]) of integers, or a
    choice; the tag `log` puts an interval or range on a log scale."""
    key, sweep = override.get_key_element(), override.value()
    where = override.input_line or override.key_or_group
    tags = set(getattr(sweep, "tags", ()) or ())
    if tags - TAGS:
        raise ConfigError(f"{where}: unknown tag {sorted(tags - TAGS)[0]!r}; allowed: log")
    log = "log" in tags
    if isinstance(sweep, ChoiceSweep):
        if log:
            raise ConfigError(f"{where}: a choice has no scale; tag(log, ...) takes an "
                              "interval or a range")
        choices = tuple(override.sweep_string_iterator())
        if len(set(choices)) < 2:
            raise ConfigError(f"{where}: a choice needs at least two different values")
        return Dimension(key, "choice", choices=choices)
    if isinstance(sweep, IntervalSweep):
        low, high, kind, step = float(sweep.start), float(sweep.end), "float", 1
    elif isinstance(sweep, RangeSweep):
        if not all(isinstance(x, int) for x in (sweep.start, sweep.stop, sweep.step)):
            raise ConfigError(f"{where}: a range searches integers; search a float with "
                              "interval(low, high)")
        kind, step = "int", sweep.step
        low, high = sweep.start, sweep.start + step * ((sweep.stop - 1 - sweep.start) // step)
    else:
        raise ConfigError(f"{where}: not a search dimension; use interval(low, high), "
                          "range(low, high[, step]) or a choice a,b,c")
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ConfigError(f"{where}: needs finite bounds with low < high")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log scale needs a positive low bound (got {low:g})")
    if log and kind == "int" and step != 1:
        raise ConfigError(f"{where}: a log-scale range takes step 1 only")
    return Dimension(key, kind, low, high, step, log)


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _count(sweeper: DictConfig, key: str, default: int) -> int:
    value = sweeper.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"hydra.sweeper.{key}={value}: must be a positive integer")
    return value


def _one_of(sweeper: DictConfig, key: str, allowed: tuple[str, ...]) -> str:
    value = sweeper.get(key, allowed[0])
    if value not in allowed:
        raise ConfigError(f"hydra.sweeper.{key}={value}: choose one of {', '.join(allowed)}")
    return value


def _check_enqueued(space: SearchSpace) -> None:
    """Each enqueued point names every searched key once; a choice's value is one of its
    choices, a number may lie outside its range (a known reference, tried first)."""
    names = {d.name: d for d in space.dimensions}
    for i, point in enumerate(space.enqueue):
        if not isinstance(point, dict) or set(point) != set(names):
            raise ConfigError(f"hydra.sweeper.enqueue[{i}]={point}: give a value of each "
                              f"searched key ({', '.join(names)})")
        for name, value in point.items():
            d = names[name]
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if (d.kind == "choice" and not d.contains(value)) or (
                    d.kind != "choice" and not (number and math.isfinite(value))):
                raise ConfigError(f"hydra.sweeper.enqueue[{i}].{name}={value}: not a value of "
                                  f"{d.describe()}")
