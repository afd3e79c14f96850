"""Two exact known answers, each a one-parameter model and dataset run through the trainer
(model=keras, dataset=arrays: the way in a user has), its parameter read from the run's own
telemetry (`param_norm/w` = |x|, logged at every logged step).

Clipping bias (Chen, Wu & Hong 2020; Koloskova et al. 2023): f(x) = E ½(x − a)², a = −3 with
probability 2/3 and 9 with 1/3 (optimum 1). Clipped SGD at threshold c settles where the
clipped gradient's mean is zero: (2/3)·clip(x + 3) + (1/3)·clip(x − 9) = 0, so x = −3 + c/2
while c/2 < 4, i.e. −2.5, −2, −1 and 1 for c = 1, 2, 4, 8 at batch size 1. At batch size 2 with
a mean loss the clip acts on the pair's mean gradient: 4/9·clip(x + 3) + 4/9·clip(x − 3) +
1/9·clip(x − 9) = 0 gives x = 2.25 for c = 1 (4/9 − 4/9·0.75 − 1/9 = 0).

(L0, L1)-smoothness (Zhang, He, Sra & Jadbabaie 2020): f(x) = x⁴/4, gradient x³. Gradient
descent at η = 1.9/x0² needs 233, 2,626 and 23,677 steps to reach |x| ≤ 0.1 from x0 = 3, 10, 30
and diverges at η = 2.1/x0²; clipped gradient descent (η = 0.5, threshold 1) needs 99, 113 and
153. The counts are float64's; the float32 recurrence gives the same counts (checked below), so
the trainer, in float32, must hit them exactly.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import pytest

from gradexp import api

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

ONE_PARAMETER = textwrap.dedent('''
    import keras
    import numpy as np


    def weight(input_shape, num_outputs, x0=0.0):
        """out = x · 1: the model is its one parameter x."""
        inputs = keras.Input(input_shape)
        w = keras.layers.Dense(1, use_bias=False, name="w",
                               kernel_initializer=keras.initializers.Constant(x0))
        return keras.Model(inputs, w(inputs))


    def half_square(y, out):
        return 0.5 * (out[:, 0] - y) ** 2


    def quartic(y, out):
        return (out[:, 0] - y) ** 4 / 4


    def targets(values=(-3.0, -3.0, 9.0), copies=1):
        """Inputs 1, targets `values` (each `copies` times); validated on the same."""
        y = np.repeat(np.asarray(values, np.float32), copies)
        x = np.ones((len(y), 1), np.float32)
        return (x, y), (x, y)
''')

COMMON = ["model=keras", "model.build=known:weight", "dataset=arrays",
          "dataset.load=known:targets", "optimizer=sgd", "optimizer.momentum=0.0",
          "layer.positions=[]", "trainer.histogram_every=0", "trainer.checkpoint_every=0",
          "trainer.divergence_factor=1e30"]


@pytest.fixture
def known(tmp_path, monkeypatch):
    (tmp_path / "known.py").write_text(ONE_PARAMETER)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def final_x(run_dir) -> float:
    """x at the end, from the run's last checkpoint (the one (1, 1) kernel in it)."""
    from gradexp._tf import tf

    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    kernels = [n for n, shape in reader.get_variable_to_shape_map().items() if shape == [1, 1]]
    values = {float(reader.get_tensor(n).ravel()[0]) for n in kernels}
    assert len(values) == 1, kernels
    return values.pop()


def trajectory(run_dir) -> np.ndarray:
    """|x| at each logged step."""
    return pd.read_csv(run_dir / "metrics.csv")["param_norm/w"].dropna().to_numpy()


