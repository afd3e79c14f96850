"""A run that cannot write, in one line: a full disk, a quota, a file-size limit, an unwritable
or read-only directory, met while saving a checkpoint or writing metrics.csv, the event file or
summary.json.

The writers wrap their writes in `writing(what, where, step)`, which turns such an error (an
OSError, or TensorFlow's ResourceExhaustedError, PermissionDeniedError, ... from its C++ file
writers) into `WriteFailed`: "cannot write <what> in <where> at step <n>: <why>". The run ends
as failed (gradexp/train.py records it and says it in that line; a sweep goes on to its next
run); a single run exits 1. Any other error is left as it is (a bug is a traceback).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from pathlib import Path

# what a full or unwritable filesystem answers a write with
ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS)
REASONS = tuple(os.strerror(e) for e in ERRNOS)  # as TensorFlow's messages spell them
TF_NOISE = re.compile(r"\{\{function_node [^}]*\}\}|\[Op:\w+\]")  # an op's name around its error
EXIT_STATUS = 1  # not 2: the settings were good, the filesystem was not


class WriteFailed(RuntimeError):
    """A run could not write; the message is the one line."""


def reason(exc: BaseException) -> str | None:
    """Why a write failed, in one line, if `exc` says the filesystem was full or unwritable;
    None for any other error."""
    if isinstance(exc, OSError) and exc.errno in ERRNOS:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{os.strerror(exc.errno)}{where}"
    tf = sys.modules.get("tensorflow")  # an error of TensorFlow's only once it is loaded
    if tf is not None and isinstance(exc, tf.errors.OpError):
        text = TF_NOISE.sub("", " ".join(str(exc.message).split())).strip()
        kinds = (tf.errors.ResourceExhaustedError, tf.errors.PermissionDeniedError)
        if isinstance(exc, kinds) or any(r in text for r in REASONS):
            return text
    return None


@contextlib.contextmanager
def writing(what: str, where: Path | str, step: int, tensorflow: str | None = None):
    """Within the block, a full or unwritable filesystem raises WriteFailed naming `what`
    (the checkpoint, metrics.csv, ...), `where` and the run's `step`; `tensorflow`: what to
    name instead when TensorFlow's writer failed (a block that writes the table from Python
    and the event file through TensorFlow)."""
    try:
        yield
    except WriteFailed:
        raise
    except Exception as exc:
        why = reason(exc)
        if why is None:
            raise
        if tensorflow is not None and not isinstance(exc, OSError):
            what = tensorflow
        path, _, rest = why.partition("; ")  # TensorFlow's "<file>; <reason>": the file named
        if rest and Path(path).is_relative_to(where):
            what, why = f"{what} ({Path(path).relative_to(where)})", rest
        raise WriteFailed(f"cannot write {what} in {where} at step {step}: {why}") from None


def explain(exc: BaseException, run_dir: Path | str | None = None) -> str | None:
    """The one line of a run that could not write; None for any other error. Outside
    `writing`, only a Python write is taken for one (summary.json's, the table's first open):
    a full filesystem anywhere, a permission refused in `run_dir`; not TensorFlow's errors,
    whose ResourceExhaustedError is also an out-of-memory, nor a file the run only reads."""
    if isinstance(exc, WriteFailed):
        return str(exc)
    if not isinstance(exc, OSError) or exc.errno not in ERRNOS:
        return None
    refused = exc.errno in (errno.EACCES, errno.EPERM)
    if refused and not (run_dir and exc.filename
                        and Path(os.path.abspath(exc.filename)).is_relative_to(
                            os.path.abspath(run_dir))):
        return None
    return f"cannot write: {reason(exc)}"
