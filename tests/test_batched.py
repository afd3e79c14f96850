"""A sweep's runs trained as one batch (gradexp/training/engine.py, `hydra/launcher=gradexp`) are
their separate runs, number for number: each test compares the batch's run directories with runs
made alone, byte for byte."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from hydra.experimental.callback import Callback
from test_sweep_resume import rows, start, summary_of, the_sweep, wait_for
from test_sweeps import TINY, runs, sweep

from conftest import QUICK, events, gradexp, processes_marked
from gradexp import train as training
from gradexp.sweeps import grouping
from gradexp.training import engine

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

# the launcher and the step as shipped (XLA on), short and narrow
XLA = ["trainer.jit_compile=true"]


def same_files(a: Path, b: Path, names=("metrics.csv",)) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{a / name} != {b / name}"


def test_a_batched_sweep_writes_the_basic_launchers_runs_byte_for_byte(tmp_path, monkeypatch):
    pair = ["clip=null,0.1", "seed=1"]  # two runs: what takes the suite's time is compiling
    basic_dir, basic = sweep(tmp_path / "basic", *pair, *XLA)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # XLA's compiles, as TensorFlow logs them
    monkeypatch.setenv("TF_CPP_VMODULE", "device_compiler=3")
    batch_dir, result = sweep(tmp_path / "batched", "hydra/launcher=gradexp", *pair, *XLA)
    assert basic.returncode == 0, basic.stderr
    assert result.returncode == 0, result.stderr
    # the batch's program compiled once, ahead (Engine.compile_ahead), and that program trains
    assert result.stderr.count("Instantly compiling for signature: __inference__part_steps") == 1
    assert "training 2 runs as one batch" in result.stdout  # clip=null and 0.1: bounds are data
    assert "sweep: 2 runs (2 completed)" in result.stdout
    for run in ("0", "1"):
        same_files(basic_dir / run, batch_dir / run)
        alone, batch = runs(basic_dir)[run], runs(batch_dir)[run]
        assert batch["final_loss"] == alone["final_loss"] and batch["steps"] == 20
        assert batch["val_accuracy"] == alone["val_accuracy"]
        log_lines = (batch_dir / run / "train.log").read_text().splitlines()
        assert sum("step 10/20" in line for line in log_lines) == 1  # its own lines only
        # its first step line: the program ready, before the first call (bench_sweeps' start)
        assert next(line for line in log_lines if "] step " in line).endswith(
            "step  0/20  the batch's step is compiled and ready")
        same_checkpoints(basic_dir / run, batch_dir / run)
        # provenance: recorded by the launcher when it set the run up, devices by the worker
        mine, theirs = (json.loads((d / run / "provenance.json").read_text())
                        for d in (batch_dir, basic_dir))
        assert mine["devices"] is not None and mine["devices"] == theirs["devices"]
        assert {k: mine[k] for k in ("code", "packages", "versions", "resumes")} == {
            k: theirs[k] for k in ("code", "packages", "versions", "resumes")}


@pytest.mark.parametrize("settings", [
    ["clipping=zclip,autoclip", "optimizer=adam"],
    ["clipping=adagc", "clipping.warmup_steps=5", "trainer.on_spike=skip",
     "trainer.spike_warmup=5", "trainer.spike_z=1.5", "optimizer=adamw",
     "precision=mixed_float16"]],
    ids=["zclip_autoclip_adam", "adagc_spike_skip_adamw_mixed_float16"])
def test_every_kind_of_state_batches_byte_for_byte(tmp_path, settings):
    """Clipping methods with state, trainer.on_spike=skip, Adam, AdamW (a Keras optimizer
    gradexp has no update code for) and mixed precision's loss scale: their state is a value
    the step carries, so their runs train as one batch (one per setting) and write the basic
    launcher's metrics.csv byte for byte. (Two sweeps hold them all: each sweep costs the suite
    its runs twice, alone and batched.)"""
    args = [*settings, "seed=0,1", "trainer.steps=40", "trainer.log_every=20", *XLA,
            "trainer.eval_every=40", "trainer.checkpoint_every=20"]
    basic_dir, basic = sweep(tmp_path / "basic", *args)
    batch_dir, result = sweep(tmp_path / "batched", "hydra/launcher=gradexp", *args)
    assert basic.returncode == 0, basic.stderr
    assert result.returncode == 0, result.stderr
    assert "one after another" not in result.stdout + result.stderr
    groups = 1 if "," not in settings[0] else 2
    assert (result.stdout + result.stderr).count("training 2 runs as one batch") == groups
    assert sorted(runs(batch_dir)) == sorted(runs(basic_dir)) == [str(i) for i in
                                                                  range(2 * groups)]
    for run in runs(basic_dir):
        same_files(basic_dir / run, batch_dir / run)
        same_checkpoints(basic_dir / run, batch_dir / run)
    if "trainer.on_spike=skip" in settings:  # the skip was exercised, not only the detector
        assert any(runs(basic_dir)[r]["spike_skipped_steps"] > 0 for r in runs(basic_dir))


def train_alone_and_batched(make_cfg, tmp_path, overrides, seeds):
    cfgs = [make_cfg(*overrides, f"seed={s}") for s in seeds]
    jobs = []
    for s, cfg in zip(seeds, cfgs, strict=True):
        for kind in ("alone", "batch"):
            (tmp_path / kind / str(s)).mkdir(parents=True)
        jobs.append(grouping.Job(cfg, tmp_path / "batch" / str(s), [f"seed={s}"]))
    together = training.train_batch(jobs)
    alone = [training.train(cfg, tmp_path / "alone" / str(s), [f"seed={s}"])
             for s, cfg in zip(seeds, cfgs, strict=True)]
    return alone, together


# lr 0.02 makes the loss of seeds 0 and 3 rise past 1.4 × its first value (at different steps),
# while seeds 1 and 2 stay below: a batch whose runs stop one by one
DIVERGING = ["optimizer.learning_rate=0.02", "trainer.divergence_factor=1.4",
             "trainer.steps=60", "trainer.log_every=10", "trainer.eval_every=30",
             "trainer.histogram_every=30", "trainer.checkpoint_every=30", "model.width=16",
             "trainer.jit_compile=false"]


def test_runs_of_a_batch_stop_at_their_own_divergence(make_cfg, tmp_path, caplog, monkeypatch):
    """(4 runs asked for 3 parts: 2 parts of 2, no part of padding only.)"""
    monkeypatch.setattr(engine, "parts_for", lambda runs, where: 3)
    caplog.set_level("INFO", logger="gradexp")
    alone, together = train_alone_and_batched(make_cfg, tmp_path, DIVERGING, [0, 1, 2, 3])
    assert "training 4 runs as one batch" in caplog.text and "2 parts at once" in caplog.text
    assert [s["status"] for s in together] == ["diverged", "completed", "completed", "diverged"]
    assert together[0]["diverged_step"] != together[3]["diverged_step"]
    compared = 0
    for s, a, b in zip(range(4), alone, together, strict=True):
        same_files(tmp_path / "alone" / str(s), tmp_path / "batch" / str(s))
        for key in ("status", "diverged_step", "steps", "final_loss", "val_loss"):
            assert a[key] == b[key], key
        same_checkpoints(tmp_path / "alone" / str(s), tmp_path / "batch" / str(s))
        compared += same_histograms(tmp_path / "alone" / str(s), tmp_path / "batch" / str(s))
    assert compared > 0  # the completed runs' histograms at steps 30 and 60 at least


def same_histograms(a: Path, b: Path) -> int:
    """Two runs' gradient histograms (steps, buckets), read by TensorBoard's loader, are equal
    (a batch computes every run's at once, each on its own state and its own batch); how many
    points were compared."""
    from tensorboard.util.tensor_util import make_ndarray

    loaded = [events(d) for d in (a, b)]
    tags = [[t for t in acc.Tags()["tensors"] if t.startswith("gradients/")] for acc in loaded]
    assert tags[0] == tags[1]
    points = 0
    for tag in tags[0]:
        mine, theirs = ([(e.step, make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
                        for acc in loaded)
        assert [step for step, _ in mine] == [step for step, _ in theirs] != []
        for (_, x), (_, y) in zip(mine, theirs, strict=True):
            np.testing.assert_array_equal(x, y, err_msg=tag)
            points += 1
    return points


def test_a_batch_of_transformers_is_its_runs_bit_for_bit_histograms_too(make_cfg, tmp_path):
    """The model whose histograms were the hardest: its gradients computed for every run in one
    loop were 1 ulp off its own run's (so a batch computes them run by run); its evaluations
    in one loop are exact."""
    quick = ["model=transformer", "dataset=digits", "trainer.steps=20", "trainer.log_every=10",
             "trainer.eval_every=10", "trainer.histogram_every=10", "trainer.jit_compile=true"]
    alone, together = train_alone_and_batched(make_cfg, tmp_path, quick, [0, 1])
    for s, a, b in zip((0, 1), alone, together, strict=True):
        assert a["val_loss"] == b["val_loss"] and a["final_loss"] == b["final_loss"]
        same_files(tmp_path / "alone" / str(s), tmp_path / "batch" / str(s))
        assert same_histograms(tmp_path / "alone" / str(s), tmp_path / "batch" / str(s)) > 0


def same_checkpoints(a: Path, b: Path) -> None:
    """The latest checkpoints of two runs hold the same step and the same values: a run that
    stopped early in a batch keeps its own last state, not the batch's."""
    from gradexp._tf import tf

    a_ckpt, b_ckpt = (max((d / "checkpoints").glob("step-*.index"),
                          key=lambda p: int(p.name.split("-")[1].split(".")[0])) for d in (a, b))
    assert a_ckpt.name == b_ckpt.name
    readers = [tf.train.load_checkpoint(str(p.with_suffix(""))) for p in (a_ckpt, b_ckpt)]
    shapes = readers[0].get_variable_to_shape_map()
    assert shapes == readers[1].get_variable_to_shape_map()
    assert {name.split("/")[0] for name in shapes} >= {"model", "optimizer"}
    for name in shapes.keys() - {"_CHECKPOINTABLE_OBJECT_GRAPH"}:
        np.testing.assert_array_equal(readers[0].get_tensor(name), readers[1].get_tensor(name),
                                      err_msg=name)


def test_runs_of_other_bounds_and_learning_rates_share_one_batch(make_cfg, tmp_path, caplog,
                                                                  monkeypatch):
    """Clip bounds and the learning rate are state (a layer weight, an optimizer variable),
    so runs that differ in them are one batch, each with its own values; the 3 runs computed
    in 2 parts (one padded with a run never computed), whatever the machine's cores."""
    monkeypatch.setattr(engine, "parts_for", lambda runs, where: 2)
    quick = ["trainer.steps=20", "trainer.log_every=10", "trainer.eval_every=20",
             "trainer.histogram_every=0", "model.width=8", "trainer.jit_compile=false"]
    settings = [["clip=null", "optimizer.learning_rate=0.001"],
                ["clip=0.01", "optimizer.learning_rate=0.003"],
                ["layer.clip_min=-0.02", "layer.clip_max=0.05", "optimizer.learning_rate=0.002"]]
    caplog.set_level("INFO", logger="gradexp")
    jobs, alone = [], []
    for i, s in enumerate(settings):
        cfg = make_cfg(*quick, *s)
        for kind in ("alone", "batch"):
            (tmp_path / kind / str(i)).mkdir(parents=True)
        jobs.append(grouping.Job(cfg, tmp_path / "batch" / str(i), s))
        alone.append(training.train(cfg, tmp_path / "alone" / str(i), s))
    together = training.train_batch(jobs)
    assert "training 3 runs as one batch" in caplog.text and "2 parts at once" in caplog.text
    for i in range(3):
        same_files(tmp_path / "alone" / str(i), tmp_path / "batch" / str(i))
        assert together[i]["final_loss"] == alone[i]["final_loss"]
    assert len({s["final_loss"] for s in together}) == 3


def test_runs_that_cannot_share_a_program_train_each_on_its_own(tmp_path):
    """deterministic=true promises each run its own program: the launcher, from the configs
    alone, before TensorFlow loads, sends each such run on its own and says why in its log;
    each is the basic launcher's run, byte for byte."""
    args = ["deterministic=true", "seed=0,1"]
    basic_dir, basic = sweep(tmp_path / "basic", *args)
    batch_dir, result = sweep(tmp_path / "batched", "hydra/launcher=gradexp", *args)
    assert basic.returncode == 0 and result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    for job in ("0", "1"):
        assert f"#{job} trains on its own: deterministic=true" in out
        same_files(basic_dir / job, batch_dir / job)
    assert "as one batch" not in out


@pytest.mark.parametrize("make", [
    lambda k: k.optimizers.SGD(0.1), lambda k: k.optimizers.SGD(0.1, momentum=0.9),
    lambda k: k.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    lambda k: k.optimizers.Adam(0.1), lambda k: k.optimizers.AdamW(0.1, weight_decay=0.1),
    lambda k: k.optimizers.Lion(0.1),
    lambda k: k.optimizers.LossScaleOptimizer(k.optimizers.Adam(0.1))],
    ids=["sgd", "momentum", "nesterov", "adam", "adamw", "lion", "loss_scale"])
def test_the_stateless_update_is_kerass_update(make):
    """gradexp.parts.optimizers.stateless_update is Keras's own stateless_apply for any optimizer:
    three steps of it on the same gradients, compiled by XLA, give Keras's `apply` bit for bit,
    and leave the optimizer's variables as they were."""
    from gradexp._tf import keras, tf
    from gradexp.parts import optimizers

    rng = np.random.default_rng(0)
    start = [rng.normal(size=(3, 2)).astype("float32"), rng.normal(size=2).astype("float32")]
    grads = [[tf.constant(rng.normal(size=v.shape).astype("float32")) for v in start]
             for _ in range(3)]
    params, ours_params = ([keras.Variable(v) for v in start] for _ in range(2))
    keras_opt, ours = make(keras), make(keras)
    keras_opt.build(params)
    ours.build(ours_params)
    update = tf.function(optimizers.stateless_update(ours, ours_params), jit_compile=True)
    apply = tf.function(lambda g: keras_opt.apply(g, params), jit_compile=True)
    untouched = [v.numpy().copy() for v in (*ours_params, *ours.variables)]
    values, state = [v.value for v in ours_params], [v.value for v in ours.variables]
    for g in grads:
        apply(g)
        values, state = update(state, g, values)
    for theirs, mine in zip((*params, *keras_opt.variables), (*values, *state), strict=True):
        np.testing.assert_array_equal(np.asarray(theirs.value), np.asarray(mine))
    for v, before in zip((*ours_params, *ours.variables), untouched, strict=True):
        np.testing.assert_array_equal(np.asarray(v.value), before)
    assert not np.array_equal(np.asarray(values[0]), start[0])


def test_the_program_compiled_ahead_is_the_one_that_trains(make_cfg, tmp_path):
    """Engine.compile_ahead traces a part's program on the first run alone and calls it once
    (in a thread, while the other runs are set up) without writing the stacked state; training
    reuses that trace, and `load` puts each run's own values in its slot. (That XLA compiled
    the program once in all: the byte-for-byte sweep test.)"""
    from gradexp._tf import tf

    cfgs = [make_cfg(*QUICK, *XLA, f"seed={s}") for s in (0, 1, 2)]
    jobs = [grouping.Job(cfg, tmp_path / str(s), []) for s, cfg in enumerate(cfgs)]
    for job in jobs:
        job.run_dir.mkdir()
    runs = [training.start(jobs[0])]
    batch = engine.Engine(runs[0], len(cfgs))
    batch.compile_ahead().result()
    assert batch.part_steps.experimental_get_tracing_count() == 1
    first = [v.numpy() for v in engine.own_variables(runs[0])]
    for stacked, v in zip(batch.parts[0], first, strict=True):  # the call wrote nothing
        np.testing.assert_array_equal(stacked.numpy(), np.stack([v] * batch.size))
    runs += [training.start(job, arrays=runs[0].arrays, free_memory=False) for job in jobs[1:]]
    batch.load(runs)
    for k, run in enumerate(runs):
        part, slot = batch.parts[k // batch.size], k % batch.size
        for stacked, v in zip(part, engine.own_variables(run), strict=True):
            np.testing.assert_array_equal(stacked[slot].numpy(), v.numpy())
    assert batch.seeds.numpy().tolist()[:3] == [0, 1, 2]
    rows, done, _ = batch.train_steps(tf.constant(0, tf.int64), tf.constant(2),
                                      tf.ones([3], tf.bool))
    assert done.numpy().tolist() == [2, 2, 2] and rows.shape[1] == 3
    assert batch.part_steps.experimental_get_tracing_count() == 1


def test_a_batch_on_a_cpu_has_a_part_per_core_and_on_a_gpu_one():
    cores = len(os.sched_getaffinity(0))
    assert engine.parts_for(10, "cpu") == min(10, cores)
    assert engine.parts_for(1, "cpu") == 1
    assert engine.parts_for(10, "1 gpu") == 1


def test_the_launcher_groups_by_structure_splits_at_max_batch_and_for_its_workers(make_cfg):
    """hydra/launcher=gradexp's batches: one per structure, at most max_batch runs each, and
    the largest split while there are fewer batches than workers, into halves that each hold
    every setting of the sweep (jobs interleaved), so that halves of a sweep whose unclipped
    runs stop early keep equal work."""
    from hydra_plugins.gradexp_launcher.gradexp_launcher import GradexpLauncher

    configs = [make_cfg(f"clip={c}", f"seed={s}") for c in ("null", "0.1") for s in (0, 1, 2)]
    configs.append(make_cfg("model.width=8"))  # another structure: its own batch

    def groups(max_batch=32, workers=1):
        return GradexpLauncher(max_batch, workers).groups(configs)

    assert groups() == [[0, 1, 2, 3, 4, 5], [6]]
    assert groups(max_batch=4) == [[0, 1, 2, 3], [4, 5], [6]]
    assert groups(workers=2) == [[0, 1, 2, 3, 4, 5], [6]]  # two batches already
    assert groups(workers=3) == [[0, 2, 4], [1, 3, 5], [6]]  # clip=null and 0.1 in both
    assert groups(workers=4) == [[0, 4], [2], [1, 3, 5], [6]]
    assert groups(workers=9) == [[0], [4], [2], [1], [5], [3], [6]]  # no batch left to split
    configs.extend(make_cfg("deterministic=true", f"seed={s}") for s in (0, 1))
    assert groups() == [[0, 1, 2, 3, 4, 5], [6], [7], [8]]  # each on its own
    with pytest.raises(ValueError, match="hydra.launcher.workers=0: must be at least 1"):
        GradexpLauncher(32, 0)


def test_the_command_line_that_names_the_launcher_forks_its_workers_before_hydra_starts():
    """gradexp.sweeps.worker.early_workers: the workers forked at the entry point (their TensorFlow
    import is what a batched sweep waits for) only for a sweep whose command line names the
    launcher and no option Hydra answers without a sweep."""
    from gradexp.sweeps.worker import early_workers

    assert early_workers(["-m", "hydra/launcher=gradexp", "clip=null,0.1"]) == 1
    assert early_workers(["clip=0.1", "--multirun", "hydra/launcher=gradexp",
                          "hydra.launcher.workers=3"]) == 3
    assert early_workers(["hydra/launcher=gradexp", "clip=0.1"]) == 0  # one run: no sweep
    assert early_workers(["-m", "clip=null,0.1"]) == 0  # the basic launcher
    assert early_workers(["-m", "+experiment=exploding_rnn"]) == 0  # a config's: Prestart
    for option in ("--help", "--cfg", "-cd"):
        assert early_workers(["-m", "hydra/launcher=gradexp", option]) == 0
    assert early_workers(["-m", "hydra/launcher=gradexp", "hydra.launcher.workers=two"]) == 0


def test_a_batched_sweep_with_a_bad_value_fails_in_one_line_and_leaves_no_worker(tmp_path):
    """The worker forked at the entry point goes when the sweep ends before it starts."""
    import time
    import uuid

    mark = f"GRADEXP_TEST_{uuid.uuid4().hex}"
    os.environ[mark] = "1"  # inherited by the sweep's processes: found in /proc/*/environ
    try:
        result = gradexp("gradexp.train", "-m", "hydra/launcher=gradexp", "clip=-1,0.1",
                         cwd=tmp_path)
    finally:
        del os.environ[mark]
    assert result.returncode == 2 and result.stderr.startswith("error: clip=-1"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

    deadline = time.monotonic() + 10  # the worker's SIGTERM, sent as the sweep exits
    while processes_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_marked(mark)


def test_a_batch_of_cnns_is_its_runs_bit_for_bit(make_cfg, tmp_path):
    """Every model batches: a batch of convolutional networks (whose XLA-compiled convolutions,
    looped over the runs, once took another order of operations) is its runs alone."""
    quick = ["model=cnn", "dataset=digits", "model.filters=4", "model.width=8",
             "trainer.steps=20", "trainer.log_every=10", "trainer.eval_every=10",
             "trainer.histogram_every=10", *XLA]
    for model in (quick, ["model=rnn", "dataset=adding"],
                  ["model=transformer", "dataset=digits", "trainer.jit_compile=false"]):
        assert grouping.why_separate(make_cfg(*model)) is None
    alone, together = train_alone_and_batched(make_cfg, tmp_path, quick, [0, 1])
    for s, a, b in zip((0, 1), alone, together, strict=True):
        assert a["val_loss"] == b["val_loss"] and a["final_loss"] == b["final_loss"]
        same_files(tmp_path / "alone" / str(s), tmp_path / "batch" / str(s))
        same_checkpoints(tmp_path / "alone" / str(s), tmp_path / "batch" / str(s))
        assert same_histograms(tmp_path / "alone" / str(s), tmp_path / "batch" / str(s)) > 0


# long enough that a signal sent once 40 rows are on disk lands mid-run (20-step calls)
STOPPABLE = ["hydra/launcher=gradexp", "clip=null,0.1", "seed=0", "trainer.steps=1500",
             "trainer.log_every=20", "trainer.eval_every=500", "trainer.histogram_every=0",
             "trainer.checkpoint_every=500", "model.width=16", "trainer.jit_compile=false"]


def worker_of(process) -> int:
    """The pid of the launcher's worker process (gradexp/sweeps/worker.py): its one child."""
    (child,) = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    return int(child)


def test_a_stopped_batch_resumes_and_a_dead_worker_s_runs_train_again(tmp_path):
    """SIGTERM: every run of the batch checkpoints, is interrupted, and `resume=<sweep dir>`
    finishes them; the worker killed (as by the OOM killer): its runs are trained again one by
    one. Both sweeps end with the metrics of the one that was left alone, byte for byte."""
    whole = start(tmp_path / "whole", "-m", *STOPPABLE)
    for what in ("stopped", "killed"):
        process = start(tmp_path / what, "-m", *STOPPABLE)
        run = wait_for(lambda w=what: next((tmp_path / w).glob("outputs/multirun/*/*/1"), None),
                       process, "the second run's directory")
        wait_for(lambda r=run: rows(r / "metrics.csv") > 40, process, "rows")
        if what == "stopped":
            process.send_signal(signal.SIGTERM)
        else:
            os.kill(worker_of(process), signal.SIGKILL)
        out, err = process.communicate(timeout=300)
        sweep_dir = the_sweep(tmp_path / what)
        if what == "stopped":
            assert process.returncode == 128 + signal.SIGTERM, err
            for r in ("0", "1"):
                summary = summary_of(sweep_dir / r)
                assert summary["status"] == "interrupted" and summary["stopped_by"] == "SIGTERM"
                assert 40 < summary["steps"] < 1500
            resumed = gradexp("gradexp.train", f"resume={sweep_dir}", cwd=tmp_path, timeout=600)
            assert resumed.returncode == 0, resumed.stderr
            assert "sweep: 2 runs (2 completed)" in resumed.stdout
        else:
            assert process.returncode == 0, err
            assert "the batch of 2 runs failed (WorkerDied" in err + out
            assert "sweep: 2 runs (2 completed)" in out
    assert whole.wait(timeout=600) == 0
    for what in ("stopped", "killed"):
        for r in ("0", "1"):
            assert summary_of(the_sweep(tmp_path / what) / r)["steps"] == 1500
            same_files(the_sweep(tmp_path / "whole") / r, the_sweep(tmp_path / what) / r)


ENDED: list = []  # (job, its return's status, summary.json's status when on_job_end ran)


class RecordEnd(Callback):
    """A user's callback, in this process: what each job's on_job_end sees (HydraConfig is the
    job's own while it runs, as under any launcher)."""

    def on_job_end(self, config, job_return, **kwargs):
        from hydra.core.hydra_config import HydraConfig

        on_disk = json.loads((Path(config.hydra.runtime.output_dir) / "summary.json").read_text())
        assert HydraConfig.get().job.num == config.hydra.job.num
        ENDED.append((config.hydra.job.num, job_return.return_value["status"],
                      on_disk["status"]))


LAUNCHER_LOG = "hydra_plugins.gradexp_launcher.gradexp_launcher"


def test_the_launcher_in_this_process_batches_a_structure_and_holds_each_job_end(
        tmp_path, monkeypatch):
    """hydra/launcher=gradexp run here (mutation testing sees only this process; TensorFlow is
    loaded, so no worker is forked and the batches train in this process): 4 jobs, 3 groups (the
    two deterministic runs each alone, the log says why); the batch's runs each log to their
    own file in the job's file format and record the batch in summary.json; a user's
    on_job_end sees each run finished, once."""
    import re

    from conftest import in_this_process, logged_lines

    monkeypatch.chdir(tmp_path)
    ENDED.clear()
    lines = logged_lines(monkeypatch, LAUNCHER_LOG, "gradexp")
    in_this_process(monkeypatch, "-m", "hydra/launcher=gradexp", *TINY, "clip=null,0.1",
                    "deterministic=false,true", "hydra.sweep.dir=sweep",
                    "+hydra.callbacks.mine._target_=test_batched.RecordEnd")
    done = runs(tmp_path / "sweep")
    together = sorted(j for j, s in done.items() if not s["config"]["deterministic"])
    alone = sorted(j for j, s in done.items() if s["config"]["deterministic"])
    assert len(together) == len(alone) == 2
    assert "Launching 4 jobs in 3 groups, sweep output dir: sweep" in lines
    for j, summary in done.items():  # each job's own overrides, before it is set up
        assert f"\t#{j} : {' '.join(summary['overrides'])}" in lines
    for j in alone:
        assert (f"\t#{j} trains on its own: deterministic=true: each run is its own program, "
                "bit for bit") in lines
        assert "batch" not in done[j]
    assert sum(line.startswith("training 2 runs as one batch") for line in lines) == 1
    first = str(tmp_path / "sweep" / together[0])
    for k, j in enumerate(together):
        assert done[j]["batch"] == {"runs": 2, "first": first, "index": k}
    for j, summary in done.items():
        assert summary["status"] == "completed" and summary["steps"] == 20
        log = (tmp_path / "sweep" / j / "train.log").read_text().splitlines()
        assert sum("step 20/20" in line for line in log) == 1  # its own lines only
        assert all(re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] ", line) for line in log)
        assert (tmp_path / "sweep" / j / "provenance.json").is_file()
    assert sorted(ENDED) == [(int(j), "completed", "completed") for j in sorted(done, key=int)]


def test_a_batch_that_fails_whole_in_this_process_trains_its_runs_one_by_one(
        tmp_path, monkeypatch):
    """64 examples of which 51 train, batches of 64: the batch of two fails as a whole; the
    launcher says so, clears its runs and trains each on its own, where each fails and is
    recorded so; each job's on_job_end is called once, with the run's failure; the sweep
    ends with exit status 1 (runs did not finish)."""
    from conftest import in_this_process, logged_lines

    monkeypatch.chdir(tmp_path)
    ENDED.clear()
    lines = logged_lines(monkeypatch, LAUNCHER_LOG)
    with pytest.raises(SystemExit) as exit:
        in_this_process(monkeypatch, "-m", "hydra/launcher=gradexp", *TINY, "seed=0,1",
                        "dataset=teacher", "dataset.num_examples=64", "hydra.sweep.dir=sweep",
                        "+hydra.callbacks.mine._target_=test_batched.RecordEnd")
    assert exit.value.code == 1
    (failure,) = [line for line in lines if "failed" in line]
    assert failure.startswith("the batch of 2 runs failed (") and failure.endswith(
        "); training them one by one")
    done = runs(tmp_path / "sweep")
    assert {j: s["status"] for j, s in done.items()} == {"0": "failed", "1": "failed"}
    assert sorted(ENDED) == [(0, "failed", "failed"), (1, "failed", "failed")]
