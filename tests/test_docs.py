"""The documentation: the site builds with `mkdocs build --strict` (a warning, such as a broken
link, fails it), the generated pages are what `python -m gradexp.docs_gen` writes today, the
configuration page lists every key of every schema Hydra knows, the bench's JSON renders as its
page, and every fenced block of README.md and docs/ is run (tests/test_docs_examples.py) or
marked not run with its reason (tests/doc_blocks.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import doc_blocks
from conftest import REPO, gradexp


def mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(site)], capture_output=True, text=True, timeout=600,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(REPO)})


@pytest.mark.slow
def test_the_site_builds_with_strict_warnings(tmp_path):
    result = mkdocs(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr
    site = tmp_path / "site"
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "Telemetry" in api and "load_runs" in api  # mkdocstrings read the docstrings
    assert (site / "guide" / "tensorboard_bands.png").stat().st_size > 100_000  # the screenshot


@pytest.mark.slow
def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The same validation settings on a page that links to a page that is not there."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config.update(docs_dir=str(tmp_path / "docs"), nav=["index.md"], plugins=["search"])
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# x\n\nSee [the guide](guide/nosuch.md).\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    result = mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "guide/nosuch.md" in result.stderr and "WARNING" in result.stderr


def test_the_generated_pages_are_what_the_code_gives_today(tmp_path):
    from gradexp.docs_gen import GENERATED, main

    assert main(["--out", str(tmp_path)]) == 0

    for name in GENERATED:
        fresh, committed = (tmp_path / name).read_text(), (REPO / "docs" / name).read_text()
        assert fresh == committed, f"docs/{name} is stale: run `python -m gradexp.docs_gen`"


def test_a_changed_default_changes_the_configuration_page():
    from gradexp import docs_gen
    from gradexp.config.trainer import TrainerConfig

    page = docs_gen.configuration_page()
    assert "| `trainer.steps` | `1000` | int |" in page
    steps = TrainerConfig.__dataclass_fields__["steps"]
    try:
        steps.default = 1234
        changed = docs_gen.configuration_page()
    finally:
        steps.default = 1000
    assert "| `trainer.steps` | `1234` | int |" in changed and changed != page
    assert docs_gen.configuration_page() == page


def sections(page: str) -> dict[str, set[str]]:
    """The configuration page's keys, by section heading."""
    out: dict[str, set[str]] = {}
    for line in page.splitlines():
        if line.startswith("## "):
            out[line[3:]] = set()
        elif line.startswith("| `") and out:
            out[list(out)[-1]].add(line.split("`")[1])
    return out


