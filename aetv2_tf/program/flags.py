"""Command-line flags of `python -m aetv2_tf.train` (absl), with their validation.

Every flag is documented by `--helpfull`; a flagfile is just these flags, one per line
(`configs/*.cfg`), and flags given after `--flagfile` on the command line override it.
A wrong value stops the program before anything is written, with a message that names the flag
and the fix.
"""

from __future__ import annotations

import math

from absl import flags

from aetv2_tf.program import flag_support

# --- what to run -----------------------------------------------------------------------------
flags.DEFINE_enum("stage", "pretext", ["pretext", "probe", "supervised"],
                  "pretext: self-supervised pretraining; probe: evaluate a frozen encoder "
                  "(KNN or a trained head); supervised: the fully supervised NIN baseline.")
flags.DEFINE_enum("pretext", "aet", ["aet", "rotation"],
                  "aet: regress the homography (AETv1/AETv2, see --loss); rotation: RotNet, "
                  "predict which of the 4 rotations was applied.")
flags.DEFINE_enum("loss", "geodesic", ["geodesic", "mse"],
                  "geodesic: AETv2, Eq. (11) of the paper; mse: AETv1, MSE on the 8 parameters.")
flags.DEFINE_float("projection_weight", 1.0,
                   "lambda of Eq. (11): weight of the projection residual ||M - P||_F^2 (>= 0).")
flags.DEFINE_integer("angle_power", 1,
                     "geodesic loss: 1 minimises the angle theta (the paper's Eq. 11), 2 minimises "
                     "theta^2 (= ||log P||_F^2 / 2).")
flags.DEFINE_float("residual_scale", 0.0,
                   "geodesic loss: b > 0 bounds the residual's growth, r -> b log(1 + r / b); "
                   "0: the paper's r.")
flags.DEFINE_float("chordal_weight", 0.0,
                   "geodesic loss: weight of ||M - I||_F^2 (M = T^{-1} T_hat, unit determinant), "
                   "the first-order full-group distance; a gradient at theta = pi. 0: off.")
flags.DEFINE_float("mse_weight", 0.0,
                   "geodesic loss: weight of an added AETv1 parameter MSE (std-normalised). "
                   "0: off (the paper).")
flags.DEFINE_integer("mse_decay_steps", 0,
                     "geodesic loss: the --mse_weight term decays linearly to 0 at this step "
                     "(an MSE warm-up; then the loss is the geodesic one). 0: constant weight.")
flags.DEFINE_enum("loss_frame", "model", ["model", "pixel"],
                  "geodesic loss: the frame of T and T_hat before the SO(3) projection: the "
                  "centred, normalised model frame (docs/conventions.md) or pixel coordinates.")
flags.DEFINE_float("loss_frame_scale", 1.0,
                   "geodesic loss, --loss_frame=model: multiply the model frame's coordinates by "
                   "this (> 0) before the SO(3) projection: rotations about the centre stay "
                   "rotations, translations weigh s times more, perspective terms s times less.")
flags.DEFINE_enum("residual_frame", "loss", ["loss", "unit"],
                  "geodesic loss: the frame of the projection residual ||M - P||_F^2: loss (the "
                  "frame of the angle, --loss_frame/--loss_frame_scale) or unit (M = T^-1 T_hat "
                  "in the unit model frame, while the angle is taken in the zoomed frame: the "
                  "residual then sees scale, shear and perspective errors at their own size).")
flags.DEFINE_bool("decoder_scale", None,
                  "The decoder regresses parameters divided by their std under the sampler "
                  "(a fixed Rescaling turns them back). Default: on for --loss=mse (the AETv1 "
                  "code), off for geodesic.")
flags.DEFINE_float("decoder_init_rotation", 0.0,
                   "The decoder starts at the rotation by this many degrees about the image "
                   "centre instead of the identity (45 keeps every quarter turn off the "
                   "geodesic loss's cut locus at theta = pi).")
flags.DEFINE_enum("siamese_batch_norm", "per_branch", ["per_branch", "joint"],
                  "AET pretext: per_branch (default: two encoder calls, x then t(x), each with "
                  "its own BatchNorm statistics and moving-average update, as the published AETv1 "
                  "code; +0.5 / +1.2 KNN points over joint at B1, docs/reproduction.md) or joint "
                  "(one call on x and t(x) together: one set of statistics; the default before "
                  "session 8, which runs of earlier versions keep when resumed).")
