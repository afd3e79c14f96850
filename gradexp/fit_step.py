"""model.fit's training step, measured as gradexp measures its own (gradexp/step.py): what
gradexp.keras.Telemetry adds to a model's `train_step` for the length of one `fit`.

Keras's train_step computes the gradients itself and watches no clip layer's statistics probe,
so each measurement is taken where the step hands a value over, while the step is traced:

    model.compute_loss(...)       loss/train: what it returns (the compiled loss and
                                  model.losses, reduced as the loss says: by default the batch
                                  mean, gradexp's trainer.loss_reduction=mean)
    optimizer.apply(grads, vars)  before the update: grad_norm/global and /post,
                                  param_clip/threshold and /clipped (`step.update_metrics`, the
                                  optimizer's own clipnorm / clipvalue / global_clipnorm
                                  measured as gradexp.clipping's norm / value / global_norm,
                                  which clip as Keras does; none: ‖g‖ as it is), learning_rate
    each ClipGradient's backward  grad_norm/<p>/pre and /post, clip_fraction/<p>
                                  (`step.layer_metrics` of [Σ g², Σ dx², changed, count], which
                                  the layer adds to a variable of its own: `record_into`)

The two methods are replaced on the instance only while the step is traced (`patched`); the
values go into one float32 variable, `row` (columns `names`, gradexp's `step.metric_names`),
set to NaN and the layers' variables to zero at the start of every step, which the callback
reads after each batch. Side effects on variables, not extra outputs of the step: Keras's logs
and its progress bar stay as they are, and the row survives jit_compile (XLA keeps a
function's variable updates in order) and run_eagerly alike. Any train_step that calls those
two methods is measured, Keras's own or a user's.

Limits, each refused in one line (ConfigError): steps_per_execution > 1 (the variables would
hold only a call's last step), more than one replica (the variables are not mirrored),
loss scaling (mixed_float16's LossScaleOptimizer, loss_scale_factor: the gradients and the
layers' dy would be in scaled units), and a train_step that does not call both methods.
"""

from __future__ import annotations

from contextlib import contextmanager

from omegaconf import OmegaConf

from gradexp import clipping, models, step
from gradexp._tf import tf
from gradexp.config import ConfigError
from gradexp.layers import STATS

_MISSING = object()
HOOKED = ("model.compute_loss", "optimizer.apply")


class MeasuredStep:
    """The measured train_step of `model` (compiled), its parameter clipping read as the
    gradexp.clipping config node `clip` (fit_config.clipping): `install()` before the train
    function is made, `remove()` after fit; `row` holds the last step's measurements."""

    def __init__(self, model, clip: dict):
        check(model)
        self.model = model
        self.layers = models.clip_layers(model)
        self.positions = [models.position(layer) for layer in self.layers]
        self.names = tuple(step.metric_names(self.positions))
        self.method = clipping.make_clipper(OmegaConf.create(clip), [])
        self.row = tf.Variable(tf.fill([len(self.names)], float("nan")), trainable=False)
        self.stats = [tf.Variable(tf.zeros([len(STATS)]), trainable=False)
                      for _ in self.layers]
        self._train_step = None

    def install(self) -> None:
        """Measure from the next trace on: the model's train_step wrapped, its layers recording;
        the train function made again (fit made it before any callback began)."""
        self._train_step = Patch(self.model, "train_step", self.wrap(self.model.train_step))
        for layer, variable in zip(self.layers, self.stats, strict=True):
            layer.record_into(variable)
        self.model.make_train_function(force=True)

    def remove(self) -> None:
        """The model as it was: a later fit traces its step anew, unmeasured."""
        if self._train_step is not None:
            self._train_step.undo()
            self._train_step = None
        for layer in self.layers:
            layer.record_into(None)
        self.model.train_function = None

    def wrap(self, train_step):
        def measured_train_step(data):
            self.row.assign(tf.fill([len(self.names)], float("nan")))
            for variable in self.stats:
                variable.assign(tf.zeros([len(STATS)]))
            called: set[str] = set()
            with self.hooks(called):
                logs = train_step(data)
            missing = [name for name in HOOKED if name not in called]
            if missing:
                raise ConfigError(f"Telemetry: the model's train_step calls no "
                                  f"{' and no '.join(missing)}, where the measurements are taken")
            self.write({name: value for position, variable in zip(
                self.positions, self.stats, strict=True)
                for name, value in step.layer_metrics(position, variable.read_value()).items()})
            return logs

        return measured_train_step

    @contextmanager
    def hooks(self, called: set):
        """model.compute_loss and optimizer.apply, measured (adding their names to `called`)."""
        model, optimizer = self.model, self.model.optimizer
        compute_loss, apply = model.compute_loss, optimizer.apply

        def measured_compute_loss(*args, **kwargs):
            loss = compute_loss(*args, **kwargs)
            self.write({"loss/train": loss})
            called.add(HOOKED[0])
            return loss

        def measured_apply(grads, trainable_variables=None):
            params = list(grads if trainable_variables is None else trainable_variables)
            # the stateless methods count the parameters, nothing more
            _, _, c = self.method.update(list(grads), self.method.init(params), params)
            self.write(step.update_metrics(c, tf.cast(optimizer.learning_rate, tf.float32)))
            called.add(HOOKED[1])
            return apply(grads, trainable_variables)

        with patched(model, "compute_loss", measured_compute_loss), \
                patched(optimizer, "apply", measured_apply):
            yield

    def write(self, metrics: dict) -> None:
        """Set the columns of `metrics` in `row`."""
        if metrics:
            indices = [[self.names.index(name)] for name in metrics]
            self.row.scatter_nd_update(indices, step.as_row(metrics, list(metrics)))


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
                          "loss_scale_factor) is not supported; train in float32 or "
                          "mixed_bfloat16")


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


@contextmanager
def patched(obj, name: str, value):
    patch = Patch(obj, name, value)
    try:
        yield
    finally:
        patch.undo()
