"""Precision, XLA and distribution: mixed precision trains with finite norms; a mirrored
strategy on two logical CPUs follows the one-device loss curve; parameter clipping in the
trainer."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from conftest import CONF, QUICK, REPO
from gradexp.train import train

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

SHORT = [*QUICK, "trainer.steps=20", "trainer.eval_every=20", "trainer.histogram_every=0"]


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_and_logs_finite_norms(make_cfg, tmp_path, precision):
    summary = train(make_cfg(*SHORT, f"precision={precision}", "clip=0.1"), tmp_path)
    assert summary["status"] == "completed"
    table = pd.read_csv(tmp_path / "metrics.csv")
    norms = table.filter(regex=r"^grad_norm/dense_\d/(pre|post)$")
    assert norms.shape[1] == 6 and np.isfinite(norms.to_numpy()).all()
    assert (norms.filter(like="post").to_numpy() <= norms.filter(like="pre").to_numpy()).all()
    assert table["loss/train"].iloc[-1] < table["loss/train"].iloc[0]
    if precision == "mixed_float16":  # dynamic loss scaling: the scale is logged, skips too
        assert table["loss_scale"].iloc[0] == 2.0**15
        kept = table[table["skipped"] == 0]
        assert len(kept) > 0 and np.isfinite(kept["grad_norm/global"]).all()
    else:
        assert "loss_scale" not in table



def test_mixed_float16_layer_statistics_are_in_true_units(make_cfg, tmp_path):
    """Under a loss scale S (2^15 at the start) the clip layers work on dy / S: the first step's
    ‖dy‖ before clipping is a float32 run's (same seed, same batch) to float16 precision, not
    S times it, and the share clipped at ±0.1 is close to the float32 run's."""
    tables = {}
    for precision in ("float32", "mixed_float16"):
        run_dir = tmp_path / precision
        run_dir.mkdir()
        train(make_cfg(*SHORT, f"precision={precision}", "clip=0.1"), run_dir)
        tables[precision] = pd.read_csv(run_dir / "metrics.csv").iloc[0]
    full, mixed = tables["float32"], tables["mixed_float16"]
    for layer in ("dense_1", "dense_2", "dense_3"):
        pre = f"grad_norm/{layer}/pre"
        assert mixed[pre] == pytest.approx(full[pre], rel=0.005), layer
        fraction = f"clip_fraction/{layer}"
        assert abs(mixed[fraction] - full[fraction]) < 0.05, layer

def test_the_loss_scale_a_step_uses_is_its_state_within_a_call(make_cfg, tmp_path):
    """mixed_float16's dynamic loss scale halves at every skipped step: the first steps of the
    default MLP overflow float16 at 2^15. A call of 20 steps carries the scale as a value, so
    each step scales its loss by the scale its state holds (not the variable's value at the
    call's start): its every-step columns are those of the same run trained one step a call."""
    tables = {}
    for every in (1, 20):
        run_dir = tmp_path / str(every)
        run_dir.mkdir()
        train(make_cfg(*SHORT, "precision=mixed_float16", f"trainer.log_every={every}",
                       "trainer.jit_compile=false"), run_dir)
        tables[every] = pd.read_csv(run_dir / "metrics.csv")
    one, twenty = tables[1], tables[20]
    scales = twenty["loss_scale"].iloc[:20]
    assert scales.iloc[0] == 2.0**15 and scales.nunique() > 1  # it changed inside the call
    assert (twenty["skipped"].iloc[:20] == 0).any()  # and later steps trained at the new scale
    for column in ("loss/train", "grad_norm/global", "loss_scale", "skipped"):
        np.testing.assert_array_equal(one[column], twenty[column], err_msg=column)


def test_xla_compiled_step_matches_the_plain_one(make_cfg, tmp_path):
    plain, xla = tmp_path / "plain", tmp_path / "xla"
    for run_dir, jit in ((plain, "false"), (xla, "true")):
        run_dir.mkdir()
        train(make_cfg(*SHORT, "clip=0.1", "clipping=zclip", f"trainer.jit_compile={jit}"),
              run_dir)
    a, b = (pd.read_csv(d / "metrics.csv") for d in (plain, xla))
    np.testing.assert_allclose(a["loss/train"], b["loss/train"], rtol=1e-4)
    np.testing.assert_allclose(a["grad_norm/dense_3/post"], b["grad_norm/dense_3/post"], rtol=1e-3)


