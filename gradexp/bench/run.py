"""What gradexp costs over the model's own arithmetic: `python -m gradexp.bench [--quick]`.

Every comparison runs in this one process, side by side: the variants of a measurement take
turns, in `--repeats` rounds (5 in a full run), and each ratio is computed round by round and
reported as its median with its spread, `<name>_min` and `<name>_max` (gradexp/bench/rounds.py), so
a busy machine slows all of them alike and shows where it did. The last line printed is one
JSON object:

    vs_keras_fit          gradexp's steps/s ÷ Keras model.fit's, same model, data, batch and
                          optimizer (clip layers in both); per model, and on the default MLP
    vs_bare_loop          gradexp with its default logging ÷ a bare tf.function loop (one
                          call per step, nothing logged, the run's one evaluation at the
                          end); on the default MLP and a compute-bound one (width 1024,
                          batch 512)
    layer_overhead        time per step with clip layers at clip=null ÷ without the layers
    logging_overhead      time per step with the default logging ÷ the same loop, nothing written
                          (per-layer telemetry on, the default; `_no_telemetry`: off in both)
    telemetry_overhead    time per step with trainer.layer_norms=true ÷ false, logging as a run
    summarize_vs_tbparse  tbparse's time to load a 100-run sweep ÷ gradexp.summarize's time to
                          summarize it (the sweep is written by the bench in gradexp's formats)
    config_error_s        seconds from launching `python -m gradexp.train clip=-1` to its error
    checkpoint_cost       time per step with a checkpoint every 100 steps ÷ none
    determinism_cost      time per step with deterministic=true ÷ without (separate processes:
                          op determinism is for the whole process)
    flop_fraction         the compute-bound MLP's FLOP rate ÷ a 2048² tf.matmul's
    sweep_speedup, sweep_step_fraction (_rnn, _stateful, _one_worker, _two_workers): basic
                          launcher ÷ hydra/launcher=gradexp's faster way, share in steps
                          (bench_sweeps.py; _stateful: clipping=zclip)

and the raw steps/s behind each ratio. "gradexp's steps/s" is the run's own figure: steps after
the first compiled call (which traces) over the wall time to the end of the loop, logging,
evaluation and checkpoints included.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gradexp.bench import report as bench_report
from gradexp.bench import sweeps as bench_sweeps
from gradexp.bench.rounds import ROUNDS, figure, medians, ratio, shown, side_by_side
from gradexp.runs import rundir
from gradexp.train import CONF_DIR

WORKLOADS = {  # name: overrides of the default config
    "mlp_wide": ["model.width=1024", "trainer.batch_size=512"],
    "cnn": ["model=cnn", "dataset=digits"],
    "rnn": ["model=rnn", "dataset=adding"],
    "transformer": ["model=transformer", "dataset=digits"],
}
EXTRA: list[str] = []  # overrides given on the command line, for every configuration


def compose_cfg(steps: int, *overrides: str):
    """The real config, with `steps` steps, one evaluation (at the end) and no checkpoints;
    otherwise a run's defaults (on_divergence=stop: `continue` costs the wide MLP ~3%)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return compose("config", overrides=[f"trainer.steps={steps}", f"trainer.eval_every={steps}",
                                            "trainer.checkpoint_every=0", *EXTRA, *overrides])


# ----------------------------------------------------------------------------- the variants
def gradexp_steps_per_s(cfg) -> float:
    """gradexp.train.train as a run does it, with its default logging."""
    from gradexp.train import train

    with tempfile.TemporaryDirectory() as run_dir:
        return train(cfg, Path(run_dir))["steps_per_s"]


def _setup(cfg):
    """What train() builds before its loop: seeded model, optimizer, data."""
    from gradexp._tf import keras
    from gradexp.parts import data
    from gradexp.training import devices

    keras.backend.clear_session()
    keras.utils.set_random_seed(cfg.seed)
    devices.precision(cfg.precision)
    arrays = data.load(cfg.dataset)
    train_batches = data.training_batches(arrays, cfg.trainer.batch_size, cfg.seed)
    validation = data.validation_set(arrays)
    return arrays, train_batches, validation