flags.DEFINE_enum("mse_target", "model", ["model", "official"],
                  "mse loss only: model (the MSE on T's model-frame parameters, see "
                  "--mse_normalize) or official (the published AETv1 code's targets: PIL's "
                  "inverse map in corner-origin pixels, normalised by its fixed constants; the "
                  "decoder regresses them; configs/cifar10_aetv1_official.cfg).")
flags.DEFINE_bool("mse_normalize", True,
                  "mse loss only: divide each parameter error by the parameter's fixed std under "
                  "the sampler (the AETv1 normalisation).")

# --- model -------------------------------------------------------------------------------------
flags.DEFINE_enum("backbone", "nin", ["nin", "alexnet"], "Encoder: NIN (CIFAR) or AlexNet.")
flags.DEFINE_enum("batch_norm", "fused", ["fused", "keras"],
                  "fused: BatchNormalization through tf.nn.fused_batch_norm (faster on CPU and "
                  "GPU); keras: keras.layers.BatchNormalization. Checkpoints are interchangeable.")

# --- data --------------------------------------------------------------------------------------
flags.DEFINE_enum("dataset", "cifar10", ["cifar10", "imagenet2012", "places365_small", "folder"],
                  "Training data. cifar10 reads the official python layout from --data_dir if it "
                  "is there, else tensorflow-datasets; folder reads class sub-folders.")
flags.DEFINE_string("data_dir", None,
                    "cifar10: the cifar-10-batches-py directory (or its parent); tfds datasets: "
                    "the tensorflow-datasets data dir; folder: the root with train/ and val/.")
flags.DEFINE_bool("download", False,
                  "Let tensorflow-datasets download and prepare the data (needs the internet). "
                  "Off: fail at once with instructions when the data is not prepared.")
flags.DEFINE_integer("train_examples", 0,
                     "Use only the first N training images (0: all). For smoke tests and budgets.")
flags.DEFINE_enum("shift", "integer", ["integer", "continuous"],
                  "Corner shifts of the homography sampler: integer pixels (AETv1) or continuous.")
flags.DEFINE_bool("augment", True,
                  "pretext: pre-augment x before warping; probe/supervised: augment the training "
                  "batches (CIFAR: 4-px padded random crop + flip; 224 protocol: random crop of "
                  "the image resized to 256, + flip).")
flags.DEFINE_enum("warp", "auto", ["auto", "host", "device"],
                  "AET pretext under TensorFlow: where t(x) is warped. host: in the tf.data "
                  "pipeline, on the CPU; device: inside the compiled train step "
                  "(models.pairs.WarpPairs, on the GPU), the pipeline sending uint8 crops and the "
                  "homographies; the same pairs either way (up to the uint8 rounding of x) and "
                  "the same checkpoints. auto: device when a GPU is visible, else host (on a TPU "
                  "pass device: the keras.ops warp, which XLA compiles). Keras on JAX always "
                  "makes its pairs on the device.")
flags.DEFINE_string("data_service", None,
                    "pretext under TensorFlow: run the input pipeline (decode, crop, "
                    "homographies) on a tf.data service, 'grpc://<dispatcher host>:<port>', whose "
                    "worker runs on a machine with spare cores (BENCHMARKS.md, 'ImageNet-size "
                    "input'): the same pairs in the same order, if that dispatcher has exactly "
                    "one worker (a second one would serve every batch twice). None: the pipeline "
                    "runs in this process.")

# --- optimisation ------------------------------------------------------------------------------
flags.DEFINE_string("model_dir", None, "Checkpoints, TensorBoard logs, flags and exports.")
flags.DEFINE_bool("overwrite", False,
                  "Start afresh in a --model_dir that holds a run with different essential flags "
                  "(its files are moved into <model_dir>/overwritten-<time>/, nothing is "
                  "deleted). Without it such a run is refused.")
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
flags.DEFINE_enum("optimizer", "adam", ["adam", "sgd"], "adam (AETv2) or SGD Nesterov (AETv1).")
flags.DEFINE_float("learning_rate", 1e-5, "Peak learning rate.")
flags.DEFINE_enum("lr_schedule", "constant", ["constant", "aetv1", "cosine", "step"],
                  "constant; aetv1: the AETv1 piecewise table scaled to the run length; cosine; "
                  "step: x--lr_drop_factor at --lr_drop_epochs (default x0.2 at 30%, 60%, 80% "
                  "of the run).")
