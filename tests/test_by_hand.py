"""A real run's first two steps recomputed by hand, in NumPy float64, from the run's initial
weights and batches: an MLP with clip layers at both hidden layers, every key of the layer
(scale, grad_scale, asymmetric bounds, max_norm over the batch or per example), both loss
reductions and both optimizers. The hand values are compared with what the run wrote, read
back from metrics.csv and by TensorBoard's own loader: the writer is checked against numbers
computed without it (and without gradexp's step, layer or optimizer)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import event_scalars, events
from gradexp.analysis.runs import read_metrics
from gradexp.train import train

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

# log_every=1: each step a call of its own, so that step 1 measures the per-layer telemetry too
SMALL = ["model.depth=2", "model.width=8", "trainer.batch_size=8", "trainer.steps=2",
         "trainer.log_every=1", "trainer.eval_every=2", "trainer.histogram_every=0",
         "dataset.num_examples=200"]
CASES = {
    # Adam, mean-reduced loss (dy / batch), gradient reversal at half strength, forward scale 2,
    # asymmetric bounds, then each example's dx rescaled to norm <= max_norm
    "adam_mean_example": ["optimizer=adam", "optimizer.learning_rate=0.01",
                          "trainer.loss_reduction=mean", "layer.scale=2", "layer.grad_scale=-0.5",
                          "layer.clip_min=-0.0008", "layer.clip_max=0.02",
                          "layer.max_norm=0.02", "layer.norm_axis=example"],
    # SGD with momentum, summed loss, grad_scale 2, forward scale 0.5, ±clip, then the whole
    # batch's dx rescaled to norm <= max_norm
    "sgd_sum_batch": ["optimizer=sgd", "optimizer.learning_rate=0.05", "layer.scale=0.5",
                      "layer.grad_scale=2", "clip=0.1", "layer.max_norm=0.5"],
}
LAYERS = ["dense_1", "dense_2", "head"]


def softmax_cross_entropy(logits, labels):
    """Per-example loss and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(labels)), labels])
    p[np.arange(len(labels)), labels] -= 1.0
    return loss, p


def clip_layer(dy, layer):
    """The seed's backward pass, by hand: g = grad_scale·dy, clipped to the bounds, rescaled to
    norm <= max_norm (whole batch, or each row). Returns dx, [‖g‖, ‖dx‖, share changed] and
    (share of elements the bounds changed, share of rows the norm bound rescaled)."""
    g = layer["grad_scale"] * dy
    bounded = np.clip(g, layer["clip_min"], layer["clip_max"])
    if layer["norm_axis"] == "example":
        norms = np.linalg.norm(bounded, axis=1, keepdims=True)
    else:
        norms = np.full((len(bounded), 1), np.linalg.norm(bounded))
    dx = bounded * np.minimum(1.0, layer["max_norm"] / norms)
    bites = (np.mean(g != bounded), np.mean(norms > layer["max_norm"]))
    return dx, [np.linalg.norm(g), np.linalg.norm(dx), np.mean(g != dx)], bites


def first_step(w, x, y, layer, loss_weight):
    """Forward and backward of the MLP  x → relu(x W1 + b1)·s → relu(· W2 + b2)·s → · W3 + b3,
    with the clip layer's backward pass after each hidden layer. Returns the mean loss, the
    parameter gradients (by layer) and each clip layer's statistics and bites (`clip_layer`)."""
    (w1, b1), (w2, b2), (w3, b3) = w
    s = layer["scale"]
    z1 = x @ w1 + b1
    h1 = s * np.maximum(z1, 0)
    z2 = h1 @ w2 + b2
    h2 = s * np.maximum(z2, 0)
    loss, dlogits = softmax_cross_entropy(h2 @ w3 + b3, y)
    dlogits = dlogits * loss_weight  # of Σ loss (sum) or Σ loss / batch (mean)
    dx2, stats2, bites2 = clip_layer(dlogits @ w3.T, layer)  # backward ignores the scale
    dz2 = dx2 * (z2 > 0)
    dx1, stats1, bites1 = clip_layer(dz2 @ w2.T, layer)
    dz1 = dx1 * (z1 > 0)
    grads = [(x.T @ dz1, dz1.sum(0)), (h1.T @ dz2, dz2.sum(0)), (h2.T @ dlogits, dlogits.sum(0))]
    return loss.mean(), grads, {"dense_1": stats1, "dense_2": stats2}, [bites1, bites2]


