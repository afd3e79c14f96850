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


def test_the_checker_reports_a_long_module_a_cycle_training_imports_and_side_imports(tmp_path):
    write(tmp_path, {
        "gradexp/__init__.py": "",
        "gradexp/train.py": "import gradexp.a\n",
        "gradexp/a.py": "import matplotlib.pyplot\n\n\ndef load():\n    from gradexp import b\n",
        "gradexp/b.py": "from . import a\nimport pandas\n",  # a -> b (inside a function) -> a
        "gradexp/big.py": "x = 1\n" * (layout.LIMIT + 1),
        "gradexp/at_limit.py": "x = 1\n" * layout.LIMIT,
        "gradexp/analysis/__init__.py": "",
        "gradexp/analysis/report.py": "import gradexp.a\nfrom gradexp import rundir\n",
        "gradexp/rundir.py": "import json\n",
        "gradexp/config/__init__.py": "",
        "gradexp/config/schema.py": "from gradexp.analysis import report\n",
    })
    only = "may import only gradexp.rundir, gradexp.measures, gradexp.search.record, gradexp._tf"
    assert layout.problems(tmp_path) == [
        f"gradexp.big: {layout.LIMIT + 1} lines, over {layout.LIMIT}",
        "cycle: gradexp.a -> gradexp.b -> gradexp.a",
        "gradexp.train reaches matplotlib: gradexp.train -> gradexp.a -> matplotlib",
        "gradexp.train reaches pandas: gradexp.train -> gradexp.a -> gradexp.b -> pandas",
        f"gradexp.analysis.report imports gradexp.a: gradexp.analysis {only}",
        "gradexp.config.schema imports gradexp.analysis: gradexp.config may import only "
        "gradexp.rundir",
        "gradexp.config.schema imports gradexp.analysis.report: gradexp.config may import only "
        "gradexp.rundir",
    ]


def test_the_checker_finds_the_training_side_reaching_the_analysis_side(tmp_path):
    write(tmp_path, {"gradexp/__init__.py": "", "gradexp/train.py": "import gradexp.step\n",
                     "gradexp/step.py": "def later():\n    from .analysis import curves\n",
                     "gradexp/analysis/__init__.py": "", "gradexp/analysis/curves.py": ""})
    assert layout.problems(tmp_path) == [
        "gradexp.train reaches gradexp.analysis: gradexp.train -> gradexp.step -> "
        "gradexp.analysis",
        "gradexp.train reaches gradexp.analysis.curves: gradexp.train -> gradexp.step -> "
        "gradexp.analysis.curves"]


def test_nothing_in_the_repository_refers_to_a_file_outside_it():
    outside = "../" + "shared"  # spelled apart, so that this file does not match itself
    tracked = subprocess.run(["git", "grep", "-n", "-F", outside], cwd=REPO, capture_output=True,
                             text=True)
    assert tracked.returncode == 1 and tracked.stdout == "", tracked.stdout
