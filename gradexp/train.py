"""Train one model with clip layers inserted: `python -m gradexp.train [key=value ...]`.

`-m` makes a sweep (`python -m gradexp.train -m clip=null,0.1 seed=0,1,2`); `--help` lists the
config groups and keys.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import numpy as np
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from gradexp import config
from gradexp.runs import provenance, rundir, runlock, write_errors
from gradexp.runs.rundir import write_json
from gradexp.sweeps.grouping import Job
from gradexp.training import checkpoint_fallback
from gradexp.training.stopping import exit_status, stop_requests
from gradexp.training.tracking import (
    LoopResult,
    Tracker,
    final_line,
    final_metrics,
    progress,
    run_summary,
    steps_to_next_event,
)

CONF_DIR = str(Path(__file__).resolve().parent / "conf")  # a link to conf/; in a wheel, its copy
log = logging.getLogger("gradexp")
LIST_POSITIONS: list = []  # `--positions`: the model's positions are printed, nothing trains


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> dict:
    """Hydra's task: one run in Hydra's output directory. A crash is recorded in the run's
    summary.json; a sweep then goes on to its next run, a single run exits non-zero. The run's
    lock (gradexp/runs/runlock.py) is taken before anything in its directory is read, and held."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        runlock.hold(run_dir)
    except runlock.RunBusy as exc:  # another process writes this run: it is left alone
        if HydraConfig.get().mode == RunMode.MULTIRUN:  # and the sweep goes on
            log.error("run not started: %s", exc)
            return {"status": rundir.BUSY, "error": str(exc)}
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        return run_held(cfg, run_dir)
    finally:
        runlock.release(run_dir)


def run_held(cfg: DictConfig, run_dir: Path) -> dict:
    """`run`, its lock held."""
    hydra_cfg = HydraConfig.get()
    overrides, resume = list(hydra_cfg.overrides.task), bool(cfg.resume)
    if resume:  # the run goes on with its own config, composed as it was
        overrides = list(OmegaConf.load(run_dir / rundir.OVERRIDES))
        cfg = compose(config_name="config", overrides=overrides)
    else:  # a requeued or resumed sweep job may find its run here
        action = rundir_action(run_dir, cfg)
        if action == rundir.KEEP:
            return rundir.read_status(run_dir)[1]
        resume = action == rundir.RESUME
    if LIST_POSITIONS:
        from gradexp.parts.insertion import position_lines

        try:
            lines = position_lines(cfg)
        except config.ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        wanted = cfg.layer.positions
        wanted = wanted if isinstance(wanted, str) else f"[{','.join(wanted)}]"
        print(f"positions of model={cfg.model.name} (*: where layer.positions={wanted} "
              "puts a clip layer):", *(f"  {line}" for line in lines), sep="\n")
        return {}
    job = Job(cfg, run_dir, overrides)
    try:
        summary = train_runs([job], resume=resume)[0]
    except Exception as exc:
        if hydra_cfg.mode == RunMode.MULTIRUN:
            return failed(exc, job)
        message = record_failure(exc, job)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        unwritten = write_errors.explain(exc, job.run_dir)
        raise SystemExit(write_errors.EXIT_STATUS if unwritten else 2) from None
    if summary["status"] == rundir.INTERRUPTED:  # asked to stop: so does a sweep, after this run
        stopped_by = signal.Signals[summary["stopped_by"]]
        scheduler = signal.getsignal(stopped_by)
        if stopped_by not in (signal.SIGINT, signal.SIGTERM) and callable(scheduler):
            scheduler(stopped_by, None)  # submitit's SIGUSR2: requeue this job, then exit
        raise SystemExit(exit_status(stopped_by))
    return summary


def record_failure(exc: Exception, job: Job) -> str | None:
    """Record a run's crash in its summary.json; return the one-line explanation of bad input
    found late (e.g. a dataset file missing) or of a write that failed (a full disk), None for
    a bug."""
    message = config.explain(exc) or write_errors.explain(exc, job.run_dir)
    try:
        write_json(job.run_dir / rundir.SUMMARY, {
            "status": rundir.FAILED, "error": f"{type(exc).__name__}: {exc}",
            "config": OmegaConf.to_container(job.cfg), "overrides": list(job.overrides)})
    except OSError as unwritten:  # the full disk that failed the run takes no summary either
        if message is None or write_errors.reason(unwritten) is None:
            raise
        message += f" ({rundir.SUMMARY} not written: {write_errors.reason(unwritten)})"
    return message


