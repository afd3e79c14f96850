"""Sweeps past interruptions: `resume=<sweep dir>` finishes a sweep as if it had never stopped,
and a job re-executed in its own run directory (a requeue) resumes its run instead of starting
over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, gradexp, in_this_process

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

# deterministic: the tables of a stopped-and-resumed sweep and of a whole one are equal, byte for
# byte. A signal sent once 40 rows are on disk lands well before step 300 (150-450 steps/s here;
# the poll and the 20-step calls let ~50-150 more steps pass). The submitit test stops its job
# twice: 500 steps.
STEADY = ["trainer.jit_compile=false", "trainer.log_every=20", "trainer.eval_every=100",
          "trainer.histogram_every=0", "trainer.checkpoint_every=100", "model.width=16",
          "deterministic=true", "clip=0.1"]
SWEEP = ["seed=0,1,2,3", "trainer.steps=300", *STEADY]


def env() -> dict:
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    environment.pop("HYDRA_FULL_ERROR", None)
    return environment


def start(cwd: Path, *args: str) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "gradexp.train", *args], cwd=cwd, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, process: subprocess.Popen, what: str):
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}")


def rows(table: Path) -> int:
    try:
        with table.open() as f:
            return sum(1 for _ in f) - 1
    except OSError:
        return 0


def the_sweep(cwd: Path) -> Path:
    (sweep_dir,) = (cwd / "outputs" / "multirun").glob("*/*")
    return sweep_dir


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def mtimes(*paths: Path) -> dict[str, int]:
    files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
    return {str(f): f.stat().st_mtime_ns for f in files}


def sweep_record(sweep: Path, sweeper: str = "basic", subdir: str = "${hydra.job.num}",
                 hydra: tuple[str, ...] = ()) -> Path:
    """A sweep directory with multirun.yaml as Hydra writes it, the parts a resume reads: a
    sweep of seed=0,1 clip=0.1 (`hydra`: its hydra overrides)."""
    from omegaconf import OmegaConf

    sweep.mkdir()
    OmegaConf.save(OmegaConf.create({"hydra": {
        "runtime": {"choices": {"hydra/sweeper": sweeper}},
        "sweep": {"dir": str(sweep), "subdir": subdir}, "sweeper": {"params": None},
        "overrides": {"hydra": list(hydra), "task": ["seed=0,1", "clip=0.1"]}}}),
        sweep / "multirun.yaml")
    return sweep


def run_of_another_job(sweep: Path) -> Path:
    """Run 1 of a sweep_record sweep, made by other overrides than its job's (seed=1)."""
    (sweep / "1" / ".hydra").mkdir(parents=True)
    (sweep / "1" / ".hydra" / "overrides.yaml").write_text("- seed=7\n- clip=0.1\n")
    return sweep


def run_still_going(sweep: Path) -> Path:
    """Run 0 of a sweep, written by a live process here: this one."""
    import socket

    (sweep / "0").mkdir()
    (sweep / "0" / "summary.json").write_text(json.dumps({
        "status": "running", "host": socket.gethostname(), "pid": os.getpid()}))
    return sweep


