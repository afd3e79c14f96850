"""Real Hydra multiruns through real launchers, and TensorBoard serving a sweep."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, gradexp

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

# Launchers are the subject here, not the step: no XLA compile (~3 s a run) for 20 steps.
TINY = ["trainer.jit_compile=false", "trainer.steps=20", "trainer.log_every=10",
        "trainer.eval_every=20", "trainer.histogram_every=0", "model.width=8"]
SWEEP = ["clip=null,0.1", "seed=0,1"]


def sweep(cwd: Path, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    cwd.mkdir(parents=True, exist_ok=True)
    result = gradexp("gradexp.train", "-m", *TINY, *args, cwd=cwd, timeout=600)  # args win
    (sweep_dir,) = (cwd / "outputs" / "multirun").glob("*/*")
    return sweep_dir, result


def runs(sweep_dir: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "summary.json").read_text())
            for d in sorted(sweep_dir.iterdir()) if (d / ".hydra").is_dir()}


def assert_four_completed_runs(sweep_dir: Path, result) -> None:
    assert result.returncode == 0, result.stderr
    done = runs(sweep_dir)
    assert sorted(done) == ["0", "1", "2", "3"]
    assert {s["status"] for s in done.values()} == {"completed"}
    settings = sorted((s["config"]["clip"] is None, s["config"]["seed"]) for s in done.values())
    assert settings == [(False, 0), (False, 1), (True, 0), (True, 1)]
    assert (sweep_dir / "multirun.yaml").exists()
    assert "sweep: 4 runs (4 completed)" in result.stdout
    assert_summary_compares_clip_with_baseline(sweep_dir)


def assert_summary_compares_clip_with_baseline(sweep_dir: Path, paired: int = 2) -> None:
    """`python -m gradexp.summarize DIR`: a row per clip setting, clip=0.1 against clip=null."""
    result = gradexp("gradexp.summarize", str(sweep_dir), cwd=sweep_dir)
    assert result.returncode == 0, result.stderr
    tidy = pd.read_csv(sweep_dir / "summary.csv", keep_default_na=False, na_values=[""])
    assert sorted(set(tidy["clip"])) == ["0.1", "null"]
    final = tidy[(tidy["metric"] == "final_loss")].set_index("clip")
    assert final.loc["0.1", "baseline"] == "clip=null" and final.loc["0.1", "n_paired"] == paired
    diff = final.loc["0.1", "mean"] - final.loc["null", "mean"]
    assert final.loc["0.1", "diff_mean"] == pytest.approx(diff)
    clipped = tidy[tidy["metric"] == "clip_fraction"].set_index("clip")
    assert clipped.loc["0.1", "mean"] > 0 and clipped.loc["null", "mean"] == 0


@pytest.fixture(scope="module")
def basic_sweep(tmp_path_factory):  # deterministic: the Ray launcher's numbers must equal these
    return sweep(tmp_path_factory.mktemp("basic"), *SWEEP, "deterministic=true")


def test_basic_launcher(basic_sweep):
    sweep_dir, result = basic_sweep
    assert_four_completed_runs(sweep_dir, result)
    # the trainer's final loss (last 10% of steps) and the summary's are one definition
    table = pd.read_csv(sweep_dir / "runs.csv", keep_default_na=False, na_values=[""])
    for run in table.itertuples():
        trainer = json.loads((sweep_dir / str(run.run) / "summary.json").read_text())["final_loss"]
        assert run.final_loss == trainer  # to the last digit
    assert (sweep_dir / "0" / ".hydra" / "overrides.yaml").read_text().count("clip=null") == 1


@pytest.mark.parametrize("launcher", ["basic", "gradexp"])
def test_a_sweep_into_a_taken_directory_trains_its_own_runs_beside_it(tmp_path, monkeypatch,
                                                                      launcher):
    """Two sweeps started in the same second share multirun/<date>/<time>/ (here both are
    given `hydra.sweep.dir=taken`): the second moves to taken_1, and its jobs train there,
    not in the first's job directories (where a finished run would be kept as theirs)."""
    from fake_runs import ending_at, write_run

    from conftest import in_this_process

    monkeypatch.chdir(tmp_path)
    first = write_run(tmp_path / "taken" / "0", ["clip=5"], ending_at(1.0))
    before = (first / "summary.json").read_text()
    in_this_process(monkeypatch, "-m", f"hydra/launcher={launcher}", *TINY, "clip=0.1,1",
                    "hydra.sweep.dir=taken")
    assert (first / "summary.json").read_text() == before
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["0"]
    done = runs(tmp_path / "taken_1")
    assert {k: (s["status"], s["config"]["clip"]) for k, s in done.items()} == {
        "0": ("completed", 0.1), "1": ("completed", 1.0)}


