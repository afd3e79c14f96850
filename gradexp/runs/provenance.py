"""A run's provenance: which code, which packages and which devices produced it.

`record` writes `provenance.json` into the run directory when a run starts, before anything that
could fail, and `add_devices` adds the devices once TensorFlow has set them up:

    code       the git checkout holding the gradexp package (not the working directory: a run
               may be launched from anywhere): its commit, whether tracked files differ from
               it (`dirty`; untracked files do not count, they are listed by name), and when
               dirty, `git diff HEAD` written beside it (rundir.PROVENANCE_DIFF); `commit` is
               null with the reason in `error` when there is no checkout (a wheel install),
               no git, or git fails: provenance never stops a run
    python, platform, cpu, environment (the few variables that change numerics or devices)
    versions   Python, TensorFlow, Keras, Hydra, NumPy, gradexp
    packages   every installed distribution, name -> version (the first of a name on sys.path,
               the one Python imports)
    devices    as devices.describe says (null until add_devices)

A resumed run keeps the first start's record and appends its own to `resumes`, with its own
diff file (rundir.resume_diff); a run older than provenance resumed gets only `resumes`.
Cost: about 30 ms of CPU a run, 60-100 ms of wall time on 2 busy cores (four or five git calls;
the package table is read from each distribution's metadata header: importlib.metadata's full
parse took 0.2-0.4 s); hydra/launcher=gradexp pays it once a launch, the later runs it sets
up copy the first's record (`record_as`). No TensorFlow here.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gradexp.runs import rundir
from gradexp.runs.rundir import write_json

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # gradexp/: the code a run records
GIT_TIMEOUT_S = 10
MAX_UNTRACKED = 100  # names listed; a messy tree can hold thousands
# what the versions table calls each library: its distribution names, the first installed wins
LIBRARIES = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos",
                            "tf-nightly", "tf-nightly-cpu"),
             "keras": ("keras", "keras-nightly"), "hydra": ("hydra-core",), "numpy": ("numpy",),
             "gradexp": ("gradexp",)}
ENVIRONMENT = ("CUDA_VISIBLE_DEVICES", "TF_ENABLE_ONEDNN_OPTS", "TF_XLA_FLAGS", "XLA_FLAGS",
               "TF_DETERMINISTIC_OPS", "OMP_NUM_THREADS", "PYTHONHASHSEED")


def record(run_dir: Path, resume: bool = False, code_dir: Path = PACKAGE_DIR) -> dict[str, Any]:
    """Write the run's provenance.json (a resume: append to its `resumes`) and the diff of a
    dirty tree; return the whole document, for `add_devices`."""
    path = run_dir / rundir.PROVENANCE
    document = _read(path) if resume else {}
    resumes = document.setdefault("resumes", [])
    diff_name = rundir.resume_diff(len(resumes) + 1) if resume else rundir.PROVENANCE_DIFF
    entry = collect(code_dir, run_dir, diff_name)
    if resume:
        resumes.append(entry)
    else:
        document = {**entry, "resumes": []}
    write_json(path, document)
    return document


def record_as(run_dir: Path, first_dir: Path, first: dict[str, Any]) -> dict[str, Any]:
    """A fresh start's record made from `first`, the record of a run started moments before in
    this process (hydra/launcher=gradexp sets a sweep's runs up together): the same code,
    packages and machine, the dirty tree's diff copied, its own time. Spares each later run
    of the sweep the git calls and the package table (~45 ms a run)."""
    document = {**copy.deepcopy(first), "resumes": [],
                "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    diff = run_dir / rundir.PROVENANCE_DIFF
    diff.unlink(missing_ok=True)  # a clean restart leaves no stale diff
    if document["code"]["diff"]:
        shutil.copyfile(first_dir / document["code"]["diff"], diff)
    write_json(run_dir / rundir.PROVENANCE, document)
    return document


def add_devices(run_dir: Path, document: dict[str, Any], devices: dict[str, Any]) -> None:
    """Fill in the devices of the latest start (or resume) and rewrite provenance.json."""
    latest = document["resumes"][-1] if document["resumes"] else document
    latest["devices"] = devices
    write_json(run_dir / rundir.PROVENANCE, document)


def collect(code_dir: Path, run_dir: Path, diff_name: str) -> dict[str, Any]:
    """One start's record (see the module's docstring); writes `diff_name` when dirty."""
    packages = installed_packages()
    by_name = {name.lower().replace("_", "-"): version for name, version in packages.items()}
    return {
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "code": code_version(code_dir, run_dir, diff_name),
        "python": {"version": platform.python_version(),
                   "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": platform.platform(),
        "cpu": {"model": _cpu_model(), "cores": _usable_cores()},
        "environment": {k: os.environ[k] for k in ENVIRONMENT if k in os.environ},
        "versions": {"python": platform.python_version(),
                     **{name: next((by_name[d] for d in dists if d in by_name), None)
                        for name, dists in LIBRARIES.items()}},
        "packages": packages,
        "devices": None,
    }


def code_version(code_dir: Path, run_dir: Path, diff_name: str) -> dict[str, Any]:
    """The git state of the checkout holding `code_dir`: {path, repository, commit, dirty,
    diff (file name or null), diff_sha256, untracked, error}. Never raises."""
    found = {"path": str(code_dir), "repository": None, "commit": None, "dirty": None,
             "diff": None, "diff_sha256": None, "untracked": [], "error": None}
    try:
        top, commit = _git(code_dir, "rev-parse", "--show-toplevel", "HEAD").splitlines()
        found["repository"] = top
        if not _git(code_dir, "ls-files", "--", ".").strip():  # e.g. site-packages in a repo
            raise GitError(f"{code_dir} is not tracked by the git repository at {top} "
                           "(installed from a wheel?)")
        found["commit"] = commit
        # --no-optional-locks: the runs of a sweep must not race for the index's lock
        status = _git(top, "--no-optional-locks", "status", "--porcelain").splitlines()
    except GitError as exc:
        found["error"] = str(exc)
        return found
    untracked = [line[3:] for line in status if line.startswith("?? ")]
    found["untracked"] = untracked[:MAX_UNTRACKED] + (
        [f"... and {len(untracked) - MAX_UNTRACKED} more"] if len(untracked) > MAX_UNTRACKED
        else [])
    found["dirty"] = any(not line.startswith("?? ") for line in status)
    (run_dir / diff_name).unlink(missing_ok=True)  # a clean restart leaves no stale diff
    if found["dirty"]:
        try:
            diff = _git(top, "diff", "--no-ext-diff", "HEAD")
        except GitError as exc:
            found["error"] = f"dirty, but the diff failed: {exc}"
            return found
        (run_dir / diff_name).write_text(diff)
        found["diff"] = diff_name
        found["diff_sha256"] = hashlib.sha256(diff.encode()).hexdigest()
    return found


class GitError(Exception):
    """Why the code's version is unknown; the message goes into provenance.json."""


def _git(where: Path | str, *args: str) -> str:
    # a GIT_DIR or GIT_WORK_TREE set for some other repository would win over -C
    env = {k: v for k, v in os.environ.items()
           if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    try:
        done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {' '.join(args)}: no answer in {GIT_TIMEOUT_S} s") from None
    if done.returncode != 0:
        message = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        raise GitError(f"git {' '.join(args)}: {message}")
    return done.stdout


def installed_packages() -> dict[str, str]:
    """Every distribution on sys.path, name -> version, sorted by name. Reads each one's
    metadata header only (importlib.metadata's full parse costs ~2 ms a package)."""
    packages = {}
    for dist in importlib.metadata.distributions():
        name = version = None
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
        for line in text.splitlines():
            if not line:  # the header ends at the first blank line
                break
            if line.startswith("Name:"):
                name = line[5:].strip()
            elif line.startswith("Version:"):
                version = line[8:].strip()
        if name:
            packages.setdefault(name, version)  # an earlier sys.path entry shadows a later
    return dict(sorted(packages.items(), key=lambda item: item[0].lower()))


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo
                         if line.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


def _usable_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count()


def _read(path: Path) -> dict[str, Any]:
    """An existing provenance.json (a resume); {} when missing or unreadable."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}
