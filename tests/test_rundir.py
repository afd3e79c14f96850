"""The run directory's rules (gradexp/runs/rundir.py) and its lock (gradexp/runs/runlock.py),
in this process: what a job does with the run it finds, when resume= is refused and with which
line, what clearing a run keeps, summary.json's writing and reading, one writer per run."""

from __future__ import annotations

import fcntl
import json
import math
import os
import socket

import numpy as np
import pytest

from gradexp.runs import rundir, runlock
from gradexp.runs.rundir import (
    BUSY,
    KEEP,
    RESTART,
    RESUME,
    START,
    NotResumable,
    check_resumable,
    restart_action,
)

NO_SUCH_PID = 2 ** 22 + 1  # above Linux's largest pid_max (2**22): never a process


def run(tmp_path, status=None, checkpoint=False, name="run", **record):
    """A run directory with .hydra/overrides.yaml (clip=0.1), summary.json of `status` (none
    when None) and, if asked, a checkpoint."""
    run_dir = tmp_path / name
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / rundir.OVERRIDES).write_text("- clip=0.1\n")
    if status is not None:
        rundir.write_json(run_dir / rundir.SUMMARY, {"status": status, **record})
    if checkpoint:
        (run_dir / rundir.CHECKPOINTS).mkdir()
        (run_dir / rundir.CHECKPOINTS / "checkpoint").write_text("")
    return run_dir


HERE = {"host": socket.gethostname(), "pid": os.getpid()}  # a live python process: this one
GONE = {"host": socket.gethostname(), "pid": NO_SUCH_PID}


def test_summary_json_is_written_whole_with_non_finite_numbers_as_null(tmp_path):
    path = tmp_path / "summary.json"
    rundir.write_json(path, {"a": np.float32(0.5), "b": [np.int64(3), (math.nan, math.inf)],
                             "c": {"d": -math.inf, "e": "x", "f": None, "g": True}})
    assert json.loads(path.read_text()) == {"a": 0.5, "b": [3, [None, None]],
                                            "c": {"d": None, "e": "x", "f": None, "g": True}}
    assert path.read_text().endswith("}\n") and '\n  "a": 0.5' in path.read_text()  # indent 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no .tmp left
    rundir.mark_running(tmp_path, ["clip=0.1"], {"clip": 0.1})
    assert rundir.read_status(tmp_path) == ("running", {
        "status": "running", "overrides": ["clip=0.1"], **HERE, "config": {"clip": 0.1}})


@pytest.mark.parametrize("text", [None, "{cut", '{"steps": 3}', "[1, 2]"])
def test_a_missing_or_unreadable_summary_is_status_unknown(tmp_path, text):
    if text is not None:
        (tmp_path / "summary.json").write_text(text)
    assert rundir.read_status(tmp_path) == ("unknown", {})


def test_a_record_is_of_the_same_config_as_summary_json_stores_it():
    assert rundir.same_config({}, {"clip": 1})  # an older run, without its config
    record = {"config": {"clip": None, "lr": 0.5, "layers": [1, 2]}}
    assert rundir.same_config(record, {"clip": math.nan, "lr": np.float64(0.5),
                                       "layers": (1, 2)})
    assert not rundir.same_config(record, {"clip": 0.1, "lr": 0.5, "layers": [1, 2]})


def test_a_sweep_directory_has_multirun_yaml_and_is_no_run(tmp_path):
    assert not rundir.is_sweep_dir(tmp_path)
    (tmp_path / rundir.SWEEP_RECORD).write_text("")
    assert rundir.is_sweep_dir(tmp_path) and rundir.is_sweep_dir(str(tmp_path))
    (tmp_path / ".hydra").mkdir()
    (tmp_path / rundir.OVERRIDES).write_text("")
    assert not rundir.is_sweep_dir(tmp_path)


def test_a_process_is_still_running_only_if_alive_on_this_host_and_python():
    assert rundir.still_running(HERE)
    assert not rundir.still_running(GONE)
    assert not rundir.still_running({**HERE, "host": "elsewhere"})
    assert not rundir.still_running({**HERE, "pid": str(os.getpid())})
    assert not rundir.still_running({})


