"""Models that check what they are given (`aetv2_tf.input_checks`): on raw uint8 images
(`ChecksInputs`), and encoders on normalised images (`ChecksNormalisedInputs`, at the end).

`ChecksInputs` goes before `keras.Model` in the bases of a functional model subclass whose only
input is the images (``keras.Input(shape=(H, W, 3), dtype="uint8")``): `models.pretext.PairsModel`
(self-supervised: no labels) and `models.image_models.CheckedModel` (`build_classifier`: integer
class labels; `feature_extractor`: labels unchecked). Its ``fit`` / ``evaluate`` / ``predict``
and ``train_on_batch`` / ``test_on_batch`` / ``predict_on_batch`` check the images (uint8
NHWC of the model's height and width: floats, NCHW, another size refused with the fix) and,
by `labels`, the labels, then call Keras's own. Keras's input would otherwise be cast to uint8
silently: [0, 1] floats become black images.

`labels` (a class attribute, or set by ``__init__``):

* ``"none"``: self-supervised (`input_checks.check_pretext_inputs`): a `y`, or a dataset of
  ``(images, labels)``, is refused (``predict`` ignores labels, as Keras does);
* ``"classes"``: a classifier (`input_checks.check_supervised_inputs`): integer class labels,
  one-hot refused with ``labels.argmax(-1)``, one per image, below the number of logits;
* ``"any"``: the images only are checked.

Nothing here imports TensorFlow; a ``tf.data.Dataset`` is judged by its ``element_spec``.
"""

from __future__ import annotations

from typing import Any

LABELS = ("none", "classes", "any")


class ChecksInputs:
    """Mixin: the inputs of a Keras model on uint8 images checked at the door (module
    docstring). Put it before ``keras.Model`` in the bases."""

    labels: str = "any"

    def _check_inputs(self, method: str, x: Any, y: Any = None, *,
                      predicting: bool = False) -> None:
        from aetv2_tf.input_checks import check_pretext_inputs, check_supervised_inputs

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

    def fit(self, x=None, y=None, *args, **kwargs):
        self._check_inputs("fit", x, y)
        if kwargs.get("validation_data") is not None:
            self._check_validation(kwargs["validation_data"])
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        self._check_inputs("evaluate", x, y)
        return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        self._check_inputs("predict", x, predicting=True)
        return super().predict(x, *args, **kwargs)

    def train_on_batch(self, x, y=None, *args, **kwargs):
        self._check_inputs("train_on_batch", x, y)
        return super().train_on_batch(x, y, *args, **kwargs)

    def test_on_batch(self, x, y=None, *args, **kwargs):
        self._check_inputs("test_on_batch", x, y)
        return super().test_on_batch(x, y, *args, **kwargs)

    def predict_on_batch(self, x):
        self._check_inputs("predict_on_batch", x, predicting=True)
        return super().predict_on_batch(x)


class ChecksNormalisedInputs:
    """Mixin: a functional encoder on NORMALISED float images (`saving.load_encoder`'s) whose
    ``fit`` / ``evaluate`` / ``predict``, ``*_on_batch`` and a call on a NumPy array refuse raw
    pixels (`input_checks.check_normalised_images`: uint8 images, floats with no value below 0),
    as the raw-image models above refuse floats. Calls on tensors (inside other models, traced
    steps) are not checked. Put it before ``keras.Model`` in the bases."""

    def _check_normalised(self, method: str, x: Any) -> None:
        from aetv2_tf.input_checks import check_normalised_images

        check_normalised_images(x, name=f"{type(self).__name__} {self.name!r}.{method}",
                                expected_hw=tuple(self.inputs[0].shape[1:3]))

    def __call__(self, *args, **kwargs):
        import numpy as np

        if args and isinstance(args[0], np.ndarray):
            self._check_normalised("__call__", args[0])
        return super().__call__(*args, **kwargs)

    def fit(self, x=None, *args, **kwargs):
        self._check_normalised("fit", x)
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        self._check_normalised("evaluate", x)
        return super().evaluate(x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        self._check_normalised("predict", x)
        return super().predict(x, *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        self._check_normalised("train_on_batch", x)
        return super().train_on_batch(x, *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        self._check_normalised("test_on_batch", x)
        return super().test_on_batch(x, *args, **kwargs)

    def predict_on_batch(self, x):
        self._check_normalised("predict_on_batch", x)
        return super().predict_on_batch(x)
