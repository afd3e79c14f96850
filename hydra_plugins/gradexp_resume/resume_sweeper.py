"""`hydra/sweeper=gradexp_resume`: the basic sweeper's jobs, launching only those a sweep left
unfinished, each into its own directory. `python -m gradexp.train resume=<sweep dir>` selects
it (gradexp/sweeps/resume.py says what becomes of each job); it is not meant to be chosen by hand.

No `from __future__ import annotations`: Hydra's plugin scan runs this module outside
sys.modules, where dataclasses cannot resolve string annotations."""

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore

log = logging.getLogger(__name__)


@dataclass
class ResumeSweeperConf:
    _target_: str = "hydra_plugins.gradexp_resume.resume_sweeper.ResumeSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None  # as the basic sweeper's: a preset's sweep


ConfigStore.instance().store(group="hydra/sweeper", name="gradexp_resume",
                             node=ResumeSweeperConf, provider="gradexp")


class ResumeSweeper(BasicSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        from gradexp.config.hydra_glue import resumed_subdir
        from gradexp.runs import rundir
        from gradexp.sweeps.resume import plan

        sweep_dir = Path(self.config.hydra.sweep.dir)
        jobs = plan(sweep_dir, self.config)
        launch = []
        for num, overrides, action in jobs:
            if action == rundir.KEEP:
                continue
            if action == rundir.RESTART:  # failed, or stopped before a checkpoint: no stale file
                shutil.rmtree(sweep_dir / str(num))
            pinned = [*overrides, f"hydra.sweep.subdir={num}"]
            if action == rundir.RESUME:  # the run's own .hydra/ stays as it was
                pinned.append(f"hydra.output_subdir={resumed_subdir()}")
            launch.append(pinned)
        counts = {a: sum(1 for *_, b in jobs if b == a) for a in
                  (rundir.KEEP, rundir.RESUME, rundir.RESTART, rundir.START)}
        log.info("resuming %s: kept (finished) %d, resumed %d, run again %d, started %d",
                 sweep_dir, *counts.values())
        if not launch:
            return []
        size = self.max_batch_size or len(launch)
        returns = []
        for first in range(0, len(launch), size):
            batch = launch[first:first + size]
            self.validate_batch_is_legal(batch)
            results = self.launcher.launch(batch, initial_job_idx=first)
            for r in results:
                _ = r.return_value  # raise a job's exception, as the basic sweeper does
            returns.append(results)
        return returns