@pytest.mark.parametrize("status, record, checkpoint, action", [
    (None, {}, False, START),
    (None, {}, True, START),
    ("completed", {}, True, KEEP),
    ("diverged", {}, False, KEEP),
    ("running", HERE, True, BUSY),
    ("running", GONE, True, RESUME),
    ("interrupted", {}, True, RESUME),
    ("interrupted", {}, False, RESTART),
    ("running", GONE, False, RESTART),
    ("failed", {}, True, RESTART),
])
def test_what_a_job_does_with_the_run_it_finds(tmp_path, status, record, checkpoint, action):
    assert restart_action(run(tmp_path, status, checkpoint, **record)) == action


def test_an_unreadable_summary_restarts_the_run(tmp_path):
    run_dir = run(tmp_path, checkpoint=True)
    (run_dir / rundir.SUMMARY).write_text("{cut")
    assert restart_action(str(run_dir)) == RESTART


def test_clearing_a_run_keeps_hydras_record_its_log_and_its_lock(tmp_path):
    run_dir = run(tmp_path, "failed", checkpoint=True)
    for name in ("metrics.csv", "events.out.tfevents.1.host", "provenance.json", ".lock",
                 "train.log"):
        (run_dir / name).write_text("x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept").write_text("")
    (run_dir / "link").symlink_to(elsewhere)
    rundir.clear_run(run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == [".hydra", ".lock", "train.log"]
    assert (run_dir / rundir.OVERRIDES).is_file() and (elsewhere / "kept").is_file()


def refused(run_dir, other=(), own=()):
    with pytest.raises(NotResumable) as error:
        check_resumable(run_dir, list(other), list(own))
    return str(error.value)


def test_each_reason_resume_is_refused_is_one_line(tmp_path):
    assert refused(tmp_path / "nothing") == (
        f"resume={tmp_path / 'nothing'}: neither a run directory (.hydra/overrides.yaml) nor a "
        "sweep directory (multirun.yaml)")
    for status in ("completed", "diverged", "failed"):
        assert refused(run(tmp_path, status, True, name=status)) == (
            f"resume={tmp_path / status}: the run is {status}; only an interrupted or killed "
            "run can be resumed")
    assert refused(run(tmp_path, None, True, name="unknown")).endswith(": the run is unknown; "
                                                                       "only an interrupted or "
                                                                       "killed run can be resumed")
    going = run(tmp_path, "running", True, name="going", **HERE)
    assert refused(going) == (
        f"resume={going}: the run is still going (pid {os.getpid()}); stop it first "
        f"(kill -TERM {os.getpid()}) or let it finish")
    bare = run(tmp_path, "interrupted", name="bare")
    assert refused(bare) == f"resume={bare}: no checkpoint in {bare / 'checkpoints'}"
    killed = run(tmp_path, "running", True, name="killed", **GONE)
    check_resumable(killed, [])
    check_resumable(str(run(tmp_path, "interrupted", True, name="stopped")), [], ["clip=0.1"])
    assert refused(killed, ["clip=1"], ["clip=0.1", "seed=0"]) == (
        f"resume={killed}: clip=1 differs from the run's own clip=0.1; a resumed run keeps "
        "its config (repeat its overrides as they were, or drop them)")
    assert refused(killed, ["trainer.steps=5", "+x=1"], ["clip=0.1"]) == (
        f"resume={killed}: the run goes on with its own config; drop trainer.steps=5 +x=1")


def test_an_overrides_key_and_the_refusal_that_names_it():
    assert [rundir.override_key(o) for o in ("clip=0.1", "+clip=0.1", "++a.b=c=d", "~clip",
                                             "hydra/launcher=ray")] == [
        "clip", "clip", "a.b", "clip", "hydra/launcher"]
    assert rundir.refusal(["~seed", "+clip=1"], ["clip=0.1", "seed=2"], "sweep") == (
        "~seed differs from the sweep's own seed=2; a resumed sweep keeps its config (repeat "
        "its overrides as they were, or drop them)")
    assert rundir.resume_diff(2) == "provenance.resume-2.diff"


def test_a_run_has_one_writer_and_the_refusal_names_the_holder(tmp_path):
    other = os.open(tmp_path / rundir.LOCK, os.O_RDWR | os.O_CREAT)  # another open file: as
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)                # another process's lock
    os.write(other, b"pid 12345 on node7\n")
    with pytest.raises(runlock.RunBusy) as error:
        runlock.hold(tmp_path)
    assert str(error.value) == (f"{tmp_path}: the run is held by another process (pid 12345 on "
                                "node7); a run has one writer: wait for it to end, or stop it "
                                "first")
    assert isinstance(error.value, NotResumable)  # refused as resume= refusals are: exit 2
    os.ftruncate(other, 0)  # a holder that has not written its pid yet: asked again, then named
    with pytest.raises(runlock.RunBusy, match=r"\(a process that has not written its pid yet\)"):
        runlock.hold(tmp_path)
    os.close(other)  # the other holder ends: the OS lets its lock go
    runlock.hold(tmp_path)
    (tmp_path / "sub").mkdir()
    runlock.hold(tmp_path / "sub" / "..")  # re-entrant, however the directory is spelled
    assert (tmp_path / rundir.LOCK).read_text() == f"pid {os.getpid()} on {socket.gethostname()}\n"
    probe = os.open(tmp_path / rundir.LOCK, os.O_RDWR)
    with pytest.raises(BlockingIOError):
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    runlock.release(tmp_path)
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free now
    os.close(probe)
    runlock.release(tmp_path)  # not held: nothing
    fresh = tmp_path / "fresh"  # a lock file hold makes: read-write, not executable
    fresh.mkdir()
    runlock.hold(fresh)
    umask = os.umask(0)
    os.umask(umask)
    assert (fresh / rundir.LOCK).stat().st_mode & 0o777 == 0o644 & ~umask
    runlock.release(fresh)