def test_joblib_launcher_runs_do_not_leak_into_each_other(tmp_path):
    """Two workers for six runs, so workers are reused; seed 1 twice per clip setting: job 1
    starts a fresh worker, job 2 a reused one, and their tables must be identical."""
    sweep_dir, result = sweep(tmp_path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                              "clip=null,0.1", "seed=0,1,1")
    assert result.returncode == 0, result.stderr
    assert "sweep: 6 runs (6 completed)" in result.stdout
    assert len({s["config"]["seed"] for s in runs(sweep_dir).values()}) == 2
    for first, again in (("1", "2"), ("4", "5")):
        pd.testing.assert_frame_equal(pd.read_csv(sweep_dir / first / "metrics.csv"),
                                      pd.read_csv(sweep_dir / again / "metrics.csv"))
    assert_summary_compares_clip_with_baseline(sweep_dir, paired=2)


def test_submitit_local_launcher(tmp_path):
    sweep_dir, result = sweep(tmp_path, "hydra/launcher=submitit_local", *SWEEP)
    assert_four_completed_runs(sweep_dir, result)
    assert (sweep_dir / ".submitit").is_dir()


def test_a_crashed_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    # a batch larger than the dataset fails inside the run, after the config checks
    sweep_dir, result = sweep(tmp_path, "trainer.batch_size=100000,16")
    assert result.returncode == 1
    done = runs(sweep_dir)
    assert done["0"]["status"] == "failed" and "trainer.batch_size=100000" in done["0"]["error"]
    assert done["1"]["status"] == "completed"
    assert "runs that did not finish: 0" in result.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
    with opener.open(request, timeout=10) as response:
        return json.loads(response.read())


BAND_RUNS = ["summary_tb/clip-null", "summary_tb/clip-0.1"]  # summarize --tensorboard's


