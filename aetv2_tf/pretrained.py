"""Pretrained encoders by name: the CIFAR-10 NIN encoders this project trained at scale.

    encoder = aetv2_tf.load_encoder("aetv1_cifar10")            # the best features measured
    aetv2_tf.presets()["aetv1_cifar10"].knn_top1                  # 66.33

Each preset is a pretraining run directory in ``results/scale/`` of the git checkout (next to
the package; tracked in git, 5.8 MB each): `load_encoder`, ``--pretrained`` and
`saving.preprocessing` read it like any run directory. All are NIN on CIFAR-10 (32x32 uint8
images, CIFAR-10's normalisation), trained on one H200 under Keras on JAX: batch 512, 8,000
steps = 4.1 million pairs (82 epochs' worth, on a 19,000-image subset), Adam, cosine schedule
with 1,000 warm-up steps (docs/reproduction.md, "At scale (GPU)").

``knn_top1``: CIFAR-10 test top-1 (%) of the authors' KNN protocol on their block-2 features
(`configs/cifar10_probe_knn.cfg`: 2x2-pooled block 2, 3,072 values, Euclidean, k = 10, all
50,000 training vs 10,000 test images; docs/reproduction.md, "Re-scored"). A random init scores
47.94 (seed 0) / 47.10 (seed 1); the paper's AETv1 / AETv2 (1,500 epochs) 77.61 / 78.74.

A pip install that is not editable has no ``results/``: a preset then raises FileNotFoundError;
clone the repository (``pip install -e .``) or pass the run directory itself. A name of
`PRESETS` always means the preset; write ``./aetv1_cifar10`` for a directory of that name.
"""

from __future__ import annotations

import dataclasses
import os

#: Where the presets' run directories are: ``<repository root>/results/scale``.
PRESETS_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "results", "scale")


@dataclasses.dataclass(frozen=True)
class Preset:
    """A pretrained encoder: ``name`` (what `load_encoder` takes), ``run`` (its directory in
    ``results/scale/``), ``method``, ``config`` (the pretraining flagfile and overrides),
    ``seed``, ``knn_top1`` (module docstring), ``backbone``, ``dataset`` and ``feature`` (the
    one the score is for)."""

    name: str
    run: str
    method: str
    config: str
    seed: int
    knn_top1: float
    backbone: str = "nin"
    dataset: str = "cifar10"
    feature: str = "block2"

    @property
    def directory(self) -> str:
        """The run directory (it may be absent: `preset_directory` checks)."""
        return os.path.join(PRESETS_ROOT, self.run)


_AETV1 = ("configs/cifar10_aetv1.cfg --optimizer=adam --learning_rate=1e-4 --lr_schedule=cosine "
          "--warmup_steps=1000 --adam_beta1=0.9 --adam_beta2=0.999")
#: The presets by name, best first (module docstring).
PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("aetv1_cifar10", "aetv1_lr1e-4", "AETv1 (MSE), Adam 1e-4", _AETV1, 0, 66.33),
    Preset("aetv1_cifar10_s2", "aetv1_lr1e-4_s2", "AETv1 (MSE), Adam 1e-4", _AETV1, 2, 66.73),
    Preset("aetv2_cifar10", "aetv2_recipe", "AETv2, this project's recipe",
           "configs/cifar10_aetv2.cfg", 0, 62.34),
    Preset("aetv2_cifar10_s2", "aetv2_recipe_s2", "AETv2, this project's recipe",
           "configs/cifar10_aetv2.cfg", 2, 62.87),
    Preset("aetv2_paper_cifar10", "aetv2_paper", "AETv2 as the paper writes it",
           "configs/cifar10_aetv2_paper.cfg", 0, 54.16),
)}


def presets() -> dict[str, Preset]:
    """The presets by name (a copy of `PRESETS`), e.g. ``{name: p.knn_top1 for name, p in
    presets().items()}``."""
    return dict(PRESETS)


def preset_directory(name: str) -> str:
    """The run directory of the preset `name`; KeyError for an unknown name (listing them),
    FileNotFoundError when the checkout's ``results/scale`` is not there."""
    if name not in PRESETS:
        raise KeyError(f"no preset {name!r}; the presets: {sorted(PRESETS)}")
    directory = PRESETS[name].directory
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"preset {name!r} is the run directory {directory}, which is not there: the presets "
            "ship in results/scale/ of the git checkout, not in a wheel; clone the repository "
            "and `pip install -e .`, or pass the run directory itself")
    return directory


def resolve(name_or_directory: str | os.PathLike) -> str:
    """A preset name -> its run directory (`preset_directory`); anything else -> as given."""
    text = os.fspath(name_or_directory)
    return preset_directory(text) if text in PRESETS else text