flags.DEFINE_integer("warmup_steps", 0, "Linear learning-rate warm-up steps.")
flags.DEFINE_list("lr_drop_epochs", [],
                  "lr_schedule=step: the epochs (of --epochs) at which the rate is multiplied by "
                  "--lr_drop_factor, e.g. 5,15,25 (RotNet's linear probes); empty: at 30%, 60% "
                  "and 80% of the run.")
flags.DEFINE_float("lr_drop_factor", 0.2, "lr_schedule=step: the factor of each drop.")
flags.DEFINE_float("momentum", 0.9, "SGD momentum (Nesterov).")
flags.DEFINE_float("adam_beta1", 0.9, "Adam beta_1.")
flags.DEFINE_float("adam_beta2", 0.999, "Adam beta_2.")
flags.DEFINE_float("weight_decay", 5e-4, "Weight decay on kernels (>= 0).")
flags.DEFINE_enum("weight_decay_mode", "l2", ["l2", "decoupled"],
                  "l2: add wd/2 ||w||^2 to the loss (PyTorch optimizer semantics, as the AETv1 "
                  "code and the paper); decoupled: AdamW/SGDW-style decay in the optimizer.")
flags.DEFINE_integer("seed", 0, "Seed of weights, data order, augmentation and homographies.")
flags.DEFINE_bool("deterministic", False,
                  "tf.config.experimental.enable_op_determinism(): bitwise repeatable runs.")
flags.DEFINE_enum("mixed_precision", "auto", ["auto", "none", "mixed_float16", "mixed_bfloat16"],
                  "auto: mixed_bfloat16 on CPUs with AMX and on TPUs, mixed_float16 on GPUs, "
                  "none elsewhere. The loss and the SO(3) projection are always float32.")
flags.DEFINE_enum("on_nonfinite", "skip", ["skip", "stop"],
                  "A step with a non-finite loss or gradient: skip the update, or stop training. "
                  "Either way no non-finite weights are ever checkpointed.")
flags.DEFINE_float("max_loss_growth", 10.0,
                   "Stop training (exit 7, the last good checkpoint kept) when the loss grows "
                   "past this many times its first logged value: a finite divergence (a run at "
                   "--learning_rate=1e6 reached 7e13). 10 because every logged run of this "
                   "project peaked at its first value (13 of 13, docs/reliability.md), so a "
                   "tenfold rise is no noise; 0: off.")

# --- distribution ------------------------------------------------------------------------------
flags.DEFINE_enum("strategy", "auto",
                  ["auto", "default", "one_device", "mirrored", "multi_worker_mirrored", "tpu"],
                  "tf.distribute strategy (see aetv2_tf/program/distribute.py and BUILD.md).")
flags.DEFINE_string("tpu", None, "TPU name or address for --strategy=tpu ('' or 'local' on a VM).")
flags.DEFINE_integer("collective_timeout_seconds", 600,
                     "--strategy=multi_worker_mirrored: a collective (gradient all-reduce) that "
                     "waits longer than this for a peer fails (exit 6) instead of hanging.")
flags.DEFINE_integer("cpu_devices", 1,
                     "Split the CPU into this many logical devices (mirrored on a CPU, for tests).")

# --- bookkeeping -------------------------------------------------------------------------------
flags.DEFINE_bool("allow_flag_changes", False,
                  "Resume a pretraining run with other values of the flags that change its "
                  "trajectory (learning rate and schedule, length, weight decay, optimiser "
                  "settings, warm-up, data selection, augmentation, precision); each change is "
                  "appended to <model_dir>/flags_history.jsonl with its step.")
flags.DEFINE_integer("checkpoint_every_steps", 1000, "Checkpoint interval in steps (> 0).")
flags.DEFINE_integer("keep_checkpoints", 3, "How many recent checkpoints to keep.")
flags.DEFINE_integer("summary_every_steps", 100, "TensorBoard scalar interval in steps (> 0).")
flags.DEFINE_integer("image_summary_every_steps", 0,
                     "TensorBoard image interval (0: 10x --summary_every_steps).")
flags.DEFINE_integer("quick_knn_train", 0,
                     "pretext on CIFAR-10: after training, a quick KNN (the authors': k=10, "
                     "Euclidean, block 2 pooled 2x2) of "
                     "the encoder and of a random init, with the first N training images as the "
                     "gallery (0: off).")
