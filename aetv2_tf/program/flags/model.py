"""The encoder (backbone, BatchNorm) and the AET model's decoder and Siamese BatchNorm."""

from absl import flags

from aetv2_tf.program.flag_support import defined

#: The `config.RunConfig` field these flags fill (`config.ModelConfig`).
GROUP = "model"

defined(flags.DEFINE_bool(
    "decoder_scale", None,
    "The decoder regresses parameters divided by their std under the sampler (a fixed "
    "Rescaling turns them back). Default: on for --loss=mse (the AETv1 code), off for "
    "geodesic."), essential=True)
defined(flags.DEFINE_float(
    "decoder_init_rotation", 0.0,
    "The decoder starts at the rotation by this many degrees about the image centre instead of "
    "the identity (45 keeps every quarter turn off the geodesic loss's cut locus at "
    "theta = pi)."), essential=True, finite=True)
defined(flags.DEFINE_enum(
    "siamese_batch_norm", "per_branch", ["per_branch", "joint"],
    "AET pretext: per_branch (default: two encoder calls, x then t(x), each with its own "
    "BatchNorm statistics and moving-average update, as the published AETv1 code; better "
    "features than joint at both seeds measured, docs/reproduction.md) or joint (one call on x "
    "and t(x) together: one set of statistics)."), essential=True)
defined(flags.DEFINE_enum("backbone", "nin", ["nin", "alexnet"],
                          "Encoder: NIN (CIFAR) or AlexNet."), essential=True)
defined(flags.DEFINE_enum(
    "batch_norm", "fused", ["fused", "keras"],
    "fused: BatchNormalization through tf.nn.fused_batch_norm (faster on CPU and GPU); keras: "
    "keras.layers.BatchNormalization. Checkpoints are interchangeable."), essential=True)
