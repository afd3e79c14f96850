"""Stopping cleanly when asked (`stop_requests`): the training loop reads the request between
compiled calls, flushes the logs, checkpoints and marks the run interrupted, and the process
exits with `exit_status(signal)`. The standard library only: launchers import it.
"""

from __future__ import annotations

import contextlib
import signal
from types import SimpleNamespace


def exit_status(signum: int) -> int:
    """The exit status of a process stopped by `signum` (128 + its number)."""
    return 128 + int(signum)


@contextlib.contextmanager
def stop_requests():
    """Yields `requests`: its `signal` is the one that asked the run to stop at the next safe
    point (None while none has): SIGINT, SIGTERM, or SIGUSR2 when a Python handler owns it (a
    job scheduler's warning; submitit's handler requeues the job and exits at once), that
    handler put back when the block ends, for the caller to call once the run is recorded."""
    requests = SimpleNamespace(signal=None)

    def ask(signum, frame):
        if requests.signal == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: stop now
        requests.signal = signum

    watched = [signal.SIGINT, signal.SIGTERM]
    usr2 = getattr(signal, "SIGUSR2", None)
    if usr2 is not None and callable(signal.getsignal(usr2)):
        watched.append(usr2)
    try:
        previous = {s: signal.signal(s, ask) for s in watched}
    except ValueError:  # not the main thread: leave signals to whoever owns them
        previous = {}
    try:
        yield requests
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
