"""aetv2_tf: AETv2 in Keras 3 on TensorFlow.

The paper: Feng Lin, Haohang Xu, Houqiang Li, Hongkai Xiong, Guo-Jun Qi, "AETv2: AutoEncoding
Transformations for Self-Supervised Representation Learning by Minimizing Geodesic Distances in
Lie Groups".

Self-supervised representation learning by autoencoding homographies: a Siamese encoder sees an
image x and a warped copy t(x); a decoder regresses t, and the loss is the geodesic distance on
SO(3) between the applied and the decoded homography (after projection), plus a projection residual.

The entry points of the library (README, "Use it from Python"), imported on first use:

* recipes as values: `Recipe`, `AETV2` (the recipe that learns), `AETV2_PAPER`, `AETV1`,
  `AETV1_OFFICIAL`, the variants `AETV2_ZOOM16`, `AETV2_SQ4`, `AETV2_HYBRID`, all by
  name in `RECIPES` / `as_recipe("aetv1")`; a recipe builds its model (`recipe.build_model`) and
  compiles it (`recipe.compile(model, steps)`, `training_steps(n, batch_size, epochs)`);
  `parameter_std` (AETv1's normalisation);
* models: `build_backbone` (NIN, AlexNet), `build_pairs_model` (fit on uint8 images, the pairs
  made in the train step), `build_aet_model`, `build_rotations_model` (RotNet);
* losses: `GeodesicLoss` (AETv2), `ParameterMSELoss` (AETv1);
* data: `pretext_dataset` (tf.data pairs), `load_cifar10`, `list_image_folder`, and the
  normalisation constants `CIFAR10_MEAN` / `CIFAR10_STD`, `IMAGENET_MEAN` / `IMAGENET_STD`;
* features and probes: `pooled_features`, `knn_accuracy`;
* encoders with their preprocessing: `build_classifier` (uint8 images -> normalisation -> the
  encoder cut at a feature -> a head; fine-tune or probe it, save it as .keras) and
  `feature_extractor` (the same without the head); any Keras backbone, `feature=` choosing it;
* saving: `save_encoder`, `load_encoder` (a directory ``--pretrained`` accepts, a custom
  encoder's `.keras`, or a preset name of `presets()` / `PRESETS`: the encoders in `results/`),
  `load_model` (a `.keras` file the project wrote, e.g. a run's ``aet_model.keras``, after its
  digest check),
  `preprocessing` (the mean and std an encoder was trained with), and `export_encoder` (a
  SavedModel, TensorFlow);
* inputs: `check_images`, `check_labels`, `check_feature`, the checks every entry point applies
  (uint8 NHWC images, integer labels, feature names), with messages that name the fix.

The command line, ``python -m aetv2_tf.train --flagfile=configs/...``, is built on them.
"""

# The module's own imports are private names: `dir(aetv2_tf)` lists the API (`__dir__`).
import importlib as _importlib
import os as _os
import platform as _platform

# The Keras backend is TensorFlow unless the user chose another (KERAS_BACKEND=jax: the library
# and the program run there too, README).
_os.environ.setdefault("KERAS_BACKEND", "tensorflow")
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's Linux wheels turn their oneDNN CPU kernels on by default only on CPUs with
# AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX; on other x86 CPUs (AVX2-only laptops and cloud VMs)
# convolutions fall back to Eigen kernels, measured at 0.58x the speed of the training step
# with oneDNN, 0.63x of the CLI (BENCHMARKS.md, "AVX2 CPUs"). So oneDNN is asked for on every
# x86 CPU (not measured on ARM: left to TensorFlow there), unless the user chose:
# TF_ENABLE_ONEDNN_OPTS=0 keeps the Eigen kernels.
# Effective only if TensorFlow is imported after this package.
if _platform.machine().lower() in ("x86_64", "amd64"):
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

__version__ = "0.2.0"

# `keras.saving.load_model` of any .keras file the package writes needs only `import aetv2_tf`:
# its classes are registered with Keras as soon as Keras is imported (aetv2_tf/registry.py).
from aetv2_tf import registry as _registry  # noqa: E402  (no Keras import: after the above)

_registry.install()

#: Where each name of the API is defined, by module (imported on first use).
_MODULES = {
    "method.recipes": (
        "Recipe", "AETV2", "AETV2_PAPER", "AETV1", "AETV2_SQ4", "AETV2_SQ4_UNITRES",
        "AETV2_HYBRID", "AETV1_OFFICIAL", "RECIPES", "as_recipe", "training_steps",
    ),
    "data.sampler": ("parameter_std",),
    "method.recipe_parts": ("LossSpec", "OptimizerSpec"),
    "models": ("build_backbone", "build_aet_model"),
    "models.pretext": ("build_pairs_model", "build_rotations_model"),
    "method.losses": ("GeodesicLoss", "ParameterMSELoss"),
    "data.pipelines": ("pretext_dataset",),
    "data.sources": ("load_cifar10", "list_image_folder"),
    "data.constants": ("CIFAR10_MEAN", "CIFAR10_STD", "IMAGENET_MEAN", "IMAGENET_STD"),
    "probes.knn": ("pooled_features", "knn_accuracy"),
    "files.saving": ("save_encoder", "load_encoder", "load_model", "preprocessing"),
    "files.savedmodel": ("export_encoder",),
    "files.presets": ("presets", "PRESETS"),
    "models.image_models": ("build_classifier", "feature_extractor"),
    "input_checks": ("check_images", "check_labels", "check_feature"),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        value = getattr(_importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API (`__all__`) and ``__version__``: not the module's imports, not the submodules
    that importing it loaded."""
    return sorted([*__all__, "__version__"])
