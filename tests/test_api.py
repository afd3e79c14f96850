"""gradexp.api: compose, run and read runs from Python, as a notebook would."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import QUICK, REPO
from gradexp import api, config

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

def test_compose_run_and_read_back_as_the_cli_does(tmp_path):
    quick = [*QUICK, "trainer.steps=20", "trainer.eval_every=20"]
    cfg = api.compose("clip=0.1", *quick)
    assert (cfg.clip, cfg.layer.clip_max, cfg.trainer.steps) == (0.1, None, 20)
    assert "hydra" not in cfg
    clipped = api.run(tmp_path / "runs" / "clipped", "clip=0.1", "seed=1", *quick)
    plain = api.run(tmp_path / "runs" / "plain", "clip=null", "seed=1", *quick)
    assert clipped["status"] == plain["status"] == "completed"
    assert clipped["final_loss"] != plain["final_loss"]  # the clip reached the run
    table = api.load_runs(tmp_path / "runs").set_index("run")
    assert list(table.index) == ["clipped", "plain"]
    assert table.loc["clipped", "clip"] == "0.1" and table.loc["plain", "clip"] == "null"
    assert table.loc["clipped", "final_loss"] == clipped["final_loss"]
    summary = subprocess.run([sys.executable, "-m", "gradexp.summarize", str(tmp_path / "runs")],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert summary.returncode == 0, summary.stderr
    assert "Baseline clip=null" in summary.stdout
    assert any(line.startswith("0.1 ") for line in summary.stdout.splitlines())


def test_a_bad_value_or_a_used_directory_is_one_line(tmp_path):
    with pytest.raises(config.ConfigError, match=r"^trainer.steps=0: must be an integer >= 1$"):
        api.compose("trainer.steps=0")
    with pytest.raises(config.ConfigError, match=r"^model=nosuch: no such option; choose one"):
        api.compose("model=nosuch")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "metrics.csv").write_text("step\n")
    with pytest.raises(config.ConfigError, match=r"^run_dir=.*used: not empty"):
        api.run(tmp_path / "used", "trainer.steps=1")


def test_a_config_directory_of_ones_own_adds_options(tmp_path):
    (tmp_path / "my_conf" / "model").mkdir(parents=True)
    (tmp_path / "my_conf" / "model" / "wide_mlp.yaml").write_text(
        "defaults:\n  - mlp\n  - _self_\n\nwidth: 7\ndepth: 1\n")
    cfg = api.compose("model=wide_mlp", config_dir=tmp_path / "my_conf")
    assert (cfg.model.name, cfg.model.width, cfg.model.depth) == ("mlp", 7, 1)
    assert api.compose("model=mlp", config_dir=tmp_path / "my_conf").model.width == 128
