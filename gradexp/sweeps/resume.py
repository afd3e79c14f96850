"""Finishing a sweep: `python -m gradexp.train resume=<sweep dir>`.

A sweep directory is recognised by Hydra's `multirun.yaml` at its root (and no `.hydra/` of its
own). The command becomes the sweep's own multirun again (its hydra and task overrides as
`multirun.yaml` records them, into the same directory) with the `gradexp_resume` sweeper
(hydra_plugins/gradexp_resume/): the basic sweeper's job list, the same numbers, but each job's
directory decides (`rundir.restart_action`):

    completed, diverged          kept: not launched at all, so not a file of it is touched
    interrupted, killed          launched; the job resumes from its checkpoint, its .hydra/
                                 stays and the resuming job's goes to .hydra/resumed-<time>/
    failed, never started,       the directory is removed, then the job runs from step 0
    stopped before a checkpoint
    still running here           refused: two processes must not write one directory

A job's directory is pinned with `hydra.sweep.subdir=<its number>`, so a launcher given only the
unfinished jobs still writes each into its own directory. Settings given with resume= must repeat
the sweep's own overrides as they were; any other is refused. Only sweeps of the basic sweeper
(Hydra's default) can be resumed: their job list is a function of the overrides alone.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gradexp.runs import rundir
from gradexp.runs.rundir import NotResumable

SWEEPER = "gradexp_resume"  # conf: hydra/sweeper=gradexp_resume
JOB_DIR = "${hydra.job.num}"  # the only sweep subdir a resume can reproduce


def sweep_to_resume(arguments: list[str]) -> Path | None:
    """The sweep directory that `resume=` names on the command line, if it names one."""
    values = [a.split("=", 1)[1] for a in arguments if a.startswith("resume=")]
    if values and values[-1] and rundir.is_sweep_dir(values[-1]):
        return Path(values[-1])
    return None


def multirun_arguments(sweep_dir: Path, arguments: list[str]) -> list[str]:
    """The command line that finishes the sweep in `sweep_dir`: its own overrides, its
    directory, the resuming sweeper. Refuses (NotResumable, one line) a setting that is not one
    of the sweep's own, a sweep another sweeper made, a sweep with a run still going."""
    record = OmegaConf.load(sweep_dir / rundir.SWEEP_RECORD)
    hydra = record.hydra
    sweeper = hydra.runtime.choices.get("hydra/sweeper")
    if sweeper not in ("basic", SWEEPER):
        raise NotResumable(f"resume={sweep_dir}: a sweep of hydra/sweeper={sweeper}; only "
                           "basic sweeps (a job list fixed by their overrides) can be resumed")
    if OmegaConf.to_container(hydra.sweep, resolve=False)["subdir"] != JOB_DIR:
        raise NotResumable(f"resume={sweep_dir}: its runs are not in <sweep>/<job number>/ "
                           "(hydra.sweep.subdir was changed)")
    own = [str(o) for o in [*hydra.overrides.hydra, *hydra.overrides.task]]
    others = [a for a in arguments if not a.startswith("resume=")
              and a not in ("-m", "--multirun") and a not in own]
    if others:
        raise NotResumable(f"resume={sweep_dir}: " + rundir.refusal(others, own, "sweep"))
    plan(sweep_dir, record)  # refuses a sweep with a run still going before anything starts
    kept = [o for o in own if rundir.override_key(o) not in ("hydra.sweep.dir", "hydra/sweeper")]
    return ["--multirun", *kept, f"hydra.sweep.dir={sweep_dir.resolve()}",
            f"hydra/sweeper={SWEEPER}"]


def plan(sweep_dir: Path, config: DictConfig) -> list[tuple[int, list[str], str]]:
    """(job number, overrides, restart action) of every job of the sweep `config` describes,
    in order. A job directory made by other overrides than its job's is refused."""
    from gradexp.config import sweep_jobs

    jobs = []
    for num, overrides in enumerate(sweep_jobs(config)):
        job_dir = Path(sweep_dir) / str(num)
        action = rundir.restart_action(job_dir)
        recorded = job_dir / rundir.OVERRIDES
        if recorded.is_file() and [str(o) for o in OmegaConf.load(recorded)] != list(overrides):
            raise NotResumable(f"resume={sweep_dir}: run {num} was made by other overrides than "
                               f"the sweep's job {num} ({' '.join(overrides)})")
        if action == rundir.BUSY:
            pid = rundir.read_status(job_dir)[1].get("pid")
            raise NotResumable(f"resume={sweep_dir}: run {num} is still going (pid {pid}); "
                               f"stop it first (kill -TERM {pid}) or let it finish")
        jobs.append((num, list(overrides), action))
    return jobs
