"""Mutation testing of gradexp's modules with mutmut 3 (outside the default test run).

    pip install -e ".[mutation]"
    nice -n 19 python tests/mutation.py                  # every group, cheapest first
    nice -n 19 python tests/mutation.py analysis layers  # some groups
    nice -n 19 python tests/mutation.py --survivors layers               # the not-yet-killed only
    nice -n 19 python tests/mutation.py clipping --only 'gradexp.parts.clipping.zclip.*'

Each group (GROUPS below) is a set of modules and the test files that exercise them (the groups
past the core: the tests of their files that start no process, `in_process`). For a group,
a scratch copy of the checkout is made in `.mutmut/<group>/` (git-ignored) with the group's
`[tool.mutmut]` section added to its pyproject.toml, and `mutmut run` runs there: mutmut writes
each module's mutants into `.mutmut/<group>/mutants/`, records which tests reach each function,
and runs only those tests (with -x) against each mutant. Workers are forked from a fork server
that has imported the tests but not started TensorFlow's runtime (TensorFlow does not survive a
fork after it has run an op).

The summary per module is mutmut's count of killed, survived, timeout and no-tests mutants, and
the score killed / (tested − equivalent), with the equivalent mutants (survivors that no test can
tell from the original: same behaviour) read from tests/mutation_equivalents.md, each with its
reason. A survivor that a test of the default run kills in a subprocess (`python -m
gradexp.train`, the mirrored strategy's two logical CPUs), where mutmut cannot see which tests
reach a function, is counted as killed when that file's last section lists it with the test,
each checked by hand (the mutant applied to the checkout, the test run: it fails).
`cd .mutmut/<group> && mutmut show <name>` prints a mutant's diff; `mutmut results` lists the
survivors.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import time
from fnmatch import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EQUIVALENTS = REPO / "tests" / "mutation_equivalents.md"
RECORD = REPO / "docs" / "mutation.json"  # --record: the scores docs/reference/mutation.md shows
CORE = ("analysis", "measures", "layers", "clipping", "telemetry", "step")  # target 95 %, else 90
ELSEWHERE = "## Killed in a subprocess"  # the heading of that file's last section

# what in a test's code starts a process that imports gradexp anew: these names (conftest's
# gradexp() runs `python -m ...`), sys.executable. A process forked from the test's (the batched
# launcher's workers: gradexp.sweeps.worker.fork) imports nothing anew and runs the mutant its
# parent runs (mutmut names it in the environment the child inherits): its tests stay in.
STARTS_A_PROCESS = {"subprocess", "Popen", "gradexp", "multiprocessing", "executable"}


def _starts_a_process(function: ast.FunctionDef) -> bool:
    return any((isinstance(n, ast.Name) and n.id in STARTS_A_PROCESS)
               or (isinstance(n, ast.Attribute) and n.attr in STARTS_A_PROCESS)
               for n in ast.walk(function))


def in_process(*files: str) -> list[str]:
    """The test ids of `files` whose tests start no process. mutmut sees only its own process,
    and a subprocess that imports a mutated module fails while mutmut collects which tests
    reach which function (its trampoline looks for mutmut's config in the subprocess's working
    directory). A test starts one if its code, or that of a function or fixture of its file it
    names (or imports from another test file), names one of STARTS_A_PROCESS. A file whose
    tests all start none is given whole: a test added to it then changes no group's selection
    (a changed selection makes mutmut forget every verdict of the group)."""
    return [test for file in files for test in _in_process(file)]


def _in_process(file: str) -> list[str]:
    source = (REPO / file).read_text()
    functions = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    starting = set()
    for node in ast.parse(source).body:  # helpers imported from another test file
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("test_"):
            other = (REPO / "tests" / f"{node.module}.py").read_text()
            defined = {n.name: n for n in ast.parse(other).body if isinstance(n, ast.FunctionDef)}
            starting |= {a.asname or a.name for a in node.names
                         if a.name in defined and _starts_a_process(defined[a.name])}

    def starts(name: str, seen: frozenset = frozenset()) -> bool:
        if name in starting:
            return True
        if name not in functions or name in seen:
            return False
        function = functions[name]
        if _starts_a_process(function):
            return True
        arguments = function.args
        own = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
        own |= {n.id for n in ast.walk(function)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        own |= {n.name for n in ast.walk(function) if n is not function  # its own helpers
                and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        loaded = {n.id for n in ast.walk(function)
                  if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        takes_fixtures = name.startswith("test_") or any(
            "fixture" in ast.unparse(d) for d in function.decorator_list)
        fixtures = {a.arg for a in arguments.args} if takes_fixtures else set()
        return any(starts(n, seen | {name}) for n in ((loaded - own) | fixtures) - {name})

    tests = [name for name in functions if name.startswith("test_")]
    kept = [name for name in tests if not starts(name)]
    return [file] if kept == tests else [f"{file}::{name}" for name in kept]


# group: (modules to mutate, test files or ids that exercise them), cheapest first
GROUPS = {
    "analysis": (["gradexp/analysis/metrics.py", "gradexp/analysis/stats.py"],
                 ["tests/test_analysis_metrics.py", "tests/test_analysis_stats.py",
                  "tests/test_analysis_known.py", "tests/test_analysis_compare.py",
                  "tests/test_analysis_runs.py", "tests/test_analysis_groups.py"]),
    "measures": (["gradexp/runs/measures.py"],
                 ["tests/test_measures.py", "tests/test_analysis_metrics.py",
                  "tests/test_analysis_known.py", "tests/test_analysis_runs.py"]),
    "layers": (["gradexp/parts/layers.py"], ["tests/test_layers.py"]),
    "clipping": (["gradexp/parts/clipping/*.py"], ["tests/test_clipping.py"]),
    "telemetry": (["gradexp/training/telemetry.py"], ["tests/test_telemetry.py"]),
    # the step's loss-scale branch is reached by two mixed_float16 tests, its divergence
    # handling by two of test_robustness', the pure step alone by test_train's; the engine's
    # distributed branch only in a subprocess (test_devices' mirrored test)
    "step": (["gradexp/training/step.py"],
             ["tests/test_telemetry.py", "tests/test_by_hand.py",
              # a user's loss (task_loss, check_loss) and model.fit's step (update_metrics,
              # as_row): their in-process tests
              *(f"tests/test_user_model.py::test_{name}" for name in (
                  "any_keras_optimizer_by_name_with_its_arguments",
                  "a_keras_loss_by_name_or_path_and_one_loss_per_example",
                  "the_step_trains_on_the_configured_loss",
                  "the_step_trains_in_training_mode_and_evaluates_in_inference_mode")),
              *(f"tests/test_keras_fit.py::test_{name}" for name in (
                  "a_fit_step_logs_what_gradexp_own_step_measures_on_the_same_weights_and_batch",
                  "a_clip_layer_inside_the_recurrence_adds_up_over_the_time_steps",
                  "a_model_without_clip_layers_logs_the_global_measurements")),
              # test_train's in-process tests (its others run `python -m gradexp.train`, whose
              # calls mutmut cannot see, and one asks git for the commit: the scratch copy has none)
              *(f"tests/test_train.py::test_{name}" for name in (
                  "clip_fraction_of_one_element_and_of_none",
                  "unclipped_run_has_equal_pre_and_post_norms",
                  "the_error_rate_counts_sequences_whose_squared_error_exceeds_the_threshold",
                  "the_step_refuses_a_model_that_cannot_take_the_datasets_examples",
                  "the_pure_step_is_the_engines_compiled_step",
                  "the_evaluation_is_the_models_mean_loss_and_accuracy_by_hand",
                  "the_evaluations_error_rate_counts_every_batch_by_hand",
                  "the_step_is_xla_compiled_as_trainer_jit_compile_says")),
              "tests/test_devices.py"
              "::test_mixed_precision_trains_and_logs_finite_norms[mixed_float16]",
              "tests/test_devices.py::test_mixed_float16_layer_statistics_are_in_true_units",
              "tests/test_devices.py::test_the_loss_scale_a_step_uses_is_its_state_within_a_call",
              "tests/test_robustness.py::test_a_diverging_run_stops_at_its_step_and_is_a_result",
              "tests/test_robustness.py::test_on_divergence_continue_skips_non_finite_updates"]),
    # past the core: the trainer, its run directory, logs, data, models, the analysis, the
    # search, the config and the batched launcher, each with the tests of its files that run
    # in this process (`in_process`)
    "train": (["gradexp/train.py", "gradexp/training/checkpoint_fallback.py"],
              in_process("tests/test_train.py", "tests/test_robustness.py",
                         "tests/test_batched.py", "tests/test_faults.py",
                         "tests/test_sweep_resume.py", "tests/test_search.py",
                         "tests/test_api.py", "tests/test_test_split.py")),
    "rundir": (["gradexp/runs/rundir.py", "gradexp/runs/runlock.py"],
               in_process("tests/test_rundir.py", "tests/test_robustness.py",
                          "tests/test_sweep_resume.py",
                          "tests/test_faults.py", "tests/test_analysis_runs.py",
                          "tests/test_summarize.py")),
    "resume": (["gradexp/sweeps/resume.py"], in_process("tests/test_sweep_resume.py")),
    "data": (["gradexp/parts/data.py"],
             in_process("tests/test_data.py", "tests/test_user_data.py")),
    "logs": (["gradexp/training/logs.py", "gradexp/runs/write_errors.py"],
             in_process("tests/test_logs.py", "tests/test_train.py", "tests/test_robustness.py",
                        "tests/test_faults.py",
                        "tests/test_sweeps.py", "tests/test_sweep_resume.py")),
    "models": (["gradexp/parts/models.py"],  # (test_mnist1d_models needs experiments/: not copied)
               in_process("tests/test_models.py", "tests/test_by_hand.py",
                          "tests/test_user_model.py")),
    "compare": (["gradexp/analysis/compare.py", "gradexp/analysis/runs.py"],
                in_process("tests/test_analysis_compare.py", "tests/test_analysis_runs.py",
                           "tests/test_analysis_known.py", "tests/test_analysis_groups.py",
                           "tests/test_summarize.py")),
    "summarize": (["gradexp/summarize.py"],
                  [*in_process("tests/test_summarize.py", "tests/test_analysis_known.py",
                               "tests/test_analysis_groups.py"),  # and its --help, on a page:
                   "tests/test_docs.py::test_the_generated_pages_are_what_the_code_gives_today"]),
    "search": (["gradexp/sweeps/search/*.py"],
               in_process("tests/test_search.py", "tests/test_search_space.py")),
    "config": (["gradexp/config/*.py"],
               in_process("tests/test_config_checks.py", "tests/test_config.py",
                          "tests/test_registries.py", "tests/test_api.py",
                          "tests/test_faults.py", "tests/test_models.py",
                          "tests/test_user_data.py", "tests/test_sweep_resume.py",
                          "tests/test_search.py")),
    "engine": (["gradexp/training/engine.py"],  # its mirrored branch: test_devices' subprocess
               in_process("tests/test_batched.py", "tests/test_train.py",
                          "tests/test_robustness.py", "tests/test_devices.py")),
    "launcher": (["hydra_plugins/gradexp_launcher/gradexp_launcher.py", "gradexp/sweeps/worker.py"],
                 in_process("tests/test_batched.py", "tests/test_sweeps.py",
                            "tests/test_worker.py")),
}

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests",
          34: "skipped", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout",
          255: "timeout", -11: "segfault", -9: "segfault", None: "not checked"}


def mutmut_section(modules: list[str], tests: list[str]) -> str:
    def toml_list(items):
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    sources = sorted({"gradexp", *(m.split("/")[0] for m in modules)})  # hydra_plugins too
    return f"""
