"""The test modules start no TensorFlow runtime when imported. mutmut's fork server
(tests/mutation.py) imports them once, to collect the tests, and forks each mutant's run from
itself; a process forked after TensorFlow's runtime started hangs in its first parallel op, and
mutmut ends it as a timeout, not a kill."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

FIRST_TO_START = """
import importlib, sys
from tensorflow.python.eager import context
for name in sys.argv[1:]:
    importlib.import_module(name)
    if context.context()._initialized:
        print(name)
        break
"""


def first_module_starting_tensorflow(folder, names) -> str:
    result = subprocess.run([sys.executable, "-c", FIRST_TO_START, *names], cwd=folder,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_importing_every_test_module_starts_no_tensorflow_runtime():
    names = sorted(path.stem for path in (REPO / "tests").glob("test_*.py"))
    assert len(names) > 40 and first_module_starting_tensorflow(REPO / "tests", names) == ""


def test_a_module_that_makes_a_variable_at_import_is_found(tmp_path):
    (tmp_path / "test_quiet.py").write_text("from gradexp._tf import tf\n")
    (tmp_path / "test_loud.py").write_text("from gradexp._tf import tf\nv = tf.Variable(1.0)\n")
    assert first_module_starting_tensorflow(tmp_path, ["test_quiet", "test_loud"]) == "test_loud"
