"""The fenced blocks of README.md and docs/, and how tests/test_docs_examples.py runs them.

Every block is in one of two categories, said by an HTML comment on the line before it:

    <!-- not run: REASON -->   not run, for the reason given (a cluster, a server, hours)
    <!-- file: PATH -->         a file of the example: written to PATH before the page's
                                commands run (its language is free)
    <!-- run in: DIR -->       run, in a copy of the repository's DIR (a bash block)
    (no comment)                run: a `bash` block (each line a command), a `console` block
                                (`$ command` lines, each followed by its exact output) or a
                                `python` block (a script)

A page's runnable blocks run in order in one temporary directory, so that a summary finds the
sweep the block before it made. A `python -m gradexp.train` command runs at a small scale
(SMALL: the keys not on its command line are added); `<date>/<time>` in a path is the newest
run or sweep directory there. A console block's command runs as written, in its own process
(what it prints is the point); a bash block's `python -m gradexp.train` or `gradexp.summarize`
runs in the test's process, as `python -m` would run it there (`in_process`): TensorFlow is
imported once a page, not once a command, which was most of a command's time.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$")
MARK = re.compile(r"^<!--\s*(not run|file|run in):\s*(.*?)\s*-->$")
RUNNABLE = ("bash", "console", "python")
SMALL = {"trainer.steps": "20", "trainer.log_every": "10", "trainer.eval_every": "20",
         "trainer.histogram_every": "20", "trainer.jit_compile": "false"}
PLACEHOLDER = "<date>/<time>"
# the pages of sweeps, run by tests/test_docs_sweep_examples.py; every other page's examples by
# tests/test_docs_examples.py (two files: pytest-xdist gives each its own process)
SWEEP_PAGES = ("docs/guide/sweeps.md", "docs/guide/search.md", "docs/guide/summarizing.md",
               "docs/guide/tensorboard.md", "docs/guide/resume.md")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, counting from 1
    lang: str
    text: str
    mark: str | None  # "not run", "file", "run in" or None
    value: str  # the reason, the path, the directory

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line} ({self.lang or 'no language'})"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def runnable_pages(sweeps: bool) -> list[Path]:
    """The pages with a block to run: those of sweeps, or all the others."""
    return [page for page in pages()
            if (page.relative_to(REPO).as_posix() in SWEEP_PAGES) == sweeps
            and any(category(b) == "run" for b in blocks(page))]


def run_count(page: Path) -> int:
    """How many commands and scripts the page's runnable blocks hold."""
    return sum(len(commands(b.text)) if b.lang == "bash" else
               len(console(b.text)) if b.lang == "console" else 1
               for b in blocks(page) if category(b) == "run")


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.groups()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        mark = MARK.match(before)
        text = "\n".join(line[len(indent):] for line in lines[i + 1:end])
        out.append(Block(page, i + 1, lang, text, mark and mark.group(1),
                         mark.group(2) if mark else ""))
        i = end + 1
    return out


def category(block: Block) -> str | None:
    """"not run", "file" or "run", or None: a block in no category."""
    if block.mark == "not run":
        return "not run" if block.value else None
    if block.mark == "file":
        return "file" if block.value else None
    if block.lang in RUNNABLE and (block.mark is None or block.lang == "bash"):
        return "run"
    return None


