"""The compiled training step: `compile_step` builds the model, its optimizer and clipper, and
returns the model, the optimizer, the state to checkpoint and the compiled functions a run
calls, as one immutable `CompiledStep`.

One step (`replica_step`, on one screen): forward and backward on this replica's share of the
batch, gradients summed over replicas, parameter clipping on the sum, the optimizer's update;
it returns its measurements as a dict (big_vision's `update_fn` style), stacked into one row of
`names` per step. The clip layers' statistics come back as the gradients of their probes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from omegaconf import DictConfig

from gradexp import clipping, config, models, optimizers, telemetry
from gradexp._tf import keras, tf
from gradexp.data import VAL_BATCH
from gradexp.measures import diverged
from gradexp.spikes import SpikeDetector


@dataclass(frozen=True)
class CompiledStep:
    """What a run trains with. `train_steps(iterator, n)`: up to n steps in one call, one row
    of `names` per step (it stops after a step that diverged when the run stops there);
    `evaluate(x_val, y_val)`: {name: value for name in `val_names`} over a validation set
    (loss/val, accuracy/val, and error_rate/val where the dataset has an error threshold);
    `gradients(x, y)`: {"gradients/<variable path>": gradient}, for histograms;
    `step_body(x, y, scope)`: one step on the state a keras.StatelessScope holds."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    state_variables: list  # besides model and optimizer: the clipper's and the spike detector's
    names: tuple[str, ...]
    val_names: tuple[str, ...]
    train_steps: Callable[[Any, tf.Tensor], tf.Tensor]
    evaluate: Callable[[tf.data.Dataset], dict[str, tf.Tensor]]
    gradients: Callable[[tf.Tensor, tf.Tensor], dict[str, tf.Tensor]]
    step_body: Callable  # replica_step(x, y, scope=None), not compiled