def test_a_sweep_stopped_in_its_second_run_finishes_as_if_it_had_never_stopped(tmp_path):
    whole = start(tmp_path / "whole", "-m", *SWEEP)  # alongside: two cores
    stopped = start(tmp_path / "stopped", "-m", *SWEEP)
    second = wait_for(lambda: next((tmp_path / "stopped").glob("outputs/multirun/*/*/1"), None),
                      stopped, "the second run")
    wait_for(lambda: rows(second / "metrics.csv") > 40, stopped, "the second run's rows")
    stopped.send_signal(signal.SIGTERM)
    out, err = stopped.communicate(timeout=120)
    assert stopped.returncode == 128 + signal.SIGTERM, err
    sweep_dir = the_sweep(tmp_path / "stopped")
    assert summary_of(sweep_dir / "0")["status"] == "completed"
    interrupted = summary_of(sweep_dir / "1")
    assert interrupted["status"] == "interrupted" and 40 < interrupted["steps"] < 300
    assert not (sweep_dir / "2").exists() and not (sweep_dir / "3").exists()
    # run 2 as a crash leaves it: a failed summary and files of its own; they must not survive
    (sweep_dir / "2").mkdir()
    (sweep_dir / "2" / "summary.json").write_text('{"status": "failed", "error": "OSError"}')
    (sweep_dir / "2" / "metrics.csv").write_text("step,loss/train\n1,123\n")
    (sweep_dir / "2" / "stale.txt").write_text("from the failed attempt")
    own_hydra = {p.name: p.read_bytes() for p in (sweep_dir / "1" / ".hydra").iterdir()}
    untouched = mtimes(sweep_dir / "0", sweep_dir / "multirun.yaml",
                       *sweep_dir.glob("events.out.tfevents.*"))

    refused = gradexp("gradexp.train", f"resume={sweep_dir}", "clip=0.2", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "clip=0.2 differs from the sweep's own clip=0.1" in refused.stderr
    # the sweep's own overrides, repeated as they were, are no other setting
    resumed = gradexp("gradexp.train", f"resume={sweep_dir}", *SWEEP, cwd=tmp_path / "stopped",
                      timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"sweep: 4 runs (4 completed) in {sweep_dir.resolve()}" in resumed.stdout
    assert "kept (finished) 1, resumed 1, run again 1, started 1" in resumed.stdout + \
        resumed.stderr
    assert mtimes(sweep_dir / "0", sweep_dir / "multirun.yaml",
                  *sweep_dir.glob("events.out.tfevents.*")) == untouched
    log = (sweep_dir / "1" / "train.log").read_text()
    assert f"resuming at step {interrupted['steps']}:" in log
    assert {p.name: p.read_bytes() for p in (sweep_dir / "1" / ".hydra").iterdir()
            if p.is_file()} == own_hydra  # the resuming job's config sits in resumed-<time>/
    assert len(list((sweep_dir / "1" / ".hydra").glob("resumed-*/overrides.yaml"))) == 1
    assert not (sweep_dir / "2" / "stale.txt").exists()

    out, err = whole.communicate(timeout=600)
    assert whole.returncode == 0, err
    reference = the_sweep(tmp_path / "whole")
    for run in ("0", "1", "2", "3"):
        assert (sweep_dir / run / "metrics.csv").read_bytes() == \
            (reference / run / "metrics.csv").read_bytes(), run
        assert summary_of(sweep_dir / run)["final_loss"] == summary_of(reference / run)[
            "final_loss"]
        assert (sweep_dir / run / ".hydra" / "overrides.yaml").read_bytes() == \
            (reference / run / ".hydra" / "overrides.yaml").read_bytes()
    assert len(pd.read_csv(sweep_dir / "1" / "metrics.csv")) == 300


def test_a_submitit_job_warned_requeued_or_killed_re_executed_resumes_its_run(tmp_path):
    """One submitit_local job, three ways a cluster ends it:

    1. SIGUSR2, Slurm's notice before a time-out or pre-emption (`--signal=USR2@120`): the run
       stops after the call under way and checkpoints (checkpoint_every=0: its only checkpoint),
       then submitit's handler requeues the job; submitit_local's controller runs it again and
       it resumes at that very step.
    2. SIGKILL (an out-of-memory kill, a lost node): the sweep sees its job die; the job submitit
       pickled, re-executed as a requeue would, resumes from the checkpoint, not from step 0.
    3. Re-executed once more: the run is completed, its result stands, nothing is rewritten."""
    steps = ["trainer.steps=500", "trainer.checkpoint_every=0", *[
        s for s in STEADY if not s.startswith("trainer.checkpoint_every")]]
    sweep = start(tmp_path, "-m", "hydra/launcher=submitit_local", *steps)
    run_dir = wait_for(lambda: next(tmp_path.glob("outputs/multirun/*/*/0"), None), sweep,
                       "the job's run directory")
    wait_for(lambda: rows(run_dir / "metrics.csv") > 40, sweep, "the job's rows")
    first_pid = summary_of(run_dir)["pid"]
    os.kill(first_pid, signal.SIGUSR2)

    def log() -> str:
        return (run_dir / "train.log").read_text()

    wait_for(lambda: "resuming at step" in log(), sweep, "the requeued job's resume")
    stopped = int(log().split("interrupted: final loss")[1].split(" steps in")[0].split()[-1])
    assert 40 < stopped < 500
    assert "the run was interrupted; resuming it from its checkpoint" in log()
    assert f"resuming at step {stopped}:" in log()
    wait_for(lambda: rows(run_dir / "metrics.csv") > stopped + 40, sweep, "rows past the resume")
    second_pid = summary_of(run_dir)["pid"]
    assert second_pid != first_pid  # the requeued job's own process
    os.kill(second_pid, signal.SIGKILL)
    sweep.communicate(timeout=120)
    assert sweep.returncode != 0  # the launcher saw its job die
    assert summary_of(run_dir)["status"] == "running"

    (job_folder,) = [d.parent for d in (run_dir.parent / ".submitit").glob("*/*_submitted.pkl")]

    def re_execute() -> None:  # what a requeue runs: the job submitit pickled
        requeued = subprocess.run(
            [sys.executable, "-u", "-m", "submitit.core._submit", str(job_folder.parent / "%j")],
            cwd=tmp_path, capture_output=True, text=True, timeout=600,
            env={**env(), "SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": job_folder.name,
                 "SUBMITIT_LOCAL_NTASKS": "1", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
                 "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_GLOBALID": "0",
                 "SUBMITIT_LOCAL_LOCALID": "0"})
        assert requeued.returncode == 0, requeued.stderr

    re_execute()
    assert "the run was killed; resuming it from its checkpoint" in log()
    assert log().count(f"resuming at step {stopped}:") == 2 and "resuming at step 0" not in log()
    done = summary_of(run_dir)
    assert done["status"] == "completed" and done["steps"] == 500
    table = pd.read_csv(run_dir / "metrics.csv")
    assert list(table["step"]) == list(range(1, 501))  # the rows past the checkpoint, redone
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert len(provenance["resumes"]) == 2

    written = mtimes(run_dir / "metrics.csv", run_dir / "summary.json", run_dir / "checkpoints")
    re_execute()
    assert "the run is completed already; its result stands" in log()
    assert mtimes(run_dir / "metrics.csv", run_dir / "summary.json",
                  run_dir / "checkpoints") == written


def test_slurm_requeues_on_pre_emption_and_time_out_by_default():
    """conf/hydra/launcher/slurm.yaml as submitit turns it into sbatch lines."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from submitit.slurm.slurm import _make_sbatch_string

    import gradexp.config  # noqa: F401  (puts the schemas in Hydra's ConfigStore)

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    launcher = cfg.hydra.launcher
    assert launcher.max_num_timeout >= 1  # time-outs requeue (pre-emptions always do)
    sbatch = _make_sbatch_string(command="true", folder="/tmp/%j", job_name="gradexp",
                                 signal_delay_s=launcher.signal_delay_s,
                                 additional_parameters=dict(launcher.additional_parameters))
    assert "#SBATCH --requeue" in sbatch.splitlines()
    assert f"#SBATCH --signal=USR2@{launcher.signal_delay_s}" in sbatch.splitlines()


def refusal(monkeypatch, capsys, *args: str) -> tuple[int, list[str]]:
    """`python -m gradexp.train *args` run in this process, in the current directory: its exit
    status and the lines it wrote to stderr."""
    from conftest import exit_of

    return exit_of(monkeypatch, *args), capsys.readouterr().err.strip().splitlines()


def test_resume_refuses_bad_input_in_one_line(tmp_path, monkeypatch, capsys):
    """A directory that is neither a run nor a sweep; a run's override given another value."""
    monkeypatch.chdir(tmp_path)
    neither = tmp_path / "neither"
    neither.mkdir()
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- clip=0.1\n- seed=3\n")
    (run / "summary.json").write_text('{"status": "interrupted"}')
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "checkpoint").write_text("")
    for args, message in (
            ([f"resume={neither}"], f"resume={neither}: neither a run directory"),
            ([f"resume={run}", "clip=0.1", "seed=4"],
             f"resume={run}: seed=4 differs from the run's own seed=3"),
            ([f"resume={run}", "model.width=8"],
             f"resume={run}: the run goes on with its own config; drop model.width=8")):
        status, lines = refusal(monkeypatch, capsys, *args)
        assert status == 2 and len(lines) == 1, lines
        assert lines[0].startswith(f"error: {message}"), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["neither", "run"]


def test_every_resume_refusal_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """The refusals docs/guide/resume.md lists, each as the user meets it (one line on stderr, exit
    2, nothing started): resume= of a finished run, of a run without a checkpoint, of a run whose
    process is alive here; a job started in a directory holding another config's run or a live run;
    resume= of a sweep another sweeper made, of one whose runs are not in <sweep>/<job number>/, of
    one with a run still going, of one whose run directory another job made."""
    import socket

    alive = {"host": socket.gethostname(), "pid": os.getpid()}  # this (python) process

    def run_dir(name, summary, checkpoint=True):
        run = tmp_path / name
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text("- clip=0.1\n")
        (run / "summary.json").write_text(json.dumps(summary))
        if checkpoint:
            (run / "checkpoints").mkdir()
            (run / "checkpoints" / "checkpoint").write_text("")
        return run

    def sweep_dir(name, **how):
        return sweep_record(tmp_path / name, **how)

    completed = run_dir("completed", {"status": "completed"})
    no_checkpoint = run_dir("no_checkpoint", {"status": "interrupted"}, checkpoint=False)
    going = run_dir("going", {"status": "running", **alive})
    optuna = sweep_dir("optuna", sweeper="optuna")
    renamed = sweep_dir("renamed", subdir="${hydra.job.override_dirname}")
    busy_sweep = run_still_going(sweep_dir("busy_sweep"))
    foreign = run_of_another_job(sweep_dir("foreign"))
    pid = os.getpid()
    cases = [
        ([f"resume={completed}"],
         f"resume={completed}: the run is completed; only an interrupted or killed run"),
        ([f"resume={no_checkpoint}"],
         f"resume={no_checkpoint}: no checkpoint in {no_checkpoint / 'checkpoints'}"),
        ([f"resume={going}"], f"resume={going}: the run is still going (pid {pid}); stop it"),
        ([f"resume={optuna}"], f"resume={optuna}: a sweep of hydra/sweeper=optuna; only basic"),
        ([f"resume={renamed}"], f"resume={renamed}: its runs are not in <sweep>/<job number>/"),
        ([f"resume={busy_sweep}"], f"resume={busy_sweep}: run 0 is still going (pid {pid})"),
        ([f"resume={foreign}"],
         f"resume={foreign}: run 1 was made by other overrides than the sweep's job 1 "
         "(seed=1 clip=0.1)"),
    ]
    before = mtimes(tmp_path)
    monkeypatch.chdir(tmp_path)
    for args, message in cases:
        status, lines = refusal(monkeypatch, capsys, *args)
        assert status == 2 and len(lines) == 1, (args, lines)
        assert lines[0].startswith(f"error: {message}"), lines[0]
    assert mtimes(tmp_path) == before  # not a file written or touched


def test_a_sweeps_resume_is_found_and_refused_in_this_process(tmp_path):
    """`resume=<sweep>` read here (so that mutation testing sees it): a sweep whose directory
    name holds "=" (as Hydra's override_dirname makes) is found whole; the whole line of each
    refusal of a sweep that cannot be resumed (the subprocess test sees only its start)."""
    import pytest

    from gradexp.runs.rundir import NotResumable
    from gradexp.sweeps import resume

    named = sweep_record(tmp_path / "lr=0.1,seed=0")
    assert resume.sweep_to_resume(["clip=0.1", f"resume={named}"]) == named
    for multirun in ("-m", "--multirun"):  # either spelling: the flag, not a setting
        assert resume.multirun_arguments(named, [f"resume={named}", multirun, "seed=0,1"]) == [
            "--multirun", "seed=0,1", "clip=0.1", f"hydra.sweep.dir={named.resolve()}",
            "hydra/sweeper=gradexp_resume"]
    # a sweep resumed before: its record names the resuming sweeper and the directory, which
    # the command line gives again (once), and keeps its own hydra settings
    again = sweep_record(tmp_path / "again", sweeper="gradexp_resume", hydra=(
        f"hydra.sweep.dir={tmp_path / 'again'}", "hydra/sweeper=gradexp_resume",
        "hydra/launcher=gradexp"))
    assert resume.multirun_arguments(again, [f"resume={again}"]) == [
        "--multirun", "hydra/launcher=gradexp", "seed=0,1", "clip=0.1",
        f"hydra.sweep.dir={again.resolve()}", "hydra/sweeper=gradexp_resume"]
    optuna = sweep_record(tmp_path / "optuna", sweeper="optuna")
    renamed = sweep_record(tmp_path / "renamed", subdir="${hydra.job.override_dirname}")
    foreign = run_of_another_job(sweep_record(tmp_path / "foreign"))
    busy = run_still_going(sweep_record(tmp_path / "busy"))
    pid = os.getpid()
    for sweep, message in (
            (optuna, "a sweep of hydra/sweeper=optuna; only basic sweeps (a job list fixed by "
                     "their overrides) can be resumed"),
            (renamed, "its runs are not in <sweep>/<job number>/ (hydra.sweep.subdir was "
                      "changed)"),
            (foreign, "run 1 was made by other overrides than the sweep's job 1 (seed=1 "
                      "clip=0.1)"),
            (busy, f"run 0 is still going (pid {pid}); stop it first (kill -TERM {pid}) or let "
                   "it finish")):
        with pytest.raises(NotResumable) as refused:
            resume.multirun_arguments(sweep, [f"resume={sweep}"])
        assert str(refused.value) == f"resume={sweep}: {message}"


def test_a_job_refuses_a_run_of_another_config_or_a_live_run_in_its_directory(make_cfg, tmp_path):
    """What a job re-executed into its run directory (a Slurm requeue) does with a run there
    that is not its own: refused in one line, the directory left as it was. (From the command
    line, hydra.run.dir= of a taken directory gets <dir>_1: only a requeue meets this.)"""
    import socket

    import pytest
    from omegaconf import OmegaConf

    from gradexp.runs.rundir import NotResumable
    from gradexp.train import rundir_action

    cfg = make_cfg("clip=0.1")
    own = json.loads(json.dumps(OmegaConf.to_container(cfg)))
    for status, config, message in (
            ("completed", {**own, "clip": 0.5}, "holds a completed run of another config; give "
                                                "this run its own directory"),
            ("interrupted", {**own, "seed": 1}, "holds an interrupted run of another config"),
            ("running", own, f"its run is still going (pid {os.getpid()})")):
        (tmp_path / "summary.json").write_text(json.dumps({
            "status": status, "config": config, "host": socket.gethostname(),
            "pid": os.getpid()}))
        (tmp_path / "checkpoints").mkdir(exist_ok=True)
        (tmp_path / "checkpoints" / "checkpoint").write_text("")
        before = mtimes(tmp_path)
        with pytest.raises(NotResumable, match=f"^{tmp_path}: " + message.replace("(", r"\(")
                           .replace(")", r"\)")):
            rundir_action(tmp_path, cfg)
        assert mtimes(tmp_path) == before
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "config": own}))
    assert rundir_action(tmp_path, cfg) == "keep"  # its own run: the result stands


