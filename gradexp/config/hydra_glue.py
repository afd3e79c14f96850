"""gradexp's side of Hydra: the schemas put in its ConfigStore (derived from the groups'
registries), the resolvers conf/config.yaml uses, the expansion of a sweep into its jobs, and
Hydra's and OmegaConf's error texts turned into one line (`explain`), and each job of a
sweep composed once (`compose_once`)."""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, read_write
from omegaconf.errors import ConfigAttributeError, OmegaConfBaseException

from gradexp.config.base import ConfigError, schema_keys
from gradexp.config.clipping import ClippingConfig
from gradexp.config.dataset import DatasetConfig
from gradexp.config.model import ModelConfig
from gradexp.config.optimizer import OptimizerConfig
from gradexp.config.root import Config
from gradexp.config.search import SearchSweeperConfig
from gradexp.runs.rundir import HYDRA, NotResumable

if TYPE_CHECKING:
    from hydra.core.config_loader import ConfigLoader

GROUPS = (ModelConfig, DatasetConfig, OptimizerConfig, ClippingConfig)  # their OPTIONS registries


def register() -> None:
    """Put the schemas in Hydra's ConfigStore: the root as `base_config`, each option of a group
    as `<group>_<name>_schema`, which conf/<group>/<name>.yaml extends (and the search
    sweeper's, which conf/hydra/sweeper/optuna.yaml extends)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(name="search_sweeper_schema", node=SearchSweeperConfig)  # hydra/sweeper=optuna
    for base in GROUPS:
        for name, schema in base.OPTIONS.items():
            cs.store(name=f"{base.OPTIONS.group}_{name}_schema", node=schema)


register()


def _run_dir(resume: str | None, new_dir: str) -> str:
    return resume or new_dir


def _hydra_subdir(resume: str | None) -> str:
    """A resumed run keeps its .hydra/ files; the resuming command's go beside them."""
    return HYDRA if not resume else resumed_subdir()


def resumed_subdir() -> str:
    """Where a resuming job's .hydra/ files go, inside the run directory."""
    return f"{HYDRA}/resumed-{datetime.now():%Y-%m-%d_%H-%M-%S}"


OmegaConf.register_new_resolver("gradexp.run_dir", _run_dir, replace=True)
OmegaConf.register_new_resolver("gradexp.hydra_subdir", _hydra_subdir, replace=True)


def explain(exc: BaseException) -> str | None:
    """One line for a bad-input error from Hydra, OmegaConf or `validate`; None otherwise."""
    if isinstance(exc, (ConfigError, NotResumable)):
        return str(exc)
    if isinstance(exc, MissingConfigException) and exc.options is not None and exc.missing_cfg_file:
        group, _, name = exc.missing_cfg_file.rpartition("/")
        return f"{group}={name}: no such option; choose one of {', '.join(sorted(exc.options))}"
    cause = exc.__cause__
    if isinstance(exc, ConfigCompositionException) and isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None) or "config"
        if str(exc).startswith("Error merging override "):
            key = str(exc).removeprefix("Error merging override ")
        reason = str(cause).splitlines()[0]
        schema = getattr(cause, "object_type", None)
        if isinstance(cause, ConfigAttributeError) and dataclasses.is_dataclass(schema):
            reason = f"no such key; allowed: {', '.join(schema_keys(schema))}"
        return f"{key}: {reason}"
    if isinstance(exc, (OverrideParseException, ConfigCompositionException)):
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        override = getattr(exc, "override", None)  # a parse error's text may not quote it
        return text if not override or override in text else f"{override}: {text}"
    return None


def check_overrides(overrides: list[str]) -> None:
    """Raise ConfigError for an override with nothing before its `=` (`=1`), which Hydra takes
    for a choice of the primary config's group and refuses in a traceback naming neither."""
    for override in overrides:
        if override.lstrip("+~").startswith("="):
            raise ConfigError(f"{override}: no key before '='; an override is key=value")


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override lists of a basic-sweeper multirun (`hydra.sweeper.params`, then the CLI)."""
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    parsed = OverridesParser.create().parse_overrides(arguments)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def task_config(sweep_config: DictConfig) -> DictConfig:
    """A job's config without its hydra node (what the task function gets)."""
    return OmegaConf.masked_copy(sweep_config, [k for k in sweep_config if k != "hydra"])


def compose_once(loader: ConfigLoader, master: DictConfig) -> None:
    """Make `loader.load_sweep_config` compose each job of the sweep `master` starts once.

    A job is composed to check it before the sweep (gradexp.sweeps.callbacks.Checks), again by the
    sweeper to check its batch (Hydra's `validate_batch_is_legal`), and again by the launcher to
    run it: ~0.25 s each, on the critical path of a sweep of short runs. The first compose is
    kept; the later calls with the same master config and overrides get a deep copy of it
    (a launcher and `run_job` write into the config they get).

    Each job gets the master's `hydra.sweep.dir` as it is at the call: Hydra composes a job's
    again from the overrides, which would undo the callbacks' move of a taken directory (to
    `<dir>_1`) and send the jobs into the other sweep's runs.
    """
    load = loader.load_sweep_config
    composed: dict[tuple[str, ...], DictConfig] = {}

    def load_sweep_config(master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        if master_config is not master:
            return load(master_config, sweep_overrides)
        key = tuple(sweep_overrides)
        if key not in composed:
            composed[key] = load(master_config, list(sweep_overrides))
        job = copy.deepcopy(composed[key])
        with read_write(job.hydra.sweep):  # as written: an interpolation stays one
            job.hydra.sweep.dir = OmegaConf.to_container(master.hydra.sweep)["dir"]
        return job

    loader.load_sweep_config = load_sweep_config
