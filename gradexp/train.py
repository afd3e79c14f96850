"""Train one model with clip layers inserted: `python -m gradexp.train [key=value ...]`.

`-m` makes a sweep (`python -m gradexp.train -m clip=null,0.1 seed=0,1,2`); `--help` lists the
config groups and keys. The file reads top to bottom: the entry point, `train` (a recipe:
provenance, process, data, the compiled step of gradexp/step.py, state, loop, summary), the
loop, then its small helpers.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path

import hydra
import numpy as np
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from gradexp import config, provenance, rundir
from gradexp.measures import divergence_step, final_loss, succeeded, success_step
from gradexp.rundir import write_json

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
log = logging.getLogger("gradexp")


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> dict:
    """Hydra's task: one run in Hydra's output directory. A crash is recorded in the run's
    summary.json; a sweep then goes on to its next run, a single run exits non-zero."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    overrides, resume = list(hydra_cfg.overrides.task), bool(cfg.resume)
    if resume:  # the run goes on with its own config, composed as it was
        overrides = list(OmegaConf.load(run_dir / rundir.OVERRIDES))
        cfg = compose(config_name="config", overrides=overrides)
    else:  # a requeued or resumed sweep job may find its run here
        action = rundir_action(run_dir, cfg)
        if action == rundir.KEEP:
            return rundir.read_status(run_dir)[1]
        resume = action == rundir.RESUME
    try:
        summary = train(cfg, run_dir, overrides, resume=resume)
    except Exception as exc:
        message = record_failure(exc, cfg, run_dir, overrides)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            log.error("run failed: %s (%s)", message or repr(exc), run_dir)
            return {"status": rundir.FAILED}
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    if summary["status"] == rundir.INTERRUPTED:  # asked to stop: so does a sweep, after this run
        stopped_by = signal.Signals[summary["stopped_by"]]
        scheduler = signal.getsignal(stopped_by)
        if stopped_by not in (signal.SIGINT, signal.SIGTERM) and callable(scheduler):
            scheduler(stopped_by, None)  # submitit's SIGUSR2: requeue this job, then exit
        raise SystemExit(128 + stopped_by)
    return summary


def record_failure(exc: Exception, cfg: DictConfig, run_dir: Path, overrides) -> str | None:
    """Record a run's crash in its summary.json; return the one-line explanation of bad input
    found late (e.g. a dataset file missing), None for a bug."""
    write_json(run_dir / rundir.SUMMARY, {
        "status": rundir.FAILED, "error": f"{type(exc).__name__}: {exc}",
        "config": OmegaConf.to_container(cfg), "overrides": list(overrides)})
    return config.explain(exc)


def rundir_action(run_dir: Path, cfg: DictConfig) -> str:
    """What this job does with the run it finds in its directory (`rundir.restart_action`),
    the directory cleared when it starts over. A run of another config is refused, not
    overwritten."""
    action = rundir.restart_action(run_dir)
    if action == rundir.START:
        return action
    status, record = rundir.read_status(run_dir)
    if action == rundir.BUSY:
        raise rundir.NotResumable(f"{run_dir}: its run is still going (pid {record['pid']})")
    if not rundir.same_config(record, OmegaConf.to_container(cfg)):
        article = "an" if status[0] in "aeiou" else "a"
        raise rundir.NotResumable(f"{run_dir}: holds {article} {status} run of another config; "
                                  "give this run its own directory")
    if action == rundir.KEEP:
        log.info("%s: the run is %s already; its result stands", run_dir, status)
    elif action == rundir.RESUME:
        log.info("%s: the run was %s; resuming it from its checkpoint", run_dir,
                 "interrupted" if status == rundir.INTERRUPTED else "killed")
    else:
        why = {rundir.FAILED: "failed", "unknown": "left no readable summary.json"}.get(
            status, "stopped before a checkpoint")
        log.info("%s: the run %s; starting it again from step 0", run_dir, why)
        rundir.clear_run(run_dir)
    return action


