"""The seed's arithmetic, exactly, in every execution mode; the layer's statistics."""

from __future__ import annotations

import numpy as np
import pytest

from gradexp._tf import keras, tf
from gradexp.parts.layers import STATS, ClipGradient, clip_gradient

MODES = {
    "eager": lambda f: f,
    "tf.function": tf.function,
    "jit_compile": lambda f: tf.function(f, jit_compile=True),
}


def value_and_grad(mode, x, **kwargs):
    x = tf.Variable(x)

    def f():
        with tf.GradientTape() as tape:
            y = clip_gradient(x, **kwargs)
        return y, tape.gradient(y, x)

    y, dx = MODES[mode](f)()
    return y.numpy(), dx.numpy()


@pytest.mark.parametrize("mode", MODES)
def test_seed_table(mode):
    # x = [1.0], forward 3·x, backward clip_by_value(dy, -0.1, 0.1) → output 3.0, gradient 0.1
    y, dx = value_and_grad(mode, [1.0], clip_min=-0.1, clip_max=0.1, scale=3.0)
    assert y.tolist() == [3.0] and dx.tolist() == [np.float32(0.1)]
    # a plain identity: output 1.0, gradient 1.0
    y, dx = value_and_grad(mode, [1.0])
    assert y.tolist() == [1.0] and dx.tolist() == [1.0]


@pytest.mark.parametrize("mode", MODES)
def test_backward_matches_tf_clip_by_value(mode):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7)).astype(np.float32)
    upstream = rng.normal(size=(5, 7)).astype(np.float32)
    xv = tf.Variable(x)

    def f():
        with tf.GradientTape() as tape:
            y = clip_gradient(xv, -0.3, 0.5, 2.0, -1.5)
            loss = tf.reduce_sum(y * upstream)
        return y, tape.gradient(loss, xv)

    y, dx = MODES[mode](f)()
    np.testing.assert_array_equal(y.numpy(), 2.0 * x)
    # the backward pass ignores `scale`, applies grad_scale, then clips
    np.testing.assert_array_equal(dx.numpy(), tf.clip_by_value(-1.5 * upstream, -0.3, 0.5))


def test_one_sided_bounds_and_reversal():
    _, dx = value_and_grad("eager", [1.0, 1.0], clip_max=0.25)
    assert dx.tolist() == [0.25, 0.25]
    _, dx = value_and_grad("eager", [1.0], clip_min=2.0)  # a lower bound above dy lifts it
    assert dx.tolist() == [2.0]
    _, dx = value_and_grad("eager", [1.0], grad_scale=-1.0)  # gradient reversal
    assert dx.tolist() == [-1.0]


def test_non_finite_gradients_are_not_clipped():
    x = tf.Variable([1.0, 1.0, 1.0])
    upstream = tf.constant([np.inf, -np.inf, np.nan])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(clip_gradient(x, -0.1, 0.1) * upstream)
    dx = tape.gradient(loss, x).numpy()
    assert dx[0] == np.inf and dx[1] == -np.inf and np.isnan(dx[2])


@pytest.mark.parametrize("mode", MODES)
def test_layer_statistics_are_the_probe_gradient(mode):
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(8, 6)).astype(np.float32))
    upstream = rng.normal(scale=0.2, size=(8, 6)).astype(np.float32)
    layer = ClipGradient(-0.1, 0.2, grad_scale=2.0)
    layer.build(x.shape)

    def f():
        with tf.GradientTape() as tape:
            tape.watch(layer.gradient_stats.value)
            loss = tf.reduce_sum(layer(x) * upstream)
        return tape.gradient(loss, layer.gradient_stats.value)

    stats = dict(zip(STATS, MODES[mode](f)().numpy(), strict=True))
    g = 2.0 * upstream
    dx = np.clip(g, -0.1, 0.2)
    assert stats["sum_sq_pre"] == pytest.approx(np.sum(g.astype(np.float64) ** 2), rel=1e-6)
    assert stats["sum_sq_post"] == pytest.approx(np.sum(dx.astype(np.float64) ** 2), rel=1e-6)
    assert stats["clipped"] == np.sum(g != dx) > 0
    assert stats["count"] == g.size


