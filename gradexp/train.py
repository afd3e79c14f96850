"""Train one model with clip layers inserted: `python -m gradexp.train [key=value ...]`.

`-m` makes a sweep (`python -m gradexp.train -m clip=null,0.1 seed=0,1,2`); `--help` lists the
config groups and keys. The file reads top to bottom: the entry point, `train` (data, model,
the compiled step, the loop), then its small helpers.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import hydra
import numpy as np
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from gradexp import config
from gradexp.callbacks import FAILED_RUNS
from gradexp.measures import diverged, divergence_step, final_loss
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
        overrides = list(OmegaConf.load(run_dir / ".hydra" / "overrides.yaml"))
        cfg = compose(config_name="config", overrides=overrides)
    try:
        summary = train(cfg, run_dir, overrides, resume=resume)
    except Exception as exc:
        write_json(run_dir / "summary.json", {
            "status": "failed", "error": f"{type(exc).__name__}: {exc}",
            "config": OmegaConf.to_container(cfg), "overrides": overrides})
        message = config.explain(exc)  # bad input found late, e.g. a dataset file missing
        if hydra_cfg.mode == RunMode.MULTIRUN:
            log.error("run failed: %s (%s)", message or repr(exc), run_dir)
            return {"status": "failed"}
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    if summary["status"] == "interrupted":  # asked to stop: so does a sweep, after this run
        raise SystemExit(128 + signal.Signals[summary["stopped_by"]])
    return summary


def main() -> None:
    """Entry point: bad input ends in one line on stderr and exit status 2, not a traceback."""
    user_wants_traceback = bool(os.environ.get("HYDRA_FULL_ERROR"))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra's errors reach us unprinted
    try:
        run()
    except Exception as exc:
        message = config.explain(exc)
        if message is None or user_wants_traceback:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    if FAILED_RUNS:  # a sweep went on past crashed runs; say so in the exit status
        sys.exit(1)


def train(cfg: DictConfig, run_dir: Path, overrides: list[str] = (), resume: bool = False) -> dict:
    """Train as `cfg` says, writing into `run_dir` (resume: from its latest checkpoint);
    return the run's summary."""
    from gradexp import data, devices
    from gradexp._tf import keras, tf
    from gradexp.checkpoints import RunState, stop_requests
    from gradexp.logs import RunLog

    started = time.perf_counter()
    t = cfg.trainer
    write_json(run_dir / "summary.json", {"status": "running", "overrides": list(overrides),
                                          "host": socket.gethostname(), "pid": os.getpid(),
                                          "config": OmegaConf.to_container(cfg)})
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    where = devices.configure(cfg.device)
    keras.backend.clear_session()
    keras.utils.set_random_seed(cfg.seed)
    devices.precision(cfg.precision)
    strategy = devices.strategy(cfg.strategy)
    arrays = data.load(cfg.dataset)
    c = compile_step(cfg, arrays, strategy)
    names = c.names

    state = RunState(run_dir, c.model, c.optimizer, c.clipper.state_variables)
    step = state.restore() if resume else 0
    train_batches, c.val_batches = data.pipelines(arrays, t.batch_size, cfg.seed, start_step=step)
    iterator = iter(strategy.experimental_distribute_dataset(train_batches))
    histogram_batches = iter(train_batches)  # its own stream: the training order stays as is
    c.evaluate.get_concrete_function()  # trace now: steps/s measures the steady state
    if t.histogram_every:
        c.gradients(*next(iter(train_batches)))  # the first call also optimizes the graph
    runlog = RunLog(run_dir, names, cfg, start_step=step)
    losses = runlog.past_values("loss/train")
    val, diverged_step, stopped_by = None, None, None
    # steps/s: from the end of the first call (which traces and compiles) to the end of the
    # loop, so that it counts the logging, evaluation and checkpoints of those steps
    timed_from, first_step = None, step
    log.info("%s %s on %s (%d steps, %s) -> %s", f"resuming at step {step}:" if step else
             "training", cfg.model.name, cfg.dataset.name, t.steps, where, run_dir)
    with stop_requests() as stop:
        while step < t.steps and stop.signal is None and (
                diverged_step is None or t.on_divergence == "continue"):
            n = steps_to_next_event(step, t)
            tick = time.perf_counter()
            rows = c.train_steps(iterator, tf.constant(n)).numpy()
            seconds = time.perf_counter() - tick
            if timed_from is None:
                timed_from, first_step = time.perf_counter(), step + len(rows)
            steps = step + 1 + np.arange(len(rows))
            step += len(rows)
            losses.extend(rows[:, names.index("loss/train")])
            if diverged_step is None:
                diverged_step = first_diverged_step(steps, rows, names, losses[0],
                                                    t.divergence_factor)
            val = None
            if step % t.eval_every == 0 or step == t.steps:
                val = {k: float(v) for k, v in c.evaluate().items()}
            runlog.steps(steps, rows, val)
            if t.histogram_every and step % t.histogram_every == 0:
                runlog.histograms(step, c.gradients(*next(histogram_batches)))
            if t.checkpoint_every and step % t.checkpoint_every == 0:
                state.save(step)
            log.info(progress(step, t.steps, rows, names, val, len(rows) / seconds))
        stopped_by = stop.signal
    timed = (step - first_step, time.perf_counter() - timed_from) if timed_from else (0, 0.0)
    state.save(step)

    wall = time.perf_counter() - started
    # the summary's definition: the last 10% of the steps before the divergence, if any
    measured = losses if diverged_step is None else losses[:diverged_step - 1]
    final = {"loss": final_loss(measured) if measured else None,
             "val_loss": val["loss/val"] if val else None,
             "val_accuracy": val["accuracy/val"] if val else None}
    runlog.close(step, final)
    status = ("interrupted" if stopped_by is not None else
              "diverged" if diverged_step is not None else "completed")
    summary = {"status": status, "diverged": diverged_step is not None,
               "diverged_step": diverged_step, "steps": step, "final_loss": final["loss"],
               "val_loss": final["val_loss"], "val_accuracy": final["val_accuracy"],
               "wall_time_s": wall,
               "steps_per_s": timed[0] / timed[1] if timed[0] else None,
               "device": where, "config": OmegaConf.to_container(cfg),
               "overrides": list(overrides)}
    if stopped_by is not None:
        summary["stopped_by"] = signal.Signals(stopped_by).name
    write_json(run_dir / "summary.json", summary)
    accuracy, val_loss = final["val_accuracy"], final["val_loss"]
    log.info("%s: final loss %s, %s, %d steps in %.1f s -> %s",
             f"diverged at step {diverged_step}" if status == "diverged" else status,
             "n/a" if final["loss"] is None else f"{final['loss']:.4f}",
             f"val accuracy {accuracy:.4f}" if accuracy is not None and np.isfinite(accuracy)
             else "val loss n/a" if val_loss is None else f"val loss {val_loss:.4f}",
             step, wall, run_dir)
    if stopped_by is not None:
        log.info("resume with: python -m gradexp.train resume=%s", run_dir)
    return summary


