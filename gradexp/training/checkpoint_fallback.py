"""A checkpoint to fall back on: a resumed run verifies its newest checkpoint before using it.

The run keeps its last `trainer.keep_checkpoints` checkpoints (tf.train.CheckpointManager, which
commits each one atomically: gradexp/training/checkpoints.py). A checkpoint's data can still be
damaged after it was committed (a full disk, a crashed network filesystem): verifying one reads
every tensor in it, which checks its size and each tensor's CRC32C. On resume, newest first:

    sound                   the run resumes from it
    damaged                 one line in the run's log; its files move to checkpoints/damaged/
                            and the manager's record drops it; the previous one is tried
    every one damaged       DamagedCheckpoints (one line) or, with
                            trainer.on_damaged_checkpoint=restart, the run starts over from step 0

summary.json records which step the run resumed from (`resumed_from`) and the checkpoints it
skipped (`checkpoints_skipped`, each with its step and error).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from gradexp.runs import rundir
from gradexp.runs.rundir import CHECKPOINTS, NotResumable

DAMAGED = "damaged"  # <run>/checkpoints/damaged/: the files of the checkpoints skipped
STATE = "checkpoint"  # the manager's record of its checkpoints, in <run>/checkpoints/
PREFIX = re.compile(r"step-(\d+)")  # gradexp/training/checkpoints.py names them step-<n>
RESTART = "restart"


class DamagedCheckpoints(NotResumable):
    """Every checkpoint of a run is damaged; the message is the one line."""


@dataclass
class Resumption:
    """Where a resumed run starts: the step of the checkpoint it uses (0: none, it starts
    over) and the checkpoints it skipped, newest first."""

    step: int
    skipped: list[dict] = field(default_factory=list)  # {"step": n, "error": "..."}

    def record(self) -> dict:
        """Its part of the run's summary.json."""
        return {"resumed_from": self.step, "checkpoints_skipped": self.skipped}


def verify(prefix: str) -> str | None:
    """None if the checkpoint at `prefix` reads back whole; else why not, in one line."""
    from gradexp._tf import tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as exc:  # what a damaged file raises varies with the damage (IndexError,
        text = str(exc).strip().splitlines()  # DataLossError, OpError, ...)
        return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return None


def settle(run_dir: Path, on_damaged: str, logger: logging.Logger) -> Resumption:
    """Choose the checkpoint a resumed run starts from (see the module's docstring). A damaged
    one is moved aside and dropped from the manager's record, so that the manager's latest
    checkpoint is the one chosen. Raises DamagedCheckpoints if none is sound and `on_damaged`
    is not "restart"; with it, the run's directory is cleared (rundir.clear_run)."""
    directory = Path(run_dir) / CHECKPOINTS
    skipped, chosen = [], 0
    for step in steps_on_disk(directory)[::-1]:
        error = verify(str(directory / f"step-{step}"))
        if error is None:
            chosen = step
            break
        skipped.append({"step": step, "error": error})
        _move_aside(directory, step)
    what = "; ".join(f"step-{s['step']} ({s['error']})" for s in skipped)
    if chosen and skipped:
        _record(directory, chosen)
        logger.warning("damaged checkpoints skipped: %s, their files moved to %s; resuming "
                       "from step-%d", what, directory / DAMAGED, chosen)
    if chosen:
        return Resumption(chosen, skipped)
    what = f"every checkpoint is damaged: {what}" if skipped else f"no checkpoint in {directory}"
    if on_damaged != RESTART:
        raise DamagedCheckpoints(
            f"{run_dir}: {what}; nothing to resume from: start the run again without resume= "
            "(with trainer.on_damaged_checkpoint=restart a run starts over by itself)")
    logger.warning("%s: %s; trainer.on_damaged_checkpoint=restart: the run starts over from "
                   "step 0", run_dir, what)
    rundir.clear_run(run_dir)
    return Resumption(0, skipped)


def steps_on_disk(directory: Path) -> list[int]:
    """The steps of the checkpoints in `directory`, in order."""
    return sorted(int(m.group(1)) for path in directory.glob("step-*.index")
                  if (m := PREFIX.fullmatch(path.stem)))


def _move_aside(directory: Path, step: int) -> None:
    aside = directory / DAMAGED
    aside.mkdir(exist_ok=True)
    for path in directory.glob(f"step-{step}.*"):
        shutil.move(str(path), str(aside / path.name))


def _record(directory: Path, step: int) -> None:
    """The manager's record (its `checkpoint` file) naming step-<step> as the latest, with the
    checkpoints still kept before it and their times, written atomically, paths relative to
    the directory, as the manager writes it."""
    from google.protobuf import text_format

    from gradexp._tf import tf

    try:
        state = tf.train.get_checkpoint_state(str(directory))
    except Exception:  # a damaged record: the checkpoints on disk are the record
        state = None
    paths = list(state.all_model_checkpoint_paths) if state else []
    times = list(state.all_model_checkpoint_timestamps) if state else []
    times = dict(zip(map(_step_of, paths), times, strict=False)) if len(times) == len(paths) else {}
    kept = [s for s in steps_on_disk(directory) if s <= step]
    proto = tf.compat.v1.train.generate_checkpoint_state_proto(
        str(directory.resolve()), f"step-{step}", [f"step-{s}" for s in kept],
        all_model_checkpoint_timestamps=[
            times.get(s, os.path.getmtime(directory / f"step-{s}.index")) for s in kept],
        last_preserved_timestamp=state.last_preserved_timestamp if state else None)
    tmp = directory / f"{STATE}.tmp"
    tmp.write_text(text_format.MessageToString(proto))
    os.replace(tmp, directory / STATE)


def _step_of(path: str) -> int | None:
    m = PREFIX.fullmatch(Path(path).name)
    return int(m.group(1)) if m else None
