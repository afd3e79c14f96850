"""The settings of the sweep's launcher and sweeper (`hydra.launcher.*`, `hydra.sweeper.*`),
checked up front like the run's own: one line naming the key and what it takes, exit 2, before
any process, cluster or worker starts (gradexp.sweeps.callbacks.PluginChecks, the first callback).

Hydra has checked their keys and types against each plugin's schema when it composed the config
(a flag, a list of shell lines, a mapping passed on as it is need nothing more); here are their
values, for every launcher and sweeper gradexp ships or supports, found by their
`_target_`:

    launchers   basic (no settings), gradexp (hydra_plugins/gradexp_launcher), ray
                (hydra_plugins/gradexp_ray_launcher), joblib, submitit_local, submitit_slurm
                and gradexp's slurm (conf/hydra/launcher/slurm.yaml)
    sweepers    basic, gradexp_resume, optuna (gradexp's search: its sampler's seed here, the
                rest with its search space, gradexp/sweeps/search/space.py)

A plugin gradexp does not know (a user's own) is left to itself.

`check_machine`, after them: what the chosen launcher needs of this machine, which no value
shows: Slurm's commands on PATH (`hydra/launcher=slurm`), and on a Ray runtime started here,
CPUs and GPUs for what one job asks (Ray would wait forever for a node that has them).

Nothing here imports TensorFlow; Ray is imported only to check `hydra.launcher.init` against
ray.init's arguments, and to count this machine's CPUs and GPUs as Ray does.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from gradexp.config.base import ConfigError, need, show

# (does the value pass, what the key takes: a text, or a function that writes it)
Rule = tuple[Callable[[Any], bool], str | Callable[[], str]]

LAUNCHER = "hydra_plugins.gradexp_launcher.gradexp_launcher.GradexpLauncher"
RAY = "hydra_plugins.gradexp_ray_launcher.ray_launcher.RayLauncher"
JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
SUBMITIT_LOCAL = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"
SLURM = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
RESUME_SWEEPER = "hydra_plugins.gradexp_resume.resume_sweeper.ResumeSweeper"
SEARCH_SWEEPER = "hydra_plugins.gradexp_search.search_sweeper.SearchSweeper"


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def count(minimum: int, note: str = "") -> Rule:
    return (lambda v: _integer(v) and v >= minimum, f"must be an integer >= {minimum}{note}")


def amount(note: str = "") -> Rule:
    """A non-negative number (Ray's resources: fractions allowed)."""
    return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and v >= 0, f"must be a number >= 0{note}")


def positive(note: str = "") -> Rule:
    return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and v > 0, f"must be a positive number{note}")


def optional(rule: Rule, meaning: str) -> Rule:
    ok, allowed = rule
    return (lambda v: v is None or ok(v), f"{allowed}, or null ({meaning})")


def text(what: str) -> Rule:
    return (lambda v: isinstance(v, str) and v.strip() != "", f"must be {what}")


def word(what: str) -> Rule:
    """A name without spaces (Slurm's partition, account, ...; several: comma-separated)."""
    return (lambda v: isinstance(v, str) and re.fullmatch(r"[^\s,]+(,[^\s,]+)*", v) is not None,
            f"must be {what}")


def one_of(*values: Any) -> Rule:
    return (lambda v: v in values, f"must be one of {', '.join(map(_show, values))}")


def _show(value: Any) -> str:
    return "null" if value is None else str(value)


def _ray_address(value: Any) -> bool:
    return value is None or value in ("auto", "local") or (
        isinstance(value, str)
        and re.fullmatch(r"(ray://)?[^\s:/]+:(\d{1,5})", value) is not None
        and 0 < int(value.rsplit(":", 1)[1]) < 65536)


def _joblib_backends() -> tuple:
    from joblib.parallel import BACKENDS

    return (None, *sorted(BACKENDS))


def _bytes(value: Any) -> bool:
    from joblib.disk import memstr_to_bytes

    try:
        return value is None or memstr_to_bytes(value) > 0
    except (ValueError, TypeError):
        return False


SLURM_MEMORY = r"\d+[KMGT]?"  # sbatch's --mem-per-cpu: a size in megabytes, or with a unit
SUBMITIT = {  # the keys of both submitit launchers
    "submitit_folder": text("a directory path (%j: the job id)"),
    "timeout_min": count(1, " (the job's time limit, in minutes)"),
    "cpus_per_task": optional(count(1), "the scheduler's default"),
    "gpus_per_node": optional(count(0), "the scheduler's default"),
    "tasks_per_node": count(1),
    "mem_gb": optional(count(0, " (0: all of a node's memory)"), "the scheduler's default"),
    "nodes": count(1),
    "name": text("a job name"),
}