def forward_loss(w, x, y, scale):
    (w1, b1), (w2, b2), (w3, b3) = w
    h2 = scale * np.maximum(scale * np.maximum(x @ w1 + b1, 0) @ w2 + b2, 0)
    return softmax_cross_entropy(h2 @ w3 + b3, y)[0].mean()


def first_update(g, o):
    """The optimizer's first step on gradient g (its state starts at zero)."""
    if o.name == "sgd":  # velocity = momentum·0 − lr·g; θ += velocity
        return -o.learning_rate * g
    # Adam: m = (1 − β1)·g, v = (1 − β2)·g², θ −= lr·√(1 − β2)/(1 − β1) · m / (√v + ε)
    alpha = o.learning_rate * np.sqrt(1 - o.beta_2) / (1 - o.beta_1)
    return -alpha * (1 - o.beta_1) * g / (np.sqrt((1 - o.beta_2) * g * g) + o.epsilon)


def initial_weights_and_batches(cfg):
    """The run's model as it was built (same seed, same order of calls as gradexp.train) and
    its first two training batches, as float64 arrays."""
    from gradexp import config
    from gradexp.parts import data, models
    from gradexp.training import devices

    devices.prepare_process(cfg.device, cfg.precision, cfg.seed, cfg.deterministic)
    arrays = data.load(cfg.dataset)
    model = models.build(cfg.model, config.clip_spec(cfg), arrays.input_shape,
                         arrays.num_outputs)
    weights = [tuple(np.asarray(v, np.float64) for v in (model.get_layer(n).kernel,
                                                          model.get_layer(n).bias))
               for n in LAYERS]
    batches = iter(data.training_batches(arrays, cfg.trainer.batch_size, cfg.seed))
    return weights, [tuple(np.asarray(t) for t in next(batches)) for _ in range(2)]


@pytest.mark.parametrize("case", CASES)
def test_the_first_steps_are_the_numbers_computed_by_hand(make_cfg, tmp_path, case):
    cfg = make_cfg(*SMALL, *CASES[case])
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed"
    w, ((x1, y1), (x2, y2)) = initial_weights_and_batches(cfg)
    bound = cfg.clip or 0.0
    layer = {"scale": cfg.layer.scale, "grad_scale": cfg.layer.grad_scale,
             "clip_min": cfg.layer.clip_min if cfg.layer.clip_min is not None else -bound,
             "clip_max": cfg.layer.clip_max if cfg.layer.clip_max is not None else bound,
             "max_norm": cfg.layer.max_norm, "norm_axis": cfg.layer.norm_axis}
    loss_weight = 1.0 if cfg.trainer.loss_reduction == "sum" else 1 / cfg.trainer.batch_size
    loss, grads, clips, bites = first_step(w, x1.astype(np.float64), y1, layer, loss_weight)
    updates = [tuple(first_update(g, cfg.optimizer) for g in pair) for pair in grads]
    after = [tuple(v + u for v, u in zip(vs, us, strict=True))
             for vs, us in zip(w, updates, strict=True)]

    def norm(pairs):
        return np.sqrt(sum((a ** 2).sum() for pair in pairs for a in pair))

    second_loss = forward_loss(after, x2.astype(np.float64), y2, layer["scale"])
    expected = {"loss/train": [loss, second_loss],
                "grad_norm/global": [norm(grads)], "learning_rate": [cfg.optimizer.learning_rate]}
    for name, (pre, post, changed) in clips.items():
        expected[f"grad_norm/{name}/pre"] = [pre]
        expected[f"grad_norm/{name}/post"] = [post]
        expected[f"clip_fraction/{name}"] = [changed]
    for i, name in enumerate(LAYERS):
        expected[f"param_grad_norm/{name}"] = [norm(grads[i:i + 1])]
        expected[f"update_norm/{name}"] = [norm(updates[i:i + 1])]
        expected[f"param_norm/{name}"] = [norm(after[i:i + 1])]
    # every setting is at work on this batch: the bounds bite on some elements of both layers,
    # the norm bound on some rows (or the batch) of at least one
    assert all(0 < bounded < 1 for bounded, _ in bites), bites
    assert any(rescaled > 0 for _, rescaled in bites), bites

    table = read_metrics(tmp_path / "metrics.csv")
    acc = events(tmp_path)
    for tag, values in expected.items():
        n = len(values)
        np.testing.assert_allclose(table[tag].to_numpy()[:n], values, rtol=2e-5, err_msg=tag)
        np.testing.assert_allclose(event_scalars(acc, tag)[:n], values, rtol=2e-5, err_msg=tag)
