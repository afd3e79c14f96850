"""gradexp.analysis.runs: unreadable runs skipped with a reason, failed and unfinished runs
counted, the event-file fallback."""

from __future__ import annotations

import math

import pytest
from fake_runs import LOSSES, NORMS, VAL, ending_at, write_run

from gradexp.analysis.compare import summarize
from gradexp.analysis.metrics import Settings, run_metrics
from gradexp.analysis.runs import Unreadable, load_runs, read_metrics


def test_unreadable_runs_are_skipped_with_a_reason(tmp_path):
    write_run(tmp_path / "0", ["clip=null", "seed=0"], ending_at(1.0))
    truncated = write_run(tmp_path / "1", ["clip=null", "seed=1"], ending_at(1.0))
    text = (truncated / "metrics.csv").read_text()
    (truncated / "metrics.csv").write_text(text[: text.rindex(",")])  # cut inside the last row
    write_run(tmp_path / "2", ["clip=null", "seed=2"], ending_at(1.0))
    (tmp_path / "2" / "summary.json").write_text("{not json")
    no_hydra = write_run(tmp_path / "3", ["clip=null", "seed=3"], ending_at(1.0))
    for f in (no_hydra / ".hydra").iterdir():
        f.unlink()
    (no_hydra / ".hydra").rmdir()
    empty = write_run(tmp_path / "4", ["clip=null", "seed=4"], ending_at(1.0))
    (empty / "metrics.csv").write_text("")
    runs, skipped = load_runs(tmp_path)
    assert [r.name for r in runs] == ["0"]
    reasons = dict(skipped)
    assert list(reasons) == ["1", "2", "3", "4"]
    assert "truncated" in reasons["1"] and "not JSON" in reasons["2"]
    assert ".hydra" in reasons["3"] and "empty" in reasons["4"]


def test_failed_run_is_counted_and_running_run_is_incomplete(tmp_path):
    write_run(tmp_path / "0", ["clip=0.1", "seed=0"], ending_at(1.0))
    write_run(tmp_path / "1", ["clip=0.1", "seed=1"], [4.0, 3.0], status="failed",
              summary={"error": "ValueError: boom"})
    killed = write_run(tmp_path / "2", ["clip=0.1", "seed=2"], [4.0, 3.0, 2.0, 1.0],
                       status="running")
    with open(killed / "metrics.csv", "a") as f:
        f.write("5,0.9,1.0")  # killed while writing a row: the row is dropped, the rest used
    write_run(tmp_path / "3", ["clip=0.1", "seed=3"], [2.0, 1.0, 5000.0], status="diverged",
              summary={"diverged_step": 3})
    runs, skipped = load_runs(tmp_path)
    assert skipped == [("1", "failed: ValueError: boom")]
    assert [r.status for r in runs] == ["completed", "failed", "running", "diverged"]
    runs_table, tidy = summarize(runs)
    row = tidy[tidy["metric"] == "final_loss"].iloc[0]
    assert (row["runs"], row["completed"], row["failed"], row["incomplete"],
            row["diverged"]) == (4, 1, 1, 1, 1)
    assert row["divergence_rate"] == pytest.approx(1 / 3)  # of the 3 runs with measurements
    assert row["n"] == 2  # the failed run has no final loss; the diverged run's is left out
    incomplete = runs_table.set_index("run").loc["2"]
    assert incomplete["final_loss"] == 1.0 and incomplete["mean_loss"] == 2.5  # steps 1-4


def test_event_files_are_read_when_there_is_no_metrics_csv(tmp_path):
    from gradexp._tf import tf

    run = write_run(tmp_path / "r", ["clip=0.1"], LOSSES, norms=NORMS, val=VAL)
    (run / "metrics.csv").unlink()
    writer = tf.summary.create_file_writer(str(run))
    with writer.as_default():
        for step, (loss, norm) in enumerate(zip(LOSSES, NORMS, strict=True), start=1):
            tf.summary.scalar("loss/train", loss, step=step)
            tf.summary.scalar("grad_norm/global", norm, step=step)
            tf.summary.scalar("clip_fraction/dense_1", 0.25, step=step)
            if step in VAL:
                tf.summary.scalar("loss/val", VAL[step][0], step=step)
                tf.summary.scalar("accuracy/val", VAL[step][1], step=step)
        tf.summary.histogram("gradients/w", [1.0, 2.0], step=1)  # not a per-step scalar
        tf.summary.scalar("final/loss", 0.6, step=10)
    writer.close()
    (loaded,), skipped = load_runs(run)
    assert skipped == [] and list(loaded.metrics["step"]) == list(range(1, 11))
    assert set(loaded.metrics.columns) == {"step", "loss/train", "grad_norm/global",
                                           "clip_fraction/dense_1", "loss/val", "accuracy/val"}
    m = run_metrics(loaded.metrics, Settings(spike_window=3))
    assert m["loss_spike_rate"] == 20 and m["grad_norm_cv"] == pytest.approx(math.sqrt(3.2) / 5)
    assert m["clip_fraction"] == 0.25 and m["val_accuracy"] == 0.75