@pytest.mark.parametrize("c, settles_at", [(1.0, -2.5), (2.0, -2.0), (4.0, -1.0), (8.0, 1.0)])
def test_clipped_sgd_settles_where_the_clipped_gradient_has_mean_zero(known, c, settles_at):
    """Batch size 1 on the three targets, each epoch all three in a fresh order: the epoch's
    mean clipped gradient is the expectation's, so the iterate stays within O(η·c) of −3 + c/2.
    It starts at the optimum, 1, and moves away from it."""
    summary = api.run(known / f"c{c}", *COMMON, "model.loss=known:half_square",
                      "model.kwargs.x0=1.0", "clipping=value", f"clipping.max_value={c}",
                      "trainer.batch_size=1", "optimizer.learning_rate=0.002",
                      "trainer.steps=12000", "trainer.log_every=3", "trainer.eval_every=12000")
    assert summary["status"] == "completed"
    settled = trajectory(known / f"c{c}")[-1500:]  # the last 4,500 steps
    assert abs(np.mean(settled) - abs(settles_at)) < 0.03, np.mean(settled)
    assert abs(final_x(known / f"c{c}") - settles_at) < 0.1  # its sign: −1, not the optimum 1


def test_at_batch_size_2_the_clip_acts_on_the_batchs_mean_gradient(known):
    """Pairs drawn (nearly) independently from 1,000 copies of the three targets; from the
    optimum, 1, the iterate moves to 2.25 (the mean clipped gradient is −1/9 on [1, 2], then
    (4/9)(x − 2.25)); its mean over the last 10,000 steps is within ~0.02 of it (σ ≈ 0.07, τ ≈
    450 steps)."""
    summary = api.run(known / "pairs", *COMMON, "model.loss=known:half_square",
                      "model.kwargs.x0=1.0", "dataset.kwargs.copies=1000",
                      "trainer.loss_reduction=mean", "clipping=value", "clipping.max_value=1.0",
                      "trainer.batch_size=2", "optimizer.learning_rate=0.005",
                      "trainer.steps=16000", "trainer.log_every=10", "trainer.eval_every=16000")
    assert summary["status"] == "completed"
    settled = trajectory(known / "pairs")[-1000:]  # the last 10,000 steps
    assert abs(np.mean(settled) - 2.25) < 0.06, np.mean(settled)  # batch size 1: −2.5


def steps_to(x0: float, eta: float, clip: float | None, dtype) -> int | None:
    """The recurrence x ← x − η·clip(x³): steps until |x| ≤ 0.1, None if it blows up."""
    x, eta = dtype(x0), dtype(eta)
    for t in range(1, 100_000):
        g = x ** 3 if clip is None else np.clip(x ** 3, -clip, clip)
        x = dtype(x - eta * g)
        if abs(x) <= 0.1:
            return t
        if not abs(x) < 1e6:
            return None
    return None


@pytest.mark.parametrize("x0, plain, clipped", [(3.0, 233, 99), (10.0, 2626, 113),
                                               (30.0, 23677, 153)])
def test_l0_l1_smooth_quartic_step_counts(known, x0, plain, clipped):
    """The trainer runs plain gradient descent from x0 = 3 and 10 (233 and 2,626 steps); from
    30 its 23,677 steps are the recurrence's alone (the trainer's arithmetic is the same at
    every step, and a run of them would take the suite a minute)."""
    for dtype in (np.float64, np.float32):
        assert steps_to(x0, 1.9 / x0 ** 2, None, dtype) == plain
        assert steps_to(x0, 0.5, 1.0, dtype) == clipped
        assert steps_to(x0, 2.1 / x0 ** 2, None, dtype) is None
    trained = [("plain", plain, 1.9 / x0 ** 2, ["clipping=none"]),
               ("clipped", clipped, 0.5, ["clipping=value", "clipping.max_value=1.0"])]
    for name, steps, eta, clipping in trained[x0 > 10:]:
        run = known / f"{name}{x0:g}"
        summary = api.run(run, *COMMON, "model.loss=known:quartic", f"model.kwargs.x0={x0}",
                          "dataset.kwargs.values=[0.0]", "trainer.batch_size=1",
                          f"optimizer.learning_rate={eta!r}", f"trainer.steps={steps + 5}",
                          "trainer.log_every=1", f"trainer.eval_every={steps + 5}", *clipping)
        assert summary["status"] == "completed"
        x = trajectory(run)  # |x| after steps 1, 2, ...
        assert int(np.argmax(x <= 0.1)) + 1 == steps, (name, x[steps - 3:steps + 1])
