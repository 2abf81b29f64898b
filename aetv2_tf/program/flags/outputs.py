"""What a run writes: model_dir, checkpoints, logs, the export and the final quick KNN."""

from absl import flags

from aetv2_tf.program.flag_support import defined

#: The `config.RunConfig` field these flags fill (`config.OutputsConfig`).
GROUP = "outputs"

defined(flags.DEFINE_string("model_dir", None,
                            "Checkpoints, TensorBoard logs, flags and exports."),
        valid=[(lambda v: bool(v),
                "--model_dir is required: where checkpoints and logs go.")])
flags.DEFINE_bool("overwrite", False,
                  "Start afresh in a --model_dir that holds a run with different essential flags "
                  "(its files are moved into <model_dir>/overwritten-<time>/, nothing is "
                  "deleted). Without it such a run is refused.")
flags.DEFINE_bool("allow_flag_changes", False,
                  "Resume a pretraining run with other values of the flags that change its "
                  "trajectory; each change is appended to <model_dir>/flags_history.jsonl.")
defined(flags.DEFINE_integer("checkpoint_every_steps", 1000,
                             "Checkpoint interval in steps (> 0)."), minimum=1)
defined(flags.DEFINE_integer("keep_checkpoints", 3, "How many recent checkpoints to keep."),
        minimum=1)
defined(flags.DEFINE_integer("summary_every_steps", 100,
                             "TensorBoard scalar interval in steps (> 0)."), minimum=1)
defined(flags.DEFINE_integer("image_summary_every_steps", 0,
                             "TensorBoard image interval (0: 10x --summary_every_steps)."),
        minimum=0)
defined(flags.DEFINE_integer(
    "quick_knn_train", 0,
    "pretext on CIFAR-10: after training, a quick KNN (the authors': k=10, Euclidean, block 2 "
    "pooled 2x2) of the encoder and of a random init, with the first N training images as the "
    "gallery (0: off)."), minimum=0)
defined(flags.DEFINE_integer("quick_knn_test", 2000,
                             "pretext: the quick KNN's queries, the first N test images."),
        minimum=1)
flags.DEFINE_bool("export", True, "Export the encoder as a SavedModel at the end of training.")
defined(flags.DEFINE_integer("verbose", 1,
                             "Keras progress: 0 silent, 1 progress bar, 2 one line/epoch."),
        valid=[(lambda v: v in (0, 1, 2), "--verbose must be 0 (silent), 1 (a progress bar) "
                                          "or 2 (one line per epoch).")])
