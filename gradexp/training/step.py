"""One run's training step as pure functions of its state: `make_step` builds the model, its
optimizer, clipping method and spike detector, and returns them with the functions a run is
trained and evaluated by, as one immutable `Step`.

A run's state is a value, `State(model, optimizer, carry)`: the values of the model's and the
optimizer's variables, and the carry (the clipping method's state, then the spike detector's),
as optax carries a transformation's state. One step,

    state, row, grads = step.train(state, x, y, measure)

is `backward` (forward and backward: gradients, the clip layers' statistics, the loss) then
`update` (parameter clipping, the spike test, the optimizer's update through Keras's
stateless_apply), its measurements one row of `names` (big_vision's `update_fn` style). It
writes no variable: the same function trains one run or, mapped over stacked states, many
(gradexp/training/engine.py). The telemetry's columns are measured only when `measure` (else NaN).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from omegaconf import DictConfig

from gradexp import config
from gradexp._tf import keras, tf
from gradexp.parts import clipping, models, optimizers
from gradexp.parts.data import VAL_BATCH
from gradexp.training import telemetry
from gradexp.training.spikes import SpikeDetector, SpikeState

NAN = float("nan")


class State(NamedTuple):
    """A run's state: the values of model.variables, of optimizer.variables, and the carry."""

    model: list
    optimizer: list
    carry: list


class Backward(NamedTuple):
    """A forward and backward pass: the parameters' gradients (of the scaled loss under mixed
    precision), the clip layers' statistics, the summed loss, the model's values after it."""

    grads: list
    stats: list
    loss_sum: tf.Tensor
    model: list