def commands(text: str) -> list[list[str]]:
    """The commands of a bash block: one a line (a trailing backslash continues it), comments
    left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def console(text: str) -> list[tuple[list[str], str]]:
    """(command, expected output) of each `$ command` of a console block."""
    out: list[tuple[list[str], list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            out.append((shlex.split(line[2:]), []))
        elif out:
            out[-1][1].append(line)
    return [(argv, "\n".join(expected).strip()) for argv, expected in out]


def newest(work: Path, arg: str) -> str:
    """`arg` with `<date>/<time>` replaced by the newest directory that matches it."""
    base = arg.split(PLACEHOLDER)[0]
    found = [p for p in (work / base).glob("*/*")
             if p.is_dir() and p.relative_to(work / base).parts[0] != "multirun"]
    assert found, f"{arg}: no run or sweep under {work / base}"
    latest = max(found, key=lambda p: p.stat().st_mtime)
    return arg.replace(base + PLACEHOLDER, str(latest.relative_to(work)))


def python_command(argv: list[str], work: Path, small: bool = True) -> list[str]:
    """A documented `python -m gradexp.<module> ...` command as the test runs it."""
    assert argv[:2] == ["python", "-m"] and argv[2].startswith("gradexp."), (
        f"{shlex.join(argv)}: only `python -m gradexp...` commands are run; mark the block "
        "`<!-- not run: REASON -->`")
    args = [newest(work, a) if PLACEHOLDER in a else a for a in argv[3:]]
    for arg in args:
        assert not re.search(r"<[a-z ]+>", arg), f"{arg}: a placeholder the test cannot fill"
    if argv[2] == "gradexp.train" and small:
        given = {a.lstrip("+").split("=")[0] for a in args}
        args += [f"{k}={v}" for k, v in SMALL.items() if k not in given]
    return [sys.executable, "-m", argv[2], *args]


def run(argv: list[str], work: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(argv, cwd=work, env=env, text=True, capture_output=True, timeout=900)


IN_PROCESS = ("gradexp.train", "gradexp.summarize")  # modules whose main() in_process calls


def shadowed(module: str, work: Path) -> bool:
    """Whether `work` holds a module, a package or a namespace package's directory of
    `module`'s top-level name, which a fresh `python -m` started in `work` would import from
    there."""
    top = work / module.split(".")[0]
    return top.with_suffix(".py").is_file() or top.is_dir()


def in_process(argv: list[str], work: Path) -> int:
    """`python -m <module> <args>` (as `python_command` gives it) run in this process, in `work`:
    its exit status (what it prints goes to pytest's capture). What `python -m` sets up is set
    up (the working directory first on sys.path, sys.argv, no module cached under a name `work`
    holds) and what a run leaves behind is undone after it (the working directory, sys.path, the
    user modules it imported from `work`, Hydra's global state, the root logger's handlers); what
    a run sets for its process (the dtype policy, the seeds, op determinism) every run sets again
    (gradexp.training.devices.prepare_process)."""
    from conftest import hydra_and_logging_undone

    module = importlib.import_module(argv[2])
    for name in [name for name in sys.modules if shadowed(name, work)]:
        del sys.modules[name]  # a module of the same name another test imported from elsewhere
    saved = (os.getcwd(), list(sys.argv), list(sys.path), set(sys.modules), dict(os.environ))
    os.chdir(work)
    sys.path.insert(0, str(work))
    sys.argv = [argv[2], *argv[3:]]
    try:  # what it prints goes to pytest's capture, shown with a failure
        with hydra_and_logging_undone():
            status = module.main() if argv[2] == "gradexp.train" else module.main(argv[3:])
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    finally:
        cwd, sys.argv, sys.path[:], modules, environ = saved
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        for name in set(sys.modules) - modules:  # a page's own models.py is not the next one's
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(work)):
                del sys.modules[name]
    return status or 0


def trains(command: list[str]) -> bool:
    """Whether a gradexp command trains (and so writes a run's summary.json)."""
    return command[2] == "gradexp.train" and not {"--help", "--positions"} & set(command)


def run_page(page: Path, work: Path) -> int:
    """Run every runnable block of `page` in `work`; the number of commands and scripts run."""
    done = 0
    for block in blocks(page):
        kind = category(block)
        assert kind is not None, f"{block}: neither run nor marked"
        if kind == "not run":
            continue
        if kind == "file":
            (work / block.value).parent.mkdir(parents=True, exist_ok=True)
            (work / block.value).write_text(block.text + "\n")
            continue
        if block.mark == "run in":
            shutil.copytree(REPO / block.value, work, dirs_exist_ok=True)
        if block.lang == "python":
            script = work / f"example_{block.line}.py"
            script.write_text(block.text + "\n")
            result = run([sys.executable, script.name], work)
            assert result.returncode == 0, f"{block}:\n{result.stderr[-3000:]}"
            done += 1
        elif block.lang == "console":
            for argv, expected in console(block.text):
                result = run(python_command(argv, work, small=False), work)
                assert (result.stdout + result.stderr).strip() == expected, (
                    f"{block}: {shlex.join(argv)}\n{result.stdout}{result.stderr}")
                done += 1
        else:
            for argv in commands(block.text):
                command = python_command(argv, work)
                if command[2] in IN_PROCESS:
                    began = time.time()
                    status, output = in_process(command, work), "(pytest's capture below)"
                    assert status != 0 or not trains(command) or any(
                        p.stat().st_mtime >= began for p in work.rglob("summary.json")), (
                        f"{block}: {shlex.join(argv)} wrote no run\n{output[-5000:]}")
                else:
                    result = run(command, work)
                    status, output = result.returncode, result.stdout + result.stderr
                assert status == 0, f"{block}: {shlex.join(argv)}\n{output[-5000:]}"
                done += 1
    return done
