"""Every reader of what a user or another program hands over, fed generated and mutated inputs
(Hypothesis): CIFAR-10 pickles, results.json (the report's reader and the library's), a
checkpoint's `.sha256` sidecar, an export's manifest, a campaign leg's record, and the library's
array inputs (the checks and the feature extractor's entries). The property is the same for
each: it returns, or refuses with a ValueError subclass (`UsageError`, `DataError`,
`ResultsError`, ...) whose message names the problem; never another exception, never a crash,
and every example within Hypothesis's deadline (no hang).

The fast tier runs `EXAMPLES` examples per reader (200; the model's entries 50);
``AETV2_FUZZ_EXAMPLES=10000 python -m pytest -n 0 -p no:randomly tests/test_readers_fuzzed.py``
is the long run, whose count and outcome docs/reliability.md records.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import pickle
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

EXAMPLES = int(os.environ.get("AETV2_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=10_000, derandomize=EXAMPLES <= 200,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                database=None)


def refused_properly(call, names: str = "") -> object:
    """`call()`'s result, or None when it raised a ValueError with a message (naming `names`,
    when given: the file read); any other exception propagates (the test fails on it)."""
    try:
        return call()
    except ValueError as e:
        assert str(e).strip(), f"{type(e).__name__} without a message"
        assert names in str(e), f"{type(e).__name__}: {e} does not name {names}"
        return None


@st.composite
def mutated(draw, valid: bytes) -> bytes:
    """`valid` with a few mutations: bytes replaced, cut, inserted, a slice repeated."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "repeat"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[at:at + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            data[at:at] = data[at:at + draw(st.integers(1, 32))] * draw(st.integers(1, 3))
    return bytes(data)


# ------------------------------------------------------------------- CIFAR-10 batch pickles
def _batch(protocol: int) -> bytes:
    rng = np.random.default_rng(protocol)
    return pickle.dumps({b"batch_label": b"testing batch 1 of 1",
                         b"labels": [int(v) for v in rng.integers(0, 10, 3)],
                         b"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8),
                         b"filenames": [b"a.png", b"b.png", b"c.png"]}, protocol=protocol)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4), max_leaves=12)
PICKLED_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.binary(max_size=16)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.binary(max_size=8), inner, max_size=4), max_leaves=12)
BATCHES = (st.sampled_from([2, 3, 4, 5]).flatmap(lambda p: mutated(_batch(p)))
           | st.builds(lambda v, p: pickle.dumps(v, protocol=p), PICKLED_VALUES,
                       st.integers(2, 5))
           | st.binary(max_size=256))


@FUZZ
@given(BATCHES)
def test_cifar10_batches(data):
    from aetv2_tf.data.sources import load_cifar10

    with tempfile.TemporaryDirectory() as root:
        pathlib.Path(root, "test_batch").write_bytes(data)
        loaded = refused_properly(lambda: load_cifar10(root, "test"), names="test_batch")
    if loaded is not None:
        images, labels = loaded
        assert images.dtype == np.uint8 and images.shape[1:] == (32, 32, 3)
        assert labels.shape == (len(images),) and labels.min() >= 0 and labels.max() <= 9


# ------------------------------------------------------------------------------ results.json
def _results() -> bytes:
    from aetv2_tf.probes.results import write_results
    from tests.folders import make_result

    with tempfile.TemporaryDirectory() as root:
        return pathlib.Path(write_results(root, make_result("fc1", 20.0))).read_bytes()


VALID_RESULTS = _results()
RESULTS = (mutated(VALID_RESULTS)
           | st.builds(lambda key, value: json.dumps(
               {**json.loads(VALID_RESULTS), key: value}).encode(),
               st.sampled_from(sorted(json.loads(VALID_RESULTS))), JSON_VALUES)
           | st.builds(lambda v: json.dumps(v).encode(), JSON_VALUES))


@FUZZ
@given(RESULTS)
def test_results_files(data):
    from aetv2_tf.probes.results import read_results
    from aetv2_tf.program.report_inputs import read_checked

    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "results.json")
        pathlib.Path(path).write_bytes(data)
        checked = refused_properly(lambda: read_checked(path), names=path)
        read = refused_properly(lambda: read_results(path), names=path)
    assert (checked is None) == (read is None)  # the two readers agree
    if checked is not None:
        result = checked[0]
        for key in ("test_top1", "test_error"):
            assert result[key] is None or isinstance(result[key], (int, float))


# ---------------------------------------------------- checkpoint sidecars, export manifests
@FUZZ
@given(st.one_of(mutated(b"%s  ckpt-4.weights.h5\n" % (b"0" * 64)), st.binary(max_size=200)),
       st.booleans())
