"""Per-layer telemetry, computed inside the compiled step for every layer with trainable weights
(`trainer.layer_norms`, on by default). With θ_l the weights of layer l (all its variables
together), g_l their gradient and Δθ_l = θ_l(after the step) − θ_l(before it):

    param_grad_norm/<l>        ‖g_l‖ = sqrt(Σ_v∈l Σ g_v²), before parameter clipping
    param_grad_norm/<l>/post   the same after parameter clipping: what the optimizer was given
    update_norm/<l>            ‖Δθ_l‖, the update the optimizer actually applied (0 when skipped)
    param_norm/<l>             ‖θ_l‖ after the step
    update_ratio/<l>           ‖Δθ_l‖ / ‖θ_l(before)‖

A layer is the first part of a variable's path (`dense_1/kernel` → dense_1; `rnn_1/rnn_1_cell/
kernel` → rnn_1): the model's own top-level layers. Norms are float32 sums of squares.
"""

from __future__ import annotations

from gradexp._tf import tf

KINDS = ("param_grad_norm", "param_grad_norm/post", "update_norm", "param_norm", "update_ratio")


def layer_of(variable) -> str:
    """The model layer a variable belongs to: the first part of its path."""
    return variable.path.split("/")[0]


def layer_names(params) -> list[str]:
    """The layers with trainable weights, in the order of their first variable."""
    return list(dict.fromkeys(layer_of(v) for v in params))


def metric_names(layers: list[str]) -> list[str]:
    """The telemetry's measurements, layer by layer: `<kind>/<layer>` (`.../post` last)."""
    return [f"{kind.split('/')[0]}/{layer}" + ("/post" if kind.endswith("/post") else "")
            for layer in layers for kind in KINDS]


def _norms_by_layer(params, tensors) -> dict[str, tf.Tensor]:
    squares: dict[str, list] = {}
    for v, t in zip(params, tensors, strict=True):
        squares.setdefault(layer_of(v), []).append(
            tf.reduce_sum(tf.square(tf.cast(t, tf.float32))))
    return {layer: tf.sqrt(tf.add_n(s)) for layer, s in squares.items()}


class LayerNorms:
    """`before(params)` when the step starts (a copy of the weights), then
    `measure(params, grads, clipped)` after the update: {metric name: value}."""

    def __init__(self, params):
        self.params = list(params)

    def before(self) -> list[tf.Tensor]:
        return [tf.identity(tf.convert_to_tensor(v)) for v in self.params]

    def measure(self, weights_before, grads, clipped) -> dict[str, tf.Tensor]:
        after = [tf.identity(tf.convert_to_tensor(v)) for v in self.params]
        norms = {"param_grad_norm": _norms_by_layer(self.params, grads),
                 "param_grad_norm/post": _norms_by_layer(self.params, clipped),
                 "update_norm": _norms_by_layer(
                     self.params, [a - b for a, b in zip(after, weights_before, strict=True)]),
                 "param_norm": _norms_by_layer(self.params, after)}
        norm_before = _norms_by_layer(self.params, weights_before)
        norms["update_ratio"] = {layer: norms["update_norm"][layer] / norm_before[layer]
                                 for layer in norm_before}
        names = metric_names(layer_names(self.params))
        values = [norms[kind][layer] for layer in layer_names(self.params) for kind in KINDS]
        return dict(zip(names, values, strict=True))
