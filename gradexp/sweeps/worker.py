"""The processes that train a sweep's batches for `hydra/launcher=gradexp`, forked at the start of
the sweep, before anything in the launcher's process imports TensorFlow: each imports TensorFlow
(~1.8 s on 2 cores) while Hydra composes and checks the sweep's jobs (~0.1 s per job, once each:
gradexp.config.compose_once) and the launcher sets the runs up, so the first batch starts when
the later of the two is done, not after both. With `hydra.launcher.workers=N`, N batches train
at once, one per worker. What a worker runs on a batch is named by the launcher
("gradexp.train.train_batch") and imported in the worker: this module imports no trainer.

    start(n)                     fork n workers (once per process; none when TensorFlow is
                                 imported here already, e.g. in a test: a process that has run
                                 TensorFlow must not fork; batches then train in this process)
    start_early(argv)            the same from gradexp.train's entry point, before Hydra
                                 starts, when the command line names the launcher
    fork(n)                      fork workers until there are n, whatever the process has
                                 imported (its caller's to know: a test's tasks run no
                                 TensorFlow)
    train(task, batches, job_logging)
                                 for each batch (a list of gradexp.sweeps.grouping.Job), the
                                 summaries the function named `task` returns
                                 (gradexp.train.train_batch) or the exception that stopped it
                                 (None: not started, the sweep was asked to stop)
    Prestart                     the Hydra callback (first in conf/config.yaml) that calls start
                                 when the sweep's launcher is gradexp's (chosen in a config file,
                                 or more workers than start_early forked)

Signals: each worker has its own process group, so that a terminal's Ctrl-C reaches it once: the
launcher's process forwards SIGINT, SIGTERM and SIGUSR2 to the workers training, and each stops
its batch the way a run stops (checkpoint, status interrupted); no batch starts after that. A
worker gets SIGTERM when the launcher's process dies, and leaves with os._exit once the sweep is
done (its run files are closed by then): TensorFlow's teardown (~1 s) is skipped.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

LAUNCHER = "hydra_plugins.gradexp_launcher.gradexp_launcher.GradexpLauncher"
FORWARDED = [signal.SIGINT, signal.SIGTERM, *([signal.SIGUSR2] if hasattr(signal, "SIGUSR2")
                                              else [])]


@dataclass
class Worker:
    process: Any  # multiprocessing.Process
    connection: Any  # its end of a multiprocessing.Pipe


_workers: list[Worker] = []


class WorkerDied(RuntimeError):
    pass


class Prestart(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        launcher = config.hydra.launcher
        if launcher.get("_target_") == LAUNCHER:
            start(launcher.get("workers", 1))


def start_early(argv: list[str]) -> None:
    """Fork the workers at the entry point, before Hydra starts (~0.2 s before Prestart would:
    their TensorFlow import is what a batched sweep waits for), when the command line itself
    asks for them (`early_workers`); otherwise Prestart forks them."""
    start(early_workers(argv))


def early_workers(argv: list[str]) -> int:
    """The workers `argv` asks for: `-m ... hydra/launcher=gradexp [hydra.launcher.workers=N]`
    and no other option (--help, --cfg, -cd ...: 0, left to Hydra and Prestart); 0 for a
    workers value that is not a count (Hydra answers it with its error) or a max_batch that is
    not a positive one."""
    options = {a for a in argv if a.startswith("-")}
    if "hydra/launcher=gradexp" not in argv or not options or options - {"-m", "--multirun"}:
        return 0
    counts = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.launcher.workers=")]
    sizes = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.launcher.max_batch=")]
    if sizes and not (sizes[-1].isdigit() and int(sizes[-1]) > 0):
        return 0  # answered in one line (gradexp.sweeps.callbacks.PluginChecks): no worker for it
    return (int(counts[-1]) if counts[-1].isdigit() else 0) if counts else 1


def start(n: int = 1) -> None:
    """Fork workers until there are n, unless TensorFlow has been imported in this process."""
    if "tensorflow" not in sys.modules:
        fork(n)


def fork(n: int) -> None:
    """Fork workers until there are n (the caller makes sure the process may fork)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    while len(_workers) < n:
        ours, theirs = context.Pipe()
        # the launcher's ends of this pipe and the earlier workers' are the launcher's alone
        process = context.Process(target=_serve, daemon=True,
                                  args=(theirs, [ours, *(w.connection for w in _workers)]),
                                  name=f"gradexp-worker-{len(_workers)}")
        process.start()
        theirs.close()
        _workers.append(Worker(process, ours))