def steps_to_next_event(step: int, t: DictConfig) -> int:
    """Steps until the next log, evaluation, histogram, checkpoint or the end (one call)."""
    every = [t.log_every, t.eval_every, t.histogram_every, t.checkpoint_every]
    return min([e - step % e for e in every if e] + [t.steps - step])


def compile_step(cfg: DictConfig, arrays, strategy) -> SimpleNamespace:
    """The model, its optimizer and clipper, and the compiled functions a run calls:
    `train_steps(iterator, n)` (up to n steps, one row of `names` per step), `evaluate()` on
    `val_batches` (a dataset the caller sets), `gradients(x, y)` (for histograms)."""
    from gradexp import clipping, models, optimizers
    from gradexp._tf import keras, tf

    t = cfg.trainer
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        config.check_model_takes(cfg.model, cfg.dataset.name, arrays.input_shape)
        model = models.build(cfg.model, config.clip_spec(cfg), arrays.input_shape,
                             arrays.num_outputs)
        params = model.trainable_variables
        optimizer = optimizers.make_optimizer(cfg.optimizer, cfg.precision)
        optimizer.build(params)
        head = models.head(model).trainable_variables
        clipper = clipping.make_clipper(cfg.clipping, params, output_params=head)
    loss_scale = getattr(optimizer, "dynamic_scale", None)  # mixed_float16 only
    layers = models.clip_layers(model)
    for layer in layers:
        layer.follow_loss_scale(loss_scale)
    probes = [layer.gradient_stats.value for layer in layers]
    names = metric_names([layer.name.removeprefix("clip_") for layer in layers],
                         loss_scaling=loss_scale is not None)
    per_example_loss = task_loss(arrays.num_classes, keras, tf)
    stop_at_divergence = t.on_divergence == "stop"
    skip_non_finite = not stop_at_divergence and loss_scale is None  # the LSO skips by itself
    loss_weight = 1.0 if t.loss_reduction == "sum" else 1.0 / t.batch_size  # global batch

    def gradients_of(x, y):
        """Forward and backward on this replica's share of the batch."""
        with tf.GradientTape() as tape:
            tape.watch(probes)
            losses = per_example_loss(y, model(x, training=True))
            scaled_loss = optimizer.scale_loss(tf.reduce_sum(losses) * loss_weight)
        grads, stats = tape.gradient(scaled_loss, (params, probes))
        return grads, stats, tf.reduce_sum(losses)

    def replica_step(x, y):
        """One step: gradients summed over replicas, parameter clipping on the sum, update."""
        sums = tf.distribute.get_replica_context().all_reduce("SUM", gradients_of(x, y))
        grads, stats, loss_sum = sums
        scale = 1.0 if loss_scale is None else tf.cast(loss_scale, tf.float32)
        clipped, c = clipper([g / scale for g in grads], params)
        # The optimizer sums over replicas again and unscales: hand it scale·g / replicas.
        update = [g * (scale / replicas) for g in clipped]
        if skip_non_finite:  # keep going past a divergence, without its non-finite updates
            tf.cond(tf.math.is_finite(c["norm_before"]),
                    lambda: [optimizer.apply(update, params), tf.constant(True)][1],
                    lambda: tf.constant(False))
        else:
            optimizer.apply(update, params)
        metrics = {"loss/train": loss_sum / t.batch_size,
                   "grad_norm/global": c["norm_before"], "grad_norm/global/post": c["norm_after"],
                   "param_clip/threshold": c["threshold"], "param_clip/clipped": c["clipped"],
                   "learning_rate": tf.cast(optimizer.learning_rate, tf.float32)}
        if loss_scale is not None:
            metrics["loss_scale"] = scale
            metrics["skipped"] = 1.0 - tf.cast(tf.math.is_finite(c["norm_before"]), tf.float32)
        for layer, s in zip(layers, stats, strict=True):
            metrics.update(layer_metrics(layer.name.removeprefix("clip_"), s, tf))
        return metrics

    if replicas > 1:  # XLA cannot compile the cross-replica sum: compile the replica's part
        gradients_of = tf.function(gradients_of, jit_compile=t.jit_compile)
    else:
        replica_step = tf.function(replica_step, jit_compile=t.jit_compile)

    def train_step(x, y):  # every replica returns the same measurements: keep the first's
        return strategy.experimental_local_results(strategy.run(replica_step, (x, y)))[0]

    @tf.function
    def train_steps(iterator, n):
        """Up to n steps in one call; stops after a step that diverged (see `diverged`)."""
        rows = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
        for i in tf.range(n):
            x, y = next(iterator)
            m = train_step(x, y)
            rows = rows.write(i, tf.stack([m[k] for k in names]))
            if stop_at_divergence and diverged(m["loss/train"], m["grad_norm/global"],
                                               m.get("skipped", 0.0), isfinite=tf.math.is_finite):
                break
        return rows.stack()

    @tf.function
    def evaluate():
        loss_sum, correct, count = 0.0, 0.0, 0.0
        for x, y in compiled.val_batches:
            outputs = model(x, training=False)
            loss_sum += tf.reduce_sum(per_example_loss(y, outputs))
            if arrays.num_classes is not None:
                predicted = tf.argmax(outputs, axis=-1, output_type=tf.int32)
                correct += tf.reduce_sum(tf.cast(predicted == y, tf.float32))
            count += tf.cast(tf.shape(y)[0], tf.float32)
        accuracy = correct / count if arrays.num_classes is not None else float("nan")
        return {"loss/val": loss_sum / count, "accuracy/val": accuracy}

    @tf.function
    def gradients(x, y):  # for histograms only: the step itself stays lean
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(per_example_loss(y, model(x, training=True))) * loss_weight
        grads = tape.gradient(loss, params)
        return {f"gradients/{v.path}": g for v, g in zip(params, grads, strict=True)}

    compiled = SimpleNamespace(model=model, optimizer=optimizer, clipper=clipper, names=names,
                               train_steps=train_steps, evaluate=evaluate, gradients=gradients,
                               val_batches=None)
    return compiled


