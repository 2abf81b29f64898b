"""What to run: the stage and the pretext task."""

from absl import flags

flags.DEFINE_enum("stage", "pretext", ["pretext", "probe", "supervised"],
                  "pretext: self-supervised pretraining; probe: evaluate a frozen encoder "
                  "(KNN or a trained head); supervised: the fully supervised NIN baseline.")
flags.DEFINE_enum("pretext", "aet", ["aet", "rotation"],
                  "aet: regress the homography (AETv1/AETv2, see --loss); rotation: RotNet, "
                  "predict which of the 4 rotations was applied.")
