"""Per-layer telemetry (`trainer.layer_norms`, on by default), computed by the training step at
the steps it logs (the last of each compiled call) for every layer with trainable weights. With
θ_l the weights of layer l (all its variables), g_l their gradient and Δθ_l = θ_l(after the
step) − θ_l(before it):

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
    from gradexp.parts.layers import total

    squares: dict[str, list] = {}
    for v, t in zip(params, tensors, strict=True):  # the same whatever the tensor's layout (a
        squares.setdefault(layer_of(v), []).append(  # batch's stacked state's may differ)
            total(tf.square(tf.cast(t, tf.float32)), small_in=tf.float64))
    return {layer: tf.sqrt(tf.add_n(s)) for layer, s in squares.items()}


def measure(params, before, grads, clipped, after) -> dict[str, tf.Tensor]:
    """{metric name: value} for the variables `params`, from their values `before` and `after`
    the step, their gradients and the gradients after parameter clipping."""
    norms = {"param_grad_norm": _norms_by_layer(params, grads),
             "param_grad_norm/post": _norms_by_layer(params, clipped),
             "update_norm": _norms_by_layer(
                 params, [a - b for a, b in zip(after, before, strict=True)]),
             "param_norm": _norms_by_layer(params, after)}
    norm_before = _norms_by_layer(params, before)
    norms["update_ratio"] = {layer: norms["update_norm"][layer] / norm_before[layer]
                             for layer in norm_before}
    layers = layer_names(params)
    return dict(zip(metric_names(layers),
                    [norms[kind][layer] for layer in layers for kind in KINDS], strict=True))
