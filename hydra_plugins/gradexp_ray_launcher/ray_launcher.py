"""`hydra/launcher=ray`: each job of a sweep is one Ray task, in a fresh worker process.

Configured under `hydra.launcher` (docs/guide/clusters.md):

    address    null: start a Ray runtime on this machine (or join the one RAY_ADDRESS names);
               "auto": the cluster this machine belongs to (`ray start` ran here);
               "host:port": a cluster's head (GCS port); "ray://host:10001": Ray Client
    num_cpus   CPUs reserved per job; its TensorFlow thread pools get as many threads
    num_gpus   GPUs reserved per job (0: CPU runs)
    max_calls  jobs a worker process runs before Ray replaces it; 1: a fresh process per job,
               so no TensorFlow state or memory leaks from one run into the next
    init       further keyword arguments of ray.init (e.g. {num_cpus: 4} for a local runtime)

Ray itself is imported only when a sweep is launched (in _core.py; Hydra's plugin scan skips
modules whose name starts with "_"), so `python -m gradexp.train` does not pay for it.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class RayLauncherConf:
    _target_: str = "hydra_plugins.gradexp_ray_launcher.ray_launcher.RayLauncher"
    address: str | None = None
    num_cpus: float = 1
    num_gpus: float = 0
    max_calls: int = 1
    init: dict[str, Any] = field(default_factory=dict)


ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayLauncherConf,
                             provider="gradexp_ray_launcher")


class RayLauncher(Launcher):
    def __init__(self, address: str | None = None, num_cpus: float = 1, num_gpus: float = 0,
                 max_calls: int = 1, init: dict[str, Any] | None = None) -> None:
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus
        self.max_calls, self.init = max_calls, dict(init or {})
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.gradexp_ray_launcher import _core

        return _core.launch(self, job_overrides, initial_job_idx)
