"""The encoder (backbone, BatchNorm) and the AET model's decoder and Siamese BatchNorm."""

from absl import flags

from aetv2_tf.program.flag_support import defined

#: The `config.RunConfig` field these flags fill (`config.ModelConfig`).
GROUP = "model"

defined(flags.DEFINE_bool(
    "decoder_scale", None,
    "The decoder regresses parameters divided by their std under the sampler (a fixed "
    "Rescaling turns them back). Default: on for --loss=mse (the AETv1 code), off for "
    "geodesic."), essential=True, aet_only=True)
defined(flags.DEFINE_float(
    "decoder_init_rotation", 0.0,
    "The decoder starts at the rotation by this many degrees about the image centre instead of "
    "the identity (45 keeps every quarter turn off the geodesic loss's cut locus at "
    "theta = pi)."), essential=True, aet_only=True, finite=True,
    valid=[(lambda v: -360 <= v <= 360, "--decoder_init_rotation is in degrees: pass a value "
                                        "from -360 to 360 (45 keeps the quarter turns off "
                                        "theta = pi).")])
defined(flags.DEFINE_enum(
    "siamese_batch_norm", "per_branch", ["per_branch", "joint"],
    "AET pretext: per_branch (two encoder calls, x then t(x), each with its own BatchNorm "
    "statistics, as the AETv1 code; docs/reproduction.md) or joint (one call on both)."),
    essential=True, aet_only=True)
defined(flags.DEFINE_enum("backbone", "nin", ["nin", "alexnet"],
                          "Encoder: NIN (CIFAR) or AlexNet."), essential=True)
defined(flags.DEFINE_enum(
    "batch_norm", "fused", ["fused", "keras"],
    "fused: BatchNormalization through tf.nn.fused_batch_norm (faster on CPU and GPU); keras: "
    "keras.layers.BatchNormalization. Checkpoints are interchangeable."), essential=True)
