"""The layout rules (tests/layout.py) hold for gradexp, and the checker finds each breach: a
package made to break every rule is reported line by line. Static: nothing is imported."""

from __future__ import annotations

import subprocess
from pathlib import Path

import layout
from conftest import REPO


def test_gradexp_keeps_its_layout_rules():
    assert layout.problems(REPO) == []


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_reports_a_long_module_a_cycle_and_training_imports(tmp_path):
    write(tmp_path, {
        "gradexp/__init__.py": "",
        "gradexp/train.py": "import gradexp.a\n",
        "gradexp/a.py": "import matplotlib.pyplot\n\n\ndef load():\n    from gradexp import b\n",
        "gradexp/b.py": "from . import a\nimport pandas\n",  # a -> b (inside a function) -> a
        "gradexp/big.py": "x = 1\n" * (layout.LIMIT + 1),
        "gradexp/at_limit.py": "x = 1\n" * layout.LIMIT,
    })
    assert layout.problems(tmp_path) == [
        f"gradexp.big: {layout.LIMIT + 1} lines, over {layout.LIMIT}",
        "cycle: gradexp.a -> gradexp.b -> gradexp.a",
        "gradexp.train reaches matplotlib: gradexp.train -> gradexp.a -> matplotlib",
        "gradexp.train reaches pandas: gradexp.train -> gradexp.a -> gradexp.b -> pandas",
    ]


def test_the_folders_order_runs_one_way():
    """Each folder may import only folders listed before it: the order has no way back."""
    order = list(layout.FOLDERS)
    for i, (folder, allowed) in enumerate(layout.FOLDERS.items()):
        assert all(a == layout.TF or a in order[:i] for a in allowed), folder


def test_the_checker_reports_imports_against_the_folders_order(tmp_path):
    """An import from a lower folder into a higher one (parts -> training, runs -> config, the
    config -> TensorFlow), the analysis into the training side, a folder into an entry point
    at the top, and a folder the layout does not place: one line each. The same imports the
    other way, and an entry point importing any folder, are fine."""
    write(tmp_path, {
        "gradexp/__init__.py": "",
        "gradexp/_tf.py": "",
        "gradexp/train.py": "from gradexp.training import step\n",
        "gradexp/summarize.py": "from gradexp.analysis import c\n",
        "gradexp/runs/rundir.py": "from gradexp.config import root\n",
        "gradexp/runs/measures.py": "",
        "gradexp/config/root.py": "from gradexp.runs import measures\nfrom gradexp import _tf\n",
        "gradexp/parts/models.py": "from gradexp.config import root\n\n\n"
                                   "def later():\n    from gradexp.training import stopping\n",
        "gradexp/training/stopping.py": "",
        "gradexp/training/step.py": "from gradexp.parts import models\nimport gradexp._tf\n",
        "gradexp/analysis/c.py": "from gradexp.runs import rundir\n"
                                 "from gradexp.training import step\n",
        "gradexp/sweeps/callbacks.py": "from gradexp import train\n",
        "gradexp/bench/run.py": "from gradexp import train\n"
                                "from gradexp.sweeps import callbacks\n",
        "gradexp/extras/x.py": "import json\n",
    })
    assert layout.problems(tmp_path) == [
        "gradexp.analysis.c imports gradexp.training.step: gradexp.analysis may import only "
        "gradexp.runs, gradexp._tf",
        "gradexp.config.root imports gradexp._tf: gradexp.config may import only gradexp.runs",
        "gradexp.extras.x: in gradexp.extras, a folder the layout does not place (FOLDERS)",
        "gradexp.parts.models imports gradexp.training.stopping: gradexp.parts may import only "
        "gradexp.runs, gradexp.config, gradexp._tf",
        "gradexp.runs.rundir imports gradexp.config.root: gradexp.runs may import only "
        "no other gradexp module",
        "gradexp.sweeps.callbacks imports gradexp.train: gradexp.sweeps may import only "
        "gradexp.runs, gradexp.config, gradexp.parts, gradexp.training, gradexp._tf",
    ]


def test_the_checker_finds_the_training_side_reaching_the_analysis_side(tmp_path):
    write(tmp_path, {"gradexp/__init__.py": "",
                     "gradexp/train.py": "import gradexp.training.step\n",
                     "gradexp/training/step.py":
                         "def later():\n    from ..analysis import curves\n",
                     "gradexp/analysis/__init__.py": "", "gradexp/analysis/curves.py": ""})
    assert layout.problems(tmp_path) == [
        "gradexp.train reaches gradexp.analysis: gradexp.train -> gradexp.training.step -> "
        "gradexp.analysis",
        "gradexp.train reaches gradexp.analysis.curves: gradexp.train -> gradexp.training.step -> "
        "gradexp.analysis.curves",
        "gradexp.training.step imports gradexp.analysis: gradexp.training may import only "
        "gradexp.runs, gradexp.config, gradexp.parts, gradexp._tf",
        "gradexp.training.step imports gradexp.analysis.curves: gradexp.training may import only "
        "gradexp.runs, gradexp.config, gradexp.parts, gradexp._tf"]


def test_nothing_in_the_repository_refers_to_a_file_outside_it():
    outside = "../" + "shared"  # spelled apart, so that this file does not match itself
    tracked = subprocess.run(["git", "grep", "-n", "-F", outside], cwd=REPO, capture_output=True,
                             text=True)
    assert tracked.returncode == 1 and tracked.stdout == "", tracked.stdout
