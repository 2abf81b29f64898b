"""The data: dataset, where it is, which images (training, held out, test), the sampler's
shifts, augmentation, where pairs are warped, and the name results give the dataset."""

from absl import flags

from aetv2_tf.program.flag_support import defined

#: The `config.RunConfig` field these flags fill (`config.DataConfig`).
GROUP = "data"

defined(flags.DEFINE_enum(
    "dataset", "cifar10", ["cifar10", "imagenet2012", "places365_small", "folder"],
    "Training data. cifar10 reads the official python layout from --data_dir if it is there, "
    "else tensorflow-datasets; folder reads class sub-folders."), essential=True)
defined(flags.DEFINE_string(
    "data_dir", None,
    "cifar10: the cifar-10-batches-py directory (or its parent); tfds datasets: the "
    "tensorflow-datasets data dir; folder: the root with train/ and val/."),
    valid=[(lambda v: v != "", "--data_dir is empty: name the data's folder, or leave the flag "
                               "out (the dataset's default place).")])
flags.DEFINE_bool("download", False,
                  "Let tensorflow-datasets download and prepare the data (needs the internet). "
                  "Off: fail at once with instructions when the data is not prepared.")
defined(flags.DEFINE_integer(
    "train_examples", 0,
    "Use only the first N training images (0: all). For smoke tests and budgets."),
    trajectory=True, minimum=0)
defined(flags.DEFINE_integer(
    "val_examples", 5000,
    "probe heads and supervised: training examples held out for model selection (never the "
    "test set); KNN uses the whole training set."), trajectory=True, minimum=0)
defined(flags.DEFINE_integer("test_examples", 0,
                             "probe: use only the first N test images (0: all)."), minimum=0)
defined(flags.DEFINE_enum(
    "shift", "integer", ["integer", "continuous"],
    "Corner shifts of the homography sampler: integer pixels (AETv1) or continuous."),
    essential=True, aet_only=True)
defined(flags.DEFINE_bool(
    "augment", True,
    "pretext: pre-augment x before warping; probe/supervised: augment the training batches "
    "(CIFAR: 4-px padded random crop + flip; 224 protocol: random crop of the image resized to "
    "256, + flip)."), trajectory=True)
defined(flags.DEFINE_enum(
    "warp", "auto", ["auto", "host", "device"],
    "AET pretext under TensorFlow: where t(x) is warped. host: in the tf.data pipeline, on the "
    "CPU; device: inside the compiled train step (models.pretext.WarpPairs, on the GPU), the "
    "pipeline sending uint8 crops and the homographies; the same pairs either way (up to the "
    "uint8 rounding of x) and the same checkpoints. auto: device when a GPU is visible, else host "
    "(on a TPU pass device: the keras.ops warp, which XLA compiles). Keras on JAX always makes "
    "its pairs on the device."), aet_only=True)
flags.DEFINE_string("data_service", None,
                    "pretext under TensorFlow: run the input pipeline (decode, crop, "
                    "homographies) on a tf.data service, 'grpc://<dispatcher host>:<port>', whose "
                    "worker runs on a machine with spare cores (BENCHMARKS.md, 'ImageNet-size "
                    "input'): the same pairs in the same order, if that dispatcher has exactly "
                    "one worker (a second one would serve every batch twice). None: the pipeline "
                    "runs in this process.")
flags.DEFINE_string("dataset_name", None,
                    "probe/supervised: the dataset's name in results.json and reports (default "
                    "--dataset; e.g. places205 for --dataset=folder holding Places205).")
