"""Summarize a sweep: how much more (or less) stably each setting trained than its baseline.

    python -m gradexp.summarize DIR [--baseline clip=null,clipping=none] [--plots] [--tensorboard]

The command line over gradexp.analysis: read the run directories (analysis.runs), group them
(analysis.groups), measure and compare each group with its baseline (analysis.metrics,
analysis.stats, analysis.compare), print the table and write summary.csv, summary.md, runs.csv
(analysis.reports), with --plots the PNGs (analysis.plots, matplotlib) and with --tensorboard
each setting's mean and 95% band over seeds as TensorBoard runs under summary_tb/
(analysis.bands_tb, the tensorboard package without TensorFlow); a search's history and best
value too (analysis.search). Definitions: docs/guide/summarizing.md.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path

import pandas as pd

from gradexp.analysis.compare import summarize
from gradexp.analysis.groups import ONE_GROUP, group_values, grouping_keys, spelling
from gradexp.analysis.metrics import Settings
from gradexp.analysis.reports import (
    MAX_STABLE_TITLE,
    comparison_note,
    group_table,
    has_success,
    markdown_report,
    max_stable_table,
)
from gradexp.analysis.runs import code_versions_warning, load_runs
from gradexp.analysis.search import search_report, search_table

DEFAULT_BASELINE = {"clip": "null", "clipping": "none"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return parser().parse_args(argv)


def parser() -> argparse.ArgumentParser:
    """The command line (its `--help` is the documentation's commands page)."""
    parser = argparse.ArgumentParser(
        prog="python -m gradexp.summarize",
        description="Compare each setting of a sweep with its unclipped baseline, seed by seed.",
        epilog="Definitions: docs/guide/summarizing.md. Writes summary.csv, summary.md, "
               "runs.csv.")
    parser.add_argument("dir", type=Path, metavar="DIR",
                        help="a sweep, or any folder holding run directories (recursively)")
    parser.add_argument("--baseline", metavar="KEY=VALUE[,KEY=VALUE]", type=_baseline_arg,
                        help="the baseline setting (default: clip=null and/or clipping=none)")
    parser.add_argument("--target-loss", type=float, metavar="LOSS",
                        help="the loss of steps_to_target (default: from the baseline's runs)")
    parser.add_argument("--final-fraction", type=_in_range(float, 1), default=0.1, metavar="F",
                        help="final_loss averages the last F of the steps (default: %(default)s)")
    parser.add_argument("--spike-factor", type=_in_range(float), default=2.0, metavar="X",
                        help="a spike is a loss above X × the preceding window's mean "
                             "(default: %(default)s)")
    parser.add_argument("--spike-window", type=_in_range(int), default=20, metavar="N",
                        help="the trailing window of spikes and steps_to_target "
                             "(default: %(default)s)")
    parser.add_argument("--spike-min-rise", type=_in_range(float, 1), default=0.05, metavar="R",
                        help="and by more than R × the first loss (default: %(default)s)")
    parser.add_argument("--spike-score-window", type=_in_range(int), default=1000, metavar="W",
                        help="the spike scores' rolling window, in steps (default: %(default)s)")
    parser.add_argument("--spike-score-sigmas", type=_in_range(float), default=7.0, metavar="K",
                        help="a spike score counts values K standard deviations from the rolling "
                             "mean (default: %(default)s)")
    parser.add_argument("--plots", action="store_true", help="also write the PNGs")
    parser.add_argument("--tensorboard", action="store_true",
                        help="also write each setting's mean and 95%% band over seeds as a "
                             "TensorBoard run, OUT/summary_tb/<setting>/")
    parser.add_argument("--out", type=Path, metavar="OUT", help="where to write (default: DIR)")
    return parser


def _baseline_arg(text: str) -> dict[str, str]:
    """`clip=null,clipping=none` → {"clip": "null", "clipping": "none"}; a comma inside brackets
    belongs to its value (`layer.positions=[a,b]`)."""
    pairs = {}
    for pair in re.split(r",(?![^\[]*\])", text):
        key, has_value, value = pair.partition("=")
        if not has_value or not key or key in pairs:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected KEY=VALUE[,KEY=VALUE...], each key once, e.g. clip=null")
        pairs[key] = value
    return pairs


def _in_range(kind: type, high: float = math.inf):
    """An argparse type: a `kind` in (0, high]."""
    def parse(text: str):
        value = kind(text)
        if not 0 < value <= high:
            raise argparse.ArgumentTypeError(
                f"{text}: must be " + ("positive" if high == math.inf else f"in (0, {high}]"))
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid ... value" error
    return parse


class UsageError(Exception):
    """A problem with the user's input: main prints `error: <message>` and exits with 2."""


def choose_baseline(requested: dict[str, str] | None, values: pd.DataFrame,
                    keys: list[str]) -> dict[str, str]:
    """The requested baseline, checked against the runs' group values; by default each of
    clip=null and clipping=none whose key is swept and whose value a run has ({}: none)."""
    if requested is None:
        return {k: v for k, v in DEFAULT_BASELINE.items()
                if k in keys and (values[k] == v).any()}
    chosen = {}
    for key, value in requested.items():
        if key not in keys:
            swept = ("no key but the seed varies" if keys == [ONE_GROUP]
                     else "keys: " + ", ".join(keys))
            raise UsageError(f"--baseline {key}={value}: {key} is not a swept key ({swept})")
        chosen[key] = spelling(value, sorted(values[key].unique()))
        if chosen[key] is None:
            raise UsageError(f"--baseline {key}={value}: no run has {key}={value} "
                             f"({key} values: {', '.join(sorted(values[key].unique()))})")
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return _main(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    root: Path = args.dir
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory")
    runs, skipped = load_runs(root)
    for name, reason in skipped:
        print(f"skipped {name}: {reason}")
    mixed = code_versions_warning(runs)
    if mixed:
        print(mixed, file=sys.stderr)
    if not any(run.metrics is not None for run in runs):
        raise UsageError(f"{root}: no readable runs"
                         + (f" ({len(skipped)} skipped)" if skipped else ""))
    settings = Settings(args.final_fraction, args.spike_factor, args.spike_window,
                        args.spike_min_rise, args.target_loss, args.spike_score_window,
                        args.spike_score_sigmas)
    keys = grouping_keys(runs)
    baseline = choose_baseline(args.baseline, group_values(runs, keys), keys)
    runs_table, tidy = summarize(runs, settings, baseline)
    print(comparison_note(baseline, settings, has_success(tidy)))
    print(group_table(tidy, keys, baseline).to_markdown(index=False, tablefmt="simple"))
    stable = max_stable_table(tidy, keys, baseline)
    if stable is not None:
        print(f"\n{MAX_STABLE_TITLE}:")
        print(stable.to_markdown(index=False, tablefmt="simple"))
    searched = search_table(root, runs)  # a search (hydra/sweeper=optuna): its history, best
    if searched is not None:
        print("\n" + search_report(searched))
    out = args.out or root
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "summary.csv", out / "summary.md", out / "runs.csv"]
    tidy.to_csv(written[0], index=False)
    report = markdown_report(tidy, keys, baseline, settings, skipped, root)
    if searched is not None:
        report += "\n## Search\n\n" + search_report(searched) + "\n"
    written[1].write_text(report)
    runs_table.to_csv(written[2], index=False)
    if args.plots:
        from gradexp.analysis.plots import plot_all

        written += plot_all(runs, runs_table, tidy, keys, baseline, settings, out)
    if args.tensorboard:
        from gradexp.analysis.bands_tb import write_bands
        from gradexp.analysis.curves import group_curves

        written.append(write_bands(group_curves(runs, runs_table, tidy, keys, baseline), out))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


class PipeSafeStdout:
    """stdout for a reader that may stop early (`summarize DIR | head`): once the pipe is
    closed, the rest of the table goes to /dev/null and summarize still writes its files,
    instead of dying in a BrokenPipeError traceback (the signal module's "Note on SIGPIPE")."""

    def __init__(self, stream):
        self.stream, self.reader_gone = stream, False

    def write(self, text: str) -> int:
        return self._guarded(self.stream.write, text) or len(text)

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    def _guarded(self, call, *args):
        if self.reader_gone:
            return None
        try:
            return call(*args)
        except BrokenPipeError:
            self.reader_gone = True  # and the bytes still buffered must not fail at exit:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
            return None

    def __getattr__(self, name):
        return getattr(self.stream, name)


if __name__ == "__main__":
    sys.stdout = PipeSafeStdout(sys.stdout)
    sys.exit(main())
