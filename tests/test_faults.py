"""Faults a run survives, each injected for real: two resumes of one run at once, a damaged
newest checkpoint, a filesystem that fills up, bad launcher and sweeper settings, a reader that
closes the pipe. docs/guide/faults.md says what gradexp promises for each."""

from __future__ import annotations

import fcntl
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_robustness import STEADY, start, summary_of, wait_for_rows

from conftest import REPO, gradexp, processes_marked

pytestmark = pytest.mark.slow  # each test starts runs, sweeps or pipes: the full tier


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("whole")
    result = gradexp("gradexp.train", *STEADY, cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (cwd / "outputs").glob("*/*")
    return run_dir


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A run of STEADY killed (SIGKILL) after step 250: its checkpoints are steps 100 and 200
    (or 200 and 300), its table runs past the newest."""
    cwd = tmp_path_factory.mktemp("killed")
    process = start(cwd, *STEADY)
    run_dir = wait_for_rows(cwd / "outputs", 250, process)
    process.kill()
    process.communicate(timeout=60)
    assert summary_of(run_dir)["status"] == "running"
    return run_dir


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of a run directory to resume (each test its own)."""
    return Path(shutil.copytree(run_dir, tmp_path / "run", symlinks=True))


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# 1. One writer per run


def test_two_resumes_at_once_one_trains_and_the_other_exits_in_one_line(tmp_path, killed,
                                                                         uninterrupted):
    """Two `resume=` of one killed run started together (a requeued job and a hand-started
    resume): exactly one trains; the other exits 2 with one line naming the first's pid, while
    the first still trains; the table is an uninterrupted run's, byte for byte."""
    run_dir = copy_of(killed, tmp_path)
    began = time.monotonic()
    processes = [start(tmp_path, f"resume={run_dir}") for _ in range(2)]
    ended: dict[int, float] = {}
    while len(ended) < 2 and time.monotonic() - began < 600:
        for p in processes:
            if p.pid not in ended and p.poll() is not None:
                ended[p.pid] = time.monotonic() - began
        time.sleep(0.02)
    outputs = {p.pid: p.communicate(timeout=60) for p in processes}
    (winner,) = [p for p in processes if p.returncode == 0]
    (loser,) = [p for p in processes if p is not winner]
    out, err = outputs[loser.pid]
    assert loser.returncode == 2, err
    line = one_line(err)
    assert line.startswith("error: ") and f"pid {winner.pid}" in line and str(run_dir) in line
    assert ended[loser.pid] < ended[winner.pid] and ended[loser.pid] < 60
    assert "resuming at step" in outputs[winner.pid][0] and "resuming" not in out
    assert summary_of(run_dir)["status"] == "completed"
    assert (run_dir / "metrics.csv").read_bytes() == (uninterrupted / "metrics.csv").read_bytes()


def test_the_lock_is_held_while_a_run_trains_and_let_go_when_it_ends(make_cfg, tmp_path):
    """Another process cannot take a held run's lock and is told who holds it; once the run
    has ended (here, in this process) it can; letting go of a lock not held does nothing."""
    from gradexp.runs import runlock
    from gradexp.train import train

    def other_process_takes(run_dir: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "from gradexp.runs import runlock; "
                               f"runlock.hold({str(run_dir)!r}); print('taken')"],
                              cwd=REPO, capture_output=True, text=True, timeout=60)

    runlock.hold(tmp_path)
    runlock.hold(tmp_path)  # again, by the same process: it holds it already
    refused = other_process_takes(tmp_path)
    assert refused.returncode == 1 and "taken" not in refused.stdout
    assert refused.stderr.strip().splitlines()[-1] == (
        f"gradexp.runs.runlock.RunBusy: {tmp_path}: the run is held by another process (pid "
        f"{os.getpid()} on {socket.gethostname()}); a run has one writer: wait for it to end, "
        "or stop it first")
    runlock.release(tmp_path)
    runlock.release(tmp_path)
    assert other_process_takes(tmp_path).stdout == "taken\n"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    train(make_cfg("trainer.steps=2", "trainer.log_every=1", "trainer.eval_every=2",
                   "trainer.histogram_every=0", "model.width=4", "trainer.jit_compile=false"),
          run_dir)
    assert other_process_takes(run_dir).stdout == "taken\n"  # the run let it go


# 2. A checkpoint to fall back on


def checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name[len("step-"):-len(".index")])
                  for p in (run_dir / "checkpoints").glob("step-*.index"))


def cut_short(run_dir: Path, step: int) -> None:
    """A checkpoint's data file cut to half its length, as a full disk or a crashed network
    filesystem leaves it."""
    (data,) = (run_dir / "checkpoints").glob(f"step-{step}.data-*")
    data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])