@pytest.fixture(scope="module")
def served_sweep(basic_sweep):
    """TensorBoard over the basic sweep after `summarize DIR --tensorboard`, every run loaded:
    (sweep dir, the plugins' base URL, the scalar tags per run)."""
    sweep_dir, _ = basic_sweep
    result = gradexp("gradexp.summarize", str(sweep_dir), "--tensorboard", cwd=sweep_dir)
    assert result.returncode == 0, result.stderr
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(sweep_dir), "--host",
         "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "NO_PROXY": "*"})
    base = f"http://127.0.0.1:{port}/data/plugin"
    wanted = {"0", "1", "2", "3", *BAND_RUNS}
    try:
        tags, deadline = {}, time.monotonic() + 120
        while time.monotonic() < deadline and not wanted <= set(tags):  # loading is
            try:                                                         # asynchronous: poll
                tags = get(f"{base}/scalars/tags")
            except OSError:
                pass
            time.sleep(1)
        yield sweep_dir, base, tags
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_tensorboard_serves_the_sweep(served_sweep):
    sweep_dir, base, tags = served_sweep
    assert set(tags) >= {"0", "1", "2", "3"}
    assert {"loss/train", "grad_norm/dense_1/pre", "grad_norm/dense_1/post",
            "clip_fraction/dense_1", "final/loss"} <= set(tags["2"])
    points = get(f"{base}/scalars/scalars?run=2&tag=loss/train")
    assert [p[1] for p in points] == list(range(1, 21))

    experiment = get(f"{base}/hparams/experiment", {"experimentName": ""})
    infos = {h["name"]: h for h in experiment["hparamInfos"]}
    assert sorted(infos["clip"]["domainDiscrete"]) == ["0.1", "null"]
    assert {m["name"]["tag"] for m in experiment["metricInfos"]} >= {"final/loss"}
    groups = get(f"{base}/hparams/session_groups", {
        "experimentName": "", "startIndex": 0, "sliceSize": 100,
        "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                            "STATUS_RUNNING"], "colParams": []})
    assert len(groups["sessionGroups"]) == 4  # the summary's runs are no sessions
    assert {g["hparams"]["clip"] for g in groups["sessionGroups"]} == {"null", "0.1"}

    layout = get(f"{base}/custom_scalars/layout")
    charts = [c["multiline"]["tag"][0] for cat in layout["category"] for c in cat["chart"]
              if "multiline" in c]
    assert "^grad_norm/dense_1/(pre|post)$" in charts


def test_a_sweep_over_parameter_clipping_methods_runs_and_summarizes(tmp_path):
    methods = ["none", "global_norm", "agc", "autoclip", "zclip"]
    sweep_dir, result = sweep(tmp_path, f"clipping={','.join(methods)}")
    assert result.returncode == 0, result.stderr
    assert {s["config"]["clipping"]["name"] for s in runs(sweep_dir).values()} == set(methods)
    summarized = gradexp("gradexp.summarize", str(sweep_dir), cwd=tmp_path)
    assert summarized.returncode == 0, summarized.stderr
    assert "Baseline clipping=none" in summarized.stdout  # the default when clip is not swept
    tidy = pd.read_csv(sweep_dir / "summary.csv", keep_default_na=False, na_values=[""])
    final = tidy[tidy["metric"] == "final_loss"].set_index("clipping")
    assert sorted(final.index) == sorted(methods)
    assert (final.drop(index="none")["baseline"] == "clipping=none").all()


def test_an_hparam_has_one_type_in_every_run_whichever_method_the_run_uses(make_cfg, tmp_path):
    """clipping.max_norm may be null under global_norm and not under norm, dataset.num_examples
    likewise under mnist and teacher: a sweep over both methods (or datasets) gets one HParams
    column per key. Each key has one type in every run's HParams (a string "40.0" in one run and
    the number 20.0 in another put the number outside the sweep's string domain, and
    TensorBoard hid those runs, tensorboard#2942), and every run's value is in the domain of the
    sweep's HParams experiment."""
    from conftest import hparams_experiment
    from gradexp.training.logs import hparams, write_hparams_config

    configs = [make_cfg("clipping=global_norm"), make_cfg("clipping=norm"),
               make_cfg("clipping=global_norm", "clipping.max_norm=null"),
               make_cfg("dataset=mnist"), make_cfg("dataset=teacher")]
    runs = [hparams(c) for c in configs]
    assert [r["clipping.max_norm"] for r in runs[:3]] == ["40.0", "20.0", "null"]
    for key in set().union(*runs):
        assert len({type(r[key]) for r in runs if key in r}) == 1, key
    write_hparams_config(tmp_path, configs)
    domains = hparams_experiment(tmp_path).domains
    for run in runs:
        for key, value in run.items():  # a string among strings, a number among numbers
            assert any(value == v and isinstance(value, str) == isinstance(v, str)
                       for v in domains[key]), (key, value, domains[key])


def test_tensorboard_serves_the_summary_bands_of_a_real_sweep(served_sweep):
    """`summarize DIR --tensorboard` on the 4-run sweep (clip=null,0.1 × 2 seeds): TensorBoard
    over DIR serves the runs summary_tb/clip-null and summary_tb/clip-0.1 and their margin
    charts, and each step's mean/lower/upper equals the mean and 95% log-scale t interval of the two
    seeds' metrics.csv values worked out here with numpy."""
    import numpy as np
    from scipy.stats import t
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sweep_dir, base, tags = served_sweep
    metrics = ["loss/train", "loss/val", "grad_norm/global"]
    for run in BAND_RUNS:
        assert {f"{kind}/{m}" for kind in ("mean", "lower", "upper") for m in metrics} <= \
            set(tags[run])
    layout = get(f"{base}/custom_scalars/layout")
    margins = {c["title"]: c["margin"]["series"] for cat in layout["category"]
               for c in cat["chart"] if "margin" in c}
    for m in metrics:
        assert margins[m] == [{"value": f"mean/{m}", "lower": f"lower/{m}",
                               "upper": f"upper/{m}"}]
    served = {}
    for kind in ("mean", "lower", "upper"):  # what a margin chart fetches, once all 20 loaded
        served[kind], deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline and len(served[kind]) < 20:
            served[kind] = get(f"{base}/custom_scalars/download_data?run=summary_tb/clip-0.1"
                               f"&tag={kind}/loss/train&format=json")

    table = {}  # clip → the seeds' metrics.csv
    for run in sorted(p for p in sweep_dir.iterdir() if (p / ".hydra").is_dir()):
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed"  # no run cut short: every step has both seeds
        clip = "null" if summary["config"]["clip"] is None else str(summary["config"]["clip"])
        table.setdefault(clip, []).append(pd.read_csv(run / "metrics.csv").set_index("step"))
    for clip, seeds in table.items():
        events = EventAccumulator(str(sweep_dir / "summary_tb" / f"clip-{clip}"),
                                  size_guidance={"tensors": 0})
        events.Reload()
        for m in metrics:
            x = np.stack([s[m].to_numpy(float) for s in seeds])  # seeds × steps
            steps = seeds[0].index.to_numpy()[~np.isnan(x).any(axis=0)]
            x = x[:, ~np.isnan(x).any(axis=0)]  # loss/val: the evaluated steps
            assert steps.tolist() == ([20] if m == "loss/val" else list(range(1, 21)))
            mean = x.mean(axis=0)
            half = t.ppf(0.975, df=1) * x.std(axis=0, ddof=1) / np.sqrt(2)
            factor = np.exp(half / mean)  # non-negative values: the interval on the log scale
            for kind, expected in (("mean", mean), ("lower", mean / factor),
                                   ("upper", mean * factor)):
                points = events.Tensors(f"{kind}/{m}")
                assert [e.step for e in points] == steps.tolist()
                read = [e.tensor_proto.float_val[0] for e in points]
                np.testing.assert_allclose(read, expected, rtol=2e-7, atol=1e-7)
                if clip == "0.1" and m == "loss/train":
                    assert [p[2] for p in served[kind]] == read  # TensorBoard serves the same


@pytest.fixture(scope="module")
def ray_cluster():
    """`ray start --head` on this machine (2 CPUs, free ports, a temp dir of its own), as a user
    starts a cluster's head; yields its address. Stopped at the end, even when a test fails, by
    signalling its process group: `ray stop` would stop every Ray runtime on the machine."""
    # Ray 2.5x turns token authentication on for `ray start` when ~/.ray/auth_token exists, but
    # not for a driver given an explicit address: say "off" to both, whatever this machine has
    patch = pytest.MonkeyPatch()
    patch.setenv("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live here
    log = Path(temp_dir, "head.log")
    port = free_port()
    with open(log, "w") as out:
        head = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
             "--num-cpus=2", f"--port={port}", f"--ray-client-server-port={free_port()}",
             f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})  # the workers import this checkout
    try:
        deadline = time.monotonic() + 300
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(1)
        yield f"127.0.0.1:{port}"
    finally:
        stop_process_group(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
        patch.undo()


def stop_process_group(leader: subprocess.Popen, grace: float = 5) -> None:
    """SIGTERM to the group (`ray start --block` then stops what it started), SIGKILL to
    whatever is left of it after `grace` seconds (Ray's GCS server can take 30 s to go)."""
    os.killpg(leader.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(leader.pid, 0)
        except ProcessLookupError:
            break
        leader.poll()  # reap the leader
        time.sleep(0.5)
    else:
        try:
            os.killpg(leader.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    leader.wait(timeout=30)


def test_ray_launcher_gives_the_basic_launchers_numbers(ray_cluster, basic_sweep, tmp_path):
    """The 4-run sweep on a local Ray cluster (1 CPU a job, 2 at once, a fresh worker process
    per job) writes the same numbers as the basic launcher, byte for byte."""
    sweep_dir, result = sweep(tmp_path, "hydra/launcher=ray",
                              f"hydra.launcher.address={ray_cluster}", *SWEEP,
                              "deterministic=true")
    assert_four_completed_runs(sweep_dir, result)
    basic_dir, _ = basic_sweep
    for job in ("0", "1", "2", "3"):
        ray_metrics = (sweep_dir / job / "metrics.csv").read_bytes()
        assert ray_metrics == (basic_dir / job / "metrics.csv").read_bytes(), job
    assert gradexp("gradexp.summarize", str(basic_dir), cwd=basic_dir).returncode == 0
    assert (sweep_dir / "runs.csv").read_bytes() == (basic_dir / "runs.csv").read_bytes()
    # max_calls=1: every run in a process of its own (its pid ends TensorBoard's file name)
    pids = {next(sweep_dir.glob(f"{job}/events.out.tfevents.*")).name.split(".")[-2]
            for job in ("0", "1", "2", "3")}
    assert len(pids) == 4


def test_ray_launcher_survives_a_killed_worker_and_stops_cleanly_on_sigterm(ray_cluster,
                                                                           tmp_path):
    """Two long runs on the cluster: run 0's worker is killed (SIGKILL), then the launching
    process gets SIGTERM. Run 1 stops at its next safe point with a checkpoint; run 0 stays
    `running` (killed, resumable); the launcher exits 128 + SIGTERM."""
    args = ["-m", "gradexp.train", "-m", "hydra/launcher=ray",
            f"hydra.launcher.address={ray_cluster}", "seed=0,1", *TINY, "trainer.steps=1000000",
            "trainer.eval_every=1000000", "trainer.checkpoint_every=0"]
    driver = subprocess.Popen([sys.executable, *args], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and len(training(tmp_path)) < 2:
            assert driver.poll() is None
            time.sleep(1)
        sweep_dir = next(tmp_path.glob("outputs/multirun/*/*"))
        worker = json.loads((sweep_dir / "0" / "summary.json").read_text())["pid"]
        os.kill(worker, signal.SIGKILL)
        driver.send_signal(signal.SIGTERM)
        output, _ = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 128 + signal.SIGTERM, output
    assert "stopped by SIGTERM" in output
    done = runs(sweep_dir)
    assert done["0"]["status"] == "running"
    assert done["1"]["status"] == "interrupted" and done["1"]["stopped_by"] == "SIGINT"
    assert (sweep_dir / "1" / "checkpoints" / "checkpoint").is_file()


def training(cwd: Path) -> list[Path]:
    """The sweep's runs that have written a row: in their loop, where a stop request is heard."""
    return [table for table in cwd.glob("outputs/multirun/*/*/*/metrics.csv")
            if len(table.read_text().splitlines()) > 1]


RECORDER = '''
import json
from pathlib import Path

from hydra.experimental.callback import Callback


class Record(Callback):
    """A user's callback: at each job's end, its return and its run directory as they are."""

    def on_job_end(self, config, job_return, **kwargs):
        on_disk = json.loads((Path(config.hydra.runtime.output_dir) / "summary.json").read_text())
        value = job_return.return_value
        with open(Path(config.hydra.runtime.cwd) / "ended.jsonl", "a") as f:
            f.write(json.dumps({"job": config.hydra.job.num, "status": value["status"],
                                "final_loss": value.get("final_loss"),
                                "on_disk": on_disk["status"]}) + "\\n")
'''


@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
                                      ["hydra/launcher=gradexp"]],
                         ids=["basic", "joblib", "gradexp"])
def test_a_users_callback_sees_each_finished_run_at_its_jobs_end(tmp_path, launcher):
    """Hydra's job contract under every launcher: a callback of the user's own, given with
    hydra.callbacks, is called at each job's end with the run's summary as the job's return,
    once the run has finished (summary.json says so too)."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "my_callbacks.py").write_text(RECORDER)
    sweep_dir, result = sweep(tmp_path, *launcher, *SWEEP,
                              "+hydra.callbacks.mine._target_=my_callbacks.Record")
    assert result.returncode == 0, result.stderr
    ended = [json.loads(line) for line in (tmp_path / "ended.jsonl").read_text().splitlines()]
    assert sorted(e["job"] for e in ended) == [0, 1, 2, 3]
    summaries = runs(sweep_dir)
    for e in ended:
        assert e["status"] == e["on_disk"] == "completed"
        assert e["final_loss"] == summaries[str(e["job"])]["final_loss"] is not None
