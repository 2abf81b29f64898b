"""The library's models answer the same through every entry (a call, ``predict``, ``fit``,
``evaluate``): what one refuses the others refuse with the same message, an empty batch gives an
empty result, a missing or listed input and a degenerate argument get a `UsageError` with the
fix, and no batch size reaches a TensorFlow kernel that crashes the process.

In-process, on `feature_extractor(load_encoder(run), "block2")` (a NIN encoder saved by
`save_encoder`, random weights), the classifier on it and the encoder itself.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import aetv2_tf
from aetv2_tf.errors import UsageError
from aetv2_tf.models import checked_inputs


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """`load_encoder` of a saved NIN: a `NormalisedEncoder`."""
    keras.utils.set_random_seed(0)
    return aetv2_tf.load_encoder(aetv2_tf.save_encoder(
        aetv2_tf.build_backbone("nin"), str(tmp_path_factory.mktemp("enc") / "run")))


@pytest.fixture(scope="module")
def ext(encoder):
    return aetv2_tf.feature_extractor(encoder, "block2")


def images(n: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def refusal(call) -> str:
    """The message of the UsageError `call()` raises, after its first ': ' (the entry's name)."""
    with pytest.raises(UsageError) as caught:
        call()
    return str(caught.value).split(": ", 1)[1]


BAD_IMAGES = {
    "floats_0_1": images() / np.float32(255),
    "floats_0_255": images().astype("float32"),
    "nchw": np.transpose(images(), (0, 3, 1, 2)),
    "other_size": np.zeros((2, 16, 16, 3), np.uint8),
    "one_image": images()[0],
}


@pytest.mark.parametrize("name", list(BAD_IMAGES))
def test_a_call_refuses_what_predict_fit_and_evaluate_refuse(ext, encoder, name):
    """`ext(float_images_in_0_1)` (whose cast to uint8 would give the features of black images)
    and the other bad arrays: a call on an array or a tensor refuses what `predict` refuses,
    with the same message and fix; the classifier's `fit` and `evaluate` too."""
    x = BAD_IMAGES[name]
    said = refusal(lambda: ext.predict(x, verbose=0))
    assert refusal(lambda: ext(x)) == said
    assert refusal(lambda: ext(keras.ops.convert_to_tensor(x))) == said or name.startswith(
        "floats")  # a tensor's range is read too: the same words
    classifier = aetv2_tf.build_classifier(encoder, 10)
    labels = np.zeros(len(x) if x.ndim == 4 else 1, np.int64)
    for entry in (classifier.fit, classifier.evaluate):
        assert refusal(lambda entry=entry: entry(x, labels, verbose=0)) == said
    assert "uint8" in said or "NHWC" in said or "pixels" in said or "batch" in said


def test_a_traced_float_input_and_a_uint8_tensor_to_the_normalised_encoder_are_refused(
        ext, encoder):
    """A float image input to the extractor inside another model (a symbolic input, which Keras
    would cast to uint8) and an integer tensor given to `load_encoder`'s encoder (which takes
    normalised floats) are refused with the fix; the right dtypes pass."""
    with pytest.raises(UsageError, match="float32 images; expected uint8 images"):
        ext(keras.Input((32, 32, 3)))
    assert tuple(ext(keras.Input((32, 32, 3), dtype="uint8")).shape) == (None, 3072)
    with pytest.raises(UsageError, match="a tensor of uint8 .*feature_extractor"):
        encoder(keras.ops.convert_to_tensor(images()))


def test_empty_missing_and_listed_inputs_and_degenerate_arguments(ext, encoder):
    """`ext.predict(x[:0])`, `ext.predict(None)`, `ext(list_of_arrays)`, `build_classifier(enc,
    0)` and `(enc, -3)`, `knn_accuracy` of NaN features (Keras's and NumPy's own errors, or a
    number without meaning): an empty batch gives an empty result of the right shape (as
    NumPy and Keras users expect of a map over rows: `predict` a NumPy array, a call a tensor);
    the others a UsageError with the fix."""
    x = images()
    assert ext.predict(x[:0], verbose=0).shape == (0, 3072)
    assert tuple(ext(x[:0]).shape) == (0, 3072)
    assert {k: v.shape for k, v in encoder.predict(np.zeros((0, 32, 32, 3), np.float32),
                                                   verbose=0).items()}["block2"] == (0, 8, 8, 192)
    for entry in (ext.predict, ext, encoder.predict, encoder):
        with pytest.raises(UsageError, match="x is None; pass a batch of images"):
            entry(None)
        with pytest.raises(UsageError, match=r"x is a (list|tuple) of 4 items.*np\.stack\(x\)"):
            entry(list(x))
    with pytest.raises(UsageError, match=r"x is a tuple of 4 items.*np\.stack\(x\)"):
        ext(tuple(x))
    classifier = aetv2_tf.build_classifier(encoder, 10)
    with pytest.raises(UsageError, match="no images"):
        classifier.fit(x[:0], np.zeros(0, np.int64), verbose=0)
    for count in (0, -3, 1, True, 2.5, "10"):
        with pytest.raises(UsageError, match=f"num_classes={count!r}; a classifier needs a "
                                             "whole number of at least 2"):
            aetv2_tf.build_classifier(encoder, count)
    features = np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32)
    labels = np.arange(20) % 3
    assert 0 <= aetv2_tf.knn_accuracy(features, labels, features[:5], labels[:5], k=3) <= 100
    for train, query in ((np.where(np.arange(20)[:, None] == 3, np.nan, features), features),
                         (features, np.where(np.arange(20)[:, None] == 0, np.inf, features))):
        with pytest.raises(UsageError, match="1 of 20 rows hold NaN or infinite values"):
            aetv2_tf.knn_accuracy(train, labels, query, labels, k=3)


