"""Faults a run survives, each injected for real: two resumes of one run at once, a damaged
newest checkpoint, a filesystem that fills up, bad launcher and sweeper settings, a reader that
closes the pipe. docs/guide/faults.md says what gradexp promises for each."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_robustness import STEADY, start, summary_of, wait_for_rows

from conftest import REPO, gradexp


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


# 2. A checkpoint to fall back on


def checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name[len("step-"):-len(".index")])
                  for p in (run_dir / "checkpoints").glob("step-*.index"))


def cut_short(run_dir: Path, step: int) -> None:
    """A checkpoint's data file cut to half its length, as a full disk or a crashed network
    filesystem leaves it."""
    (data,) = (run_dir / "checkpoints").glob(f"step-{step}.data-*")
    data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])


def test_a_truncated_newest_checkpoint_is_skipped_and_the_previous_one_used(tmp_path, killed,
                                                                            uninterrupted):
    """The run keeps its last two checkpoints; with the newest cut short, `resume=` says so in
    one line, resumes from the previous one, and its summary says which step it resumed from
    and which it skipped; the finished table is an uninterrupted run's, byte for byte."""
    run_dir = copy_of(killed, tmp_path)
    previous, newest = checkpoint_steps(run_dir)
    assert newest - previous == 100
    cut_short(run_dir, newest)
    result = gradexp("gradexp.train", f"resume={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if "damaged" in line]
    assert len(said) == 1 and f"step-{newest} (IndexError: Read less bytes" in said[0], said
    assert said[0].endswith(f"resuming from step-{previous}")
    assert f"resuming at step {previous}:" in result.stdout
    assert said[0] in (run_dir / "train.log").read_text()  # the run's own log says it too
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["resumed_from"] == previous
    assert [s["step"] for s in summary["checkpoints_skipped"]] == [newest]
    assert summary["checkpoints_skipped"][0]["error"].startswith("IndexError")
    assert (run_dir / "metrics.csv").read_bytes() == (uninterrupted / "metrics.csv").read_bytes()
    assert checkpoint_steps(run_dir) == [1100, 1200]  # two kept; the damaged one set aside
    assert (run_dir / "checkpoints" / "damaged" / f"step-{newest}.index").is_file()


def test_every_checkpoint_damaged_is_one_line_and_nothing_trains(tmp_path, killed):
    run_dir = copy_of(killed, tmp_path)
    table = (run_dir / "metrics.csv").read_bytes()
    for step in checkpoint_steps(run_dir):
        cut_short(run_dir, step)
    result = gradexp("gradexp.train", f"resume={run_dir}", cwd=tmp_path)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line.startswith(f"error: {run_dir}: every checkpoint is damaged: step-"), line
    assert "trainer.on_damaged_checkpoint=restart" in line and "resuming" not in result.stdout
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and "every checkpoint is damaged" in summary["error"]
    assert (run_dir / "metrics.csv").read_bytes() == table  # nothing trained, nothing cut


def test_a_run_asked_to_restart_when_every_checkpoint_is_damaged_starts_over(make_cfg,
                                                                             tmp_path):
    """trainer.on_damaged_checkpoint=restart: a run whose every checkpoint is damaged is
    cleared and trains from step 0; its table is then an uninterrupted run's."""
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

    from gradexp import logs
    from gradexp.write_errors import WriteFailed

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