flags.DEFINE_integer("quick_knn_test", 2000,
                     "pretext: the quick KNN's queries, the first N test images.")
flags.DEFINE_bool("export", True, "Export the encoder as a SavedModel at the end of training.")
flags.DEFINE_integer("verbose", 1, "Keras progress: 0 silent, 1 progress bar, 2 one line/epoch.")

# --- probe stages ------------------------------------------------------------------------------
flags.DEFINE_string("pretrained", None,
                    "probe: a pretraining --model_dir (its newest checkpoint), a directory "
                    "written by aetv2_tf.save_encoder (a NIN or AlexNet), an exported "
                    "SavedModel dir (<model_dir>/export/encoder), a preset name (the encoders of "
                    "results/scale: aetv1_cifar10, aetv2_cifar10, ...; aetv2_tf.presets()), or "
                    "'none' (random-init encoder seeded by --seed).")
flags.DEFINE_bool("trust_saved_model", False,
                  "probe: load a --pretrained SavedModel that is not a verified export of this "
                  "project (no aetv2_export.json, or files that differ from it) by running its "
                  "graph. A SavedModel is a program: loading it runs code, which can read and "
                  "write files; pass this only for a SavedModel from someone you trust. The "
                  "project's own exports need no flag: their variables are read as data into an "
                  "encoder built here, nothing from the file runs.")
flags.DEFINE_string("feature", None,
                    "probe/supervised: the frozen feature (NIN: block1..block4, default block2; "
                    "AlexNet: conv1..conv5, fc6, fc7, no default).")
flags.DEFINE_enum("probe", "knn", ["knn", "fc1", "fc2", "fc3", "conv", "linear", "nonlinear"],
                  "probe: the classifier on the frozen feature (supervised: the head on the "
                  "trained blocks, conv for the paper's row).")
flags.DEFINE_enum("probe_pool", "avg", ["avg", "max"],
                  "probe=linear: adaptive pooling of the feature map to about 9,000 values, "
                  "average or max.")
flags.DEFINE_string("method", None,
                    "probe/supervised: the method label of results.json and reports (AETv2, "
                    "AETv1, RotNet, random, supervised...). Default: derived from the pretrained "
                    "run's flags.json (loss geodesic: AETv2, mse: AETv1, pretext rotation: "
                    "RotNet), 'random' for --pretrained=none.")
flags.DEFINE_string("dataset_name", None,
                    "probe/supervised: the dataset's name in results.json and reports (default "
                    "--dataset; e.g. places205 for --dataset=folder holding Places205).")
flags.DEFINE_integer("knn_k", 10, "probe=knn: number of neighbours.")
flags.DEFINE_enum("knn_metric", "euclidean", ["euclidean", "cosine"],
                  "probe=knn: distance between features. Default: Euclidean, as the published "
                  "AETv1 code's KNN (scikit-learn); cosine was this project's earlier protocol.")
flags.DEFINE_enum("knn_pool", "avg2x2", ["avg2x2", "global"],
                  "probe=knn: how the feature map becomes a vector. avg2x2 (default): 2x2 average "
                  "pooling, stride 2, flattened (NIN block 2: 3,072 values), the published AETv1 "
                  "code's KNN; global: global average pooling (192 values), the earlier protocol.")
flags.DEFINE_enum("knn_ties", "smallest_label", ["smallest_label", "nearest"],
                  "probe=knn: the class chosen among classes with equal votes: the smallest label "
                  "(default, scikit-learn's KNeighborsClassifier) or the nearest neighbour's.")
flags.DEFINE_integer("val_examples", 5000,
                     "probe heads and supervised: training examples held out for model "
                     "selection (never the test set); KNN uses the whole training set.")
flags.DEFINE_integer("test_examples", 0, "probe: use only the first N test images (0: all).")

FLAGS = flags.FLAGS

# Flags that define what a model_dir contains: resuming with other values is refused.
#: Flags that change a pretraining run's trajectory: resuming with another value is refused
#: unless --allow_flag_changes (then recorded in <model_dir>/flags_history.jsonl).
TRAJECTORY = ("learning_rate", "lr_schedule", "lr_drop_epochs", "lr_drop_factor", "warmup_steps",
              "epochs", "train_steps", "weight_decay", "weight_decay_mode", "momentum",
              "adam_beta1", "adam_beta2", "train_examples", "augment", "mixed_precision",
              "on_nonfinite")