def test_a_truncated_newest_checkpoint_is_skipped_and_the_previous_one_used(
        tmp_path, monkeypatch, capsys, killed, uninterrupted):
    """The run keeps its last two checkpoints; with the newest cut short, `resume=` says so in
    one line, resumes from the previous one, and its summary says which step it resumed from
    and which it skipped; the finished table is an uninterrupted run's, byte for byte."""
    from conftest import in_this_process

    run_dir = copy_of(killed, tmp_path)
    # a kill between writing a checkpoint and deleting the oldest leaves three (a busy machine)
    *older, previous, newest = checkpoint_steps(run_dir)
    assert newest - previous == 100 and len(older) <= 1
    cut_short(run_dir, newest)
    monkeypatch.chdir(tmp_path)
    in_this_process(monkeypatch, f"resume={run_dir}")
    stdout = capsys.readouterr().out
    said = [line for line in stdout.splitlines() if "damaged" in line]
    assert len(said) == 1 and f"step-{newest} (IndexError: Read less bytes" in said[0], said
    assert said[0].endswith(f"resuming from step-{previous}")
    assert f"resuming at step {previous}:" in stdout
    assert said[0] in (run_dir / "train.log").read_text()  # the run's own log says it too
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["resumed_from"] == previous
    assert [s["step"] for s in summary["checkpoints_skipped"]] == [newest]
    assert summary["checkpoints_skipped"][0]["error"].startswith("IndexError")
    assert (run_dir / "metrics.csv").read_bytes() == (uninterrupted / "metrics.csv").read_bytes()
    assert checkpoint_steps(run_dir) == [1100, 1200]  # two kept; the damaged one set aside
    assert (run_dir / "checkpoints" / "damaged" / f"step-{newest}.index").is_file()


def test_every_checkpoint_damaged_is_one_line_and_nothing_trains(tmp_path, monkeypatch, capsys,
                                                                 killed):
    from conftest import exit_of

    run_dir = copy_of(killed, tmp_path)
    table = (run_dir / "metrics.csv").read_bytes()
    for step in checkpoint_steps(run_dir):
        cut_short(run_dir, step)
    monkeypatch.chdir(tmp_path)
    assert exit_of(monkeypatch, f"resume={run_dir}") == 2
    out, err = capsys.readouterr()
    line = one_line(err)
    assert line.startswith(f"error: {run_dir}: every checkpoint is damaged: step-"), line
    assert "trainer.on_damaged_checkpoint=restart" in line and "resuming" not in out
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and "every checkpoint is damaged" in summary["error"]
    assert (run_dir / "metrics.csv").read_bytes() == table  # nothing trained, nothing cut


