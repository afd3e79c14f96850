"""Groups: runs that differ only in their seed. Which override keys set runs apart
(`grouping_keys`), each run's value of each key (`group_values`), and how a group is named
(`group_label`) and ordered (`natural_value`, the baseline first) in the reports and the plots.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import yaml

from gradexp.analysis.runs import YAML_LOADER, Run

SEED_KEY = "seed"
UNSET = "(unset)"  # a swept key that neither a run's overrides nor its config has
ONE_GROUP = "sweep"  # the key of the single group when no key but the seed was swept
LR_KEY = "optimizer.learning_rate"  # a learning-rate sweep: max_stable_lr, final loss vs rate


def grouping_keys(runs: list[Run]) -> list[str]:
    """The override keys, in order of appearance, that differ between runs, except the seed,
    Hydra's own (`hydra/...`, `hydra.*`) and the names of presets that set nothing the other
    keys do not (`only_names_a_preset`); [`sweep`] (one group, `sweep=all`) if none."""
    keys = [k for k in dict.fromkeys(key for run in runs for key in run.overrides)
            if k != SEED_KEY and k != "hydra" and not k.startswith(("hydra/", "hydra."))
            and len({run.overrides.get(k) for run in runs}) > 1]
    return [k for k in keys if not only_names_a_preset(runs, k, keys)] or [ONE_GROUP]


def only_names_a_preset(runs: list[Run], key: str, keys: list[str]) -> bool:
    """Whether `key` is no value of any run's config (a preset: `+experiment=exploding_rnn`)
    and runs that agree on the other keys have the same config whatever its value (but the
    seed): then it names runs, it does not set them apart (two preset sweeps of one model)."""
    if any(_from_config(run.config, key) != UNSET for run in runs):
        return False
    others = group_values(runs, [k for k in keys if k != key]).drop(columns=SEED_KEY)
    config_of: dict[tuple, str] = {}
    for values, run in zip(others.itertuples(index=False), runs, strict=True):
        config = json.dumps({k: v for k, v in run.config.items() if k != SEED_KEY},
                            sort_keys=True, default=str)
        if config_of.setdefault(tuple(values), config) != config:
            return False
    return True


def group_values(runs: list[Run], keys: list[str]) -> pd.DataFrame:
    """One row per run, one string column per key and `seed`: each value as written in the run's
    overrides, else taken from its config (a config group such as `model` by its `name`). A
    config value takes the spelling that other runs wrote for the same value (`null`, `0.1`),
    so that `clip=null` and a run without a clip override land in the same group."""
    table = pd.DataFrame(
        [["all" if key == ONE_GROUP else run.overrides[key] if key in run.overrides
          else _from_config(run.config, key) for key in [*keys, SEED_KEY]] for run in runs],
        columns=[*keys, SEED_KEY], dtype=object)
    for column in table:
        written = {v for run in runs if (v := run.overrides.get(column)) is not None}
        from_config = [run.overrides.get(column) is None for run in runs]
        table.loc[from_config, column] = [_spelled_as(v, written)
                                          for v in table.loc[from_config, column]]
    return table.map(_as_text)


def _from_config(config: dict[str, Any], key: str) -> Any:
    """The config's value at `key` (a config group, such as `model`, by its `name`)."""
    node: Any = config
    for part in key.replace("/", ".").split("."):
        if not isinstance(node, dict) or part not in node:
            return UNSET
        node = node[part]
    return node.get("name", UNSET) if isinstance(node, dict) else node


def _parsed(text: str) -> Any:
    """An override's value as YAML reads it (`false` and `False` alike; YAML 1.1's "1e-3" a
    float), else the text."""
    try:
        parsed = yaml.load(text, Loader=YAML_LOADER)
        return float(parsed) if isinstance(parsed, str) else parsed
    except (yaml.YAMLError, ValueError):
        return text


def _spelled_as(value: Any, written: set[str]) -> Any:
    """`value` as some run wrote it in its overrides (None as `null`), else itself."""
    return next((text for text in written if _parsed(text) == value), value)


def spelling(value: str, spelled: list[str]) -> str | None:
    """The one of `spelled` that means `value` (`--baseline shuffle=false` for runs whose
    overrides say `False`, as Hydra writes a swept bool), else None."""
    return value if value in spelled else next(
        (text for text in spelled if _parsed(text) == _parsed(value)), None)


def _as_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(map(_as_text, value)) + "]"
    return str(value)


def group_label(values: dict[str, str]) -> str:
    """A group's name: `clip=0.1 layer.scale=3`."""
    return " ".join(f"{k}={v}" for k, v in values.items())


def natural_value(value: str, baseline_value: str | None) -> tuple:
    """Sort order of a key's values: the baseline first, then numbers by size, then text."""
    if value == baseline_value:
        return (0, 0.0, "")
    try:
        return (1, float(value), "")
    except ValueError:
        return (2, 0.0, value)


def varying_keys(tidy: pd.DataFrame, keys: list[str], baseline: dict[str, str]) -> list:
    """The keys whose value differs between groups (and the baseline keys): the ones worth a
    column; keys fixed for the whole sweep (e.g. trainer.steps=100) are stated once instead."""
    return [k for k in keys if tidy[k].nunique() > 1 or k in baseline] or keys

