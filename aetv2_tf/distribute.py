"""Strategy construction in one place (after TF Model Garden's `distribute_utils`).

`get_strategy` is total: every accepted name gives a strategy or a `ValueError` that says what to
pass instead. Nothing here is home-made: every multi-device or multi-machine path is one of
TensorFlow's own `tf.distribute` strategies.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker_mirrored", "tpu")


def configure_cpu_devices(num_logical_devices: int) -> None:
    """Split the first CPU into `num_logical_devices` logical devices (tests, CPU-only mirrored).

    Must run before TensorFlow initialises its devices (before any op is executed).
    """
    if num_logical_devices <= 1:
        return
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_logical_devices
    )


def get_strategy(name: str = "auto", tpu: str | None = None) -> tf.distribute.Strategy:
    """Returns the `tf.distribute.Strategy` called `name`.

    - `auto`: `mirrored` when there are several GPUs, `one_device` on a single GPU, else `default`.
    - `default`: no distribution (the current device; CPU here).
    - `one_device`: the first GPU if there is one, else the CPU.
    - `mirrored`: synchronous data parallelism over all local GPUs, or over all logical CPU devices
      when there is no GPU (see `configure_cpu_devices`).
    - `multi_worker_mirrored`: synchronous data parallelism across machines; reads `TF_CONFIG`.
    - `tpu`: `TPUStrategy` on the TPU named by `tpu` ("" or "local" for a TPU VM).
    """
    if name not in STRATEGIES:
        raise ValueError(f"--strategy={name!r} is not one of {', '.join(STRATEGIES)}.")
    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        name = "mirrored" if len(gpus) > 1 else ("one_device" if gpus else "default")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker_mirrored":
        if "TF_CONFIG" not in os.environ:
            raise ValueError(
                "--strategy=multi_worker_mirrored needs the TF_CONFIG environment variable "
                '(e.g. {"cluster": {"worker": ["host1:port", "host2:port"]}, '
                '"task": {"type": "worker", "index": 0}}); see BUILD.md.'
            )
        json.loads(os.environ["TF_CONFIG"])  # fail early on malformed JSON
        return tf.distribute.MultiWorkerMirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the worker that writes checkpoints, summaries and exports."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    return resolver.task_type in ("chief", None) or (
        resolver.task_type == "worker" and resolver.task_id == 0
    )