def failed(exc: Exception, job: Job) -> dict:
    """A sweep's run that crashed: recorded, said in one line, and the sweep goes on."""
    message = record_failure(exc, job)
    log.error("run failed: %s (%s)", message or repr(exc), job.run_dir)
    return {"status": rundir.FAILED}


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
    `resume=<sweep dir>` becomes that sweep's multirun, finishing it (gradexp/sweeps/resume.py)."""
    from gradexp.sweeps import resume, worker

    user_wants_traceback = bool(os.environ.get("HYDRA_FULL_ERROR"))
    logging.raiseExceptions = False  # a log file on a full disk: our one line, not a traceback
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra's errors reach us unprinted
    try:
        config.check_overrides(sys.argv[1:])
        sweep_dir = resume.sweep_to_resume(sys.argv[1:])
        if sweep_dir is not None:
            sys.argv[1:] = resume.multirun_arguments(sweep_dir, sys.argv[1:])
        LIST_POSITIONS.clear()  # this call's flag, not an earlier call's in the same process
        if "--positions" in sys.argv:  # list them; a throwaway directory for Hydra's files
            sys.argv.remove("--positions")
            LIST_POSITIONS.append(True)
            sys.argv += [f"hydra.run.dir={tempfile.mkdtemp(prefix='gradexp-positions-')}",
                         "hydra.output_subdir=null", "hydra/job_logging=none"]
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
    return the run's summary."""
    try:
        return train_runs([Job(cfg, Path(run_dir), list(overrides))], resume=resume)[0]
    finally:
        runlock.release(run_dir)


def train_runs(jobs: list[Job], resume: bool = False,
               loggers: list[logging.Logger] | None = None) -> list[dict]:
    """Train `jobs`, runs of one structure (gradexp/sweeps/grouping.py) starting at the same step,
    as one (K = 1 a run alone, K > 1 a batch); return their summaries. A batch's program compiles
    in a thread while its other runs are set up. `loggers`: each run's (default: `log`)."""
    from gradexp.training.engine import Engine

    loggers = loggers or [log] * len(jobs)
    runs = [start(jobs[0], resume, logger=loggers[0])]
    engine = Engine(runs[0], len(jobs))
    ready = engine.compile_ahead() if len(jobs) > 1 else None
    runs += [start(job, arrays=runs[0].arrays, free_memory=False, logger=logger)
             for job, logger in zip(jobs[1:], loggers[1:], strict=True)]
    engine.load(runs)
    results = loop(engine, runs, ready)
    tested = evaluate_test_split(engine, runs, results)
    batch = {"runs": len(runs), "first": str(runs[0].run_dir)} if len(runs) > 1 else None
    return [finish(run, result, batch and {**batch, "index": k}, tested[k])
            for k, (run, result) in enumerate(zip(runs, results, strict=True))]


def evaluate_test_split(engine, runs: list[Run], results: list[LoopResult]) -> list[dict]:
    """trainer.test: the final weights of each run that reached its end (or diverged)
    evaluated once on the test split, the batch's in one call, as summary.json's figures
    (rundir.TEST_LOSS, TEST_ACCURACY); {} for the others (an interrupted run's waits for its
    end). The loop never sees the test split: it is read here, after it."""
    ended = [result.stopped_by is None for result in results]
    if not runs[0].cfg.trainer.test or not any(ended):
        return [{} for _ in runs]
    from gradexp.parts import data

    measured = {name: value.numpy() for name, value in
                engine.evaluate(*data.sealed_test_set(runs[0].arrays)).items()}
    figures = [{rundir.TEST_LOSS: measured["loss/val"][k],
                rundir.TEST_ACCURACY: measured["accuracy/val"][k]} if ended[k] else {}
               for k in range(len(runs))]
    for run, result, f in zip(runs, results, figures, strict=True):
        if f:
            run.logger.info("after step %d, the test split (%d examples, read once): loss "
                            "%.4f, accuracy %.4f", result.step, len(run.arrays.x_test),
                            f[rundir.TEST_LOSS], f[rundir.TEST_ACCURACY])
    return figures


def train_batch(jobs: list[Job]) -> list[dict]:
    """hydra/launcher=gradexp's task, in its worker process: runs of one structure trained as
    one batch, each logging to its own file as a job would. A run alone that crashes is recorded
    and the sweep goes on; a batch that crashes raises (the launcher then trains them singly)."""
    loggers = [run_logger(job) for job in jobs]
    try:
        return train_runs(jobs, loggers=loggers)
    except Exception as exc:
        if len(jobs) > 1:
            raise
        return [failed(exc, jobs[0])]
    finally:
        for logger in loggers:  # a sweep of many batches keeps no file open
            for handler in logger.handlers:
                handler.close()
            logger.handlers.clear()
        for job in jobs:
            runlock.release(job.run_dir)


