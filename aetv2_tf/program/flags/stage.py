"""What to run: the stage and the pretext task."""

from absl import flags

from aetv2_tf.program.flag_support import defined

#: The `config.RunConfig` fields these flags fill: "run", the run's own (``stage``, ``pretext``).
GROUP = "run"

defined(flags.DEFINE_enum(
    "stage", "pretext", ["pretext", "probe", "supervised"],
    "pretext: self-supervised pretraining; probe: evaluate a frozen encoder (KNN or a trained "
    "head); supervised: the fully supervised NIN baseline."), essential=True)
defined(flags.DEFINE_enum(
    "pretext", "aet", ["aet", "rotation"],
    "aet: regress the homography (AETv1/AETv2, see --loss); rotation: RotNet, predict which of "
    "the 4 rotations was applied."), essential=True)
