"""The optimizer, its learning-rate schedule and weight decay (pretext and probe heads)."""

from collections.abc import Callable

from absl import flags

from aetv2_tf.program.flag_support import FLOAT32_MAX, FLOAT32_TINY, as_float32, defined, in_float32


def below_one(name: str, why: str) -> tuple[Callable[[float], bool], str]:
    """The rule 0 <= value < 1, also once rounded to float32 (a momentum, an Adam beta), with
    its message: what --``name`` must be, then ``why``."""
    return (lambda v: 0 <= v and as_float32(v) < 1,
            f"--{name} must be >= 0 and below 1, also in float32 (0.99999999 is 1 there): {why}")

#: The `config.RunConfig` field these flags fill: the recipe's `OptimizerSpec`
#: (`config.recipe_of`).
GROUP = "recipe"

defined(flags.DEFINE_enum("optimizer", "adam", ["adam", "sgd"],
                          "adam (AETv2) or SGD Nesterov (AETv1)."), essential=True)
defined(flags.DEFINE_float("learning_rate", 1e-5, "Peak learning rate."),
        trajectory=True, finite=True,
        valid=[(lambda v: v > 0, "--learning_rate must be > 0."),
               (in_float32, f"--learning_rate must be from {FLOAT32_TINY:.3g} to "
                            f"{FLOAT32_MAX:.3g}: the rate, the weights and their updates are "
                            "float32 under every --mixed_precision, where a smaller rate is 0 "
                            "(no weight would change) and a larger one infinite; the default "
                            "is 1e-05.")])
defined(flags.DEFINE_enum(
    "lr_schedule", "constant", ["constant", "aetv1", "cosine", "step"],
    "constant; aetv1: the AETv1 piecewise table scaled to the run length; cosine; step: "
    "x--lr_drop_factor at --lr_drop_epochs (default x0.2 at 30%, 60%, 80% of the run)."),
    trajectory=True)
defined(flags.DEFINE_integer("warmup_steps", 0, "Linear learning-rate warm-up steps."),
        trajectory=True, minimum=0)
defined(flags.DEFINE_list(
    "lr_drop_epochs", [],
    "lr_schedule=step: the epochs (of --epochs) at which the rate is multiplied by "
    "--lr_drop_factor, e.g. 5,15,25 (RotNet's linear probes); empty: at 30%, 60% and 80% of "
    "the run."), trajectory=True)
defined(flags.DEFINE_float("lr_drop_factor", 0.2, "lr_schedule=step: the factor of each drop."),
        trajectory=True, finite=True, float32=True,
        valid=[(lambda v: 0 < v <= 1, "--lr_drop_factor must be > 0 and at most 1: each drop "
                                      "multiplies the rate by it (0.1 divides it by 10).")])
defined(flags.DEFINE_float("momentum", 0.9, "SGD momentum (Nesterov), from 0 to below 1."),
        trajectory=True, finite=True,
        valid=[below_one("momentum", "SGD keeps momentum times its last step, which grows "
                                     "without end at 1 or more (0.9 is the default).")])
defined(flags.DEFINE_float("adam_beta1", 0.9, "Adam beta_1, from 0 to below 1."),
        trajectory=True, finite=True,
        valid=[below_one("adam_beta1", "Adam divides its step by 1 - beta_1^t, which is 0 at 1 "
                                       "(an infinite step) and negative above (a reversed one); "
                                       "0.9 is the default.")])
defined(flags.DEFINE_float("adam_beta2", 0.999, "Adam beta_2, from 0 to below 1."),
        trajectory=True, finite=True,
        valid=[below_one("adam_beta2", "Adam multiplies its step by sqrt(1 - beta_2^t), which "
                                       "is 0 at 1 (no weight would ever change); 0.999 is the "
                                       "default.")])
defined(flags.DEFINE_float("weight_decay", 5e-4, "Weight decay on kernels (>= 0)."),
        trajectory=True, finite=True, float32=True, minimum=0)
defined(flags.DEFINE_enum(
    "weight_decay_mode", "l2", ["l2", "decoupled"],
    "l2: add wd/2 ||w||^2 to the loss (PyTorch optimizer semantics, as the AETv1 code and the "
    "paper); decoupled: AdamW/SGDW-style decay in the optimizer."), trajectory=True)
