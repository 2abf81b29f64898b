"""Pretrained encoders by name: the CIFAR-10 NIN encoders this project trained at scale.

    encoder = aetv2_tf.load_encoder("aetv1_cifar10")            # the best features measured
    aetv2_tf.presets()["aetv1_cifar10"].knn_top1                  # 66.33

Each preset is a pretraining run directory in ``results/scale/`` of the git checkout; its
weights are kept in git history only (the working tree stays small) and restored on first use
(`restore_weights`). All are NIN on CIFAR-10, trained on one H200 under JAX (docs/reproduction.md,
"At scale (GPU)"). ``knn_top1``: CIFAR-10 test top-1 (%) of the authors' KNN protocol on block-2
features (`configs/cifar10_probe_knn.cfg`; docs/reproduction.md, "Re-scored"; a random init:
47.94 / 47.10; the paper's AETv1 / AETv2: 77.61 / 78.74). Without ``results/`` (a wheel) or the
git history (``git clone --depth``), a preset raises FileNotFoundError with the fix. A name of
`PRESETS` always means the preset; write ``./aetv1_cifar10`` for a directory of that name."""

from __future__ import annotations

import dataclasses
import os
import subprocess

import aetv2_tf

#: The repository the package was installed from (editable), and its presets' run directories.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(aetv2_tf.__file__)))
PRESETS_ROOT = os.path.join(REPOSITORY, "results", "scale")
WEIGHTS = "encoder.weights.h5"
CHECKSUM = ".sha256"  # the suffix of a file's SHA-256 beside it (as `saving.CHECKSUM`)


@dataclasses.dataclass(frozen=True)
class Preset:
    """A pretrained encoder: ``name`` (what `load_encoder` takes), ``run`` (its directory in
    ``results/scale/``), ``config`` (the pretraining flagfile and overrides), ``knn_top1``
    (module docstring), ``weights_blob`` / ``weights_sha256`` (the git blob and SHA-256 of its
    ``encoder.weights.h5``), ``feature`` (the one the score is for)."""

    name: str
    run: str
    method: str
    config: str
    seed: int
    knn_top1: float
    weights_blob: str
    weights_sha256: str
    backbone: str = "nin"
    dataset: str = "cifar10"
    feature: str = "block2"

    @property
    def directory(self) -> str:
        """The run directory (it may be absent: `preset_directory` checks)."""
        return os.path.join(PRESETS_ROOT, self.run)


_AETV1 = ("configs/cifar10_aetv1.cfg --optimizer=adam --learning_rate=1e-4 --lr_schedule=cosine "
          "--warmup_steps=1000 --adam_beta1=0.9 --adam_beta2=0.999")
_ZOOM16 = "AETv2, the angle in the 16x zoomed frame, no residual (recipes.AETV2_ZOOM16)"
#: The presets by name, best first (module docstring).
PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("aetv1_cifar10", "aetv1_lr1e-4", "AETv1 (MSE), Adam 1e-4", _AETV1, 0, 66.33,
           "036045a4f5edcc0fd9eed23fcfa78c10730e8fdc",
           "0f1bed775c87ccb2b11a2f16dedfb628929575051c7157b5fe4bd468bfd52028"),
    Preset("aetv1_cifar10_s2", "aetv1_lr1e-4_s2", "AETv1 (MSE), Adam 1e-4", _AETV1, 2, 66.73,
           "1832b2eb59399e0d675b3aa6daf012011252f3e1",
           "47e397f5bb420c0543889ec339c30d8b45a62aea9ec8052ecaa804fdb920734c"),
    Preset("aetv2_cifar10", "aetv2_recipe", _ZOOM16, "configs/cifar10_aetv2_zoom16.cfg", 0, 62.34,
           "300961c06aabca23f6050ba41759adb5cc1c7a54",
           "edc736974e3bda95908f5e4a345b3be01f2930e16f009ce6329f4224dbe0665c"),
    Preset("aetv2_cifar10_s2", "aetv2_recipe_s2", _ZOOM16, "configs/cifar10_aetv2_zoom16.cfg", 2,
           62.87, "bac3870527b8f26c8e90d71ab881bbc22b0f07cd",
           "0e014796620da709a97e03a1d6e41a8177aba10b8ad9490088246952bb7b9e70"),
    Preset("aetv2_paper_cifar10", "aetv2_paper", "AETv2 as the paper writes it",
           "configs/cifar10_aetv2_paper.cfg", 0, 54.16,
           "27a81bb533d4f2bd685831712df7cdd6d09df97f",
           "1a62e79a60067309b2b15fa9abdc0be12670353d805a937d26166c765f2d82c6"),
)}


