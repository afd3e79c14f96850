"""Shared fixtures: the real config, composed and shrunk for quick runs."""

from __future__ import annotations

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


def gradexp(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m <args>` as a user would, in `cwd`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)