def compile_step(cfg: DictConfig, arrays, strategy) -> CompiledStep:
    """The model of `cfg` for `arrays`' shapes, built under `strategy`, and its compiled
    functions (see CompiledStep)."""
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
    stat_weights = [layer.gradient_stats for layer in layers]
    probes = [w.value for w in stat_weights]
    layer_norms = telemetry.LayerNorms(params) if t.layer_norms else None
    with strategy.scope():
        spikes = (SpikeDetector(t.spike_z, t.spike_warmup, t.spike_alpha)
                  if t.on_spike == "skip" else None)
    names = metric_names([layer.name.removeprefix("clip_") for layer in layers],
                         loss_scaling=loss_scale is not None, spike_skip=spikes is not None,
                         weight_layers=telemetry.layer_names(params) if layer_norms else [])
    per_example_loss = task_loss(arrays.num_classes)
    error_threshold = cfg.dataset.get("error_threshold")  # regression: squared error above it
    val_names = ("loss/val", "accuracy/val", *(("error_rate/val",) if error_threshold else ()))
    stop_at_divergence = t.on_divergence == "stop"
    skip_non_finite = not stop_at_divergence and loss_scale is None  # the LSO skips by itself
    loss_weight = 1.0 if t.loss_reduction == "sum" else 1.0 / t.batch_size  # global batch

    def gradients_of(x, y, sources=None):
        """Forward and backward on this replica's share of the batch; the gradients are those
        of `sources`, (params, probes) or a stateless scope's values of them."""
        with tf.GradientTape() as tape:
            tape.watch(probes if sources is None else sources)  # trainable variables: watched
            sources = sources or (params, probes)
            losses = per_example_loss(y, model(x, training=True))
            scaled_loss = optimizer.scale_loss(tf.reduce_sum(losses) * loss_weight)
        grads, stats = tape.gradient(scaled_loss, sources)
        return grads, stats, tf.reduce_sum(losses)

    def replica_step(x, y, scope=None):
        """One step: gradients summed over replicas, parameter clipping on the sum, update.
        With `scope` (a keras.StatelessScope holding one run's state: gradexp/batched.py) the
        step reads and writes that state instead of the variables."""
        if scope is None:
            sums = tf.distribute.get_replica_context().all_reduce("SUM", gradients_of(x, y))
        else:  # one replica; the sources of the gradients are the scope's values
            sums = gradients_of(x, y, tuple([scope.get_current_value(v) for v in vs]
                                            for vs in (params, stat_weights)))
        grads, stats, loss_sum = sums
        scale = 1.0 if loss_scale is None else tf.cast(loss_scale, tf.float32)
        weights_before = layer_norms.before() if layer_norms else None
        grads = [g / scale for g in grads]
        clipped, c = clipper(grads, params)
        # The optimizer sums over replicas again and unscales: hand it scale·g / replicas.
        update = [g * (scale / replicas) for g in clipped]
        skip = tf.constant(False)
        if spikes:  # trainer.on_spike=skip: see gradexp/spikes.py
            skip = spikes.is_spike(loss_sum / t.batch_size, c["norm_before"])
            spikes.record(loss_sum / t.batch_size, c["norm_before"], skip)
        if skip_non_finite:  # keep going past a divergence, without its non-finite updates
            skip |= tf.logical_not(tf.math.is_finite(c["norm_before"]))
        if scope is not None:  # a skipped step keeps the state it read: a select, not a cond
            before = {id(v): scope.get_current_value(v) for v in (*params, *optimizer.variables)}
            optimizers.apply_in_scope(optimizer, update, params, scope)
            for v in (*params, *optimizer.variables):
                scope.add_update((v, tf.where(skip, before[id(v)], scope.get_current_value(v))))
        elif spikes or skip_non_finite:
            tf.cond(skip, lambda: tf.constant(False),
                    lambda: [optimizer.apply(update, params), tf.constant(True)][1])
        else:
            optimizer.apply(update, params)
        metrics = {"loss/train": loss_sum / t.batch_size,
                   "grad_norm/global": c["norm_before"], "grad_norm/global/post": c["norm_after"],
                   "param_clip/threshold": c["threshold"], "param_clip/clipped": c["clipped"],
                   "learning_rate": tf.cast(optimizer.learning_rate, tf.float32)}
        if spikes:
            metrics["spike_skipped"] = tf.cast(skip, tf.float32)
        if loss_scale is not None:
            metrics["loss_scale"] = scale
            metrics["skipped"] = 1.0 - tf.cast(tf.math.is_finite(c["norm_before"]), tf.float32)
        for layer, s in zip(layers, stats, strict=True):
            metrics.update(layer_metrics(layer.name.removeprefix("clip_"), s))
        if layer_norms:
            metrics.update(layer_norms.measure(weights_before, grads, clipped))
        return metrics

    step_body = replica_step  # uncompiled: gradexp/batched.py traces it in its map over runs
    jit = partial(tf.function, jit_compile=t.jit_compile, autograph=False)  # the step: XLA
    if replicas > 1:  # XLA cannot compile the cross-replica sum: compile the replica's part
        gradients_of = jit(gradients_of)
    else:
        replica_step = jit(replica_step)

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

    @tf.function(autograph=False)
    def evaluate(x_val, y_val):
        """Mean loss, accuracy (classes) and error rate = #{squared error > threshold} / n, over
        the validation set, data.VAL_BATCH examples per forward pass."""
        loss_sum, correct, errors, count = 0.0, 0.0, 0.0, x_val.shape[0]
        for start in range(0, count, VAL_BATCH):
            x, y = x_val[start:start + VAL_BATCH], y_val[start:start + VAL_BATCH]
            outputs = model(x, training=False)
            losses = per_example_loss(y, outputs)
            loss_sum += tf.reduce_sum(losses)
            if arrays.num_classes is not None:
                predicted = tf.argmax(outputs, axis=-1, output_type=tf.int32)
                correct += tf.reduce_sum(tf.cast(predicted == y, tf.float32))
            if error_threshold:
                errors += tf.reduce_sum(tf.cast(losses > error_threshold, tf.float32))
        accuracy = correct / count if arrays.num_classes is not None else float("nan")
        measured = {"loss/val": loss_sum / count, "accuracy/val": accuracy,
                    "error_rate/val": errors / count}
        return {name: measured[name] for name in val_names}

    @tf.function(autograph=False)
    def gradients(x, y, scope=None):  # for histograms only: the step itself stays lean
        sources = params if scope is None else [scope.get_current_value(v) for v in params]
        with tf.GradientTape() as tape:
            tape.watch(sources if scope else [])
            loss = tf.reduce_sum(per_example_loss(y, model(x, training=True))) * loss_weight
        grads = tape.gradient(loss, sources)
        return {f"gradients/{v.path}": g for v, g in zip(params, grads, strict=True)}

    state_variables = [*clipper.state_variables, *(spikes.variables if spikes else [])]
    return CompiledStep(model, optimizer, state_variables, tuple(names), val_names,
                        train_steps, evaluate, gradients, step_body)


def task_loss(num_classes: int | None):
    """Per-example loss: cross-entropy of logits, or squared error of one output (regression)."""
    if num_classes is not None:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    return lambda y, outputs: tf.square(outputs[:, 0] - tf.cast(y, outputs.dtype))


def metric_names(positions: list[str], loss_scaling: bool = False, spike_skip: bool = False,
                 weight_layers: list[str] = ()) -> list[str]:
    """The per-step measurements, in the order of the rows the step returns: the clip layers'
    at `positions`, then the telemetry of `weight_layers` (gradexp/telemetry.py)."""
    per_layer = [f"{kind}/{p}{suffix}" for p in positions
                 for kind, suffix in (("grad_norm", "/pre"), ("grad_norm", "/post"),
                                      ("clip_fraction", ""))]
    scaling = ["loss_scale", "skipped"] if loss_scaling else []
    spikes = ["spike_skipped"] if spike_skip else []
    return ["loss/train", "grad_norm/global", "grad_norm/global/post", "param_clip/threshold",
            "param_clip/clipped", "learning_rate", *spikes, *scaling, *per_layer,
            *telemetry.metric_names(list(weight_layers))]


def layer_metrics(position: str, stats) -> dict:
    """From a clip layer's [Σg², Σdx², clipped, count]: ‖dy‖ before, after, fraction clipped."""
    return {f"grad_norm/{position}/pre": tf.sqrt(stats[0]),
            f"grad_norm/{position}/post": tf.sqrt(stats[1]),
            f"clip_fraction/{position}": stats[2] / tf.maximum(stats[3], 1.0)}
