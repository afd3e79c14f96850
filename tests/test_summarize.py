"""python -m gradexp.summarize: the command line end to end (tables, files, plots), its
errors, the --baseline option, and the bad-input catalogue of the summary side."""

from __future__ import annotations

import math
import subprocess
import sys

import pandas as pd
import pytest
from fake_runs import code_record, ending_at, two_sweeps, write_run

from conftest import REPO
from gradexp import summarize as S
from gradexp.analysis.metrics import METRICS

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

def read_csv(path):
    """summary.csv / runs.csv as a user should read them: `null` is a value, not a blank."""
    return pd.read_csv(path, dtype={"clip": str, "seed": str, "run": str},
                       keep_default_na=False, na_values=[""])


def test_baseline_option_takes_several_pairs(tmp_path, capsys):
    assert S._baseline_arg("clip=null") == {"clip": "null"}
    assert S._baseline_arg("clip=null,clipping=none") == {"clip": "null", "clipping": "none"}
    assert S._baseline_arg("layer.positions=[a,b],clip=null") == {
        "layer.positions": "[a,b]", "clip": "null"}
    # the default: each of clip=null and clipping=none whose key is swept and value present
    values = pd.DataFrame({"clip": ["0.1", "1"], "clipping": ["none", "agc"]})
    assert S.choose_baseline(None, values, ["clip", "clipping"]) == {"clipping": "none"}
    # a value as YAML reads it: Hydra writes a swept `shuffle=false,true` as False and True
    values = pd.DataFrame({"shuffle": ["False", "True"], "clip": ["0.10", "null"]})
    assert S.choose_baseline({"shuffle": "false", "clip": "0.1"}, values,
                             ["shuffle", "clip"]) == {"shuffle": "False", "clip": "0.10"}
    two_sweeps(tmp_path)
    assert S.main([str(tmp_path), "--baseline", "clipping=none,clip=null"]) == 0
    assert "Baseline clipping=none,clip=null: each group" in capsys.readouterr().out
    tidy = read_csv(tmp_path / "summary.csv")
    assert set(tidy.loc[tidy["clip"] == "0.1", "baseline"]) == {"clip=null clipping=none"}
    assert S.main([str(tmp_path), "--baseline", "clip=null,clipping=zclip"]) == 2
    assert capsys.readouterr().err == ("error: --baseline clipping=zclip: no run has "
                                       "clipping=zclip (clipping values: agc, none)\n")
    with pytest.raises(SystemExit):
        S.main([str(tmp_path), "--baseline", "clip=null,clip=0.1"])
    assert "each key once" in capsys.readouterr().err