def unlogged_steps_per_s(cfg) -> float:
    """gradexp's compiled calls alone (gradexp/training/engine.py): the same steps, measurements and
    final evaluation, nothing written (no table, events, histograms or progress lines)."""
    from gradexp._tf import tf
    from gradexp.sweeps.grouping import Job
    from gradexp.train import start
    from gradexp.training.engine import Engine

    with tempfile.TemporaryDirectory() as run_dir:
        run = start(Job(cfg, Path(run_dir), []))
        engine = Engine(run, 1)
        # `going` a tensor, as the loop gives it: a Python list is a constant of the program, a
        # different one (XLA folds the masks; ~10% faster), not the run's
        n, every = tf.constant(cfg.trainer.log_every), cfg.trainer.log_every
        going = tf.constant([True])
        engine.train_steps(tf.constant(0, tf.int64), n, going)[0].numpy()  # traces, compiles
        engine.evaluate.get_concrete_function(*run.validation)
        calls = max(1, cfg.trainer.steps // every - 1)
        begin = time.perf_counter()
        for call in range(1, calls + 1):
            engine.train_steps(tf.constant(call * every, tf.int64), n, going)[0].numpy()
        engine.evaluate(*run.validation)["loss/val"].numpy()  # the run's one evaluation
        return calls * every / (time.perf_counter() - begin)


def _model_and_loss(cfg, arrays):
    from gradexp import config
    from gradexp.parts import models
    from gradexp.parts.optimizers import make_optimizer
    from gradexp.training.step import task_loss

    model = models.build(cfg.model, config.clip_spec(cfg), arrays.input_shape, arrays.num_outputs)
    optimizer = make_optimizer(cfg.optimizer, cfg.precision)
    return model, optimizer, task_loss(arrays.num_classes)


def bare_loop_steps_per_s(cfg) -> float:
    """The textbook custom loop: one tf.function call per step, forward, backward, update,
    nothing logged; and the one evaluation at the end that the run it is compared with makes."""
    from gradexp._tf import tf
    from gradexp.parts import data

    arrays, train_batches, (x_val, y_val) = _setup(cfg)
    model, optimizer, per_example_loss = _model_and_loss(cfg, arrays)
    params = model.trainable_variables
    optimizer.build(params)

    @tf.function(jit_compile=cfg.trainer.jit_compile)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(per_example_loss(y, model(x, training=True)))
        optimizer.apply(tape.gradient(loss, params), params)
        return loss

    @tf.function
    def evaluate():
        total = 0.0
        for start in range(0, len(x_val), data.VAL_BATCH):
            x, y = x_val[start:start + data.VAL_BATCH], y_val[start:start + data.VAL_BATCH]
            total += tf.reduce_sum(per_example_loss(y, model(x, training=False)))
        return total

    iterator = iter(train_batches)
    for _ in range(3):  # trace and compile
        step(*next(iterator))
    evaluate.get_concrete_function()
    steps = cfg.trainer.steps
    start = time.perf_counter()
    for _ in range(steps):
        loss = step(*next(iterator))
    loss.numpy()
    evaluate().numpy()
    return steps / (time.perf_counter() - start)


def keras_fit_steps_per_s(cfg) -> float:
    """model.fit as Keras users run it (its own defaults: jit_compile="auto"); epoch 2 timed."""
    from gradexp._tf import keras, tf

    arrays, train_batches, _ = _setup(cfg)
    model, optimizer, per_example_loss = _model_and_loss(cfg, arrays)
    model.compile(optimizer=optimizer,  # the summed loss, as gradexp's default trains
                  loss=lambda y, outputs: tf.reduce_sum(per_example_loss(y, outputs)))
    times: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            times.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            times[-1] = time.perf_counter() - times[-1]

    per_epoch = max(1, cfg.trainer.steps // 2)
    model.fit(train_batches, steps_per_epoch=per_epoch, epochs=2, verbose=0,
              shuffle=False, callbacks=[EpochTimer()])  # the dataset is shuffled already
    return per_epoch / times[-1]


# --------------------------------------------------------------------------- measurement
def matmul_flops_per_s(size: int = 2048, repeats: int = 10) -> float:
    from gradexp._tf import tf

    a = tf.random.normal([size, size])
    multiply = tf.function(lambda: tf.matmul(a, a))
    multiply().numpy()
    start = time.perf_counter()
    for _ in range(repeats):
        result = multiply()
    result.numpy()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def mlp_flops_per_step(cfg, input_size: int, num_outputs: int) -> float:
    """Dense layers: 2·B·in·out forward, 4·B·in·out backward (input and weight gradients)."""
    sizes = [input_size] + [cfg.model.width] * cfg.model.depth + [num_outputs]
    return 6 * cfg.trainer.batch_size * sum(a * b for a, b in zip(sizes[:-1], sizes[1:],
                                                                  strict=True))


def summarize_vs_tbparse(runs: int, steps: int, repeats: int) -> dict[str, float]:
    """A sweep of `runs` runs in gradexp's formats, loaded by tbparse and by gradexp.summarize."""
    import scipy.stats  # noqa: F401  summarize's lazy import, made before timing (as tbparse's)
    from tbparse import SummaryReader

    from gradexp import summarize

    with tempfile.TemporaryDirectory() as root:
        sweep = Path(root)
        write_sweep(sweep, runs, steps)

        def with_tbparse():
            start = time.perf_counter()
            frame = SummaryReader(str(sweep), extra_columns={"dir_name"}).tensors
            assert len(frame) >= runs * steps
            return time.perf_counter() - start

        def with_summarize():
            start = time.perf_counter()
            with open(os.devnull, "w") as quiet:
                stdout, sys.stdout = sys.stdout, quiet
                try:
                    assert summarize.main([str(sweep)]) == 0
                finally:
                    sys.stdout = stdout
            return time.perf_counter() - start

        times = side_by_side({"tbparse_s": with_tbparse, "summarize_s": with_summarize},
                             repeats)
    return {**medians("", times),
            **ratio("summarize_vs_tbparse", times["tbparse_s"], times["summarize_s"])}


def write_sweep(sweep: Path, runs: int, steps: int) -> None:
    """`runs` runs of `steps` steps (clip=null or 0.1, seeds) through
    gradexp.training.logs.RunLog."""
    from omegaconf import OmegaConf

    from gradexp.runs.rundir import write_json
    from gradexp.training.logs import RunLog
    from gradexp.training.step import metric_names

    names = metric_names(["dense_1", "dense_2", "dense_3"])  # the telemetry's are not every step's
    rng = np.random.default_rng(0)
    composed = {clip: compose_cfg(steps, f"clip={clip}") for clip in ("null", "0.1")}
    for k in range(runs):
        clip, seed = ("null", "0.1")[k % 2], k // 2
        cfg = composed[clip].copy()
        cfg.seed = seed
        run_dir = sweep / str(k)
        (run_dir / rundir.HYDRA).mkdir(parents=True)
        overrides = [f"clip={clip}", f"seed={seed}"]
        OmegaConf.save(OmegaConf.create(overrides), run_dir / rundir.OVERRIDES)
        OmegaConf.save(cfg, run_dir / rundir.CONFIG)
        log = RunLog(run_dir, names, cfg)
        loss = 2.3 * np.exp(-np.arange(steps) / (steps / 4)) + rng.random(steps) * 0.05
        rows = rng.random((steps, len(names))).astype(np.float32)
        rows[:, 0] = loss
        log.steps(np.arange(1, steps + 1), rows, {"loss/val": 0.5, "accuracy/val": 0.9})
        log.close(steps, {"loss": float(loss[-1])})
        write_json(run_dir / rundir.SUMMARY, {"status": rundir.COMPLETED, "steps": steps,
                                              "config": OmegaConf.to_container(cfg),
                                              "overrides": overrides})


def config_error_seconds(repeats: int) -> list[float]:
    """Launch to error for a bad value, as a user meets it: a fresh process each time."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "gradexp.train", "clip=-1"],
                                capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        assert result.returncode == 2, result.stderr
    return times


def determinism_cost(steps: int, repeats: int) -> dict[str, float]:
    """steps/s of the default run with and without deterministic=true, separate processes."""
    def run(deterministic: bool) -> float:
        with tempfile.TemporaryDirectory() as run_dir:
            subprocess.run([sys.executable, "-m", "gradexp.train", f"trainer.steps={steps}",
                            f"trainer.eval_every={steps}", "trainer.checkpoint_every=0", *EXTRA,
                            f"deterministic={str(deterministic).lower()}",
                            f"hydra.run.dir={run_dir}/run"], check=True, capture_output=True)
            return json.loads((Path(run_dir) / "run" / rundir.SUMMARY).read_text())[
                "steps_per_s"]

    speeds = side_by_side({"deterministic": lambda: run(True),
                           "default": lambda: run(False)}, repeats)
    return {**ratio("determinism_cost", speeds["default"], speeds["deterministic"]),
            **medians("steps_per_s", {"deterministic": speeds["deterministic"]})}


# ------------------------------------------------------------------------------------ main
def parser() -> argparse.ArgumentParser:
    """The command line (its `--help` is the documentation's commands page)."""
    parser = argparse.ArgumentParser(prog="python -m gradexp.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="the targets' ratios on the MLPs, summary and config error, "
                             "fewer steps and rounds (about a minute); the rest: full run")
    parser.add_argument("--repeats", type=int,
                        help=f"rounds per comparison (default {ROUNDS}, quick 2)")
    parser.add_argument("--smoke", action="store_true", help="--quick at a toy scale, one "
                        "round: a test of the bench's code (under a minute; figures mean nothing)")
    parser.add_argument("--markdown", metavar="FILE.json", help="print the figures of FILE.json "
                        "(the JSON line a run printed) as a Markdown page, and measure nothing")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides for every run, e.g. trainer.jit_compile=false")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.markdown:
        print(bench_report.render(args.markdown), end="")
        return {}
    EXTRA[:] = args.overrides
    repeats = args.repeats or (1 if args.smoke else 2 if args.quick else ROUNDS)
    steps = 40 if args.smoke else 600 if args.quick else 10000  # ~2.5 s a gradexp run
    wide_steps = 20 if args.smoke else 30 if args.quick else 60
    wide_workload = ["model.width=32"] if args.smoke else WORKLOADS["mlp_wide"]
    if args.smoke:  # no XLA: compiling dominates runs this short
        args.quick = True
        EXTRA[:0] = ["model.width=8", "trainer.log_every=10", "trainer.jit_compile=false"]
    out: dict[str, float] = {}
    since = [time.perf_counter()]

    def report(label: str, values: dict[str, float]) -> None:
        out.update(values)
        print(f"{label}: {shown(values)}  ({time.perf_counter() - since[0]:.0f} s)", flush=True)
        since[0] = time.perf_counter()

    mlp = compose_cfg(steps)
    mlp_no_telemetry = compose_cfg(steps, "trainer.layer_norms=false")
    speeds = side_by_side({
        "gradexp": lambda: gradexp_steps_per_s(mlp),
        "unlogged": lambda: unlogged_steps_per_s(mlp),
        "no_telemetry": lambda: gradexp_steps_per_s(mlp_no_telemetry),
        "unlogged_no_telemetry": lambda: unlogged_steps_per_s(mlp_no_telemetry),
        "no_layers": lambda: gradexp_steps_per_s(compose_cfg(steps, "layer.positions=[]")),
        "bare_loop": lambda: bare_loop_steps_per_s(mlp),
        "keras_fit": lambda: keras_fit_steps_per_s(mlp),
    }, repeats)
    report("default MLP, steps/s", medians("steps_per_s", speeds))
    report("default MLP", {
        **ratio("vs_keras_fit", speeds["gradexp"], speeds["keras_fit"]),
        **ratio("vs_bare_loop", speeds["gradexp"], speeds["bare_loop"]),
        **ratio("layer_overhead", speeds["no_layers"], speeds["gradexp"]),
        **ratio("logging_overhead", speeds["unlogged"], speeds["gradexp"]),
        **ratio("logging_overhead_no_telemetry", speeds["unlogged_no_telemetry"],
                speeds["no_telemetry"]),
        **ratio("telemetry_overhead", speeds["no_telemetry"], speeds["gradexp"]),
    })

    wide = compose_cfg(wide_steps, *wide_workload, "trainer.log_every=10")
    speeds = side_by_side({"gradexp": lambda: gradexp_steps_per_s(wide),
                           "bare_loop": lambda: bare_loop_steps_per_s(wide),
                           "matmul_flops": lambda: matmul_flops_per_s(
                               256 if args.smoke else 2048,
                               repeats=5 if args.quick else 10)}, repeats)
    flops = [mlp_flops_per_step(wide, 32, 10) * s for s in speeds["gradexp"]]
    report("compute-bound MLP (width 1024, batch 512)", {
        **medians("steps_per_s_wide", {k: speeds[k] for k in ("gradexp", "bare_loop")}),
        **ratio("vs_bare_loop_wide", speeds["gradexp"], speeds["bare_loop"]),
        **medians("gflop_per_s", {"wide": [f / 1e9 for f in flops],
                                  "matmul": [f / 1e9 for f in speeds["matmul_flops"]]}),
        **ratio("flop_fraction", flops, speeds["matmul_flops"])})

    if not args.quick:  # each model compiles twice (~10 s): the full run only
        for name in ("cnn", "rnn", "transformer"):
            cfg = compose_cfg(steps // 3, *WORKLOADS[name])
            speeds = side_by_side({"gradexp": lambda cfg=cfg: gradexp_steps_per_s(cfg),
                                   "keras_fit": lambda cfg=cfg: keras_fit_steps_per_s(cfg)},
                                  repeats)
            report(f"{name}", ratio(f"vs_keras_fit_{name}", speeds["gradexp"],
                                    speeds["keras_fit"]))

        checkpointed = compose_cfg(steps, "trainer.checkpoint_every=100")
        speeds = side_by_side({"none": lambda: gradexp_steps_per_s(mlp),
                               "every_100": lambda: gradexp_steps_per_s(checkpointed)},
                              repeats)
        report("checkpoints", ratio("checkpoint_cost", speeds["none"], speeds["every_100"]))
        report("determinism", determinism_cost(steps, repeats))
        report("sweeps", bench_sweeps.measure(repeats))
    # tbparse takes ~17 s for 100 runs of 100 steps (2 cores): one round in --quick
    report("summarize", summarize_vs_tbparse(4 if args.smoke else 100,
                                             20 if args.smoke else 100 if args.quick else 1000,
                                             1 if args.quick else repeats))
    report("config error", figure("config_error_s", config_error_seconds(repeats)))
    print(json.dumps({k: float(f"{v:.6g}") for k, v in out.items()}))  # never 0 for v > 0
    return out

