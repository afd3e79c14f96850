"""One run's account of its training, call by call (gradexp/train.py's loop keeps one per run):
what a call's rows say (losses, divergence, skips), when to evaluate, write histograms and
checkpoint, the progress line, and the run's summary.json at its end. NumPy only: the work on
the run's state is done by the functions a Tracker is given."""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from gradexp.config import TrainerConfig
from gradexp.runs import rundir
from gradexp.runs.measures import divergence_step, final_loss, succeeded, success_step


@dataclass(frozen=True)
class LoopResult:
    """Where the loop ended; `losses`: every training loss so far (a resumed run's earlier ones
    too); `timed`: (steps, seconds) after the first call (which traces and compiles)."""

    step: int
    losses: list
    error_rates: list | None  # per step, NaN but at evaluations; None: not measured
    val: dict[str, float] | None
    diverged_step: int | None
    stopped_by: int | None
    timed: tuple[int, float]
    spike_skipped: int | None = None  # steps not applied (trainer.on_spike=skip); None: off


class Tracker:
    """`record` after each compiled call, through the functions it is given: `evaluate()` ->
    {name: value}, `gradients()` -> {name: array} (the call's last step's), `save(step)`."""

    def __init__(self, t: TrainerConfig, names, val_names, runlog, step: int, evaluate, gradients,
                 save, logger: logging.Logger):
        self.t, self.names, self.runlog, self.step = t, list(names), runlog, step
        self.evaluate, self.gradients, self.save, self.log = evaluate, gradients, save, logger
        self.losses = runlog.past_values("loss/train")
        self.spike_skipped = (int(np.nansum(runlog.past_values("spike_skipped")))
                              if "spike_skipped" in self.names else None)
        self.error_rates = (runlog.past_values("error_rate/val") if "error_rate/val" in val_names
                            else None)
        self.val, self.diverged_step = None, None
        # steps/s: from the end of the first call (which traces and compiles) to the end of the
        # loop, so that it counts the logging, evaluation and checkpoints of those steps
        self.timed_from, self.first_step = None, step

    def going(self) -> bool:
        """Whether the run has steps to do: not at its end, not stopped by a divergence."""
        return self.step < self.t.steps and (self.diverged_step is None
                                             or self.t.on_divergence == "continue")

    def record(self, rows: np.ndarray, seconds: float, measured: bool) -> None:
        """A call's rows (`measured`: its last row holds the telemetry and its gradients are
        the ones `gradients()` gives)."""
        t, names = self.t, self.names
        if self.timed_from is None:
            self.timed_from, self.first_step = time.perf_counter(), self.step + len(rows)
        steps = self.step + 1 + np.arange(len(rows))
        self.step += len(rows)
        self.losses.extend(rows[:, names.index("loss/train")])
        if self.spike_skipped is not None:
            self.spike_skipped += int(rows[:, names.index("spike_skipped")].sum())
        if self.diverged_step is None:
            self.diverged_step = first_diverged_step(steps, rows, names, self.losses[0],
                                                     t.divergence_factor)
        step, val = self.step, None
        if step % t.eval_every == 0 or step == t.steps:
            val = {k: float(v) for k, v in self.evaluate().items()}
        self.val = val
        if self.error_rates is not None:
            self.error_rates.extend([np.nan] * len(rows))
            self.error_rates[-1] = val["error_rate/val"] if val else np.nan
        self.runlog.steps(steps, rows, val, measured)
        if t.histogram_every and step % t.histogram_every == 0 and measured:
            self.runlog.histograms(step, self.gradients())
        if t.checkpoint_every and step % t.checkpoint_every == 0:
            self.save(step)
        self.log.info("  ".join(progress(step, t.steps, rows, names, val, len(rows) / seconds)))

    def result(self, stopped_by: int | None) -> LoopResult:
        timed = ((self.step - self.first_step, time.perf_counter() - self.timed_from)
                 if self.timed_from else (0, 0.0))
        return LoopResult(self.step, self.losses, self.error_rates, self.val, self.diverged_step,
                          stopped_by, timed, self.spike_skipped)


def steps_to_next_event(step: int, t: TrainerConfig) -> int:
    """Steps until the next log, evaluation, histogram, checkpoint or the end (one call)."""
    every = [t.log_every, t.eval_every, t.histogram_every, t.checkpoint_every]
    return min([e - step % e for e in every if e] + [t.steps - step])


