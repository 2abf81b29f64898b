"""How long a stage trains, where an invocation stops, the seed, non-finite and grown losses."""

from absl import flags

flags.DEFINE_integer("batch_size", 128, "Global batch size (pairs), split across replicas.")
flags.DEFINE_integer("epochs", 0, "Training epochs over the training set (0: use --train_steps).")
flags.DEFINE_integer("train_steps", 0, "Training steps (overrides --epochs when > 0).")
flags.DEFINE_float("train_seconds", 0.0,
                   "pretext: size the run to about this many seconds of training on this "
                   "machine (overrides --epochs, and --train_steps unless that is given after "
                   "it on the command line, as after a flagfile's line): a throwaway model "
                   "times a few steps, the step count (and so the learning-rate schedule) follows "
                   "from the rate and is recorded in <model_dir>/budget.json, which a resumed run "
                   "reuses. 0: off.")
flags.DEFINE_integer("stop_after_steps", 0,
                     "End this invocation after this many steps (checkpointed; 0: run to the end). "
                     "For time-limited job slots: rerun the same command to continue.")
flags.DEFINE_float("stop_after_seconds", 0.0,
                   "End this invocation at the first step that ends this many seconds after the "
                   "program started (start-up and compilation count), with a checkpoint; 0: run "
                   "to the end. For job slots of a fixed length (a lent GPU): the learning-rate "
                   "schedule stays that of the whole run; rerun the same command to continue.")
flags.DEFINE_integer("steps_per_execution", 1,
                     "Steps run inside one tf.function call (fewer Python round trips).")
flags.DEFINE_integer("seed", 0, "Seed of weights, data order, augmentation and homographies.")
flags.DEFINE_enum("on_nonfinite", "skip", ["skip", "stop"],
                  "A step with a non-finite loss or gradient: skip the update, or stop training. "
                  "Either way no non-finite weights are ever checkpointed.")
flags.DEFINE_float("max_loss_growth", 10.0,
                   "Stop training (exit 7, the last good checkpoint kept) when the loss grows "
                   "past this many times its first logged value: a finite divergence (a run at "
                   "--learning_rate=1e6 reached 7e13). 10 because every logged run of this "
                   "project peaked at its first value (13 of 13, docs/reliability.md), so a "
                   "tenfold rise is no noise; 0: off.")
