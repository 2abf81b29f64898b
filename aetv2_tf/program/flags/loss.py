"""The AET pretext loss: AETv2's geodesic loss (its weights and frame) or AETv1's MSE (every
flag ``aet_only``: RotNet's loss is a cross-entropy over 4 rotations)."""

from absl import flags

from aetv2_tf.program.flag_support import defined

#: The `config.RunConfig` field these flags fill: the recipe's `LossSpec` (`config.recipe_of`).
GROUP = "recipe"

defined(flags.DEFINE_enum(
    "loss", "geodesic", ["geodesic", "mse"],
    "geodesic: AETv2, Eq. (11) of the paper; mse: AETv1, MSE on the 8 parameters."),
    essential=True, aet_only=True)
defined(flags.DEFINE_float(
    "projection_weight", 1.0,
    "lambda of Eq. (11): weight of the projection residual ||M - P||_F^2 (>= 0)."),
    essential=True, aet_only=True, finite=True, float32=True, minimum=0)
defined(flags.DEFINE_integer(
    "angle_power", 1,
    "geodesic loss: 1 minimises the angle theta (the paper's Eq. 11), 2 minimises theta^2 "
    "(= ||log P||_F^2 / 2)."),
    essential=True, aet_only=True,
    valid=[(lambda v: v in (1, 2), "--angle_power must be 1 (the paper) or 2.")])
defined(flags.DEFINE_float(
    "residual_scale", 0.0,
    "geodesic loss: b > 0 bounds the residual's growth, r -> b log(1 + r / b); 0: the paper's "
    "r."),
    essential=True, aet_only=True, finite=True, float32=True, minimum=0)
defined(flags.DEFINE_float(
    "chordal_weight", 0.0,
    "geodesic loss: weight of ||M - I||_F^2 (M = T^{-1} T_hat, unit determinant), the "
    "first-order full-group distance; a gradient at theta = pi. 0: off."),
    essential=True, aet_only=True, finite=True, float32=True, minimum=0)
defined(flags.DEFINE_float(
    "mse_weight", 0.0,
    "geodesic loss: weight of an added AETv1 parameter MSE (std-normalised). 0: off (the "
    "paper)."),
    essential=True, aet_only=True, finite=True, float32=True, minimum=0)
defined(flags.DEFINE_integer(
    "mse_decay_steps", 0,
    "geodesic loss: the --mse_weight term decays linearly to 0 at this step (an MSE warm-up; "
    "then the loss is the geodesic one). 0: constant weight."),
    essential=True, aet_only=True, minimum=0)
defined(flags.DEFINE_enum(
    "loss_frame", "model", ["model", "pixel"],
    "geodesic loss: the frame of T and T_hat before the SO(3) projection: the centred, "
    "normalised model frame (docs/conventions.md) or pixel coordinates."),
    essential=True, aet_only=True)
defined(flags.DEFINE_float(
    "loss_frame_scale", 1.0,
    "geodesic loss, --loss_frame=model: multiply the model frame's coordinates by this (> 0) "
    "before the SO(3) projection: rotations about the centre stay rotations, translations weigh "
    "s times more, perspective terms s times less."),
    essential=True, aet_only=True, finite=True,
    valid=[(lambda v: 1e-6 <= v <= 1e6, "--loss_frame_scale must be from 1e-06 to 1e+06 (1: the "
                                        "model frame): the loss inverts the frame it scales.")])
defined(flags.DEFINE_enum(
    "residual_frame", "loss", ["loss", "unit"],
    "geodesic loss: the frame of the projection residual ||M - P||_F^2: loss (the angle's, "
    "--loss_frame/--loss_frame_scale) or unit (M = T^-1 T_hat in the unit model frame)."),
    essential=True, aet_only=True)
defined(flags.DEFINE_enum(
    "mse_target", "model", ["model", "official"],
    "mse loss only: model (the MSE on T's model-frame parameters, see --mse_normalize) or "
    "official (the published AETv1 code's targets: PIL's inverse map in corner-origin pixels, "
    "normalised by its fixed constants; the decoder regresses them; "
    "configs/cifar10_aetv1_official.cfg)."), essential=True, aet_only=True)
defined(flags.DEFINE_bool(
    "mse_normalize", True,
    "mse loss only: divide each parameter error by the parameter's fixed std under the sampler "
    "(the AETv1 normalisation)."), aet_only=True)
