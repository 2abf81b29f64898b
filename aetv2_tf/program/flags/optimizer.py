"""The optimizer, its learning-rate schedule and weight decay (pretext and probe heads)."""

from absl import flags

from aetv2_tf.program.flag_support import defined

#: The `config.RunConfig` field these flags fill: the recipe's `OptimizerSpec`
#: (`config.recipe_of`).
GROUP = "recipe"

defined(flags.DEFINE_enum("optimizer", "adam", ["adam", "sgd"],
                          "adam (AETv2) or SGD Nesterov (AETv1)."), essential=True)
defined(flags.DEFINE_float("learning_rate", 1e-5, "Peak learning rate."),
        trajectory=True, finite=True,
        valid=[(lambda v: v > 0, "--learning_rate must be > 0.")])
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
        trajectory=True, finite=True,
        valid=[(lambda v: v > 0, "--lr_drop_factor must be > 0 (0.1 divides the rate by 10)")])
defined(flags.DEFINE_float("momentum", 0.9, "SGD momentum (Nesterov)."),
        trajectory=True, finite=True)
defined(flags.DEFINE_float("adam_beta1", 0.9, "Adam beta_1."), trajectory=True, finite=True)
defined(flags.DEFINE_float("adam_beta2", 0.999, "Adam beta_2."), trajectory=True, finite=True)
defined(flags.DEFINE_float("weight_decay", 5e-4, "Weight decay on kernels (>= 0)."),
        trajectory=True, finite=True,
        valid=[(lambda v: v >= 0, "--weight_decay must be >= 0.")])
defined(flags.DEFINE_enum(
    "weight_decay_mode", "l2", ["l2", "decoupled"],
    "l2: add wd/2 ||w||^2 to the loss (PyTorch optimizer semantics, as the AETv1 code and the "
    "paper); decoupled: AdamW/SGDW-style decay in the optimizer."), trajectory=True)