def test_a_sweep_made_through_the_entry_point_in_this_process_is_planned_run_by_run(
        tmp_path, monkeypatch):
    """The entry point run here, not in a subprocess (so that mutation testing sees the trainer
    and the resume plan): a real two-run sweep, then `resume=<sweep>`'s plan of it and the
    command line that finishes it, as each run's directory stands: finished (kept), gone
    (started), interrupted with a checkpoint (resumed); and its refusals, in one line."""
    import pytest
    from omegaconf import OmegaConf

    from gradexp.runs.rundir import NotResumable
    from gradexp.sweeps import resume

    overrides = ["seed=0,1", "trainer.jit_compile=false", "trainer.steps=20",
                 "trainer.log_every=10", "trainer.eval_every=20", "trainer.histogram_every=0",
                 "model.width=8"]
    monkeypatch.chdir(tmp_path)
    in_this_process(monkeypatch, "-m", *overrides, "hydra.sweep.dir=sweep")  # all finish
    sweep = tmp_path / "sweep"
    assert [summary_of(sweep / n)["status"] for n in ("0", "1")] == ["completed"] * 2
    record = OmegaConf.load(sweep / "multirun.yaml")
    jobs = [[f"seed={s}", *(o.replace("=false", "=False") for o in overrides[1:])]
            for s in (0, 1)]  # as Hydra's sweeper writes each job's overrides
    assert resume.plan(sweep, record) == [(0, jobs[0], "keep"), (1, jobs[1], "keep")]
    assert resume.sweep_to_resume(["resume=sweep"]) == Path("sweep")
    assert resume.sweep_to_resume(["resume=sweep/0"]) is None  # a run, not a sweep
    assert resume.multirun_arguments(Path("sweep"), ["resume=sweep", "-m", *overrides]) == [
        "--multirun", "hydra.mode=MULTIRUN", *overrides, f"hydra.sweep.dir={sweep}",
        "hydra/sweeper=gradexp_resume"]
    with pytest.raises(NotResumable, match=r"^resume=sweep: the sweep goes on with its own "
                                           r"config; drop clip=0.1$"):
        resume.multirun_arguments(Path("sweep"), ["resume=sweep", "clip=0.1"])
    with pytest.raises(NotResumable, match=r"^resume=sweep: seed=2 differs from the sweep's "
                                           r"own seed=0,1"):
        resume.multirun_arguments(Path("sweep"), ["resume=sweep", "seed=2"])
    summary = summary_of(sweep / "0")  # run 0 as SIGTERM leaves it, run 1 never started
    (sweep / "0" / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    for entry in (sweep / "1").iterdir():
        if entry.is_file():
            entry.unlink()
    assert [action for *_, action in resume.plan(sweep, record)] == ["resume", "start"]
