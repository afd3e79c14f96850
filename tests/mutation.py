"""Mutation testing of gradexp's modules with mutmut 3 (outside the default test run).

    pip install -e ".[mutation]"
    nice -n 19 python tests/mutation.py                  # every group, cheapest first
    nice -n 19 python tests/mutation.py analysis layers  # some groups
    nice -n 19 python tests/mutation.py --survivors layers               # the not-yet-killed only
    nice -n 19 python tests/mutation.py clipping --only 'gradexp.clipping.zclip.*'  # some mutants

Each group (GROUPS below) is a set of modules and the test files that exercise them. For a group,
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
ELSEWHERE = "## Killed in a subprocess"  # the heading of that file's last section

# group: (modules to mutate, test files that exercise them), cheapest first
GROUPS = {
    "analysis": (["gradexp/analysis/metrics.py", "gradexp/analysis/stats.py"],
                 ["tests/test_analysis_metrics.py", "tests/test_analysis_stats.py",
                  "tests/test_analysis_known.py", "tests/test_analysis_compare.py",
                  "tests/test_analysis_runs.py", "tests/test_analysis_groups.py"]),
    "measures": (["gradexp/measures.py"],
                 ["tests/test_measures.py", "tests/test_analysis_metrics.py",
                  "tests/test_analysis_known.py", "tests/test_analysis_runs.py"]),
    "layers": (["gradexp/layers.py"], ["tests/test_layers.py"]),
    "clipping": (["gradexp/clipping/*.py"], ["tests/test_clipping.py"]),
    "telemetry": (["gradexp/telemetry.py"], ["tests/test_telemetry.py"]),
    # the step's loss-scale branch is reached by two mixed_float16 tests, its divergence
    # handling by two of test_robustness', the pure step alone by test_train's; the engine's
    # distributed branch only in a subprocess (test_devices' mirrored test)
    "step": (["gradexp/step.py"],
             ["tests/test_telemetry.py", "tests/test_by_hand.py",
              # a user's loss (task_loss, check_loss) and model.fit's step (update_metrics,
              # as_row): their in-process tests
              *(f"tests/test_user_model.py::test_{name}" for name in (
                  "any_keras_optimizer_by_name_with_its_arguments",
                  "a_keras_loss_by_name_or_path_and_one_loss_per_example",
                  "the_step_trains_on_the_configured_loss")),
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
                  "the_step_is_xla_compiled_as_trainer_jit_compile_says")),
              "tests/test_devices.py"
              "::test_mixed_precision_trains_and_logs_finite_norms[mixed_float16]",
              "tests/test_devices.py::test_mixed_float16_layer_statistics_are_in_true_units",
              "tests/test_robustness.py::test_a_diverging_run_stops_at_its_step_and_is_a_result",
              "tests/test_robustness.py::test_on_divergence_continue_skips_non_finite_updates"]),
    # past the core: the trainer, its run directory, logs, data, models, the analysis, the
    # search, the config and the batched launcher. Most of their tests run gradexp in a
    # subprocess (`python -m gradexp.train`), which mutmut cannot follow: the in-process tests
    # are listed (test ids where a file is mostly subprocesses); a survivor that a subprocess
    # test kills goes in tests/mutation_equivalents.md's last section, checked by hand
    "train": (["gradexp/train.py", "gradexp/checkpoint_fallback.py"],
              [*(f"tests/test_train.py::test_{name}" for name in (
                  "clip_fraction_of_one_element_and_of_none",
                  "unclipped_run_has_equal_pre_and_post_norms",
                  "success_criterion_of_pascanu_et_al",
                  "the_step_is_xla_compiled_as_trainer_jit_compile_says",
                  "the_pure_step_is_the_engines_compiled_step",
                  "gradient_histograms_are_tensorboards_own_buckets")),
               *(f"tests/test_robustness.py::test_{name}" for name in (
                   "a_diverging_run_stops_at_its_step_and_is_a_result",
                   "divergence_is_measured_against_the_runs_first_loss",
                   "after_a_resume_divergence_is_measured_against_step_1s_loss",
                   "on_divergence_continue_skips_non_finite_updates")),
               *(f"tests/test_batched.py::test_{name}" for name in (
                   "runs_of_a_batch_stop_at_their_own_divergence",
                   "runs_of_other_bounds_and_learning_rates_share_one_batch")),
               "tests/test_faults.py::test_a_run_asked_to_restart_when_every_checkpoint_is_"
               "damaged_starts_over"]),
    "rundir": (["gradexp/rundir.py", "gradexp/runlock.py"],
               ["tests/test_robustness.py::test_resume_refuses_a_run_whose_process_is_still_going",
                "tests/test_robustness.py::test_a_taken_run_directory_is_never_reused",
                "tests/test_sweep_resume.py::test_a_job_refuses_a_run_of_another_config_or_a_"
                "live_run_in_its_directory",
                "tests/test_faults.py::test_a_run_asked_to_restart_when_every_checkpoint_is_"
                "damaged_starts_over",
                "tests/test_faults.py::test_the_lock_is_held_while_a_run_trains_and_let_go_when_"
                "it_ends",
                "tests/test_analysis_runs.py", "tests/test_summarize.py"]),
    "resume": (["gradexp/resume.py"], ["tests/test_sweep_resume.py"]),
    "data": (["gradexp/data.py"], ["tests/test_data.py", "tests/test_user_data.py"]),
    "logs": (["gradexp/logs.py", "gradexp/write_errors.py"],
             ["tests/test_robustness.py::test_a_resumed_run_reads_back_the_float32_numbers_it_"
              "wrote",
              "tests/test_train.py::test_gradient_histograms_are_tensorboards_own_buckets",
              "tests/test_train.py::test_unclipped_run_has_equal_pre_and_post_norms",
              "tests/test_sweeps.py::test_an_hparam_has_one_type_in_every_run_whichever_method_"
              "the_run_uses",
              "tests/test_faults.py::test_a_table_on_a_full_device_fails_in_one_line_and_the_"
              "next_run_writes",
              "tests/test_faults.py::test_only_a_write_that_failed_is_called_one",
              "tests/test_faults.py::test_a_run_asked_to_restart_when_every_checkpoint_is_"
              "damaged_starts_over"]),
    "models": (["gradexp/models.py"],
               ["tests/test_models.py", "tests/test_mnist1d_models.py", "tests/test_by_hand.py"]),
    "compare": (["gradexp/analysis/compare.py", "gradexp/analysis/runs.py"],
                ["tests/test_analysis_compare.py", "tests/test_analysis_runs.py",
                 "tests/test_analysis_known.py", "tests/test_analysis_groups.py",
                 "tests/test_summarize.py"]),
    "summarize": (["gradexp/summarize.py"],
                  ["tests/test_summarize.py", "tests/test_analysis_known.py",
                   "tests/test_analysis_groups.py"]),
    "search": (["gradexp/search/*.py"], ["tests/test_search.py"]),
    "config": (["gradexp/config/*.py"],
               ["tests/test_config.py", "tests/test_registries.py", "tests/test_api.py",
                "tests/test_faults.py::test_every_launcher_and_sweeper_key_is_checked_in_one_line",
                "tests/test_faults.py::test_each_plugins_defaults_pass_and_each_of_its_keys_has_"
                "a_rule",
                "tests/test_models.py::test_bad_model_and_dataset_values_are_one_line",
                *(f"tests/test_user_data.py::test_{name}" for name in (
                    "bad_arrays_are_one_line_naming_what_is_wrong",
                    "keys_a_loader_does_not_take_and_a_missing_load_are_one_line",
                    "tfds_without_a_name_or_a_directory_is_one_line"))]),
    "engine": (["gradexp/engine.py"],
               ["tests/test_train.py::test_the_pure_step_is_the_engines_compiled_step",
                *(f"tests/test_batched.py::test_{name}" for name in (
                    "runs_of_a_batch_stop_at_their_own_divergence",
                    "a_batch_of_transformers_is_its_runs_bit_for_bit_histograms_too",
                    "runs_of_other_bounds_and_learning_rates_share_one_batch",
                    "the_stateless_update_is_kerass_update",
                    "a_batch_on_a_cpu_has_a_part_per_core_and_on_a_gpu_one",
                    "the_program_compiled_ahead_is_the_one_that_trains",
                    "a_batch_of_cnns_is_its_runs_bit_for_bit"))]),
    "launcher": (["hydra_plugins/gradexp_launcher/gradexp_launcher.py", "gradexp/worker.py"],
                 [*(f"tests/test_batched.py::test_{name}" for name in (
                     "the_launcher_groups_by_structure_splits_at_max_batch_and_for_its_workers",
                     "the_command_line_that_names_the_launcher_forks_its_workers_before_hydra_"
                     "starts")),
                  "tests/test_sweeps.py::test_a_users_callback_sees_each_finished_run_at_its_jobs_"
                  "end"]),
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
also_copy = {toml_list([d for d in ("conf", "hydra_plugins") if d not in sources])}
# -n 0: in one process, where mutmut's hooks are
pytest_add_cli_args = ["-p", "no:cacheprovider", "-W", "ignore", "-n", "0"]
pytest_add_cli_args_test_selection = {toml_list(tests)}
process_isolation = "forkserver"
use_git_change_detection = false
timeout_constant = 20.0
"""