def train(task: str, batches: list[list], job_logging: dict | None = None) -> list:
    """Each batch's summaries, what the function named `task` returns for it (the launcher's:
    "gradexp.train.train_batch", imported where it runs, not in the launcher's process, which
    imports no TensorFlow), or the exception that ended it: WorkerDied (its runs are to be
    trained again), KeyboardInterrupt (asked twice to stop) or RuntimeError (the batch failed);
    None for a batch not started because the sweep was asked to stop."""
    if not _workers:
        return _train_here(task, batches)
    from multiprocessing.connection import wait

    results: list = [None] * len(batches)
    queue, idle, busy, stop = list(range(len(batches))), list(_workers), {}, []

    def forward(signum, frame):
        stop.append(signum)
        for w in busy.values():
            os.kill(w.process.pid, signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        while busy or (queue and idle and not stop):
            while queue and idle and not stop:
                i, w = queue.pop(0), idle.pop(0)
                w.connection.send((task, batches[i], job_logging))
                busy[i] = w
            ready = wait([w.connection for w in busy.values()])
            for i, w in [(i, w) for i, w in busy.items() if w.connection in ready]:
                del busy[i]
                results[i] = _reply(w)
                if isinstance(results[i], WorkerDied):
                    _workers.remove(w)
                    continue
                idle.append(w)
                if isinstance(results[i], KeyboardInterrupt) or _interrupted(results[i]):
                    stop.append(signal.SIGINT)
        for i in queue if not stop else []:  # every worker died: the rest cannot be sent
            results[i] = WorkerDied("no worker process left")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return results


def _train_here(task: str, batches: list[list]) -> list:
    from hydra.utils import get_method

    results: list = [None] * len(batches)
    for i, jobs in enumerate(batches):
        try:
            results[i] = get_method(task)(jobs)
        except Exception as exc:
            results[i] = exc
        if _interrupted(results[i]):
            break
    return results


def _interrupted(result) -> bool:
    from gradexp.runs.rundir import INTERRUPTED

    return isinstance(result, list) and any(s["status"] == INTERRUPTED for s in result)


def _reply(w: Worker):
    try:
        kind, value = w.connection.recv()
    except (EOFError, OSError):
        w.process.join(5)
        return WorkerDied(f"the worker process died (exit code {w.process.exitcode})")
    return {"done": lambda: value, "interrupted": KeyboardInterrupt,
            "failed": lambda: RuntimeError(value)}[kind]()


def _serve(connection, launchers_ends: list) -> None:
    """A worker: import TensorFlow, then run the task on each batch it is sent; leave at once
    when the launcher closes its end of the pipe (the copies of the launcher's ends this
    process was forked with closed first: while one is open, the pipe never closes)."""
    for end in launchers_ends:
        end.close()
    os.setpgrp()
    _die_with_parent()
    for s in FORWARDED:  # a Python handler inherited from the parent would not be ours
        signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    from gradexp import _tf  # noqa: F401  TensorFlow: why this process was started early

    while answer(connection):
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def answer(connection) -> bool:
    """A worker's turn: receive (task, batch, job_logging), run the function named `task` on
    the batch, send back ("done", its result), ("interrupted", None) or ("failed", "Type:
    message"); False, nothing done, when the pipe is closed."""
    from hydra.utils import get_method

    try:
        task, jobs, job_logging = connection.recv()
    except (EOFError, OSError):
        return False
    _console_logging(job_logging)
    try:
        reply = ("done", get_method(task)(jobs))
    except KeyboardInterrupt:
        reply = ("interrupted", None)
    except Exception as exc:
        logging.getLogger("gradexp").exception("the batch failed")
        reply = ("failed", f"{type(exc).__name__}: {exc}")
    sys.stdout.flush()
    sys.stderr.flush()
    connection.send(reply)
    return True


def _die_with_parent() -> None:
    """SIGTERM when the launcher's process dies (Linux's PR_SET_PDEATHSIG); elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _console_logging(job_logging: dict | None) -> None:
    """Hydra's job_logging without its file handlers: the worker's lines on the console, as a
    job's (each run's log file is written by gradexp.train.run_logger)."""
    import logging.config

    if not job_logging:
        return
    files = {name for name, h in job_logging.get("handlers", {}).items() if "filename" in h}
    config = {**job_logging,
              "handlers": {n: h for n, h in job_logging["handlers"].items() if n not in files}}
    for part in [config.get("root", {}), *config.get("loggers", {}).values()]:
        if "handlers" in part:
            part["handlers"] = [h for h in part["handlers"] if h not in files]
    logging.config.dictConfig(config)