ESSENTIAL = ("stage", "pretext", "loss", "angle_power", "residual_scale", "chordal_weight",
             "mse_weight", "mse_decay_steps", "loss_frame", "loss_frame_scale", "residual_frame",
             "decoder_scale",
             "decoder_init_rotation", "siamese_batch_norm", "mse_target", "backbone", "dataset",
             "batch_norm",
             "shift", "optimizer",
             "projection_weight", "batch_size", "seed", "probe", "feature", "pretrained")


def _positive(name: str, allow_zero: bool = False) -> None:
    bound = 0 if allow_zero else 1
    kind = "non-negative" if allow_zero else "positive"
    flags.register_validator(name, lambda v: v is None or v >= bound,
                             message=f"--{name} must be >= {bound}; pass a {kind} integer.")


for _name in ("batch_size", "steps_per_execution", "checkpoint_every_steps", "summary_every_steps",
              "keep_checkpoints", "knn_k", "cpu_devices", "quick_knn_test"):
    _positive(_name)
for _name in ("quick_knn_train", "mse_decay_steps", "epochs", "train_steps", "stop_after_steps",
              "train_examples", "image_summary_every_steps", "val_examples", "test_examples",
              "warmup_steps"):
    _positive(_name, allow_zero=True)
for _name in ("projection_weight", "residual_scale", "chordal_weight", "mse_weight",
              "loss_frame_scale", "decoder_init_rotation", "train_seconds", "stop_after_seconds",
              "learning_rate",
              "lr_drop_factor", "momentum", "adam_beta1", "adam_beta2", "weight_decay"):
    flags.register_validator(_name, lambda v: v is None or math.isfinite(v),
                             message=f"--{_name} must be a finite number, not inf or nan.")
flags.register_validator("learning_rate", lambda v: v > 0,
                         message="--learning_rate must be > 0.")
flags.register_validator("train_seconds", lambda v: v >= 0,
                         message="--train_seconds must be >= 0 (0: off).")
flags.register_validator("stop_after_seconds", lambda v: v >= 0,
                         message="--stop_after_seconds must be >= 0 (0: off).")
flags.register_validator("lr_drop_factor", lambda v: v > 0,
                         message="--lr_drop_factor must be > 0 (0.1 divides the rate by 10)")
flags.register_validator("loss_frame_scale", lambda v: v > 0,
                         message="--loss_frame_scale must be > 0 (1: the model frame).")
flags.register_validator("angle_power", lambda v: v in (1, 2),
                         message="--angle_power must be 1 (the paper) or 2.")
for _name in ("residual_scale", "chordal_weight", "mse_weight"):
    flags.register_validator(_name, lambda v: v >= 0, message=f"--{_name} must be >= 0 (0: off).")
del _name
flags.register_validator("projection_weight", lambda v: v >= 0,
                         message="--projection_weight must be >= 0 (the paper uses 1).")
flags.register_validator("weight_decay", lambda v: v >= 0, message="--weight_decay must be >= 0.")
flags.register_validator("learning_rate", lambda v: v > 0, message="--learning_rate must be > 0.")
flags.register_validator("model_dir", lambda v: bool(v),
                         message="--model_dir is required: where checkpoints and logs go.")
# Integer flags: digits up to flag_support.MAX_INT; path flags: `~` expanded, also in a flagfile.
flag_support.strict_flags(FLAGS, __name__)
_positive("seed", allow_zero=True)  # NumPy refuses negative seeds
_positive("collective_timeout_seconds", allow_zero=True)
flags.register_validator(
    "cpu_devices", lambda v: v <= flag_support.MAX_CPU_DEVICES,
    message=f"--cpu_devices must be at most {flag_support.MAX_CPU_DEVICES}: logical CPU devices "
            "share the same cores and each adds a traced copy of the step; pass 2 to 8 to "
            "exercise --strategy=mirrored on a CPU.")
flags.register_validator(
    "max_loss_growth", lambda v: v == 0 or 1 < v < math.inf,
    message="--max_loss_growth must be 0 (off) or a finite factor above 1, e.g. 10.")
flags.register_validator(
    "train_seconds", lambda v: v <= flag_support.MAX_TRAIN_SECONDS,
    message=f"--train_seconds must be at most {flag_support.MAX_TRAIN_SECONDS:.0f} (a year); "
            "for longer runs pass --train_steps or --epochs.")


