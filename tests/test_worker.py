"""The batched launcher's worker processes (gradexp/sweeps/worker.py), with tasks that load no
TensorFlow: a worker's turn (`answer`) in this process, and real workers forked from it, the
launcher's side of the pipe (`train`) dispatching batches to them. A process that has run
TensorFlow may fork as long as the child runs none of it: these tasks are plain Python."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from multiprocessing import Pipe

import pytest

from conftest import hydra_and_logging_undone, logged_lines
from gradexp.sweeps import worker

TASK = f"{__name__}.summaries"


def summaries(jobs: list) -> list[dict]:
    """A batch's 'summaries': each job as a completed run, with what the process it ran in is:
    its pid, its process group, its parent-death signal, its SIGINT and SIGTERM handlers. A
    job named "fail", "die", "stop" or "interrupt" fails, kills its process, is interrupted or
    is asked twice to stop."""
    if "fail" in jobs:
        raise ValueError(f"no batch of {jobs}")
    if "die" in jobs:
        os._exit(3)
    if "interrupt" in jobs:
        raise KeyboardInterrupt
    death = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(death))  # PR_GET_PDEATHSIG
    return [{"status": "interrupted" if job == "stop" else "completed", "job": job,
             "pid": os.getpid(), "group": os.getpgrp(), "death": death.value,
             "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
             "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}
            for job in jobs]


def test_a_worker_answers_a_batch_with_its_summaries_its_failure_or_its_interruption(
        tmp_path, monkeypatch):
    """One turn each: ("done", the task's result), ("failed", "Type: message", logged with its
    traceback), ("interrupted", None); the job's logging set up without its file handlers (each
    run's log file is written by the run); False, once the launcher's end is closed."""
    ours, theirs = Pipe()
    job_logging = {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(message)s"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"},
                     "file": {"class": "logging.FileHandler", "formatter": "plain",
                              "filename": str(tmp_path / "job.log")}},
        "root": {"level": "INFO", "handlers": ["console", "file"]}}
    with hydra_and_logging_undone():
        ours.send((TASK, ["a", "b"], job_logging))
        assert worker.answer(theirs)
        handlers = logging.getLogger().handlers
        assert [type(h) for h in handlers] == [logging.StreamHandler]
    assert not (tmp_path / "job.log").exists()
    kind, result = ours.recv()
    assert kind == "done" and [s["job"] for s in result] == ["a", "b"]
    assert result[0]["pid"] == os.getpid()
    logged = logged_lines(monkeypatch, "gradexp")
    for jobs, reply in ((["fail"], ("failed", "ValueError: no batch of ['fail']")),
                        (["interrupt"], ("interrupted", None))):
        ours.send((TASK, jobs, None))
        assert worker.answer(theirs)
        assert ours.recv() == reply
    assert logged == ["the batch failed"]
    ours.close()
    assert not worker.answer(theirs)


@pytest.fixture
def workers(monkeypatch):
    """A function that forks n workers, this test's own; each closed and joined afterwards:
    each leaves with exit status 0 once its pipe is closed."""
    monkeypatch.setattr(worker, "_workers", [])
    started: list = []

    def fork(n: int) -> list:
        worker.fork(n)
        started[:] = list(worker._workers)
        return started

    yield fork
    for w in started:
        w.connection.close()
    for w in started:
        w.process.join(10)
    assert [w.process.exitcode for w in started if w in worker._workers] == [
        0 for w in started if w in worker._workers]


@pytest.mark.slow  # each forks workers, which import TensorFlow
def test_forked_workers_train_the_batches_in_order_each_in_its_own_process_group(workers):
    """Three batches over two workers: each batch's summaries, in the batches' order, from a
    worker (not this process), in a process group of its own (a terminal's Ctrl-C reaches it
    once: through the launcher), told SIGTERM when the launcher dies, with default handlers for
    SIGINT and SIGTERM."""
    pids = {w.process.pid for w in workers(2)}
    results = worker.train(TASK, [["a"], ["b", "c"], ["d"]])
    assert [[s["job"] for s in r] for r in results] == [["a"], ["b", "c"], ["d"]]
    for summary in (s for r in results for s in r):
        assert summary["pid"] in pids and summary["group"] == summary["pid"]
        assert summary["death"] == signal.SIGTERM
        assert summary["sigint_default"] and summary["sigterm_default"]
    assert len(worker._workers) == 2


@pytest.mark.slow  # each forks workers, which import TensorFlow
def test_a_dead_worker_is_reported_and_its_batches_go_to_the_others(workers):
    """A worker that dies (the OOM killer): its batch comes back as WorkerDied with its exit
    status, the worker is dropped, the other batches train on the one left; with none left,
    the batches not sent are WorkerDied too. A batch that fails is RuntimeError("Type:
    message"), and its worker goes on."""
    workers(2)
    results = worker.train(TASK, [["die"], ["fail"], ["b"], ["c"]])
    assert isinstance(results[0], worker.WorkerDied)
    assert str(results[0]) == "the worker process died (exit code 3)"
    assert isinstance(results[1], RuntimeError)
    assert str(results[1]) == "ValueError: no batch of ['fail']"
    assert [[s["job"] for s in r] for r in results[2:]] == [["b"], ["c"]]
    assert len(worker._workers) == 1
    last = worker.train(TASK, [["die"], ["d"]])
    assert [str(r) for r in last] == ["the worker process died (exit code 3)",
                                      "no worker process left"]
    assert worker._workers == []


@pytest.mark.slow  # each forks workers, which import TensorFlow
def test_an_interrupted_batch_stops_the_sweep_before_its_next_batch(workers):
    """A batch whose runs were interrupted (SIGTERM: checkpointed), or a worker asked twice to
    stop (KeyboardInterrupt): the batches not yet sent are not started (None)."""
    workers(1)
    stopped = worker.train(TASK, [["stop"], ["b"]])
    assert stopped[0][0]["status"] == "interrupted" and stopped[1] is None
    interrupted = worker.train(TASK, [["interrupt"], ["b"]])
    assert isinstance(interrupted[0], KeyboardInterrupt) and interrupted[1] is None
    assert len(worker._workers) == 1