def test_the_configuration_page_lists_every_key_of_every_schema_hydra_knows():
    """Read from Hydra's ConfigStore (what composing a config uses), not from the generator."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import DictConfig, OmegaConf

    import gradexp.config  # noqa: F401  (registers the schemas)
    import hydra_plugins.gradexp_launcher.gradexp_launcher  # noqa: F401
    import hydra_plugins.gradexp_ray_launcher.ray_launcher  # noqa: F401

    page = sections((REPO / "docs" / "reference" / "configuration.md").read_text())
    repo = ConfigStore.instance().repo
    expected: dict[str, set[str]] = {}
    root = repo["base_config.yaml"].node
    groups = {"model", "dataset", "optimizer", "clipping"}
    expected["Top-level keys"] = {k for k in root if k not in groups
                                  and not isinstance(root._get_node(k), DictConfig)}
    for node_name, title in (("layer", "layer: the clip layers"),
                             ("trainer", "trainer: the training loop")):
        expected[title] = {f"{node_name}.{k}" for k in root[node_name]}
    options = 0
    for entry, stored in repo.items():
        match = re.fullmatch(r"(model|dataset|optimizer|clipping)_(\w+)_schema\.yaml", entry)
        if match:
            group, option = match.groups()
            expected[f"{group}={option}"] = {f"{group}.{k}" for k in stored.node}
            options += 1
    sweeper = repo["search_sweeper_schema.yaml"].node
    expected["hydra/sweeper=optuna"] = {f"hydra.sweeper.{k}" for k in sweeper if k != "_target_"}
    for launcher in ("gradexp", "ray"):
        node = repo["hydra"]["launcher"][f"{launcher}.yaml"].node
        expected[f"hydra/launcher={launcher}"] = {f"hydra.launcher.{k}" for k in node
                                                  if k != "_target_"}
    assert options >= 25  # every option of the four groups
    assert page == expected
    assert "resume" in expected["Top-level keys"] and OmegaConf.is_missing(root, "model")


def test_every_key_of_the_configuration_page_says_what_it_means():
    """The page as the code gives it now (the committed one is checked against it above): a
    key whose field comment, docstring entry or YAML comment goes missing fails here."""
    from gradexp import docs_gen

    rows, heading = [], None
    for line in docs_gen.configuration_page().splitlines():
        if line.startswith("## "):
            heading = line[3:]
        elif line.startswith("| `"):  # key, default, type, meaning; an escaped \| is text
            rows.append((heading, [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]))
    assert len(rows) >= 150 and all(len(cells) == 4 for _, cells in rows)
    unexplained = [f"{cells[0].strip('`')} ({heading})" for heading, cells in rows if not cells[3]]
    assert unexplained == [], "give each a `# meaning` comment in its schema (gradexp/config/)"


@pytest.mark.slow
def test_the_bench_json_renders_as_its_page(tmp_path):
    figures = {"vs_keras_fit": 2.5, "vs_keras_fit_min": 2.3, "vs_keras_fit_max": 2.625,
               "logging_overhead": 1.1, "logging_overhead_min": 1.0, "logging_overhead_max": 1.2,
               "flop_fraction": 0.66, "steps_per_s_gradexp": 4512.4}
    (tmp_path / "bench.json").write_text(json.dumps(figures))
    result = gradexp("gradexp.bench", "--markdown", "bench.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| `")]
    assert rows[0].startswith("| `vs_keras_fit` | 2.50 (2.30–2.62) | ≥ 1.5 | yes | ")
    assert rows[1].startswith("| `flop_fraction` | 0.66 |  |  | ")
    assert rows[2].startswith("| `logging_overhead` | 1.10 (1.00–1.20) | ≤ 1.05 | **no** | ")
    assert rows[3] == "| `steps_per_s_gradexp` | 4,512 |"
    assert len(rows) == 4 and list(tmp_path.iterdir()) == [tmp_path / "bench.json"]
    about = {"about": {"when": "2026-12-05", "on": "2 CPU cores"}, "figures": figures}
    from gradexp.bench.report import markdown

    page = markdown(about)
    assert "- **when**: 2026-12-05\n- **on**: 2 CPU cores\n" in page
    assert page.count("| `vs_keras_fit` |") == 1
    # two full runs: a section each, with its own about and table
    later = {"about": {"when": "2026-12-06"}, "figures": {**figures, "logging_overhead": 1.04}}
    page = markdown([about, later])
    first, second = page.split("## Full run 2 of 2\n")
    assert "## Full run 1 of 2\n\n- **when**: 2026-12-05" in first
    assert "| `logging_overhead` | 1.10 (1.00–1.20) | ≤ 1.05 | **no** |" in first
    assert second.startswith("\n- **when**: 2026-12-06\n")
    assert ("| `logging_overhead` | 1.04 (1.00–1.20) | ≤ 1.05 | median only: spread wider than "
            "±10% |") in second


def test_every_fenced_block_is_run_or_marked_not_run_with_its_reason():
    found = [block for page in doc_blocks.pages() for block in doc_blocks.blocks(page)]
    unmarked = [str(block) for block in found if doc_blocks.category(block) is None]
    assert unmarked == [], "mark each `<!-- not run: REASON -->` or make it runnable"
    kinds = [doc_blocks.category(block) for block in found]
    # of the command blocks (bash, console, python), at most a third not run; a sample of what
    # gradexp prints (text, json) is marked not run with the test that checks it
    commands = [kind for block, kind in zip(found, kinds, strict=True)
                if block.lang in doc_blocks.RUNNABLE]
    assert commands.count("run") >= 30 and commands.count("not run") <= commands.count("run") // 2
    assert any(b.page.name == "README.md" and doc_blocks.category(b) == "run" for b in found)
    # the two example tests together run every page that has a block to run
    ran = doc_blocks.runnable_pages(sweeps=False) + doc_blocks.runnable_pages(sweeps=True)
    assert sorted(ran) == sorted({b.page for b in found if doc_blocks.category(b) == "run"})
    assert all((doc_blocks.REPO / page).is_file() for page in doc_blocks.SWEEP_PAGES)


def test_the_block_finder_sorts_blocks_into_their_categories(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "```yaml", "a: 1", "```",                                   # no category
        "<!-- not run: needs a cluster -->", "", "```bash", "sbatch x", "```",
        "<!-- not run: -->", "```bash", "echo", "```",              # a reason is required
        "```bash", "python -m gradexp.train \\", "    clip=0.1  # one run", "```",
        "<!-- file: my/x.yaml -->", "~~~yaml", "b: 2", "~~~",
        "- an item:", "", "  ```text", "  indented", "  ```",      # indented: found too
        "```console", "$ python -m gradexp.train clip=-1", "error: x", "```"]))
    found = doc_blocks.blocks(page)
    assert [doc_blocks.category(b) for b in found] == [None, "not run", None, "run", "file",
                                                       None, "run"]
    assert [b.line for b in found] == [1, 6, 10, 13, 18, 23, 26]
    assert doc_blocks.commands(found[3].text) == [["python", "-m", "gradexp.train", "clip=0.1"]]
    assert found[4].value == "my/x.yaml" and found[4].text == "b: 2"
    assert found[5].text == "indented"
    assert doc_blocks.console(found[6].text) == [
        (["python", "-m", "gradexp.train", "clip=-1"], "error: x")]


def test_a_documented_command_runs_small_and_finds_the_sweep_it_names(tmp_path):
    older, newer = tmp_path / "outputs/multirun/d1/t1", tmp_path / "outputs/multirun/d2/t2"
    older.mkdir(parents=True)
    newer.mkdir(parents=True)
    import os

    os.utime(older, (1, 1))
    argv = doc_blocks.python_command(
        ["python", "-m", "gradexp.train", "-m", "clip=null,0.1", "trainer.steps=5"], tmp_path)
    assert argv[1:] == ["-m", "gradexp.train", "-m", "clip=null,0.1", "trainer.steps=5",
                        "trainer.log_every=10", "trainer.eval_every=20",
                        "trainer.histogram_every=20", "trainer.jit_compile=false"]
    summary = doc_blocks.python_command(
        ["python", "-m", "gradexp.summarize", "outputs/multirun/<date>/<time>", "--plots"],
        tmp_path)
    assert summary[3:] == ["outputs/multirun/d2/t2", "--plots"]
    with pytest.raises(AssertionError, match="only `python -m gradexp"):
        doc_blocks.python_command(["tensorboard", "--logdir", "x"], tmp_path)
    with pytest.raises(AssertionError, match="placeholder"):
        doc_blocks.python_command(["python", "-m", "gradexp.train", "resume=<run dir>"], tmp_path)


def test_the_readme_is_short_and_undated():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", readme)
    first_screen = "\n".join(readme.splitlines()[:30])
    assert 'pip install -e ".[dev]" && python -m gradexp.train clip=0.1\npytest\n' in first_screen
    ci = (REPO / ".ci" / "run").read_text()
    assert 'pip install -e ".[dev]" && python -m gradexp.train clip=0.1\npytest\n' in ci


def test_the_mutation_page_scores_each_group_against_its_target(tmp_path):
    """A group's score is killed (in a subprocess included) / (tested − equivalent) over its
    modules, each module's too, marked against the group's own target; the mutants a stopped
    run left untested are shown apart and kept out of the score."""
    from gradexp.docs_gen import mutation_page

    def module(name, total, killed, equivalent, in_subprocess=0, untested=0):
        scored = total - equivalent - untested  # as tests/mutation.py counts
        return {"module": name, "total": total, "killed": killed, "equivalent": equivalent,
                "in_subprocess": in_subprocess, "scored": scored, "not checked": untested}

    (tmp_path / "m.json").write_text(json.dumps({
        "core": {"commit": "abc1234", "day": "2026-12-05", "target": 0.95,
                 "modules": [module("a.py", 100, 90, 4, in_subprocess=2),   # 92/96
                             module("b.py", 10, 10, 0)]},                   # 10/10
        "past": {"commit": "def5678", "day": "2026-12-04", "target": 0.90,
                 "modules": [module("c.py", 20, 13, 0, untested=5)]}}))     # 13/15
    rows = [line for line in mutation_page(tmp_path / "m.json").splitlines()
            if line.startswith("| ") and "---" not in line][1:]
    assert rows == [
        "| core | `a.py` | 100 | 0 | 92 | 4 | 4 | 95.8% | | |",
        "| core | `b.py` | 10 | 0 | 10 | 0 | 0 | 100.0% | | |",
        "| **core** | all | 110 | 0 | 102 | 4 | 4 | **96.2%** | 95%: met | abc1234, 2026-12-05 |",
        "| past | `c.py` | 20 | 5 | 13 | 2 | 0 | 86.7% | | |",
        "| **past** | all | 20 | 5 | 13 | 2 | 0 | **86.7%** | 90%: not shown (5 untested) | "
        "def5678, 2026-12-04 |"]
    (tmp_path / "m.json").write_text(json.dumps({"low": {
        "commit": "0", "day": "d", "target": 0.9, "modules": [module("d.py", 10, 8, 0)]}}))
    assert "| 90%: **not met** |" in mutation_page(tmp_path / "m.json")  # 8/10
    (tmp_path / "m.json").write_text(json.dumps({"partial": {  # 9/9 tested, one not: not shown
        "commit": "0", "day": "d", "target": 0.9,
        "modules": [module("e.py", 10, 9, 0, untested=1)]}}))
    assert "| 90%: not shown (1 untested) |" in mutation_page(tmp_path / "m.json")
