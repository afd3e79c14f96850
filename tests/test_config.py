"""Bad input: one line naming the key, exit status 2, no run directory, no TensorFlow import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import QUICK, REPO, gradexp
from gradexp import config

BAD = [
    (["clip=-1"], "clip=-1", "positive number or null"),
    (["clip=abc"], "clip=abc", "Float"),
    (["layer.clip_min=1", "layer.clip_max=0"], "layer.clip_min=1", "must not exceed clip_max"),
    (["model=nosuch"], "model=nosuch", "choose one of cnn, keras, mlp, rnn, transformer"),
    (["model=cnn", "dataset=teacher"], "model=cnn", "needs image inputs (H, W, C) or "
     "sequences (T, F), convolved along T; dataset=teacher gives vectors (32,)"),
    (["layer.positions=[nosuch]"], "layer.positions=nosuch", "dense_1, dense_2, dense_3"),
    (["trainer.steps=0"], "trainer.steps=0", ">= 1"),
    (["trainer.stepz=5"], "trainer.stepz", "allowed: steps, batch_size"),
    (["+model.extra=1"], "model.extra", "no such key"),
    (["device=tpu"], "device=tpu", "auto, cpu, gpu"),
    (["-m", "clip=0.1,-1"], "clip=-1", "positive number or null"),
    # unknown options of groups
    (["optimizer=rmsprop"], "optimizer=rmsprop", "choose one of adam, adamw, keras, sgd"),
    (["+experiment=nosuch"], "experiment=nosuch", "choose one of"),
    (["hydra/launcher=nosuch"], "hydra/launcher=nosuch", "basic, gradexp, joblib"),
    # wrong types
    (["trainer.batch_size=1.5"], "trainer.batch_size=1.5", "converted to Integer"),
    (["trainer.jit_compile=maybe"], "trainer.jit_compile=maybe", "not a valid bool"),
    (["seed=abc"], "seed=abc", "converted to Integer"),
    (["seed=-1"], "seed=-1", "must be an integer in [0, 2**32 - 1]"),
    (["seed=4294967296"], "seed=4294967296", "must be an integer in [0, 2**32 - 1]"),
    (["clip=[1,2]"], "clip=[1,2]", "converted to Float"),
    (["clip="], "clip=", "converted to Float"),
    # overrides Hydra cannot parse, or without a key
    (["clip=[1,"], "clip=[1,", "no viable alternative at input '[1,'"),
    (["=1"], "=1", "no key before '='; an override is key=value"),
    # values and choices
    (["precision=float64"], "precision=float64", "float32, mixed_float16, mixed_bfloat16"),
    (["layer.norm_axis=channel"], "layer.norm_axis=channel", "batch, example"),
    (["layer.max_norm=0"], "layer.max_norm=0.0", "positive number or null"),
    (["clipping=global_norm", "clipping.max_norm=-1"], "clipping.max_norm=-1.0", "positive"),
    # the keys of zclip's options and of adagc
    (["clipping=zclip", "clipping.mode=minmax"], "clipping.mode=minmax", "zscore, percentile"),
    (["clipping=zclip", "clipping.clip_option=median"], "clipping.clip_option=median",
     "adaptive_scaling, mean"),
    (["clipping=zclip", "clipping.clip_factor=2"], "clipping.clip_factor=2.0", "(0, 1]"),
    (["clipping=zclip", "clipping.max_grad_norm=0"], "clipping.max_grad_norm=0.0", "positive"),
    (["clipping=adagc", "clipping.clip_ratio=-1"], "clipping.clip_ratio=-1.0", "positive"),
    (["clipping=adagc", "clipping.beta=1"], "clipping.beta=1.0", "[0, 1)"),
    (["clipping=adagc", "clipping.warmup_steps=-5"], "clipping.warmup_steps=-5", ">= 0"),
    (["clipping=adagc", "clipping.warmup_max_norm=-1"], "clipping.warmup_max_norm=-1.0",
     "positive number, or null"),
    (["trainer.eval_every=-5"], "trainer.eval_every=-5", ">= 1"),
    (["trainer.on_divergence=ignore"], "trainer.on_divergence=ignore", "stop, continue"),
    (["trainer.on_spike=clip"], "trainer.on_spike=clip", "none, skip"),
    (["trainer.spike_z=0"], "trainer.spike_z=0.0", "> 0"),
    (["trainer.spike_warmup=0"], "trainer.spike_warmup=0", ">= 1"),
    (["trainer.spike_alpha=1"], "trainer.spike_alpha=1.0", "(0, 1)"),
    (["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints=0", ">= 1"),
    (["trainer.on_damaged_checkpoint=ignore"], "trainer.on_damaged_checkpoint=ignore",
     "fail, restart"),
    # the other clipping methods, optimizers, datasets and a user's model
    (["clipping=value", "clipping.max_value=0"], "clipping.max_value=0.0", "positive number"),
    (["clipping=norm", "clipping.max_norm=0"], "clipping.max_norm=0.0", "positive number"),
    (["clipping=agc", "clipping.factor=0"], "clipping.factor=0.0", "positive number"),
    (["clipping=agc", "clipping.eps=0"], "clipping.eps=0.0", "positive number"),
    (["clipping=autoclip", "clipping.percentile=101"], "clipping.percentile=101.0", "[0, 100]"),
    (["clipping=autoclip", "clipping.history=0"], "clipping.history=0", ">= 1"),
    (["optimizer=adam", "optimizer.beta_2=1"], "optimizer.beta_2=1.0", "[0, 1)"),
    (["optimizer=adam", "optimizer.epsilon=0"], "optimizer.epsilon=0.0", "positive number"),
    (["optimizer=adamw", "optimizer.weight_decay=-1"], "optimizer.weight_decay=-1.0", ">= 0"),
    (["optimizer=keras"], "optimizer.class_name=???", "must be set"),
    (["optimizer=keras", "optimizer.class_name= "], "optimizer.class_name=", "a Keras optimizer"),
    (["optimizer=sgd", "optimizer.learning_rate=0"], "optimizer.learning_rate=0.0", "positive"),
    (["dataset=mnist1d", "dataset.val_fraction=1.5"], "dataset.val_fraction=1.5",
     "between 0 and 1 (exclusive)"),
    (["dataset=digits", "dataset.val_fraction=0"], "dataset.val_fraction=0.0", "between 0 and 1"),
    (["dataset=arrays", "dataset.load=a:b", "dataset.task=other"], "dataset.task=other",
     "auto, classification, regression"),
    (["dataset=arrays", "dataset.load=a:b", "dataset.num_classes=1"], "dataset.num_classes=1",
     ">= 2, or null"),
    (["dataset=arrays", "dataset.load=a:b", "dataset.task=regression", "dataset.num_classes=3"],
     "dataset.num_classes=3", "null when dataset.task=regression"),
    (["dataset=tfds"], "dataset.name=tfds", "the TFDS name of a dataset prepared in data_dir"),
    (["model=keras", "model.build= "], "model.build=", "a dotted path"),
    (["trainer.test=true"], "trainer.test=true", "dataset=synthetic has no test split"),
    # contradictory settings
    (["strategy=mirrored", "trainer.on_divergence=continue"], "trainer.on_divergence=continue",
     "one device only"),
    (["model=cnn"], "model=cnn", "needs image inputs"),
    (["clipping=zclip", "clipping.mode=percentile", "clipping.clip_factor=0.5"],
     "clipping.clip_factor=0.5", "not used by mode=percentile"),
    # resume
    (["resume=no/such/run"], "resume=no/such/run", "neither a run directory"),  # in tmp_path
    (["-m", "resume=/x"], "resume=/x", "not a sweep"),
    pytest.param(["device=gpu"], "device=gpu", "device=auto or cpu",
                 marks=pytest.mark.skipif("has_gpu()", reason="a GPU is visible here")),
]


# The entry point's wiring (the one line on stderr, exit status 2, no run directory), once for
# each way a bad value is found: by `validate`, by OmegaConf's types, by a config's schema, by
# Hydra's options of a group (the run's and Hydra's own), by a sweep's check, by resume's, by the
# device's. Every value of BAD is checked in this process too (test_bad_value_...).
THROUGH_THE_CLI = {"clip=-1", "clip=abc", "clip=", "clip=[1,", "=1", "trainer.stepz=5",
                   "+model.extra=1", "optimizer=rmsprop", "hydra/launcher=nosuch",
                   "model=cnn dataset=teacher",
                   "strategy=mirrored trainer.on_divergence=continue", "-m clip=0.1,-1",
                   "resume=no/such/run", "-m resume=/x", "device=gpu"}
IN_A_PROCESS = {"clip=-1", "-m clip=0.1,-1"}  # a run's and a sweep's, as a shell sees them


def case_id(value):
    return " ".join(value) if isinstance(value, list) else None


def cases(keep) -> list:
    return [case for case in BAD if keep(case_id(getattr(case, "values", case)[0]))]


assert len(cases(THROUGH_THE_CLI.__contains__)) == len(THROUGH_THE_CLI)  # each names a case


def has_gpu() -> bool:
    from gradexp._tf import tf

    return bool(tf.config.list_physical_devices("GPU"))


@pytest.mark.parametrize(("overrides", "key", "allowed"), cases(
    lambda id: not (id.startswith(("-m ", "resume=")) or id == "device=gpu")), ids=case_id)
def test_bad_value_is_one_line_naming_the_key_and_what_is_allowed(overrides, key, allowed):
    from gradexp import api

    with pytest.raises(config.ConfigError) as caught:
        api.compose(*overrides)
    line = str(caught.value)
    assert line.startswith(key) and allowed in line and "\n" not in line, line


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "key", "allowed"), cases(THROUGH_THE_CLI.__contains__),
                         ids=case_id)
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, overrides, key,
                                          allowed):
    """gradexp.train.main() in this process (mutation testing sees only this one), and for
    IN_A_PROCESS `python -m gradexp.train` itself: its stderr and exit status."""
    from conftest import exit_of

    flags = [o for o in overrides if o.startswith("-")]
    values = [o for o in overrides if not o.startswith("-")]
    monkeypatch.chdir(tmp_path)
    if case_id(overrides) in IN_A_PROCESS:
        result = gradexp("gradexp.train", *flags, *QUICK, *values, cwd=tmp_path)
        status, err, out = result.returncode, result.stderr, result.stdout
    else:
        status, (out, err) = exit_of(monkeypatch, *flags, *QUICK, *values), capsys.readouterr()
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {key}") and allowed in lines[0], lines[0]
    assert "Traceback" not in err + out
    assert not (tmp_path / "outputs").exists()  # no run directory made, not even .hydra/


@pytest.mark.slow
def test_config_errors_do_not_wait_for_tensorflow():
    # The entry point and the validation import no TensorFlow (which takes ~10 s to load).
    code = ("import sys, gradexp.train, gradexp.config; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_defaults_are_valid_and_clip_sets_both_bounds(make_cfg):
    cfg = make_cfg()
    config.validate(cfg)
    assert cfg.clip is None and config.clip_bounds(cfg) == (None, None)
    assert config.positions(cfg) == ["dense_1", "dense_2", "dense_3"]
    cfg = make_cfg("clip=0.1", "layer.clip_max=0.5", "layer.positions=[dense_3,dense_1]")
    assert config.clip_bounds(cfg) == (-0.1, 0.5)  # layer.clip_max overrides +clip
    assert config.positions(cfg) == ["dense_1", "dense_3"]  # model order


def test_sweep_jobs_expand_like_the_basic_sweeper(make_cfg):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"hydra": {"sweeper": {"params": {"seed": "0,1"}},
                                      "overrides": {"task": ["clip=null,0.1,1"]}}})
    jobs = config.sweep_jobs(cfg)
    assert len(jobs) == 6 and ["seed=0", "clip=null"] in jobs and ["seed=1", "clip=1"] in jobs


@pytest.mark.slow
def test_each_job_of_a_sweep_is_composed_once(monkeypatch):
    """compose_once: the checks', the sweeper's and the launcher's loads of one job compose it
    once; each gets its own copy of that config, the one a fresh compose gives; a load for
    another sweep's master config is composed as before."""
    from hydra import initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    from conftest import CONF

    composed = []
    real = ConfigLoaderImpl.load_configuration

    def counted(self, *args, **kwargs):
        composed.append(kwargs["overrides"])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counted)
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        master, other = (hydra.compose_config("config", ["clip=null,0.1", "seed=3"],
                                              run_mode=RunMode.MULTIRUN) for _ in range(2))
        loader = hydra.config_loader
        fresh = loader.load_sweep_config(master, ["clip=0.1", "seed=3"])
        composed.clear()
        config.compose_once(loader, master)
        first = loader.load_sweep_config(master, ["clip=0.1", "seed=3"])
        with open_dict(first):
            first.hydra.job.num = 7  # as the launcher and run_job write into theirs
        again = loader.load_sweep_config(master_config=master,
                                         sweep_overrides=["clip=0.1", "seed=3"])
        assert composed == [["clip=0.1", "seed=3"]]
        assert OmegaConf.to_yaml(again) == OmegaConf.to_yaml(fresh) and again.clip == 0.1
        assert OmegaConf.is_missing(again.hydra.job, "num")  # not the first copy's 7
        loader.load_sweep_config(master, ["clip=null", "seed=3"])
        loader.load_sweep_config(other, ["clip=0.1", "seed=3"])
        assert composed[1:] == [["clip=null", "seed=3"], ["clip=0.1", "seed=3"]]
    GlobalHydra.instance().clear()


