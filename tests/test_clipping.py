"""Parameter-gradient clipping: Keras' own clipping, the papers' rules re-implemented in NumPy,
and the properties every method must have."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from omegaconf import OmegaConf

from gradexp import config
from gradexp._tf import keras, tf
from gradexp.parts.clipping import METHODS, make_clipper

MODES = {
    "eager": lambda f: f,
    "tf.function": tf.function,
    "jit_compile": lambda f: tf.function(f, jit_compile=True),
}
# A setting of every method that clips the gradients below, and one that bounds nothing.
ACTIVE = {
    "none": {},
    "value": {"max_value": 0.5},
    "norm": {"max_norm": 1.0},
    "global_norm": {"max_norm": 1.0},
    "agc": {"factor": 0.05, "eps": 1e-3, "exclude_output": False},
    "autoclip": {"percentile": 10.0, "history": 100},
    "zclip": {"alpha": 0.97, "z_threshold": 2.5, "warmup_steps": 3},
    "adagc": {"clip_ratio": 1.04, "beta": 0.99, "warmup_steps": 3, "warmup_max_norm": 1.0},
}
LOOSE = {**ACTIVE, "value": {"max_value": 1e30}, "norm": {"max_norm": 1e30},
         "global_norm": {"max_norm": 1e30}, "agc": {**ACTIVE["agc"], "factor": 1e30},
         "autoclip": {**ACTIVE["autoclip"], "percentile": 100.0},
         "zclip": {**ACTIVE["zclip"], "z_threshold": 1e30},
         "adagc": {**ACTIVE["adagc"], "clip_ratio": 1e30, "warmup_max_norm": None}}


# the methods without state; checked against their state below. Written out, not computed: a
# parametrize list computed at import would make TensorFlow variables while pytest collects, and a
# process forked after that (mutmut's fork server forks each mutant's run) hangs in its first op
STATELESS = ("none", "value", "norm", "global_norm", "agc")


def keeps_state(name: str) -> bool:
    params = [tf.Variable(tf.ones(2))]
    cfg = OmegaConf.create({"name": name, **ACTIVE[name]})
    return bool(make_clipper(cfg, params).init(params)._fields)


def test_every_registered_method_has_settings_for_the_shared_tests():
    """The shared tests below run every method the registry holds (clipping=function's are
    the user's code, tested by tests/test_extending.py)."""
    assert set(ACTIVE) == set(METHODS) - {"function"}
    stateless = tuple(m for m in ACTIVE if not keeps_state(m))
    assert stateless == STATELESS  # as their state says
STATS = {"norm_before", "norm_after", "threshold", "clipped"}


class Stateful:
    """A method with its state held in variables between calls, as a run holds it (the carry of
    gradexp/training/checkpoints.py): `clipper(grads, params)` -> (grads, stats);
    `state_variables`."""

    def __init__(self, method, params):
        self.method, self.initial = method, method.init(params)
        self.state_variables = [tf.Variable(v, trainable=False) for v in self.initial]

    def __call__(self, grads, params):
        state = type(self.initial)(*(tf.convert_to_tensor(v) for v in self.state_variables))
        out, state, stats = self.method.update(grads, state, params)
        for v, value in zip(self.state_variables, state, strict=True):
            v.assign(value)
        return out, stats


def stateful(cfg, params, output_params=None):
    return Stateful(make_clipper(cfg, params, output_params=output_params), params)


def clipper_for(method, settings, params):
    return stateful(OmegaConf.create({"name": method, **settings}), params)


def variables(arrays):
    return [tf.Variable(a, name=f"p{i}") for i, a in enumerate(arrays)]


def as_numpy(tensors):
    return [np.asarray(t) for t in tensors]


def global_norm64(arrays):
    return float(np.sqrt(sum(np.sum(np.asarray(a, np.float64) ** 2) for a in arrays)))


# ------------------------------------------------------------ a fixed sequence of gradients
# Global norms step by step: noise around 1, a spike during ZClip's 25-step warm-up (step 9),
# isolated and back-to-back spikes after it.
NORMS = [
    1.00, 1.10, 0.95, 1.05, 0.90, 1.20, 1.01, 0.85, 7.00, 1.11,
    0.96, 1.02, 1.15, 0.91, 1.06, 1.03, 0.97, 1.12, 0.92, 1.04,
    1.07, 0.98, 1.21, 0.93, 1.08,
    1.13, 0.99, 1.09, 5.00, 1.14, 0.94, 1.16, 30.0, 25.0, 1.17,
    0.89, 1.18, 1.22, 0.88, 1.19, 4.00, 1.23, 0.87, 1.24, 1.25,
    0.86, 1.26, 60.0, 1.27, 0.84, 1.28, 1.29, 2.50, 0.83, 1.30,
]  # all different, so that no percentile falls on a tie between two float32 roundings
SHAPES = [(3, 2), (2,)]


def pattern(step, shape, offset):
    k = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return np.sin(0.7 * step + 1.3 * k + offset) + 0.5 * np.cos(0.3 * step * (k + 1))


def gradients_at(step, shapes=SHAPES, norm=None):
    """float32 gradients with global norm NORMS[step] (or `norm`), a direction that turns."""
    raw = [pattern(step, s, i) for i, s in enumerate(shapes)]
    scale = (NORMS[step] if norm is None else norm) / global_norm64(raw)
    return [(r * scale).astype(np.float32) for r in raw]


def run_compiled(clipper, params, gradient_list):
    """The clipper inside one tf.function, as the trainer calls it, over a list of steps."""
    step = tf.function(lambda grads: clipper(grads, params))
    outputs = []
    for grads in gradient_list:
        out, stats = step([tf.constant(g) for g in grads])
        outputs.append((as_numpy(out), {k: float(v) for k, v in stats.items()}))
    return outputs


# ------------------------------------------------------------ value, norm, global_norm = Keras
def small_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
                             keras.layers.Dense(2)])


def loss_gradients(model, x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(model(x) - y))  # targets far off: large gradients
    return tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize(("method", "settings", "keras_clipping"), [
    ("value", {"max_value": 0.5}, {"clipvalue": 0.5}),
    ("norm", {"max_norm": 1.0}, {"clipnorm": 1.0}),
    ("global_norm", {"max_norm": 1.0}, {"global_clipnorm": 1.0}),
])
def test_one_sgd_step_matches_keras_own_clipping(method, settings, keras_clipping):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(16, 4)).astype(np.float32))
    y = tf.constant(rng.normal(loc=5.0, size=(16, 2)).astype(np.float32))
    ours, theirs = small_model(), small_model()
    theirs.set_weights(ours.get_weights())
    start = ours.get_weights()

    clipper = clipper_for(method, settings, ours.trainable_variables)
    grads, stats = clipper(loss_gradients(ours, x, y), ours.trainable_variables)
    keras.optimizers.SGD(0.01).apply(grads, ours.trainable_variables)
    keras.optimizers.SGD(0.01, **keras_clipping).apply(loss_gradients(theirs, x, y),
                                                       theirs.trainable_variables)

    assert float(stats["clipped"]) == 1.0 and float(stats["norm_before"]) > 10
    for a, b, w0 in zip(ours.get_weights(), theirs.get_weights(), start, strict=True):
        np.testing.assert_array_equal(a, b)  # bit for bit: the same expressions as Keras 3
        assert not np.array_equal(a, w0)
    unclipped = small_model()
    unclipped.set_weights(start)
    keras.optimizers.SGD(0.01).apply(loss_gradients(unclipped, x, y),
                                     unclipped.trainable_variables)
    assert not np.allclose(unclipped.get_weights()[0], ours.get_weights()[0], rtol=1e-3)