def presets() -> dict[str, Preset]:
    """The presets by name (a copy of `PRESETS`)."""
    return dict(PRESETS)


def preset_directory(name: str) -> str:
    """The run directory of the preset `name`, its weights restored (`restore_weights`);
    KeyError for an unknown name (listing them), FileNotFoundError when the checkout's
    ``results/scale`` or the weights' git history is not there."""
    if name not in PRESETS:
        raise KeyError(f"no preset {name!r}; the presets: {sorted(PRESETS)}")
    directory = PRESETS[name].directory
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"preset {name!r} is the run directory {directory}, which is not there: the presets "
            "ship in results/scale/ of the git checkout, not in a wheel; clone the repository "
            "and `pip install -e .`, or pass the run directory itself")
    restore_weights(PRESETS[name])
    return directory


def restore_weights(preset: Preset) -> str:
    """``<preset directory>/encoder.weights.h5`` (and its ``.sha256``), restored from the git
    blob ``preset.weights_blob`` if absent (module docstring); returns its path. A file there
    whose SHA-256 is not ``preset.weights_sha256`` is refused, never replaced."""
    from aetv2_tf.files.digests import file_digest, sha256
    from aetv2_tf.files.safe_paths import write_atomically

    path = os.path.join(preset.directory, WEIGHTS)
    sidecar = f"{preset.weights_sha256}  {WEIGHTS}\n"
    if os.path.lexists(path):
        link = os.path.islink(path)
        if link or file_digest(path) != preset.weights_sha256:
            why = "it is a symbolic link" if link else \
                f"its SHA-256 is not {preset.weights_sha256}"
            raise FileNotFoundError(
                f"{path} is not preset {preset.name!r}'s encoder ({why}); it is left as it is: "
                "move it away and use the preset again to restore the preset's weights")
        if not os.path.isfile(path + CHECKSUM):
            write_atomically(path + CHECKSUM, sidecar)
        return path
    try:
        blob = subprocess.run(["git", "-C", REPOSITORY, "cat-file", "blob", preset.weights_blob],
                              capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        why = e.stderr.decode(errors="replace").strip() if isinstance(
            e, subprocess.CalledProcessError) else str(e)
        raise FileNotFoundError(
            f"preset {preset.name!r}: its weights are kept in the git history of {REPOSITORY} "
            f"(blob {preset.weights_blob}), which cannot be read here ({why}); use a clone with "
            "its history (not `git clone --depth`; `git fetch --unshallow` completes one) and "
            "git on the PATH, or pass a run directory itself") from e
    if sha256([blob]) != preset.weights_sha256:
        raise FileNotFoundError(f"preset {preset.name!r}: git blob {preset.weights_blob} is not "
                                f"its weights (SHA-256 differs); the repository is damaged")
    write_atomically(path + CHECKSUM, sidecar)  # the digest first, as `saving` does
    write_atomically(path, blob)
    return path


class UnknownPreset(ValueError):
    """A name that looks like a preset's (no path separator, not an existing path) but is none
    of `PRESETS`: the message lists them (and the closest)."""


def directory_of(name_or_directory: str | None) -> str | None:
    """A preset's name -> its run directory, anything else as given; nothing is read."""
    return PRESETS[name_or_directory].directory if name_or_directory in PRESETS \
        else name_or_directory


def resolve(name_or_directory: str | os.PathLike) -> str:
    """A preset name, or a preset's run directory, -> that directory, its weights restored
    (`preset_directory`); another existing path, or one with a path separator, -> as given; any
    other name (a mistyped preset, "aetv3") -> `UnknownPreset` listing the presets (a directory
    of that name is then ``./name``)."""
    text = os.fspath(name_or_directory)
    if text in PRESETS:
        return preset_directory(text)
    path = os.path.abspath(os.path.expanduser(text))
    for preset in PRESETS.values():
        if path == preset.directory:
            preset_directory(preset.name)
            return text
    separators = {os.sep, "/", *((os.altsep,) if os.altsep else ())}
    if os.path.lexists(text) or any(s in text for s in separators) or text.startswith("~"):
        return text
    import difflib

    close = difflib.get_close_matches(text, PRESETS, n=1, cutoff=0.4)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UnknownPreset(
        f"{text!r} is neither a preset nor an existing path: {hint}the presets are "
        f"{', '.join(PRESETS)} (aetv2_tf.presets()); for a directory, give its path (e.g. "
        f"./{text})")
