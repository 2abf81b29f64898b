"""How long a stage trains, where an invocation stops, the seed, non-finite and grown losses."""

import math

from absl import flags

from aetv2_tf.program.flag_support import at_most_a_year, defined

#: The `config.RunConfig` field these flags fill (`config.TrainConfig`).
GROUP = "train"

defined(flags.DEFINE_integer("batch_size", 128,
                             "Global batch size (pairs), split across replicas."),
        essential=True, minimum=1)
defined(flags.DEFINE_integer("epochs", 0,
                             "Training epochs over the training set (0: use --train_steps)."),
        trajectory=True, minimum=0)
defined(flags.DEFINE_integer("train_steps", 0, "Training steps (overrides --epochs when > 0)."),
        trajectory=True, minimum=0)
defined(flags.DEFINE_float(
    "train_seconds", 0.0,
    "pretext: size the run to about this many seconds of training on this machine (overrides "
    "--epochs, and --train_steps unless given after it): the step count, timed on a throwaway "
    "model, is recorded in <model_dir>/budget.json for a resumed run. 0: off."),
    finite=True, minimum=0,
    valid=[at_most_a_year("train_seconds", "for longer runs pass --train_steps or --epochs.")])
defined(flags.DEFINE_integer(
    "stop_after_steps", 0,
    "End this invocation after this many steps (checkpointed; 0: run to the end). For "
    "time-limited job slots: rerun the same command to continue."), minimum=0)
defined(flags.DEFINE_float(
    "stop_after_seconds", 0.0,
    "End this invocation, checkpointed, at the first step ending this many seconds after the "
    "program started (0: run to the end); the schedule stays the whole run's: rerun the same "
    "command to continue."),
    finite=True, minimum=0,
    valid=[at_most_a_year("stop_after_seconds", "0 runs to the end.")])
defined(flags.DEFINE_integer("steps_per_execution", 1,
                             "Steps run inside one tf.function call (fewer Python round trips)."),
        minimum=1)
defined(flags.DEFINE_integer("seed", 0,
                             "Seed of weights, data order, augmentation and homographies."),
        essential=True, minimum=0)  # NumPy refuses negative seeds
defined(flags.DEFINE_enum(
    "on_nonfinite", "skip", ["skip", "stop"],
    "A step with a non-finite loss or gradient: skip the update, or stop training. Either way "
    "no non-finite weights are ever checkpointed."), trajectory=True)
defined(flags.DEFINE_float(
    "max_loss_growth", 10.0,
    "Stop training (exit 7, the last good checkpoint kept) when the loss grows past this many "
    "times its first logged value: a finite divergence (docs/reliability.md). 0: off."),
    valid=[(lambda v: v == 0 or 1 < v < math.inf,
            "--max_loss_growth must be 0 (off) or a finite factor above 1, e.g. 10.")])
