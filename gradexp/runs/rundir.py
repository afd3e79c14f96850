"""The run directory: the one contract between the training side and the analysis side.

Every name a run writes or reads is spelled here, and nowhere else:

    <run dir>/
      .hydra/{config,hydra,overrides}.yaml   Hydra's record of the job (resumes add resumed-*/)
      summary.json                           status and final figures, written atomically
                                             (with trainer.test: TEST_FIGURES, of the test split)
      metrics.csv                            one row per step
      events.out.tfevents.*                  TensorBoard
      checkpoints/                           the latest training state (resume)
      provenance.json                        code version, packages, devices
                                             (gradexp.runs.provenance)
      provenance.diff                        `git diff HEAD` when the code's tree was dirty
      provenance.resume-<n>.diff             the same, for the n-th resume
      .lock                                  held by the process that writes the run
                                             (gradexp.runs.runlock): one writer per run

A run's status is one of STATUSES; `running` until it ends (a killed run stays `running`, and
`still_running` tells it from a live one). Whether a run may be resumed is decided here too, and
what a job that finds a run in its directory does with it (`restart_action`).

A sweep directory holds `multirun.yaml` (Hydra's record of the sweep) and a directory per job,
named by the job's number.
NumPy and the standard library only: both sides import this module.
"""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np

SUMMARY = "summary.json"
METRICS = "metrics.csv"
CHECKPOINTS = "checkpoints"
HYDRA = ".hydra"
OVERRIDES = f"{HYDRA}/overrides.yaml"
CONFIG = f"{HYDRA}/config.yaml"
EVENTS_GLOB = "events.out.tfevents.*"
PROVENANCE = "provenance.json"
PROVENANCE_DIFF = "provenance.diff"
SWEEP_RECORD = "multirun.yaml"  # at a sweep's root
LOCK = ".lock"  # gradexp.runs.runlock's

# summary.json's figures of the test split (trainer.test): the final weights evaluated once,
# after the last step, on examples nothing read during training; absent without a test
TEST_LOSS, TEST_ACCURACY = "test_loss", "test_accuracy"
TEST_FIGURES = (TEST_LOSS, TEST_ACCURACY)

RUNNING, COMPLETED, DIVERGED, INTERRUPTED, FAILED = (
    "running", "completed", "diverged", "interrupted", "failed")
STATUSES = (RUNNING, COMPLETED, DIVERGED, INTERRUPTED, FAILED)
FINISHED = (COMPLETED, DIVERGED)  # a run that reached its end: its figures are final
RESUMABLE = (INTERRUPTED, RUNNING)  # asked to stop, or killed

# what a job does with the run it finds in its directory (`restart_action`)
START, KEEP, RESUME, RESTART, BUSY = "start", "keep", "resume", "restart", "busy"


def resume_diff(n: int) -> str:
    """The diff file of the run's n-th resume (1, 2, ...) from a dirty tree."""
    return f"provenance.resume-{n}.diff"


class NotResumable(ValueError):
    """resume=<dir> cannot go on; the message is the one line the user sees."""