[tool.mutmut]
source_paths = {toml_list(sources)}
only_mutate = {toml_list(modules)}
also_copy = {toml_list([d for d in ("conf", "docs", "hydra_plugins") if d not in sources])}
# -n 0: in one process, where mutmut's hooks are
pytest_add_cli_args = ["-p", "no:cacheprovider", "-W", "ignore", "-n", "0"]
pytest_add_cli_args_test_selection = {toml_list(tests)}
process_isolation = "forkserver"
use_git_change_detection = false
timeout_constant = 20.0
"""


def prepare(group: str) -> Path:
    """A fresh scratch copy of the checkout for `group`, its pyproject.toml configuring mutmut."""
    work = REPO / ".mutmut" / group
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    copy(work, "gradexp", "tests", "conf", "hydra_plugins", "docs")
    return configure(group, work)


def refresh(group: str) -> tuple[Path, bool]:
    """The group's scratch copy as it is, its code, tests, conf and test selection the
    checkout's; whether the selection changed (a test added to the group: mutmut then forgets
    every verdict, and every mutant must be tested again). mutmut keeps the verdicts of each
    function whose code is unchanged and forgets those of a changed one: its mutants show as
    not checked after this run, and the next `--survivors` run tests them."""
    work = REPO / ".mutmut" / group
    before = (work / "pyproject.toml").read_text()
    copy(work, "gradexp", "hydra_plugins", "tests", "conf", "docs")
    return configure(group, work), (work / "pyproject.toml").read_text() != before


def copy(work: Path, *names: str) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in names:
        shutil.copytree(REPO / name, work / name, ignore=ignore, dirs_exist_ok=True)


def configure(group: str, work: Path) -> Path:
    """The checkout's pyproject.toml with the group's `[tool.mutmut]` section, into `work`."""
    modules, tests = GROUPS[group]
    tests = [t for t in tests if (REPO / t.split("::")[0]).exists()]  # files or test ids
    pyproject = (REPO / "pyproject.toml").read_text() + mutmut_section(modules, tests)
    (work / "pyproject.toml").write_text(pyproject)
    return work


def not_killed(work: Path) -> list[str]:
    """The mutants of the last run that no test killed."""
    names = []
    for meta in (work / "mutants").rglob("*.py.meta"):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        names += [n for n, c in codes.items() if STATUS.get(c, "suspicious") != "killed"]
    return sorted(names)


def equivalents(section: str = "equivalent") -> dict[str, str]:
    """{mutant name: reason} from the tables of tests/mutation_equivalents.md: the equivalent
    mutants, or (section="elsewhere") those its last section lists as killed by a test that
    runs gradexp in a subprocess, out of mutmut's sight (each checked by hand)."""
    found: dict[str, dict[str, str]] = {"equivalent": {}, "elsewhere": {}}
    into = found["equivalent"]
    if EQUIVALENTS.exists():
        for line in EQUIVALENTS.read_text().splitlines():
            if line.startswith("## "):
                into = found["elsewhere" if line.startswith(ELSEWHERE) else "equivalent"]
            m = re.match(r"\|\s*`((?:gradexp|hydra_plugins)\.[^`]+__mutmut_\d+)`\s*\|(.*)\|\s*$",
                         line)
            if m:
                into[m.group(1)] = m.group(2).strip()
    return found[section]


