"""The schema of `hydra.sweeper` under `hydra/sweeper=optuna` (conf/hydra/sweeper/optuna.yaml):
its keys and types. Its values, and the search space in `params`, are checked by
gradexp.sweeps.search.space when the search starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SearchSweeperConfig:
    _target_: str = "hydra_plugins.gradexp_search.search_sweeper.SearchSweeper"
    n_trials: int = 20
    n_jobs: int = 1
    objective: str = "final_loss"
    sampler: str = "tpe"
    sampler_seed: Any = 0  # an int, or null: a new sequence every time
    enqueue: list[Any] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