LAUNCHERS: dict[str, dict[str, Rule]] = {
    LAUNCHER: {"max_batch": count(1, " (runs trained together at most)"),
               "workers": count(1, " (batches trained at once, each in its own process)")},
    RAY: {"address": (_ray_address, "must be null (a local Ray), auto, host:port or "
                                     "ray://host:port"),
          "num_cpus": amount(" (CPUs reserved per job)"),
          "num_gpus": amount(" (GPUs reserved per job; 0: CPU runs)"),
          "max_calls": count(0, " (jobs per worker process; 0: no limit)")},
    JOBLIB: {"backend": ((lambda v: v in _joblib_backends()),
                         lambda: f"must be one of {', '.join(map(_show, _joblib_backends()))}"),
             "n_jobs": ((lambda v: _integer(v) and v != 0),
                        "must be a positive integer, or -1 for every CPU (-2: all but one, ...)"),
             "prefer": one_of("processes", "threads"),
             "require": one_of(None, "sharedmem"),
             "verbose": count(0),
             "timeout": optional(positive(" (seconds a job may take)"), "no limit"),
             "pre_dispatch": ((lambda v: isinstance(v, str) and re.fullmatch(
                 r"all|\d*[1-9]\d*|(\d+\s*\*\s*)?n_jobs", v.strip()) is not None),
                 "must be all, a positive integer, or an expression such as 2*n_jobs"),
             "batch_size": ((lambda v: isinstance(v, str) and (
                 v == "auto" or re.fullmatch(r"\d*[1-9]\d*", v) is not None)),
                 "must be auto or a positive integer"),
             "temp_folder": optional(text("a directory path"), "the system's"),
             "max_nbytes": (_bytes, "must be a size such as 1M (K, M, G), or null (no "
                                    "memmapping)"),
             "mmap_mode": one_of("r+", "r", "w+", "c")},
    SUBMITIT_LOCAL: SUBMITIT,
    SLURM: {**SUBMITIT,
            "partition": optional(word("a partition name (sinfo lists them; several: "
                                       "comma-separated)"), "the cluster's default"),
            "qos": optional(word("a QOS name"), "the default"),
            "account": optional(word("an account name"), "the default"),
            "comment": optional(text("a comment"), "none"),
            "constraint": optional(text("a feature constraint"), "none"),
            "exclude": optional(word("node names (comma-separated)"), "none"),
            "gres": optional(word("a generic resource such as gpu:2"), "none"),
            "cpus_per_gpu": optional(count(1), "the default"),
            "gpus_per_task": optional(count(1), "the default"),
            "mem_per_gpu": optional(((lambda v: re.fullmatch(SLURM_MEMORY, str(v)) is not None),
                                     "must be a size such as 16G"), "the default"),
            "mem_per_cpu": optional(((lambda v: re.fullmatch(SLURM_MEMORY, str(v)) is not None),
                                     "must be a size such as 4G"), "the default"),
            "signal_delay_s": count(0, " (seconds before the time limit that the job is "
                                       "warned)"),
            "max_num_timeout": count(0, " (requeues after a time-out)"),
            "array_parallelism": count(1, " (jobs at once)")},
}

SWEEPERS: dict[str, dict[str, Rule]] = {
    BASIC_SWEEPER: {"max_batch_size": optional(count(1, " (jobs launched at once)"),
                                               "every job at once")},
    RESUME_SWEEPER: {"max_batch_size": optional(count(1, " (jobs launched at once)"),
                                                "every job at once")},
    SEARCH_SWEEPER: {"sampler_seed": optional(
        ((lambda v: _integer(v) and 0 <= v <= 2**32 - 1), "must be an integer in [0, 2**32 - 1]"),
        "a new sequence every time")},
}


def check_plugins(config: DictConfig) -> None:
    """Raise ConfigError (one line) for the first bad value of `hydra.launcher` and
    `hydra.sweeper`, by the rules of their plugin (none for a plugin gradexp does not know)."""
    for node in ("launcher", "sweeper"):
        settings = OmegaConf.select(config, f"hydra.{node}")
        if not isinstance(settings, DictConfig):
            continue
        target = settings.get("_target_")
        rules = (LAUNCHERS if node == "launcher" else SWEEPERS).get(target, {})
        plain = {key: _value(settings, key) for key in settings}
        for key, (ok, allowed) in rules.items():
            if key in plain and not ok(plain[key]):
                need(False, f"hydra.{node}.{key}", plain[key],
                     allowed() if callable(allowed) else allowed)
        combinations = {SLURM: _slurm, RAY: _ray}.get(target)
        if combinations is not None:
            combinations(plain)


def _value(settings: DictConfig, key: str) -> Any:
    """A setting's value, resolved (a plain list or dict); unresolved if it cannot be yet (a
    `${hydra.job.name}` Hydra fills in per job)."""
    try:
        value = settings[key]
    except Exception:
        return OmegaConf.to_container(settings, resolve=False)[key]
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _slurm(settings: dict) -> None:
    memory = [k for k in ("mem_gb", "mem_per_cpu", "mem_per_gpu") if settings.get(k) is not None]
    if len(memory) > 1:
        raise ConfigError(", ".join(f"hydra.launcher.{k}={settings[k]}" for k in memory)
                          + ": Slurm takes one of them; set the others to null")
    delay, limit = settings.get("signal_delay_s"), settings.get("timeout_min")
    need(delay < 60 * limit, "hydra.launcher.signal_delay_s", delay,
         f"must be less than the time limit, hydra.launcher.timeout_min={limit} minutes "
         f"({60 * limit} s)")