def task_loss(num_classes: int | None, keras, tf):
    """Per-example loss: cross-entropy of logits, or squared error of one output (regression)."""
    if num_classes is not None:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    return lambda y, outputs: tf.square(outputs[:, 0] - tf.cast(y, outputs.dtype))


def metric_names(positions: list[str], loss_scaling: bool = False) -> list[str]:
    """The per-step measurements, in the order of the rows the step returns."""
    per_layer = [f"{kind}/{p}{suffix}" for p in positions
                 for kind, suffix in (("grad_norm", "/pre"), ("grad_norm", "/post"),
                                      ("clip_fraction", ""))]
    scaling = ["loss_scale", "skipped"] if loss_scaling else []
    return ["loss/train", "grad_norm/global", "grad_norm/global/post", "param_clip/threshold",
            "param_clip/clipped", "learning_rate", *scaling, *per_layer]





def layer_metrics(position: str, stats, tf) -> dict:
    """From a clip layer's [Σg², Σdx², clipped, count]: ‖dy‖ before, after, fraction clipped."""
    return {f"grad_norm/{position}/pre": tf.sqrt(stats[0]),
            f"grad_norm/{position}/post": tf.sqrt(stats[1]),
            f"clip_fraction/{position}": stats[2] / tf.maximum(stats[3], 1.0)}


def first_diverged_step(steps, rows, names, first_loss, factor) -> int | None:
    """measures.divergence_step of these rows (the run's own rule and the summary's)."""

    column = {name: rows[:, i] for i, name in enumerate(names)}
    step = divergence_step(steps, column["loss/train"], column["grad_norm/global"],
                           column.get("skipped", np.zeros(len(rows))), factor, first_loss)
    return None if np.isnan(step) else int(step)


def progress(step, steps, rows, names, val, rate) -> str:
    """One line: step, mean loss of the last steps, validation accuracy, clip fraction, speed."""
    parts = [f"step {step:>{len(str(steps))}}/{steps}",
             f"loss {np.mean(rows[:, names.index('loss/train')]):.4f}"]
    if val:
        parts.append(f"val_acc {val['accuracy/val']:.3f}")
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