def test_parameter_clipping_in_the_step(make_cfg, tmp_path):
    train(make_cfg(*SHORT, "clipping=global_norm", "clipping.max_norm=5"), tmp_path)
    table = pd.read_csv(tmp_path / "metrics.csv")
    assert (table["param_clip/threshold"] == 5).all()
    before, after = table["grad_norm/global"], table["grad_norm/global/post"]
    clipped = before > 5
    assert clipped.any() and (table["param_clip/clipped"] == clipped).all()
    np.testing.assert_allclose(after[clipped], 5, rtol=1e-5)
    np.testing.assert_array_equal(after[~clipped], before[~clipped])


MIRRORED = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from gradexp._tf import tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from hydra import compose, initialize_config_dir
    from gradexp.train import train
    for overrides, out in json.loads(sys.argv[1]):
        with initialize_config_dir(sys.argv[2], version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        print(train(cfg, Path(out))["device"], len(tf.config.list_logical_devices("CPU")))
""")
CLIPPED = ["clip=0.1", "clipping=global_norm", "clipping.max_norm=5"]


def test_mirrored_strategy_follows_the_one_device_curve(tmp_path):
    """Two logical CPU devices, each half of the same global batch: the same losses, and the
    parameter clip acting on the summed gradient (Keras would clip each replica's half);
    unclipped and clipped. One process: the devices are split before TensorFlow starts."""
    import json

    jobs = []
    for clipping in ([], CLIPPED):
        for strategy in ("none", "mirrored"):
            out = tmp_path / f"{strategy}{'_clipped' if clipping else ''}"
            out.mkdir()
            jobs.append(([*SHORT, "trainer.steps=30", f"strategy={strategy}", *clipping],
                         str(out)))
    result = subprocess.run([sys.executable, "-c", MIRRORED, json.dumps(jobs), str(CONF)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cpu", "2"] * 4
    for suffix in ("", "_clipped"):
        one, two = (pd.read_csv(tmp_path / f"{s}{suffix}" / "metrics.csv")
                    for s in ("none", "mirrored"))
        np.testing.assert_allclose(two["loss/train"], one["loss/train"], rtol=1e-5)
        np.testing.assert_allclose(two["grad_norm/global"], one["grad_norm/global"], rtol=1e-4)
        for column in one.filter(regex="^(grad_norm|clip_fraction)/dense").columns:
            np.testing.assert_allclose(two[column], one[column], rtol=1e-4, atol=1e-6)
        if suffix:
            assert (one["param_clip/clipped"] == 1).any()
            np.testing.assert_allclose(two["grad_norm/global/post"],
                                       one["grad_norm/global/post"], rtol=1e-4)


def test_a_run_resets_what_an_earlier_run_in_the_process_set():
    """A sweep's jobs share a process (the basic launcher): deterministic=true in one run must
    not stay on for the next, nor a mixed policy."""
    from tensorflow.python.framework import config as tf_config

    from gradexp._tf import keras
    from gradexp.training.devices import prepare_process

    prepare_process("cpu", "mixed_bfloat16", 0, deterministic=True)
    assert tf_config.is_op_determinism_enabled()
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
    prepare_process("cpu", "float32", 0, deterministic=False)
    assert not tf_config.is_op_determinism_enabled()
    assert keras.config.dtype_policy().name == "float32"


def test_tensorflow_imports_without_kerass_optional_integrations_and_is_kept_from_gc():
    """gradexp._tf keeps Keras (and TensorFlow's legacy Keras) from importing scikit-learn,
    IPython, pandas, matplotlib, Pillow and SciPy (~1.4 s of a 3.9 s import, parts gradexp
    never uses), which import as usual afterwards (dataset=digits, summarize); the import's
    objects are frozen out of garbage collection (a full collection: 0.15 s -> 0)."""
    optional = "('sklearn', 'IPython', 'pandas', 'matplotlib', 'PIL', 'scipy', 'keras')"
    code = ("import gc, sys, gradexp._tf\n"
            f"print(sorted(m for m in {optional} if m in sys.modules))\n"
            "print(gc.get_freeze_count() > 100_000)\n"
            "import sklearn.datasets, pandas, matplotlib.pyplot, PIL.Image, scipy.stats\n"
            "print(pandas.DataFrame(sklearn.datasets.load_digits().data).shape)\n"
            "print(PIL.Image.new('L', (3, 2)).size, scipy.stats.t.ppf(0.5, 3))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["['keras']", "True", "(1797, 64)", "(3, 2) 0.0"]
