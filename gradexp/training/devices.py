"""Which devices a run uses, set before TensorFlow places its first op. TensorFlow is imported
inside the functions: the Hydra callbacks import `check_device` to answer a bad config first.
"""

from __future__ import annotations

from gradexp.config.base import ConfigError


def check_device(device: str) -> None:
    """device=gpu needs a GPU; only this check loads TensorFlow, and only when it is asked."""
    if device == "gpu":
        from gradexp._tf import tf

        if not tf.config.list_physical_devices("GPU"):
            raise ConfigError("device=gpu: no GPU is visible to TensorFlow; use device=auto or cpu")


def configure(device: str) -> str:
    """Apply `device` (auto | cpu | gpu: cpu hides every GPU, gpu requires one, auto uses any)
    and return a short description of what runs. GPU memory grows on demand rather than being
    reserved whole, so the runs of a sweep can share a card."""
    from gradexp._tf import tf

    gpus = tf.config.list_physical_devices("GPU")
    if device == "cpu":
        tf.config.set_visible_devices([], "GPU")
        return "cpu"
    check_device(device)
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # the runtime is already initialised (a reused worker process)
            pass
    return _where(gpus)


def in_use() -> str:
    """`configure`'s description of the devices visible now, in a process whose devices its
    user set up (model.fit with gradexp.keras.Telemetry)."""
    from gradexp._tf import tf

    return _where(tf.config.get_visible_devices("GPU"))


def _where(gpus: list) -> str:
    return f"{len(gpus)} gpu" if gpus else "cpu"


def precision(policy: str) -> None:
    """Set Keras's global dtype policy (float32, mixed_float16, mixed_bfloat16), float32 too: a
    reused worker process keeps the last run's."""
    from gradexp._tf import keras

    keras.mixed_precision.set_dtype_policy(policy)


def strategy(name: str):
    """`none`: TensorFlow's default (one device); `mirrored`: every visible GPU, or every
    logical CPU when there is no GPU (a test splits the CPU into two logical devices)."""
    from gradexp._tf import tf

    if name == "none":
        return tf.distribute.get_strategy()
    gpus = tf.config.list_logical_devices("GPU")
    devices = [d.name for d in gpus or tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices)


def describe(where: str, strategy_name: str, strategy) -> dict:
    """The devices a run uses, for its provenance (after `prepare_process` and `strategy`):
    `configure`'s description, the strategy's replica devices (the default strategy places
    ops on the first visible GPU, else the CPU), every visible logical device, and the
    physical ones with what TensorFlow knows of them (a GPU's name, compute capability)."""
    from gradexp._tf import tf

    visible = [d.name for d in tf.config.list_logical_devices()]
    if strategy_name == "none":
        replicas = [d.name for d in (tf.config.list_logical_devices("GPU")
                                     or tf.config.list_logical_devices("CPU"))[:1]]
    else:
        replicas = list(strategy.extended.worker_devices)
    physical = [{"name": d.name, "type": d.device_type, **(
        tf.config.experimental.get_device_details(d) if d.device_type == "GPU" else {})}
        for d in tf.config.list_physical_devices()]
    return {"description": where, "strategy": strategy_name, "replicas": replicas,
            "visible": visible, "physical": physical}


def set_op_determinism(on: bool) -> None:
    """TensorFlow op determinism on or off for the process (its public API only turns it on:
    tf.config.experimental.enable_op_determinism; both live in tensorflow.python.framework)."""
    from gradexp._tf import tf  # noqa: I001, F401  (TensorFlow imported quietly, first)
    from tensorflow.python.framework import config as framework

    (framework.enable_op_determinism if on else framework.disable_op_determinism)()


def prepare_process(device: str, policy: str, seed: int, deterministic: bool,
                    free_memory: bool = True) -> str:
    """Everything a run sets in its process before building a model, reset every run (a
    reused worker keeps the last run's state): op determinism, devices, a fresh Keras session,
    the seeds, the dtype policy. Returns `configure`'s description of the devices."""
    from gradexp._tf import keras

    set_op_determinism(deterministic)  # off too: a process's earlier run may have set it
    where = configure(device)
    keras.backend.clear_session(free_memory=free_memory)  # False: no gc.collect
    keras.utils.set_random_seed(seed)
    precision(policy)
    return where
