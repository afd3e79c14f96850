"""Train one model with clip layers inserted: `python -m gradexp.train [key=value ...]`.

`-m` makes a sweep (`python -m gradexp.train -m clip=null,0.1 seed=0,1,2`); `--help` lists the
config groups and keys. The file reads top to bottom: the entry point, `train` (data, model,
the compiled step, the loop), then its small helpers.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from gradexp import config
from gradexp.logs import write_json

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
log = logging.getLogger("gradexp")


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> dict:
    """Hydra's task: one run in Hydra's output directory. A crash is recorded in the run's
    summary.json; a sweep then goes on to its next run, a single run exits non-zero."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    overrides = list(hydra_cfg.overrides.task)
    try:
        return train(cfg, run_dir, overrides)
    except Exception as exc:
        write_json(run_dir / "summary.json", {
            "status": "failed", "error": f"{type(exc).__name__}: {exc}",
            "config": OmegaConf.to_container(cfg), "overrides": overrides})
        if hydra_cfg.mode != RunMode.MULTIRUN:
            raise
        log.error("run failed: %s (%s)", config.explain(exc) or repr(exc), run_dir)
        return {"status": "failed"}


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


def train(cfg: DictConfig, run_dir: Path, overrides: list[str] = ()) -> dict:
    """Train as `cfg` says, writing into `run_dir`; return the run's summary."""
    from gradexp import data, devices, models
    from gradexp._tf import keras, tf
    from gradexp.logs import RunLog

    started = time.perf_counter()
    t = cfg.trainer
    write_json(run_dir / "summary.json", {"status": "running", "overrides": list(overrides),
                                          "config": OmegaConf.to_container(cfg)})
    where = devices.configure(cfg.device)
    keras.backend.clear_session()
    keras.utils.set_random_seed(cfg.seed)

    arrays = data.load(cfg.dataset)
    train_batches, val_batches = data.pipelines(arrays, t.batch_size, cfg.seed)
    model = models.build(cfg, arrays.input_shape, arrays.num_outputs)
    params = model.trainable_variables
    optimizer = make_optimizer(cfg.optimizer, keras)
    optimizer.build(params)
    layers = models.clip_layers(model)
    probes = [layer.gradient_stats.value for layer in layers]
    names = metric_names([layer.name.removeprefix("clip_") for layer in layers])
    regression = arrays.num_classes is None  # one output, squared error, no accuracy
    per_example_loss = (
        keras.losses.MeanSquaredError(reduction=None) if regression
        else keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None))
    reduce_loss = tf.reduce_sum if t.loss_reduction == "sum" else tf.reduce_mean

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            tape.watch(probes)
            losses = per_example_loss(y, model(x, training=True))
            loss = reduce_loss(losses)
        grads, stats = tape.gradient(loss, (params, probes))
        optimizer.apply(grads, params)
        metrics = {"loss/train": tf.reduce_mean(losses),
                   "grad_norm/global": tf.linalg.global_norm(grads),
                   "learning_rate": tf.cast(optimizer.learning_rate, tf.float32)}
        for layer, s in zip(layers, stats, strict=True):
            metrics.update(layer_metrics(layer.name.removeprefix("clip_"), s, tf))
        return metrics

    @tf.function
    def train_steps(iterator, n):
        """Up to n steps in one call; stops after a step whose loss or gradient is not finite."""
        rows = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
        for i in tf.range(n):
            x, y = next(iterator)
            m = train_step(x, y)
            rows = rows.write(i, tf.stack([m[k] for k in names]))
            if not tf.math.is_finite(m["loss/train"] + m["grad_norm/global"]):
                break
        return rows.stack()

    @tf.function
    def evaluate():
        loss_sum, correct, count = 0.0, 0.0, 0.0
        for x, y in val_batches:
            logits = model(x, training=False)
            loss_sum += tf.reduce_sum(per_example_loss(y, logits))
            if not regression:
                predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
                correct += tf.reduce_sum(tf.cast(predicted == y, tf.float32))
            count += tf.cast(tf.shape(y)[0], tf.float32)
        accuracy = tf.constant(np.nan, tf.float32) if regression else correct / count
        return {"loss/val": loss_sum / count, "accuracy/val": accuracy}

    def gradients(x, y):  # for histograms only: the step itself stays lean
        with tf.GradientTape() as tape:
            loss = reduce_loss(per_example_loss(y, model(x, training=True)))
        grads = tape.gradient(loss, params)
        return {f"gradients/{v.path}": g for v, g in zip(params, grads, strict=True)}

    runlog = RunLog(run_dir, names, cfg)
    iterator = iter(train_batches)
    loss_column = names.index("loss/train")
    losses, val, step, diverged_step = [], None, 0, None
    timed_steps, timed_seconds = 0, 0.0  # training calls after the first (which traces)
    log.info("training %s on %s (%d steps, %s) -> %s", cfg.model.name, cfg.dataset.name,
             t.steps, where, run_dir)
    while step < t.steps and diverged_step is None:
        n = min(t.log_every - step % t.log_every, t.eval_every - step % t.eval_every,
                t.steps - step)
        tick = time.perf_counter()
        rows = train_steps(iterator, tf.constant(n)).numpy()
        seconds = time.perf_counter() - tick
        if step > 0:
            timed_steps, timed_seconds = timed_steps + len(rows), timed_seconds + seconds
        steps = step + 1 + np.arange(len(rows))
        step += len(rows)
        losses.extend(rows[:, loss_column])
        diverged_step = first_diverged_step(steps, rows, names, losses[0], t.divergence_factor)
        val = None
        if diverged_step is None and (step % t.eval_every == 0 or step == t.steps):
            val = {k: float(v) for k, v in evaluate().items()}
        runlog.steps(steps, rows, val)
        if t.histogram_every and step % t.histogram_every == 0 and diverged_step is None:
            runlog.histograms(step, gradients(*next(iterator)))
        log.info(progress(step, t.steps, rows, names, val, len(rows) / seconds))

    wall = time.perf_counter() - started
    tail = losses[-max(1, len(losses) // 10):]
    final = {"loss": float(np.mean(tail)),
             "val_loss": val["loss/val"] if val else None,
             "val_accuracy": val["accuracy/val"] if val else None}
    runlog.close(step, final)
    summary = {"status": "completed" if diverged_step is None else "diverged",
               "diverged": diverged_step is not None, "diverged_step": diverged_step,
               "steps": step, "final_loss": final["loss"], "val_loss": final["val_loss"],
               "val_accuracy": final["val_accuracy"], "wall_time_s": wall,
               "steps_per_s": timed_steps / timed_seconds if timed_seconds else None,
               "device": where,
               "config": OmegaConf.to_container(cfg),
               "overrides": list(overrides)}
    write_json(run_dir / "summary.json", summary)
    log.info("%s: final loss %.4f, val accuracy %s, %d steps in %.1f s -> %s",
             summary["status"], final["loss"],
             "n/a" if final["val_accuracy"] is None else f"{final['val_accuracy']:.4f}",
             step, wall, run_dir)
    return summary


def make_optimizer(o: DictConfig, keras):
    if o.name == "sgd":
        return keras.optimizers.SGD(o.learning_rate, momentum=o.momentum, nesterov=o.nesterov)
    return keras.optimizers.Adam(o.learning_rate, beta_1=o.beta_1, beta_2=o.beta_2,
                                 epsilon=o.epsilon)


def metric_names(positions: list[str]) -> list[str]:
    """The per-step measurements, in the order of the rows the step returns."""
    per_layer = [f"{kind}/{p}{suffix}" for p in positions
                 for kind, suffix in (("grad_norm", "/pre"), ("grad_norm", "/post"),
                                      ("clip_fraction", ""))]
    return ["loss/train", "grad_norm/global", "learning_rate", *per_layer]


def layer_metrics(position: str, stats, tf) -> dict:
    """From a clip layer's [Σg², Σdx², clipped, count]: ‖dy‖ before, after, fraction clipped."""
    return {f"grad_norm/{position}/pre": tf.sqrt(stats[0]),
            f"grad_norm/{position}/post": tf.sqrt(stats[1]),
            f"clip_fraction/{position}": stats[2] / tf.maximum(stats[3], 1.0)}


def first_diverged_step(steps, rows, names, first_loss, factor) -> int | None:
    """The first step whose loss or gradient norm is not finite, or whose loss exceeds
    `factor` × the first step's loss."""
    loss = rows[:, names.index("loss/train")]
    norm = rows[:, names.index("grad_norm/global")]
    bad = ~np.isfinite(loss) | ~np.isfinite(norm) | (loss > factor * first_loss)
    return int(steps[np.argmax(bad)]) if bad.any() else None


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
    main()