def job_order(name: str) -> tuple:
    """Sort key of a job directory's name: numbered jobs by number (2 before 10), then the
    others by name."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (a crash leaves the old file or the new one, never half of one)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(data), indent=2) + "\n")
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def mark_running(run_dir: Path, overrides: list[str], config: dict[str, Any]) -> None:
    """summary.json of a run that starts: `running`, by this process on this host (see
    `still_running`), with its overrides and config (a plain dict)."""
    write_json(Path(run_dir) / SUMMARY, {
        "status": RUNNING, "overrides": list(overrides), "host": socket.gethostname(),
        "pid": os.getpid(), "config": config})


def same_config(record: dict[str, Any], config: dict[str, Any]) -> bool:
    """Whether a summary.json `record` is of a run of `config` (a plain dict), compared as
    summary.json stores it. A record without its config (an older run) is taken as the same."""
    if "config" not in record:
        return True
    return record["config"] == json.loads(json.dumps(_jsonable(config)))


def read_status(run_dir: Path) -> tuple[str, dict[str, Any]]:
    """(status, summary.json as a dict); ("unknown", {}) when it is missing or unreadable."""
    try:
        record = json.loads((Path(run_dir) / SUMMARY).read_text())
        return str(record["status"]), record
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown", {}


def is_sweep_dir(path: Path | str) -> bool:
    """A sweep's root: Hydra's multirun.yaml, and not itself a run."""
    path = Path(path)
    return (path / SWEEP_RECORD).is_file() and not (path / OVERRIDES).is_file()


def restart_action(run_dir: Path | str) -> str:
    """What a job started in `run_dir` does with what it finds there:

    START    nothing of a run (no summary.json): train from step 0
    KEEP     a finished run (completed or diverged): its result stands, no training
    RESUME   an interrupted or killed run with a checkpoint: go on from it
    RESTART  a failed run, a stopped one without a checkpoint, an unreadable summary.json:
             clear the directory (`clear_run`) and train from step 0
    BUSY     a run whose process is still alive on this host: leave it alone
    """
    run_dir = Path(run_dir)
    if not (run_dir / SUMMARY).exists():
        return START
    status, record = read_status(run_dir)
    if status in FINISHED:
        return KEEP
    if status == RUNNING and still_running(record):
        return BUSY
    if status in RESUMABLE and (run_dir / CHECKPOINTS / "checkpoint").is_file():
        return RESUME
    return RESTART


def clear_run(run_dir: Path) -> None:
    """Remove what a run wrote (table, events, checkpoints, summary, provenance), keeping
    Hydra's record of the job (.hydra/) and its log, which Hydra holds open: a run started
    again here has nothing stale mixed in."""
    import shutil

    for entry in Path(run_dir).iterdir():
        if entry.name in (HYDRA, LOCK) or entry.suffix == ".log":  # LOCK: held by the caller
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def check_resumable(run_dir: Path | str, other_overrides: list[str],
                    own_overrides: list[str] = ()) -> None:
    """resume=<dir> needs a run that stopped before its end, with a checkpoint, and no other
    settings: the run goes on with its own config (`own_overrides`, its .hydra/overrides.yaml;
    repeating one of them as it was is not another setting, and the caller drops those).
    Raises NotResumable (one line)."""
    run_dir = Path(run_dir)
    if not (run_dir / OVERRIDES).is_file():
        raise NotResumable(f"resume={run_dir}: neither a run directory ({OVERRIDES}) nor a "
                           f"sweep directory ({SWEEP_RECORD})")
    status, record = read_status(run_dir)
    if status not in RESUMABLE:
        raise NotResumable(f"resume={run_dir}: the run is {status}; only an interrupted or "
                           "killed run can be resumed")
    if status == RUNNING and still_running(record):
        raise NotResumable(f"resume={run_dir}: the run is still going (pid {record['pid']}); "
                           f"stop it first (kill -TERM {record['pid']}) or let it finish")
    if not (run_dir / CHECKPOINTS / "checkpoint").is_file():
        raise NotResumable(f"resume={run_dir}: no checkpoint in {run_dir / CHECKPOINTS}")
    if other_overrides:
        raise NotResumable(f"resume={run_dir}: " + refusal(other_overrides, own_overrides))


def override_key(override: str) -> str:
    """`clip` of `clip=0.1`, `+clip=0.1`, `~clip`; `hydra/launcher` of `hydra/launcher=ray`."""
    return override.split("=", 1)[0].lstrip("+~")


def refusal(other_overrides: list[str], own_overrides: list[str], what: str = "run") -> str:
    """Why settings given with resume= are refused: the first one that changes a value the run
    (or sweep) was started with names it; otherwise they are new settings."""
    own = {override_key(o): o for o in own_overrides}
    for other in other_overrides:
        if override_key(other) in own:
            return (f"{other} differs from the {what}'s own {own[override_key(other)]}; a "
                    f"resumed {what} keeps its config (repeat its overrides as they were, or "
                    "drop them)")
    return f"the {what} goes on with its own config; drop {' '.join(other_overrides)}"


def still_running(record: dict[str, Any]) -> bool:
    """Whether the process a "running" summary.json names is alive on this host (a killed
    run's is not: two processes must never write one run directory). Elsewhere: unknown, no."""
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a dead run's pid taken by another program since; the executable, not the command
        return "python" in os.readlink(f"/proc/{pid}/exe")  # line (Ray workers rewrite theirs)
    except OSError:
        return True