def first_diverged_step(steps, rows, names, first_loss, factor) -> int | None:
    """measures.divergence_step of these rows (the run's own rule and the summary's)."""
    column = {name: rows[:, i] for i, name in enumerate(names)}
    step = divergence_step(steps, column["loss/train"], column["grad_norm/global"],
                           column.get("skipped", np.zeros(len(rows))), factor, first_loss)
    return None if np.isnan(step) else int(step)


def progress(step, steps, rows, names, val, rate=None) -> list[str]:
    """A progress line's parts: step, mean loss of the last steps, validation accuracy
    (regression: loss) and error rate, clip fraction, speed (steps/s, if `rate`)."""
    parts = [f"step {step:>{len(str(steps))}}/{steps}",
             f"loss {np.mean(rows[:, names.index('loss/train')]):.4f}"]
    if val and np.isfinite(val["accuracy/val"]):
        parts.append(f"val_acc {val['accuracy/val']:.3f}")
    elif val:
        parts.append(f"val_loss {val['loss/val']:.4f}")
    if val and "error_rate/val" in val:
        parts.append(f"val_errors {100 * val['error_rate/val']:.1f}%")
    fractions = [i for i, n in enumerate(names) if n.startswith("clip_fraction/")]
    if fractions:
        parts.append(f"clipped {100 * np.mean(rows[:, fractions]):.1f}%")
    return parts + ([f"{rate:.0f} steps/s"] if rate is not None else [])


def run_summary(r: LoopResult, cfg: DictConfig, overrides, where: str, wall: float) -> dict:
    """summary.json of a run that ended (completed, diverged or interrupted). Its final loss is
    the summary's definition: the last 10% of the steps before the divergence, if any."""
    measured = r.losses if r.diverged_step is None else r.losses[:r.diverged_step - 1]
    status = (rundir.INTERRUPTED if r.stopped_by is not None else
              rundir.DIVERGED if r.diverged_step is not None else rundir.COMPLETED)
    summary = {"status": status, "diverged": r.diverged_step is not None,
               "diverged_step": r.diverged_step, "steps": r.step,
               "final_loss": final_loss(measured) if measured else None,
               "val_loss": r.val["loss/val"] if r.val else None,
               "val_accuracy": r.val["accuracy/val"] if r.val else None,
               "wall_time_s": wall,
               "steps_per_s": r.timed[0] / r.timed[1] if r.timed[0] else None,
               "device": where, "config": OmegaConf.to_container(cfg),
               "overrides": list(overrides)}
    if r.error_rates is not None:  # Pascanu et al.'s criterion: see gradexp.runs.measures
        below = cfg.dataset.success_below
        summary["success"] = succeeded(r.error_rates, below, r.diverged_step is not None)
        found = success_step(np.arange(1, len(r.error_rates) + 1), r.error_rates, below)
        summary["success_step"] = None if np.isnan(found) else int(found)
    if r.spike_skipped is not None:
        summary["spike_skipped_steps"] = r.spike_skipped
    if r.stopped_by is not None:
        summary["stopped_by"] = signal.Signals(r.stopped_by).name
    return summary


def final_metrics(s: dict) -> dict:
    """The figures of summary.json `s` that the event file gets as `final/<name>` (RunLog.close,
    TensorBoard's HParams view): logs.FINAL_METRICS."""
    return {"loss": s["final_loss"], "val_loss": s["val_loss"], "val_accuracy": s["val_accuracy"]}


def final_line(s: dict, run_dir: Path) -> str:
    """The run's last log line: how it ended, final loss, val accuracy (or loss), test accuracy
    (or loss) if measured, time."""
    accuracy, val_loss = s["val_accuracy"], s["val_loss"]
    ended = (f"diverged at step {s['diverged_step']}" if s["status"] == rundir.DIVERGED
             else s["status"])
    loss = "n/a" if s["final_loss"] is None else f"{s['final_loss']:.4f}"
    val = (f"val accuracy {accuracy:.4f}" if accuracy is not None and np.isfinite(accuracy)
           else "val loss n/a" if val_loss is None else f"val loss {val_loss:.4f}")
    if rundir.TEST_LOSS in s:  # trainer.test: the test split, read once at the end
        test_accuracy, test_loss = s[rundir.TEST_ACCURACY], s[rundir.TEST_LOSS]
        val += (f", test accuracy {test_accuracy:.4f}"
                if test_accuracy is not None and np.isfinite(test_accuracy) else
                ", test loss n/a" if test_loss is None else f", test loss {test_loss:.4f}")
    took = f"{s['steps']} steps in {s['wall_time_s']:.1f} s"
    return f"{ended}: final loss {loss}, {val}, {took} -> {run_dir}"
