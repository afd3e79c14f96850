"""Nothing lost: divergence is a result, SIGTERM checkpoints and resume continues exactly,
SIGKILL loses at most the unflushed steps, determinism, and no run directory is reused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import QUICK, REPO, gradexp
from gradexp.analysis.metrics import run_metrics, table_divergence_step
from gradexp.analysis.runs import load_runs, read_metrics
from gradexp.runs.measures import diverged
from gradexp.train import train

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

# 1200 steps: a SIGTERM sent once 150 rows are on disk lands well before the end (300-450 steps/s
# here; the poll and the 20-step calls let ~50-150 more steps pass, at 300 steps it was a race)
STEADY = ["trainer.steps=1200", "trainer.log_every=20", "trainer.eval_every=100",
          "trainer.histogram_every=0", "trainer.checkpoint_every=100", "model.width=16",
          "deterministic=true", "clip=0.1", "clipping=zclip"]


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_a_diverging_run_stops_at_its_step_and_is_a_result(make_cfg, tmp_path):
    summary = train(make_cfg(*QUICK, "trainer.steps=200", "optimizer.learning_rate=5"), tmp_path)
    assert summary["status"] == "diverged" and summary["diverged"] is True
    step = summary["diverged_step"]
    table = read_metrics(tmp_path / "metrics.csv")
    assert 1 < step < 200 and table["step"].iloc[-1] < 200  # it stopped early
    assert table_divergence_step(table, 1000.0) == step  # one rule, both places
    assert table["step"].iloc[-1] >= step  # the diverging step is in the table
    # the compiled call (of 10 steps here) stops after its first step that is not finite
    # (measures.diverged): nothing after it is computed or logged
    not_finite = diverged(table["loss/train"], table["grad_norm/global"], 0).to_numpy()
    assert table["step"].iloc[-1] % 10 != 0 and not_finite[-1] and not not_finite[:-1].any()
    # its final loss, here and in the summary: the last 10% of the steps before the divergence
    before = table["loss/train"].to_numpy()[: step - 1]
    expected = before[-max(1, len(before) // 10):].mean()
    assert summary["final_loss"] == expected  # to the last digit
    assert run_metrics(table)["final_loss"] == expected


# gradient reversal (grad_scale=-1) with a large step: the loss climbs ~1.5x a step after
# step ~10, over several compiled calls of 5 steps (it passes 10x its first value near step 19)
RISING = [*QUICK, "layer.grad_scale=-1", "optimizer.learning_rate=0.01", "trainer.steps=60",
          "trainer.log_every=5", "trainer.divergence_factor=10", "trainer.jit_compile=false"]


def first_above(losses, threshold, start=0) -> int | None:
    """The step (1-based) of the first loss at or after index `start` above `threshold`."""
    above = np.flatnonzero(np.asarray(losses[start:]) > threshold)
    return int(above[0]) + start + 1 if len(above) else None


def test_divergence_is_measured_against_the_runs_first_loss(make_cfg, tmp_path):
    """A loss above divergence_factor x the loss of step 1, not of the first step of the
    compiled call it is in (here calls of 5 steps: the loss at a call's start has grown)."""
    summary = train(make_cfg(*RISING), tmp_path)
    losses = read_metrics(tmp_path / "metrics.csv")["loss/train"].to_numpy()
    expected = first_above(losses, 10 * losses[0])
    assert summary["status"] == "diverged" and summary["diverged_step"] == expected
    call_start = (expected - 1) // 5 * 5  # index of the first step of its call
    assert call_start > 0 and first_above(losses, 10 * losses[call_start], call_start) != expected


def test_after_a_resume_divergence_is_measured_against_step_1s_loss(make_cfg, tmp_path):
    """A run resumed at step 15 judges a divergence against its step-1 loss (read back from
    its table), not against the first loss of the resumed part."""
    first = train(make_cfg(*RISING, "trainer.steps=15"), tmp_path)
    assert first["status"] == "completed" and first["steps"] == 15
    summary = train(make_cfg(*RISING), tmp_path, resume=True)
    losses = read_metrics(tmp_path / "metrics.csv")["loss/train"].to_numpy()
    expected = first_above(losses, 10 * losses[0])
    assert summary["status"] == "diverged" and summary["diverged_step"] == expected
    assert expected > 15  # in the resumed part, where the other reference answers otherwise
    assert first_above(losses, 10 * losses[15], 15) != expected


def test_on_divergence_continue_skips_non_finite_updates(make_cfg, tmp_path):
    cfg = make_cfg(*QUICK, "trainer.steps=60", "optimizer.learning_rate=5",
                   "trainer.on_divergence=continue", "trainer.log_every=1")  # telemetry: each step
    summary = train(cfg, tmp_path)
    assert summary["status"] == "diverged" and summary["steps"] == 60
    table = read_metrics(tmp_path / "metrics.csv")
    assert list(table["step"]) == list(range(1, 61))
    # a step whose gradient is not finite is not applied: the weights stay as they were (the
    # telemetry's ‖Δθ‖ is 0 and ‖θ‖ is the step before's, finite), on every such step
    skipped = ~np.isfinite(table["grad_norm/global"].to_numpy())
    assert 0 < skipped.sum() < 60
    for layer in [c.removeprefix("param_norm/") for c in table if c.startswith("param_norm/")]:
        weights, update = table[f"param_norm/{layer}"].to_numpy(), table[f"update_norm/{layer}"]
        assert (update.to_numpy()[skipped] == 0).all(), layer
        assert np.isfinite(weights).all()
        kept = np.flatnonzero(skipped[1:]) + 1  # rows after the first
        assert (weights[kept] == weights[kept - 1]).all(), layer
    # under mixed_float16 the loss-scale optimizer skips a non-finite step itself: it must still
    # see the step, to halve its scale (the scale logged at step t is the one step t used)
    mixed_dir = tmp_path / "mixed_float16"
    mixed_dir.mkdir()
    train(make_cfg(*QUICK, "trainer.steps=60", "optimizer.learning_rate=5",
                   "trainer.on_divergence=continue", "precision=mixed_float16"), mixed_dir)
    table = read_metrics(mixed_dir / "metrics.csv")
    scale, skipped = table["loss_scale"].to_numpy(), table["skipped"].to_numpy() == 1
    assert list(table["step"]) == list(range(1, 61)) and 0 < skipped[:-1].sum()
    assert (scale[1:][skipped[:-1]] == scale[:-1][skipped[:-1]] / 2).all()


def start(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen([sys.executable, "-m", "gradexp.train", *overrides], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cpu_seconds(pid: int) -> float | None:
    """The CPU time a process has used so far (Linux's /proc; None without it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def wait_for_rows(run_parent: Path, rows: int, process: subprocess.Popen) -> Path:
    """Until the run's table has more than `rows` rows. The run gets 240 s of its own CPU time,
    not of the clock: on a shared machine a niced run can be starved for minutes (a random-order
    run of the suite at load 4-5 on 2 cores waited 240 s of the clock here and failed); the
    clock only bounds a run that uses no CPU at all."""
    began = time.monotonic()
    while time.monotonic() - began < 1800:
        for table in run_parent.glob("*/*/metrics.csv"):
            if sum(1 for _ in table.open()) > rows:
                return table.parent
        assert process.poll() is None, process.communicate()
        used = cpu_seconds(process.pid)
        if (time.monotonic() - began if used is None else used) > 240:
            break
        time.sleep(0.05)
    process.kill()  # not left training on after the test
    raise AssertionError("the run did not get going")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("whole")
    result = gradexp("gradexp.train", *STEADY, cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (cwd / "outputs").glob("*/*")
    return run_dir


def test_sigterm_checkpoints_and_resume_matches_an_uninterrupted_run(tmp_path, uninterrupted):
    process = start(tmp_path, *STEADY)
    run_dir = wait_for_rows(tmp_path / "outputs", 150, process)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err
    stopped = summary_of(run_dir)
    assert stopped["status"] == "interrupted" and stopped["stopped_by"] == "SIGTERM"
    step = stopped["steps"]
    assert 150 <= step < 1200 and f"resume with: python -m gradexp.train resume={run_dir}" in out
    assert len(pd.read_csv(run_dir / "metrics.csv")) == step  # flushed up to the stop
    assert (run_dir / "checkpoints" / f"step-{step}.index").exists()
    before = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir() if p.is_file()}

    # the run's own overrides, repeated as they were, are accepted (another value is not)
    resumed = gradexp("gradexp.train", f"resume={run_dir}", *STEADY, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert summary_of(run_dir)["status"] == "completed"
    after = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir() if p.is_file()}
    assert after == before  # the run's own config is kept; the resume's sits beside it
    # every step, to the last digit
    assert (run_dir / "metrics.csv").read_bytes() == (uninterrupted / "metrics.csv").read_bytes()
    assert summary_of(run_dir)["final_loss"] == summary_of(uninterrupted)["final_loss"]



def test_ctrl_c_stops_after_the_call_under_way_with_exit_130(tmp_path):
    """SIGINT (Ctrl-C) is handled like SIGTERM: the run checkpoints, is `interrupted` by
    SIGINT, and the process exits 128 + 2 without a traceback."""
    process = start(tmp_path, *STEADY)
    run_dir = wait_for_rows(tmp_path / "outputs", 50, process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in err, err
    stopped = summary_of(run_dir)
    assert stopped["status"] == "interrupted" and stopped["stopped_by"] == "SIGINT"
    assert (run_dir / "checkpoints" / f"step-{stopped['steps']}.index").exists()

def test_a_resumed_streaming_run_equals_an_uninterrupted_one(tmp_path):
    """With fresh examples every step, the examples after a resume are drawn from (seed,
    dataset seed, step) as they would have been: the table is the same byte for byte. The spike
    detector (on_spike=skip, a low bar so that it skips often) resumes with its statistics: a
    detector started afresh would skip other steps after the resume."""
    streaming = [*STEADY, "dataset.stream=true", "dataset.num_examples=500",
                 "trainer.steps=800", "clipping=none", "trainer.on_spike=skip",
                 "trainer.spike_z=1", "trainer.spike_warmup=100"]
    whole = tmp_path / "whole"
    whole.mkdir()
    result = gradexp("gradexp.train", *streaming, cwd=whole)
    assert result.returncode == 0, result.stderr
    (uninterrupted_dir,) = (whole / "outputs").glob("*/*")
    process = start(tmp_path, *streaming)
    run_dir = wait_for_rows(tmp_path / "outputs", 150, process)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=120)
    stopped = summary_of(run_dir)["steps"]
    assert 150 <= stopped < 800
    resumed = gradexp("gradexp.train", f"resume={run_dir}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    table = (run_dir / "metrics.csv").read_bytes()
    assert table == (uninterrupted_dir / "metrics.csv").read_bytes()
    skipped = pd.read_csv(run_dir / "metrics.csv")["spike_skipped"].to_numpy()
    assert skipped[:100].sum() == 0 and skipped[stopped:].sum() > 0  # warm-up; after the stop


def test_a_resumed_run_reads_back_the_float32_numbers_it_wrote(tmp_path):
    """The table's nine digits parse, as float64, to numbers off in the ninth digit (0.1f is
    0.100000001490116…, its nine digits 0.100000001); a resumed run's final loss counts the steps
    before the stop, so it must read them as the float32 they were."""
    from omegaconf import OmegaConf

    from gradexp.training.logs import RunLog

    losses = np.float32([0.1, 1 / 3, 2.718281828, 1e-7, 12345.678])
    assert float(f"{losses[0]:.9g}") != float(losses[0])  # what a float64 parse would give
    cfg, names = OmegaConf.create({"clip": 0.1}), ["loss/train", "grad_norm/global"]
    first = RunLog(tmp_path, names, cfg)
    first.steps(np.arange(1, 6), np.stack([losses, 2 * losses], axis=1), None)
    first.close(5, {})
    resumed = RunLog(tmp_path, names, cfg, start_step=4)
    past = resumed.past_values("loss/train")
    assert [type(v) for v in past] == [np.float32] * 4
    assert np.asarray(past, float).tolist() == losses[:4].astype(float).tolist()
    assert resumed.past_values("grad_norm/global") == list(2 * losses[:4])
    resumed.close(4, {})


def test_sigkill_loses_at_most_the_unflushed_steps_and_summarize_marks_it(tmp_path):
    process = start(tmp_path, *STEADY, "trainer.steps=100000")
    run_dir = wait_for_rows(tmp_path / "outputs", 120, process)
    process.kill()
    process.communicate(timeout=60)
    table = pd.read_csv(run_dir / "metrics.csv")
    assert len(table) >= 120 and list(table["step"]) == list(range(1, len(table) + 1))
    assert summary_of(run_dir)["status"] == "running"
    runs, skipped = load_runs(run_dir.parent)
    assert skipped == [] and [r.status for r in runs] == ["running"]
    result = gradexp("gradexp.summarize", str(run_dir.parent), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tidy = pd.read_csv(run_dir.parent / "summary.csv", keep_default_na=False, na_values=[""])
    assert (tidy["incomplete"] == 1).all()
    # a killed run can be resumed from its last checkpoint; the rows after it are redone
    from gradexp.runs.rundir import check_resumable
    from gradexp.training.logs import keep_rows

    check_resumable(run_dir, [])
    header = list(table.columns)
    assert len(keep_rows(run_dir / "metrics.csv", header, 100)) == 100
    assert list(pd.read_csv(run_dir / "metrics.csv")["step"]) == list(range(1, 101))


def test_resume_refuses_a_run_whose_process_is_still_going(tmp_path):
    """A "running" summary.json whose process is alive on this host is not a killed run: a
    resume would have two processes writing one directory."""
    import socket

    from gradexp.runs.rundir import NotResumable, check_resumable

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("[]\n")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint").write_text("")
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True)
    # a live Python whose command line names no Python, as Ray's workers rename theirs
    renamed = subprocess.Popen(["bash", "-c", f"exec -a ray::IDLE {sys.executable} -c "
                                "'import time; time.sleep(60)'"])
    try:
        while not Path(f"/proc/{renamed.pid}/cmdline").read_bytes().startswith(b"ray::IDLE\0"):
            assert renamed.poll() is None
            time.sleep(0.01)
        for pid, refused in ((os.getpid(), True), (renamed.pid, True),
                             (int(finished.stdout), False)):
            summary = {"status": "running", "host": socket.gethostname(), "pid": pid}
            (tmp_path / "summary.json").write_text(json.dumps(summary))
            if refused:
                with pytest.raises(NotResumable, match=f"still going \\(pid {pid}\\)"):
                    check_resumable(tmp_path, [])
            else:
                check_resumable(tmp_path, [])  # its process is gone: a killed run, resumable
    finally:
        renamed.kill()
        renamed.wait()


def test_determinism_same_config_same_numbers(uninterrupted, tmp_path):
    again = gradexp("gradexp.train", *STEADY, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    assert (run_dir / "metrics.csv").read_bytes() == (uninterrupted / "metrics.csv").read_bytes()


def test_a_taken_run_directory_is_never_reused(tmp_path):
    """Two runs started in the same second would share outputs/<date>/<time>/: the second gets
    <time>_1, then _2. (The callback acts before Hydra makes the directory.)"""
    from omegaconf import OmegaConf

    from gradexp.sweeps.callbacks import _never_reuse

    taken = tmp_path / "12-00-00"
    node = OmegaConf.create({"dir": str(taken)})
    _never_reuse(node, "dir")
    assert node.dir == str(taken)  # free: kept
    taken.mkdir()
    (tmp_path / "12-00-00_1").mkdir()
    _never_reuse(node, "dir")
    assert node.dir == f"{taken}_2"
