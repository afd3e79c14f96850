"""gradexp as a package: its wheel, installed (not editable) into a fresh virtual environment,
runs a user's own model and data (examples/own_model) from a directory holding only them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

QUICK = ["trainer.steps=60", "trainer.log_every=20", "trainer.eval_every=60",
         "model.kwargs.width=8", "dataset.kwargs.n=600"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment's python with gradexp installed from a wheel built from
    this checkout; its dependencies (TensorFlow and the rest) are read from this environment's
    site-packages, added to the path by a .pth line (whose own .pth files, such as an editable
    gradexp's, are not run: the wheel's gradexp is the only one)."""
    where = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(where), str(REPO)], check=True, capture_output=True,
                   timeout=300)
    shutil.rmtree(REPO / "build", ignore_errors=True)  # pip's build tree, in the checkout
    wheel, = where.glob("gradexp-*.whl")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], check=True, capture_output=True, text=True).stdout
    outer = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(site.strip()) / "dependencies.pth").write_text("\n".join(sorted(outer)) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return python


def user(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
    return subprocess.run([str(python), *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=600)


def test_the_wheel_runs_a_users_model_and_data_from_any_directory(installed, tmp_path):
    project = tmp_path / "project"  # the user's models.py, data.py and my_conf/, nothing else
    shutil.copytree(REPO / "examples" / "own_model", project,
                    ignore=shutil.ignore_patterns("README.md", "__pycache__"))
    assert sorted(p.name for p in project.iterdir()) == ["data.py", "models.py", "my_conf"]
    where = user(installed, project, "-c", "import gradexp; print(gradexp.__file__)")
    assert where.stdout.strip().startswith(str(installed.parent.parent)), where.stdout  # the wheel
    own = ["--config-dir", "my_conf", "model=two_towers", "dataset=rings"]

    listed = user(installed, project, "-m", "gradexp.train", *own, "--positions")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [
        "left", "right", "join", "mix", "logits"]

    one = user(installed, project, "-m", "gradexp.train", *own, *QUICK, "clip=0.1",
               "layer.positions=[left,right]", "hydra.run.dir=one")
    assert one.returncode == 0, one.stderr
    summary = json.loads((project / "one" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 60
    header = (project / "one" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert [c for c in header if c.startswith("clip_fraction/")] == [
        "clip_fraction/left", "clip_fraction/right"]

    sweep = user(installed, project, "-m", "gradexp.train", "-m", *own, *QUICK,
                 "layer.positions=[left,right]", "clip=null,0.1", "seed=0,1",
                 "hydra.sweep.dir=sweep")
    assert sweep.returncode == 0, sweep.stderr
    statuses = [json.loads((project / "sweep" / str(n) / "summary.json").read_text())["status"]
                for n in range(4)]
    assert statuses == ["completed"] * 4
    compared = user(installed, project, "-m", "gradexp.summarize", "sweep")
    assert compared.returncode == 0, compared.stderr
    rows = {line.split()[0]: line.split()[1] for line in compared.stdout.splitlines()
            if line.split() and line.split()[0] in ("null", "0.1")}
    assert rows == {"null": "2", "0.1": "2"}  # two seeds each, clipped against unclipped
    assert "Baseline clip=null" in compared.stdout
