"""A run's state on disk, and stopping cleanly when asked.

A checkpoint holds the model, the optimizer (with its loss scale under mixed_float16) and the
parameter-clipping state, numbered by the step it was taken after. Nothing else needs saving:
the training order is a function of (seed, step) (gradexp/data.py), and the step's randomness
is seeded from the config. `resume=<run dir>` restores the latest checkpoint and carries on.

SIGINT and SIGTERM during training set a flag that the loop reads between compiled calls
(every `trainer.log_every` steps at most): it flushes the logs, saves a checkpoint and marks the
run interrupted. A second SIGINT stops at once. SIGUSR2, a scheduler's notice (submitit's
requeue on pre-emption or time-out), does the same before its own handler runs.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

from gradexp._tf import tf
from gradexp.rundir import CHECKPOINTS


class RunState:
    """The checkpoint of a run's model, optimizer and clipping state, in <run>/checkpoints."""

    def __init__(self, run_dir: Path, model, optimizer, clipping_state: list):
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                              clipping=list(clipping_state))
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, str(run_dir / CHECKPOINTS), max_to_keep=1, checkpoint_name="step")

    def save(self, step: int) -> None:
        if self.saved_step() != step:
            self.manager.save(checkpoint_number=step)

    def saved_step(self) -> int | None:
        latest = self.manager.latest_checkpoint
        return None if latest is None else int(latest.rsplit("-", 1)[1])

    def restore(self) -> int:
        """Load the latest checkpoint; return its step (0 when there is none)."""
        step = self.saved_step()
        if step is None:
            return 0
        status = self.checkpoint.restore(self.manager.latest_checkpoint)
        status.assert_existing_objects_matched()
        del status
        return step


class StopRequests:
    """Which signal asked the run to stop (None while none has)."""

    signal: int | None = None


@contextlib.contextmanager
def stop_requests():
    """Within the block, SIGINT and SIGTERM ask the run to stop at the next safe point. So does
    SIGUSR2 when a Python handler owns it: a job scheduler's warning that the job is about to be
    stopped (submitit's handler requeues the job and exits at once). Its handler is put back
    when the block ends, for the caller to call once the run is checkpointed and recorded."""
    requests = StopRequests()

    def ask(signum, frame):
        if requests.signal == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: stop now
        requests.signal = signum

    watched = [signal.SIGINT, signal.SIGTERM]
    usr2 = getattr(signal, "SIGUSR2", None)
    if usr2 is not None and callable(signal.getsignal(usr2)):
        watched.append(usr2)
    try:
        previous = {s: signal.signal(s, ask) for s in watched}
    except ValueError:  # not the main thread: leave signals to whoever owns them
        previous = {}
    try:
        yield requests
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
