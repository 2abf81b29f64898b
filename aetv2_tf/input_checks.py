"""Inputs checked at the door: images, labels, feature names and the backend (library code).

The library's raw-image entry points (``fit`` / ``evaluate`` / ``predict`` and ``*_on_batch`` of
`models.pretext.PairsModel` and of `build_classifier` / `feature_extractor` models, through
`models.checked_inputs.ChecksInputs`; `probes.knn.pooled_features`) take **uint8 images
(N, H, W, 3), NHWC, RGB, values 0..255** and normalise them themselves. Anything else would be
cast to uint8 silently (a [0, 1] float image becomes black) or fail deep inside a layer; these
functions refuse it up front, naming the problem and the fix (the conversion of floats, the
transpose of NCHW, ``x[None]`` for one image, ``labels.argmax(-1)`` for one-hot labels).

Errors: `errors.UsageError` (a ValueError) for a bad value, dtype, shape or name; TypeError when
the object is not an array (or not a name) at all; RuntimeError for the wrong backend. Nothing
here imports TensorFlow: a ``tf.data.Dataset`` is recognised by its type's module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from aetv2_tf.errors import UsageError

UINT8_RULE = "uint8 images (N, H, W, 3), NHWC, RGB, values 0..255 (normalised by the library)"
SELF_SUPERVISED = "the model is self-supervised: the pairs are the targets; pass the images only"


def _dtype_name(dtype: Any) -> str:
    """'float32', 'uint8', ... for a NumPy, TensorFlow or JAX dtype."""
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else np.dtype(dtype).name


def _kind(dtype: str) -> str:
    """'float' (float*, bfloat16), 'int' (int*, uint*) or 'other' (bool, str, object...)."""
    return "float" if "float" in dtype else "int" if dtype.startswith(("int", "uint")) \
        else "other"


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _unwrapped(x: Any) -> Any:
    """The value of a one-entry dict (``{"images": x}``) or of Keras's one-tuple ``(x,)``."""
    if isinstance(x, dict) and len(x) == 1:
        x = next(iter(x.values()))
    return x[0] if isinstance(x, tuple) and len(x) == 1 else x


def is_tf_dataset(x: Any) -> bool:
    """Whether `x` is a ``tf.data.Dataset`` (or a distributed one), without importing TF."""
    return hasattr(x, "element_spec") and type(x).__module__.startswith("tensorflow")


def _check_shape(shape: Sequence, name: str, expected_hw: Sequence | None,
                 batch_fix: str = "x[None]") -> None:
    """NHWC with 3 channels and, when fixed, the expected (H, W); None dims pass. `batch_fix`:
    how to make a batch of one image (an array: ``x[None]``; a dataset: ``dataset.batch(n)``)."""
    shape = tuple(None if d is None else int(d) for d in shape)
    if len(shape) == 3 and shape[-1] == 3:
        raise UsageError(f"{name}: shape {shape} is one image; pass a batch (N, H, W, 3), "
                         f"e.g. {batch_fix}")
    if len(shape) != 4:
        raise UsageError(f"{name}: shape {shape}; expected a batch of {UINT8_RULE}")
    if shape[1] == 3 and shape[-1] != 3:
        raise UsageError(f"{name}: shape {shape} looks channels-first (NCHW); the library takes "
                         "NHWC (N, H, W, 3): np.transpose(x, (0, 2, 3, 1))")
    if shape[-1] not in (3, None):
        fix = " (grayscale: np.repeat(x, 3, axis=-1))" if shape[-1] == 1 else ""
        raise UsageError(f"{name}: shape {shape} has {shape[-1]} channels; expected 3 (RGB, "
                         f"NHWC){fix}")
    if expected_hw is not None:
        want = tuple(None if d is None else int(d) for d in expected_hw)[:2]
        got = shape[1:3]
        if any(w is not None and g is not None and w != g for w, g in zip(want, got, strict=True)):
            raise UsageError(f"{name}: images of {got[0]}x{got[1]} pixels; the encoder takes "
                             f"{want[0]}x{want[1]} (N, {want[0]}, {want[1]}, 3): resize or crop "
                             f"them, or build the encoder for this size "
                             f"(build_backbone(..., input_shape=({got[0]}, {got[1]}, 3)))")


