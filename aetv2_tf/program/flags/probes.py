"""The probe and supervised stages: the encoder, feature, probe and the KNN's protocol."""

from absl import flags

from aetv2_tf.program.flag_support import defined

#: The `config.RunConfig` field these flags fill (`config.ProbeConfig`).
GROUP = "probe"

defined(flags.DEFINE_string(
    "pretrained", None,
    "probe: a pretraining --model_dir (its newest checkpoint), a directory written by "
    "aetv2_tf.save_encoder (a NIN or AlexNet), an exported SavedModel dir "
    "(<model_dir>/export/encoder), a preset name (the encoders of results/scale: aetv1_cifar10, "
    "aetv2_cifar10, ...; aetv2_tf.presets()), or 'none' (random-init encoder seeded by "
    "--seed)."), essential=True)
flags.DEFINE_bool("trust_saved_model", False,
                  "probe: load a --pretrained SavedModel that is not a verified export of this "
                  "project (no aetv2_export.json, or files that differ from it) by running its "
                  "graph. A SavedModel is a program: loading it runs code, which can read and "
                  "write files; pass this only for a SavedModel from someone you trust. The "
                  "project's own exports need no flag: their variables are read as data into an "
                  "encoder built here, nothing from the file runs.")
defined(flags.DEFINE_string(
    "feature", None,
    "probe/supervised: the frozen feature (NIN: block1..block4, default block2; AlexNet: "
    "conv1..conv5, fc6, fc7, no default)."), essential=True)
defined(flags.DEFINE_enum(
    "probe", "knn", ["knn", "fc1", "fc2", "fc3", "conv", "linear", "nonlinear"],
    "probe: the classifier on the frozen feature (supervised: the head on the trained blocks, "
    "conv for the paper's row)."), essential=True)
defined(flags.DEFINE_enum("probe_pool", "avg", ["avg", "max"],
                          "probe=linear: adaptive pooling of the feature map to about 9,000 "
                          "values, average or max."), essential=True)
flags.DEFINE_string("method", None,
                    "probe/supervised: the method label of results.json and reports (AETv2, "
                    "AETv1, RotNet, random, supervised...). Default: derived from the pretrained "
                    "run's flags.json (loss geodesic: AETv2, mse: AETv1, pretext rotation: "
                    "RotNet), 'random' for --pretrained=none.")
defined(flags.DEFINE_integer("knn_k", 10, "probe=knn: number of neighbours."), minimum=1)
flags.DEFINE_enum("knn_metric", "euclidean", ["euclidean", "cosine"],
                  "probe=knn: distance between features. Default: Euclidean, as the published "
                  "AETv1 code's KNN (scikit-learn).")
flags.DEFINE_enum("knn_pool", "avg2x2", ["avg2x2", "global"],
                  "probe=knn: how the feature map becomes a vector. avg2x2 (default): 2x2 average "
                  "pooling, stride 2, flattened (NIN block 2: 3,072 values), the published AETv1 "
                  "code's KNN; global: global average pooling (NIN block 2: 192 values).")
flags.DEFINE_enum("knn_ties", "smallest_label", ["smallest_label", "nearest"],
                  "probe=knn: the class chosen among classes with equal votes: the smallest label "
                  "(default, scikit-learn's KNeighborsClassifier) or the nearest neighbour's.")
