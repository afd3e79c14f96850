"""gradexp's measurements inside `model.fit`: the Keras callback `Telemetry`.

A fit with `Telemetry(run_dir)` writes the run directory a gradexp run writes (gradexp.runs.rundir),
by gradexp's own writers, so that `python -m gradexp.summarize DIR` reads fit runs and gradexp
runs alike, in one table:

    metrics.csv, events   a row per step, gradexp's columns and tags (logs.RunLog): loss/train,
                          grad_norm/global and /post, param_clip/threshold and /clipped,
                          learning_rate, and per clip layer at position p grad_norm/p/pre and
                          /post and clip_fraction/p (measured as gradexp/training/fit_step.py says);
                          loss/val and accuracy/val at each epoch's last step, from Keras's
                          val_loss and val_accuracy (validation_data); the HParams, the final
                          figures
    summary.json          tracking.run_summary's: completed, or diverged at the first step
                          measures.divergence_step finds (fit stops there: a result, not a
                          crash), final_loss over the last 10% of the steps before it
    provenance.json       gradexp.runs.provenance's record, with the devices in use
    .hydra/               config.yaml and overrides.yaml: the run's settings, read off the
                          model (gradexp/training/fit_config.py), for summarize to group runs by

How the statistics reach the callback (gradexp/training/fit_step.py): for one fit the model's
train_step is wrapped; while it is traced, Keras's own tape watches every clip layer's probe
(`gradient_stats`) and, asked for the gradients of model.trainable_weights, gives the probes'
too: gradexp's own mechanism, so a layer applied at many time steps (a Keras RNN cell, inside
its while loop) is summed as in gradexp. The step writes its row into a variable the callback
reads after each batch. Chosen over layers that write a variable in their backward pass (TF
refuses a variable written inside a while loop's gradient) and over a train_step of gradexp's
own (it would replace a user's, and copy Keras's private parts). Works with jit_compile on or
off and run_eagerly, for Keras's train_step or a user's that takes that gradient. A clip
layer's position is its name without a leading `clip_` (models.position): name the one after
dense_1 `clip_dense_1` and its columns say dense_1, as gradexp's (unnamed, Keras calls them
clip_gradient, clip_gradient_1: positions gradient, gradient_1).

Not measured in fit: the per-layer telemetry (param_grad_norm/<layer>, update_norm, ...), the
gradient histograms, checkpoints (a fit run is not resumable). One fit is one run: a run_dir
that holds a run already is refused. A fit that raises leaves its summary.json `running`,
as a killed run (Keras tells a callback nothing of an exception), and the model's train_step
wrapped until the next fit with Telemetry takes the wrapper off.

A model without ClipGradient layers is measured all the same, globally (loss, ‖g‖, learning
rate): a baseline without clip layers, which a warning line names as such.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from gradexp._tf import keras
from gradexp.config import ConfigError
from gradexp.runs import provenance, rundir
from gradexp.training import devices, fit_config
from gradexp.training.fit_step import MeasuredStep
from gradexp.training.logs import RunLog, release
from gradexp.training.tracking import (
    LoopResult,
    final_line,
    final_metrics,
    first_diverged_step,
    run_summary,
)

log = logging.getLogger("gradexp")
# metrics.csv's validation columns, from the first of Keras's epoch logs that is there
VALIDATION = {"loss/val": ("val_loss",),
              "accuracy/val": ("val_accuracy", "val_sparse_categorical_accuracy",
                               "val_categorical_accuracy", "val_acc")}


class Telemetry(keras.callbacks.Callback):
    """Write gradexp's run directory for one `model.fit` (the module docstring).

        from gradexp.keras import Telemetry
        from gradexp.parts.layers import ClipGradient

        x = keras.layers.Dense(64, activation="relu", name="dense_1")(inputs)
        x = ClipGradient(-0.1, 0.1, name="clip_dense_1")(x)   # logged as dense_1
        model = keras.Model(inputs, keras.layers.Dense(10, name="head")(x))
        model.compile(keras.optimizers.SGD(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x_train, y_train, epochs=3, callbacks=[Telemetry("runs/clip0.1", seed=0)])
        # then: python -m gradexp.summarize runs

    run_dir      the run's directory (made if need be; one that holds a run is refused)
    seed         recorded as the run's seed (summarize pairs runs by it); None: not said
    settings     more settings to record, {dotted key: value}, e.g. {"dataset.name": "mnist"}
    log_every    steps between writes of metrics.csv (and an epoch's end)
    divergence_factor   diverged: a loss above factor × the first loss, or a loss or ‖g‖ not
                 finite (measures.divergence_step); fit stops at that step
    """

    def __init__(self, run_dir: str | Path, *, seed: int | None = None,
                 settings: dict[str, Any] | None = None, log_every: int = 50,
                 divergence_factor: float = 1000.0):
        super().__init__()
        if not (isinstance(log_every, int) and log_every >= 1):
            raise ConfigError(f"Telemetry: log_every={log_every}: must be a whole number >= 1")
        if not divergence_factor > 1:
            raise ConfigError(f"Telemetry: divergence_factor={divergence_factor}: must be > 1")
        self.run_dir, self.seed, self.settings = Path(run_dir), seed, dict(settings or {})
        self.log_every, self.divergence_factor = log_every, float(divergence_factor)
        self.measured: MeasuredStep | None = None

    # ------------------------------------------------------------------------- fit's calls
    def on_train_begin(self, logs=None):
        if (self.run_dir / rundir.SUMMARY).exists():
            status, _ = rundir.read_status(self.run_dir)
            raise ConfigError(f"Telemetry: {self.run_dir} holds a {status} run already; give "
                              "this run its own directory")
        model = self.model
        clip = fit_config.clipping(model.optimizer)
        measured = MeasuredStep(model, clip)  # refuses what it cannot measure, before writing
        steps = self.params.get("steps")
        config, self.overrides = fit_config.record(
            model, clip, steps and steps * self.params.get("epochs", 1), self.seed,
            self.divergence_factor, self.settings)
        if not measured.layers:
            log.warning("Telemetry: %s has no ClipGradient layer; logging the loss and the "
                        "global gradient norm only", model.name)
        self.cfg, self.names = OmegaConf.create(config), list(measured.names)
        self.started = time.perf_counter()
        self.where = start_run(self.run_dir, config, self.overrides)
        self.runlog = RunLog(self.run_dir, self.names, self.cfg)
        self.step, self.losses, self.pending, self.val = 0, [], [], None
        self.diverged_step, self.timed_from = None, None
        self.measured = measured
        measured.install()

    def on_train_batch_end(self, batch, logs=None):
        row = self.measured.row.numpy()
        self.step += 1
        if self.timed_from is None:  # steps/s from the first step's end (it traces, compiles)
            self.timed_from = (time.perf_counter(), self.step)
        self.losses.append(row[self.names.index("loss/train")])
        self.pending.append((self.step, row))
        if self.diverged_step is None:
            self.diverged_step = first_diverged_step(
                np.array([self.step]), row[None], self.names, self.losses[0],
                self.divergence_factor)
            if self.diverged_step is not None:
                self.model.stop_training = True
        if len(self.pending) > self.log_every:  # the last row waits for its epoch's val
            self.write(self.pending[:-1], None)
            self.pending = self.pending[-1:]

    def on_epoch_end(self, epoch, logs=None):
        val = validation(logs or {})
        self.val = val or self.val
        self.write(self.pending, val)
        self.pending = []

    def on_train_end(self, logs=None):
        if self.measured is None:
            return
        self.measured.remove()
        self.measured = None
        self.write(self.pending, None)
        self.pending = []
        timed = ((self.step - self.timed_from[1], time.perf_counter() - self.timed_from[0])
                 if self.timed_from else (0, 0.0))
        result = LoopResult(self.step, self.losses, None, self.val, self.diverged_step, None,
                            timed)
        summary = run_summary(result, self.cfg, self.overrides, self.where,
                              time.perf_counter() - self.started)
        self.runlog.close(self.step, final_metrics(summary))
        rundir.write_json(self.run_dir / rundir.SUMMARY, summary)
        log.info(final_line(summary, self.run_dir))

    # ----------------------------------------------------------------------------- helpers
    def write(self, rows: list, val: dict | None) -> None:
        """Hand steps (step, row) to the run's writer, `val` at the last."""
        if rows:
            steps, values = zip(*rows, strict=True)
            self.runlog.steps(np.array(steps), np.stack(values), val)
            release()


def start_run(run_dir: Path, config: dict, overrides: list[str]) -> str:
    """Everything a run writes before its first step: .hydra/'s config and overrides (as Hydra
    writes a gradexp run's), summary.json `running`, provenance.json with the devices in use.
    Returns the devices' description."""
    (run_dir / rundir.HYDRA).mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(config), run_dir / rundir.CONFIG)
    OmegaConf.save(OmegaConf.create(overrides), run_dir / rundir.OVERRIDES)
    rundir.mark_running(run_dir, overrides, config)
    record = provenance.record(run_dir)
    where = devices.in_use()
    provenance.add_devices(run_dir, record, devices.describe(where, "none", None))
    return where


def validation(epoch_logs: dict) -> dict[str, float] | None:
    """loss/val and accuracy/val (NaN without an accuracy) of Keras's epoch logs; None without
    validation data."""
    found = {column: next((float(epoch_logs[k]) for k in keys if k in epoch_logs), np.nan)
             for column, keys in VALIDATION.items()}
    return None if np.isnan(found["loss/val"]) else found