def resolve_run_length(argv: list[str]) -> str | None:
    """--train_steps and --train_seconds both > 0: the one given LAST on the command line wins
    (a flagfile's lines count where ``--flagfile`` is named), the other is set to 0; so
    ``--flagfile=configs/quickstart.cfg --train_steps=20`` trains 20 steps although the
    flagfile sizes the run in seconds. Returns the line to log, or None (nothing to resolve)."""
    if not (FLAGS.train_steps > 0 and FLAGS.train_seconds > 0):
        return None
    expanded = FLAGS.read_flags_from_files(list(argv[1:]), force_gnu=False)
    last = {}
    for i, arg in enumerate(expanded):
        for name in ("train_steps", "train_seconds"):
            if arg == f"--{name}" or arg.startswith(f"--{name}="):
                last[name] = i
    if len(last) < 2:
        return None
    winner, loser = sorted(last, key=last.get, reverse=True)
    setattr(FLAGS, loser, 0)
    return f"--{winner}={FLAGS[winner].value} was given after --{loser}: it sizes the run."


#: Flags whose default changed, with the value runs recorded before them behaved as: a run whose
#: flags.json lacks the flag resumes with that value unless the flag is given
#: (`adopt_earlier_defaults`).
EARLIER_DEFAULTS = {"siamese_batch_norm": "joint"}


def adopt_earlier_defaults(saved: dict) -> list[str]:
    """For a run recorded before a flag of `EARLIER_DEFAULTS` existed (`saved`, its flags.json),
    sets that flag to the value the run trained with, unless the command line gives it; returns
    the ``--flag=value`` settings made (to be logged)."""
    made = []
    for name, value in EARLIER_DEFAULTS.items():
        if name not in saved and not FLAGS[name].present and FLAGS[name].value != value:
            FLAGS[name].value = value
            made.append(f"--{name}={value}")
    return made


#: The loss flags of configs/cifar10_aetv2.cfg and configs/quickstart.cfg: (before version 0.2,
#: since). The default AETv2 changed from the angle in the 16x zoomed frame without a residual
#: (`recipes.AETV2_ZOOM16`) to `recipes.AETV2`; runs recorded before keep what they trained with
#: (`adopt_earlier_recipe`).
RECIPE_CHANGED_IN_0_2 = {"angle_power": (1, 2), "loss_frame_scale": (16.0, 4.0),
                         "projection_weight": (0.0, 10.0), "residual_frame": ("loss", "unit")}


def adopt_earlier_recipe(saved: dict, argv: list[str]) -> list[str]:
    """For a run recorded before version 0.2 (`saved`, its flags.json, has no "version") that
    trained the earlier default AETv2, resumed with a flagfile that now holds the current one:
    sets the flags of `RECIPE_CHANGED_IN_0_2` back to the values it trained with and returns the
    ``--flag=value`` settings made (to be logged). Nothing is changed when the run records a
    version, when its values or the command line's are any others, or when the command line
    (`argv`, flagfiles not expanded) names one of these flags itself: then the run's own check
    reports the difference."""
    if "version" in saved or saved.get("loss") != "geodesic":
        return []
    earlier = {name: saved.get(name, old) for name, (old, _) in RECIPE_CHANGED_IN_0_2.items()}
    if any(earlier[name] != old or FLAGS[name].value != new
           for name, (old, new) in RECIPE_CHANGED_IN_0_2.items()):
        return []
    if any(arg == f"--{name}" or arg.startswith(f"--{name}=")
           for arg in argv for name in RECIPE_CHANGED_IN_0_2):
        return []
    for name, value in earlier.items():
        FLAGS[name].value = value
    return [f"--{name}={value:g}" if isinstance(value, float) else f"--{name}={value}"
            for name, value in earlier.items()]


def run_flags() -> dict:
    """The values of this module's flags, as a dict (written to results and compared on resume)."""
    return {f.name: f.value for f in FLAGS.get_flags_for_module(__name__)}


def flagfile_text() -> str:
    """This run's flags as a reusable flagfile (`--flagfile=<model_dir>/flags.cfg`)."""
    lines = (f.serialize() for f in FLAGS.get_flags_for_module(__name__) if f.value is not None)
    return "".join(f"{line}\n" for line in lines if line)
