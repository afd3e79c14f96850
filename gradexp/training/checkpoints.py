"""A run's state in variables, and on disk: the model's variables, the optimizer's (with its loss
scale under mixed_float16) and the carry (the clipping method's and the spike detector's state,
gradexp/training/step.py, saved under the key `clipping`), numbered by the step it was taken after.
Nothing else needs saving: the training order is a function of (seed, step) (gradexp/parts/data.py).
"""

from __future__ import annotations

from pathlib import Path

from gradexp._tf import tf
from gradexp.runs.rundir import CHECKPOINTS
from gradexp.runs.write_errors import writing


class RunState:
    """A run's carry variables (made from `step`'s initial carry, under `strategy`) and the
    checkpoints of its whole state in <run>/checkpoints, the last `keep` of them kept."""

    def __init__(self, run_dir: Path, step, strategy, keep: int = 1):
        with strategy.scope():  # every replica computes the same carry: the first's is kept
            self.carry = [tf.Variable(value, trainable=False, name=name,
                                      aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                          for name, value in zip(step.carry_names, step.initial_carry(),
                                                 strict=True)]
        self.checkpoint = tf.train.Checkpoint(model=step.model, optimizer=step.optimizer,
                                              clipping=list(self.carry))
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, str(run_dir / CHECKPOINTS), max_to_keep=keep, checkpoint_name="step")

    def save(self, step: int) -> None:
        if self.saved_step() != step:
            with writing("the checkpoint", self.manager.directory, step):  # a full disk: a line
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
        return step
