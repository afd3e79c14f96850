"""Every study's README against the study's committed files (issue 31): the numbers a report
quotes are the numbers its data give.

- A README's generated blocks (gradexp/analysis/readme.py's markers) are what the study's
  report.py writes now from its committed files: a number there that differs from the data, or
  a data file changed without rerunning report.py, fails.
- Every number of the rest of the README, its prose and hand-written tables, is written in a
  committed results file of the study (its .md, .csv, .json and .txt files but README.md and
  the declarations, DECLARED*.md), compared as decimals: 0.10 is 0.1, 21,415 is 21415, 1.9e-6 is
  0.0000019, 2·10⁻⁶ and 10⁴ are read as such; a sign is ignored (−0.8 and -0.8 alike). Code
  (`...` and fenced blocks), link targets and HTML comments are not prose. A number that is not
  a result (a config value, a seed, a paper's figure, a year) is allowed only inside a phrase of
  ALLOWED, each with its reason.

The prose check is as strong as the number is specific: a small count (5, 10) is written in
every table, a measured value (0.0311, 11,135) in few. The generated blocks are what ties a
number to its meaning; the prose check catches a number with no source at all.
"""

from __future__ import annotations

import importlib
import re
import shutil
import sys
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO
from gradexp.analysis.readme import prose, read_blocks, replace_blocks

EXPERIMENTS = REPO / "experiments"
STUDIES = sorted(readme.parent.name for readme in EXPERIMENTS.glob("*/README.md"))
RESULTS = (".md", ".csv", ".json", ".txt")
SIBLINGS = ("report", "mcnemar", "choose", "pooled", "table", "regime", "fresh", "paper_table")

# The phrases whose numbers are not results, per study, each with its reason.
ALLOWED: dict[str, dict[str, str]] = {
    "pascanu_adding": {
        "ICML\n2013": "the paper's venue and year",
        "5,000,000 updates": "the paper's budget (its code)",
    },
    "digits_clip_scale": {"scikit-learn's 1797": "the dataset's size"},
    "mnist1d": {
        "batches of 100": "the paper's recipe: a config value",
        "40 → 100 → 100": "the paper's MLP: its widths",
        "two hidden layers of 100": "the preset's MLP: its widths",
    },
}


# ------------------------------------------------------------------------------ numbers
SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
NUMBER = re.compile(
    r"(?<![\w.])(?:"
    r"(?P<mantissa>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)"  # 21,415  0.5  100000
    r"(?:[eE](?P<exp>[-+−]?\d+))?"                          # 1.907e-06
    r"(?:·10(?P<times>[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+))?"                # 2·10⁻⁶
    r"|10(?P<power>[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)"                     # 10⁴
    r")(?!\w)")
NOT_PROSE = [re.compile(r"```.*?```", re.S), re.compile(r"`[^`\n]*`"),
             re.compile(r"(?<=\])\([^)]*\)"), re.compile(r"<!--.*?-->", re.S)]


def value(match: re.Match) -> Decimal:
    if match["power"]:
        return Decimal(1).scaleb(int(match["power"].translate(SUPERSCRIPT)))
    number = Decimal(match["mantissa"].replace(",", ""))
    if match["exp"]:
        number = number.scaleb(int(match["exp"].replace("−", "-")))
    if match["times"]:
        number = number.scaleb(int(match["times"].translate(SUPERSCRIPT)))
    return number


def numbers(text: str) -> list[tuple[str, Decimal]]:
    """(as written, value) of every number in `text`."""
    return [(m.group(0), value(m)) for m in NUMBER.finditer(text)]


def results_files(study: Path) -> list[Path]:
    return sorted(p for p in study.rglob("*") if p.suffix in RESULTS and p.name != "README.md"
                  and not p.name.startswith("DECLARED"))


def results_numbers(study: Path) -> set[Decimal]:
    return {v for path in results_files(study) for _, v in numbers(path.read_text())}


def prose_numbers(text: str, allowed: dict[str, str]) -> list[tuple[str, Decimal]]:
    """The numbers of a README's prose: without its generated blocks, code, link targets,
    comments and the allowed phrases."""
    text = prose(text)
    for pattern in NOT_PROSE:
        text = pattern.sub(" ", text)
    for phrase in allowed:
        text = text.replace(phrase, " ")
    return numbers(text)


def unsourced(study: Path, allowed: dict[str, str]) -> list[str]:
    """The README's prose numbers that no committed results file of the study writes."""
    found = {abs(v) for v in results_numbers(study)}
    return [written for written, v in prose_numbers((study / "README.md").read_text(), allowed)
            if abs(v) not in found]


# ------------------------------------------------------------------------ generated blocks
def report_module(study: Path, monkeypatch):
    """The study's report.py, imported from `study` (its siblings by their plain names, as the
    script itself imports them)."""
    monkeypatch.syspath_prepend(str(study))
    for name in SIBLINGS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("report")


