"""The Hydra sweeper of `hydra/sweeper=optuna`: Optuna's ask-and-tell loop over Hydra's launcher.

    for each batch of n_jobs trials:   study.ask() each trial's values (gradexp.sweeps.search.space)
                                       compose and validate every job's config  (else exit 2)
                                       launcher.launch(the trials' jobs: one per seed)
                                       study.tell(trial, measures.trial_objective of its runs)
                                       rewrite search.csv (gradexp.runs.search_record)

Why not hydra-optuna-sweeper: its 1.3.0 pins optuna<3 (2.10.1), whose SQL storage fails with
SQLAlchemy 2 and which logs deprecation warnings at every start; and it takes the task's return
value as the objective, a float, where gradexp's task returns the run's summary. Here the
objective is computed from that summary, so train.py needs no search mode.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any

from hydra import compose
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from gradexp.config import ConfigError, explain, validate
from gradexp.runs import measures, rundir
from gradexp.runs import search_record as record
from gradexp.sweeps.search.space import Dimension, SearchSpace, from_config

log = logging.getLogger(__name__)


class SearchSweeper(Sweeper):
    """Settings (hydra.sweeper.*): see conf/hydra/sweeper/optuna.yaml and
    gradexp.sweeps.search.space."""

    config: DictConfig  # the sweep's, and the launcher it hands the jobs to: from `setup`
    launcher: Any

    def __init__(self, **settings: Any) -> None:
        """`settings`: hydra.sweeper.*, read with the whole space from `config` in `sweep`."""

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> list:
        import optuna

        space = from_config(self.config.hydra.sweeper, arguments)
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line a trial: ours
        study = optuna.create_study(direction="minimize", sampler=_sampler(optuna, space))
        for point in space.enqueue:
            study.enqueue_trial(point)
        distributions = {d.name: _distribution(optuna, d) for d in space.dimensions}
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / rundir.SWEEP_RECORD)
        log.info("search: %s", space.describe())
        returns, rows, configs, next_job = [], [], [], 0
        for first in range(0, space.n_trials, space.n_jobs):  # a batch of n_jobs trials at a time
            with warnings.catch_warnings():  # an enqueued value may lie outside its range
                warnings.filterwarnings("ignore", "Fixed parameter .* out of range")
                trials = [study.ask(distributions)
                          for _ in range(min(space.n_jobs, space.n_trials - first))]
            jobs = [space.jobs(trial.params) for trial in trials]
            configs += [self._checked(job, trial)
                        for trial, js in zip(trials, jobs, strict=True) for job in js]
            batch = [job for js in jobs for job in js]
            results = self.launcher.launch(batch, initial_job_idx=next_job)
            next_job += len(batch)
            returns.append(results)
            left = list(results)  # in the order of `batch`: each trial's runs in turn
            for trial, js in zip(trials, jobs, strict=True):
                mine, left = left[:len(js)], left[len(js):]
                rows.append(self._tell(study, trial, mine, space, sweep_dir))
            record.write(sweep_dir, [d.name for d in space.dimensions], rows)
        from gradexp.training.logs import (
            write_hparams_config,  # the launching process: no TensorFlow
        )

        write_hparams_config(sweep_dir, configs)
        log.info(best_line(study, space, sweep_dir))
        return returns

    def _checked(self, job: list[str], trial) -> DictConfig:
        """The job's config, composed and validated before it runs; a bad one ends the search
        (ConfigError: one line, exit 2)."""
        try:
            cfg = compose(config_name=self.config.hydra.job.config_name, overrides=job)
            validate(cfg)
        except Exception as exc:
            message = explain(exc)
            if message is None:
                raise
            raise ConfigError(f"search trial {trial.number} ({_point(trial.params)}): "
                              f"{message}") from None
        return cfg

    def _tell(self, study, trial, results, space: SearchSpace, sweep_dir: Path) -> dict:
        """Tell Optuna the trial's value (or that it failed); its row of search.csv."""
        from optuna.trial import TrialState

        summaries = [_summary(r) for r in results]
        values = [measures.search_objective(s, space.objective) for s in summaries]
        value = measures.trial_objective(values)
        if value is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, value)
        diverged = sum(v == math.inf for v in values)
        log.info("search trial %d (%s): %s %s%s", trial.number, _point(trial.params),
                 space.objective, "failed" if value is None else f"{value:.6g}",
                 f" ({diverged} of {len(values)} runs diverged)" if diverged else "")
        return {"trial": trial.number, "state": "fail" if value is None else "complete",
                "value": "" if value is None else value, **trial.params,
                "seeds": len(values), "diverged": diverged,
                "values": " ".join("" if v is None else repr(v) for v in values),
                "jobs": " ".join(_job_dir(r, sweep_dir) for r in results)}


def best_line(study, space: SearchSpace, sweep_dir: Path) -> str:
    done = [t for t in study.trials if t.value is not None]
    if not done:
        return f"search: no trial has a value (see {sweep_dir / record.SEARCH_RECORD})"
    best = study.best_trial
    if math.isinf(best.value):
        return f"search: every trial diverged (see {sweep_dir / record.SEARCH_RECORD})"
    return (f"search: best {_point(best.params)} (trial {best.number}): {space.objective} "
            f"{best.value:.6g}; history in {sweep_dir / record.SEARCH_RECORD}")


def _sampler(optuna, space: SearchSpace):
    if space.sampler == "random":
        return optuna.samplers.RandomSampler(seed=space.sampler_seed)
    return optuna.samplers.TPESampler(seed=space.sampler_seed)


def _distribution(optuna, d: Dimension):
    if d.kind == "choice":
        return optuna.distributions.CategoricalDistribution(d.choices)
    if d.kind == "int":
        return optuna.distributions.IntDistribution(d.low, d.high, log=d.log, step=d.step)
    return optuna.distributions.FloatDistribution(d.low, d.high, log=d.log)


def _summary(result) -> dict:
    """The run's summary (gradexp's task returns one on every path); {} for a job that
    raised."""
    try:
        return result.return_value
    except Exception:
        return {}


def _job_dir(result, sweep_dir: Path) -> str:
    return os.path.relpath(result.hydra_cfg.hydra.runtime.output_dir, sweep_dir)


def _point(params: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in params.items())
