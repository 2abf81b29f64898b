"""Models that check what they are given (`aetv2_tf.input_checks`) at every entry: on raw uint8
images (`ChecksInputs`), and encoders on normalised images (`ChecksNormalisedInputs`).

`ChecksInputs` goes before `keras.Model` in the bases of a functional model on uint8 images
(`models.pretext.PairsModel`, `models.image_models.CheckedModel`): every entry (``fit``,
``evaluate``, ``predict``, the ``*_on_batch`` methods, a call) checks the images (uint8 NHWC of
the model's size; Keras would cast [0, 1] floats to black images) and, by `labels`, the labels:
``"none"`` (`input_checks.check_pretext_inputs`: a ``y`` refused), ``"classes"``
(`input_checks.check_supervised_inputs`: integer class labels, one-hot refused) or ``"any"``.

Both mixins treat the batch alike (`BatchSizes`): ``x=None`` or a list of arrays is refused with
the fix; an empty batch gives an empty result (``predict``, a call; ``fit``/``evaluate`` refuse
it); inference runs batches in slices of at most `MAX_ACTIVATION_VALUES` values per layer
output, training refuses a batch past `TRAINING_VALUES_LIMIT` (TensorFlow's CPU kernels
segfault past 2**31 - 1 values in one output, docs/reliability.md). No TensorFlow import.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aetv2_tf.errors import UsageError

LABELS = ("none", "classes", "any")
#: The most values one layer's output holds for one slice of an inference batch (1 GiB of
#: float32): far below the crash at 2**31 values, and a bounded memory on any machine.
MAX_ACTIVATION_VALUES = 2**28
#: The most values one layer's output may hold for one training batch: TensorFlow's int32 limit.
TRAINING_VALUES_LIMIT = 2**31 - 1


def values_per_image(model: Any, hw: tuple) -> int:
    """The most values any layer of `model` (nested models included) outputs for one image of
    height and width `hw` (an unknown dimension counts as the larger of `hw`)."""
    import keras

    largest, side = 1, max(int(d) for d in hw)
    for layer in model.layers:
        try:
            outputs = keras.tree.flatten(layer.output)
        except (AttributeError, ValueError):  # a layer of several calls: its nodes differ
            outputs = []
        for output in outputs:
            shape = tuple(output.shape)[1:]
            largest = max(largest, math.prod(side if d is None else int(d) for d in shape))
        if isinstance(layer, keras.Model):
            largest = max(largest, values_per_image(layer, hw))
    return largest


class BatchSizes:
    """The batch rules of both mixins (module docstring)."""

    def _hw(self, images: Any) -> tuple:
        return tuple(d if d is not None else images.shape[1 + i]
                     for i, d in enumerate(self.inputs[0].shape[1:3]))

    def largest_batch(self, images: Any, training: bool = False) -> int:
        """The most images of `images`' size one call may take (module docstring)."""
        limit = TRAINING_VALUES_LIMIT if training else MAX_ACTIVATION_VALUES
        return max(1, limit // values_per_image(self, self._hw(images)))

    def _refuse_missing(self, method: str, x: Any, sequences: tuple = (list,)) -> None:
        """`x` None, or one of `sequences` (a list of images; a call takes no tuple either),
        refused with the fix."""
        name = f"{type(self).__name__} {self.name!r}.{method}"
        if x is None:
            raise UsageError(f"{name}: x is None; pass a batch of images (N, H, W, 3)")
        if isinstance(x, sequences):
            raise UsageError(f"{name}: x is a {type(x).__name__} of {len(x)} items; the model "
                             "takes one batch array of images (N, H, W, 3): np.stack(x)")

    def _refuse_large_training_batch(self, method: str, images: Any, batch_size: int) -> None:
        most = self.largest_batch(images, training=True)
        if batch_size > most:
            height, width = self._hw(images)
            raise UsageError(f"{type(self).__name__} {self.name!r}.{method}: a training batch of "
                             f"{batch_size} images of {height}x{width} pixels would make a "
                             f"layer output of more than {TRAINING_VALUES_LIMIT:,} values, "
                             f"which TensorFlow's kernels cannot index (the process crashes); "
                             f"pass batch_size={most} or less")

    def _empty(self, images: Any, as_numpy: bool) -> Any:
        """The model's outputs for the empty batch `images`: zeros of shape ``(0, ...)``."""
        import keras

        spec = self.compute_output_spec(keras.KerasTensor(tuple(images.shape),
                                                          dtype=images.dtype))
        make = (lambda s: np.zeros(s.shape, s.dtype)) if as_numpy else \
            (lambda s: keras.ops.zeros(s.shape, s.dtype))
        return keras.tree.map_structure(make, spec)

    def _call_in_slices(self, images: Any, args: tuple, kwargs: dict) -> Any:
        """`Layer.__call__` on `images` (an array or tensor of known batch size), an empty batch
        answered with zeros and a large one in slices (module docstring)."""
        import keras

        training = kwargs.get("training", args[0] if args else None)
        n = images.shape[0]
        if n is None:  # a tensor being traced: its batch is the caller's (predict's: capped)
            return super().__call__(images, *args, **kwargs)
        if n == 0:
            return self._empty(images, as_numpy=False)
        if training is True:
            self._refuse_large_training_batch("__call__", images, n)
        if training not in (None, False):  # training, or a flag known only when it runs
            return super().__call__(images, *args, **kwargs)
        step = self.largest_batch(images)
        if n <= step:
            return super().__call__(images, *args, **kwargs)
        parts = [super(BatchSizes, self).__call__(images[i:i + step], *args, **kwargs)
                 for i in range(0, n, step)]
        return keras.tree.map_structure(lambda *p: keras.ops.concatenate(p, axis=0), *parts)

    def _predicted(self, method: str, x: Any, batch_size: int | None, run) -> Any:
        """`run(batch_size)` (Keras's predict or evaluate) on checked `x`: an empty array
        answered with zeros (predict) or refused (evaluate), the batch size capped."""
        if not hasattr(x, "shape") or len(x.shape) != 4:
            return run(batch_size)
        if x.shape[0] == 0:
            if method == "predict":
                return self._empty(x, as_numpy=True)
            raise UsageError(f"{type(self).__name__} {self.name!r}.{method}: no images (an "
                             "empty batch); pass at least one")
        return run(min(batch_size or 32, self.largest_batch(x)))

    def _fitted(self, method: str, x: Any, batch_size: int | None) -> None:
        """Refuses an empty array or a training batch past `TRAINING_VALUES_LIMIT`."""
        if not hasattr(x, "shape") or len(x.shape) != 4:
            return
        if x.shape[0] == 0:
            raise UsageError(f"{type(self).__name__} {self.name!r}.{method}: no images (an empty "
                             "batch); pass at least one")
        size = x.shape[0] if method == "train_on_batch" else min(batch_size or 32, x.shape[0])
        self._refuse_large_training_batch(method, x, size)

    def _check_inputs(self, method: str, x: Any, y: Any = None, *,
                      predicting: bool = False) -> None:
        raise NotImplementedError  # each mixin's own check

    def _check_validation(self, data: Any) -> None:
        """`fit`'s ``validation_data``: unchecked unless a mixin checks it."""

    def fit(self, x=None, y=None, batch_size=None, *args, **kwargs):
        self._check_inputs("fit", x, y)
        if kwargs.get("validation_data") is not None:
            self._check_validation(kwargs["validation_data"])
        self._fitted("fit", x, batch_size)
        return super().fit(x, y, batch_size, *args, **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, *args, **kwargs):
        self._check_inputs("evaluate", x, y)
        return self._predicted("evaluate", x, batch_size, lambda size: super(
            BatchSizes, self).evaluate(x, y, size, *args, **kwargs))

    def predict(self, x, batch_size=None, *args, **kwargs):
        self._check_inputs("predict", x, predicting=True)
        return self._predicted("predict", x, batch_size, lambda size: super(
            BatchSizes, self).predict(x, size, *args, **kwargs))

    def train_on_batch(self, x, y=None, *args, **kwargs):
        self._check_inputs("train_on_batch", x, y)
        self._fitted("train_on_batch", x, None)
        return super().train_on_batch(x, y, *args, **kwargs)

    def test_on_batch(self, x, y=None, *args, **kwargs):
        self._check_inputs("test_on_batch", x, y)
        return super().test_on_batch(x, y, *args, **kwargs)

    def predict_on_batch(self, x):
        self._check_inputs("predict_on_batch", x, predicting=True)
        return super().predict_on_batch(x)


class ChecksInputs(BatchSizes):
    """Mixin: the inputs of a Keras model on uint8 images checked at the door (module
    docstring). Put it before ``keras.Model`` in the bases."""

    labels: str = "any"

    def _check_inputs(self, method: str, x: Any, y: Any = None, *,
                      predicting: bool = False) -> None:
        from aetv2_tf.input_checks import check_pretext_inputs, check_supervised_inputs

        self._refuse_missing(method, x)
        name = f"{type(self).__name__}.{method}"
        expected_hw = tuple(self.inputs[0].shape[1:3])
        if self.labels == "classes" and not predicting:
            check_supervised_inputs(x, y, name=name, expected_hw=expected_hw,
                                    num_classes=self.outputs[0].shape[-1])
        else:
            check_pretext_inputs(x, y, name=name, expected_hw=expected_hw,
                                 allow_labels=predicting or self.labels != "none")

    def _check_validation(self, data: Any) -> None:
        name = "fit(validation_data=...)"
        if self.labels != "none" and isinstance(data, (tuple, list)) and len(data) in (2, 3):
            self._check_inputs(name, data[0], data[1])  # (x, y) or (x, y, sample_weight)
        else:
            self._check_inputs(name, data)

    def __call__(self, *args, **kwargs):
        from aetv2_tf.input_checks import check_images

        if not args or len(self.inputs) != 1:
            return super().__call__(*args, **kwargs)
        images = args[0]
        self._refuse_missing("__call__", images, (list, tuple))
        if isinstance(images, dict):
            return super().__call__(*args, **kwargs)
        check_images(images, name=f"{type(self).__name__} {self.name!r}.__call__: x",
                     expected_hw=tuple(self.inputs[0].shape[1:3]))
        return self._call_in_slices(images, args[1:], kwargs)


class ChecksNormalisedInputs(BatchSizes):
    """Mixin (before ``keras.Model``): an encoder on NORMALISED float images whose entries
    refuse raw pixels (`input_checks.check_normalised_images`); a traced tensor is checked for
    its dtype only."""

    def _check_inputs(self, method: str, x: Any, y: Any = None, *,
                      predicting: bool = False) -> None:
        from aetv2_tf.input_checks import check_normalised_images

        self._refuse_missing(method, x)
        check_normalised_images(x, name=f"{type(self).__name__} {self.name!r}.{method}",
                                expected_hw=tuple(self.inputs[0].shape[1:3]))

    def __call__(self, *args, **kwargs):
        if not args or len(self.inputs) != 1:
            return super().__call__(*args, **kwargs)
        images = args[0]
        self._refuse_missing("__call__", images, (list, tuple))
        if not hasattr(images, "shape"):
            return super().__call__(*args, **kwargs)
        if isinstance(images, np.ndarray):
            self._check_inputs("__call__", images)
        elif "float" not in getattr(images.dtype, "name", str(images.dtype)):
            raise UsageError(f"{type(self).__name__} {self.name!r}.__call__: a tensor of "
                             f"{getattr(images.dtype, 'name', images.dtype)} (raw pixels?); "
                             "this encoder takes normalised float images (u / 255 - mean) / "
                             "std: give uint8 images to aetv2_tf.feature_extractor, which "
                             "normalises them")
        return self._call_in_slices(images, args[1:], kwargs)