def run_logger(job: Job) -> logging.Logger:
    """A logger writing to the run's own log file only, as its job's Hydra logging would (the
    console gets the batch's lines)."""
    logger = logging.getLogger(f"gradexp.run.{job.run_dir}")
    logger.handlers.clear()
    handler = logging.FileHandler(job.run_dir / job.log_name)
    handler.setFormatter(logging.Formatter(job.log_format))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def loop(engine, runs: list[Run], ready=None) -> list[LoopResult]:
    """Train the runs to `trainer.steps` in calls of up to `trainer.log_every` steps, then each
    run's bookkeeping (gradexp/training/tracking.py); a run stops at its divergence
    (on_divergence=stop), all at SIGINT/SIGTERM after the call under way. `ready`: a batch's
    programs compiled ahead."""
    from gradexp._tf import tf
    from gradexp.training import logs

    # the trainer's settings as a plain dataclass (a DictConfig is slow to read): read every call
    t, K = OmegaConf.to_object(runs[0].cfg.trainer), len(runs)
    done: dict = {}  # what one call's bookkeeping does for all runs at once, done once

    def for_all(what: str, do):
        if what not in done:
            done[what] = do()
        return done[what]

    def evaluate(k):  # the runs' one validation set
        measured = for_all("evaluate", lambda: {name: value.numpy() for name, value in
                                               engine.evaluate(*runs[0].validation).items()})
        return {name: values[k] for name, values in measured.items()}

    def gradients(k):
        grads = for_all("gradients", lambda: [np.asarray(g) for g in done["grads"]])
        return {f"gradients/{v.path}": g[k] if K > 1 else g
                for v, g in zip(engine.params, grads, strict=True)}

    def save(k, step):
        for_all("sync", lambda: engine.sync(*(j for j, tr in enumerate(trackers)
                                              if tr.going() or j == k)))
        logs.flush()  # the table holds every step the checkpoint has
        runs[k].state.save(step)

    trackers = [Tracker(t, engine.names, run.step.val_names, run.runlog, run.first,
                        evaluate=lambda k=k: evaluate(k), gradients=lambda k=k: gradients(k),
                        save=lambda step, k=k: save(k, step), logger=run.logger)
                for k, run in enumerate(runs)]
    for run in runs:
        run.logger.info("%s %s on %s (%d steps, %s%s) -> %s", f"resuming at step {run.first}:"
                        if run.first else "training", run.cfg.model.name, run.cfg.dataset.name,
                        t.steps, run.where, f", one of a batch of {K}" if K > 1 else "",
                        run.run_dir)
    if K > 1:
        log.info("training %d runs as one batch: %s on %s (%d steps, %s, %d parts at once) -> "
                 "%s ...", K, runs[0].cfg.model.name, runs[0].cfg.dataset.name, t.steps,
                 runs[0].where, len(engine.parts), runs[0].run_dir)
        ready.result()
        for tracker in trackers:  # steps run from here
            tracker.log.info("step %*d/%d  the batch's step is compiled and ready",
                             len(str(t.steps)), tracker.step, t.steps)
    engine.evaluate.get_concrete_function(*runs[0].validation)  # traced before steps/s counts
    with stop_requests() as stop:
        while stop.signal is None and any(tr.going() for tr in trackers):
            going = [tr.going() for tr in trackers]
            step = {tr.step for tr, g in zip(trackers, going, strict=True) if g}.pop()
            n = steps_to_next_event(step, t)
            tick = time.perf_counter()
            logs.release()  # the last call's writes, while this one runs
            rows, steps, grads = engine.train_steps(tf.constant(step, tf.int64), tf.constant(n),
                                                   tf.constant(going))
            rows, steps, seconds = rows.numpy(), steps.numpy(), time.perf_counter() - tick
            done.clear()
            done["grads"] = grads
            for k, tracker in enumerate(trackers):
                if going[k]:
                    tracker.record(rows[:steps[k], k], seconds, measured=steps[k] == n)
            if K > 1:
                ran = np.concatenate([rows[:steps[k], k] for k in range(K) if going[k]])
                log.info("  ".join([*progress(step + max(steps), t.steps, ran, engine.names, None),
                                    f"{sum(tr.going() for tr in trackers)} of {K} runs going",
                                    f"{max(steps) / seconds:.0f} steps/s per run"]))
    engine.sync(*range(K))
    logs.flush()
    return [tracker.result(stop.signal) for tracker in trackers]


