"""The Ray side of `hydra/launcher=ray`, imported only when a sweep is launched.

The driver (the process that ran `python -m gradexp.train -m ...`) composes each job's config,
submits one task per job and waits for all of them; each task sets the job up in its worker as
Hydra's `run_job` does (output dir, .hydra/, logging, callbacks) and returns its JobReturn.
Results come back in job order, whatever order the jobs finish in.

Failures: the task function records its own crash and returns (gradexp's run does), so the sweep
goes on. A job whose worker process dies (killed, out of memory, node lost) comes back as
{"status": "failed", "error": ...}; its run directory keeps the status the run last wrote
(`running`: killed, resumable) and the sweep's account lists it as not finished.
SIGINT/SIGTERM of the driver: every job not yet done is cancelled; Ray raises KeyboardInterrupt
in a running one (the same as SIGINT, which gradexp's run takes as "stop after this call,
checkpoint, status interrupted"), queued ones never start. The driver waits for the running
ones to stop, then exits 128 + the signal. A second signal kills the workers at once (a job
that was starting when the first came may have missed its cancel: seen once, under heavy load).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import (
    JobReturn,
    JobStatus,
    configure_log,
    filter_overrides,
    run_job,
    setup_globals,
)
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from gradexp.training.stopping import exit_status

from .ray_launcher import RayLauncher

log = logging.getLogger(__name__)
THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


def launch(launcher: RayLauncher, job_overrides: Sequence[Sequence[str]],
           initial_job_idx: int) -> list[JobReturn]:
    setup_globals()
    config = launcher.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    # the workers may run elsewhere, in another working directory: give them an absolute path
    sweep_dir = Path(config.hydra.runtime.cwd, str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    connect(launcher.address, launcher.init)
    job = ray.remote(num_cpus=launcher.num_cpus, num_gpus=launcher.num_gpus,
                     max_calls=launcher.max_calls, max_retries=0)(run_one_job)
    threads = max(1, int(launcher.num_cpus))
    log.info("Ray is launching %d jobs (%s CPU, %s GPU each), sweep output dir: %s",
             len(job_overrides), launcher.num_cpus, launcher.num_gpus, sweep_dir)
    singleton_state = Singleton.get_state()
    configs, refs = [], []
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        sweep_config = launcher.hydra_context.config_loader.load_sweep_config(
            config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.sweep.dir = str(sweep_dir)
            sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
            sweep_config.hydra.job.num = idx
        configs.append(sweep_config)
        refs.append(job.remote(launcher.hydra_context, sweep_config, launcher.task_function,
                               singleton_state, threads))
    with stop_requests() as stop:
        wait_all(refs, stop)
    if stop.signal is not None:
        log.info("stopped by %s: jobs that had not started will not run",
                 signal.Signals(stop.signal).name)
        raise SystemExit(exit_status(stop.signal))
    return [result(ref, sweep_config) for ref, sweep_config in zip(refs, configs, strict=True)]


def connect(address: str | None, init: dict[str, Any]) -> None:
    """ray.init once per process: address None starts a local runtime (unless RAY_ADDRESS
    names a cluster), "auto" / "host:port" / "ray://host:port" join an existing one."""
    if ray.is_initialized():
        return
    ray.init(address=address, **OmegaConf.to_container(OmegaConf.create(init), resolve=True))


def run_one_job(hydra_context: HydraContext, sweep_config: DictConfig,
                task_function: TaskFunction, singleton_state: dict[Any, Any],
                threads: int) -> JobReturn:
    """In the worker: bound TensorFlow's thread pools to the job's CPUs (before TensorFlow
    loads; an explicit setting in the environment wins), then Hydra's run_job."""
    for variable in THREAD_VARIABLES:
        os.environ.setdefault(variable, str(threads))
    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    try:
        return run_job(hydra_context=hydra_context, task_function=task_function,
                       config=sweep_config, job_dir_key="hydra.sweep.dir",
                       job_subdir_key="hydra.sweep.subdir")
    except SystemExit as exc:  # the task's "I was asked to stop" (gradexp: SIGINT/SIGTERM)
        return lost_job(sweep_config, {"status": "interrupted", "exit_code": exc.code})


class StopRequest:
    signal: int | None = None
    forced: bool = False


@contextmanager
def stop_requests():
    """Within the block, SIGINT and SIGTERM are recorded for the wait loop to act on."""
    stop = StopRequest()

    def ask(signum, frame):
        stop.forced = stop.signal is not None
        stop.signal = signum

    try:
        previous = {s: signal.signal(s, ask) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def wait_all(refs: list, stop: StopRequest) -> None:
    """Wait until every job has ended, waking each second to act on a stop request."""
    pending, cancelled, forced = list(refs), False, False
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
        if stop.signal is not None and (not cancelled or (stop.forced and not forced)):
            log.info("%s: cancelling %d jobs%s", signal.Signals(stop.signal).name,
                     len(pending), " (killing their workers)" if stop.forced else "")
            for ref in pending:
                ray.cancel(ref, force=stop.forced)
            cancelled, forced = True, stop.forced


def result(ref, sweep_config: DictConfig) -> JobReturn:
    """The job's JobReturn; a job whose worker died is reported failed, and the sweep goes on."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as exc:
        run_dir = Path(sweep_config.hydra.sweep.dir, str(sweep_config.hydra.sweep.subdir))
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log.error("job #%d lost (%s): %s", sweep_config.hydra.job.num, run_dir, error)
        return lost_job(sweep_config, {"status": "failed", "error": error})


def lost_job(sweep_config: DictConfig, value: dict[str, Any]) -> JobReturn:
    """A JobReturn for a job whose task function did not return."""
    task_cfg = OmegaConf.masked_copy(sweep_config, [k for k in sweep_config if k != "hydra"])
    return JobReturn(overrides=list(sweep_config.hydra.overrides.task), cfg=task_cfg,
                     hydra_cfg=sweep_config, working_dir=os.getcwd(),
                     task_name=sweep_config.hydra.job.name, status=JobStatus.COMPLETED,
                     _return_value=value)
