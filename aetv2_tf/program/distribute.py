"""The tf.distribute strategies, made in one place (after TF Model Garden's
`distribute_utils`): every name gives one of TensorFlow's strategies or a `ValueError` that says
what to pass instead."""

from __future__ import annotations

import json
import os

import tensorflow as tf

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker_mirrored", "tpu")


def configure_cpu_devices(num_logical_devices: int) -> None:
    """Splits the first CPU into `num_logical_devices` logical devices, before TensorFlow
    initialises its devices; more than `flag_support.MAX_CPU_DEVICES`: `ValueError`."""
    from aetv2_tf.program.flag_support import MAX_CPU_DEVICES

    if num_logical_devices > MAX_CPU_DEVICES:
        raise ValueError(f"--cpu_devices={num_logical_devices}: at most {MAX_CPU_DEVICES} "
                         "logical CPU devices (they share the same cores); pass 2 to 8 to "
                         "exercise --strategy=mirrored on a CPU.")
    if num_logical_devices <= 1:
        return
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * num_logical_devices)


def get_strategy(name: str = "auto", tpu: str | None = None,
                 timeout_seconds: int | None = None) -> tf.distribute.Strategy:
    """The `tf.distribute.Strategy` called `name`: `auto` (`mirrored` on several GPUs,
    `one_device` on one, else `default`); `default` (no distribution); `one_device` (the first
    GPU, else the CPU); `mirrored` (all local GPUs, else all logical CPU devices);
    `multi_worker_mirrored` (from `TF_CONFIG`; a collective waiting over `timeout_seconds` for
    a peer fails); `tpu` (on the TPU named `tpu`, "" or "local" for a TPU VM)."""
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
    """MWMS from `TF_CONFIG`, made before TensorFlow's context is initialised (it refuses
    after)."""
    if "TF_CONFIG" not in os.environ:
        raise ValueError("--strategy=multi_worker_mirrored needs the TF_CONFIG environment "
                         'variable (e.g. {"cluster": {"worker": ["host1:port", "host2:port"]}, '
                         '"task": {"type": "worker", "index": 0}}); see BUILD.md.')
    try:
        json.loads(os.environ["TF_CONFIG"])
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}); see BUILD.md.") from e
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def signal_agreement(strategy: tf.distribute.Strategy):
    """Under `MultiWorkerMirroredStrategy`, `signal_stop.Agreement`: every worker's counts of
    received signals summed (one collective); None elsewhere."""
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


def _cluster(strategy: tf.distribute.Strategy):
    """The strategy's cluster resolver, None outside a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver if resolver is not None and getattr(resolver, "task_type", None) else None


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the worker that writes checkpoints, summaries and exports: the `chief` task if the
    cluster has one, else worker 0 (TensorFlow's convention)."""
    resolver = _cluster(strategy)
    if resolver is None or resolver.task_type == "chief":
        return True
    return (resolver.task_type == "worker" and resolver.task_id == 0
            and "chief" not in resolver.cluster_spec().jobs)


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """The machines of the cluster that train (its `chief` and `worker` tasks); 1 outside one."""
    resolver = _cluster(strategy)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec()
    return sum(spec.num_tasks(job) for job in ("chief", "worker") if job in spec.jobs)


def task_name(strategy: tf.distribute.Strategy) -> str:
    """`<task_type>_<task_id>` of this process in a cluster (`worker_1`), `local` outside one."""
    resolver = _cluster(strategy)
    return "local" if resolver is None else f"{resolver.task_type}_{resolver.task_id}"


def patch_keras_multi_worker_fit(model, strategy: tf.distribute.Strategy) -> None:
    """Lets `model.fit` run under `MultiWorkerMirroredStrategy` (keras-team/keras #20585,
    #20329); a no-op under other strategies. Keras 3 builds the metrics from a batch reduced
    over the replicas, which fails on a nested batch: the build takes this worker's first
    replica's values (through the private `_maybe_symbolic_build`: no public hook). Keras
    averages the logs with `strategy.reduce("MEAN", v, axis=0)`, which fails on scalars: the
    train step returns them with shape (1,)."""
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
