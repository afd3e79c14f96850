"""`hydra/launcher=gradexp`: a sweep's jobs grouped by structure, each group trained as one batch.

Jobs whose configs differ only in data of the compiled step (seed, clip bounds, learning rate)
form a group (gradexp/sweeps/grouping.py); a group of runs that can share a compiled step trains as
one batch of at most `max_batch` runs, one dispatch per call for all of them
(gradexp/training/engine.py); others train one after another, as Hydra's basic launcher would run
them. Batches train in worker processes forked when the sweep starts (gradexp/sweeps/worker.py),
which import TensorFlow while this one composes the jobs;
`workers` of them train at once (a group is split while there are fewer batches than workers).
Every job is set up here by Hydra's own `run_job` (output directory, .hydra/, logging,
`on_job_start` callbacks) and its provenance recorded, so its run directory is the one a separate
run leaves: summary.json, metrics.csv, event files, checkpoints, train.log. Its `on_job_end`
callbacks are called once its run has trained, with the run's summary as the job's return, as
under any launcher. A job that finds its run in its directory (a requeued or resumed sweep)
keeps it or resumes it on its own, in this process, as `gradexp.train.run` does.

If a batch fails as a whole (an exception in the shared program), its runs are cleared and
trained one by one, so that each run's failure, if any, is its own. SIGINT/SIGTERM: every run
of the batch under way checkpoints and is marked interrupted; the sweep stops (exit 128 + the
signal), and `resume=<sweep dir>` finishes it.
"""

import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)
PENDING = {"status": "pending"}  # set up, to train in its batch


@dataclass
class GradexpLauncherConf:
    _target_: str = "hydra_plugins.gradexp_launcher.gradexp_launcher.GradexpLauncher"
    max_batch: int = 32  # runs trained together at most (memory: K copies of model and data)
    workers: int = 1  # batches trained at once, each in its own process (a CPU core or GPU each)


ConfigStore.instance().store(group="hydra/launcher", name="gradexp", node=GradexpLauncherConf,
                             provider="gradexp_launcher")