# ------------------------------------------------------------ AGC = nfnets' rule
def unitwise_norm_reference(x):
    """nfnets/timm: a vector or scalar is one unit; a kernel (…, in, out) has one per output.
    (nfnets reduces axis 0 of a 2-D and axes 0-2 of a 4-D kernel: the same as here.)"""
    x = np.asarray(x, np.float64)
    if x.ndim <= 1:
        return np.sqrt(np.sum(x**2))
    return np.sqrt(np.sum(x**2, axis=tuple(range(x.ndim - 1)), keepdims=True))


def agc_reference(grads, params, factor, eps, skip):
    """deepmind-research nfnets/optim.py SGD_AGC.update_param, the clipping part."""
    out = []
    for g, w, skipped in zip(grads, params, skip, strict=True):
        if skipped:
            out.append(g)
            continue
        max_norm = np.maximum(unitwise_norm_reference(w), eps) * factor
        grad_norm = unitwise_norm_reference(g)
        clipped = g * (max_norm / np.maximum(grad_norm, 1e-6))
        out.append(np.where(grad_norm > max_norm, clipped, g))
    return out


AGC_SHAPES = [(3, 2), (2,), (2, 2, 3, 4), (4,), (2, 3)]  # Dense, bias, Conv, bias, output kernel
AGC_SKIP = [False, False, False, False, True]


def agc_params_at(step):
    """Weights that grow as training goes; the biases start at zero (the eps floor bites)."""
    params = [np.cos(1.7 * np.arange(int(np.prod(s))) + i).reshape(s) * (1 + 0.05 * step)
              for i, s in enumerate(AGC_SHAPES)]
    if step < 10:
        params[1] = np.zeros(AGC_SHAPES[1])
    return [p.astype(np.float32) for p in params]