def test_checkpoint_sidecars(sidecar, required):
    """`damage` (a checkpoint trusted or not) and `held_step` (the step its name was written
    for) on any sidecar: a reason or None, a step or None; never an exception."""
    from aetv2_tf.files.saving import damage
    from aetv2_tf.program.keras_checkpoints import held_step

    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "ckpt-4.weights.h5")
        pathlib.Path(path).write_bytes(b"weights")
        pathlib.Path(path + ".sha256").write_bytes(sidecar)
        reason = damage(path, required=required)
        step = held_step(path)
    assert reason is None or reason.strip()
    assert step is None or isinstance(step, int)


def _manifest() -> bytes:
    from aetv2_tf.files.provenance import file_digest

    with tempfile.TemporaryDirectory() as root:
        pathlib.Path(root, "saved_model.pb").write_bytes(b"graph")
        return json.dumps({"format": "aetv2_tf export", "version": 1,
                           "sha256": {"saved_model.pb": file_digest(
                               os.path.join(root, "saved_model.pb"))},
                           "encoder": {"name": "nin", "input_shape": [32, 32, 3],
                                       "mean": [0.5] * 3, "std": [0.2] * 3,
                                       "shapes": [[3, 3]]}}).encode()


VALID_MANIFEST = _manifest()


@FUZZ
@given(mutated(VALID_MANIFEST)
       | st.builds(lambda key, value: json.dumps({**json.loads(VALID_MANIFEST), key: value})
                   .encode(), st.sampled_from(["format", "sha256", "encoder", "version"]),
                   JSON_VALUES)
       | st.builds(lambda v: json.dumps(v).encode(), JSON_VALUES))
def test_export_manifests(manifest):
    """`verify_export`, `export_record` and `check_export_target` on an export folder with any
    manifest: a reason or None, a record or None, an ExportTargetError (a ValueError) or
    None."""
    from aetv2_tf.files.provenance import check_export_target, export_record, verify_export

    with tempfile.TemporaryDirectory() as root:
        folder = os.path.join(root, "export")
        os.mkdir(folder)
        pathlib.Path(folder, "saved_model.pb").write_bytes(b"graph")
        pathlib.Path(folder, "aetv2_export.json").write_bytes(manifest)
        why = verify_export(folder)
        record = export_record(folder)
        refused_properly(lambda: check_export_target(folder))
    assert why is None or why.strip()
    assert record is None or isinstance(record, dict)


# ------------------------------------------------------------ a campaign leg's record, landed
VALID_LEG = {"started": "2026-11-29 06:00:00 UTC", "device": "GPU 0: NVIDIA H200", "images": 50000,
             "runs": {"aetv2": {"parts": ["aetv2.tar.0"], "tar_sha256": "0" * 64,
                                "checkpoint": {"step": 2000, "file": "checkpoints/ckpt-2000"
                                               ".weights.h5", "sha256": "a" * 64},
                                "start_step": 0, "steps": 2000, "pairs": 1_024_000,
                                "wall_s": 240.5, "pairs_per_sec": 4257.9, "loss": 0.61}}}
LEG_KEYS = sorted(VALID_LEG) + [f"runs.aetv2.{k}" for k in sorted(VALID_LEG["runs"]["aetv2"])]


def _with(key: str, value) -> bytes:
    record = json.loads(json.dumps(VALID_LEG))
    *outer, last = key.split(".")
    target = record
    for name in outer:
        target = target[name]
    target[last] = value
    return json.dumps(record).encode()


@FUZZ
@given(mutated(json.dumps(VALID_LEG).encode())
       | st.builds(_with, st.sampled_from(LEG_KEYS), JSON_VALUES)
       | st.builds(lambda v: json.dumps(v).encode(), JSON_VALUES))
def test_leg_records(data):
    """`land.read_leg` on any leg.json: a record or a LandingError naming the file; a record it
    returns gives each shipped run one ledger row of the header's 13 cells."""
    from experiments.campaign import land

    with tempfile.TemporaryDirectory() as root:
        returned = pathlib.Path(root)
        (returned / "leg.json").write_bytes(data)
        record = refused_properly(lambda: land.read_leg(returned), names="leg.json")
        for run, entry in (record or {"runs": {}})["runs"].items():
            if entry.get("parts"):  # as `land.checked_run` completes it
                step = entry["checkpoint"]["step"]
                row = land.ledger_row(1, record, run, dict(
                    entry, batch=512, steps=step, pairs=step * 512, total_steps=145_500),
                    spent_s=600.0)
                assert row.count("|") == 14 and row.endswith("|\n"), row


# --------------------------------------------------------------------- the library's arrays
DTYPES = st.sampled_from(["uint8", "int8", "int32", "int64", "uint16", "float16", "float32",
                          "float64", "bool", "complex64"])
SHAPES = st.sampled_from([(2, 32, 32, 3), (0, 32, 32, 3), (1, 32, 32, 3), (32, 32, 3),
                          (2, 3, 32, 32), (2, 16, 16, 3), (2, 32, 32, 1), (2, 32, 32, 4),
                          (2, 32, 32), (3072,), (), (2, 0, 32, 3)])