def test_a_dotted_path_names_the_users_object_or_fails_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "models.py").write_text(
        "def make(units=3):\n    return units\n\n\nclass Maker:\n    make = staticmethod(make)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    for name in ("my_pkg", "my_pkg.models"):  # another test's package of this name
        monkeypatch.delitem(sys.modules, name, raising=False)
    # the dotted form first: my_pkg.models is imported as the module (my_pkg has no attribute
    # models until then), then the colon form, whose first colon ends the module
    for path in ("my_pkg.models.make", "my_pkg.models:make"):
        assert config.import_object("model.build", path)(units=5) == 5
    assert sys.path.count("") == 1 and "." not in sys.path  # the working directory, once
    assert config.import_object("model.build", "my_pkg.models:Maker.make")(units=4) == 4
    monkeypatch.setattr(sys, "path", [".", *(p for p in sys.path if p != "")])
    assert config.import_object("model.build", "my_pkg.models:make")() == 3
    assert "" not in sys.path  # "." is the working directory already
    for path, why in [("my_pkg.nothing:make", "cannot import my_pkg.nothing"),
                      ("my_pkg.models:absent", "my_pkg.models has no absent"),
                      ("my_pkg.models:make:x", "my_pkg.models has no make:x"),
                      ("make", "must be a dotted path")]:
        with pytest.raises(config.ConfigError, match=f"^model.build={path}: {why}"):
            config.import_object("model.build", path)
