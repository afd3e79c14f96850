"""model.fit's training step, measured as gradexp measures its own (gradexp/training/step.py): what
gradexp.keras.Telemetry adds to a model's `train_step` for the length of one `fit`.

gradexp's step reads a clip layer's statistics as the gradient of its probe, the zero vector
`gradient_stats` it watches (gradexp/parts/layers.py). Keras's train_step has its own tape and asks
it for the gradients of model.trainable_weights only; so while the step is traced, the tape is
made to watch the probes too and, at that call, to give their gradients with the parameters':

    with tf.GradientTape() as tape:      the tape watches every clip layer's probe
        ...                              (Keras's forward pass and loss)
    tape.gradient(loss, model.trainable_weights)
        → the parameters' gradients, handed back as asked; and, measured there, before the
          optimizer's update:
          loss/train          the loss the gradients are of (Keras's compiled loss and
                              model.losses, reduced as the loss says: by default the batch
                              mean, gradexp's trainer.loss_reduction=mean)
          grad_norm/global and /post, param_clip/threshold and /clipped (`step.update_metrics`;
                              the optimizer's own clipnorm / clipvalue / global_clipnorm are
                              measured as gradexp.parts.clipping's norm / value / global_norm, which
                              clip as Keras does), learning_rate
          grad_norm/<p>/pre and /post, clip_fraction/<p> of each clip layer at position p
                              (`step.layer_metrics` of its probe's gradient, [Σ g², Σ dx²,
                              changed, count], summed over every application: the time steps of
                              a recurrent cell, inside Keras's while loop, too)

These go into one float32 variable, `row` (columns `names`, gradexp's `step.metric_names`),
which the callback reads after each batch. A variable, not extra outputs of the step: Keras's
logs and progress bar stay as they are; XLA keeps the write (jit_compile on or off, run_eagerly
alike). `tf.GradientTape`'s __enter__ and gradient are replaced only while the step is traced,
in the tracing thread's time (every other tape passes through: it merely also watches the
probes), and put back after; the model's train_step is wrapped for one fit. Any train_step
that takes `tape.gradient(loss, model.trainable_weights)`, Keras's own or a user's, is measured.

Limits, each refused in one line (ConfigError): steps_per_execution > 1 (the variable holds a
call's last step only), more than one replica (the variable is not mirrored), loss scaling
(mixed_float16's LossScaleOptimizer, loss_scale_factor: the gradients and the loss would be in
scaled units), and a train_step that takes no such gradient.
"""

from __future__ import annotations

from contextlib import contextmanager

from omegaconf import OmegaConf

from gradexp._tf import tf
from gradexp.config import ConfigError
from gradexp.parts import clipping, models
from gradexp.parts.layers import STATS
from gradexp.training import step

_MISSING = object()


class MeasuredStep:
    """The measured train_step of the compiled `model`, its parameter clipping read as the
    gradexp.parts.clipping config node `clip` (fit_config.clipping): `install()` before fit's first
    step, `remove()` after it; `row` holds the last step's measurements."""

    def __init__(self, model, clip: dict):
        check(model)
        self.model = model
        self.layers = models.clip_layers(model)
        self.positions = [models.position(layer) for layer in self.layers]
        self.names = tuple(step.metric_names(self.positions))
        self.method = clipping.make_clipper(OmegaConf.create(clip), [])
        self.row = tf.Variable(tf.fill([len(self.names)], float("nan")), trainable=False)
        self._train_step = None

    def install(self) -> None:
        """Measure from the next trace on: the model's train_step wrapped (a wrapper a fit
        that raised left behind is taken off first), the train function made again (fit made
        it before any callback began)."""
        stale = getattr(self.model.train_step, "measured", None)
        if stale is not None:
            stale.remove()
        self._train_step = Patch(self.model, "train_step", self.wrap(self.model.train_step))
        self.model.make_train_function(force=True)

    def remove(self) -> None:
        """The model as it was: a later fit traces its step anew, unmeasured."""
        if self._train_step is not None:
            self._train_step.undo()
            self._train_step = None
        self.model.train_function = None

    def wrap(self, train_step):
        def measured_train_step(data):
            measured: list[bool] = []
            with self.watching(measured):
                logs = train_step(data)
            if not measured:
                self.remove()
                raise ConfigError("Telemetry: the model's train_step takes no tape.gradient of "
                                  "its loss with respect to model.trainable_weights")
            return logs

        measured_train_step.measured = self
        return measured_train_step

    @contextmanager
    def watching(self, measured: list):
        """tf.GradientTape made to watch the probes and, asked for the gradients of
        model.trainable_weights, to measure the step (appending True to `measured`)."""
        probes = [layer.gradient_stats.value for layer in self.layers]
        tape_class = tf.GradientTape
        enter, gradient = tape_class.__enter__, tape_class.gradient

        def watching_enter(tape):
            entered = enter(tape)
            tape.watch(probes)
            return entered

        def measuring_gradient(tape, target, sources, *args, **kwargs):
            params = self.model.trainable_weights
            if not isinstance(sources, (list, tuple)) or list(map(id, sources)) != list(
                    map(id, params)):
                return gradient(tape, target, sources, *args, **kwargs)
            grads, stats = gradient(tape, target, [list(sources), probes], *args, **kwargs)
            self.measure(target, grads, params, stats)
            measured.append(True)
            return grads if isinstance(sources, list) else tuple(grads)

        tape_class.__enter__, tape_class.gradient = watching_enter, measuring_gradient
        try:
            yield
        finally:
            tape_class.__enter__, tape_class.gradient = enter, gradient

    def measure(self, loss, grads, params, stats) -> None:
        """Write the step's row: the loss, the parameter clipping's stats of the gradients and
        the learning rate (before the update), each clip layer's statistics."""
        _, _, c = self.method.update(list(grads), self.method.init(params), params)
        optimizer = self.model.optimizer
        metrics = {"loss/train": loss,
                   **step.update_metrics(c, tf.cast(optimizer.learning_rate, tf.float32))}
        for position, s in zip(self.positions, stats, strict=True):
            s = tf.zeros([len(STATS)]) if s is None else s  # one the loss does not reach
            metrics.update(step.layer_metrics(position, s))
        self.row.assign(step.as_row(metrics, self.names))


def check(model) -> None:
    """What the measured step cannot do, refused in one line (the module docstring)."""
    if model.optimizer is None:
        raise ConfigError("Telemetry: the model is not compiled; call model.compile first")
    if model.steps_per_execution != 1:
        raise ConfigError(f"Telemetry: steps_per_execution={model.steps_per_execution}: "
                          "the measurements need every step (steps_per_execution=1)")
    replicas = model.distribute_strategy.num_replicas_in_sync
    if replicas > 1:
        raise ConfigError(f"Telemetry: {replicas} replicas: measures a model trained on one "
                          "device (no distribution strategy)")
    optimizer = model.optimizer
    if (getattr(optimizer, "dynamic_scale", None) is not None
            or getattr(optimizer, "loss_scale_factor", None) is not None):
        raise ConfigError("Telemetry: a loss-scaled optimizer (mixed_float16, "
                          "loss_scale_factor) is not supported; train in float32")


class Patch:
    """`obj.name = value` on the instance until `undo()`, which puts back what the instance
    had (its own attribute, or none: the class's method again)."""

    def __init__(self, obj, name: str, value):
        self.obj, self.name, self.own = obj, name, obj.__dict__.get(name, _MISSING)
        setattr(obj, name, value)

    def undo(self) -> None:
        if self.own is _MISSING:
            delattr(self.obj, self.name)
        else:
            setattr(self.obj, self.name, self.own)
