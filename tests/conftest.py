"""Shared fixtures: the real config, composed and shrunk for quick runs."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"
QUICK = ["trainer.steps=30", "trainer.log_every=10", "trainer.eval_every=30",
         "trainer.histogram_every=30", "model.width=16"]


def pytest_collection_modifyitems(config, items):
    """Under mutmut (tests/mutation.py), a mutant's test files cheapest first: by the seconds
    its tests there took in mutmut's measurement (its stats file, in the working directory it
    runs pytest in). With -x, a mutant a quick file's test kills is not first run through a
    slow file. mutmut gives the tests as a set, whose order is arbitrary. Each file's tests
    stay together and in their order, so a module's fixture is set up once, as in any run."""
    stats = Path("mutmut-stats.json")
    if not os.environ.get("MUTANT_UNDER_TEST") or not stats.exists():
        return
    import json

    seconds = json.loads(stats.read_text()).get("duration_by_test", {})
    cost: dict[Path, float] = {}
    for item in items:
        cost[item.path] = cost.get(item.path, 0.0) + seconds.get(item.nodeid, 60.0)
    items.sort(key=lambda item: cost[item.path])  # stable: a file's order kept


@pytest.fixture(autouse=True)
def fresh_global_state():
    """What a test's in-process run sets for the whole process
    (gradexp.training.devices.prepare_process: the Keras dtype policy, TensorFlow op determinism,
    TensorFlow's global seed set by keras.utils.set_random_seed) is undone after it, so a test sees
    the defaults whichever tests ran before it in the same process (pytest-randomly reseeds
    Python's and NumPy's)."""
    yield
    if "keras" in sys.modules:
        import keras

        keras.config.set_dtype_policy("float32")
    if "tensorflow" in sys.modules:
        from gradexp.training.devices import set_op_determinism

        set_op_determinism(False)
        import tensorflow as tf

        tf.random.set_seed(None)  # unset again: ops draw fresh seeds, as in a new process


@pytest.fixture
def make_cfg():
    """compose(overrides) → the real config from conf/, with the given overrides."""

    def make(*overrides: str):
        import gradexp.config  # noqa: F401  (puts the schemas in Hydra's ConfigStore)

        GlobalHydra.instance().clear()
        with initialize_config_dir(str(CONF), version_base="1.3"):
            return compose("config", overrides=list(overrides))

    yield make
    GlobalHydra.instance().clear()


def events(run_dir):
    """A run directory's event files, every point kept, read by TensorBoard's own loader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "histograms": 0})
    acc.Reload()
    return acc


def hparams_experiment(sweep_dir):
    """The HParams experiment at a sweep's root, as TensorBoard's loader reads it: its
    `domains` ({key: the listed values}) and its `metrics` (their tags)."""
    from types import SimpleNamespace

    from tensorboard.plugins.hparams import plugin_data_pb2

    content = events(sweep_dir).SummaryMetadata("_hparams_/experiment").plugin_data.content
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content).experiment
    return SimpleNamespace(
        domains={info.name: [getattr(v, v.WhichOneof("kind")) for v in
                             info.domain_discrete.values] for info in experiment.hparam_infos},
        metrics=[m.name.tag for m in experiment.metric_infos])


def event_scalars(acc, tag):
    """A scalar tag's values, in step order, as float32 (TF2 writes scalars as tensors)."""
    import numpy as np

    return np.array([np.frombuffer(e.tensor_proto.tensor_content, np.float32)[0]
                     if e.tensor_proto.tensor_content else e.tensor_proto.float_val[0]
                     for e in acc.Tensors(tag)], np.float32)


def gradexp(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m <args>` as a user would, in `cwd`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)


def started(cfg, run_dir: Path, n: int):
    """A run of `cfg` set up in `run_dir` (gradexp.train.start) and its engine (K = 1,
    gradexp/training/engine.py), whose calls train up to n steps."""
    from omegaconf import OmegaConf

    from gradexp.sweeps import grouping
    from gradexp.train import start
    from gradexp.training.engine import Engine

    cfg = cfg.copy()
    OmegaConf.update(cfg, "trainer.log_every", n)
    run = start(grouping.Job(cfg, Path(run_dir), []))
    return run, Engine(run, 1)


def first_call(run, engine, n: int):
    """The run's first n steps in one compiled call, as the trainer calls it: the n rows as a
    {name: column} dict, and the last step's gradients (it measures the telemetry too)."""
    import numpy as np

    from gradexp._tf import tf

    rows, done, grads = engine.train_steps(tf.constant(0, tf.int64), tf.constant(n),
                                           tf.constant([True]))
    assert int(done[0]) == n
    rows = rows.numpy()[:n, 0]
    return ({name: rows[:, i] for i, name in enumerate(run.step.names)},
            [np.asarray(g) for g in grads])


def first_steps(cfg, run_dir: Path, n: int):
    """(run, rows, gradients) of a run's first n steps: `started`, then `first_call`."""
    run, engine = started(cfg, run_dir, n)
    return (run, *first_call(run, engine, n))


def in_this_process(monkeypatch, *args: str) -> None:
    """`python -m gradexp.train *args` run in this process, in the current directory, not a
    subprocess (mutation testing sees only what runs here): Hydra's global state, its job
    logging's handlers and what the entry point sets for its process are undone after it."""
    from gradexp import train

    monkeypatch.setattr(sys, "argv", ["gradexp.train", *args])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "")  # main() sets it
    with hydra_and_logging_undone():
        train.main()


def logged_lines(monkeypatch, *names: str) -> list:
    """The lines of the loggers `names` as they are logged, for this test (Hydra's logging
    config replaces the root logger's handlers: caplog sees none of a sweep's lines)."""
    import logging

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    for name in names:
        monkeypatch.setattr(logging.getLogger(name), "handlers", [handler])
    return lines


def exit_of(monkeypatch, *args: str) -> int:
    """`in_this_process(*args)` for a call that must end with SystemExit: its status (what it
    printed is capsys's to read)."""
    with pytest.raises(SystemExit) as exited:
        in_this_process(monkeypatch, *args)
    return exited.value.code


@contextlib.contextmanager
def hydra_and_logging_undone():
    """Hydra's global state, the root logger's handlers and level and logging.raiseExceptions
    as they were before an entry point ran in this process (Hydra's job logging adds handlers,
    gradexp.train.main() sets raiseExceptions), and the handlers made before it open: so
    capsys can read what an entry point run here prints."""
    import logging

    from hydra.core.global_hydra import GlobalHydra

    root = logging.getLogger()
    handlers, level, raise_exceptions = list(root.handlers), root.level, logging.raiseExceptions
    # Hydra's logging set-up (logging.config.dictConfig) closes every handler made so far, and
    # absl's closes its stream, pytest's own capture, when that is not the sys.stderr of the
    # moment (capsys's): the handlers that were here before are kept open through it
    kept = [handler for ref in logging._handlerList if (handler := ref()) is not None]
    for handler in kept:
        handler.close = lambda: None
    try:
        yield
    finally:
        for handler in kept:
            del handler.close
        GlobalHydra.instance().clear()
        for handler in set(root.handlers) - set(handlers):
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)
        logging.raiseExceptions = raise_exceptions


def processes_marked(mark: str) -> list[str]:
    """The processes whose environment holds `mark` (this test's children and theirs)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark.encode() in environ.read_bytes():
                found.append(environ.parent.name)
        except OSError:  # gone, or not ours to read
            pass
    return found