def test_no_batch_reaches_a_kernel_that_crashes(ext, encoder, monkeypatch):
    """`ext.predict(np.zeros((20000, 32, 32, 3), np.uint8), batch_size=20000)` in one pass would
    end the process with a segmentation fault: a layer output of more than 2**31 - 1 values
    (TensorFlow's CPU convolutions index with int32: NIN block 1 ran at 10,900 images of
    32 x 32 and crashed at 11,000). The largest output per image is counted from the model
    (NIN block 1: 32 x 32 x 192, recounted here); inference runs in slices of at most 2**28
    values per output, the same numbers as one pass; a training batch past the int32 limit is
    refused, naming the largest that works (10,922 here, between the two measurements)."""
    assert checked_inputs.values_per_image(ext, (32, 32)) == 32 * 32 * 192
    one = images(1)
    assert ext.largest_batch(one) == 2**28 // (32 * 32 * 192) == 1365
    assert ext.largest_batch(one, training=True) == (2**31 - 1) // (32 * 32 * 192) == 10922
    x = images(10)
    whole = ext.predict(x, batch_size=10, verbose=0)
    monkeypatch.setattr(checked_inputs, "MAX_ACTIVATION_VALUES", 3 * 32 * 32 * 192)
    seen = []

    class Sizes(keras.callbacks.Callback):
        def on_predict_batch_end(self, batch, logs=None):
            seen.append(len(logs["outputs"]))

    sliced = ext.predict(x, batch_size=10, verbose=0, callbacks=[Sizes()])
    assert seen == [3, 3, 3, 1]
    np.testing.assert_allclose(sliced, whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ext(x)), whole, rtol=1e-5, atol=1e-5)
    assert encoder.largest_batch(np.zeros((1, 32, 32, 3), np.float32)) == 3
    monkeypatch.setattr(checked_inputs, "TRAINING_VALUES_LIMIT", 3 * 32 * 32 * 192)
    classifier = aetv2_tf.build_classifier(encoder, 10)
    for call in (lambda: classifier.fit(x, np.zeros(10, np.int64), batch_size=10, verbose=0),
                 lambda: classifier(x, training=True),
                 lambda: classifier.train_on_batch(x, np.zeros(10, np.int64))):
        with pytest.raises(UsageError, match="a training batch of 10 images of 32x32 pixels "
                                             ".*pass batch_size=3 or less"):
            call()