@dataclass
class Run:
    """One run set up to train: its config and directory, its step (gradexp/training/step.py), its
    state and checkpoints, data and logs, and the step it starts from."""

    cfg: DictConfig
    run_dir: Path
    overrides: list
    started: float
    where: str
    strategy: object  # a tf.distribute strategy
    step: object  # gradexp.training.step.Step
    state: object  # gradexp.training.checkpoints.RunState
    arrays: object  # gradexp.parts.data.Arrays
    validation: tuple  # (x_val, y_val) tensors
    first: int  # the step it starts from (a resumed run's checkpoint)
    runlog: object  # gradexp.training.logs.RunLog
    logger: logging.Logger
    resumed: dict = field(default_factory=dict)  # a resumed run's checkpoint_fallback record


def start(job: Job, resume: bool = False, arrays=None, free_memory: bool = True,
          logger: logging.Logger = log) -> Run:
    """A run set up to train: provenance, process, data (`arrays` when already loaded), step,
    state (restored when resuming), logs. `free_memory`: collect the garbage of earlier runs in
    this process first (not between the runs of a batch)."""
    from gradexp.parts import data
    from gradexp.training import devices
    from gradexp.training.checkpoints import RunState
    from gradexp.training.logs import RunLog
    from gradexp.training.step import make_step

    cfg, run_dir = job.cfg, job.run_dir
    runlock.hold(run_dir)  # already held by `run`; a batch's runs take theirs here
    resumed = None
    if resume:  # the newest sound checkpoint; none: fail, or start over if the config says so
        resumed = checkpoint_fallback.settle(run_dir, cfg.trainer.on_damaged_checkpoint, logger)
        resume = resumed.step > 0
    started = time.perf_counter()
    rundir.mark_running(run_dir, job.overrides, OmegaConf.to_container(cfg))
    # the code and package versions first: even a run that fails at once keeps them
    record = job.provenance or provenance.record(run_dir, resume=resume)
    where = devices.prepare_process(cfg.device, cfg.precision, cfg.seed, cfg.deterministic,
                                    free_memory)
    strategy = devices.strategy(cfg.strategy)
    provenance.add_devices(run_dir, record, devices.describe(where, cfg.strategy, strategy))
    arrays = data.load(cfg.dataset) if arrays is None else arrays
    if cfg.trainer.test and arrays.x_test is None:  # dataset=arrays: only loading tells
        source = cfg.dataset.get("load") and f"dataset.load={cfg.dataset.load} returned"
        raise config.ConfigError(f"trainer.test=true: {source or 'the dataset has'} no test "
                                 f"split; {config.TEST_SPLITS}")
    step = make_step(cfg, arrays, strategy)
    state = RunState(run_dir, step, strategy, cfg.trainer.keep_checkpoints)
    first = state.restore() if resume else 0
    runlog = RunLog(run_dir, list(step.names), cfg, start_step=first, val_names=step.val_names,
                    telemetry=step.telemetry)
    return Run(cfg, run_dir, list(job.overrides), started, where, strategy, step, state, arrays,
               data.validation_set(arrays), first, runlog, logger,
               resumed.record() if resumed else {})


def finish(run: Run, result: LoopResult, batch: dict | None = None,
           tested: dict | None = None) -> dict:
    """Checkpoint the run where it ended, write its summary and final metrics; return it.
    `batch`: {"runs": K, "first": its first run, "index": k} for run k of a batch; `tested`:
    its figures on the test split (`evaluate_test_split`)."""
    run.state.save(result.step)
    summary = run_summary(result, run.cfg, run.overrides, run.where,
                          time.perf_counter() - run.started)
    summary.update(tested or {})
    summary["data"] = run.arrays.record()
    summary.update(run.resumed)
    if batch is not None:
        summary["batch"] = batch
    run.runlog.close(result.step, final_metrics(summary))
    write_json(run.run_dir / rundir.SUMMARY, summary)
    run.logger.info(final_line(summary, run.run_dir))
    if result.stopped_by is not None:
        run.logger.info("resume with: python -m gradexp.train resume=%s", run.run_dir)
    if batch is not None:
        log.info(final_line(summary, run.run_dir))
    return summary


if __name__ == "__main__":
    # Run the task as gradexp.train, not __main__: launchers that pickle it (joblib, submitit)
    # then send a reference, not the function's code, and AutoGraph can still read the source.
    from gradexp import train as _module

    _module.main()