def test_cli_end_to_end(tmp_path, capsys):
    """What summarize prints (a skipped run's line, the note, the table as `simple` Markdown
    without an index, what it wrote) and writes (into --out, made with its parents)."""
    sweep, out_dir = tmp_path / "sweep", tmp_path / "out" / "deep"
    for seed in range(2):
        for clip in ("null", "0.1", "1"):
            write_run(sweep / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                      [4.0, 3.0 + seed, 2.0, 1.5 if clip == "null" else 1.0])
    (sweep / "broken").mkdir()
    (sweep / "broken" / "metrics.csv").write_text("step,loss/train\n1,2\n")
    assert S.main([str(sweep), "--plots", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "skipped broken: no .hydra/ (not a Hydra run directory)"
    assert out[1].startswith("Baseline clip=null: each group against the group with the same")
    header, rule, *rows = out[2:-1]
    assert header.split()[:4] == ["clip", "runs", "diverged", "Δ"]
    assert set(rule) == {"-", " "} and rule.startswith("------  ------  ---")
    assert [row.split()[0] for row in rows] == ["null", "0.1", "1"]  # the baseline first
    final = header.index("final_loss")
    assert [row[final:].split()[0] for row in rows] == ["1.5±0", "1±0", "1±0"]
    names = ["summary.csv", "summary.md", "runs.csv", "loss_curves.png", "grad_norms.png",
             "final_loss_vs_clip.png"]
    assert out[-1] == "wrote " + ", ".join(str(out_dir / name) for name in names)
    assert all((out_dir / name).stat().st_size > 0 for name in names)
    assert not (sweep / "summary.csv").exists()
    tidy = read_csv(out_dir / "summary.csv")
    assert list(tidy.columns[:3]) == ["clip", "group", "metric"] and len(tidy) == 3 * len(METRICS)
    runs = read_csv(out_dir / "runs.csv")
    assert runs.columns[0] == "run" and sorted(runs["run"]) == sorted(
        f"{clip}_{seed}" for clip in ("null", "0.1", "1") for seed in range(2))
    report = (out_dir / "summary.md").read_text()
    assert report.startswith(f"# Sweep summary: {sweep}\n")
    assert "## final_loss (lower is better)" in report and "broken" in report  # and the skipped


def test_target_loss_option_sets_the_loss_of_steps_to_target(tmp_path, capsys):
    """By default the target is the baseline's worst final loss, 1.5: clip=0.1's trailing
    mean over 2 steps reaches it at step 4 ((2 + 1) / 2); --target-loss 2.5 at step 3
    ((3 + 2) / 2)."""
    for seed in range(2):
        for clip in ("null", "0.1"):
            write_run(tmp_path / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                      [4.0, 3.0, 2.0, 1.5 if clip == "null" else 1.0])

    def target(*options):
        assert S.main([str(tmp_path), "--spike-window", "2", *options]) == 0
        tidy = read_csv(tmp_path / "summary.csv").set_index(["metric", "clip"])
        return tidy.loc[("steps_to_target", "0.1"), ["target_loss", "mean"]].tolist()

    assert target() == [1.5, 4]
    assert target("--target-loss", "2.5") == [2.5, 3]
    capsys.readouterr()


def test_each_option_is_checked_at_the_ends_of_its_range(capsys):
    args = S.parse_args(["d", "--final-fraction", "1", "--spike-min-rise", "1",
                         "--spike-factor", "0.5", "--spike-window", "1"])
    assert (args.final_fraction, args.spike_min_rise, args.spike_factor, args.spike_window) == (
        1.0, 1.0, 0.5, 1)
    for option, value, message in [
            ("--final-fraction", "0", "0: must be in (0, 1]"),
            ("--final-fraction", "1.5", "1.5: must be in (0, 1]"),
            ("--spike-min-rise", "2", "2: must be in (0, 1]"),
            ("--spike-factor", "0", "0: must be positive"),
            ("--spike-score-window", "-1", "-1: must be positive"),
            ("--spike-window", "2.5", "invalid int value: '2.5'"),
            ("--target-loss", "low", "invalid float value: 'low'"),
            ("--baseline", "=null", "'=null': expected KEY=VALUE[,KEY=VALUE...], each key once, "
                                    "e.g. clip=null"),
            ("--baseline", "clip", "'clip': expected KEY=VALUE[,KEY=VALUE...], each key once, "
                                   "e.g. clip=null")]:
        with pytest.raises(SystemExit) as exit:
            S.parse_args(["d", option, value])
        assert exit.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"python -m gradexp.summarize: error: argument {option}: {message}"), option
    assert S._baseline_arg("layer.note=a=b") == {"layer.note": "a=b"}  # the first = splits


def test_summary_csv_compares_the_spike_scores_seed_by_seed(tmp_path, capsys):
    """grad_norm_spike_score in summary.csv, against the baseline like every metric: each
    clip=null seed has one 7σ gradient-norm spike in 100 steps (step 80: 5.0 among 79 values
    alternating 1 ± 0.01, mean 1.05, std 0.444: 8.9σ), each clip=0.1 seed none; so the
    baseline's mean is 1 (%), clip=0.1's 0, Δ −1 with 2 wins in 2. --spike-score-sigmas 9 sets
    the threshold above that spike, --spike-score-window the window."""
    steady = [1 + 0.01 * (-1) ** t for t in range(100)]
    spiky = [*steady[:79], 5.0, *steady[80:]]
    for seed in range(2):
        for clip, norms in (("null", spiky), ("0.1", steady)):
            write_run(tmp_path / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"], steady,
                      norms=norms)

    def scores(*options):
        assert S.main([str(tmp_path), *options]) == 0
        tidy = read_csv(tmp_path / "summary.csv").set_index(["metric", "clip"])
        return tidy.loc["grad_norm_spike_score"], tidy.loc["loss_spike_score"]

    grad, loss = scores()
    assert grad.loc["null", "mean"] == 1 and grad.loc["null", "better"] == "lower"
    row = grad.loc["0.1"]
    assert (row["mean"], row["baseline"], row["n_paired"], row["diff_mean"]) == (
        0, "clip=null", 2, -1)
    assert (row["wins"], row["losses"], row["win_rate"]) == (2, 0, 1)
    assert (loss["mean"] == 0).all()  # the losses alternate 1 ± 0.01: no spike
    assert "grad_norm_spike_score" in capsys.readouterr().out  # a column of the printed table
    grad, _ = scores("--spike-score-sigmas", "9")
    assert (grad["mean"] == 0).all()
    grad, _ = scores("--spike-score-window", "10")  # over 10 values: at most 3σ
    assert (grad["mean"] == 0).all()
    assert "spike score 7.0σ over a rolling window of 10 steps" in (
        tmp_path / "summary.md").read_text()


def test_plots_name_every_panel_and_use_a_log_axis_for_far_apart_losses(tmp_path, monkeypatch):
    """Groups clipping at different positions each appear in their own panel's legend; final
    losses decades apart (diverged runs) are drawn on a log axis whose bottom is above 0."""
    sweep = tmp_path / "sweep"
    for seed in range(2):
        write_run(sweep / f"null_{seed}", ["clip=null", f"seed={seed}"], ending_at(1000.0 + seed))
        write_run(sweep / f"a_{seed}", ["clip=0.1", f"seed={seed}"], ending_at(0.5 - seed / 10))
        write_run(sweep / f"b_{seed}", ["clip=1", f"seed={seed}"], ending_at(0.2),
                  fractions={"dense_2": [0.5] * 10})
    from gradexp.analysis import plots

    figures, save = {}, plots._save

    def record(plt, fig, path):
        figures[path.name] = fig.axes
        return save(plt, fig, path)

    monkeypatch.setattr(plots, "_save", record)
    assert S.main([str(sweep), "--plots"]) == 0
    legends = [[t.get_text() for t in ax.get_legend().get_texts()]
               for ax in figures["grad_norms.png"]]
    assert legends == [["clip=null", "clip=0.1"], ["clip=1"]]  # dense_1, dense_2
    (ax,) = figures["final_loss_vs_clip.png"]
    assert ax.get_yscale() == "log" and 0 < ax.get_ylim()[0] < 0.2



def test_a_reader_that_stops_early_ends_summarize_quietly(tmp_path):
    """`summarize DIR | head`: the pipe is closed before summarize prints its first line (it
    is still importing pandas), so every write fails with EPIPE; the user sees no traceback
    and summarize still writes its files."""
    two_sweeps(tmp_path)
    child = subprocess.Popen([sys.executable, "-m", "gradexp.summarize", str(tmp_path)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()
    _, err = child.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert child.returncode == 0
    assert len(read_csv(tmp_path / "summary.csv")) == 3 * len(METRICS)

def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert S.main(["no/such/dir"]) == 2  # relative to the working directory
    assert capsys.readouterr() == ("", "error: no/such/dir: no such directory\n")
    (tmp_path / "empty").mkdir()
    assert S.main([str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'empty'}: no readable runs\n"
    write_run(tmp_path / "one" / "a", ["clip=0.1", "layer.scale=1"], ending_at(1.0))
    write_run(tmp_path / "one" / "b", ["clip=0.1", "layer.scale=3"], ending_at(1.0))
    assert S.main([str(tmp_path / "one")]) == 0  # the default baseline may be absent: a note
    assert "No baseline (pass --baseline KEY=VALUE): no comparisons." in capsys.readouterr().out
    assert S.main([str(tmp_path / "one"), "--baseline", "layer.scale=5"]) == 2
    assert capsys.readouterr().err == ("error: --baseline layer.scale=5: no run has "
                                       "layer.scale=5 (layer.scale values: 1, 3)\n")
    assert S.main([str(tmp_path / "one"), "--baseline", "clip=none"]) == 2
    assert capsys.readouterr().err == ("error: --baseline clip=none: clip is not a swept key "
                                       "(keys: layer.scale)\n")
    write_run(tmp_path / "two" / "a", ["clip=0.1", "layer.scale=1", "seed=0"], ending_at(1.0))
    write_run(tmp_path / "two" / "b", ["clip=1", "layer.scale=3", "seed=0"], ending_at(1.0))
    assert S.main([str(tmp_path / "two"), "--baseline", "layer.scale=1,seed=0"]) == 2
    assert capsys.readouterr().err == ("error: --baseline seed=0: seed is not a swept key "
                                       "(keys: clip, layer.scale)\n")
    for seed in range(2):
        write_run(tmp_path / "seeds" / f"s{seed}", ["clip=0.1", f"seed={seed}"], ending_at(1.0))
    assert S.main([str(tmp_path / "seeds"), "--baseline", "clip=0.1"]) == 2
    assert capsys.readouterr().err == ("error: --baseline clip=0.1: clip is not a swept key "
                                       "(no key but the seed varies)\n")
    (tmp_path / "broken" / "a").mkdir(parents=True)
    (tmp_path / "broken" / "a" / "metrics.csv").write_text("step,loss/train\n1,2\n")
    assert S.main([str(tmp_path / "broken")]) == 2
    out, err = capsys.readouterr()
    assert out == "skipped a: no .hydra/ (not a Hydra run directory)\n"
    assert err == f"error: {tmp_path / 'broken'}: no readable runs (1 skipped)\n"


def test_summarize_never_loads_tensorflow(tmp_path):
    """Not on import, not while writing TensorBoard runs (the tensorboard package alone)."""
    for seed in range(2):
        for clip in ("null", "0.1"):
            write_run(tmp_path / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                      ending_at(1.0 + seed))
    for code in ("import gradexp.summarize",
                 f"from gradexp.summarize import main; main([{str(tmp_path)!r}, '--tensorboard'])"):
        result = subprocess.run([sys.executable, "-c", f"import sys; {code}; "
                                 "print('tensorflow' in sys.modules)"], cwd=REPO,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == "False", code
    assert (tmp_path / "summary_tb" / "settings.csv").is_file()


def test_bad_inputs_are_skipped_with_a_reason_never_a_traceback(tmp_path, capsys):
    """The summary's half of the bad-input catalogue: each case is answered by a
    `skipped <run>: <reason>` line (or summarized, where the data allow it), exit 0."""
    sweep = tmp_path / "sweep"
    for seed in range(2):
        write_run(sweep / f"good_{seed}", ["clip=null", f"seed={seed}"], ending_at(1.0))
    # a run whose only record is a corrupt event file
    corrupt = write_run(sweep / "corrupt_events", ["clip=0.1", "seed=0"], ending_at(1.0))
    (corrupt / "metrics.csv").unlink()
    (corrupt / "events.out.tfevents.1.host.v2").write_bytes(b"\x00garbage, not a record" * 9)
    # NaNs in a metrics table: a diverged run, summarized as one
    write_run(sweep / "nan_loss", ["clip=0.1", "seed=1"], [4.0, 3.0, float("nan"), 2.0])
    # a table cut off in the middle of a line (and its summary says completed)
    cut = write_run(sweep / "truncated", ["clip=1", "seed=0"], ending_at(1.0))
    (cut / "metrics.csv").write_text((cut / "metrics.csv").read_text()[:-7])
    assert S.main([str(sweep)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    skipped = [line for line in out.splitlines() if line.startswith("skipped ")]
    assert any(line.startswith("skipped corrupt_events: ") for line in skipped), skipped
    assert any(line.startswith("skipped truncated: ") for line in skipped), skipped
    runs_table = pd.read_csv(sweep / "runs.csv", keep_default_na=False, na_values=[""])
    nan_run = runs_table[runs_table["run"] == "nan_loss"].iloc[0]
    assert nan_run["diverged"] == 1 and nan_run["diverged_step"] == 3

    single = sweep / "good_0"  # not a sweep: one run directory is summarized as one group
    assert S.main([str(single)]) == 0
    assert (single / "summary.csv").exists()


A, B = "a" * 40, "b" * 40  # two commits


def test_summarize_warns_in_one_line_when_runs_come_from_different_code(tmp_path, capsys):
    """Two commits, a dirty tree, a run resumed on other code, a run without provenance.json:
    one line on stderr says how many of each; the summary itself is unchanged (exit 0)."""
    def sweep(name, records):
        for seed, record in enumerate(records):
            for clip in ("null", "0.1"):
                write_run(tmp_path / name / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                          ending_at(1.0), provenance=record)
        return tmp_path / name

    mixed = sweep("mixed", [code_record(A), code_record(B)])
    assert S.main([str(mixed)]) == 0
    out, err = capsys.readouterr()
    assert err == "warning: 4 runs from 2 commits (2 at aaaaaaaaaa, 2 at bbbbbbbbbb)\n"
    assert "Baseline" in out and "warning" not in out  # the table as without the warning
    dirty = sweep("dirty", [code_record(A, dirty=True, diff="d1"), None])  # seed 1: unknown
    assert S.main([str(dirty)]) == 0
    assert capsys.readouterr().err == (
        "warning: 4 runs from 1 commit (2 at aaaaaaaaaa); 2 from a dirty tree (1 distinct "
        "diff, in the run directory's provenance.diff); 2 with no recorded commit\n")
    resumed = sweep("resumed", [code_record(A, resumes=[(A, True, "d1"), (B, True, "d2")]),
                                code_record(A)])
    assert S.main([str(resumed)]) == 0
    assert capsys.readouterr().err == (
        "warning: 4 runs from 2 commits (4 at aaaaaaaaaa, 2 at bbbbbbbbbb); 2 from a dirty "
        "tree (2 distinct diffs, in the run directory's provenance.diff)\n")


def test_summarize_is_silent_when_runs_share_a_clean_commit_or_have_no_provenance(
        tmp_path, capsys):
    for seed in range(2):
        for clip in ("null", "0.1"):
            overrides = [f"clip={clip}", f"seed={seed}"]
            write_run(tmp_path / "same" / f"{clip}_{seed}", overrides, ending_at(1.0),
                      provenance=code_record(A, resumes=[(A, False, None)]))
            write_run(tmp_path / "older" / f"{clip}_{seed}", overrides, ending_at(1.0),
                      provenance=code_record(None) if seed else None)  # wheel; older run
    corrupt = tmp_path / "older" / "0.1_0" / "provenance.json"
    corrupt.write_text("{cut")  # unreadable: unknown, never a reason to skip the run
    for folder in ("same", "older"):
        assert S.main([str(tmp_path / folder)]) == 0
        out, err = capsys.readouterr()
        assert err == "" and "skipped" not in out, folder


def test_tensorboard_bands_name_each_setting_and_replace_an_earlier_summary(tmp_path, capsys):
    """--tensorboard: a run per setting under summary_tb/, its directory named by the mapping
    (`=` → `-`, `/` → `.`, `,` → `+`, brackets dropped, pairs joined by `,`); at a step only one
    seed reached (the other diverged before it) the band has no width; a second summary
    replaces the first."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gradexp.analysis.bands_tb import run_dir_name, run_dir_names

    assert run_dir_name("clip=0.1 layer.positions=[rnn_1,dense_1]") == \
        "clip-0.1,layer.positions-rnn_1+dense_1"
    assert run_dir_names(["a=[b,c]", "a=b+c"]) == {"a=[b,c]": "a-b+c", "a=b+c": "a-b+c~2"}
    sweep = tmp_path / "sweep"
    for seed, losses in enumerate(([4.0, 3.0, 2.0, 1.0], [4.0, 2.0, 1e9])):  # seed 1 diverges
        write_run(sweep / f"a{seed}", ["clip=0.1", "dataset.path=data/x.npz", f"seed={seed}"],
                  losses, status="diverged" if seed else "completed")
        write_run(sweep / f"b{seed}", ["clip=null", "dataset.path=data/y.npz", f"seed={seed}"],
                  [4.0, 3.0 + seed, 2.0, 1.0])
    assert S.main([str(sweep), "--tensorboard"]) == 0
    assert S.main([str(sweep), "--tensorboard"]) == 0  # again: it replaces the first's runs
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        f"runs.csv, {sweep / 'summary_tb'}")
    runs = {p.name: p for p in (sweep / "summary_tb").iterdir() if p.is_dir()}
    assert sorted(runs) == ["clip-0.1,dataset.path-data.x.npz", "clip-null,dataset.path-data.y.npz"]
    assert read_csv(sweep / "summary_tb" / "settings.csv")["setting"].tolist() == [
        "clip=null dataset.path=data/y.npz", "clip=0.1 dataset.path=data/x.npz"]
    assert not list(sweep.glob(".summary_tb*"))
    clipped = runs["clip-0.1,dataset.path-data.x.npz"]
    assert len(list(clipped.glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(clipped), size_guidance={"tensors": 0})
    events.Reload()

    def values(tag):
        return {e.step: float(e.tensor_proto.float_val[0]) for e in events.Tensors(tag)}

    # seed 1 diverged at step 3 (1e9 > 1000 × 4): steps 1-2 have two seeds, steps 3-4 one
    assert values("mean/loss/train") == {1: 4.0, 2: 2.5, 3: 2.0, 4: 1.0}
    half = 12.706204736174707 * (0.5 ** 0.5) / (2 ** 0.5)  # t_{0.975,1} · s / √2, s = √0.5
    factor = math.exp(half / 2.5)  # a loss: on the log scale, [x̄ / f, x̄ · f], never below 0
    assert values("lower/loss/train")[2] == pytest.approx(2.5 / factor, rel=1e-6)
    assert values("upper/loss/train")[2] == pytest.approx(2.5 * factor, rel=1e-6)
    assert values("lower/loss/train")[1] == values("upper/loss/train")[1] == 4.0  # s = 0
    assert values("lower/loss/train")[3] == values("upper/loss/train")[3] == 2.0  # one seed

    seeds = tmp_path / "seeds"  # only the seed varies: one group, all runs
    for seed in range(2):
        write_run(seeds / f"s{seed}", ["clip=0.1", f"seed={seed}"], ending_at(2.0 + seed))
    assert S.main([str(seeds), "--tensorboard"]) == 0
    assert sorted(p.name for p in (seeds / "summary_tb").iterdir()) == ["settings.csv",
                                                                         "sweep-all"]


def test_a_search_is_summarized_with_its_history_and_best_value(tmp_path, capsys):
    """A search's record (search.csv, as the sweeper writes it) beside its runs: its history
    and best line are printed after the table and end summary.md as its own section. Trial 0
    (clip=0.1) has final losses 1 and 2, trial 1 (clip=1) 3 and 3."""
    from gradexp.runs import search_record

    finals = {0: ("0.1", [1.0, 2.0]), 1: ("1", [3.0, 3.0])}
    rows = []
    for trial, (clip, losses) in finals.items():
        jobs = [f"{trial}_{seed}" for seed in range(2)]
        for seed, (job, loss) in enumerate(zip(jobs, losses, strict=True)):
            write_run(tmp_path / job, [f"clip={clip}", f"seed={seed}"], ending_at(loss),
                      summary={"final_loss": loss})
        rows.append({"trial": trial, "state": "complete", "value": sum(losses) / 2, "clip": clip,
                     "seeds": 2, "diverged": 0, "values": " ".join(map(str, losses)),
                     "jobs": " ".join(jobs)})
    search_record.write(tmp_path, ["clip"], rows)
    assert S.main([str(tmp_path), "--baseline", "clip=1"]) == 0
    out = capsys.readouterr().out
    table, search = out.split("\n\nsearch: 2 trials in the order they ran; final_loss: ")
    assert table.splitlines()[-1].split()[0] == "0.1"  # the comparison's table, then the search
    best = "best: clip=0.1 (trial 0): final_loss 1.5, sd 0.7071 over 2 seeds (from 1 to 2)"
    assert search.splitlines()[-2] == best
    assert search.splitlines()[-1].startswith("wrote ")
    report = (tmp_path / "summary.md").read_text()
    assert report.endswith("\n## Search\n\nsearch: 2 trials in the order they ran; final_loss: "
                           + search.split("\nwrote ")[0] + "\n")
    assert report.count("## Search") == 1 and report.index("## final_loss") < report.index(
        "## Search")


def test_the_note_explains_the_success_columns_when_the_runs_have_a_criterion(tmp_path, capsys):
    for seed in range(2):
        for clip in ("null", "0.1"):
            write_run(tmp_path / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                      ending_at(1.0), columns={"error_rate/val": [None] * 9 + [0.0]},
                      config={"dataset": {"name": "adding", "success_below": 0.01}})
    assert S.main([str(tmp_path)]) == 0
    note = capsys.readouterr().out.splitlines()[0]
    assert note.startswith("Baseline clip=null: ")
    assert " success: seeds that succeeded/seeds [exact 95% interval], Δ success: " in note


def test_a_closed_pipe_sends_the_rest_of_the_output_to_dev_null():
    """PipeSafeStdout over a pipe whose reader reads one line and goes: what is written after
    is dropped without an error, and its descriptor then points to /dev/null, so the bytes
    still buffered at exit cannot fail either."""
    import os

    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    safe = S.PipeSafeStdout(stream)
    assert not safe.reader_gone and safe.fileno() == write_end  # the rest: the stream's own
    assert safe.write("first ü\n") == 8
    safe.flush()
    assert os.read(read_end, 100) == "first ü\n".encode()
    os.close(read_end)
    assert safe.write("x" * 100_000) == 100_000  # more than the buffer: it fails to flush
    assert safe.reader_gone
    safe.flush()
    assert safe.write("more") == 4
    assert os.path.samestat(os.fstat(write_end), os.stat(os.devnull))
    stream.close()