def _dtype_fix(dtype: str, low: float | None = None, high: float | None = None) -> str:
    """The message for images of a dtype other than uint8 (their range when known)."""
    if _kind(dtype) == "other":
        return f"{dtype} images; expected {UINT8_RULE}"
    if low is None:
        return (f"{dtype} images; expected {UINT8_RULE}. Floats in [0, 1]: "
                "(x * 255).round().astype(\"uint8\") (tf.data: dataset.map(lambda x: "
                "tf.cast(tf.round(x * 255), tf.uint8))); values in [0, 255]: "
                ".astype(\"uint8\") (tf.cast(x, tf.uint8))")
    where = f"{dtype} images with values in [{low:.4g}, {high:.4g}]"
    if low < 0:
        return (f"{where}: they look normalised already; pass the raw {UINT8_RULE} (the library "
                "applies the mean and std itself)")
    if high <= 1.0 and _kind(dtype) == "float":
        return (f"{where}; expected {UINT8_RULE}: "
                "(x * 255).round().astype(\"uint8\")")
    if high <= 255:
        return f"{where}; expected {UINT8_RULE}: x.astype(\"uint8\")"
    return (f"{where}: above 255, not 8-bit pixels; expected {UINT8_RULE} (rescale them to "
            "0..255, then .astype(\"uint8\"))")


def check_images(images: Any, *, name: str = "images", expected_hw: Sequence | None = None,
                 uint8: bool = True) -> Any:
    """`images` (an array, a backend tensor returned as it is, or an array-like converted with
    ``np.asarray``) checked: ``(N, H, W, 3)`` NHWC of ``expected_hw`` (None entries: any size)
    and, with ``uint8``, dtype uint8. `name`: how the message calls them (``"fit: x"``).

    Raises TypeError (not an array of numbers) or UsageError: wrong dtype (with the range and
    the conversion), rank, layout (NCHW), channels or size.
    """
    if not _is_array(images):
        if isinstance(images, (str, bytes, dict)) or not isinstance(images, Iterable):
            raise TypeError(f"{name}: expected an array of {UINT8_RULE}, got "
                            f"{type(images).__name__}")
        images = np.asarray(images)
    dtype = _dtype_name(images.dtype)
    if dtype == "object" or dtype.startswith(("str", "bytes")):
        raise TypeError(f"{name}: an array of {dtype}, not of numbers; expected {UINT8_RULE}")
    _check_shape(images.shape, name, expected_hw)
    if uint8 and dtype != "uint8":
        try:  # only on the way to an error: the range, in one pass (a symbolic tensor has none)
            values = np.asarray(images)
        except Exception:  # noqa: BLE001 - a tensor being traced, a KerasTensor
            values = np.zeros(0)
        if _kind(dtype) == "other" or not values.size or values.dtype == object:
            raise UsageError(f"{name}: " + _dtype_fix(dtype))
        raise UsageError(f"{name}: " + _dtype_fix(dtype, float(values.min()),
                                                  float(values.max())))
    return images


NORMALISED_RULE = ("NORMALISED float images (N, H, W, 3), (u / 255 - mean) / std with the "
                   "mean and std of aetv2_tf.preprocessing(<its directory or preset>)")


def check_normalised_images(images: Any, *, name: str = "images",
                            expected_hw: Sequence | None = None) -> None:
    """What an encoder on normalised images (`saving.load_encoder`'s) is given: an array or a
    ``tf.data.Dataset`` (its ``element_spec`` only) of float NHWC images of the encoder's size.
    Raw pixels are refused with the fix: integer images, and float images with no value below 0
    (a normalised batch is negative wherever a pixel is darker than the mean; a batch brighter
    than the mean everywhere is refused too: ``encoder(keras.ops.convert_to_tensor(x))`` skips
    the check)."""
    fix = ("give uint8 images to aetv2_tf.feature_extractor(encoder, feature, "
           "**aetv2_tf.preprocessing(p)) or build_classifier, which normalise them, or "
           "normalise them yourself")
    images = _unwrapped(images)
    if is_tf_dataset(images):
        spec = images.element_spec
        spec = spec[0] if isinstance(spec, (tuple, list)) and spec else spec
        if hasattr(spec, "dtype") and _kind(_dtype_name(spec.dtype)) != "float":
            raise UsageError(f"{name}: the dataset holds {_dtype_name(spec.dtype)} images; this "
                             f"encoder takes {NORMALISED_RULE}; {fix}")
        return
    if not _is_array(images):
        return  # a generator or a PyDataset: Keras judges it
    dtype = _dtype_name(images.dtype)
    _check_shape(images.shape, name, expected_hw)
    if _kind(dtype) != "float":
        raise UsageError(f"{name}: {dtype} images (raw pixels); this encoder takes "
                         f"{NORMALISED_RULE}; {fix}")
    values = np.asarray(images)
    if values.size and float(values.min()) >= 0:
        raise UsageError(f"{name}: {dtype} images with values in [{float(values.min()):.4g}, "
                         f"{float(values.max()):.4g}], none below 0: raw pixels, not normalised "
                         f"(features would differ without a word); this encoder takes "
                         f"{NORMALISED_RULE}; {fix}")


