"""Where it runs: the tf.distribute strategy, determinism, precision."""

from absl import flags

from aetv2_tf.program.flag_support import MAX_CPU_DEVICES, defined

#: The `config.RunConfig` field these flags fill (`config.MachineConfig`).
GROUP = "machine"

flags.DEFINE_bool("deterministic", False,
                  "tf.config.experimental.enable_op_determinism(): bitwise repeatable runs.")
defined(flags.DEFINE_enum(
    "mixed_precision", "auto", ["auto", "none", "mixed_float16", "mixed_bfloat16"],
    "auto: mixed_bfloat16 on CPUs with AMX and on TPUs, mixed_float16 on GPUs, none elsewhere. "
    "The loss and the SO(3) projection are always float32."), trajectory=True)
flags.DEFINE_enum("strategy", "auto",
                  ["auto", "default", "one_device", "mirrored", "multi_worker_mirrored", "tpu"],
                  "tf.distribute strategy (see aetv2_tf/program/distribute.py and BUILD.md).")
flags.DEFINE_string("tpu", None, "TPU name or address for --strategy=tpu ('' or 'local' on a VM).")
defined(flags.DEFINE_integer(
    "collective_timeout_seconds", 600,
    "--strategy=multi_worker_mirrored: a collective (gradient all-reduce) that waits longer "
    "than this for a peer fails (exit 6) instead of hanging."), minimum=0)
defined(flags.DEFINE_integer(
    "cpu_devices", 1,
    "Split the CPU into this many logical devices (mirrored on a CPU, for tests)."),
    minimum=1,
    valid=[(lambda v: v <= MAX_CPU_DEVICES,
            f"--cpu_devices must be at most {MAX_CPU_DEVICES}: logical CPU devices share the "
            "same cores and each adds a traced copy of the step; pass 2 to 8 to exercise "
            "--strategy=mirrored on a CPU.")])