def main() -> None:
    """Entry point: bad input ends in one line on stderr and exit status 2, not a traceback.
    `resume=<sweep dir>` becomes that sweep's multirun, finishing it (gradexp/resume.py)."""
    from gradexp import resume, worker

    user_wants_traceback = bool(os.environ.get("HYDRA_FULL_ERROR"))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra's errors reach us unprinted
    try:
        sweep_dir = resume.sweep_to_resume(sys.argv[1:])
        if sweep_dir is not None:
            sys.argv[1:] = resume.multirun_arguments(sweep_dir, sys.argv[1:])
        worker.start_early(sys.argv[1:])  # the batched sweep's workers, before Hydra starts
        run()
    except Exception as exc:
        message = config.explain(exc)
        if message is None or user_wants_traceback:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def train(cfg: DictConfig, run_dir: Path, overrides: list[str] = (), resume: bool = False) -> dict:
    """Train as `cfg` says, writing into `run_dir` (resume: from its latest checkpoint);
    return the run's summary. A recipe: set the run up, loop, finish."""
    run = start(cfg, run_dir, overrides, resume)
    log.info("%s %s on %s (%d steps, %s) -> %s", f"resuming at step {run.step}:" if run.step
             else "training", cfg.model.name, cfg.dataset.name, cfg.trainer.steps, run.where,
             run_dir)
    return finish(run, loop(run))


@dataclass
class Run:
    """One run set up to train: its config and directory, the compiled step, its checkpoint
    state, data and logs, and the step it starts from."""

    cfg: DictConfig
    run_dir: Path
    overrides: list
    started: float
    where: str
    strategy: object  # a tf.distribute strategy
    compiled: object  # gradexp.step.CompiledStep
    state: object  # gradexp.checkpoints.RunState
    step: int
    batches: object  # (ahead) -> data.training_batches from `step`: made when first read
    validation: tuple  # (x_val, y_val) tensors
    runlog: object  # gradexp.logs.RunLog

    @cached_property
    def train_batches(self):
        return self.batches(ahead=True)

    @cached_property
    def histogram_batches(self):  # the training stream again, read without prefetching
        return self.batches(ahead=False)


def start(cfg: DictConfig, run_dir: Path, overrides: list[str] = (), resume: bool = False,
          arrays=None, free_memory: bool = True, recorded: dict | None = None) -> Run:
    """A run set up to train: provenance, process, data (`arrays` when already loaded),
    compiled step, state restored when resuming, logs. `free_memory`: collect the garbage of
    earlier runs in this process first (not between the runs of a batch). `recorded`: the
    provenance.json written for this start already (by hydra/launcher=gradexp)."""
    from gradexp import data, devices
    from gradexp.checkpoints import RunState
    from gradexp.logs import RunLog
    from gradexp.step import compile_step

    started = time.perf_counter()
    write_json(run_dir / rundir.SUMMARY, {
        "status": rundir.RUNNING, "overrides": list(overrides), "host": socket.gethostname(),
        "pid": os.getpid(), "config": OmegaConf.to_container(cfg)})
    # the code and package versions first: even a run that fails at once keeps them
    record = recorded or provenance.record(run_dir, resume=resume)
    where = devices.prepare_process(cfg.device, cfg.precision, cfg.seed, cfg.deterministic,
                                    free_memory)
    strategy = devices.strategy(cfg.strategy)
    provenance.add_devices(run_dir, record, devices.describe(where, cfg.strategy, strategy))
    arrays = data.load(cfg.dataset) if arrays is None else arrays
    compiled = compile_step(cfg, arrays, strategy)
    state = RunState(run_dir, compiled.model, compiled.optimizer, compiled.state_variables)
    step = state.restore() if resume else 0
    batches = partial(data.training_batches, arrays, cfg.trainer.batch_size, cfg.seed, step)
    runlog = RunLog(run_dir, list(compiled.names), cfg, start_step=step,
                    val_names=compiled.val_names)
    return Run(cfg, run_dir, list(overrides), started, where, strategy, compiled, state, step,
               batches, data.validation_set(arrays), runlog)


def finish(run: Run, result: LoopResult, logger: logging.Logger = log,
           batch: dict | None = None) -> dict:
    """Checkpoint the run where it ended, write its summary and final metrics; return it.
    `batch`: {"runs": K, "index": k} for run k of a batch (gradexp/batched.py)."""
    run.state.save(result.step)
    summary = run_summary(result, run.cfg, run.overrides, run.where,
                          time.perf_counter() - run.started)
    if batch is not None:
        summary["batch"] = batch
    run.runlog.close(result.step, {"loss": summary["final_loss"], "val_loss": summary["val_loss"],
                                   "val_accuracy": summary["val_accuracy"]})
    write_json(run.run_dir / rundir.SUMMARY, summary)
    logger.info(final_line(summary, run.run_dir))
    if result.stopped_by is not None:
        logger.info("resume with: python -m gradexp.train resume=%s", run.run_dir)
    return summary


