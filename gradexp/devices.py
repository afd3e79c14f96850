"""Which devices a run uses. Called before TensorFlow places its first op."""

from __future__ import annotations

from gradexp._tf import tf
from gradexp.config import ConfigError


def require_gpu() -> None:
    if not tf.config.list_physical_devices("GPU"):
        raise ConfigError("device=gpu: no GPU is visible to TensorFlow; use device=auto or cpu")


def configure(device: str) -> str:
    """Apply `device` (auto | cpu | gpu) and return a short description of what runs.

    cpu hides every GPU; gpu requires one; auto uses GPUs when present. GPU memory grows on
    demand rather than being reserved whole, so the runs of a sweep can share a card.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if device == "cpu":
        tf.config.set_visible_devices([], "GPU")
        return "cpu"
    if device == "gpu":
        require_gpu()
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # the runtime is already initialised (a reused worker process)
            pass
    return f"{len(gpus)} gpu" if gpus else "cpu"
