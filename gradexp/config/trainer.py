"""The `trainer` node (conf/config.yaml): how long and how a run trains, logs, evaluates and
checkpoints, and what it does when the loss diverges."""

from __future__ import annotations

from dataclasses import dataclass

from gradexp.config.base import at_least, need, one_of

LOSS_REDUCTIONS = ("sum", "mean")
ON_DIVERGENCE = ("stop", "continue")
ON_SPIKE = ("none", "skip")
ON_DAMAGED_CHECKPOINT = ("fail", "restart")  # gradexp/training/checkpoint_fallback.py


@dataclass
class TrainerConfig:
    steps: int = 1000  # optimizer steps in all, a resumed run's earlier ones included
    batch_size: int = 64  # examples per step (strategy=mirrored: split over the devices)
    log_every: int = 50  # fetch measurements, write table and TensorBoard, print progress
    eval_every: int = 200  # evaluate on the whole validation set (and at the last step)
    histogram_every: int = 200  # gradient histograms in TensorBoard; 0: never
    loss_reduction: str = "sum"  # sum: dy is in per-example units whatever the batch size
    divergence_factor: float = 1000.0  # loss above this × the first loss: diverged
    jit_compile: bool = True  # XLA-compile the step (fuses the clip layers' statistics into it)
    checkpoint_every: int = 500  # 0: only when the run stops
    keep_checkpoints: int = 2  # the newest kept; a resume falls back on the previous if damaged
    on_damaged_checkpoint: str = "fail"  # every checkpoint damaged: fail (one line) | restart
    on_divergence: str = "stop"  # stop (a result: exit 0) | continue (skipping non-finite updates)
    layer_norms: bool = True  # per-layer gradient, update and weight norms (training/telemetry.py)
    on_spike: str = "none"  # skip: a step whose loss or ‖g‖ spikes is skipped (training/spikes.py)
    spike_z: float = 6.0  # a spike: z-score above this against the running (EMA) statistics
    spike_warmup: int = 50  # steps that set the statistics before any step can be a spike
    spike_alpha: float = 0.99  # the EMA's factor
    # true: after the last step, the final weights are evaluated once on the dataset's test
    # split (summary.json test_loss, test_accuracy); nothing reads it during training. The
    # dataset must have one: mnist1d with val_fraction set, arrays whose load returns a third
    # pair (x_test, y_test), tfds with split_test
    test: bool = False

    def check(self) -> None:
        at_least(self, 1, "steps", "batch_size", "log_every", "eval_every")
        need(self.histogram_every >= 0, "histogram_every", self.histogram_every,
             "must be an integer >= 0 (0: no histograms)")
        one_of("loss_reduction", self.loss_reduction, LOSS_REDUCTIONS)
        need(self.divergence_factor > 1, "divergence_factor", self.divergence_factor,
             "must be a number > 1")
        need(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every,
             "must be an integer >= 0 (0: only when the run stops)")
        at_least(self, 1, "keep_checkpoints")
        one_of("on_damaged_checkpoint", self.on_damaged_checkpoint, ON_DAMAGED_CHECKPOINT)
        one_of("on_divergence", self.on_divergence, ON_DIVERGENCE)
        one_of("on_spike", self.on_spike, ON_SPIKE)
        need(self.spike_z > 0, "spike_z", self.spike_z, "must be a number > 0")
        at_least(self, 1, "spike_warmup")
        need(0 < self.spike_alpha < 1, "spike_alpha", self.spike_alpha,
             "must be a number in (0, 1)")