def test_a_run_asked_to_restart_when_every_checkpoint_is_damaged_starts_over(make_cfg,
                                                                             tmp_path):
    """trainer.on_damaged_checkpoint=restart: a run whose every checkpoint is damaged is
    cleared and trains from step 0; its table is then an uninterrupted run's."""
    from gradexp.runs import runlock
    from gradexp.train import train

    cfg = make_cfg("trainer.steps=40", "trainer.log_every=10", "trainer.eval_every=20",
                   "trainer.histogram_every=0", "trainer.checkpoint_every=10", "model.width=8",
                   "trainer.jit_compile=false", "deterministic=true",
                   "trainer.on_damaged_checkpoint=restart")
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    whole.mkdir(), run_dir.mkdir()
    train(cfg, whole)
    train(cfg, run_dir)
    assert checkpoint_steps(run_dir) == [30, 40]  # trainer.keep_checkpoints=2
    for step in (30, 40):
        cut_short(run_dir, step)
    summary = train(cfg, run_dir, resume=True)
    assert summary["status"] == "completed" and summary["resumed_from"] == 0
    assert [s["step"] for s in summary["checkpoints_skipped"]] == [40, 30]
    assert (run_dir / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()
    assert not (run_dir / "checkpoints" / "damaged").exists()  # cleared with the rest
    # the run let its lock go (the lock file itself was kept): another open of it takes it
    fd = os.open(run_dir / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    runlock.release(run_dir)  # a lock not held: nothing (a batch lets go of runs never started)


# 3. A full disk, in one line


def limited(limit: int):
    """A preexec_fn: files the process writes may grow to `limit` bytes (RLIMIT_FSIZE), and a
    write past it fails with EFBIG (SIGXFSZ ignored), as on a filesystem that has filled up."""

    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def on_a_full_disk(limit: int, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "gradexp.train", *args], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=600, preexec_fn=limited(limit))


FILLS_UP = ["trainer.steps=1000", "trainer.log_every=20", "trainer.eval_every=100",
            "trainer.histogram_every=0", "trainer.checkpoint_every=100", "model.width=16"]


def test_an_event_file_that_fills_the_disk_fails_the_run_in_one_line(tmp_path):
    """The event file outgrows the filesystem first (60 kB here: near step 100 of 1000): the run
    ends with exit 1, one line naming the file, its directory and the step, status failed."""
    result = on_a_full_disk(60_000, tmp_path, *FILLS_UP)
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    assert result.returncode == 1, result.stderr
    line = one_line(result.stderr)
    found = re.fullmatch(rf"error: cannot write the event file \(events\.out\.tfevents\.[^)]+\) "
                         rf"in {re.escape(str(run_dir))} at step (\d+): File too large", line)
    assert found, line
    step = int(found.group(1))
    assert 0 < step < 1000 and step % 20 == 0
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and summary["error"] == f"WriteFailed: {line[7:]}"
    assert "Traceback" not in result.stdout + result.stderr


def test_a_checkpoint_that_fills_the_disk_fails_the_run_in_one_line(tmp_path):
    """A wide model's checkpoint (~200 kB) is the first file past 100 kB: its save at step 100
    fails; one line, exit 1, status failed, no checkpoint committed."""
    result = on_a_full_disk(100_000, tmp_path, *FILLS_UP, "model.width=256")
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    assert result.returncode == 1, result.stderr
    line = one_line(result.stderr)
    assert re.fullmatch(rf"error: cannot write the checkpoint \(step-100_temp/[^)]+\) in "
                        rf"{re.escape(str(run_dir / 'checkpoints'))} at step 100: File too large",
                        line), line
    assert summary_of(run_dir)["status"] == "failed"
    assert not list((run_dir / "checkpoints").glob("step-*.index"))


def test_a_table_on_a_full_device_fails_in_one_line_and_the_next_run_writes(make_cfg, tmp_path):
    """metrics.csv on a device that is full (/dev/full: every write fails with ENOSPC): the
    writer thread's error comes back once, as one line naming the table, the run and the step
    of its first failed write; the failed run's later writes are dropped, so a run after it in
    the same process writes its own."""
    import numpy as np

    from gradexp.runs.write_errors import WriteFailed
    from gradexp.training import logs

    cfg, names = make_cfg(), ["loss/train", "grad_norm/global"]
    (tmp_path / "full").mkdir()
    full = logs.RunLog(tmp_path / "full", names, cfg)
    full._table_file.close()
    full._table_file = open("/dev/full", "w")  # the table's file, now on a full device
    full.steps(np.arange(1, 6), np.ones((5, 2), np.float32), None)
    full.steps(np.arange(6, 11), np.ones((5, 2), np.float32), None)
    with pytest.raises(WriteFailed) as failed:
        logs.flush()
    full.events.close()
    assert str(failed.value) == (f"cannot write metrics.csv in {tmp_path / 'full'} at step 5: "
                                 "No space left on device")
    (tmp_path / "next").mkdir()
    after = logs.RunLog(tmp_path / "next", names, cfg)
    after.steps(np.arange(1, 3), np.full((2, 2), 0.5, np.float32), None)
    after.close(2, {})
    assert (tmp_path / "next" / "metrics.csv").read_text().splitlines()[1:] == [
        "1,0.5,0.5,,", "2,0.5,0.5,,"]


def test_only_a_write_that_failed_is_called_one(tmp_path):
    """A full filesystem anywhere, or a permission refused in the run's directory, is a write
    that failed; TensorFlow's out-of-memory (also a ResourceExhaustedError) outside a write, a
    dataset file the run may not read, and other errors are left as they are (None)."""
    import errno

    from gradexp._tf import tf
    from gradexp.runs.write_errors import WriteFailed, explain, reason, writing

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "summary.json.tmp"))
    assert explain(full) == f"cannot write: No space left on device ({full.filename})"
    refused = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "metrics.csv"))
    assert explain(refused, tmp_path) == f"cannot write: Permission denied ({refused.filename})"
    unreadable = PermissionError(errno.EACCES, "Permission denied", "/data/train.npz")
    oom = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
    assert [explain(e, tmp_path) for e in (unreadable, oom, ValueError("x"))] == [None] * 3
    with pytest.raises(WriteFailed, match=rf"^cannot write the checkpoint in {tmp_path} at step "
                                          r"7: OOM when allocating tensor$"):
        with writing("the checkpoint", tmp_path, 7):  # within a write, it is the write's
            raise oom
    with pytest.raises(KeyError):
        with writing("the checkpoint", tmp_path, 7):
            raise KeyError("a bug stays a bug")
    assert explain(WriteFailed("cannot write x in y at step 1: z")) == (
        "cannot write x in y at step 1: z")
    # TensorFlow's: the op's name around it dropped; any kind whose text says the disk is full
    noisy = tf.errors.ResourceExhaustedError(
        None, None, "{{function_node __inference_save_9}} ck.data; No space left on device "
                    "[Op:SaveV2]")
    unknown = tf.errors.UnknownError(None, None, "ev.tfevents; No space left on device")
    other = tf.errors.InvalidArgumentError(None, None, "shapes differ")
    assert [reason(e) for e in (noisy, unknown, other)] == [
        "ck.data; No space left on device", "ev.tfevents; No space left on device", None]