def check_image_dataset(dataset: Any, *, name: str = "dataset",
                        expected_hw: Sequence | None = None, labels: bool = True) -> None:
    """Checks a ``tf.data.Dataset``'s ``element_spec`` (no element is read): its images (the
    element, or its first component) uint8 ``(B, H, W, 3)`` as `check_images`; with
    ``labels=False`` an element ``(images, labels, ...)`` is refused (self-supervised)."""
    spec = dataset.element_spec
    if isinstance(spec, (tuple, list)):
        if len(spec) > 1 and not labels:
            raise UsageError(f"{name}: its elements are a tuple of {len(spec)} (images, "
                             f"labels, ...); {SELF_SUPERVISED}, e.g. dataset.map(lambda x, y: x)")
        spec = spec[0] if spec else spec
    if isinstance(spec, dict) and len(spec) == 1:
        spec = next(iter(spec.values()))
    if not (hasattr(spec, "shape") and hasattr(spec, "dtype")):
        return  # a structure the model itself will judge
    _check_shape(tuple(spec.shape), name, expected_hw,
                 batch_fix="dataset.batch(n) (unbatched elements: one image each)")
    dtype = _dtype_name(spec.dtype)
    if dtype != "uint8":
        raise UsageError(f"{name}: " + _dtype_fix(dtype))


def check_pretext_inputs(x: Any, y: Any = None, *, name: str = "fit",
                         expected_hw: Sequence | None = None, allow_labels: bool = False) -> None:
    """What `models.pretext.PairsModel` is given: `x` uint8 ``(N, H, W, 3)`` (an array, a
    tensor, ``{"images": array}`` or a ``tf.data.Dataset`` of image batches) and no labels: a
    `y`, or a dataset of ``(images, labels)``, is refused unless ``allow_labels`` (``predict``).
    Other inputs (a ``keras.utils.PyDataset``, a generator) pass unchecked."""
    if y is not None and not allow_labels:
        method = name.split(".")[-1]
        raise UsageError(f"{name}: y was given (labels?); {SELF_SUPERVISED}: "
                         f"model.{method}(images), without y")
    x = _unwrapped(x)
    if is_tf_dataset(x):
        check_image_dataset(x, name=f"{name}: the dataset", expected_hw=expected_hw,
                            labels=allow_labels)
    elif isinstance(x, (tuple, list)) and len(x) > 1 and _is_array(x[0]) and \
            len(x[0].shape) == 4 and not allow_labels:
        raise UsageError(f"{name}: got a tuple of {len(x)} (images, labels?); {SELF_SUPERVISED}")
    elif _is_array(x) or isinstance(x, (tuple, list, str, bytes)):
        check_images(x, name=f"{name}: x", expected_hw=expected_hw)


def _check_label_spec(spec: Any, name: str) -> None:
    """A dataset's label spec: class indices ``(B,)`` / ``(B, 1)``, not one-hot ``(B, C)``."""
    shape = tuple(getattr(spec, "shape", ()) or ())
    if len(shape) == 2 and shape[-1] not in (1, None):
        raise UsageError(f"{name}: labels of shape {shape} look one-hot (or class scores); "
                         "pass the class indices (B,): dataset.map(lambda x, y: "
                         "(x, tf.argmax(y, -1)))")


