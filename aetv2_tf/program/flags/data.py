"""The training data: dataset, where it is, which images, the sampler's shifts, augmentation."""

from absl import flags

flags.DEFINE_enum("dataset", "cifar10", ["cifar10", "imagenet2012", "places365_small", "folder"],
                  "Training data. cifar10 reads the official python layout from --data_dir if it "
                  "is there, else tensorflow-datasets; folder reads class sub-folders.")
flags.DEFINE_string("data_dir", None,
                    "cifar10: the cifar-10-batches-py directory (or its parent); tfds datasets: "
                    "the tensorflow-datasets data dir; folder: the root with train/ and val/.")
flags.DEFINE_bool("download", False,
                  "Let tensorflow-datasets download and prepare the data (needs the internet). "
                  "Off: fail at once with instructions when the data is not prepared.")
flags.DEFINE_integer("train_examples", 0,
                     "Use only the first N training images (0: all). For smoke tests and budgets.")
flags.DEFINE_enum("shift", "integer", ["integer", "continuous"],
                  "Corner shifts of the homography sampler: integer pixels (AETv1) or continuous.")
flags.DEFINE_bool("augment", True,
                  "pretext: pre-augment x before warping; probe/supervised: augment the training "
                  "batches (CIFAR: 4-px padded random crop + flip; 224 protocol: random crop of "
                  "the image resized to 256, + flip).")
flags.DEFINE_enum("warp", "auto", ["auto", "host", "device"],
                  "AET pretext under TensorFlow: where t(x) is warped. host: in the tf.data "
                  "pipeline, on the CPU; device: inside the compiled train step "
                  "(models.pairs.WarpPairs, on the GPU), the pipeline sending uint8 crops and the "
                  "homographies; the same pairs either way (up to the uint8 rounding of x) and "
                  "the same checkpoints. auto: device when a GPU is visible, else host (on a TPU "
                  "pass device: the keras.ops warp, which XLA compiles). Keras on JAX always "
                  "makes its pairs on the device.")
flags.DEFINE_string("data_service", None,
                    "pretext under TensorFlow: run the input pipeline (decode, crop, "
                    "homographies) on a tf.data service, 'grpc://<dispatcher host>:<port>', whose "
                    "worker runs on a machine with spare cores (BENCHMARKS.md, 'ImageNet-size "
                    "input'): the same pairs in the same order, if that dispatcher has exactly "
                    "one worker (a second one would serve every batch twice). None: the pipeline "
                    "runs in this process.")