class GradexpLauncher(Launcher):
    def __init__(self, max_batch: int = 32, workers: int = 1) -> None:
        for key, value in (("max_batch", max_batch), ("workers", workers)):
            if value < 1:
                raise ValueError(f"hydra.launcher.{key}={value}: must be at least 1")
        self.max_batch, self.workers = max_batch, workers
        self.recorded: dict[Path, dict] = {}  # provenance.json of the runs set up to start
        self.ended: dict[int, tuple] = {}  # on_job_end's arguments of the jobs set up to train
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        from gradexp.sweeps import worker

        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        worker.start(self.workers)  # if gradexp.sweeps.worker.Prestart has not (no such callback)

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        configs = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            sweep_config = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
                sweep_config.hydra.job.num = idx
            configs.append(sweep_config)
        groups = self.groups(configs)
        log.info("Launching %d jobs in %d groups, sweep output dir: %s", len(configs),
                 len(groups), self.config.hydra.sweep.dir)
        returns: dict[int, JobReturn] = {}
        batches: list[list[int]] = []  # the jobs of each group that start afresh
        for c in configs:  # before run_job points the log at a job's file
            log.info("\t#%d : %s", c.hydra.job.num,
                     " ".join(filter_overrides(c.hydra.overrides.task)))
        for group in groups:
            for i in group:
                returns[i] = self.run(configs[i], self.set_up)
            batches.append([i for i in group if returns[i].status.name == "COMPLETED"
                            and returns[i].return_value is PENDING])
        self.train([b for b in batches if b], configs, returns)
        return [returns[i] for i in range(len(configs))]

    def groups(self, configs: list[DictConfig]) -> list[list[int]]:
        """Job indices by structure, in order of first appearance, split at max_batch, and
        split further while there are fewer batches than workers; a run whose config cannot
        share a program is a group of its own, and the log says why."""
        from gradexp.config import task_config
        from gradexp.sweeps.grouping import group_key, why_separate

        by_key: dict[str, list[int]] = {}
        for i, c in enumerate(configs):
            by_key.setdefault(group_key(task_config(c)), []).append(i)
        groups = []
        for members in by_key.values():
            reason = why_separate(task_config(configs[members[0]]))
            for i in members if reason else []:
                log.info("\t#%d trains on its own: %s",
                         OmegaConf.select(configs[i], "hydra.job.num", default=i), reason)
            groups += ([[i] for i in members] if reason else
                       [members[j:j + self.max_batch]
                        for j in range(0, len(members), self.max_batch)])
        while len(groups) < self.workers and max(map(len, groups)) > 1:
            largest = max(groups, key=len)  # halves interleaved: a sweep's settings in both
            at = groups.index(largest)
            groups[at:at + 1] = [largest[0::2], largest[1::2]]
        return groups

    def run(self, config: DictConfig, task_function: TaskFunction) -> JobReturn:
        """Hydra's run_job; a job left to its batch (PENDING) has its on_job_end callbacks held
        back until its run has trained (`end`)."""
        context = self.hydra_context
        if task_function == self.set_up:
            context = HydraContext(config_loader=context.config_loader,
                                   callbacks=_HoldJobEnd(context.callbacks, self.ended,
                                                         config.hydra.job.num))
        return run_job(hydra_context=context, task_function=task_function, config=config,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")

    def end(self, num: int, returned: JobReturn) -> None:
        """The job's on_job_end callbacks, held back at set-up, now that it has its return."""
        config, _ = self.ended.pop(num)
        saved = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(config)
        try:
            self.hydra_context.callbacks.on_job_end(config=config, job_return=returned)
        finally:
            HydraConfig.instance().cfg = saved

    def set_up(self, cfg: DictConfig):
        """A job's task here: its run directory set up by run_job, the run left to its batch
        (PENDING) when it starts afresh, its provenance recorded (here, while the worker imports
        TensorFlow, not beside the batch's compile; the launch's first record serves the rest);
        a run found in its directory is kept or resumed."""
        from hydra.core.hydra_config import HydraConfig

        from gradexp.runs import provenance, rundir

        run_dir = Path(HydraConfig.get().runtime.output_dir)
        if rundir.restart_action(run_dir) == rundir.START:
            taken = next(iter(self.recorded.items()), None)  # a run of this launch, just set up
            self.recorded[run_dir] = (provenance.record(run_dir) if taken is None
                                      else provenance.record_as(run_dir, *taken))
            return PENDING
        return self.task_function(cfg)

    def train(self, batches: list[list[int]], configs: list[DictConfig],
              returns: dict[int, JobReturn]) -> None:
        """Train the batches in the workers (gradexp/sweeps/worker.py); a batch that failed as a
        whole is trained again one run at a time, here."""
        from gradexp.runs import rundir
        from gradexp.sweeps import worker
        from gradexp.sweeps.grouping import Job
        from gradexp.training.stopping import exit_status

        if not batches:
            return
        for handler in list(logging.getLogger().handlers):  # the last job's log file
            if isinstance(handler, logging.FileHandler):
                logging.getLogger().removeHandler(handler)
                handler.close()
        jobs = [[Job(returns[i].cfg, run_dir, list(returns[i].overrides),
                     f"{returns[i].hydra_cfg.hydra.job.name}.log", self.recorded.pop(run_dir, None),
                     file_format(returns[i].hydra_cfg))
                 for i in batch
                 for run_dir in [Path(returns[i].hydra_cfg.hydra.runtime.output_dir)]]
                for batch in batches]
        job_logging = OmegaConf.to_container(
            returns[batches[0][0]].hydra_cfg.hydra.job_logging, resolve=True)
        results = worker.train("gradexp.train.train_batch", jobs, job_logging)
        if any(isinstance(r, KeyboardInterrupt) for r in results):
            raise KeyboardInterrupt
        stopped = []
        for batch, batch_jobs, result in zip(batches, jobs, results, strict=True):
            if isinstance(result, Exception):  # each run on its own, from step 0
                log.error("the batch of %d runs failed (%s: %s); training them one by one",
                          len(batch), type(result).__name__, result)
                for i, job in zip(batch, batch_jobs, strict=True):
                    rundir.clear_run(job.run_dir)
                    self.ended.pop(configs[i].hydra.job.num, None)  # run_job calls them now
                    returns[i] = self.run(configs[i], self.task_function)
                continue
            for i, summary in zip(batch, result or [], strict=False):
                returns[i].return_value = summary
                self.end(configs[i].hydra.job.num, returns[i])
                if summary["status"] == rundir.INTERRUPTED:
                    stopped.append(summary["stopped_by"])
        if stopped:  # asked to stop: the sweep stops, as after a run
            raise SystemExit(exit_status(signal.Signals[stopped[0]]))


def file_format(hydra_cfg: DictConfig) -> str:
    """The format of a job's log file: its job_logging's file handler's formatter's."""
    logging_cfg = hydra_cfg.hydra.job_logging
    name = OmegaConf.select(logging_cfg, "handlers.file.formatter")
    return OmegaConf.select(logging_cfg, f"formatters.{name}.format") or "%(message)s"


class _HoldJobEnd:
    """Hydra's callbacks for a job set up to train later: on_job_end is held back (its arguments
    kept in `ended` under the job's number), the others pass."""

    def __init__(self, callbacks, ended: dict, num: int):
        self.callbacks, self.ended, self.num = callbacks, ended, num

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        if job_return.status.name == "COMPLETED" and job_return.return_value is PENDING:
            self.ended[self.num] = (config, job_return)
        else:
            self.callbacks.on_job_end(config=config, job_return=job_return, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.callbacks, name)
