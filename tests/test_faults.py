"""Faults a run survives, each injected for real: two resumes of one run at once, a damaged
newest checkpoint, a filesystem that fills up, bad launcher and sweeper settings, a reader that
closes the pipe. docs/guide/faults.md says what gradexp promises for each."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from test_robustness import STEADY, start, summary_of, wait_for_rows

from conftest import gradexp


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

