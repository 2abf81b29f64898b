"""Where images come from: local CIFAR-10, tensorflow-datasets, folders of class folders.

Nothing here downloads unless asked (``download=True``); offline, a missing dataset is a fast
:class:`DataError` that says how to prepare it. `load_source` is the programs' entry point. The
CIFAR-10 python files are read by a restricted unpickler (`data.cifar10_pickles`: a crafted file
is a DataError, nothing executed) and load on any Keras backend, without TensorFlow; only the
tensorflow-datasets and folder readers import TensorFlow.
"""

from __future__ import annotations

import os
import pathlib
import pickle
from typing import TYPE_CHECKING

import numpy as np

from aetv2_tf.data.cifar10_pickles import unpickle_batch
from aetv2_tf.data.image_folders import ImageFiles, decode_image_file, image_files, named

if TYPE_CHECKING:  # TensorFlow is imported lazily: the CIFAR-10 reader works without it.
    import tensorflow as tf

CIFAR10_DIRNAME = "cifar-10-batches-py"
CIFAR10_FILES = {
    "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test": ("test_batch",),
}
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
_CIFAR10_HELP = (
    "download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and "
    "extract it (tar xzf) so that DIR/cifar-10-batches-py/data_batch_1 exists, then pass DIR "
    "or DIR/cifar-10-batches-py"
)


class DataError(ValueError):
    """A dataset is missing, incomplete, corrupt or unsafe; the message says how to fix it."""


def _unpickle(path: pathlib.Path) -> dict:
    try:
        obj = unpickle_batch(path)
    except pickle.UnpicklingError as e:
        raise DataError(
            f"{path}: not unpickled ({e}); this is not an official CIFAR-10 batch (corrupt, or "
            f"crafted: nothing in it was executed); replace it: {_CIFAR10_HELP}"
        ) from e
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            MemoryError, OverflowError) as e:
        raise DataError(
            f"{path}: truncated or corrupt CIFAR-10 batch ({type(e).__name__}: {e}); "
            f"delete it and extract it again: {_CIFAR10_HELP}"
        ) from e
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a dict, got {type(obj).__name__}; {_CIFAR10_HELP}")
    return obj


def _batch_arrays(path: pathlib.Path, data, labels) -> tuple[np.ndarray, np.ndarray]:
    """A batch's ``data`` -> (N, 3072) uint8 and ``labels`` -> (N,) int64 in 0..9, checked
    before any conversion (a list reaches ``np.asarray`` only once its length and element types
    are known: `data.cifar10_pickles`). DataError naming ``path`` otherwise."""
    if not isinstance(data, np.ndarray):
        raise DataError(f"{path}: data is a {type(data).__name__}, expected a numpy (N, 3072) "
                        f"uint8 array (10,000 rows in an official batch); {_CIFAR10_HELP}")
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(
            f"{path}: data has shape {data.shape} dtype {data.dtype}, expected (N, 3072) "
            f"uint8; {_CIFAR10_HELP}"
        )
    n = data.shape[0]
    if n == 0:
        raise DataError(f"{path}: data holds no image (shape {data.shape}); an official batch "
                        f"holds 10,000; {_CIFAR10_HELP}")
    if isinstance(labels, list):
        if len(labels) != n or not all(type(v) is int for v in labels):
            kinds = sorted({type(v).__name__ for v in labels[:n + 1]})
            raise DataError(
                f"{path}: labels have shape ({len(labels)},) of {'/'.join(kinds) or 'nothing'}, "
                f"expected ({n},) integers, one per image; {_CIFAR10_HELP}")
        labels = np.asarray(labels, np.int64)
    elif not isinstance(labels, np.ndarray) or labels.shape != (n,) \
            or not np.issubdtype(labels.dtype, np.integer):
        what = (f"shape {labels.shape} dtype {labels.dtype}" if isinstance(labels, np.ndarray)
                else f"a {type(labels).__name__}")
        raise DataError(f"{path}: labels have {what}, expected ({n},) integers, one per image; "
                        f"{_CIFAR10_HELP}")
    if labels.min() < 0 or labels.max() > 9:
        raise DataError(f"{path}: labels outside 0..9; {_CIFAR10_HELP}")
    return data, labels.astype(np.int64)


def _cifar10_root(data_dir) -> pathlib.Path:
    """The ``cifar-10-batches-py`` directory given it or its parent; DataError if absent."""
    if data_dir is None:
        raise DataError(f"no CIFAR-10 directory given; {_CIFAR10_HELP}")
    path = pathlib.Path(data_dir).expanduser()
    if not path.is_dir():
        raise DataError(f"CIFAR-10 directory {path} does not exist; {_CIFAR10_HELP}")
    if (path / CIFAR10_DIRNAME).is_dir() and not (path / "data_batch_1").exists():
        path = path / CIFAR10_DIRNAME
    return path


