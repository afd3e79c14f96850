"""Hydra callbacks (listed under `hydra.callbacks` in conf/config.yaml).

- `PluginChecks`: the launcher's and sweeper's settings, before any process, cluster or worker
  starts (the first callback in conf/config.yaml).
- `Checks`: every job's config is validated before any run directory is made; a sweep is
  checked whole before its first run (a search: its space, and its corners' configs; the
  search sweeper checks each trial's before it runs).
- `SweepRecord`: at the end of a sweep, a one-line account of the runs with the command that
  summarizes them; exit status 1 when a run did not finish (a sweep goes on past a crashed run,
  and says so at the end). `Checks` writes the sweep root's HParams experiment config, so the
  TensorBoard HParams view lists every run with its settings and final metrics.

Hydra turns a callback's exceptions into warnings, so a bad value ends the process here, with
one line and exit status 2.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from gradexp.config import ConfigError, compose_once, explain, sweep_jobs, task_config, validate
from gradexp.config.plugins import check_machine, check_plugins
from gradexp.runs import rundir
from gradexp.runs.rundir import check_resumable, read_status
from gradexp.sweeps.search.space import from_config, is_search
from gradexp.training.devices import check_device


def _exit_if_invalid(check) -> Any:
    try:
        return check()
    except Exception as exc:
        message = explain(exc)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


class PluginChecks(Callback):
    """The sweep's launcher and sweeper settings (gradexp/config/plugins.py), then what the
    launcher needs of this machine (Slurm's commands, Ray's CPUs and GPUs), first of all: before
    the batched launcher forks its workers, Ray starts or Slurm is asked for a job."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_if_invalid(lambda: (check_plugins(config), check_machine(config)))


class Checks(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        def check():
            validate(config)
            check_device(config.device)
            if config.resume:
                own = _own_overrides(Path(config.resume))
                others = [o for o in config.hydra.overrides.task
                          if not o.startswith("resume=") and o not in own]
                check_resumable(config.resume, others, own)

        _exit_if_invalid(check)
        if not config.resume:
            _never_reuse(config.hydra.run, "dir")

    def on_multirun_start(self, config: DictConfig, config_name: str | None = None,
                          **kwargs: Any) -> None:
        searching = is_search(config)
        if not resumes_a_sweep(config):  # its directory is the sweep's own
            _never_reuse(config.hydra.sweep, "dir")
        loader = GlobalHydra.instance().hydra.config_loader
        compose_once(loader, config)  # the sweeper and the launcher reuse the configs made here

        def check_all_jobs():
            if searching:  # trials are not known up front: check the space and its corners
                overrides = from_config(config.hydra.sweeper,
                                        list(config.hydra.overrides.task)).corner_jobs()
            else:
                overrides = sweep_jobs(config)
            jobs = [task_config(loader.load_sweep_config(config, o)) for o in overrides]
            for job in jobs:
                validate(job)
                if job.resume:
                    raise ConfigError(f"resume={job.resume}: continues one run, not a sweep (-m)")
            for device in {job.device for job in jobs}:
                check_device(device)
            return jobs

        jobs = _exit_if_invalid(check_all_jobs)
        if resumes_a_sweep(config) or searching:  # a resumed sweep has its HParams record;
            return  # the search writes it when its trials are known
        from gradexp.training.logs import write_hparams_config

        write_hparams_config(Path(config.hydra.sweep.dir), jobs)


def _own_overrides(run_dir: Path) -> list[str]:
    """The overrides a run was started with (none when it has no .hydra/ record)."""
    path = run_dir / rundir.OVERRIDES
    return [str(o) for o in OmegaConf.load(path)] if path.is_file() else []


def resumes_a_sweep(config: DictConfig) -> bool:
    """Whether this multirun finishes a sweep (`resume=<sweep dir>`, gradexp/sweeps/resume.py)."""
    return config.hydra.runtime.choices.get("hydra/sweeper") == "gradexp_resume"


def _never_reuse(node: DictConfig, key: str) -> None:
    """Two runs started in the same second would share outputs/<date>/<time>/ and the second
    would overwrite the first: give the second its own directory (<time>_1, _2, ...)."""
    path = Path(node[key])
    if not path.exists():
        return
    k = 1
    while Path(f"{path}_{k}").exists():
        k += 1
    with open_dict(node), read_write(node):
        node[key] = f"{path}_{k}"


class SweepRecord(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = sorted((s.parent for s in sweep_dir.glob(f"*/{rundir.SUMMARY}")),
                      key=lambda d: rundir.job_order(d.name))
        statuses = {job.name: read_status(job)[0] for job in jobs}
        counts = Counter(statuses.values())
        unfinished = [name for name, s in statuses.items() if s not in rundir.FINISHED]
        account = ", ".join(f"{n} {status}" for status, n in counts.most_common())
        print(f"sweep: {len(statuses)} runs ({account}) in {sweep_dir}")
        if unfinished:
            print(f"runs that did not finish: {', '.join(unfinished)} (see their {rundir.SUMMARY})")
        print(f"summarize: python -m gradexp.summarize {sweep_dir}")
        if unfinished:  # SystemExit passes Hydra's callback guard (it catches Exception only)
            raise SystemExit(1)