def _ray(settings: dict) -> None:
    """`init`: keyword arguments of ray.init (its own num_cpus and num_gpus: counts)."""
    init = settings.get("init") or {}
    if not init:
        return
    import inspect

    import ray

    known = [name for name, p in inspect.signature(ray.init).parameters.items()
             if p.kind is not inspect.Parameter.VAR_KEYWORD]
    for key, value in init.items():
        need(key in known, f"hydra.launcher.init.{key}", value,
             f"not an argument of ray.init; allowed: {', '.join(known)}")
        if key in ("num_cpus", "num_gpus"):
            need(value is None or (_integer(value) and value >= 0), f"hydra.launcher.init.{key}",
                 value, "must be an integer >= 0, or null (what the machine has)")


# What the launching process runs of Slurm: submitit refuses to make its executor without srun
# (SlurmExecutor.__init__, a RuntimeError and its traceback), and sbatch submits the array job.
# sacct (polling the jobs) and scancel (cancelling them) come with them; submitit goes on with a
# warning if sacct fails, so they are not asked for here.
SLURM_COMMANDS = ("srun", "sbatch")


def check_machine(config: DictConfig) -> None:
    """Raise ConfigError (one line) if this machine cannot run the sweep's launcher as set:
    Slurm's commands missing, or a job asking a Ray runtime started here for more CPUs or GPUs
    than it has. After check_plugins (the settings' values are sound), before anything starts."""
    settings = OmegaConf.select(config, "hydra.launcher")
    if not isinstance(settings, DictConfig):
        return
    target = settings.get("_target_")
    if target == SLURM:
        missing = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
        if missing:
            choice = (OmegaConf.select(config, "hydra.runtime.choices") or {}).get(
                "hydra/launcher") or "slurm"
            raise ConfigError(
                f"hydra/launcher={choice}: {' and '.join(missing)} not found on PATH; run the "
                "sweep on a machine of the Slurm cluster (a login node), or choose a launcher "
                "for this one: hydra/launcher=gradexp, ray, joblib or submitit_local")
    elif target == RAY:
        plain = {key: _value(settings, key) for key in settings}
        node = _local_ray_node(plain.get("address"), plain.get("init") or {})
        for key, what in (("num_cpus", "CPUs"), ("num_gpus", "GPUs")) if node else ():
            has, source = node[key]
            need(plain[key] <= has, f"hydra.launcher.{key}", plain[key],
                 f"more {what} per job than this machine's Ray runtime has, {show(has)} "
                 f"({source}); the job would wait for them forever: ask for at most "
                 f"{show(has)}, or join a cluster that has them (hydra.launcher.address)")


def _local_ray_node(address: str | None, init: dict) -> dict[str, tuple[float, str]] | None:
    """{"num_cpus": (count, where it comes from), "num_gpus": ...} of the runtime ray.init
    would start on this machine; None if the launcher joins a running cluster instead (address
    auto or host:port; null with RAY_ADDRESS set, or a runtime `ray start` left here), whose
    nodes are not this machine's to count.

    Ray's own count, as the runtime it starts from this process will make it, rather than
    TensorFlow's (not imported here) or nvidia-smi's, since Ray schedules by it:
    RAY_OVERRIDE_RESOURCES first, then ray.init's num_cpus / num_gpus (hydra.launcher.init),
    else what Ray detects: CPUs within cgroup limits (ray._private.utils.get_num_cpus), GPUs by
    NVML (or AMD's, Intel's, Apple's) at most as many as CUDA_VISIBLE_DEVICES (or its
    vendor's variable) lists. These are Ray's private functions: should a Ray release move
    them, nothing is counted and the sweep goes ahead unchecked."""
    if address not in (None, "local"):
        return None
    try:
        from ray._private import accelerators, ray_constants, services, utils

        if address is None and services.get_ray_address_from_environment(
                None, init.get("_temp_dir")) not in (None, "local"):
            return None
        override = json.loads(os.environ.get(ray_constants.RESOURCES_ENVIRONMENT_VARIABLE)
                              or "{}")
        node = {}
        for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            if name in override:
                node[key] = (override[name], ray_constants.RESOURCES_ENVIRONMENT_VARIABLE)
            elif init.get(key) is not None:
                node[key] = (init[key], f"hydra.launcher.init.{key}")
        if "num_cpus" not in node:
            node["num_cpus"] = (utils.get_num_cpus(), "counted by Ray")
        if "num_gpus" not in node:
            gpus = accelerators.get_accelerator_manager_for_resource("GPU")
            count = gpus.get_current_node_num_accelerators()
            visible = gpus.get_current_process_visible_accelerator_ids()
            if visible is not None:
                count = min(count, len(visible))
            node["num_gpus"] = (count, "counted by Ray")
        return node
    except (ImportError, AttributeError, TypeError, ValueError):  # a Ray that counts otherwise
        return None