def is_cifar10_dir(data_dir) -> bool:
    """True when ``data_dir`` (or its ``cifar-10-batches-py`` child) holds the python layout."""
    if data_dir is None:
        return False
    path = pathlib.Path(data_dir).expanduser()
    return any((p / "data_batch_1").is_file() or (p / "test_batch").is_file()
               for p in (path, path / CIFAR10_DIRNAME))


def load_cifar10(data_dir, split: str = "train",
                 limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 images (N, 32, 32, 3) uint8 RGB and labels (N,) int64 in 0..9, in the official
    order, from the python layout in ``data_dir`` (``cifar-10-batches-py`` or its parent):
    ``split`` ``"train"`` (50000 images) or ``"test"`` (10000); ``limit``: only the first images
    (only the files holding them read). DataError, naming the file and the fix, for a missing
    directory or file, a truncated, corrupt or unsafe pickle, or arrays of the wrong shape.
    """
    if split not in CIFAR10_FILES:
        raise DataError(f"CIFAR-10 split must be one of {sorted(CIFAR10_FILES)}, got {split!r}")
    root = _cifar10_root(data_dir)
    paths = [root / name for name in CIFAR10_FILES[split]]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"CIFAR-10 directory {root} lacks {', '.join(missing)}; {_CIFAR10_HELP}")
    images, labels = [], []
    for path in paths:
        if limit and sum(map(len, labels)) >= limit:
            break
        batch = _unpickle(path)
        if b"data" not in batch or b"labels" not in batch:
            raise DataError(f"{path}: no b'data'/b'labels' entries; {_CIFAR10_HELP}")
        data, label = _batch_arrays(path, batch[b"data"], batch[b"labels"])
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(label.astype(np.int64))
    images, labels = np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels)
    return (images[:limit], labels[:limit]) if limit else (images, labels)


def load_tfds(name: str, split: str, data_dir=None, download: bool = False,
              shuffle_seed: int | None = None) -> tf.data.Dataset:
    """A tensorflow-datasets split as a ``tf.data.Dataset`` of (image uint8 (H, W, 3), label int64),
    its files in a seeded order reshuffled every iteration with ``shuffle_seed``, else stored
    order. ``download=False``: the prepared data must be in ``data_dir`` (default
    ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``), checked before any network access
    (DataError: how to prepare it); ``download=True`` runs ``download_and_prepare``."""
    import tensorflow_datasets as tfds  # slow import, only when used

    try:
        builder = tfds.builder(name, data_dir=None if data_dir is None else os.fspath(data_dir),
                               try_gcs=False)
    except Exception as e:  # unknown name, bad config
        raise DataError(f"tensorflow-datasets has no dataset {name!r}: {e}") from e
    if not builder.is_prepared():
        if not download:
            raise DataError(
                f"tensorflow-datasets {name!r} is not prepared in {builder.data_dir} and "
                f"download=False; prepare it on a machine with internet access "
                f"(`tfds build {name} --data_dir DIR`, or pass download=True; ImageNet/Places need "
                f"their archives in DIR/downloads/manual) and pass data_dir=DIR"
            )
        builder.download_and_prepare()
    if shuffle_seed is None:
        return builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)
    config = tfds.ReadConfig(shuffle_seed=shuffle_seed, shuffle_reshuffle_each_iteration=True)
    return builder.as_dataset(split=split, as_supervised=True, shuffle_files=True,
                              read_config=config)


def _entries(folder: pathlib.Path) -> list[os.DirEntry]:
    """The entries of ``folder``, sorted by name; DataError naming it when it cannot be read."""
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise DataError(f"image folder {folder} cannot be read ({e.strerror or e}); give this "
                        "user read and execute permission on it (chmod a+rx), or remove it") from e


def shown(path: str) -> str:
    """A file name as shown: its bytes decoded as UTF-8, any other byte as ``\\xNN`` (Python's
    surrogates for undecodable bytes cannot be printed or given to TensorFlow)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _check_name(folder: pathlib.Path, path: str) -> None:
    """DataError when the name ``path`` is not valid UTF-8 (TensorFlow reads UTF-8 paths only)."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"image folder {shown(os.fspath(folder))}: the name {shown(path)} is "
                        "not valid UTF-8 (its undecodable bytes shown as \\xNN); TensorFlow "
                        "reads UTF-8 file names only: rename it (e.g. convmv -f latin1 -t utf8 "
                        "--notest -r FOLDER) or remove it") from None


def _kind(folder: pathlib.Path, entry: os.DirEntry) -> str:
    """"dir", "file" or "other" for ``entry`` of ``folder``, links followed; DataError naming
    a symbolic link that loops or whose target cannot be read."""
    try:
        return "dir" if entry.is_dir() else "file" if entry.is_file() else "other"
    except OSError as e:
        target = os.readlink(entry.path) if entry.is_symlink() else "?"
        raise DataError(f"image folder {shown(os.fspath(folder))}: {shown(entry.name)} is a "
                        f"symbolic link to {shown(target)} that cannot be followed "
                        f"({e.strerror or e}: a loop, or its target unreadable); remove the "
                        "link or point it at a real folder or image") from e


def _unread_reason(name: str, kind: str) -> str | None:
    """Why the entry ``name`` of a class folder, of `_kind` ``kind``, is not read as an image;
    None for a file of `IMAGE_EXTENSIONS`."""
    extension = os.path.splitext(name)[1].lower()
    if kind == "dir":
        return "a folder: the images of a class are the files of its folder"
    if kind != "file":
        return "not a regular file (a device, a pipe, a socket, or a link to one)"
    if extension not in IMAGE_EXTENSIONS:
        return (f"unsupported format {extension or '(no extension)'}; supported: "
                f"{' '.join(IMAGE_EXTENSIONS)}")
    return None


def _class_folders(folder: pathlib.Path) -> tuple[list[str], list[tuple[str, str]]]:
    """The class sub-directories of ``folder``, sorted, and its other entries with why they are
    not read (``(path, reason)``). A symbolic link to another directory is a class like any
    other; one to ``folder`` or a folder containing it (``/``, the dataset's root), or one that
    loops, is refused (DataError)."""
    real = folder.resolve()
    names, unread = [], []
    for entry in _entries(folder):
        if _kind(folder, entry) != "dir":
            unread.append((shown(entry.path), f"not a class folder: those of {folder} are its "
                                              "sub-folders"))
            continue
        _check_name(folder, entry.name)
        if entry.is_symlink():
            target = pathlib.Path(entry.path).resolve()
            if real.is_relative_to(target):
                raise DataError(
                    f"image folder {folder}: class folder {entry.name} is a symbolic link to "
                    f"{target}, which contains the image folder itself; remove the link or "
                    f"point it at the class's own folder")
        names.append(entry.name)
    return names, unread


def list_image_folder(root, split: str | None = None, min_classes: int = 2) -> ImageFiles:
    """The checked files of ``root/split/<class>/*`` with ``IMAGE_EXTENSIONS`` (any case), in
    sorted (class, file name) order; label ``i`` is ``class_names[i]`` (sorted sub-directory
    names); undecodable files and every other entry (`_unread_reason`) left out, named in the
    log and in ``skipped``. DataError, naming the folder and the fix, for an unreadable folder,
    a bad link, a name that is not UTF-8, fewer than ``min_classes`` classes (one class would
    make a probe's top-1 100%; unlabelled images are one folder, ``min_classes=1``), or a class
    folder with no decodable image.
    """
    base = pathlib.Path(root).expanduser()
    folder = base / split if split else base
    if not folder.is_dir():
        raise DataError(
            f"image folder {folder} does not exist; expected ROOT/{split or ''}/<class>/<image> "
            f"with one sub-directory per class"
        )
    class_names, unread = _class_folders(folder)
    if len(class_names) < min_classes:
        unlabelled = " (images without labels: one sub-directory holding them all)" \
            if min_classes == 1 else ""
        raise DataError(f"image folder {folder} has {len(class_names)} class sub-director"
                        f"{'y' if len(class_names) == 1 else 'ies'} ({', '.join(class_names)}); "
                        f"expected ROOT/<split>/<class>/<image> with at least {min_classes} "
                        f"class{'es' if min_classes > 1 else ''}{unlabelled}")
    paths, labels = [], []
    for label, name in enumerate(class_names):
        entries = [(e.path, _unread_reason(e.name, _kind(folder / name, e)))
                   for e in _entries(folder / name)]
        files = [path for path, reason in entries if reason is None]
        others = [(shown(path), reason) for path, reason in entries if reason is not None]
        for path in files:
            _check_name(folder, path)
        if not files:
            raise DataError(f"image folder {folder}: class folder {name} holds no image "
                            f"{IMAGE_EXTENSIONS}{'; it holds ' if others else ''}"
                            f"{named(others, 3)}; add its images or remove the folder")
        paths += files
        labels += [label] * len(files)
        unread += others
    try:
        files = image_files(paths, np.asarray(labels, np.int64), class_names, os.fspath(folder),
                            unread)
    except OSError as e:
        raise DataError(f"image folder {folder}: {e.filename or 'a file'} cannot be read "
                        f"({e.strerror or e}); check the disk or the network file system, or "
                        "remove the file.") from e
    if not len(files.paths):
        raise DataError(f"image folder {folder}: none of its {len(paths)} images can be decoded "
                        f"(first: {files.skipped[0][0]}: {files.skipped[0][1]})")
    empty = sorted(set(class_names) - {class_names[i] for i in np.unique(files.labels)})
    if empty:
        raise DataError(f"image folder {folder}: no image of class folder(s) {', '.join(empty)} "
                        "can be decoded (see the skipped files above); replace them or remove "
                        "the folder(s)")
    return files


def load_image_folder(root, split: str | None = None) -> tf.data.Dataset:
    """``root/split/<class>/<image>`` as a dataset of (image uint8 (h, w, 3) RGB of its own
    size, label int64), in the order of :func:`list_image_folder`."""
    import tensorflow as tf

    files = list_image_folder(root, split)
    ds = tf.data.Dataset.from_tensor_slices((files.paths, files.labels))
    return ds.map(tf.autograph.experimental.do_not_convert(decode_image_file),
                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


_TFDS_NAMES = {"imagenet2012": "imagenet2012", "imagenet": "imagenet2012",
               "places365_small": "places365_small", "places365": "places365_small"}


def _cifar10(data_dir, split: str, download: bool, limit: int | None):
    """CIFAR-10 as numpy arrays: the python layout if ``data_dir`` holds it, else a prepared
    tensorflow-datasets copy in ``data_dir`` (read whole; ``limit`` applies to the former)."""
    if is_cifar10_dir(data_dir):
        return load_cifar10(data_dir, split, limit)
    if data_dir is not None and "://" not in os.fspath(data_dir) \
            and not os.path.isdir(os.fspath(data_dir)):
        raise DataError(f"--data_dir={data_dir} does not exist; {_CIFAR10_HELP}")
    try:
        import tensorflow as tf
    except ImportError as e:
        raise DataError(f"--data_dir={data_dir} does not hold the CIFAR-10 python layout "
                        f"(data_batch_1..5, test_batch), and reading a tensorflow-datasets "
                        f"copy needs TensorFlow, which is not importable here ({e}); "
                        f"{_CIFAR10_HELP}") from e
    if data_dir is not None and not tf.io.gfile.isdir(os.fspath(data_dir)):
        raise DataError(f"--data_dir={data_dir} does not exist; {_CIFAR10_HELP}")
    try:
        ds = load_tfds("cifar10", split, data_dir, download)
    except DataError as e:
        raise DataError(f"--data_dir={data_dir} holds neither the CIFAR-10 python layout "
                        f"(data_batch_1..5, test_batch) nor a prepared tensorflow-datasets "
                        f"cifar10 ({e}); {_CIFAR10_HELP}") from e
    images, labels = [], []
    for image, label in ds.batch(10_000).as_numpy_iterator():
        images.append(image)
        labels.append(label)
    return np.concatenate(images).astype(np.uint8), np.concatenate(labels).astype(np.int64)


def load_source(dataset: str, data_dir=None, split: str = "train", download: bool = False,
                shuffle_seed: int | None = None, min_classes: int = 2,
                limit: int | None = None):
    """Load a dataset by name.

    * ``"cifar10"``: numpy ``(images (N, 32, 32, 3) uint8, labels (N,) int64)`` from the python
      layout (its first ``limit`` images, only the files holding them read) or from
      tensorflow-datasets in ``data_dir`` (`_cifar10`);
    * ``"imagenet2012"``, ``"places365_small"``: a ``tf.data.Dataset`` of (image uint8
      (h, w, 3), label int64) from tensorflow-datasets (`load_tfds`);
    * ``"folder"``: the checked file list (`ImageFiles`) of ``data_dir/split/<class>/*`` with at
      least ``min_classes`` classes (:func:`list_image_folder`).
    """
    name = dataset.lower()
    if name == "cifar10":
        return _cifar10(data_dir, split, download, limit)
    if name in _TFDS_NAMES:
        return load_tfds(_TFDS_NAMES[name], split, data_dir, download, shuffle_seed)
    if name == "folder":
        if data_dir is None:
            raise DataError("dataset 'folder' needs data_dir=ROOT holding ROOT/<split>/<class>/")
        return list_image_folder(data_dir, split, min_classes)
    raise DataError(
        f"unknown dataset {dataset!r}; choose cifar10, imagenet2012, places365_small or folder"
    )
