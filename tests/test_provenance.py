"""provenance.json: the code's commit and state (on temporary git repositories), the installed
packages, a resume's record, and a real sweep run from a dirty copy of the code."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from gradexp.runs import provenance

GIT_ID = ["-c", "user.name=test", "-c", "user.email=test@example.com", "-c",
          "commit.gpgsign=false"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *GIT_ID, *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def make_repo(root: Path) -> Path:
    """A git repository holding pkg/mod.py, committed."""
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_a_dirty_tree_leaves_its_diff_beside_the_record(tmp_path):
    repo, run_dir = make_repo(tmp_path / "repo"), tmp_path / "run"
    run_dir.mkdir()
    (repo / "notes.txt").write_text("scratch\n")  # untracked: listed, not dirty
    clean = provenance.code_version(repo / "pkg", run_dir, "provenance.diff")
    assert clean["commit"] == git(repo, "rev-parse", "HEAD") and clean["error"] is None
    assert clean["dirty"] is False and clean["diff"] is None and clean["untracked"] == [
        "notes.txt"]
    assert not (run_dir / "provenance.diff").exists()

    (repo / "pkg" / "mod.py").write_text("x = 2  # changed after the commit\n")
    dirty = provenance.code_version(repo / "pkg", run_dir, "provenance.diff")
    assert dirty["commit"] == clean["commit"] and dirty["dirty"] is True
    diff = (run_dir / dirty["diff"]).read_text()
    assert "-x = 1\n+x = 2  # changed after the commit\n" in diff
    assert diff == git(repo, "diff", "HEAD") + "\n"  # the whole of `git diff HEAD`
    # staged changes count too (the diff is against HEAD, not the index)
    git(repo, "add", "pkg/mod.py")
    staged = provenance.code_version(repo / "pkg", run_dir, "provenance.diff")
    assert staged["dirty"] is True and staged["diff_sha256"] == dirty["diff_sha256"]


def test_without_a_checkout_or_git_the_commit_is_null_with_the_reason(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "loose").mkdir()  # a wheel's site-packages: no repository at all
    loose = provenance.code_version(tmp_path / "loose", run_dir, "provenance.diff")
    assert loose["commit"] is None and "not a git repository" in loose["error"]
    # a package inside someone else's repository (a virtualenv in a project), not tracked there
    repo = make_repo(tmp_path / "project")
    (repo / "venv" / "gradexp").mkdir(parents=True)
    inside = provenance.code_version(repo / "venv" / "gradexp", run_dir, "provenance.diff")
    assert inside["commit"] is None and "is not tracked by the git repository" in inside["error"]
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    no_git = provenance.code_version(repo / "pkg", run_dir, "provenance.diff")
    assert no_git["commit"] is None and no_git["error"] == "git is not installed"


def test_a_resume_keeps_the_first_record_and_appends_its_own(tmp_path):
    repo, run_dir = make_repo(tmp_path / "repo"), tmp_path / "run"
    run_dir.mkdir()
    first = provenance.record(run_dir, code_dir=repo / "pkg")
    provenance.add_devices(run_dir, first, {"replicas": ["/device:CPU:0"]})
    (repo / "pkg" / "mod.py").write_text("x = 3\n")
    for n in (1, 2):
        again = provenance.record(run_dir, resume=True, code_dir=repo / "pkg")
        provenance.add_devices(run_dir, again, {"replicas": [f"/device:GPU:{n}"]})
    saved = json.loads((run_dir / "provenance.json").read_text())
    assert saved["code"]["dirty"] is False and saved["devices"] == {"replicas": ["/device:CPU:0"]}
    assert [r["code"]["diff"] for r in saved["resumes"]] == [
        "provenance.resume-1.diff", "provenance.resume-2.diff"]
    assert [r["devices"]["replicas"] for r in saved["resumes"]] == [
        ["/device:GPU:1"], ["/device:GPU:2"]]
    assert "+x = 3" in (run_dir / "provenance.resume-2.diff").read_text()
    assert not (run_dir / "provenance.diff").exists()  # the first start was clean
    # a fresh start in that directory begins a new record
    assert provenance.record(run_dir, code_dir=repo / "pkg")["resumes"] == []


def test_a_record_made_from_anothers_is_the_same_with_its_own_diff_file(tmp_path):
    """record_as (the launcher's later runs): what `record` would write, but for the time."""
    repo = make_repo(tmp_path / "repo")
    (repo / "pkg" / "mod.py").write_text("x = 2\n")  # dirty: a diff beside each record
    first_dir, run_dir, again_dir = (tmp_path / n for n in ("first", "run", "again"))
    for d in (first_dir, run_dir, again_dir):
        d.mkdir()
    first = provenance.record(first_dir, code_dir=repo / "pkg")
    (run_dir / "provenance.diff").write_text("stale\n")
    copied = provenance.record_as(run_dir, first_dir, first)
    own = provenance.record(again_dir, code_dir=repo / "pkg")
    saved = json.loads((run_dir / "provenance.json").read_text())
    assert saved == copied
    assert ({k: v for k, v in saved.items() if k != "recorded_at"}
            == {k: v for k, v in own.items() if k != "recorded_at"})
    assert saved["code"]["dirty"] is True and saved["code"]["diff"] == "provenance.diff"
    assert ((run_dir / "provenance.diff").read_text()
            == (again_dir / "provenance.diff").read_text() != "stale\n")
    copied["code"]["commit"] = "changed"  # its own copy: the first record is untouched
    assert first["code"]["commit"] == own["code"]["commit"]


def test_installed_packages_are_importlib_metadata_s_versions():
    packages = provenance.installed_packages()
    for name in ("tensorflow", "keras", "hydra-core", "numpy", "pandas"):
        assert packages[name] == importlib.metadata.version(name), name
    names = {d.metadata["Name"] for d in importlib.metadata.distributions()} - {None}
    assert set(packages) == names


@pytest.mark.slow
def test_a_sweep_from_a_dirty_checkout_records_its_commit_and_diff_in_every_run(tmp_path):
    """The code's checkout, not the working directory: a copy of gradexp/ and conf/ in a fresh
    repository, a line changed after its commit, a 2-run sweep launched from elsewhere. Every
    run records that commit and the diff; summarize warns about the dirty tree."""
    code = tmp_path / "code"
    for part in ("gradexp", "conf"):
        shutil.copytree(REPO / part, code / part, ignore=shutil.ignore_patterns("__pycache__"))
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-q", "-m", "a copy")
    with open(code / "gradexp" / "runs" / "measures.py", "a") as f:
        f.write("# a change not committed\n")
    env = {**os.environ, "PYTHONPATH": str(code)}
    env.pop("HYDRA_FULL_ERROR", None)
    user = tmp_path / "user"
    user.mkdir()
    tiny = ["trainer.jit_compile=false", "trainer.steps=10", "trainer.log_every=10",
            "trainer.eval_every=10", "trainer.histogram_every=0", "model.width=8"]
    result = subprocess.run([sys.executable, "-m", "gradexp.train", "-m", "seed=0,1", *tiny],
                            cwd=user, env=env, text=True, capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr
    (sweep_dir,) = (user / "outputs" / "multirun").glob("*/*")
    run_dirs = sorted(d for d in sweep_dir.iterdir() if (d / ".hydra").is_dir())
    assert [d.name for d in run_dirs] == ["0", "1"]
    for run_dir in run_dirs:
        record = json.loads((run_dir / "provenance.json").read_text())
        assert record["code"]["path"] == str(code / "gradexp")  # the copy ran, not REPO
        assert record["code"]["commit"] == git(code, "rev-parse", "HEAD")
        assert record["code"]["dirty"] is True and record["code"]["diff"] == "provenance.diff"
        assert "+# a change not committed" in (run_dir / "provenance.diff").read_text()
        assert record["versions"]["tensorflow"] == importlib.metadata.version("tensorflow")
        summary = json.loads((run_dir / "summary.json").read_text())
        assert record["devices"]["description"] == summary["device"]
        assert record["devices"]["replicas"] and record["resumes"] == []
    summarized = subprocess.run([sys.executable, "-m", "gradexp.summarize", str(sweep_dir)],
                                cwd=user, env=env, text=True, capture_output=True, timeout=120)
    assert summarized.returncode == 0, summarized.stderr
    assert summarized.stderr.startswith("warning: 2 runs from 1 commit")
    assert "2 from a dirty tree (1 distinct diff" in summarized.stderr
