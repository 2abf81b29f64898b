"""Command-line flags of `python -m aetv2_tf.train` (absl), with their validation.

The flags are defined by what they are for, one module each (`GROUPS`: ``--helpfull`` lists
them so): the stage, the loss, the model, the data, the optimizer, training (length, stops,
seed), the machine, the outputs and the probe stages. A flagfile is just these flags, one per
line (`configs/*.cfg`), and flags given after ``--flagfile`` on the command line override it.
A value out of its range stops the program while parsing (exit 1), with a message that names
the flag and the fix; `program.config` reads the parsed flags once, into a `RunConfig`, and
checks their combinations.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from absl import flags

from aetv2_tf.program import flag_support
from aetv2_tf.program.flags import (  # noqa: F401 - each defines its group of flags
    data,
    loss,
    machine,
    model,
    optimizer,
    outputs,
    probes,
    stage,
    training,
)

#: The modules that define the flags, in the order of a run's story (`program_flags`).
GROUPS = tuple(m.__name__ for m in (stage, loss, model, data, optimizer, training, machine,
                                    outputs, probes))


FLAGS = flags.FLAGS

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
flags.register_validator("model_dir", lambda v: bool(v),
                         message="--model_dir is required: where checkpoints and logs go.")
# Integer flags: digits up to flag_support.MAX_INT; path flags: `~` expanded, also in a flagfile.
flag_support.strict_flags(FLAGS, GROUPS)
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


def program_flags(flag_values: flags.FlagValues = FLAGS) -> list[flags.Flag]:
    """The flags of ``python -m aetv2_tf.train`` (every group of this module), in order."""
    return [flag for group in GROUPS for flag in flag_values.get_flags_for_module(group)]


#: Flags whose default changed, with the value runs recorded before them behaved as: a run whose
#: flags.json lacks the flag resumes with that value unless the flag is given
#: (`adopt_earlier_defaults`).
EARLIER_DEFAULTS = {"siamese_batch_norm": "joint"}


def adopt_earlier_defaults(saved: dict, values: dict, given: Collection[str]) -> list[str]:
    """For a run recorded before a flag of `EARLIER_DEFAULTS` existed (`saved`, its flags.json),
    sets that flag's entry of ``values`` (the run's flag values) to the value the run trained
    with, unless ``given`` (the flags named on the command line or in a flagfile) holds it;
    returns the ``--flag=value`` settings made (to be logged)."""
    made = []
    for name, value in EARLIER_DEFAULTS.items():
        if name not in saved and name not in given and values[name] != value:
            values[name] = value
            made.append(f"--{name}={value}")
    return made


#: The loss flags of configs/cifar10_aetv2.cfg and configs/quickstart.cfg: (before version 0.2,
#: since). The default AETv2 changed from the angle in the 16x zoomed frame without a residual
#: (`recipes.AETV2_ZOOM16`) to `recipes.AETV2`; runs recorded before keep what they trained with
#: (`adopt_earlier_recipe`).
RECIPE_CHANGED_IN_0_2 = {"angle_power": (1, 2), "loss_frame_scale": (16.0, 4.0),
                         "projection_weight": (0.0, 10.0), "residual_frame": ("loss", "unit")}


def adopt_earlier_recipe(saved: dict, values: dict, argv: Sequence[str]) -> list[str]:
    """For a run recorded before version 0.2 (`saved`, its flags.json, has no "version") that
    trained the earlier default AETv2, resumed with a flagfile that now holds the current one:
    sets the entries of `RECIPE_CHANGED_IN_0_2` in ``values`` back to what it trained with and
    returns the ``--flag=value`` settings made (to be logged). Nothing is changed when the run
    records a version, when its values or the command line's are any others, or when the
    command line (``argv``, flagfiles not expanded) names one of these flags itself: then the
    run directory's own check reports the difference."""
    if "version" in saved or saved.get("loss") != "geodesic":
        return []
    earlier = {name: saved.get(name, old) for name, (old, _) in RECIPE_CHANGED_IN_0_2.items()}
    if any(earlier[name] != old or values[name] != new
           for name, (old, new) in RECIPE_CHANGED_IN_0_2.items()):
        return []
    if any(arg == f"--{name}" or arg.startswith(f"--{name}=")
           for arg in argv for name in RECIPE_CHANGED_IN_0_2):
        return []
    values.update(earlier)
    return [f"--{name}={value:g}" if isinstance(value, float) else f"--{name}={value}"
            for name, value in earlier.items()]