def summarize(group: str, work: Path, seconds: float) -> list[dict]:
    """One row per module: mutmut's counts and the score without the listed equivalents, the
    mutants listed as killed in a subprocess counted as killed."""
    known, elsewhere = equivalents(), equivalents("elsewhere")
    rows = []
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        module = meta.relative_to(work / "mutants").as_posix().removesuffix(".meta")
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        counts: dict[str, int] = {}
        survivors = []
        for name, code in sorted(codes.items()):
            status = STATUS.get(code, "suspicious")
            counts[status] = counts.get(status, 0) + 1
            if status != "killed":
                survivors.append((name, status))
        equivalent = [n for n, s in survivors if s == "survived" and n in known]
        in_subprocess = [n for n, s in survivors if s == "survived" and n in elsewhere]
        stale = [n for n, c in codes.items()
                 if (n in known or n in elsewhere) and STATUS.get(c) == "killed"]
        total, killed = len(codes), counts.get("killed", 0) + len(in_subprocess)
        scored = total - len(equivalent) - counts.get("not checked", 0)  # of the tested ones
        rows.append({"module": module, "total": total, **counts,
                     "equivalent": len(equivalent), "in_subprocess": len(in_subprocess),
                     "scored": scored, "score": killed / scored if scored else float("nan"),
                     "not_killed": [f"{n} ({s})" for n, s in survivors
                                    if n not in equivalent and n not in in_subprocess],
                     "stale": stale})
    print(f"\n== {group}: {seconds / 60:.1f} min")
    for r in rows:
        counts = ", ".join(f"{k} {r[k]}" for k in ("killed", "survived", "timeout", "no tests",
                                                    "segfault", "suspicious", "not checked")
                           if r.get(k))
        of = f" of the {r['total'] - r['not checked']} tested" if r.get("not checked") else ""
        score = f"score {r['score']:.1%}{of}" if r["scored"] else "none tested"
        by_hand = (f"; killed in a subprocess test (by hand) {r['in_subprocess']}"
                   if r["in_subprocess"] else "")
        print(f"{r['module']}: {r['total']} mutants: {counts}; equivalent {r['equivalent']}"
              f"{by_hand}; {score}")
        for name in r["not_killed"]:
            print(f"    not killed: {name}")
        for name in r["stale"]:
            print(f"    killed, but listed in {EQUIVALENTS.name}: {name}")
    return rows