ARRAYS = st.tuples(DTYPES, SHAPES).flatmap(lambda ds: hnp.arrays(ds[0], ds[1]))


@FUZZ
@given(ARRAYS, st.one_of(st.none(), hnp.arrays(st.sampled_from(
    ["int64", "int32", "float32", "uint8", "bool"]), st.sampled_from([(2,), (2, 1), (2, 10),
                                                                      (3,), (0,)]))))
def test_array_checks(images, labels):
    """`check_images`, `check_normalised_images` and `check_labels` on arrays of any numeric
    dtype, shape and values (NaN, infinities, extremes): the array back, or a UsageError."""
    from aetv2_tf.input_checks import check_images, check_labels, check_normalised_images

    checked = refused_properly(lambda: check_images(images, expected_hw=(32, 32)))
    if checked is not None:
        assert checked.dtype == np.uint8 and checked.shape[1:] == (32, 32, 3)
    refused_properly(lambda: check_normalised_images(images, expected_hw=(32, 32)))
    if labels is not None:
        got = refused_properly(lambda: check_labels(labels, 2))
        assert got is None or (got.dtype == np.int64 and got.shape == (2,) and
                               np.array_equal(got, labels.reshape(-1)))  # the same values


@pytest.fixture(scope="module")
def extractor():
    import keras

    import aetv2_tf

    keras.utils.set_random_seed(0)
    encoder = aetv2_tf.build_backbone("nin")
    classifier = aetv2_tf.build_classifier(encoder, 10)
    classifier.compile(loss="sparse_categorical_crossentropy")
    return aetv2_tf.feature_extractor(encoder, "block2"), classifier


@settings(FUZZ, max_examples=EXAMPLES if EXAMPLES > 200 else 50,
          suppress_health_check=[*FUZZ.suppress_health_check,
                                 HealthCheck.function_scoped_fixture])
@given(ARRAYS, st.sampled_from(["call", "predict", "evaluate"]))
def test_the_feature_extractor_and_classifier_entries(extractor, images, entry):
    """A call, `predict` and the classifier's `evaluate` on any array: features (N, 3072) or
    a score, or a UsageError; the three refuse the same arrays."""
    ext, classifier = extractor
    labels = np.zeros(images.shape[0] if images.ndim else 0, np.int64)
    with contextlib.redirect_stdout(None):
        got = refused_properly({
            "call": lambda: ext(images),
            "predict": lambda: ext.predict(images, verbose=0),
            "evaluate": lambda: classifier.evaluate(images, labels, verbose=0),
        }[entry])
    valid = images.dtype == np.uint8 and images.shape[1:] == (32, 32, 3) and images.ndim == 4
    if entry == "evaluate":
        assert (got is not None) == (valid and images.shape[0] > 0)
    else:
        assert (got is not None) == valid
        if got is not None:
            assert tuple(got.shape) == (images.shape[0], 3072)


def _image_bytes(fmt: str) -> bytes:
    """A small seeded RGB image encoded as ``fmt`` by Pillow."""
    import io

    from PIL import Image

    rgb = np.random.default_rng(0).integers(0, 256, (8, 12, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format=fmt)
    return out.getvalue()


IMAGES = st.sampled_from(["PNG", "JPEG", "BMP", "GIF"]).flatmap(
    lambda fmt: mutated(_image_bytes(fmt)))


@FUZZ
@given(IMAGES)
def test_image_files(contents):
    """A mutated image file is either named as bad by the folder reader's check
    (`check_image_file`: the reason is a message) or, once it passes, a PNG, BMP or GIF decodes
    on both backends' decoders (TensorFlow's `decode_rgb`, Pillow's `rgb_image`) into uint8 RGB
    of one shape: such a file never ends a run with a decoder's error. A JPEG damaged inside
    its entropy-coded data passes the check, which decodes nothing (docs/reliability.md)."""
    import tensorflow as tf
    from PIL import Image

    from aetv2_tf.data.augment import decode_rgb
    from aetv2_tf.data.image_folders import check_image_file
    from aetv2_tf.data.stream import rgb_image

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "image")
        pathlib.Path(path).write_bytes(contents)
        reason = check_image_file(path)
        if reason is not None:
            assert isinstance(reason, str) and reason.strip()
            return
        if contents.startswith(b"\xff\xd8"):
            return
        by_tensorflow = decode_rgb(tf.constant(contents)).numpy()
        with Image.open(path) as image:
            by_pillow = np.asarray(rgb_image(image))
    assert by_tensorflow.dtype == by_pillow.dtype == np.uint8
    assert by_tensorflow.shape == by_pillow.shape and by_tensorflow.shape[2] == 3