def test_a_failed_write_names_the_file_in_the_run_or_tensorflows_writer_and_the_first_one(
        tmp_path):
    """A file of the run that TensorFlow named is named by its path in the run (and, from
    TensorFlow's writer in a block that writes both, as `tensorflow` says); Python's own error
    keeps the block's name; in nested blocks the innermost write's line is the one raised."""
    import errno

    from gradexp._tf import tf
    from gradexp.runs.write_errors import WriteFailed, writing

    full = os.strerror(errno.ENOSPC)
    events = tf.errors.ResourceExhaustedError(None, None, f"{tmp_path}/ev.tfevents; {full}")
    with pytest.raises(WriteFailed) as failed:
        with writing("metrics.csv", tmp_path, 9, tensorflow="the event file"):
            raise events
    assert str(failed.value) == (
        f"cannot write the event file (ev.tfevents) in {tmp_path} at step 9: {full}")
    elsewhere = OSError(errno.ENOSPC, full, "/elsewhere/x")
    with pytest.raises(WriteFailed) as failed:
        with writing("metrics.csv", tmp_path, 9, tensorflow="the event file"):
            raise elsewhere
    assert str(failed.value) == (
        f"cannot write metrics.csv in {tmp_path} at step 9: {full} (/elsewhere/x)")
    with pytest.raises(WriteFailed) as failed:
        with writing("summary.json", tmp_path, 3):
            with writing("the checkpoint", tmp_path, 2):
                raise elsewhere
    assert str(failed.value).startswith(f"cannot write the checkpoint in {tmp_path} at step 2: ")


def test_a_sweep_on_a_full_disk_goes_on_to_its_other_runs(tmp_path):
    """Three runs on a filesystem that fills up: the long one fails in one line, the two short
    ones complete, the sweep says which did not finish and exits 1."""
    result = on_a_full_disk(60_000, tmp_path, "-m", *FILLS_UP, "trainer.steps=40,1000,60",
                            "hydra.sweep.dir=sweep")
    assert result.returncode == 1, result.stderr
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    (line,) = [line for line in output.splitlines() if "cannot write" in line]
    assert line.startswith("run failed: cannot write the event file") and "/sweep/1" in line
    statuses = {n: summary_of(tmp_path / "sweep" / n)["status"] for n in ("0", "1", "2")}
    assert statuses == {"0": "completed", "1": "failed", "2": "completed"}
    assert "runs that did not finish: 1" in result.stdout
    assert summary_of(tmp_path / "sweep" / "2")["steps"] == 60


# 4. Launcher and sweeper settings, checked up front

