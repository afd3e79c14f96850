"""The bench's sweep measurements: part of `python -m gradexp.bench`'s full run, or alone with
`python -m gradexp.bench.sweeps [--repeats N] [--no-rnn]` (about 1 minute a round on 2 cores
for the MLP sweep, 2.5 with the RNN's).

A clipping sweep of small runs, launched as a user launches it, with Hydra's basic launcher and
with gradexp's own (`hydra/launcher=gradexp`: gradexp/training/engine.py, gradexp/sweeps/worker.py)
with one worker process and with two (a group of runs split into two batches), taking turns:

    sweep_speedup        wall time of `python -m gradexp.train -m clip=null,0.1 seed=0,1,2,3,4`
                         (10 runs of the default MLP, 1000 steps) with the basic launcher ÷
                         with hydra/launcher=gradexp the faster way (`sweep_workers`: 1 or 2),
                         from launch to exit; `_one_worker`, `_two_workers`: each way's
    sweep_step_fraction  the share of that sweep's wall time in which training steps run: the
                         union over its runs of [first step line, last step line] of each run's
                         train.log (logging and evaluation in between included). A separate
                         run's first is the end of its first compiled call (which traces and
                         compiles: start-up); a batched run's is the "step 0" line written
                         when the batch's program is ready, before its first call
    sweep_speedup_rnn    the same on the exploding-RNN preset (+experiment=exploding_rnn, clip
                         layer in the recurrence, 4000 steps; its clip=null runs diverge within
                         20 steps)
    sweep_speedup_stateful  the same sweep with clipping=zclip (a method with state)

Each speedup is computed round by round and reported with its spread (gradexp/bench/rounds.py); the
faster way (`sweep_workers`: 1 or 2) is the one of the smaller median wall time.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from gradexp.bench.rounds import ratio

SWEEP = ["clip=null,0.1", "seed=0,1,2,3,4"]
RNN = ["+experiment=exploding_rnn", "layer.positions=[rnn_1_state]"]
STATEFUL = ["clipping=zclip"]
GRADEXP = ["hydra/launcher=gradexp"]
LAUNCHERS = {"basic": [], "one_worker": [*GRADEXP, "hydra.launcher.workers=1"],
             "two_workers": [*GRADEXP, "hydra.launcher.workers=2"]}


def timed_sweep(args: list[str]) -> tuple[float, float]:
    """(wall seconds, seconds in which training steps run) of `python -m gradexp.train -m
    <args>`."""
    with tempfile.TemporaryDirectory() as root:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "gradexp.train", "-m", *args,
                                 f"hydra.sweep.dir={root}/sweep"], capture_output=True, text=True)
        wall = time.perf_counter() - start
        if result.returncode != 0:
            raise RuntimeError(f"sweep {' '.join(args)} failed:\n{result.stderr[-2000:]}")
        intervals = [stepping(log) for log in Path(root).glob("sweep/*/train.log")]
    return wall, union_length([i for i in intervals if i is not None])


def stepping(log: Path) -> tuple[float, float] | None:
    """[first, last] of a run's train.log's step lines ("[<time>] step <n>/<steps> ..."): the
    time its steps run (see sweep_step_fraction); None for a run with fewer than two."""
    times = [datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()
             for line in log.read_text().splitlines() if line[26:31] == "step "]
    return (times[0], times[-1]) if len(times) > 1 else None


def union_length(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [a, b] intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total


def sweep_speed(overrides: list[str], repeats: int, suffix: str = "") -> dict[str, float]:
    """The launchers on one sweep, `repeats` rounds taking turns; speedups round by round."""
    walls: dict[str, list[float]] = {name: [] for name in LAUNCHERS}
    fractions: dict[str, list[float]] = {name: [] for name in LAUNCHERS}
    for _ in range(repeats):
        for name, launcher in LAUNCHERS.items():
            wall, stepping_s = timed_sweep([*launcher, *overrides])
            way = "the basic launcher" if name == "basic" else name.replace("_", " ")
            print(f"  {' '.join(overrides)} with {way}: {wall:.1f} s, "
                  f"{stepping_s:.1f} s with training steps running", flush=True)
            walls[name].append(wall)
            fractions[name].append(stepping_s / wall)
    return ratios(walls, fractions, suffix)


def ratios(walls: dict[str, list[float]], fractions: dict[str, list[float]],
           suffix: str = "") -> dict[str, float]:
    """Each launcher's median wall time, each gradexp way's speedup (round by round, with its
    spread) and step fraction, and the faster way's as `sweep_speedup`, `sweep_step_fraction`
    (`sweep_workers`: which)."""
    wall = {name: statistics.median(w) for name, w in walls.items()}
    out = {f"sweep_s_{name}{suffix}": w for name, w in wall.items()}
    for name in ("one_worker", "two_workers"):
        out.update(ratio(f"sweep_speedup_{name}{suffix}", walls["basic"], walls[name]))
        out[f"sweep_step_fraction_{name}{suffix}"] = statistics.median(fractions[name])
    fastest = min(("one_worker", "two_workers"), key=wall.get)
    for end in ("", "_min", "_max"):
        out[f"sweep_speedup{suffix}{end}"] = out[f"sweep_speedup_{fastest}{suffix}{end}"]
    out[f"sweep_step_fraction{suffix}"] = out[f"sweep_step_fraction_{fastest}{suffix}"]
    out[f"sweep_workers{suffix}"] = 1 if fastest == "one_worker" else 2
    return out


def measure(repeats: int, rnn: bool = True) -> dict[str, float]:
    out = sweep_speed(SWEEP, repeats)
    out.update(sweep_speed([*STATEFUL, *SWEEP], repeats, suffix="_stateful"))
    if rnn:
        out.update(sweep_speed([*RNN, *SWEEP], repeats, suffix="_rnn"))
    return out


def parser():
    """The command line (its `--help` is the documentation's commands page)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gradexp.bench.sweeps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="rounds (medians compared)")
    parser.add_argument("--no-rnn", action="store_true", help="the default MLP's sweep only")
    return parser


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parser().parse_args(argv)
    out = measure(args.repeats, rnn=not args.no_rnn)
    print(json.dumps({k: round(v, 4) for k, v in out.items()}))
    return out


if __name__ == "__main__":
    main()
