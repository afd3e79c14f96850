"""Import TensorFlow and Keras once, without the start-up noise of a machine with no GPU.

TensorFlow's C++ side prints "Could not find cuda drivers", "All log messages before
absl::InitializeLog()..." and CPU-feature notes while it loads, before TF_CPP_MIN_LOG_LEVEL is
read (abseil logs to stderr until it is initialised). We hold file descriptor 2 while importing
and pass on every line but those known notes, so real import errors still show.

`import keras` also imports, when they are installed, scikit-learn (for keras.wrappers), IPython
(a notebook view in keras.saving), pandas (DataFrames as `fit` input), matplotlib (image
galleries), Pillow (image files) and, through TensorFlow's legacy Keras, SciPy (sparse input):
parts gradexp never uses, 0.55, 0.2, 0.3, 0.25 and (the last two) 0.07 s of a 3.9 s import,
paid by every run and every worker before its first step, and the training side is to import
neither pandas nor matplotlib (DESIGN). Keras goes without them (it imports each in `try`); they
import as usual afterwards (dataset=digits uses scikit-learn, dataset=mnist1d matplotlib,
summarize SciPy), only those parts of Keras stay without them in this process. (ml_dtypes, which
TensorFlow imports, is held below 0.7 in pyproject.toml: with NumPy 2.4, 0.7.0 took 0.52 s to
import, 0.6.0 4 ms.)

The import leaves ~370,000 objects that live as long as the process; a full garbage collection
walked them all (0.15 s), and Keras' clear_session collects once a run
(gradexp/training/devices.py), so they are moved out of every collection (gc.freeze) once imported.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

NOISE = (
    "absl::InitializeLog()",
    "cudart_stub.cc",
    "cpu_feature_guard.cc",
    "To enable the following instructions",
    "oneDNN custom operations are on",
    "Unable to register cu",
    "computation_placer.cc",
    "TF-TRT Warning",
    "failed call to cuInit",
)
OPTIONAL = ("sklearn", "IPython", "pandas", "matplotlib", "PIL", "scipy")


def _import_quietly():
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        absent = [name for name in OPTIONAL if name not in sys.modules]
        sys.modules.update(dict.fromkeys(absent))  # None: `import` raises ImportError
        try:
            import keras
            import tensorflow as tf

            tf.config.list_physical_devices()  # probes for CUDA (and says it found none) now
        finally:
            for name in absent:
                if sys.modules.get(name, 0) is None:
                    del sys.modules[name]
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if not any(n in line for n in NOISE):
                    sys.stderr.write(line)
    return tf, keras


tf, keras = _import_quietly()
gc.freeze()  # see above: what the import made is never garbage
# TensorFlow's Python side logs INFO notes through the "tensorflow" and "absl" loggers (e.g.
# "Sharding callback duration" at every checkpoint save), which Hydra's INFO root would print:
# keep their warnings only.
for name in ("tensorflow", "absl"):
    logging.getLogger(name).setLevel(logging.WARNING)
# Each run compiles its own step; in a process that trains many runs (a sweep) TensorFlow
# takes the new functions for one function retraced and warns: not so here.
logging.getLogger("tensorflow").addFilter(
    lambda record: "triggered tf.function retracing" not in record.getMessage())
