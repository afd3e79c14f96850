"""One writer per run directory: an exclusive OS lock (flock) on `<run>/.lock`.

A process takes it before it decides anything about a run it finds in its directory (keep,
resume, clear) and holds it while the run trains; the OS releases it when the process exits or
dies, so a killed run never leaves a stale lock. A second start or resume of a held run is
refused in one line naming the holder (`RunBusy`, exit 2). The pid in summary.json
(`rundir.still_running`) only words an earlier refusal; between reading it and writing it there
is a window, and the lock closes it.

The lock file holds "pid <pid> on <host>" of its holder. `hold` is re-entrant in a process (a
run's entry point takes it, and `gradexp.train.start` again); `release` lets it go. The standard
library only.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from gradexp.runs.rundir import LOCK, NotResumable

_held: dict[Path, int] = {}  # run directory -> the lock file's descriptor, in this process


class RunBusy(NotResumable):
    """The run directory is held by another process; the message is the one line."""


def hold(run_dir: Path | str) -> None:
    """Take the run's lock, or raise RunBusy naming the process that holds it."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    fd = os.open(key / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd)
        os.close(fd)
        raise RunBusy(f"{run_dir}: the run is held by another process ({holder}); a run has "
                      "one writer: wait for it to end, or stop it first") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    _held[key] = fd


def release(run_dir: Path | str) -> None:
    """Let the run's lock go (nothing when this process does not hold it)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the last descriptor of the open file releases the lock


def _holder(fd: int, wait: float = 2.0) -> str:
    """Who holds the lock, as the holder wrote it; it writes just after it takes the lock, so
    an empty file is read again for up to `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if text or time.monotonic() > deadline:
            return text or "a process that has not written its pid yet"
        time.sleep(0.02)