# (command line, the one line's start): the keys every launcher and sweeper is asked for most,
# each through the real entry point
AT_THE_COMMAND_LINE = [
    (["hydra/launcher=gradexp", "hydra.launcher.workers=0"], "hydra.launcher.workers=0"),
    (["hydra/launcher=gradexp", "hydra.launcher.workers=2", "hydra.launcher.max_batch=0"],
     "hydra.launcher.max_batch=0"),
    (["hydra/launcher=ray", "hydra.launcher.num_cpus=-1"], "hydra.launcher.num_cpus=-1.0"),
    (["hydra/launcher=ray", "hydra.launcher.num_gpus=-0.5"], "hydra.launcher.num_gpus=-0.5"),
    (["hydra/launcher=ray", "hydra.launcher.max_calls=-1"], "hydra.launcher.max_calls=-1"),
    (["hydra/launcher=ray", "hydra.launcher.address=nowhere"], "hydra.launcher.address=nowhere"),
    (["hydra/launcher=joblib", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0"),
    (["hydra/launcher=joblib", "hydra.launcher.timeout=-1"], "hydra.launcher.timeout=-1.0"),
    (["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=0"],
     "hydra.launcher.timeout_min=0"),
    (["hydra/launcher=slurm", "hydra.launcher.partition=gpu queue"],
     "hydra.launcher.partition=gpu queue"),
    (["hydra/launcher=slurm", "hydra.launcher.mem_per_cpu=4G"],
     "hydra.launcher.mem_gb=16, hydra.launcher.mem_per_cpu=4G"),
    (["hydra.sweeper.max_batch_size=0"], "hydra.sweeper.max_batch_size=0"),
    (["hydra/sweeper=optuna", "+search=clip_threshold", "hydra.sweeper.n_trials=0"],
     "hydra.sweeper.n_trials=0"),
    (["hydra/sweeper=optuna", "+search=clip_threshold", "hydra.sweeper.n_jobs=-2"],
     "hydra.sweeper.n_jobs=-2"),
]


def refused_up_front(tmp_path: Path, monkeypatch, *arguments: str, timeout: float = 300) -> str:
    """`python -m gradexp.train -m <arguments>` in tmp_path: it exits with status 2, writes
    nothing (no sweep directory, no run) and leaves no process behind; its one line."""
    import uuid

    mark = f"GRADEXP_TEST_{uuid.uuid4().hex}"
    monkeypatch.setenv(mark, "1")  # inherited by whatever the sweep starts: found in /proc
    result = gradexp("gradexp.train", "-m", *arguments, "trainer.steps=10", cwd=tmp_path,
                     timeout=timeout)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == []  # no sweep directory, no run
    deadline = time.monotonic() + 10
    while processes_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_marked(mark) == []  # no worker, Ray node or job left behind
    return one_line(result.stderr)


@pytest.mark.parametrize(("arguments", "key"), AT_THE_COMMAND_LINE,
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_bad_launcher_or_sweeper_setting_is_one_line_exit_2_and_nothing_starts(
        tmp_path, monkeypatch, arguments, key):
    assert refused_up_front(tmp_path, monkeypatch, *arguments).startswith(f"error: {key}: ")


# What a launcher needs of the machine (gradexp.config.plugins.check_machine), through the
# entry point. Without the check, Slurm's launcher ends in submitit's traceback (no srun) and a
# Ray job asking for more than the machine has waits forever (these tests then time out).
NO_SLURM = ("not found on PATH; run the sweep on a machine of the Slurm cluster (a login "
            "node), or choose a launcher for this one: hydra/launcher=gradexp, ray, joblib or "
            "submitit_local")


def more_than_ray_has(key: str, asked: str, has: str, source: str) -> str:
    what = {"num_cpus": "CPUs", "num_gpus": "GPUs"}[key]
    return (f"error: hydra.launcher.{key}={asked}: more {what} per job than this machine's Ray "
            f"runtime has, {has} ({source}); the job would wait for them forever: ask for at "
            f"most {has}, or join a cluster that has them (hydra.launcher.address)")


def without_slurm(monkeypatch) -> None:
    """PATH without Slurm's commands, as on this machine (on a cluster's node too)."""
    kept = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if not any(Path(d, c).exists() for c in ("srun", "sbatch"))]
    monkeypatch.setenv("PATH", os.pathsep.join(kept))


def a_local_ray_without_gpus(monkeypatch) -> None:
    """A Ray runtime started here, which counts no GPU whatever the machine has."""
    for variable in ("RAY_ADDRESS", "RAY_OVERRIDE_RESOURCES"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.mark.parametrize("choice", ["slurm", "submitit_slurm"])
def test_slurm_without_its_commands_is_one_line_exit_2_and_nothing_starts(tmp_path,
                                                                          monkeypatch, choice):
    without_slurm(monkeypatch)
    line = refused_up_front(tmp_path, monkeypatch, f"hydra/launcher={choice}",
                            "clip=null,0.1")
    assert line == f"error: hydra/launcher={choice}: srun and sbatch {NO_SLURM}"


@pytest.mark.parametrize(("setting", "line"), [
    ("hydra.launcher.num_gpus=1", more_than_ray_has("num_gpus", "1.0", "0", "counted by Ray")),
    ("hydra.launcher.num_gpus=0.5",
     more_than_ray_has("num_gpus", "0.5", "0", "counted by Ray")),
], ids=["num_gpus=1", "num_gpus=0.5"])
def test_more_gpus_per_job_than_a_local_ray_has_is_one_line_exit_2(tmp_path, monkeypatch,
                                                                   setting, line):
    a_local_ray_without_gpus(monkeypatch)
    assert refused_up_front(tmp_path, monkeypatch, "hydra/launcher=ray", setting,
                            "clip=null,0.1", timeout=120) == line


def test_more_cpus_per_job_than_a_local_ray_has_is_one_line_exit_2(tmp_path, monkeypatch):
    from ray._private.utils import get_num_cpus

    a_local_ray_without_gpus(monkeypatch)
    has = get_num_cpus()
    line = refused_up_front(tmp_path, monkeypatch, "hydra/launcher=ray",
                            f"hydra.launcher.num_cpus={has + 1}", "clip=null,0.1", timeout=120)
    assert line == more_than_ray_has("num_cpus", f"{has + 1:.1f}", str(has), "counted by Ray")


# every other key of each plugin gradexp ships or supports: (overrides, the one line)
EVERY_KEY = [
    (["hydra/launcher=ray", "hydra.launcher.address=ray://head"],
     "hydra.launcher.address=ray://head: must be null (a local Ray), auto, host:port or "
     "ray://host:port"),
    (["hydra/launcher=ray", "+hydra.launcher.init={num_cpus: -1}"],
     "hydra.launcher.init.num_cpus=-1: must be an integer >= 0, or null (what the machine has)"),
    (["hydra/launcher=ray", "+hydra.launcher.init={num_cpu: 2}"],
     "hydra.launcher.init.num_cpu=2: not an argument of ray.init; allowed: address, num_cpus,"),
    (["hydra/launcher=joblib", "hydra.launcher.backend=dask"],
     "hydra.launcher.backend=dask: must be one of null, loky, multiprocessing, sequential, "
     "threading"),
    (["hydra/launcher=joblib", "hydra.launcher.prefer=gpus"],
     "hydra.launcher.prefer=gpus: must be one of processes, threads"),
    (["hydra/launcher=joblib", "hydra.launcher.require=lock"],
     "hydra.launcher.require=lock: must be one of null, sharedmem"),
    (["hydra/launcher=joblib", "hydra.launcher.verbose=-1"],
     "hydra.launcher.verbose=-1: must be an integer >= 0"),
    (["hydra/launcher=joblib", "hydra.launcher.pre_dispatch=n_jobs+"],
     "hydra.launcher.pre_dispatch=n_jobs+: must be all, a positive integer, or an expression "
     "such as 2*n_jobs"),
    (["hydra/launcher=joblib", "hydra.launcher.batch_size=0"],
     "hydra.launcher.batch_size=0: must be auto or a positive integer"),
    (["hydra/launcher=joblib", "hydra.launcher.temp_folder=' '"],
     "hydra.launcher.temp_folder= : must be a directory path, or null (the system's)"),
    (["hydra/launcher=joblib", "hydra.launcher.max_nbytes=1Q"],
     "hydra.launcher.max_nbytes=1Q: must be a size such as 1M (K, M, G), or null"),
    (["hydra/launcher=joblib", "hydra.launcher.mmap_mode=rw"],
     "hydra.launcher.mmap_mode=rw: must be one of r+, r, w+, c"),
    (["hydra/launcher=submitit_local", "hydra.launcher.submitit_folder=''"],
     "hydra.launcher.submitit_folder=: must be a directory path (%j: the job id)"),
    (["hydra/launcher=submitit_local", "hydra.launcher.cpus_per_task=0"],
     "hydra.launcher.cpus_per_task=0: must be an integer >= 1, or null (the scheduler's "
     "default)"),
    (["hydra/launcher=submitit_local", "hydra.launcher.gpus_per_node=-1"],
     "hydra.launcher.gpus_per_node=-1: must be an integer >= 0, or null"),
    (["hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=0"],
     "hydra.launcher.tasks_per_node=0: must be an integer >= 1"),
    (["hydra/launcher=submitit_local", "hydra.launcher.mem_gb=-4"],
     "hydra.launcher.mem_gb=-4: must be an integer >= 0 (0: all of a node's memory)"),
    (["hydra/launcher=submitit_local", "hydra.launcher.nodes=0"],
     "hydra.launcher.nodes=0: must be an integer >= 1"),
    (["hydra/launcher=submitit_local", "hydra.launcher.name=''"],
     "hydra.launcher.name=: must be a job name"),
    (["hydra/launcher=slurm", "hydra.launcher.timeout_min=0"],
     "hydra.launcher.timeout_min=0: must be an integer >= 1"),
    (["hydra/launcher=slurm", "hydra.launcher.qos=high prio"],
     "hydra.launcher.qos=high prio: must be a QOS name, or null"),
    (["hydra/launcher=slurm", "hydra.launcher.account=' '"],
     "hydra.launcher.account= : must be an account name, or null"),
    (["hydra/launcher=slurm", "hydra.launcher.comment=''"],
     "hydra.launcher.comment=: must be a comment, or null"),
    (["hydra/launcher=slurm", "hydra.launcher.constraint=''"],
     "hydra.launcher.constraint=: must be a feature constraint, or null"),
    (["hydra/launcher=slurm", "hydra.launcher.exclude='node1, node2'"],
     "hydra.launcher.exclude=node1, node2: must be node names (comma-separated), or null"),
    (["hydra/launcher=slurm", "hydra.launcher.gres='gpu 2'"],
     "hydra.launcher.gres=gpu 2: must be a generic resource such as gpu:2, or null"),
    (["hydra/launcher=slurm", "hydra.launcher.cpus_per_gpu=0"],
     "hydra.launcher.cpus_per_gpu=0: must be an integer >= 1, or null"),
    (["hydra/launcher=slurm", "hydra.launcher.gpus_per_task=0"],
     "hydra.launcher.gpus_per_task=0: must be an integer >= 1, or null"),
    (["hydra/launcher=slurm", "hydra.launcher.mem_gb=null", "hydra.launcher.mem_per_gpu=lots"],
     "hydra.launcher.mem_per_gpu=lots: must be a size such as 16G, or null"),
    (["hydra/launcher=slurm", "hydra.launcher.mem_gb=null", "hydra.launcher.mem_per_cpu=4 G"],
     "hydra.launcher.mem_per_cpu=4 G: must be a size such as 4G, or null"),
    (["hydra/launcher=slurm", "hydra.launcher.signal_delay_s=3600"],
     "hydra.launcher.signal_delay_s=3600: must be less than the time limit, "
     "hydra.launcher.timeout_min=60 minutes (3600 s)"),
    (["hydra/launcher=slurm", "hydra.launcher.max_num_timeout=-1"],
     "hydra.launcher.max_num_timeout=-1: must be an integer >= 0"),
    (["hydra/launcher=slurm", "hydra.launcher.array_parallelism=0"],
     "hydra.launcher.array_parallelism=0: must be an integer >= 1"),
    (["hydra/sweeper=optuna", "hydra.sweeper.sampler_seed=-1"],
     "hydra.sweeper.sampler_seed=-1: must be an integer in [0, 2**32 - 1], or null"),
]


def composed_with_hydra(*overrides: str):
    """The sweep's whole config, its hydra node too, as the entry point composes it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import gradexp.config  # noqa: F401  (the schemas in Hydra's ConfigStore)

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize(("overrides", "message"), EVERY_KEY,
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_every_launcher_and_sweeper_key_is_checked_in_one_line(overrides, message):
    from gradexp.config import ConfigError
    from gradexp.config.plugins import check_plugins

    with pytest.raises(ConfigError) as refused:
        check_plugins(composed_with_hydra(*overrides))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("overrides", "key"),
                         [(a, k) for a, k in AT_THE_COMMAND_LINE
                          if "hydra/sweeper=optuna" not in a],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_the_command_lines_bad_settings_are_the_plugin_checks_own(overrides, key):
    """The command-line cases above, refused by check_plugins in this process too (the search's
    own settings are its space's: tests/test_search_space.py)."""
    from gradexp.config import ConfigError
    from gradexp.config.plugins import check_plugins

    with pytest.raises(ConfigError) as refused:
        check_plugins(composed_with_hydra(*overrides))
    assert str(refused.value).startswith(f"{key}: ") and "\n" not in str(refused.value)


def test_a_ray_address_is_null_auto_local_or_a_host_and_port():
    from gradexp.config.plugins import LAUNCHERS, RAY

    takes, _ = LAUNCHERS[RAY]["address"]
    good = [None, "auto", "local", "10.0.0.1:6379", "head-node:1", "ray://head:10001",
            "head:65535"]
    bad = ["ray://head", "head", "head:0", "head:65536", "http://head:80", "head: 80", "",
           "ray://:10001", "head:123456"]
    assert [takes(a) for a in good] == [True] * len(good)
    assert [takes(a) for a in bad] == [False] * len(bad)


def test_what_a_launcher_needs_of_the_machine_is_counted_where_it_runs(monkeypatch, tmp_path):
    """check_machine: Ray's CPUs and GPUs are counted only for a runtime started here (not
    for a cluster joined by address or RAY_ADDRESS), from RAY_OVERRIDE_RESOURCES or
    hydra.launcher.init first; Slurm's commands are asked for only by Slurm's launcher."""
    from gradexp.config import ConfigError
    from gradexp.config.plugins import check_machine

    def refusal(*overrides: str) -> str | None:
        try:
            check_machine(composed_with_hydra(*overrides))
        except ConfigError as refused:
            return f"error: {refused}"
        return None

    a_local_ray_without_gpus(monkeypatch)
    assert refusal("hydra/launcher=ray") is None  # 1 CPU, no GPU
    assert refusal("hydra/launcher=ray", "hydra.launcher.num_gpus=1") == more_than_ray_has(
        "num_gpus", "1.0", "0", "counted by Ray")
    for elsewhere in ("auto", "head:6379", "ray://head:10001"):
        assert refusal("hydra/launcher=ray", f"hydra.launcher.address={elsewhere}",
                       "hydra.launcher.num_gpus=8") is None
    assert refusal("hydra/launcher=ray", "hydra.launcher.address=local",
                   "hydra.launcher.num_gpus=8") is not None
    assert refusal("hydra/launcher=ray", "hydra.launcher.num_gpus=2",
                   "+hydra.launcher.init={num_gpus: 2}") is None
    assert refusal("hydra/launcher=ray", "hydra.launcher.num_cpus=2",
                   "+hydra.launcher.init={num_cpus: 1}") == more_than_ray_has(
        "num_cpus", "2.0", "1", "hydra.launcher.init.num_cpus")
    monkeypatch.setenv("RAY_OVERRIDE_RESOURCES", '{"GPU": 1}')
    assert refusal("hydra/launcher=ray", "hydra.launcher.num_gpus=2",
                   "+hydra.launcher.init={num_gpus: 4}") == more_than_ray_has(
        "num_gpus", "2.0", "1", "RAY_OVERRIDE_RESOURCES")
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    assert refusal("hydra/launcher=ray", "hydra.launcher.num_gpus=8") is None

    without_slurm(monkeypatch)
    assert refusal("hydra/launcher=submitit_local") is None
    for command in ("sbatch", "srun"):
        (tmp_path / command).write_text("#!/bin/sh\n")
        (tmp_path / command).chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        assert refusal("hydra/launcher=slurm") == (
            None if command == "srun" else f"error: hydra/launcher=slurm: srun {NO_SLURM}")


# keys only Hydra's type check needs (a flag, shell lines, a mapping passed on as it is), the
# Ray launcher's `init` (checked against ray.init's arguments), and the search's own, checked
# with its space (gradexp/sweeps/search/space.py)
TYPE_ONLY = {"_target_", "stderr_to_stdout", "additional_parameters", "setup", "init", "params"}
SEARCH_ONLY = {"n_trials", "n_jobs", "objective", "sampler", "enqueue"}


@pytest.mark.parametrize("choice", ["hydra/launcher=basic", "hydra/launcher=gradexp",
                                    "hydra/launcher=ray", "hydra/launcher=joblib",
                                    "hydra/launcher=submitit_local",
                                    "hydra/launcher=submitit_slurm", "hydra/launcher=slurm",
                                    "hydra/sweeper=basic", "hydra/sweeper=gradexp_resume",
                                    "hydra/sweeper=optuna"])
def test_each_plugins_defaults_pass_and_each_of_its_keys_has_a_rule(choice):
    """No plugin's own defaults are refused (gradexp's slurm.yaml's neither), and every key of
    its schema has a rule, or needs none (TYPE_ONLY)."""
    from gradexp.config.plugins import LAUNCHERS, SWEEPERS, check_plugins

    cfg = composed_with_hydra(choice)
    check_plugins(cfg)
    node = cfg.hydra.launcher if choice.startswith("hydra/launcher") else cfg.hydra.sweeper
    rules = {**LAUNCHERS, **SWEEPERS}.get(node._target_, {})
    own = SEARCH_ONLY if choice == "hydra/sweeper=optuna" else set()
    assert set(node) - TYPE_ONLY - own == set(rules), node._target_


# 5. A reader that stops early


def test_summarize_piped_into_head_ends_quietly(tmp_path):
    """`python -m gradexp.summarize DIR | head -n 1`, as a shell runs it: the tables of 40
    settings (~16 kB, past stdout's 8 kB buffer) are still being written when head has its line
    and closes the pipe; summarize ends with status 0 and no traceback, its files written."""
    from fake_runs import ending_at, write_run

    clips = ["null"] + [f"{0.01 * k:.2f}" for k in range(1, 40)]
    for i, clip in enumerate(clips):
        for seed in range(2):
            write_run(tmp_path / "sweep" / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                      ending_at(1.0 + 0.01 * i + seed))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    piped = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m gradexp.summarize sweep | head -n 1; '
                       'echo "summarize exited ${PIPESTATUS[0]}" >&2'],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    whole = subprocess.run([sys.executable, "-m", "gradexp.summarize", "sweep"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
    assert len(whole.stdout.encode()) > 12_000 and whole.returncode == 0
    assert piped.stdout == whole.stdout.splitlines(keepends=True)[0]
    assert piped.stderr == "summarize exited 0\n"  # nothing else: no BrokenPipeError
    assert (tmp_path / "sweep" / "summary.csv").is_file()