def test_layer_config_round_trip_and_saved_model(tmp_path):
    layer = ClipGradient(clip_min=-0.1, clip_max=0.2, scale=3.0, grad_scale=-1.0, name="clip_a")
    clone = ClipGradient.from_config(layer.get_config())
    for key in ("clip_min", "clip_max", "scale", "grad_scale", "name"):
        assert getattr(clone, key) == getattr(layer, key)

    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(layer(inputs)))
    model.save(tmp_path / "m.keras")
    reloaded = keras.models.load_model(tmp_path / "m.keras")
    x = tf.constant([[1.0, -2.0, 0.5]])
    np.testing.assert_array_equal(model(x), reloaded(x))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        a, b = tf.reduce_sum(model(x) * 5.0), tf.reduce_sum(reloaded(x) * 5.0)
    np.testing.assert_array_equal(tape.gradient(a, x), tape.gradient(b, x))
    assert reloaded.get_layer("clip_a").get_config() == layer.get_config()


def test_bounds_in_the_wrong_order_are_refused():
    with pytest.raises(ValueError, match="clip_min"):
        ClipGradient(clip_min=1.0, clip_max=0.0)


def backward(dy, dtype=tf.float32, **kwargs):
    """dx of clip_gradient for upstream gradient dy (x = ones of dy's shape, in `dtype`)."""
    x = tf.ones(dy.shape, dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(clip_gradient(x, **kwargs) * tf.cast(dy, dtype))
    return tape.gradient(loss, x)


@pytest.mark.parametrize("mode", MODES)
def test_norm_bound_per_batch_and_per_example_match_tf_clip_by_norm(mode):
    dy = tf.constant(np.random.default_rng(2).normal(size=(4, 3, 5)).astype(np.float32))
    per_batch = MODES[mode](lambda: backward(dy, max_norm=1.5))()
    np.testing.assert_allclose(per_batch, tf.clip_by_norm(dy, 1.5), rtol=1e-6)
    per_example = MODES[mode](lambda: backward(dy, max_norm=1.5, norm_axis="example"))()
    expected = tf.stack([tf.clip_by_norm(dy[i], 1.5) for i in range(4)])
    np.testing.assert_allclose(per_example, expected, rtol=1e-6)
    large = MODES[mode](lambda: backward(dy, max_norm=1e6, norm_axis="example"))()
    np.testing.assert_array_equal(large, dy)  # a bound above every norm is the identity


@pytest.mark.parametrize("mode", MODES)
def test_per_example_norm_of_a_rank_1_input_bounds_each_element(mode):
    # shape (3,): three examples of one element each, the same as shape (3, 1)
    dy = tf.constant([0.3, 0.3, 0.3])
    dx = MODES[mode](lambda: backward(dy, max_norm=0.4, norm_axis="example"))()
    columns = MODES[mode](lambda: backward(dy[:, None], max_norm=0.4, norm_axis="example"))()
    np.testing.assert_allclose(dx, [0.3, 0.3, 0.3], rtol=1e-6)  # each |dy| <= 0.4: unchanged
    np.testing.assert_allclose(dx, columns[:, 0], rtol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("kwargs", [
    {"clip_min": -0.1, "clip_max": 0.1},
    {"max_norm": 0.5, "norm_axis": "example"},
])
def test_mixed_precision_clips_in_true_units(dtype, kwargs):
    # dy arrives multiplied by the loss scale S; the layer unscales, clips, rescales
    rng = np.random.default_rng(3)
    dy = tf.constant(rng.normal(scale=0.2, size=(8, 16)).astype(np.float32))
    reference = backward(dy, **kwargs)
    loss_scale = tf.Variable(2.0**15)
    scaled = backward(dy * loss_scale, dtype, loss_scale=loss_scale, **kwargs)
    assert scaled.dtype == dtype
    true_units = tf.cast(scaled, tf.float32) / loss_scale
    tolerance = 1e-2 if dtype == tf.bfloat16 else 1e-3  # the rounding of dy to 16 bits
    np.testing.assert_allclose(true_units, reference, rtol=tolerance, atol=tolerance * 0.1)
    assert np.max(np.abs(reference)) > 0  # and the clip was active:
    assert not np.allclose(reference, dy)


def test_non_finite_dy_survives_the_loss_scale_path():
    dy = tf.constant([[np.inf, 1.0], [np.nan, -1.0]])
    dx = backward(dy, tf.float16, clip_min=-0.1, clip_max=0.1, max_norm=0.05,
                  loss_scale=tf.constant(4.0)).numpy()
    assert dx[0, 0] == np.inf and np.isnan(dx[1, 0])  # the loss-scale optimizer can skip


@pytest.mark.parametrize("dtype", [None, "float16", "mixed_float16"])
def test_the_statistics_weight_is_a_non_trainable_float32_zero_vector(dtype):
    """What the trainer relies on: `gradient_stats` is a float32 vector of 4 zeros (sums of
    squares would overflow float16) that the optimizer never sees (not trainable), saved under
    its own name whatever the layer's dtype policy."""
    layer = ClipGradient(-0.1, 0.1, dtype=dtype)
    layer.build((2, 3))
    stats = layer.gradient_stats
    assert stats.dtype == "float32" and tuple(stats.shape) == (len(STATS),)
    assert stats.numpy().tolist() == [0.0, 0.0, 0.0, 0.0]
    assert stats.path.split("/")[-1] == "gradient_stats"
    bounds = layer.clip_bounds  # the bounds as data (runs of other bounds share one step)
    assert layer.trainable_weights == [] and layer.non_trainable_weights == [stats, bounds]
    assert bounds.dtype == "float32" and bounds.path.split("/")[-1] == "clip_bounds"
    assert bounds.numpy().tolist() == [np.float32(-0.1), np.float32(0.1)]
    one_sided = ClipGradient(None, 0.1, dtype=dtype)
    one_sided.build((2, 3))
    assert one_sided.clip_bounds.numpy().tolist() == [-np.inf, np.float32(0.1)]
    whole = ClipGradient(-1, 2, dtype=dtype)  # integer bounds (`clip=1` on the command line)
    whole.build((2, 3))
    assert whole.clip_bounds.dtype == "float32"
    assert whole.clip_bounds.numpy().tolist() == [-1.0, 2.0]


def test_the_layer_follows_the_loss_scale_variable_it_is_given():
    """follow_loss_scale(S): dy arrives S times the true gradient; the layer clips g = dy / S
    and hands back S · dx, reading S when the backward pass runs (the optimizer changes it)."""
    layer = ClipGradient(-0.1, 0.1)
    x = tf.ones((1, 2))
    layer.build(x.shape)
    scale = tf.Variable(4.0)
    layer.follow_loss_scale(scale)
    true_dy = tf.constant([[0.2, 0.04]])

    def dx_and_stats():
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            tape.watch(layer.gradient_stats.value)
            loss = tf.reduce_sum(layer(x) * true_dy * scale)
        return (tape.gradient(loss, x).numpy() / scale.numpy(),
                tape.gradient(loss, layer.gradient_stats.value).numpy())

    dx, stats = dx_and_stats()
    np.testing.assert_allclose(dx, [[0.1, 0.04]], rtol=1e-6)  # true units: 0.2 clipped to 0.1
    np.testing.assert_allclose(stats, [0.2**2 + 0.04**2, 0.1**2 + 0.04**2, 1, 2], rtol=1e-6)
    scale.assign(1024.0)  # the loss scale grows: the layer reads the new value
    dx, stats = dx_and_stats()
    np.testing.assert_allclose(dx, [[0.1, 0.04]], rtol=1e-6)
    np.testing.assert_allclose(stats, [0.2**2 + 0.04**2, 0.1**2 + 0.04**2, 1, 2], rtol=1e-6)


def layer_backward(layer, dy):
    """dx and the statistics of a Keras clip layer for upstream gradient dy (x = ones)."""
    x = tf.ones(dy.shape)
    layer.build(x.shape)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        tape.watch(layer.gradient_stats.value)
        loss = tf.reduce_sum(layer(x) * dy)
    return (tape.gradient(loss, x).numpy(),
            tape.gradient(loss, layer.gradient_stats.value).numpy())


def test_the_layer_passes_its_norm_bound_and_axis():
    """Rows of norm 0.5 and 0.05, bound 0.1: per example the first row shrinks to norm 0.1
    (× 0.2, a norm below 1 divided by itself) and the second passes; per batch both shrink by
    0.1 / ‖dy‖ = 0.1 / 0.50249."""
    dy = tf.constant([[0.3, 0.4], [0.03, 0.04]])
    dx, stats = layer_backward(ClipGradient(max_norm=0.1, norm_axis="example"), dy)
    np.testing.assert_allclose(dx, [[0.06, 0.08], [0.03, 0.04]], rtol=1e-6)
    np.testing.assert_allclose(stats, [0.2525, 0.0125, 2, 4], rtol=1e-5)  # 2 elements changed
    dx, _ = layer_backward(ClipGradient(max_norm=0.1), dy)
    np.testing.assert_allclose(dx, dy.numpy() * 0.1 / np.sqrt(0.2525), rtol=1e-6)
    dx = backward(tf.constant([0.3, 0.4]), max_norm=0.1)  # the function: × 0.1 / 0.5
    np.testing.assert_allclose(dx, [0.06, 0.08], rtol=1e-6)


def test_the_unclipped_layer_reports_nothing_clipped():
    dy = tf.constant([[0.3, -0.4, 2.0]])
    dx, stats = layer_backward(ClipGradient(grad_scale=2.0), dy)
    np.testing.assert_allclose(dx, 2 * dy.numpy(), rtol=1e-6)
    np.testing.assert_allclose(stats, [4 * 4.25, 4 * 4.25, 0, 3], rtol=1e-6)


def test_a_norm_axis_that_does_not_exist_is_refused_by_name():
    with pytest.raises(ValueError, match="^norm_axis=rows: must be one of batch, example$"):
        clip_gradient(tf.ones(2), max_norm=1.0, norm_axis="rows")


def test_a_mixed_float16_layer_clips_to_its_float32_bounds():
    """Under mixed_float16 the layer computes in float16 but reads its bounds in float32 (autocast
    would make them float16, a type error in the float32 backward pass, and 0.1 would become
    0.09998): true dy = [0.2, 0.04] arrives times S = 4 in float16; dx = S · [0.1, 0.04], and the
    statistics count the one clipped element, in true units."""
    layer = ClipGradient(-0.1, 0.1, dtype="mixed_float16")
    x = tf.ones((1, 2), tf.float16)
    layer.build(x.shape)
    scale = tf.Variable(4.0)
    layer.follow_loss_scale(scale)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        tape.watch(layer.gradient_stats.value)
        y = layer(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.constant([[0.2, 0.04]]) * scale)
    assert y.dtype == tf.float16
    dx = tape.gradient(loss, x)
    assert dx.dtype == tf.float16
    assert dx.numpy().tolist() == [[np.float16(0.4), np.float16(0.16)]]
    stats = tape.gradient(loss, layer.gradient_stats.value).numpy()
    np.testing.assert_allclose(stats, [0.2**2 + 0.04**2, 0.1**2 + 0.04**2, 1, 2], rtol=1e-3)
    # the clipped element is float32's 0.1 (float16's would be 0.09998: 4e-6 less in Σdx²)
    assert stats[1] == pytest.approx(float(np.float32(0.1)) ** 2 + (float(np.float16(0.16)) / 4)
                                     ** 2, rel=1e-7)


def test_the_layer_clips_to_its_bounds_weight_without_a_retrace():
    """The bounds are data (gradexp/training/engine.py loads each run's): after assigning [−0.5,
    0.2] to `clip_bounds` the same compiled function clips dy = [0.3, −0.8, 0.1] to [0.2, −0.5, 0.1]
    where ±0.1 gave [0.1, −0.1, 0.1], and ±inf leaves it as it is; one trace for all three."""
    layer = ClipGradient(-0.1, 0.1)
    x = tf.ones((1, 3))
    layer.build(x.shape)
    dy = tf.constant([[0.3, -0.8, 0.1]])

    @tf.function
    def dx_and_stats():
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            tape.watch(layer.gradient_stats.value)
            loss = tf.reduce_sum(layer(x) * dy)
        return tape.gradient(loss, x), tape.gradient(loss, layer.gradient_stats.value)

    dx, stats = dx_and_stats()
    np.testing.assert_allclose(dx, [[0.1, -0.1, 0.1]], rtol=1e-6)
    assert stats[2] == 2
    layer.clip_bounds.assign([-0.5, 0.2])
    dx, stats = dx_and_stats()
    np.testing.assert_allclose(dx, [[0.2, -0.5, 0.1]], rtol=1e-6)
    assert stats[2] == 2
    layer.clip_bounds.assign([-np.inf, np.inf])
    dx, stats = dx_and_stats()
    np.testing.assert_array_equal(dx, dy)
    assert stats[2] == 0
    assert dx_and_stats.experimental_get_tracing_count() == 1


def test_the_unclipped_function_reports_nothing_clipped():
    """clip_gradient with no bound (the function form; the layer always passes its bounds
    weight) takes the baseline's path: dx = grad_scale · dy and the statistics
    [Σg², Σg², 0, n] with g = 2 · [0.3, −0.4, 2.0]."""
    x = tf.ones((1, 3))
    probe = tf.zeros([len(STATS)])
    dy = tf.constant([[0.3, -0.4, 2.0]])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, probe])
        loss = tf.reduce_sum(clip_gradient(x, grad_scale=2.0, stats=probe) * dy)
    np.testing.assert_allclose(tape.gradient(loss, x), 2 * dy.numpy(), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(loss, probe), [4 * 4.25, 4 * 4.25, 0, 3],
                               rtol=1e-6)
