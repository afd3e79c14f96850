"""`hydra/launcher=gradexp`: a sweep's jobs grouped by structure, each group trained as one batch.

Jobs whose configs differ only in their seed form a group (gradexp.batched.group_key); a group
of runs that can share a compiled step trains as one batch of at most `max_batch` runs, one
dispatch per step for all of them; others train one after another, as Hydra's basic launcher
would run them. Every job is set up by Hydra's own `run_job` (output directory, .hydra/,
logging, callbacks), so its run directory is the one a separate run leaves: summary.json,
metrics.csv, event files, checkpoints, train.log. A job that finds its run in its directory
(a requeued or resumed sweep) keeps it or resumes it on its own, as `gradexp.train.run` does.

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
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)
PENDING = {"status": "pending"}  # set up, to train in its batch


@dataclass
class GradexpLauncherConf:
    _target_: str = "hydra_plugins.gradexp_launcher.gradexp_launcher.GradexpLauncher"
    max_batch: int = 32  # runs trained together at most (memory: K copies of model and data)


ConfigStore.instance().store(group="hydra/launcher", name="gradexp", node=GradexpLauncherConf,
                             provider="gradexp_launcher")


class GradexpLauncher(Launcher):
    def __init__(self, max_batch: int = 32) -> None:
        if max_batch < 1:
            raise ValueError(f"hydra.launcher.max_batch={max_batch}: must be at least 1")
        self.max_batch = max_batch
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

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
        for group in groups:
            for i in group:
                log.info("\t#%d : %s", configs[i].hydra.job.num,
                         " ".join(filter_overrides(configs[i].hydra.overrides.task)))
            returns.update(self.launch_group([configs[i] for i in group], group))
        return [returns[i] for i in range(len(configs))]

    def groups(self, configs: list[DictConfig]) -> list[list[int]]:
        """Job indices by structure, in order of first appearance, split at max_batch."""
        from gradexp.batched import group_key

        by_key: dict[str, list[int]] = {}
        for i, c in enumerate(configs):
            by_key.setdefault(group_key(task_config(c)), []).append(i)
        return [g[j:j + self.max_batch] for g in by_key.values()
                for j in range(0, len(g), self.max_batch)]

    def run(self, config: DictConfig, task_function: TaskFunction) -> JobReturn:
        return run_job(hydra_context=self.hydra_context, task_function=task_function,
                       config=config, job_dir_key="hydra.sweep.dir",
                       job_subdir_key="hydra.sweep.subdir")

    def launch_group(self, configs: list[DictConfig], indices: list[int]) -> dict[int, JobReturn]:
        """Set each job up through run_job; train the ones that start afresh as one batch."""
        from gradexp import batched, rundir

        def set_up(cfg: DictConfig):
            from hydra.core.hydra_config import HydraConfig

            run_dir = Path(HydraConfig.get().runtime.output_dir)
            if len(configs) > 1 and rundir.restart_action(run_dir) == rundir.START:
                return PENDING
            return self.task_function(cfg)  # alone, or a run found in its directory

        returns = {i: self.run(c, set_up) for i, c in zip(indices, configs, strict=True)}
        pending = [i for i in indices if returns[i].status.name == "COMPLETED"
                   and returns[i].return_value is PENDING]
        if not pending:
            return returns
        jobs = [batched.Job(r.cfg, Path(r.hydra_cfg.hydra.runtime.output_dir), list(r.overrides),
                            f"{r.hydra_cfg.hydra.job.name}.log")
                for r in (returns[i] for i in pending)]
        for handler in list(logging.getLogger().handlers):  # the last job's log file
            if isinstance(handler, logging.FileHandler):
                logging.getLogger().removeHandler(handler)
                handler.close()
        try:
            summaries = batched.train(jobs)
        except Exception as exc:  # the shared program failed: each run on its own, from step 0
            log.error("the batch of %d runs failed (%s: %s); training them one by one",
                      len(jobs), type(exc).__name__, exc)
            for i, job in zip(pending, jobs, strict=True):
                rundir.clear_run(job.run_dir)
                returns[i] = self.run(configs[indices.index(i)], self.task_function)
            return returns
        for i, summary in zip(pending, summaries, strict=True):
            returns[i].return_value = summary
        stopped = [s["stopped_by"] for s in summaries if s["status"] == rundir.INTERRUPTED]
        if stopped:  # asked to stop: the sweep stops after this batch, as after a run
            raise SystemExit(128 + signal.Signals[stopped[0]])
        return returns


def task_config(sweep_config: DictConfig) -> DictConfig:
    """A job's config without its hydra node (what the task function gets)."""
    from omegaconf import OmegaConf

    return OmegaConf.masked_copy(sweep_config, [k for k in sweep_config if k != "hydra"])
