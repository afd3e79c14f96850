"""The bench's sweep measurements: part of `python -m gradexp.bench`'s full run, or alone with
`python -m gradexp.bench_sweeps [--repeats N] [--no-rnn]` (about 3 minutes a round on 2 cores
for the MLP sweep, 8 with the RNN's).

A clipping sweep of small runs, launched as a user launches it, with Hydra's basic launcher and
with gradexp's own (`hydra/launcher=gradexp`, gradexp/batched.py), taking turns:

    sweep_speedup        wall time of `python -m gradexp.train -m clip=null,0.1 seed=0,1,2,3,4`
                         (10 runs of the default MLP, 1000 steps) with the basic launcher ÷
                         with hydra/launcher=gradexp, from launch to exit
    sweep_step_fraction  the share of the gradexp sweep's wall time spent in training steps:
                         Σ steps ÷ steps/s over the runs trained alone and, once per batch, its
                         longest run, each at its own steady rate (logging and evaluation
                         included; the first call, which traces and compiles, is start-up)
    sweep_speedup_rnn    sweep_speedup on the exploding-RNN preset (+experiment=exploding_rnn,
    sweep_step_fraction_rnn   clip layer in the recurrence, 4000 steps; its clip=null runs
                         diverge within 20 steps), and its step fraction
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = ["clip=null,0.1", "seed=0,1,2,3,4"]
RNN = ["+experiment=exploding_rnn", "layer.positions=[rnn_1_state]"]
LAUNCHERS = {"basic": [], "gradexp": ["hydra/launcher=gradexp"]}


def timed_sweep(args: list[str]) -> tuple[float, float]:
    """(wall seconds, seconds in training steps) of `python -m gradexp.train -m <args>`."""
    with tempfile.TemporaryDirectory() as root:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "gradexp.train", "-m", *args,
                                 f"hydra.sweep.dir={root}/sweep"], capture_output=True, text=True)
        wall = time.perf_counter() - start
        if result.returncode != 0:
            raise RuntimeError(f"sweep {' '.join(args)} failed:\n{result.stderr[-2000:]}")
        summaries = [json.loads(p.read_text()) for p in Path(root).glob("sweep/*/summary.json")]
    per_batch: dict[str, float] = {}  # a batch's steps take as long as its longest run's
    for s in summaries:
        if s.get("steps_per_s"):
            key = s.get("batch", {}).get("first", id(s))
            per_batch[key] = max(per_batch.get(key, 0.0), s["steps"] / s["steps_per_s"])
    return wall, sum(per_batch.values())


def sweep_speed(overrides: list[str], repeats: int, suffix: str = "") -> dict[str, float]:
    """The two launchers on one sweep, `repeats` rounds taking turns; medians compared."""
    walls: dict[str, list[float]] = {name: [] for name in LAUNCHERS}
    fractions: list[float] = []
    for _ in range(repeats):
        for name, launcher in LAUNCHERS.items():
            wall, stepping = timed_sweep([*launcher, *overrides])
            print(f"  {' '.join(overrides)} with the {name} launcher: {wall:.1f} s, "
                  f"{stepping:.1f} s in training steps", flush=True)
            walls[name].append(wall)
            if name == "gradexp":
                fractions.append(stepping / wall)
    basic, fast = (statistics.median(walls[name]) for name in LAUNCHERS)
    return {f"sweep_s_basic{suffix}": basic, f"sweep_s_gradexp{suffix}": fast,
            f"sweep_speedup{suffix}": basic / fast,
            f"sweep_step_fraction{suffix}": statistics.median(fractions)}


def measure(repeats: int, rnn: bool = True) -> dict[str, float]:
    out = sweep_speed(SWEEP, repeats)
    if rnn:
        out.update(sweep_speed([*RNN, *SWEEP], repeats, suffix="_rnn"))
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gradexp.bench_sweeps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="rounds (medians compared)")
    parser.add_argument("--no-rnn", action="store_true", help="the default MLP's sweep only")
    args = parser.parse_args(argv)
    out = measure(args.repeats, rnn=not args.no_rnn)
    print(json.dumps({k: round(v, 4) for k, v in out.items()}))
    return out


if __name__ == "__main__":
    main()