def head() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          capture_output=True, text=True).stdout.strip()


def record(group: str, rows: list[dict], commit: str) -> None:
    """The group's counts into RECORD, with the commit (its tests, when the group's run began)
    and day they were measured at."""
    known = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    keys = ("module", "total", "killed", "survived", "timeout", "no tests", "not checked",
            "equivalent", "in_subprocess", "scored", "score")
    known[group] = {"commit": commit, "day": time.strftime("%Y-%m-%d"),
                    "target": 0.95 if group in CORE else 0.90,
                    "modules": [{k: r.get(k, 0) for k in keys} for r in rows]}
    RECORD.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("groups", nargs="*",
                        help=f"the groups to run (default: all): {', '.join(GROUPS)}")
    parser.add_argument("--survivors", action="store_true",
                        help="test again only the mutants the last run of each group did not "
                             "kill (but the listed equivalents), with the checkout's code and "
                             "tests; a function changed since is tested by the next such run")
    parser.add_argument("--only", nargs="+", metavar="PATTERN",
                        help="test only the mutants whose names match one of these fnmatch "
                             "patterns (e.g. 'gradexp.parts.clipping.zclip.*'), the others left as "
                             "they were: not checked in a fresh scratch copy, or as the last "
                             "run left them with --survivors")
    parser.add_argument("--record", action="store_true",
                        help=f"write each group's counts into {RECORD.relative_to(REPO)} (the "
                             "documentation's table: python -m gradexp.docs_gen)")
    parser.add_argument("--max-children", type=int, default=1,
                        help="mutants tested at once (default 1: the machine is shared)")
    args = parser.parse_args(argv)
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}: choose from {', '.join(GROUPS)}")
    mutmut = shutil.which("mutmut") or str(Path(sys.executable).with_name("mutmut"))
    everything = []
    for group in args.groups or list(GROUPS):
        again = args.survivors and (REPO / ".mutmut" / group / "mutants").exists()
        commit = head()  # the scratch copy is the checkout as it is now
        work, selection_changed = refresh(group) if again else (prepare(group), False)
        if selection_changed:
            print(f"{group}: its tests changed since its last run: every mutant is tested again")
            again = False
        # the listed equivalents survive every run: testing them again only costs time
        listed = {**equivalents(), **equivalents("elsewhere")}
        names = [n for n in not_killed(work) if n not in listed] if again else []
        if args.only:
            if again:
                # none left (every match killed or equivalent): nothing runs, the counts stand
                names = [n for n in names if any(fnmatch(n, p) for p in args.only)]
            else:
                names = list(args.only)
        start = time.monotonic()
        if not again or names:
            subprocess.run([mutmut, "run", "--max-children", str(args.max_children), *names],
                           cwd=work, check=False)
        rows = summarize(group, work, time.monotonic() - start)
        everything += rows
        if args.record:
            record(group, rows, commit)
    killed = sum(r.get("killed", 0) + r["in_subprocess"] for r in everything)
    scored = sum(r["scored"] for r in everything)
    unchecked = sum(r.get("not checked", 0) for r in everything)
    if scored:
        print(f"\nall: {killed} killed of {scored} (equivalents excluded"
              f"{f'; {unchecked} not checked' if unchecked else ''}): {killed / scored:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