def test_event_files_every_step_and_the_reasons_a_run_without_metrics_csv_is_skipped(tmp_path):
    """A run of 30 steps (more than the event reader keeps of a tag by default, 10) whose first
    records are a histogram and a final/ scalar: every step is read. Runs without metrics.csv
    are skipped with the reason: no event files, event files without loss/train, an event file
    that is no event (a well-framed record of other bytes)."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    from gradexp._tf import tf

    def events(name, write):
        run = write_run(tmp_path / name, [f"clip={name}"], [1.0])
        (run / "metrics.csv").unlink()
        if write:
            writer = tf.summary.create_file_writer(str(run))
            with writer.as_default():
                write()
            writer.close()
        return run

    def long_run():
        tf.summary.histogram("gradients/w", [1.0, 2.0], step=0)
        tf.summary.scalar("final/loss", 0.6, step=0)
        for step in range(1, 31):
            tf.summary.scalar("loss/train", 30.0 / step, step=step)

    events("long", long_run)
    events("none", None)
    events("no_loss", lambda: tf.summary.scalar("grad_norm/global", 1.0, step=1))
    corrupt = events("corrupt", None)
    with open(corrupt / "events.out.tfevents.1.host", "wb") as f:
        RecordWriter(f).write(b"\xff\xfe not an Event")
    runs, skipped = load_runs(tmp_path)
    assert [r.name for r in runs] == ["long"]
    assert list(runs[0].metrics.columns) == ["step", "loss/train"]
    assert list(runs[0].metrics["step"]) == list(range(1, 31))
    assert list(runs[0].metrics["loss/train"]) == pytest.approx([30.0 / s for s in range(1, 31)])
    reasons = dict(skipped)
    assert reasons.pop("corrupt").startswith("event files unreadable (DecodeError: ")
    assert reasons == {"no_loss": "no metrics.csv, and the event files have no loss/train",
                       "none": "no metrics.csv and no event files"}


def test_every_reason_a_run_is_left_out_word_for_word(tmp_path):
    """load_runs over one folder of broken runs: the reason of each, as summarize prints it,
    and the order of the folder's runs (job 10 after job 9, names after numbers)."""
    def run(name, **kwargs):
        return write_run(tmp_path / name, [f"clip={name}"], ending_at(1.0), **kwargs)

    def write(path, text):
        path.write_text(text)

    for name in ("10", "9", "ok"):
        run(name)
    write(run("no_hydra") / ".hydra" / "overrides.yaml", "[]")
    for f in (tmp_path / "no_hydra" / ".hydra").iterdir():
        f.unlink()
    (tmp_path / "no_hydra" / ".hydra").rmdir()
    (run("no_overrides") / ".hydra" / "overrides.yaml").unlink()
    write(run("overrides_not_yaml") / ".hydra" / "overrides.yaml", "[a, b")
    write(run("overrides_not_a_list") / ".hydra" / "overrides.yaml", "clip: 1")
    write(run("summary_not_json") / "summary.json", "{not json")
    write(run("summary_not_an_object") / "summary.json", "[1, 2]")
    no_summary = run("config_not_a_dict")
    (no_summary / "summary.json").unlink()
    write(no_summary / ".hydra" / "config.yaml", "- 1")
    write(run("empty") / "metrics.csv", " \n")
    write(run("unfinished") / "metrics.csv", "step,loss/train\n1,2.0\n2,1.")
    write(run("short_line") / "metrics.csv", "step,loss/train,x\n1,2.0,0\n2,1.0\n3,1.0,0\n")
    write(run("unparsable") / "metrics.csv", 'step,loss/train\n1,"2.0\n')
    write(run("no_step") / "metrics.csv", "loss/train,x\n2.0,1\n")
    write(run("no_columns") / "metrics.csv", "a,b\n2.0,1\n")
    write(run("no_rows") / "metrics.csv", "step,loss/train\n")
    write(run("steps_back") / "metrics.csv", "step,loss/train\n2,2.0\n1,1.0\n")
    write(run("steps_text") / "metrics.csv", "step,loss/train\n1,2.0\nx,1.0\n")
    run("failed", status="failed", summary={"error": "ValueError: boom"})
    run("failed_quietly", status="failed")
    killed = run("killed", status="running")
    with open(killed / "metrics.csv", "a") as f:
        f.write("11,0.5")  # a row cut short: dropped, the rest kept
    # a running run's last line is dropped only when unfinished: no newline, or too few fields
    whole = run("running", status="running")
    text = (whole / "metrics.csv").read_text()
    cut = run("running_cut", status="running")
    write(cut / "metrics.csv", text + "11,0.5\n")
    unfinished = run("running_unfinished", status="running")
    write(unfinished / "metrics.csv", text + text.splitlines()[-1][:-1])  # all fields, no \n
    latin = run("latin1")  # a byte that is no UTF-8, in a column's name: replaced, not fatal
    (latin / "metrics.csv").write_bytes(text.replace("learning_rate", "caf\xe9", 1)
                                        .encode("latin-1"))
    runs, skipped = load_runs(tmp_path)
    assert [r.name for r in runs] == ["9", "10", "failed", "failed_quietly", "killed", "latin1",
                                      "ok", "running", "running_cut", "running_unfinished"]
    assert [len(r.metrics) for r in runs if r.metrics is not None] == [10] * 8
    assert runs[2].metrics is None and "caf\ufffd" in runs[5].metrics.columns
    reasons = dict(skipped)
    assert reasons.pop("unparsable").startswith("metrics.csv is corrupt (")
    assert reasons == {
        "config_not_a_dict": ".hydra/config.yaml is not a YAML dict",
        "empty": "metrics.csv is empty",
        "failed": "failed: ValueError: boom",
        "failed_quietly": "failed: no error recorded",
        "no_columns": "metrics.csv has no column step, loss/train",
        "no_hydra": "no .hydra/ (not a Hydra run directory)",
        "no_overrides": "no .hydra/overrides.yaml",
        "no_rows": "metrics.csv has no steps",
        "no_step": "metrics.csv has no column step",
        "overrides_not_a_list": ".hydra/overrides.yaml is not a YAML list",
        "overrides_not_yaml": ".hydra/overrides.yaml is not YAML (ParserError)",
        "short_line": "metrics.csv is truncated or corrupt (line 3 has 2 fields, the header 3)",
        "steps_back": "metrics.csv: the step column is not increasing whole numbers",
        "steps_text": "metrics.csv: the step column is not increasing whole numbers",
        "summary_not_an_object": "summary.json is not a JSON object",
        "summary_not_json": "summary.json is not JSON (Expecting property name enclosed in "
                            "double quotes: line 1 column 2 (char 1))",
        "unfinished": "metrics.csv is truncated (its last line is unfinished)"}
    assert list(reasons)[:2] == ["config_not_a_dict", "empty"]  # in the folder's order
    with pytest.raises(Unreadable, match=r"^metrics.csv is truncated \(its last line"):
        read_metrics(tmp_path / "unfinished" / "metrics.csv")  # refused unless asked to drop it
    assert len(read_metrics(tmp_path / "unfinished" / "metrics.csv", partial_last_row=True)) == 1


def test_metrics_csv_reads_back_float32_values_and_exact_steps(tmp_path):
    """The trainer writes float32 values in nine digits: read back as float32 they are its own
    numbers (0.1 is float32's 0.100000001490116…, not float64's 0.1). Steps stay whole numbers,
    exact past float32's 2^24 (a long or resumed run)."""
    import numpy as np

    path = tmp_path / "metrics.csv"
    path.write_text("step,loss/train,grad_norm/global\n"
                    "16777217,0.1,3\n16777218,0.2,2\n16777219,0.3,1\n")
    table = read_metrics(path)
    assert list(table["step"]) == [16777217, 16777218, 16777219]
    assert table["step"].dtype == np.int64
    assert list(table["loss/train"]) == [float(np.float32(x)) for x in (0.1, 0.2, 0.3)]
    assert table["loss/train"].dtype == np.float64 and list(table["grad_norm/global"]) == [3, 2, 1]