def prepare(group: str) -> Path:
    """A fresh scratch copy of the checkout for `group`, its pyproject.toml configuring mutmut."""
    modules, tests = GROUPS[group]
    work = REPO / ".mutmut" / group
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in ("gradexp", "tests", "conf", "hydra_plugins"):
        shutil.copytree(REPO / name, work / name, ignore=ignore)
    tests = [t for t in tests if (REPO / t.split("::")[0]).exists()]  # files or test ids
    pyproject = (REPO / "pyproject.toml").read_text() + mutmut_section(modules, tests)
    (work / "pyproject.toml").write_text(pyproject)
    return work


def refresh(group: str) -> Path:
    """The group's scratch copy as it is, its tests (and conf) replaced by the checkout's."""
    work = REPO / ".mutmut" / group
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in ("tests", "conf"):
        shutil.copytree(REPO / name, work / name, ignore=ignore, dirs_exist_ok=True)
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
            m = re.match(r"\|\s*`(gradexp\.[^`]+__mutmut_\d+)`\s*\|(.*)\|\s*$", line)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("groups", nargs="*",
                        help=f"the groups to run (default: all): {', '.join(GROUPS)}")
    parser.add_argument("--survivors", action="store_true",
                        help="test again only the mutants the last run of each group did not "
                             "kill (but the listed equivalents), with the checkout's tests")
    parser.add_argument("--only", nargs="+", metavar="PATTERN",
                        help="test only the mutants whose names match one of these fnmatch "
                             "patterns (e.g. 'gradexp.clipping.zclip.*'), the others left as "
                             "they were: not checked in a fresh scratch copy, or as the last "
                             "run left them with --survivors")
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
        work = refresh(group) if again else prepare(group)
        # the listed equivalents survive every run: testing them again only costs time
        listed = {**equivalents(), **equivalents("elsewhere")}
        names = [n for n in not_killed(work) if n not in listed] if again else []
        if args.only:
            if again:
                names = [n for n in names if any(fnmatch(n, p) for p in args.only)]
                if not names:  # every matching mutant is killed or equivalent: nothing to run
                    everything += summarize(group, work, 0.0)
                    continue
            else:
                names = list(args.only)
        start = time.monotonic()
        if not again or names:
            subprocess.run([mutmut, "run", "--max-children", str(args.max_children), *names],
                           cwd=work, check=False)
        everything += summarize(group, work, time.monotonic() - start)
    killed = sum(r.get("killed", 0) + r["in_subprocess"] for r in everything)
    scored = sum(r["scored"] for r in everything)
    unchecked = sum(r.get("not checked", 0) for r in everything)
    if scored:
        print(f"\nall: {killed} killed of {scored} (equivalents excluded"
              f"{f'; {unchecked} not checked' if unchecked else ''}): {killed / scored:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
