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

    Must run before TensorFlow initialises its devices (before any op is executed). More than
    `flag_support.MAX_CPU_DEVICES` is refused with a `ValueError` (100000 hung the start).
    """
    from aetv2_tf.program.flag_support import MAX_CPU_DEVICES

    if num_logical_devices > MAX_CPU_DEVICES:
        raise ValueError(f"--cpu_devices={num_logical_devices}: at most {MAX_CPU_DEVICES} "
                         "logical CPU devices (they share the same cores); pass 2 to 8 to "
                         "exercise --strategy=mirrored on a CPU.")
    if num_logical_devices <= 1:
        return
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_logical_devices
    )


def get_strategy(name: str = "auto", tpu: str | None = None,
                 timeout_seconds: int | None = None) -> tf.distribute.Strategy:
    """Returns the `tf.distribute.Strategy` called `name`.

    - `auto`: `mirrored` when there are several GPUs, `one_device` on a single GPU, else `default`.
    - `default`: no distribution (the current device; CPU here).
    - `one_device`: the first GPU if there is one, else the CPU.
    - `mirrored`: synchronous data parallelism over all local GPUs, or over all logical CPU devices
      when there is no GPU (see `configure_cpu_devices`).
    - `multi_worker_mirrored`: synchronous data parallelism across machines; reads `TF_CONFIG`;
      a collective that waits more than `timeout_seconds` for a peer (a dead or hung worker)
      fails instead of hanging.
    - `tpu`: `TPUStrategy` on the TPU named by `tpu` ("" or "local" for a TPU VM).
    """
    if name not in STRATEGIES:
        raise ValueError(f"--strategy={name!r} is not one of {', '.join(STRATEGIES)}.")
    if name == "multi_worker_mirrored":  # before anything initialises TensorFlow's context
        return _multi_worker_strategy(timeout_seconds)
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
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def _multi_worker_strategy(
        timeout_seconds: int | None) -> tf.distribute.MultiWorkerMirroredStrategy:
    """MWMS from `TF_CONFIG`. TensorFlow refuses it once its context is initialised (e.g. by
    `tf.config.list_logical_devices` or by creating a variable), so create it first thing."""
    if "TF_CONFIG" not in os.environ:
        raise ValueError(
            "--strategy=multi_worker_mirrored needs the TF_CONFIG environment variable "
            '(e.g. {"cluster": {"worker": ["host1:port", "host2:port"]}, '
            '"task": {"type": "worker", "index": 0}}); see BUILD.md.'
        )
    try:
        json.loads(os.environ["TF_CONFIG"])
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}); see BUILD.md.") from e
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def signal_agreement(strategy: tf.distribute.Strategy):
    """Under `MultiWorkerMirroredStrategy`, a function `(sigint, sigterm) -> (sigint, sigterm)`
    that sums every worker's counts of received signals (one collective, a few ms), so that all
    workers stop after the same step when any is signalled (`signal_stop.SignalStop`); None
    elsewhere (one process receives its own signals)."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None

    @tf.function
    def summed(counts):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, (counts,)),
                               axis=None)

    def agree(sigint: int, sigterm: int) -> tuple[int, int]:
        total = summed(tf.constant([sigint, sigterm], tf.float32)).numpy()
        return int(total[0]), int(total[1])

    return agree


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the worker that writes checkpoints, summaries and exports: the `chief` task if the
    cluster has one, else worker 0 (TensorFlow's convention)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    if resolver.task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().jobs
    return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """The machines of the cluster that train (its `chief` and `worker` tasks); 1 outside one."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return 1
    spec = resolver.cluster_spec()
    return sum(spec.num_tasks(job) for job in ("chief", "worker") if job in spec.jobs)


def task_name(strategy: tf.distribute.Strategy) -> str:
    """`<task_type>_<task_id>` of this process in a cluster (`worker_1`), `local` outside one."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return "local"
    return f"{resolver.task_type}_{resolver.task_id}"


def patch_keras_multi_worker_fit(model, strategy: tf.distribute.Strategy) -> None:
    """Lets `model.fit` run under `MultiWorkerMirroredStrategy` (Keras 3 bug, keras-team/keras
    #20585 and #20329).

    Two bugs, two fixes; a no-op under other strategies:

    - before training, Keras 3 builds the model's metrics from one batch that it averages over
      the replicas with `strategy.reduce`, which fails on a nested batch such as ((x, t(x)),
      params). Only the batch's shapes and dtypes matter there, so this builds from this
      worker's first replica's values instead (through the model's private
      `_maybe_symbolic_build`, which reduces that batch before any public hook of `fit` runs:
      Keras has no public one for it);
    - every step, Keras averages the replicas' logs with `strategy.reduce("MEAN", v, axis=0)`,
      which fails on scalars. The train step's scalars are returned with shape (1,) instead
      (through the public `train_step`); the same reduction then averages them over every
      replica of every worker into scalars, as Keras does under `MirroredStrategy`.
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    train_step = model.train_step

    def train_step_with_vector_logs(data):
        return tf.nest.map_structure(lambda v: tf.reshape(v, [1]), train_step(data))

    model.train_step = train_step_with_vector_logs

    def symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0], next(batches))
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = symbolic_build