def test_the_holder_is_read_again_while_its_file_is_empty(tmp_path):
    """A holder writes its line just after it takes the lock: an empty file is read again
    until the line comes (here 0.2 s later) or `wait` runs out; bytes that are no UTF-8 are
    shown replaced, never an error."""
    import threading

    path = tmp_path / rundir.LOCK
    path.write_text("")
    fd = os.open(path, os.O_RDONLY)
    assert runlock._holder(fd, wait=0.1) == "a process that has not written its pid yet"
    late = threading.Timer(0.2, path.write_text, ["pid 7 on here\n"])
    late.start()
    assert runlock._holder(fd, wait=30) == "pid 7 on here"
    late.join()
    path.write_bytes(b"pid 8 on h\xffst\n")
    assert runlock._holder(fd, wait=0.1) == "pid 8 on h\ufffdst"
    os.close(fd)


def test_a_sweeps_last_lines_count_its_runs_and_name_the_unfinished_in_job_order(tmp_path,
                                                                                  capsys):
    """SweepRecord at a sweep's end: the runs by status, the ones that did not finish by job
    (2 before 10, not as strings), the summarize command, exit status 1."""
    from omegaconf import OmegaConf

    from gradexp.sweeps.callbacks import SweepRecord

    for job, status in [(0, "completed"), (2, "failed"), (10, "interrupted"), (11, "diverged")]:
        (tmp_path / str(job)).mkdir()
        rundir.write_json(tmp_path / str(job) / rundir.SUMMARY, {"status": status})
    sweep = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    with pytest.raises(SystemExit) as exit:
        SweepRecord().on_multirun_end(sweep)
    assert exit.value.code == 1
    assert capsys.readouterr().out.splitlines() == [
        f"sweep: 4 runs (1 completed, 1 failed, 1 interrupted, 1 diverged) in {tmp_path}",
        "runs that did not finish: 2, 10 (see their summary.json)",
        f"summarize: python -m gradexp.summarize {tmp_path}"]
