"""Per-layer telemetry (gradexp/training/telemetry.py) against norms computed by hand from the
weights before and after a real compiled step, and from the gradient of the same batch."""

from __future__ import annotations

import numpy as np
import pytest

from gradexp.training import telemetry

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

STEP = ["model.width=16", "trainer.batch_size=32", "clipping=global_norm",
        "clipping.max_norm=5.0"]  # small enough to bite: post < pre


def by_layer(variables, tensors) -> dict[str, float]:
    squares: dict[str, float] = {}
    for v, t in zip(variables, tensors, strict=True):
        layer = v.path.split("/")[0]
        squares[layer] = squares.get(layer, 0.0) + float(np.sum(np.square(np.float64(t))))
    return {layer: np.sqrt(s) for layer, s in squares.items()}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("xla", [True, False])
def test_each_per_layer_norm_equals_one_computed_by_hand(make_cfg, tmp_path, optimizer, xla):
    from conftest import first_call, started
    from gradexp._tf import tf
    from gradexp.parts import data
    from gradexp.training.step import task_loss

    cfg = make_cfg(*STEP, f"optimizer={optimizer}", f"trainer.jit_compile={str(xla).lower()}")
    run, engine = started(cfg, tmp_path, 1)
    compiled, arrays = run.step, run.arrays
    params = compiled.model.trainable_variables
    train_batches = data.training_batches(arrays, 32, cfg.seed)
    x, y = next(iter(train_batches))  # the batch of step 1: the order is a function of the seed
    before = [v.numpy().copy() for v in params]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(task_loss(arrays.num_classes)(y, compiled.model(x, training=True)))
    grads = [g.numpy() for g in tape.gradient(loss, params)]
    rows, step_grads = first_call(run, engine, 1)
    # the histograms' gradients: the step's own (summed loss: trainer.loss_reduction=sum)
    for g, h in zip(grads, step_grads, strict=True):
        np.testing.assert_allclose(h, g, rtol=1e-5, atol=1e-7)
    measured = {name: column[0] for name, column in rows.items()}
    after = [v.numpy() for v in params]

    layers = telemetry.layer_names(params)
    assert layers == ["dense_1", "dense_2", "dense_3", "head"]
    g, w0, w1 = by_layer(params, grads), by_layer(params, before), by_layer(params, after)
    dw = by_layer(params, [a - b for a, b in zip(after, before, strict=True)])
    total = np.sqrt(sum(n ** 2 for n in g.values()))
    assert total > 5.0  # the clip bites: every layer's gradient is scaled by 5 / ‖g‖
    for layer in layers:
        assert measured[f"param_grad_norm/{layer}"] == pytest.approx(g[layer], rel=1e-4)
        assert measured[f"param_grad_norm/{layer}/post"] == pytest.approx(
            g[layer] * 5.0 / total, rel=1e-4)
        assert measured[f"update_norm/{layer}"] == pytest.approx(dw[layer], rel=1e-4)
        assert measured[f"param_norm/{layer}"] == pytest.approx(w1[layer], rel=1e-5)
        assert measured[f"update_ratio/{layer}"] == pytest.approx(dw[layer] / w0[layer],
                                                                   rel=1e-4)
        if optimizer == "sgd":  # the first step of SGD with momentum: Δθ = −lr · clipped g
            assert dw[layer] == pytest.approx(
                cfg.optimizer.learning_rate * g[layer] * 5.0 / total, rel=1e-4)
        else:  # Adam's first step, per element: lr·|ĝ| / (|ĝ| + ε/√(1 − β₂)), ĝ the clipped g
            opt = compiled.optimizer
            eps = opt.epsilon / np.sqrt(1 - opt.beta_2)
            steps = [np.abs(gv) * 5.0 / total for v, gv in zip(params, grads, strict=True)
                     if v.path.startswith(layer + "/")]
            by_hand = opt.learning_rate.numpy() * np.sqrt(
                sum(np.sum(np.square(s / (s + eps))) for s in steps))
            assert dw[layer] == pytest.approx(by_hand, rel=1e-3)

def test_agc_in_the_step_leaves_the_output_layer_unclipped(make_cfg, tmp_path):
    """clipping=agc, exclude_output=true, a tight factor: the step hands the clipper the output
    layer's parameters, which pass unclipped (head's ‖g‖ after = before) while every hidden
    layer's gradient shrinks."""
    from conftest import first_steps

    cfg = make_cfg("model.width=8", "clipping=agc", "clipping.factor=0.001",
                   "clipping.exclude_output=true", "trainer.jit_compile=false")
    _, rows, _ = first_steps(cfg, tmp_path, 1)
    measured = {name: column[0] for name, column in rows.items()}
    assert measured["param_grad_norm/head/post"] == measured["param_grad_norm/head"] > 0
    for layer in ("dense_1", "dense_2", "dense_3"):
        assert measured[f"param_grad_norm/{layer}/post"] < measured[f"param_grad_norm/{layer}"]
    assert measured["param_clip/clipped"] == 1.0