def stale_blocks(study: Path, monkeypatch) -> list[str]:
    """The generated blocks of the README that differ from what report.py writes now (and the
    blocks one of them has that the other does not)."""
    readme = read_blocks((study / "README.md").read_text())
    written = report_module(study, monkeypatch).blocks()
    missing = sorted(set(readme) ^ set(written))
    return missing + [name for name in sorted(set(readme) & set(written))
                      if readme[name] != written[name].rstrip("\n") + "\n"]


# ------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("study", STUDIES)
def test_the_generated_blocks_are_what_the_script_writes_now(study, monkeypatch):
    path = EXPERIMENTS / study
    assert (path / "report.py").exists(), f"{study}: no report.py writes its README's numbers"
    assert read_blocks((path / "README.md").read_text()), f"{study}: no generated block"
    assert stale_blocks(path, monkeypatch) == []


@pytest.mark.parametrize("study", STUDIES)
def test_every_number_of_the_prose_is_in_a_committed_results_file(study):
    assert unsourced(EXPERIMENTS / study, ALLOWED.get(study, {})) == []


@pytest.mark.parametrize("study", sorted(ALLOWED))
def test_every_allowed_phrase_is_needed(study):
    """Each phrase is in its README and holds a number no results file writes: without it,
    the prose check fails. The list allows nothing more than it must."""
    allowed = ALLOWED[study]
    text = (EXPERIMENTS / study / "README.md").read_text()
    assert [phrase for phrase in allowed if phrase not in text] == []
    for phrase in allowed:
        rest = {p: why for p, why in allowed.items() if p != phrase}
        assert unsourced(EXPERIMENTS / study, rest) != [], f"{phrase!r} allows nothing"


def test_numbers_are_read_as_written():
    text = "21,415 updates, p = 1.907e-06, 2·10⁻⁶ and 10⁴, 0.10, −0.8; seeds 1, 2; rnn_1 p8"
    assert [v for _, v in numbers(text)] == [
        Decimal(21415), Decimal("0.000001907"), Decimal("0.000002"), Decimal(10000),
        Decimal("0.1"), Decimal("0.8"), Decimal(1), Decimal(2)]
    assert prose_numbers("`clip=0.5` [a](b/0.7.md) <!-- 3 --> 9", {}) == [("9", Decimal(9))]


def test_a_changed_number_is_reported(tmp_path, monkeypatch):
    """On a copy of a study: a number changed in the prose has no source; one changed in a
    generated block makes that block stale; the committed copy passes both."""
    study = tmp_path / "pascanu_adding"
    shutil.copytree(EXPERIMENTS / "pascanu_adding", study,
                    ignore=shutil.ignore_patterns("*.png", "__pycache__"))
    allowed = ALLOWED["pascanu_adding"]
    assert unsourced(study, allowed) == []
    assert stale_blocks(study, monkeypatch) == []
    readme = study / "README.md"
    text = readme.read_text()

    prose_claim = "SGD-C (gradient-norm clipping at 1)"
    assert prose_claim in text and Decimal("1.3") not in results_numbers(study)
    readme.write_text(text.replace(prose_claim, "SGD-C (gradient-norm clipping at 1.3)"))
    assert unsourced(study, allowed) == ["1.3"]

    block_claim = "at update 11,135,"
    assert block_claim in text
    readme.write_text(text.replace(block_claim, "at update 11,136,"))
    assert stale_blocks(study, monkeypatch) == ["test"]
    assert unsourced(study, allowed) == []  # a block's numbers are the script's to check

    readme.write_text(text)  # the data changed under an unchanged README: its result is stale
    runs = study / "test" / "runs.csv"
    table = pd.read_csv(runs)
    solved = table.index[table["success"] == 1][0]
    runs.write_text(table.assign(success=table["success"].where(table.index != solved, 0.0))
                    .to_csv(index=False))
    assert "result" in stale_blocks(study, monkeypatch)


def test_blocks_are_rewritten_between_their_markers_and_nowhere_else():
    text = ("a 1\n<!-- begin generated by report.py: one -->\nold 2\n"
            "<!-- end generated: one -->\nb 3\n")
    new = replace_blocks(text, {"one": "new 4"})
    assert new == text.replace("old 2", "new 4")
    assert read_blocks(new) == {"one": "new 4\n"}
    assert prose(new).split() == ["a", "1", "b", "3"]
    with pytest.raises(ValueError, match="not the script's"):
        replace_blocks(text, {"two": "x"})
    with pytest.raises(ValueError, match="without their end marker"):
        read_blocks(text.replace("<!-- end generated: one -->", ""))
    with pytest.raises(ValueError, match="appears twice"):
        read_blocks(text + text)