@dataclass(frozen=True)
class Step:
    """What a run trains with (the module docstring). `carry_names`: the carry's parts, as a
    checkpoint names them; `evaluate(model_values, x_val, y_val)` -> {name: value}."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    names: tuple[str, ...]
    telemetry: tuple[str, ...]  # the columns of `names` measured only when asked
    val_names: tuple[str, ...]
    carry_names: tuple[str, ...]
    initial_carry: Callable[[], list]
    backward: Callable[[State, Any, Any], Backward]
    update: Callable[[State, Backward, bool], tuple[State, tf.Tensor, list]]
    evaluate: Callable

    def train(self, state: State, x, y, measure: bool) -> tuple[State, tf.Tensor, list]:
        """One step on one device: the new state, its row, and the parameters' gradients
        (before parameter clipping, in true units: the gradient histograms')."""
        return self.update(state, self.backward(state, x, y), measure)

    @property
    def variables(self) -> list:
        """The model's variables, then the optimizer's (the carry's:
        gradexp/training/checkpoints.py)."""
        return [*self.model.variables, *self.optimizer.variables]


def make_step(cfg: DictConfig, arrays, strategy=None) -> Step:
    """The model of `cfg` for `arrays`' shapes (built under `strategy`) and its Step."""
    t = cfg.trainer
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        config.check_model_takes(cfg.model, cfg.dataset.name, arrays.input_shape)
        model = models.build(cfg.model, config.clip_spec(cfg), arrays.input_shape,
                             arrays.num_outputs)
        optimizer = optimizers.make_optimizer(cfg.optimizer, cfg.precision)
        params = model.trainable_variables
        optimizer.build(params)
    method = clipping.make_clipper(cfg.clipping, params,
                                   output_params=models.head(model).trainable_variables)
    stateless_update = optimizers.stateless_update(optimizer, params)
    loss_scale = getattr(optimizer, "dynamic_scale", None)  # mixed_float16 only
    layers = models.clip_layers(model)
    for layer in layers:
        layer.follow_loss_scale(loss_scale)
    probes = [layer.gradient_stats for layer in layers]
    spikes = (SpikeDetector(t.spike_z, t.spike_warmup, t.spike_alpha)
              if t.on_spike == "skip" else None)
    measured = tuple(telemetry.metric_names(telemetry.layer_names(params))
                     if t.layer_norms else ())
    names = (*metric_names([models.position(layer) for layer in layers],
                           loss_scaling=loss_scale is not None, spike_skip=spikes is not None),
             *measured)
    per_example_loss = task_loss(arrays.num_classes, cfg.model.get("loss", "auto"))
    if cfg.model.get("loss", "auto") != "auto":  # one loss per example, or one line
        check_loss(per_example_loss, model, arrays, cfg.model.loss)
    error_threshold = cfg.dataset.get("error_threshold")  # regression: squared error above it
    val_names = ("loss/val", "accuracy/val", *(("error_rate/val",) if error_threshold else ()))
    skip_non_finite = t.on_divergence == "continue" and loss_scale is None  # the LSO skips
    loss_weight = 1.0 if t.loss_reduction == "sum" else 1.0 / t.batch_size  # global batch
    clip_type = type(method.init(params))  # a NamedTuple: the carry's first part
    carry_names = (*(f"{method.name}/{f}" for f in clip_type._fields),
                   *(f"spikes/{f}" for f in SpikeState._fields if spikes))
    split = len(clip_type._fields)

    def scope(model_values, optimizer_values=()):
        pairs = list(zip(model.variables, model_values, strict=True))
        if optimizer_values:
            pairs += list(zip(optimizer.variables, optimizer_values, strict=True))
        return keras.StatelessScope(pairs)

    def backward(state: State, x, y) -> Backward:
        """Forward and backward on (x, y) in the model's state; the clip layers' statistics come
        back as the gradients of their probes (gradexp/parts/layers.py)."""
        with scope(state.model, state.optimizer) as s:
            sources = ([s.get_current_value(v) for v in params],
                       [s.get_current_value(v) for v in probes])
            with tf.GradientTape() as tape:
                tape.watch(sources)
                losses = per_example_loss(y, model(x, training=True))
                scaled_loss = optimizer.scale_loss(tf.reduce_sum(losses) * loss_weight)
            grads, stats = tape.gradient(scaled_loss, sources)
            after_forward = [s.get_current_value(v) for v in model.variables]
        return Backward(grads, stats, tf.reduce_sum(losses), after_forward)

    def update(state: State, b: Backward, measure: bool) -> tuple[State, tf.Tensor, list]:
        """Parameter clipping of the summed gradients, the spike test, the optimizer's update;
        a skipped step keeps the parameters and the optimizer's state as they were."""
        clip_state = clip_type(*state.carry[:split])
        spike_state = SpikeState(*state.carry[split:]) if spikes else None
        with scope(b.model, state.optimizer) as s:
            before = [s.get_current_value(v) for v in params]
            scale = 1.0 if loss_scale is None else tf.cast(loss_scale, tf.float32)
            grads = [g / scale for g in b.grads]
            clipped, clip_state, c = method.update(grads, clip_state, params)
            learning_rate = tf.cast(optimizer.learning_rate, tf.float32)
        loss = b.loss_sum / t.batch_size
        skip = tf.constant(False)
        if spikes:  # trainer.on_spike=skip: see gradexp/training/spikes.py
            skip, spike_state = spikes.update(spike_state, loss, c["norm_before"])
        if skip_non_finite:  # keep going past a divergence, without its non-finite updates
            skip |= tf.logical_not(tf.math.is_finite(c["norm_before"]))
        scaled = [g * scale for g in clipped]  # the loss-scale optimizer unscales them again

        def apply():
            return stateless_update(state.optimizer, scaled, before)

        if spikes or skip_non_finite:
            after, optimizer_values = tf.cond(skip, lambda: (before, list(state.optimizer)),
                                              apply)
        else:
            after, optimizer_values = apply()
        new_values = dict(zip(map(id, params), after, strict=True))
        model_values = [new_values.get(id(v), value)
                        for v, value in zip(model.variables, b.model, strict=True)]
        metrics = {"loss/train": loss, **update_metrics(c, learning_rate)}
        if spikes:
            metrics["spike_skipped"] = tf.cast(skip, tf.float32)
        if loss_scale is not None:
            metrics["loss_scale"] = scale
            metrics["skipped"] = 1.0 - tf.cast(tf.math.is_finite(c["norm_before"]), tf.float32)
        for layer, s in zip(layers, b.stats, strict=True):
            metrics.update(layer_metrics(models.position(layer), s))
        if measure and measured:
            metrics.update(telemetry.measure(params, before, grads, clipped, after))
        row = as_row(metrics, names, sometimes=measured)
        carry = [*clip_state, *(spike_state or ())]
        return State(model_values, optimizer_values, carry), row, grads

    def evaluate(model_values, x_val, y_val):
        """Mean loss, accuracy (classes) and error rate = #{squared error > threshold} / n, over
        the validation set, data.VAL_BATCH examples per forward pass."""
        loss_sum, correct, errors, count = 0.0, 0.0, 0.0, x_val.shape[0]
        with scope(model_values):
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
        accuracy = correct / count if arrays.num_classes is not None else NAN
        measured_val = {"loss/val": loss_sum / count, "accuracy/val": accuracy,
                        "error_rate/val": errors / count}
        return {name: tf.cast(measured_val[name], tf.float32) for name in val_names}

    def initial_carry():
        return [*method.init(params), *(spikes.init() if spikes else ())]

    return Step(model, optimizer, names, measured, val_names, carry_names, initial_carry,
                backward, update, evaluate)


def task_loss(num_classes: int | None, loss: str = "auto"):
    """Per-example loss: cross-entropy of logits, or squared error of one output (regression);
    or a Keras loss function by name, or a function of one's own by dotted path."""
    if loss != "auto":
        if "." in loss or ":" in loss:
            return config.import_object("model.loss", loss)
        try:
            return keras.losses.get(loss)
        except ValueError:
            raise config.ConfigError(f"model.loss={loss}: no such Keras loss; give a Keras loss "
                                     "function's name (e.g. huber) or a dotted path") from None
    if num_classes is not None:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    return lambda y, outputs: tf.square(outputs[:, 0] - tf.cast(y, outputs.dtype))


def check_loss(per_example_loss, model, arrays, name: str) -> None:
    """ConfigError unless the loss gives one value per example of (up to) two validation
    examples."""
    n = min(2, len(arrays.y_val))
    try:
        shape = tuple(per_example_loss(arrays.y_val[:n], model(arrays.x_val[:n])).shape)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as exc:
        shape = str(exc).splitlines()[0]
    if shape != (n,):
        raise config.ConfigError(f"model.loss={name}: must give one loss per example (shape "
                                 f"({n},) for {n} examples); got {shape}")


def metric_names(positions: list[str], loss_scaling: bool = False,
                 spike_skip: bool = False) -> list[str]:
    """The per-step measurements before the telemetry's, in the order of a step's row: the
    parameter clipping's, then the clip layers' at `positions`."""
    per_layer = [f"{kind}/{p}{suffix}" for p in positions
                 for kind, suffix in (("grad_norm", "/pre"), ("grad_norm", "/post"),
                                      ("clip_fraction", ""))]
    scaling = ["loss_scale", "skipped"] if loss_scaling else []
    spikes = ["spike_skipped"] if spike_skip else []
    return ["loss/train", "grad_norm/global", "grad_norm/global/post", "param_clip/threshold",
            "param_clip/clipped", "learning_rate", *spikes, *scaling, *per_layer]


def update_metrics(c: dict, learning_rate) -> dict:
    """From the parameter clipping's stats (gradexp.parts.clipping): ‖g‖ before and after it, its
    threshold, whether it clipped; and the step's learning rate."""
    return {"grad_norm/global": c["norm_before"], "grad_norm/global/post": c["norm_after"],
            "param_clip/threshold": c["threshold"], "param_clip/clipped": c["clipped"],
            "learning_rate": learning_rate}


def as_row(metrics: dict, names, sometimes=()) -> tf.Tensor:
    """The float32 row of `names`; NaN for those of `sometimes` (the telemetry, measured only
    at logged steps) that `metrics` lacks. A name it lacks otherwise is a bug: KeyError."""
    return tf.stack([tf.cast(metrics[name] if name in metrics or name not in sometimes else NAN,
                             tf.float32) for name in names])


def layer_metrics(position: str, stats) -> dict:
    """From a clip layer's [Σg², Σdx², clipped, count]: ‖dy‖ before, after, fraction clipped."""
    return {f"grad_norm/{position}/pre": tf.sqrt(stats[0]),
            f"grad_norm/{position}/post": tf.sqrt(stats[1]),
            f"clip_fraction/{position}": stats[2] / tf.maximum(stats[3], 1.0)}