def check_supervised_inputs(x: Any, y: Any = None, *, name: str = "fit",
                            expected_hw: Sequence | None = None,
                            num_classes: int | None = None) -> None:
    """What a `build_classifier` model's ``fit`` / ``evaluate`` is given: `x` as
    `check_pretext_inputs`, with class labels: an array `y` (`check_labels`, below
    `num_classes`) or a ``tf.data.Dataset`` of ``(images, labels)`` batches. Images without
    labels are refused; a ``keras.utils.PyDataset`` or a generator passes unchecked."""
    x = _unwrapped(x)
    if is_tf_dataset(x):
        check_image_dataset(x, name=f"{name}: the dataset", expected_hw=expected_hw)
        spec = x.element_spec
        if not isinstance(spec, (tuple, list)) or len(spec) < 2:
            raise UsageError(f"{name}: the dataset's elements are images only; a classifier "
                             "needs (images, labels) batches, e.g. tf.data.Dataset."
                             "from_tensor_slices((images, labels)).batch(n)")
        _check_label_spec(spec[1], f"{name}: the dataset")
        return
    if not (_is_array(x) or isinstance(x, (list, str, bytes))):
        return
    images = check_images(x, name=f"{name}: x", expected_hw=expected_hw)
    if y is None:
        raise UsageError(f"{name}: no labels; a classifier needs integer class labels: "
                         f"model.{name.split('.')[-1]}(images, labels)")
    labels = check_labels(y, len(images), name=f"{name}: y", what="images")
    if num_classes is not None and labels.size and \
            (labels.min() < 0 or labels.max() >= num_classes):
        raise UsageError(f"{name}: y holds labels in [{labels.min()}, {labels.max()}]; the "
                         f"model has {num_classes} classes: 0..{num_classes - 1}")


def check_labels(labels: Any, n: int | None = None, *, name: str = "labels",
                 what: str = "examples") -> np.ndarray:
    """Class labels -> int64 ``(N,)``: integers (floats only with whole values), shape ``(N,)``
    or ``(N, 1)``; one-hot or probabilities ``(N, C)`` refused (``labels.argmax(-1)``); with
    `n`, exactly `n` of them (one per ``what``: e.g. "training features")."""
    if isinstance(labels, (str, bytes, dict)):
        raise TypeError(f"{name}: expected an array of integer class labels, got "
                        f"{type(labels).__name__}")
    try:
        array = np.asarray(labels)
    except Exception as e:  # noqa: BLE001 - a tensor of another device, a ragged list...
        raise TypeError(f"{name}: not an array of integer class labels ({e})") from e
    if array.dtype == bool:
        raise UsageError(f"{name}: boolean labels; expected integer class indices (N,), e.g. "
                         "labels.astype(\"int64\") for two classes")
    if array.dtype == object or not np.issubdtype(array.dtype, np.number):
        raise TypeError(f"{name}: an array of {array.dtype}, not of integer class labels")
    if array.ndim == 2 and array.shape[1] > 1:
        raise UsageError(f"{name}: shape {array.shape} looks one-hot (or class scores); pass "
                         "the class indices (N,): labels.argmax(-1)")
    if array.ndim == 2:
        array = array[:, 0]
    if array.ndim != 1:
        raise UsageError(f"{name}: shape {array.shape}; expected integer class labels (N,)")
    if not np.issubdtype(array.dtype, np.integer):
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise UsageError(f"{name}: {array.dtype} values that are not whole numbers; expected "
                             "integer class indices (N,), e.g. labels.astype(\"int64\")")
        if array.size and np.abs(array).max() >= 2**53:  # past exact floats: not a class index
            raise UsageError(f"{name}: {array.dtype} values up to {np.abs(array).max():.3g}, "
                             "not class indices; expected integer class indices (N,)")
    if n is not None and array.shape[0] != n:
        raise UsageError(f"{name}: {array.shape[0]} labels for {n} {what}; pass one class "
                         "index per row, in the same order")
    return array.astype(np.int64)


def check_feature(feature: Any, available: Iterable[str], *, model: str = "the encoder") -> str:
    """`feature` if it is one of `available` (an encoder's output names), else a UsageError
    (ValueError) that lists them; TypeError when it is not a string."""
    names = sorted(available)
    if not isinstance(feature, str):
        raise TypeError(f"feature must be a name, one of {names}; got {type(feature).__name__}")
    if feature not in names:
        raise UsageError(f"unknown feature {feature!r}: {model} outputs {names}; pass one of "
                         "them")
    return feature


def require_backend(backend: str, what: str, instead: str = "") -> None:
    """RuntimeError unless Keras runs on `backend` (e.g. "tensorflow"): names
    ``KERAS_BACKEND=<backend>`` and, when given, what to do instead."""
    import keras

    current = keras.backend.backend()
    if current != backend:
        raise RuntimeError(f"{what} needs KERAS_BACKEND={backend}; this process runs Keras on "
                           f"{current!r}." + (f" Instead: {instead}" if instead else ""))
