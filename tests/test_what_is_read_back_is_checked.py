"""What the project reads back is checked where it is read: a `.keras` file's digest, the inputs
of `load_encoder`'s encoder, an edited flags.json named, an export's signature on an unbatched
image (docs/reliability.md, "Trust: links and files of others").

In-process (a regression of the exported signature's check would abort the test's worker: a
failure too).
"""

from __future__ import annotations

import json
import pathlib

import keras
import numpy as np
import pytest

import aetv2_tf
from aetv2_tf.errors import UsageError
from aetv2_tf.files.saving import save_atomically


def _uint8_batch(n: int = 4) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def test_load_model_checks_the_digest_written_beside_a_keras_file(tmp_path):
    """`aetv2_tf.load_model` of a `.keras` file the project wrote (`save_atomically`, as a run's
    aet_model.keras): loaded when its SHA-256 matches; a byte changed, or its `.sha256`
    deleted: ValueError naming the file, never loaded (`keras.saving.load_model` checks
    nothing)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(256), keras.layers.Dense(2)])
    path = tmp_path / "aet_model.keras"
    save_atomically(model.save, str(path))
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(aetv2_tf.load_model(path)(x), model(x), atol=1e-6)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"aet_model\.keras cannot be trusted: its SHA-256"):
        aetv2_tf.load_model(path)
    pathlib.Path(f"{path}.sha256").unlink()
    with pytest.raises(ValueError, match=r"has no aet_model\.keras\.sha256"):
        aetv2_tf.load_model(path)


def test_load_encoders_encoder_refuses_raw_pixels_as_the_library_does(tmp_path):
    """`load_encoder`'s encoder takes normalised images: `predict`, `fit` and a call on a NumPy
    array refuse uint8 images and [0, 1] or [0, 255] floats with the fix (before: [0, 1]
    floats gave features off by up to 235 without a word); normalised images give the
    features `feature_extractor` gives for the uint8 ones; it saves and reloads as before."""
    keras.utils.set_random_seed(0)
    directory = aetv2_tf.save_encoder(aetv2_tf.build_backbone("nin"), str(tmp_path / "enc"))
    encoder = aetv2_tf.load_encoder(directory)
    images = _uint8_batch()
    for given, found in ((images, "uint8 images"),
                         (images / np.float32(255), r"values in \[0, 1\]|none below 0"),
                         (images.astype("float32"), "none below 0")):
        for call in (encoder.predict, encoder, lambda x: encoder.fit(x, x)):
            with pytest.raises(UsageError, match=rf"{found}.*NORMALISED.*feature_extractor"):
                call(given)
    mean, std = (np.asarray(v, np.float32) for v in aetv2_tf.preprocessing(directory).values())
    normalised = (images / np.float32(255) - mean) / std
    got = encoder.predict(normalised, verbose=0)["block2"]
    want = aetv2_tf.feature_extractor(encoder, "block2", pool=None).predict(images, verbose=0)
    np.testing.assert_allclose(got, want, atol=1e-4)
    again = aetv2_tf.load_encoder(aetv2_tf.save_encoder(encoder, str(tmp_path / "again")))
    np.testing.assert_array_equal(again.get_weights()[0], encoder.get_weights()[0])
    assert aetv2_tf.build_classifier(again, 10).predict(images, verbose=0).shape == (4, 10)


def test_an_edited_flags_json_is_named_in_a_short_message(tmp_path):
    """A run whose flags.json was edited so that it no longer describes the weights beside it:
    a ValueError of a few lines naming flags.json and the fix (before: Keras's 10-19 KB
    dump of every layer, flags.json never named)."""
    keras.utils.set_random_seed(0)
    directory = pathlib.Path(aetv2_tf.save_encoder(aetv2_tf.build_backbone("nin"),
                                                   str(tmp_path / "run")))
    record = json.loads((directory / "flags.json").read_text())
    (directory / "flags.json").write_text(json.dumps({**record, "backbone": "alexnet"}))
    with pytest.raises(ValueError) as caught:
        aetv2_tf.load_encoder(str(directory))
    message = str(caught.value)
    assert f"{directory / 'flags.json'} describes" in message and "was flags.json edited" in \
        message and len(message) < 1000, message


def test_an_unbatched_image_to_the_exported_signature_is_an_error_not_an_abort(tmp_path):
    """`signatures["serving_default"](images=<one (32, 32, 3) image>)`: InvalidArgumentError
    naming the shape expected (before: the calling process ABORTED, exit 134, a TensorFlow
    check failure in the oneDNN convolution: a regression here kills this test's worker); the
    probes' helper on an export of an earlier version (no check in its signature) raises
    before calling it."""
    import tensorflow as tf

    from aetv2_tf.probes.frozen_encoder import saved_model_features

    keras.utils.set_random_seed(0)
    encoder = aetv2_tf.build_backbone("nin")
    aetv2_tf.export_encoder(encoder, str(tmp_path / "new"))
    signature = tf.saved_model.load(str(tmp_path / "new")).signatures["serving_default"]
    batch = signature(images=tf.zeros((2, 32, 32, 3), tf.uint8))
    assert batch["block2"].shape == (2, 8, 8, 192)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Shape of tensor images \[32,32,3\] is not compatible with "
                             r"expected shape \[\?,32,32,3\]"):
        signature(images=tf.zeros((32, 32, 3), tf.uint8))
    archive = keras.export.ExportArchive()  # an export without the check in its signature
    archive.track(encoder)
    archive.add_endpoint("serving_default", lambda x: encoder(tf.cast(x, tf.float32)),
                         input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.uint8,
                                                        name="images")])
    archive.write_out(str(tmp_path / "old"), verbose=False)
    features = saved_model_features(str(tmp_path / "old"), "block2", 32, (0.0,) * 3,
                                    (1.0,) * 3, trust_saved_model=True)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"\[32,32,3\] is not compatible with expected shape "
                             r"\[\?,32,32,3\]"):
        features(tf.zeros((32, 32, 3)))
    assert features(tf.zeros((2, 32, 32, 3)))["block2"].shape == (2, 8, 8, 192)