def test_the_switch_turns_the_telemetry_off_and_names_its_columns(make_cfg):
    from gradexp.parts import data
    from gradexp.training.step import make_step, metric_names

    cfg = make_cfg("model.width=8", "trainer.layer_norms=false")
    compiled = make_step(cfg, data.load(cfg.dataset))
    assert compiled.telemetry == ()
    assert not any(n.startswith(("param_grad_norm/", "update_norm/")) for n in compiled.names)
    # the defaults (no loss scaling, no spike skip, no telemetry): a float32 run without either
    one_layer = ["loss/train", "grad_norm/global", "grad_norm/global/post", "param_clip/threshold",
                 "param_clip/clipped", "learning_rate", "grad_norm/dense_1/pre",
                 "grad_norm/dense_1/post", "clip_fraction/dense_1"]
    assert metric_names(["dense_1"]) == one_layer
    assert list(compiled.names) == metric_names(["dense_1", "dense_2", "dense_3"])
    assert compiled.val_names == ("loss/val", "accuracy/val")  # no error threshold: no rate
    assert telemetry.metric_names(["dense_1"]) == [
        "param_grad_norm/dense_1", "param_grad_norm/dense_1/post", "update_norm/dense_1",
        "param_norm/dense_1", "update_ratio/dense_1"]


# ------------------------------------------------------------------ spike detection and skip
def spike_reference(xs, z_t, warmup, alpha):
    """gradexp/training/spikes.py's rule written out in numpy (float64), for one series of (loss,
    norm)."""
    mean, var, seen, skipped = np.zeros(2), np.zeros(2), 0, []
    for x in np.asarray(xs, dtype=np.float64):
        z = (x - mean) / (np.sqrt(var) + 1e-12)
        skip = (not np.isfinite(x).all()) or (seen >= warmup and (z > z_t).any())
        skipped.append(skip)
        if skip:
            continue
        seen += 1
        if seen <= warmup:  # Welford
            new_mean = mean + (x - mean) / seen
            var = (var * (seen - 1) + (x - mean) * (x - new_mean)) / seen
            mean = new_mean
        else:
            mean = alpha * mean + (1 - alpha) * x
            var = alpha * var + (1 - alpha) * (x - mean) ** 2
    return np.array(skipped), mean, var


def test_the_spike_detector_follows_its_rule_step_by_step():
    from gradexp._tf import tf
    from gradexp.training.spikes import SpikeDetector

    rng = np.random.default_rng(0)
    loss = 2.0 + 0.05 * rng.standard_normal(60)
    norm = 10.0 + 0.5 * rng.standard_normal(60)
    loss[[5, 30, 31]] *= 4  # a spike in the warm-up (not skipped), two in a row later
    norm[[45]] *= 6
    loss[50] = np.inf
    detector = SpikeDetector(z=4.0, warmup=10, alpha=0.9)
    step = tf.function(detector.update)
    state, skipped = detector.init(), []
    for a, b in zip(loss, norm, strict=True):
        skip, state = step(state, tf.constant(a, tf.float32), tf.constant(b, tf.float32))
        skipped.append(bool(skip))
    expected, mean, var = spike_reference(np.stack([loss, norm], 1).astype(np.float32), 4.0,
                                          10, 0.9)
    np.testing.assert_array_equal(skipped, expected)
    assert list(np.flatnonzero(skipped)) == [30, 31, 45, 50]  # not the warm-up's, step 5
    np.testing.assert_allclose(state.mean.numpy(), mean, rtol=1e-5)
    np.testing.assert_allclose(state.var.numpy(), var, rtol=1e-4)
    assert int(state.seen.numpy()) == 60 - 4


def test_the_step_feeds_its_spike_detector_the_loss_and_norm_it_logs(make_cfg, tmp_path):
    """on_spike=skip in a compiled step, 60 steps: the rows marked spike_skipped, and the
    detector's statistics after them, are the rule's (spike_reference) on the step's own
    (loss/train, grad_norm/global) rows: the detector sees what the table shows."""
    from conftest import first_steps

    cfg = make_cfg("model.width=8", "dataset=digits", "trainer.on_spike=skip",
                   "trainer.spike_z=1", "trainer.spike_warmup=10", "trainer.jit_compile=false",
                   "trainer.layer_norms=false")
    run, column, _ = first_steps(cfg, tmp_path, 60)
    series = np.stack([column["loss/train"], column["grad_norm/global"]], 1)
    expected, mean, var = spike_reference(series, 1.0, 10, cfg.trainer.spike_alpha)
    np.testing.assert_array_equal(column["spike_skipped"] == 1, expected)
    assert 0 < expected.sum() < 50
    seen, detector_mean, detector_var = (v.numpy() for v in run.state.carry)
    assert seen == 60 - expected.sum()
    np.testing.assert_allclose(detector_mean, mean, rtol=1e-5)
    np.testing.assert_allclose(detector_var, var, rtol=1e-4)


def test_a_skipped_step_leaves_the_weights_alone_and_is_counted(make_cfg, tmp_path):
    """on_spike=skip with a low bar (z > 1: a noisy loss crosses it often): the rows marked
    spike_skipped have update_norm 0 in every layer, the others not; summary.json counts them.
    (A call of one step each: every step's row measures the per-layer norms.)"""
    import pandas as pd

    from gradexp.train import train

    cfg = make_cfg("model.width=16", "dataset=digits",
                   "trainer.steps=100", "trainer.log_every=1", "trainer.eval_every=100",
                   "trainer.histogram_every=0", "trainer.on_spike=skip", "trainer.spike_z=1",
                   "trainer.spike_warmup=10", "trainer.on_divergence=continue")
    summary = train(cfg, tmp_path)
    table = pd.read_csv(tmp_path / "metrics.csv")
    skipped = table["spike_skipped"] == 1
    assert summary["spike_skipped_steps"] == int(skipped.sum()) > 0
    updates = table.filter(like="update_norm/")
    assert (updates[skipped] == 0).all().all()
    assert (updates[~skipped] > 0).all().all()
    assert not skipped.iloc[:10].any()  # the warm-up
