"""aetv2_tf: AETv2 in Keras 3 on TensorFlow.

The paper: Feng Lin, Haohang Xu, Houqiang Li, Hongkai Xiong, Guo-Jun Qi, "AETv2: AutoEncoding
Transformations for Self-Supervised Representation Learning by Minimizing Geodesic Distances in
Lie Groups".

Self-supervised representation learning by autoencoding homographies: a Siamese encoder sees an
image x and a warped copy t(x); a decoder regresses t, and the loss is the geodesic distance on
SO(3) between the applied and the decoded homography (after projection), plus a projection residual.

The library's entry points (README, "Use it from Python"), imported on first use:

* recipes: `Recipe`, `AETV2`, `AETV2_PAPER`, `AETV1`, `AETV1_OFFICIAL` and the variants, by name
  in `RECIPES` / `as_recipe("aetv1")`; `recipe.build_model`, `recipe.compile(model, steps)`,
  `training_steps`, `parameter_std` (AETv1's normalisation);
* models: `build_backbone` (NIN, AlexNet), `build_pairs_model`, `build_aet_model`,
  `build_rotations_model` (RotNet); losses: `GeodesicLoss` (AETv2), `ParameterMSELoss` (AETv1);
* data: `pretext_dataset`, `load_cifar10`, `list_image_folder`, `CIFAR10_MEAN` / `CIFAR10_STD`,
  `IMAGENET_MEAN` / `IMAGENET_STD`; features and probes: `pooled_features`, `knn_accuracy`;
* encoders with their preprocessing: `build_classifier` (uint8 images -> normalisation -> the
  encoder cut at a feature -> a head) and `feature_extractor` (the same without the head);
* saving: `save_encoder`, `load_encoder` (a run directory, a `.keras` file, or a preset of
  `presets()` / `PRESETS`), `load_model` (a project `.keras` file, digest checked),
  `preprocessing`, `export_encoder` (a SavedModel, TensorFlow);
* inputs: `check_images`, `check_labels`, `check_feature` (messages that name the fix).

The command line, ``python -m aetv2_tf.train --flagfile=configs/...``, is built on them.
"""

# The module's own imports are private names: `dir(aetv2_tf)` lists the API (`__dir__`).
import importlib as _importlib
import os as _os
import platform as _platform

# TensorFlow unless the user chose another backend (KERAS_BACKEND=jax, README).
_os.environ.setdefault("KERAS_BACKEND", "tensorflow")
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# oneDNN CPU kernels on every x86 CPU (TensorFlow enables them only on AVX512/AMX ones; Eigen's
# are 0.6x as fast: BENCHMARKS.md, "AVX2 CPUs"), if TensorFlow is imported after this package;
# TF_ENABLE_ONEDNN_OPTS=0 keeps Eigen's.
if _platform.machine().lower() in ("x86_64", "amd64"):
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

__version__ = "0.2.0"

# The package's Keras classes are registered as soon as Keras is imported (registry.py).
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
    """The API (`__all__`) and ``__version__``."""
    return sorted([*__all__, "__version__"])