@dataclass(frozen=True)
class LoopResult:
    """Where the loop ended: the last step done, every training loss so far (a resumed run's
    earlier ones too), the last validation figures, the divergence step, the signal that
    stopped it, and (steps, seconds) timed after the first call (which traces and compiles)."""

    step: int
    losses: list
    error_rates: list | None  # per step, NaN but at evaluations; None: not measured
    val: dict[str, float] | None
    diverged_step: int | None
    stopped_by: int | None
    timed: tuple[int, float]
    spike_skipped: int | None = None  # steps not applied (trainer.on_spike=skip); None: off


class Tracker:
    """One run's account of its training, call by call: after each compiled call `record`
    writes its rows and, when due, evaluates, writes histograms and checkpoints. The functions
    it is given do the work on the run's state: `evaluate()` -> {name: value},
    `gradients()` -> {name: tensor}, `save(step)`."""

    def __init__(self, t: DictConfig, names, val_names, runlog, step: int, evaluate, gradients,
                 save, logger: logging.Logger = log):
        self.t, self.names, self.runlog, self.step = t, list(names), runlog, step
        self.evaluate, self.gradients, self.save, self.log = evaluate, gradients, save, logger
        self.losses = runlog.past_values("loss/train")
        self.measures_errors = "error_rate/val" in val_names
        self.skips = "spike_skipped" in self.names
        self.spike_skipped = (int(np.nansum(runlog.past_values("spike_skipped")))
                              if self.skips else None)
        self.error_rates = runlog.past_values("error_rate/val") if self.measures_errors else None
        self.val, self.diverged_step = None, None
        # steps/s: from the end of the first call (which traces and compiles) to the end of the
        # loop, so that it counts the logging, evaluation and checkpoints of those steps
        self.timed_from, self.first_step = None, step

    def going(self) -> bool:
        """Whether the run has steps to do: not at its end, not stopped by a divergence."""
        return self.step < self.t.steps and (self.diverged_step is None
                                             or self.t.on_divergence == "continue")

    def record(self, rows: np.ndarray, seconds: float) -> None:
        t, names = self.t, self.names
        if self.timed_from is None:
            self.timed_from, self.first_step = time.perf_counter(), self.step + len(rows)
        steps = self.step + 1 + np.arange(len(rows))
        self.step += len(rows)
        self.losses.extend(rows[:, names.index("loss/train")])
        if self.skips:
            self.spike_skipped += int(rows[:, names.index("spike_skipped")].sum())
        if self.diverged_step is None:
            self.diverged_step = first_diverged_step(steps, rows, names, self.losses[0],
                                                     t.divergence_factor)
        step, val = self.step, None
        if step % t.eval_every == 0 or step == t.steps:
            val = {k: float(v) for k, v in self.evaluate().items()}
        self.val = val
        if self.measures_errors:
            self.error_rates.extend([np.nan] * len(rows))
            self.error_rates[-1] = val["error_rate/val"] if val else np.nan
        self.runlog.steps(steps, rows, val)
        if t.histogram_every and step % t.histogram_every == 0:
            self.runlog.histograms(step, self.gradients())
        if t.checkpoint_every and step % t.checkpoint_every == 0:
            self.save(step)
        self.log.info(progress(step, t.steps, rows, names, val, len(rows) / seconds))

    def result(self, stopped_by: int | None) -> LoopResult:
        timed = ((self.step - self.first_step, time.perf_counter() - self.timed_from)
                 if self.timed_from else (0, 0.0))
        return LoopResult(self.step, self.losses, self.error_rates, self.val, self.diverged_step,
                          stopped_by, timed, self.spike_skipped)


class HistogramBatches:
    """`next()`: the next batch of a run's histogram stream (its training stream read again),
    each read as one element of a dataset, not through an iterator kept for the run: deleting a
    stream's iterator (tf.numpy_function batches) took 0.4-1.5 s at a run's end."""

    def __init__(self, batches):
        self.batches, self.taken = batches, 0

    def __next__(self):
        self.taken += 1
        return self.batches.skip(self.taken - 1).take(1).get_single_element()