def test_agc_matches_nfnets_step_by_step():
    factor, eps = 0.5, 1e-3
    steps = range(len(NORMS))
    grads = [gradients_at(t, AGC_SHAPES) for t in steps]
    params = variables(agc_params_at(0))
    clipper = stateful(OmegaConf.create({"name": "agc", "factor": factor, "eps": eps,
                                             "exclude_output": True}),
                           params, output_params=AGC_SKIP)
    step = tf.function(lambda g: clipper(g, params))
    clipped_units = 0
    for t in steps:
        w = agc_params_at(t)
        for v, value in zip(params, w, strict=True):
            v.assign(value)
        out, stats = step([tf.constant(g) for g in grads[t]])
        expected = agc_reference(grads[t], w, factor, eps, AGC_SKIP)
        for a, b in zip(as_numpy(out), expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(out[-1], grads[t][-1])  # the output layer: untouched
        changed = sum(int(np.sum(unitwise_norm_reference(a - g) > 0))
                      for a, g in zip(expected, grads[t], strict=True))
        clipped_units += changed
        assert float(stats["clipped"]) == float(changed > 0)
        assert float(stats["threshold"]) == pytest.approx(factor)
    assert clipped_units > 20  # the rule was exercised, not only the identity


# ------------------------------------------------------------ AutoClip = the paper's code
class AutoClipReference:
    """github.com/pseeth/autoclip autoclip.py: append the norm, then np.percentile of the history.
    (It rescales with torch's clip_grad_norm_, by T / (norm + 1e-6); gradexp rescales to T.)"""

    def __init__(self, percentile, history):
        self.percentile, self.history = percentile, collections.deque(maxlen=history)

    def step(self, grads):
        norm = global_norm64(grads)
        self.history.append(norm)
        threshold = float(np.percentile(np.array(self.history), self.percentile))
        if norm > threshold:
            return [g * (threshold / norm) for g in grads], threshold, True
        return grads, threshold, False


@pytest.mark.parametrize(("percentile", "history"), [(10.0, 16), (50.0, 10000)])
def test_autoclip_matches_the_papers_rule_step_by_step(percentile, history):
    grads = [gradients_at(t) for t in range(len(NORMS))]
    params = variables([np.zeros(s, np.float32) for s in SHAPES])
    clipper = clipper_for("autoclip", {"percentile": percentile, "history": history}, params)
    reference = AutoClipReference(percentile, history)
    decisions = []
    for g, (out, stats) in zip(grads, run_compiled(clipper, params, grads), strict=True):
        expected, threshold, clipped = reference.step(g)
        norm = global_norm64(g)
        assert norm == threshold or abs(norm - threshold) > 1e-4 * threshold  # no coin flips
        assert stats["clipped"] == float(clipped)
        assert stats["threshold"] == pytest.approx(threshold, rel=1e-5)
        for a, b in zip(out, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        decisions.append(clipped)
    assert 5 < sum(decisions) < len(decisions) - 5


# ------------------------------------------------------------ ZClip = the reference code
class ZClipReference:
    """github.com/bluorion-com/ZClip zclip.py, mode="zscore", clip_option="adaptive_scaling",
    max_grad_norm=None: the same statements in the same order, in float64."""

    def __init__(self, alpha, z_thresh, warmup_steps, eps=1e-6):
        self.alpha, self.z_thresh, self.warmup_steps, self.eps = alpha, z_thresh, warmup_steps, eps
        self.buffer, self.initialized, self.mean, self.var = [], False, None, None

    def step(self, grads):
        total_norm = global_norm64(grads)
        if not self.initialized:
            self.buffer.append(total_norm)
            if len(self.buffer) >= self.warmup_steps:
                self.mean = sum(self.buffer) / len(self.buffer)
                self.var = sum((x - self.mean) ** 2 for x in self.buffer) / len(self.buffer)
                self.initialized, self.buffer = True, []
            return grads, np.inf, False, None
        std = self.var**0.5
        z = (total_norm - self.mean) / (std + self.eps)
        threshold = self.mean + self.z_thresh * (std + self.eps)  # where z = z_thresh
        clip_val = None
        if z > self.z_thresh:
            eta = z / self.z_thresh
            clip_val = self.mean + (self.z_thresh * std) / eta
            grads = [g * (clip_val / total_norm) for g in grads]
        effective = clip_val if clip_val is not None else total_norm
        self.mean = self.alpha * self.mean + (1 - self.alpha) * effective
        self.var = self.alpha * self.var + (1 - self.alpha) * (effective - self.mean) ** 2
        return grads, threshold, clip_val is not None, z


def test_zclip_matches_the_reference_code_step_by_step():
    alpha, z_threshold, warmup = 0.97, 2.5, 25
    grads = [gradients_at(t) for t in range(len(NORMS))]
    params = variables([np.zeros(s, np.float32) for s in SHAPES])
    clipper = clipper_for("zclip", {"alpha": alpha, "z_threshold": z_threshold,
                                    "warmup_steps": warmup}, params)
    reference = ZClipReference(alpha, z_threshold, warmup)
    clipped_steps = []
    for t, (g, (out, stats)) in enumerate(
            zip(grads, run_compiled(clipper, params, grads), strict=True)):
        expected, threshold, clipped, z = reference.step(g)
        assert z is None or abs(z - z_threshold) > 1e-3  # no coin flips
        assert stats["clipped"] == float(clipped), t
        assert stats["threshold"] == pytest.approx(threshold, rel=1e-5)
        for a, b in zip(out, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        if clipped:
            clipped_steps.append(t)
    np.testing.assert_allclose(clipper.state_variables[2].numpy(), reference.mean, rtol=1e-5)
    np.testing.assert_allclose(clipper.state_variables[3].numpy(), reference.var, rtol=1e-4)
    # the spike of step 8 falls in the warm-up and passes; 2.5 at step 52 is no outlier
    assert clipped_steps == [28, 32, 33, 40, 47]


# ------------------------------------------------------------ ZClip's options = the reference code
NORMS_60 = NORMS + [1.31, 0.82, 9.00, 1.32, 0.81]  # 60 steps: one more spike, at step 57


class ZClipUpstream:
    """github.com/bluorion-com/ZClip zclip/zclip.py, class ZClip with all its options but
    skip_update_on_spike: __init__'s checks, _compute_clip_val, _apply_clipping and step, the
    same statements in the same order, in float64, on a list of gradients instead of a model.
    (torch's clip_grad_norm_ in the warm-up and apply_in_place_clipping scale by bound / (norm +
    1e-6); gradexp, and this transcription, scale to the bound exactly.) `step` also returns the
    norm above which the step clips and the norms its decisions compared with."""

    def __init__(self, alpha=0.97, z_thresh=2.5, max_grad_norm=1.0, eps=1e-6, warmup_steps=25,
                 mode="zscore", clip_option="adaptive_scaling", clip_factor=1.0):
        self.alpha, self.z_thresh, self.max_grad_norm = alpha, z_thresh, max_grad_norm
        self.eps, self.warmup_steps, self.mode = eps, warmup_steps, mode.lower()
        self.clip_factor = clip_factor
        if self.mode == "zscore":
            assert clip_option in ["mean", "adaptive_scaling"]
            self.clip_option = clip_option.lower()
        elif self.mode == "percentile":
            self.clip_option = None  # clip_option is ignored in percentile mode
        else:
            raise ValueError("mode must be either 'zscore' or 'percentile'.")
        self.buffer, self.initialized, self.mean, self.var = [], False, None, None

    def _initialize_ema(self):
        self.mean = sum(self.buffer) / len(self.buffer)
        self.var = sum((x - self.mean) ** 2 for x in self.buffer) / len(self.buffer)
        self.initialized, self.buffer = True, []

    def _update_ema(self, grad_norm):
        self.mean = self.alpha * self.mean + (1 - self.alpha) * grad_norm
        self.var = self.alpha * self.var + (1 - self.alpha) * (grad_norm - self.mean) ** 2

    def _compute_positive_zscore(self, grad_norm):
        std = self.var**0.5
        return (grad_norm - self.mean) / (std + self.eps), std

    def _compute_clip_val(self, grad_norm):
        std = self.var**0.5
        if self.mode == "percentile":
            threshold = self.mean + self.z_thresh * std
            if grad_norm > threshold:
                return threshold
        elif self.mode == "zscore":
            z, std = self._compute_positive_zscore(grad_norm)
            if z > self.z_thresh:
                if self.clip_option == "adaptive_scaling":
                    eta = z / self.z_thresh
                    threshold = self.mean + (self.z_thresh * std) / eta
                    threshold = threshold * self.clip_factor
                elif self.clip_option == "mean":
                    threshold = self.mean
                return threshold
        return None

    @staticmethod
    def apply_in_place_clipping(grads, global_norm, max_global_norm):
        clip_coef = (max_global_norm / global_norm) if global_norm > max_global_norm else 1.0
        return ([g * clip_coef for g in grads] if clip_coef < 1.0 else grads), clip_coef < 1.0

    def _apply_clipping(self, grads, clip_val, total_norm):
        adaptive_clip = clip_val if clip_val is not None else total_norm
        if self.max_grad_norm is not None:
            effective_clip = min(adaptive_clip, self.max_grad_norm)
        else:
            effective_clip = adaptive_clip
        return self.apply_in_place_clipping(grads, total_norm, effective_clip)

    def step(self, grads):
        total_norm = global_norm64(grads)
        cap = np.inf if self.max_grad_norm is None else self.max_grad_norm
        if not self.initialized:
            self.buffer.append(total_norm)
            if len(self.buffer) >= self.warmup_steps:
                self._initialize_ema()
            if self.max_grad_norm is not None:  # torch.nn.utils.clip_grad_norm_
                grads, clipped = self.apply_in_place_clipping(grads, total_norm, cap)
                return grads, cap, clipped, [cap]
            return grads, np.inf, False, []
        std = self.var**0.5  # the norm where _compute_clip_val starts returning a value:
        margin = std if self.mode == "percentile" else std + self.eps
        boundary = self.mean + self.z_thresh * margin
        clip_val = self._compute_clip_val(total_norm)
        grads, clipped = self._apply_clipping(grads, clip_val, total_norm)
        self._update_ema(clip_val if clip_val is not None else total_norm)
        return grads, min(boundary, cap), clipped, [e for e in (boundary, cap) if e < np.inf]


ZCLIP_OPTIONS = {  # the options against their defaults, and the steps that clip
    "clip_factor=0.7": ({"clip_factor": 0.7}, [28, 32, 33, 40, 47, 57]),
    "clip_option=mean": ({"clip_option": "mean"}, [28, 32, 33, 40, 47, 57]),
    # clipped to mean + 2.5 std, not below it, the spikes of 28-33 leave a larger std: 40 passes
    "mode=percentile": ({"mode": "percentile"}, [28, 32, 33, 47, 57]),
    "max_grad_norm=1.175": ({"max_grad_norm": 1.175}, [5, 8, 22, 28, 32, 33, 36, 37, 39, 40,
                                                       41, 43, 44, 46, 47, 48, 50, 51, 52, 54,
                                                       55, 57, 58]),
    "mode=percentile max_grad_norm=3": ({"mode": "percentile", "max_grad_norm": 3.0},
                                        [8, 28, 32, 33, 40, 47, 57]),  # 8, 40 by the cap
}


@pytest.mark.parametrize("option", ZCLIP_OPTIONS)
def test_zclip_options_match_the_reference_code_step_by_step(option):
    settings, expected_steps = ZCLIP_OPTIONS[option]
    options = {"mode": "zscore", "clip_option": "adaptive_scaling", "clip_factor": 1.0,
               "max_grad_norm": None, **settings}
    alpha, z_threshold, warmup = 0.97, 2.5, 25
    grads = [gradients_at(t, norm=norm) for t, norm in enumerate(NORMS_60)]
    params = variables([np.zeros(s, np.float32) for s in SHAPES])
    clipper = clipper_for("zclip", {"alpha": alpha, "z_threshold": z_threshold,
                                    "warmup_steps": warmup, **options}, params)
    reference = ZClipUpstream(alpha, z_threshold, warmup_steps=warmup, **options)
    clipped_steps = []
    for t, (g, (out, stats)) in enumerate(
            zip(grads, run_compiled(clipper, params, grads), strict=True)):
        expected, threshold, clipped, edges = reference.step(g)
        norm = global_norm64(g)
        assert all(abs(norm - edge) > 1e-4 * edge for edge in edges), t  # no coin flips
        assert stats["clipped"] == float(clipped), t
        assert stats["threshold"] == pytest.approx(threshold, rel=1e-5), t
        assert stats["norm_before"] == pytest.approx(norm, rel=1e-6)
        for a, b in zip(out, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        if clipped:
            clipped_steps.append(t)
    np.testing.assert_allclose(clipper.state_variables[2].numpy(), reference.mean, rtol=1e-5)
    np.testing.assert_allclose(clipper.state_variables[3].numpy(), reference.var, rtol=1e-4)
    assert clipped_steps == expected_steps


# ------------------------------------------------------------ AdaGC = the authors' code
def tensor_norms_at(step):
    """Per-tensor norms of 3 tensors, each with its own spikes: a kernel (one spike in the
    warm-up, lone and back-to-back ones after it), a bias whose norm drifts down (its spikes at
    other steps, one shared), and a tensor without a gradient before step 15 (None)."""
    kernel = 1 + 0.2 * np.sin(0.9 * step) + 0.1 * np.cos(2.3 * step)
    kernel *= {5: 2.4, 18: 6.0, 30: 8.0, 31: 20.0, 44: 5.0}.get(step, 1.0)
    bias = 0.3 * (1 + 0.15 * np.sin(1.3 * step + 1)) * (1 - 0.004 * step)
    bias *= {24: 4.0, 37: 10.0, 44: 3.0, 52: 6.0}.get(step, 1.0)
    late = 2 + 0.3 * np.sin(0.5 * step + 2) if step >= 15 else None
    if late is not None:
        late *= {20: 3.0, 50: 7.0}.get(step, 1.0)
    return [kernel, bias, late]


ADAGC_SHAPES = [(3, 2), (2,), (2, 2)]


def adagc_gradients_at(step):
    """float32 gradients with the norms of tensor_norms_at(step) (or None), turning."""
    out = []
    for i, (shape, norm) in enumerate(zip(ADAGC_SHAPES, tensor_norms_at(step), strict=True)):
        if norm is None:
            out.append(None)
            continue
        raw = pattern(step, shape, i)
        out.append((raw * (norm / np.linalg.norm(raw))).astype(np.float32))
    return out


class AdaGCReference:
    """github.com/lishuai-97/AdaGC megatron-gpt2.patch, megatron/optimizer/clip_grads.py, class
    AdaGC, clip_by_norm with norm_type 2 on one rank: the same statements in the same order, in
    float64, including its eps. Megatron's max_norm (--clip-grad) is `max_norm`; gradexp's null
    is max_norm=inf. `step` also returns the norm bounds its decisions compared with."""

    def __init__(self, clip_ratio=1.04, beta=0.99, eps=1.0e-6, start_clip_steps=100, max_norm=1.0):
        assert 0 <= clip_ratio and 0 <= beta < 1 and 0 < eps and start_clip_steps >= 0
        self.clip_ratio, self.beta, self.eps = clip_ratio, beta, eps
        self.start_clip_steps, self.max_norm, self.steps = start_clip_steps, max_norm, 0
        self.state = collections.defaultdict(dict)  # by tensor index

    def step(self, grads):
        self.steps += 1
        grads = [None if g is None else np.asarray(g, np.float64) for g in grads]
        total_norm = global_norm64([g for g in grads if g is not None])
        if self.steps <= self.start_clip_steps:
            clip_coeff = self.max_norm / (total_norm + self.eps)
            if clip_coeff < 1.0:
                grads = [None if g is None else g * clip_coeff for g in grads]
            for i, g in enumerate(grads):
                if g is None:
                    continue
                state = self.state[i]
                norm_value = np.linalg.norm(g)
                if "norm_value" not in state:
                    state["norm_value"] = norm_value
                if norm_value < state["norm_value"]:
                    state["norm_value"] = norm_value
            return grads, bool(clip_coeff < 1.0), [self.max_norm]
        clipped, bounds = False, []
        for i, g in enumerate(grads):
            if g is None:
                continue
            state = self.state[i]
            norm_value = np.linalg.norm(g)
            if "norm_value" not in state:
                state["norm_value"] = norm_value
            avg_norm_value = state["norm_value"]
            bounds.append(self.clip_ratio * avg_norm_value)
            if norm_value > self.clip_ratio * avg_norm_value:
                clip_coef = (self.clip_ratio * avg_norm_value) / (norm_value + self.eps)
                grads[i] = g * clip_coef
                norm_value = self.clip_ratio * avg_norm_value
                clipped = True
            state["norm_value"] = avg_norm_value * self.beta + norm_value * (1.0 - self.beta)
        return grads, clipped, bounds


ADAGC_SETTINGS = {  # (clip_ratio, beta, warmup_steps, warmup_max_norm): tracking, and the code's
    "ratio 1.25, beta 0.8": (1.25, 0.8, 10, 1.5),
    "the code's ratio 1.04, beta 0.99": (1.04, 0.99, 10, 1.5),
    "no warm-up clipping": (1.25, 0.8, 10, None),
}


# After the warm-up, the steps at which each tensor is clipped. With the code's settings each is
# clipped on most steps (γ starts at its smallest warm-up norm and grows by at most 0.04% a step).
ADAGC_CLIPPED = {
    "ratio 1.25, beta 0.8": [[10, 14, 16, 18, 22, 30, 31, 44, 57], [10, 24, 37, 44, 52], [20, 50]],
    "no warm-up clipping": [[10, 14, 16, 18, 22, 30, 31, 44, 57], [10, 24, 37, 44, 52], [20, 50]],
}


@pytest.mark.parametrize("settings", ADAGC_SETTINGS)
def test_adagc_matches_the_authors_code_step_by_step(settings):
    clip_ratio, beta, warmup, max_norm = ADAGC_SETTINGS[settings]
    params = variables([np.zeros(s, np.float32) for s in ADAGC_SHAPES])
    clipper = clipper_for("adagc", {"clip_ratio": clip_ratio, "beta": beta,
                                    "warmup_steps": warmup, "warmup_max_norm": max_norm}, params)
    reference = AdaGCReference(clip_ratio, beta, start_clip_steps=warmup,
                               max_norm=np.inf if max_norm is None else max_norm)
    step = tf.function(lambda grads: clipper(grads, params))
    clipped_steps = [[] for _ in ADAGC_SHAPES]
    for t in range(60):
        grads = adagc_gradients_at(t)
        norms = [None if g is None else np.linalg.norm(np.asarray(g, np.float64)) for g in grads]
        out, stats = step([None if g is None else tf.constant(g) for g in grads])
        expected, clipped, bounds = reference.step(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        # the bounds and decisions: no coin flips, the threshold their global norm
        decided = [sum(n**2 for n in norms if n is not None) ** 0.5] if t < warmup else \
            [norms[i] for i in present]
        assert all(b == np.inf or abs(n - b) > 1e-4 * b
                   for n, b in zip(decided, bounds, strict=True)), t
        if t >= warmup:
            assert float(stats["threshold"]) == pytest.approx(np.linalg.norm(bounds), rel=1e-5)
        else:
            assert float(stats["threshold"]) == (np.inf if max_norm is None else max_norm)
        assert float(stats["clipped"]) == float(clipped), t
        for i, (a, b) in enumerate(zip(out, expected, strict=True)):
            if b is None:
                assert a is None
                continue
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
            if t >= warmup and not np.allclose(b, grads[i], rtol=1e-7):
                clipped_steps[i].append(t)
        gamma = clipper.state_variables[0].numpy()
        for i in range(len(ADAGC_SHAPES)):
            if "norm_value" in reference.state[i]:
                assert gamma[i] == pytest.approx(reference.state[i]["norm_value"], rel=1e-5), t
            else:
                assert gamma[i] == np.inf  # not seen yet
    # every tensor was clipped on some steps after the warm-up and left alone on others
    assert all(0 < len(steps) < 60 - warmup - (i == 2) * 5
               for i, steps in enumerate(clipped_steps)), clipped_steps
    assert clipped_steps == ADAGC_CLIPPED.get(settings, clipped_steps)


# ------------------------------------------------------------ properties of every method
def spiky_steps(n=6):
    """Gradients for a few steps, the last one a spike: enough history for the adaptive methods."""
    norms = [1.0, 1.2, 0.9, 1.1, 0.95, 40.0][:n]
    return [gradients_at(t, norm=norm) for t, norm in enumerate(norms)]


def params_for_steps():
    return variables([np.full(s, 0.5, np.float32) for s in SHAPES])


@pytest.mark.parametrize("method", ACTIVE)
def test_a_bound_above_every_norm_is_the_identity(method):
    params = params_for_steps()
    clipper = clipper_for(method, LOOSE[method], params)
    steps = spiky_steps()
    for grads, (out, stats) in zip(steps, run_compiled(clipper, params, steps), strict=True):
        for a, g in zip(out, grads, strict=True):
            np.testing.assert_array_equal(a, g)  # exactly, not approximately
        assert stats["clipped"] == 0.0 and stats["norm_after"] == stats["norm_before"]


@pytest.mark.parametrize("method", [m for m in STATELESS if m != "none"])
def test_clipping_twice_changes_nothing(method):
    params = params_for_steps()
    clipper = clipper_for(method, ACTIVE[method], params)
    grads = [tf.constant(g) for g in gradients_at(0, norm=40.0)]
    once, stats = clipper(grads, params)
    twice, _ = clipper(once, params)
    assert float(stats["clipped"]) == 1.0
    for a, b in zip(as_numpy(once), as_numpy(twice), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6)


def test_zclip_from_the_same_state_clipping_twice_changes_nothing():
    params = params_for_steps()
    clipper = clipper_for("zclip", ACTIVE["zclip"], params)
    steps = spiky_steps()
    for grads in steps[:-1]:
        clipper([tf.constant(g) for g in grads], params)
    saved = [v.numpy() for v in clipper.state_variables]
    once, stats = clipper([tf.constant(g) for g in steps[-1]], params)
    for v, value in zip(clipper.state_variables, saved, strict=True):
        v.assign(value)
    twice, stats_twice = clipper(once, params)
    assert float(stats["clipped"]) == 1.0 and float(stats_twice["clipped"]) == 0.0
    for a, b in zip(as_numpy(once), as_numpy(twice), strict=True):
        np.testing.assert_array_equal(b, a)


def test_autoclip_is_not_idempotent_but_never_lengthens_a_gradient():
    # history 1..5, then a norm of 100 at p=50: T = percentile([1..5, 100], 50) = 3.5. From the
    # same state, the clipped gradient (norm 3.5) gives T = percentile([1..5, 3.5], 50) = 3.25.
    params = params_for_steps()
    clipper = clipper_for("autoclip", {"percentile": 50.0, "history": 100}, params)
    for norm in (1.0, 2.0, 3.0, 4.0, 5.0):
        clipper([tf.constant(g) for g in gradients_at(0, norm=norm)], params)
    saved = [v.numpy() for v in clipper.state_variables]
    once, stats = clipper([tf.constant(g) for g in gradients_at(1, norm=100.0)], params)
    for v, value in zip(clipper.state_variables, saved, strict=True):
        v.assign(value)
    _, stats_twice = clipper(once, params)
    assert float(stats["threshold"]) == pytest.approx(3.5)
    assert float(stats_twice["threshold"]) == pytest.approx(3.25)
    assert float(stats_twice["norm_after"]) < float(stats["norm_after"])


def unit_bounds_hold(out, params, factor, eps):
    bounds = [factor * np.maximum(unitwise_norm_reference(w.numpy()), eps) for w in params]
    return all(np.all(unitwise_norm_reference(g) <= bound * (1 + 1e-6))
               for g, bound in zip(out, bounds, strict=True))


@pytest.mark.parametrize("method", ACTIVE)
def test_the_norm_after_is_within_the_bound(method):
    params = params_for_steps()
    clipper = clipper_for(method, ACTIVE[method], params)
    settings, tolerance = ACTIVE[method], 1 + 1e-6
    steps = spiky_steps()
    for out, stats in run_compiled(clipper, params, steps):
        assert stats["norm_after"] == pytest.approx(global_norm64(out), rel=1e-6)
        assert stats["norm_after"] <= stats["norm_before"] * tolerance
        if method == "value":
            assert max(np.max(np.abs(g)) for g in out) <= settings["max_value"]
        elif method == "norm":
            assert all(np.linalg.norm(g) <= settings["max_norm"] * tolerance for g in out)
        elif method == "agc":
            assert unit_bounds_hold(out, params, settings["factor"], settings["eps"])
        else:  # global_norm, autoclip, zclip (adagc: by its norm of bounds) by `threshold`
            assert stats["norm_after"] <= stats["threshold"] * tolerance
    assert stats["clipped"] == (0.0 if method == "none" else 1.0)  # the spike was clipped


@pytest.mark.parametrize("bad", [np.inf, np.nan], ids=["inf", "nan"])
@pytest.mark.parametrize("method", ACTIVE)
def test_non_finite_gradients_pass_unchanged(method, bad):
    params = params_for_steps()
    clipper = clipper_for(method, ACTIVE[method], params)
    for grads in spiky_steps():
        clipper([tf.constant(g) for g in grads], params)  # past ZClip's warm-up
    saved = [v.numpy() for v in clipper.state_variables]
    grads = gradients_at(7, norm=40.0)
    grads[0][1, 0] = bad
    out, stats = clipper([tf.constant(g) for g in grads], params)
    for a, g in zip(as_numpy(out), grads, strict=True):
        np.testing.assert_array_equal(a, g)  # inf stays inf, NaN stays NaN, the rest as it was
    assert not np.isfinite(float(stats["norm_before"])) and float(stats["clipped"]) == 0.0
    for v, value in zip(clipper.state_variables, saved, strict=True):
        np.testing.assert_array_equal(v.numpy(), value)  # statistics untouched


@pytest.mark.parametrize("mode", ["tf.function", "jit_compile"])
@pytest.mark.parametrize("method", ACTIVE)
def test_compiled_steps_give_the_eager_results(method, mode):
    results = {}
    for run_mode in ("eager", mode):
        params = params_for_steps()
        clipper = clipper_for(method, ACTIVE[method], params)
        step = MODES[run_mode](step_function(clipper, params))
        results[run_mode] = [step([tf.constant(g) for g in grads]) for grads in spiky_steps()]
    for (out_a, stats_a), (out_b, stats_b) in zip(*results.values(), strict=True):
        for a, b in zip(as_numpy(out_a), as_numpy(out_b), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
        assert set(stats_b) == STATS
        for key in STATS:
            assert stats_b[key].dtype == tf.float32 and stats_b[key].shape == ()
            np.testing.assert_allclose(float(stats_b[key]), float(stats_a[key]), rtol=1e-6)


def step_function(clipper, params):
    def step(grads):
        return clipper(grads, params)

    return step


# ------------------------------------------------------------ what the trainer relies on
def test_none_gradients_pass_and_sparse_ones_are_clipped_dense():
    params = variables([np.ones((3, 2), np.float32), np.ones((2,), np.float32)])
    clipper = clipper_for("global_norm", {"max_norm": 1.0}, params)
    sparse = tf.IndexedSlices(tf.constant([[30.0, 40.0]]), tf.constant([1]), tf.constant([3, 2]))
    (dense, none), stats = clipper([sparse, None], params)
    assert none is None and float(stats["norm_before"]) == pytest.approx(50.0)
    np.testing.assert_allclose(dense, [[0, 0], [0.6, 0.8], [0, 0]], rtol=1e-6)


@pytest.mark.parametrize("method", ["norm", "global_norm"])
def test_float16_gradients_are_clipped_by_a_norm_computed_in_float32(method):
    # ‖[300, -200, 100]‖² = 140 000 overflows float16 (max 65 504): the norm must be float32
    params = variables([np.ones(3, np.float16)])
    (out,), stats = clipper_for(method, {"max_norm": 1.0}, params)(
        [tf.constant([300.0, -200.0, 100.0], tf.float16)], params)
    assert out.dtype == tf.float16 and float(stats["clipped"]) == 1.0
    np.testing.assert_allclose(out.numpy(), [0.8018, -0.5345, 0.2673], rtol=2e-3)


def test_agc_output_params_as_variables_paths_or_booleans():
    params = variables([np.ones((3, 2), np.float32), np.ones((2,), np.float32)])
    grads = [tf.fill([3, 2], 100.0), tf.fill([2], 100.0)]
    agc = OmegaConf.create({"name": "agc", **ACTIVE["agc"], "exclude_output": True})
    for output in ([params[1]], [params[1].name], [False, True]):
        out, _ = stateful(agc, params, output_params=output)(grads, params)
        assert np.all(out[0].numpy() < 100.0) and np.all(out[1].numpy() == 100.0)
    with pytest.raises(ValueError, match="output_params"):
        stateful(agc, params)  # excluding the output layer needs to know which it is
    with pytest.raises(ValueError, match="nosuch"):
        stateful(agc, params, output_params=["nosuch/kernel"])


@pytest.mark.parametrize("method", ["adagc", "autoclip", "zclip"])
def test_a_restored_state_goes_on_as_if_never_stopped(method, tmp_path):
    """The state variables are the whole state: a clipper restored from a checkpoint of them (as
    gradexp/training/checkpoints.py writes it) clips the following steps exactly as the one that
    saved."""
    norms = [1.0, 1.2, 0.9, 1.1, 0.95, 40.0, 1.05, 0.9, 30.0, 1.0, 1.1, 0.97]
    steps = [gradients_at(t, norm=norm) for t, norm in enumerate(norms)]
    params = params_for_steps()
    whole = run_compiled(clipper_for(method, ACTIVE[method], params), params, steps)
    first = clipper_for(method, ACTIVE[method], params)
    run_compiled(first, params, steps[:6])
    saved = tf.train.Checkpoint(clipping=list(first.state_variables)).write(str(tmp_path / "c"))
    second = clipper_for(method, ACTIVE[method], params)
    tf.train.Checkpoint(clipping=list(second.state_variables)).read(
        saved).assert_existing_objects_matched()
    resumed = run_compiled(second, params, steps[6:])
    assert sum(stats["clipped"] for _, stats in resumed) > 0
    for (out_a, stats_a), (out_b, stats_b) in zip(whole[6:], resumed, strict=True):
        assert stats_a == stats_b
        for a, b in zip(out_a, out_b, strict=True):
            np.testing.assert_array_equal(a, b)


def test_only_the_adaptive_methods_have_state_to_checkpoint():
    params = params_for_steps()
    for method, settings in ACTIVE.items():
        state = clipper_for(method, settings, params).state_variables
        assert bool(state) == (method in ("adagc", "autoclip", "zclip"))
        assert all(not v.trainable for v in state)


# ------------------------------------------------------------ the config group
@pytest.mark.parametrize("method", ACTIVE)
def test_every_method_composes_validates_and_builds(make_cfg, method):
    cfg = make_cfg(f"clipping={method}")
    config.validate(cfg)
    assert cfg.clipping.name == method
    params = params_for_steps()
    clipper = stateful(cfg.clipping, params, output_params=[False, True])
    out, stats = clipper([tf.constant(g) for g in gradients_at(0)], params)
    assert set(stats) == STATS and len(out) == len(params)


def test_the_default_is_no_clipping(make_cfg):
    assert make_cfg().clipping.name == "none"


@pytest.mark.parametrize(("overrides", "key"), [
    (["clipping=global_norm", "clipping.max_norm=-1"], "clipping.max_norm=-1"),
    (["clipping=norm", "clipping.max_norm=0"], "clipping.max_norm=0"),
    (["clipping=value", "clipping.max_value=inf"], "clipping.max_value=inf"),
    (["clipping=agc", "clipping.factor=-0.01"], "clipping.factor=-0.01"),
    (["clipping=autoclip", "clipping.percentile=101"], "clipping.percentile=101"),
    (["clipping=autoclip", "clipping.history=0"], "clipping.history=0"),
    (["clipping=zclip", "clipping.alpha=1"], "clipping.alpha=1"),
    (["clipping=zclip", "clipping.warmup_steps=0"], "clipping.warmup_steps=0"),
    (["clipping=zclip", "clipping.mode=minmax"], "clipping.mode=minmax"),
    (["clipping=zclip", "clipping.clip_option=median"], "clipping.clip_option=median"),
    (["clipping=zclip", "clipping.clip_factor=0"], "clipping.clip_factor=0"),
    (["clipping=zclip", "clipping.clip_factor=1.5"], "clipping.clip_factor=1.5"),
    (["clipping=zclip", "clipping.max_grad_norm=-1"], "clipping.max_grad_norm=-1"),
    (["clipping=zclip", "clipping.max_grad_norm=nan"], "clipping.max_grad_norm=nan"),
    # options the chosen mode ignores (in the reference) are refused
    (["clipping=zclip", "clipping.mode=percentile", "clipping.clip_option=mean"],
     "clipping.clip_option=mean"),
    (["clipping=zclip", "clipping.mode=percentile", "clipping.clip_factor=0.7"],
     "clipping.clip_factor=0.7"),
    (["clipping=zclip", "clipping.clip_option=mean", "clipping.clip_factor=0.7"],
     "clipping.clip_factor=0.7"),
    (["clipping=adagc", "clipping.clip_ratio=0"], "clipping.clip_ratio=0"),
    (["clipping=adagc", "clipping.clip_ratio=inf"], "clipping.clip_ratio=inf"),
    (["clipping=adagc", "clipping.beta=1"], "clipping.beta=1"),
    (["clipping=adagc", "clipping.beta=-0.1"], "clipping.beta=-0.1"),
    (["clipping=adagc", "clipping.warmup_steps=-1"], "clipping.warmup_steps=-1"),
    (["clipping=adagc", "clipping.warmup_max_norm=0"], "clipping.warmup_max_norm=0"),
])
def test_bad_values_name_the_key(make_cfg, overrides, key):
    with pytest.raises(config.ConfigError) as error:
        config.validate(make_cfg(*overrides))
    assert str(error.value).startswith(key)


def test_global_norm_with_no_bound_is_no_clipping():
    """clipping.max_norm=null: the baseline of a threshold sweep passes g unchanged, threshold
    inf, never counted as clipped, where max_norm=1 rescales the same gradients to norm 1."""
    params = variables([np.ones((2, 2), np.float32), np.ones(3, np.float32)])
    grads = [tf.constant([[3.0, 0.0], [0.0, 4.0]]), tf.constant([0.0, 12.0, 0.0])]  # ‖g‖ = 13
    out, stats = clipper_for("global_norm", {"max_norm": None}, params)(grads, params)
    for g, o in zip(grads, out, strict=True):
        np.testing.assert_array_equal(o, g)
    assert float(stats["threshold"]) == np.inf and float(stats["clipped"]) == 0.0
    assert float(stats["norm_before"]) == float(stats["norm_after"]) == 13.0
    out, stats = clipper_for("global_norm", {"max_norm": 1.0}, params)(grads, params)
    assert float(stats["norm_after"]) == pytest.approx(1.0) and float(stats["clipped"]) == 1.0


def test_agc_skips_a_parameter_anywhere_in_the_list_and_at_the_bound_does_not_count():
    """AGC by hand on rank-1 parameters (one unit each: the norm of the whole vector), λ = 0.5:
    bound = λ · max(‖w‖, eps). An excluded parameter first in the list passes and the ones after
    it are still clipped; a gradient exactly at its bound is unchanged and not counted."""
    from gradexp.parts.clipping.agc import adaptive_clip

    w = variables([np.array([2.0, 0.0], np.float32), np.array([3.0, 4.0], np.float32)])
    g = [tf.constant([1.0, 0.0]), tf.constant([6.0, 8.0])]  # norms 1 and 10; bounds 1 and 2.5
    out, stats = adaptive_clip(g, w, 0.5, 1e-3, [True, False])
    assert [o.numpy().tolist() for o in out] == [[1.0, 0.0], [1.5, 2.0]]  # × 2.5 / 10
    assert float(stats["clipped"]) == 1.0
    out, stats = adaptive_clip(g[:1], w[:1], 0.5, 1e-3, [False])  # ‖g‖ = 1 = its bound
    assert out[0].numpy().tolist() == [1.0, 0.0] and float(stats["clipped"]) == 0.0
    out, stats = adaptive_clip(g, w, 0.5, 1e-3, [True, True])  # every parameter excluded
    assert [o.numpy().tolist() for o in out] == [[1.0, 0.0], [6.0, 8.0]]
    assert float(stats["clipped"]) == 0.0 and float(stats["threshold"]) == 0.5


def test_output_params_as_booleans_must_be_one_per_parameter():
    from gradexp.parts.clipping.common import output_paths, variable_path

    params = variables([np.ones((3, 2), np.float32), np.ones((2,), np.float32)])
    assert output_paths(params, [False, True]) == {variable_path(params[1])}
    with pytest.raises(ValueError, match="^output_params: 1 booleans for 2 parameters$"):
        output_paths(params, [True])


def test_autoclip_history_evicts_the_oldest_norm_when_it_first_fills_and_on_a_tie():
    """The sorted history by hand (size 3): after 1, 5, 3 it is full; the 4th norm, 2, evicts
    the oldest (1), not the largest: [2, 3, 5]. Then 5 arrives while 5 is the oldest: a tie,
    the history stays sorted, [2, 3, 5] (a minimum of 2 and a maximum of 5)."""
    from gradexp.parts.clipping.autoclip import NormHistory, percentile, record

    history = NormHistory.create(3)
    assert float(percentile(history, 50.0)) == np.inf  # empty: inf (clips nothing), not NaN
    for norm in (1.0, 5.0, 3.0, 2.0):
        history = record(history, tf.constant(norm), tf.constant(True))
    assert history.ascending.numpy().tolist() == [2.0, 3.0, 5.0]
    history = record(history, tf.constant(5.0), tf.constant(True))  # evicts the oldest 5
    assert history.ascending.numpy().tolist() == [2.0, 3.0, 5.0]
    assert float(percentile(history, 0.0)) == 2.0 and float(percentile(history, 100.0)) == 5.0


def test_adagc_a_norm_exactly_at_its_bound_is_not_clipped():
    """AdaGC by hand on one tensor, warm-up 2 steps at λ_abs = 5, then λ_rel = 2, β = 0.5:
    [3, 4] (‖g‖ = 5 = λ_abs) passes and does not count; [6, 8] halves; γ = min(5, 5) = 5. After
    it [6, 8] (‖g‖ = 10 = 2γ) passes, uncounted, γ = 0.5·5 + 0.5·10 = 7.5; [12, 16] (20 > 15)
    shrinks by 0.75 to [9, 12], γ = 0.5·7.5 + 0.5·15 = 11.25."""
    params = variables([np.zeros(2, np.float32)])
    clipper = clipper_for("adagc", {"clip_ratio": 2.0, "beta": 0.5, "warmup_steps": 2,
                                    "warmup_max_norm": 5.0}, params)
    expected = [([3.0, 4.0], [3.0, 4.0], 0.0, 5.0, 5.0),  # g, out, clipped, threshold, γ
                ([6.0, 8.0], [3.0, 4.0], 1.0, 5.0, 5.0),
                ([6.0, 8.0], [6.0, 8.0], 0.0, 10.0, 7.5),
                ([12.0, 16.0], [9.0, 12.0], 1.0, 15.0, 11.25)]
    for g, out, clipped, threshold, gamma in expected:
        result, stats = clipper([tf.constant(g)], params)
        assert result[0].numpy().tolist() == out
        assert float(stats["clipped"]) == clipped and float(stats["threshold"]) == threshold
        assert clipper.state_variables[0].numpy().tolist() == [gamma]


def test_zclip_called_with_its_defaults_clips_a_spike_by_hand():
    """zclip() with its keyword defaults (z-score mode, adaptive scaling, clip_factor 1, no
    cap), by hand: warm-up norms 1 and 3 give μ = 2, σ = 1; then ‖g‖ = 10, z = 8 > z_t = 2.5,
    is clipped to μ + z_t·σ / (z / z_t) = 2 + 2.5 / 3.2 = 2.78125 (z and the threshold
    μ + z_t·(σ + 1e-6) carry ZClip's eps)."""
    from gradexp.parts.clipping.zclip import ZClipState, zclip

    state = ZClipState.create(2)
    for g in (1.0, 3.0):
        out, state, stats = zclip([tf.constant([g])], state, 0.9, 2.5)
        assert out[0].numpy().tolist() == [g] and float(stats["clipped"]) == 0.0
    assert float(state.mean.numpy()) == 2.0 and float(state.var.numpy()) == 1.0
    out, state, stats = zclip([tf.constant([10.0])], state, 0.9, 2.5)
    z = 8.0 / (1.0 + 1e-6)
    assert float(out[0][0]) == pytest.approx(2.0 + 2.5 / (z / 2.5), rel=1e-6)
    assert float(stats["threshold"]) == pytest.approx(2.0 + 2.5 * (1.0 + 1e-6), rel=1e-6)
    assert float(stats["clipped"]) == 1.0


def test_zclip_at_its_boundaries_by_hand():
    """Warm-up norms 1 and 3 (μ = 2, σ = 1): a norm exactly on the boundary is not a spike, in
    z-score mode (z = (g − μ)/(σ + 1e-6) = z_t = 2.5 exactly for g = 4.5000024 in float32)
    and in percentile mode (g = μ + z_t·σ = 4 with z_t = 2). Warm-up norms 2 and 2 (σ = 0):
    3 is a spike (z = 1/1e-6), clipped to μ = 2, and the boundary is μ + z_t·1e-6."""
    from gradexp.parts.clipping.zclip import ZClipState, zclip

    def warmed(norms, z_threshold, **options):
        state = ZClipState.create(len(norms))
        for g in norms:
            _, state, _ = zclip([tf.constant([g])], state, 0.9, z_threshold, **options)
        return state

    g = np.float32(4.5000024)
    assert (g - np.float32(2)) / (np.float32(1) + np.float32(1e-6)) == np.float32(2.5)
    out, _, stats = zclip([tf.constant([g])], warmed([1.0, 3.0], 2.5), 0.9, 2.5)
    assert out[0].numpy().tolist() == [g] and float(stats["clipped"]) == 0.0
    out, _, stats = zclip([tf.constant([4.0])], warmed([1.0, 3.0], 2.0, mode="percentile"),
                          0.9, 2.0, mode="percentile")
    assert out[0].numpy().tolist() == [4.0] and float(stats["clipped"]) == 0.0
    assert float(stats["threshold"]) == 4.0
    out, _, stats = zclip([tf.constant([3.0])], warmed([2.0, 2.0], 2.5), 0.9, 2.5)
    assert float(out[0][0]) == pytest.approx(2.0, rel=1e-6) and float(stats["clipped"]) == 1.0
    assert float(stats["threshold"]) == pytest.approx(2.0 + 2.5e-6, abs=3e-7)


def test_zclip_cap_at_exactly_the_norm_and_a_non_finite_warmup_step():
    """ZClip's cap (max_grad_norm = 5) during the warm-up: ‖[3, 4]‖ = 5 passes and does not
    count, ‖[6, 8]‖ = 10 is halved. An infinite norm in the warm-up passes and leaves every
    statistic (the collected norms, the count, μ, σ²) as it was."""
    from gradexp.parts.clipping.zclip import ZClipState, zclip

    state = ZClipState.create(3)
    out, state, stats = zclip([tf.constant([3.0, 4.0])], state, 0.9, 2.5, max_grad_norm=5.0)
    assert out[0].numpy().tolist() == [3.0, 4.0] and float(stats["clipped"]) == 0.0
    out, state, stats = zclip([tf.constant([6.0, 8.0])], state, 0.9, 2.5, max_grad_norm=5.0)
    assert out[0].numpy().tolist() == [3.0, 4.0] and float(stats["clipped"]) == 1.0
    before = [v.numpy().tolist() for v in state]
    assert before == [[5.0, 10.0, 0.0], 2, 0.0, 0.0]
    out, state, _ = zclip([tf.constant([np.inf, 1.0])], state, 0.9, 2.5, max_grad_norm=5.0)
    assert out[0].numpy().tolist() == [np.inf, 1.0]
    assert [v.numpy().tolist() for v in state] == before


@pytest.mark.parametrize(("overrides", "names"), [
    (["clipping=autoclip", "clipping.history=4"],
     ["autoclip/arrivals", "autoclip/ascending", "autoclip/count"]),
    (["clipping=zclip", "clipping.warmup_steps=3", "trainer.on_spike=skip"],
     ["zclip/warmup_norms", "zclip/seen", "zclip/mean", "zclip/var",
      "spikes/seen", "spikes/mean", "spikes/var"])])
def test_clipping_state_is_named_for_checkpoints_and_kept_from_the_first_replica(
        make_cfg, tmp_path, overrides, names):
    """A run's carry (the method's state, then the spike detector's) is held in variables named
    by the state's fields, a checkpoint's keys (a resumed run finds them by these names); under
    a distribution strategy the first replica's write is kept."""
    from gradexp.parts import data
    from gradexp.training.checkpoints import RunState
    from gradexp.training.step import make_step

    cfg = make_cfg("model.width=8", *overrides)
    state = RunState(tmp_path, make_step(cfg, data.load(cfg.dataset)),
                     tf.distribute.get_strategy())
    assert [v.name.split(":")[0] for v in state.carry] == names
    assert all(v.aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA and not v.trainable
               for v in state.carry)


def test_the_output_layer_is_told_by_its_variables_paths_not_their_names():
    """Every Dense layer has a `kernel` and a `bias`: the head is told by path (`logits/kernel`),
    so AGC's unclipped output layer is the model's last, not every layer's kernel."""
    from gradexp.parts.clipping.common import output_paths

    model = small_model()
    head = model.layers[-1]
    assert output_paths(model.trainable_variables, head.trainable_variables) == {
        v.path for v in head.trainable_variables}
    assert len({v.name for v in model.trainable_variables}) < len(model.trainable_variables)


def test_the_clipper_refuses_gradients_that_do_not_match_the_parameters():
    params = variables([np.ones(2, np.float32), np.ones(3, np.float32)])
    clipper = clipper_for("norm", {"max_norm": 1.0}, params)
    with pytest.raises(ValueError, match="^1 gradients for 2 parameters$"):
        clipper([tf.ones(2)], params)


def test_a_method_that_loses_a_gradient_fails_loudly():
    """Method.update pairs each present gradient with its clipped one: a clip that returns fewer
    is a bug, not a run whose last gradients go unclipped."""
    from gradexp.parts.clipping.common import Method, NoState

    grads = [tf.ones(2), None, tf.ones(3)]
    params = [tf.Variable(tf.zeros(2)), tf.Variable(tf.zeros(1)), tf.Variable(tf.zeros(3))]
    halves = Method("halves", NoState, lambda g, s, p: ([x / 2 for x in g], s, {}))
    out, _, _ = halves.update(grads, NoState(), params)
    assert out[1] is None and [o.numpy().tolist() for o in (out[0], out[2])] == [[0.5] * 2,
                                                                                [0.5] * 3]
    lossy = Method("lossy", NoState, lambda g, s, p: (g[:-1], s, {}))
    with pytest.raises(ValueError, match="zip"):
        lossy.update(grads, NoState(), params)