def loop(run: Run) -> LoopResult:
    """Train from `run.step` to `trainer.steps` in calls of up to `trainer.log_every` steps,
    each followed by the Tracker's bookkeeping. Stops at a divergence (on_divergence=stop) or
    at SIGINT/SIGTERM, after the call under way."""
    from gradexp._tf import tf
    from gradexp.checkpoints import stop_requests

    t, compiled, strategy = run.cfg.trainer, run.compiled, run.strategy
    iterator = iter(strategy.experimental_distribute_dataset(run.train_batches))
    histogram_batches = HistogramBatches(run.histogram_batches)
    compiled.evaluate.get_concrete_function(*run.validation)  # trace now: steps/s = steady
    if t.histogram_every:
        compiled.gradients(*next(iter(run.train_batches)))  # the first call also optimizes
    tracker = Tracker(t, compiled.names, compiled.val_names, run.runlog, run.step,
                      evaluate=lambda: compiled.evaluate(*run.validation),
                      gradients=lambda: compiled.gradients(*next(histogram_batches)),
                      save=run.state.save)
    with stop_requests() as stop:
        while tracker.going() and stop.signal is None:
            n = steps_to_next_event(tracker.step, t)
            tick = time.perf_counter()
            rows = compiled.train_steps(iterator, tf.constant(n)).numpy()
            tracker.record(rows, time.perf_counter() - tick)
    return tracker.result(stop.signal)


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
    if r.error_rates is not None:  # Pascanu et al.'s criterion: see gradexp.measures
        below = cfg.dataset.success_below
        summary["success"] = succeeded(r.error_rates, below, r.diverged_step is not None)
        found = success_step(np.arange(1, len(r.error_rates) + 1), r.error_rates, below)
        summary["success_step"] = None if np.isnan(found) else int(found)
    if r.spike_skipped is not None:
        summary["spike_skipped_steps"] = r.spike_skipped
    if r.stopped_by is not None:
        summary["stopped_by"] = signal.Signals(r.stopped_by).name
    return summary


def final_line(s: dict, run_dir: Path) -> str:
    """The run's last log line: how it ended, final loss, val accuracy (or loss), time."""
    accuracy, val_loss = s["val_accuracy"], s["val_loss"]
    ended = (f"diverged at step {s['diverged_step']}" if s["status"] == rundir.DIVERGED
             else s["status"])
    loss = "n/a" if s["final_loss"] is None else f"{s['final_loss']:.4f}"
    val = (f"val accuracy {accuracy:.4f}" if accuracy is not None and np.isfinite(accuracy)
           else "val loss n/a" if val_loss is None else f"val loss {val_loss:.4f}")
    took = f"{s['steps']} steps in {s['wall_time_s']:.1f} s"
    return f"{ended}: final loss {loss}, {val}, {took} -> {run_dir}"


def steps_to_next_event(step: int, t: DictConfig) -> int:
    """Steps until the next log, evaluation, histogram, checkpoint or the end (one call)."""
    every = [t.log_every, t.eval_every, t.histogram_every, t.checkpoint_every]
    return min([e - step % e for e in every if e] + [t.steps - step])


def first_diverged_step(steps, rows, names, first_loss, factor) -> int | None:
    """measures.divergence_step of these rows (the run's own rule and the summary's)."""
    column = {name: rows[:, i] for i, name in enumerate(names)}
    step = divergence_step(steps, column["loss/train"], column["grad_norm/global"],
                           column.get("skipped", np.zeros(len(rows))), factor, first_loss)
    return None if np.isnan(step) else int(step)


def progress(step, steps, rows, names, val, rate) -> str:
    """One line: step, mean loss of the last steps, validation accuracy (regression: loss) and
    error rate, clip fraction, speed."""
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
    parts.append(f"{rate:.0f} steps/s")
    return "  ".join(parts)


if __name__ == "__main__":
    # Run the task as gradexp.train, not __main__: launchers that pickle it (joblib, submitit)
    # then send a reference, not the function's code, and AutoGraph can still read the source.
    from gradexp import train as _module

    _module.main()
