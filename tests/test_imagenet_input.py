"""The 224-pixel input made cheap without changing what the model sees (BENCHMARKS.md,
"ImageNet-size input"): the crop resized from its window only, a JPEG decoded only there, the
pair's warp moved into the train step (`--warp=device`), and the pipeline served by a tf.data
service (`--data_service`). Each is compared with the path it replaces."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.data.augment import decode_resize_crop, decode_rgb, resize_crop
from aetv2_tf.data.constants import IMAGENET_MEAN, IMAGENET_STD
from aetv2_tf.data.pipelines import from_data_service, pretext_dataset
from aetv2_tf.data.sources import list_image_folder
from aetv2_tf.models.pretext import WarpPairs
from benchmarks.imagenet_input import full_resize_then_crop
from benchmarks.make_folder import PHOTO_SIZE, photo_like, write_cifar10_folder
from tests.cli import _env, run_module


@pytest.fixture(scope="module")
def photos(tmp_path_factory, cifar10_dir):
    """Two ImageNet-like 500 x 375 JPEG files per CIFAR-10 class (`--photo`)."""
    root = tmp_path_factory.mktemp("photos")
    write_cifar10_folder(root, cifar10_dir, train_per_class=2, val_per_class=0, photo=True)
    return list_image_folder(root, "train")


def test_photo_like_files_have_imagenet_size_and_entropy(photos, cifar10_dir):
    sizes = [len(open(p, "rb").read()) for p in photos.paths]
    assert 70_000 < np.mean(sizes) < 160_000  # ImageNet's 500 x 375 files: about 110 KB
    image = tf.io.decode_jpeg(open(photos.paths[0], "rb").read())
    assert image.shape == (PHOTO_SIZE[1], PHOTO_SIZE[0], 3)
    again = photo_like(np.zeros((32, 32, 3), np.uint8), seed=3)
    np.testing.assert_array_equal(again, photo_like(np.zeros((32, 32, 3), np.uint8), seed=3))


@pytest.mark.parametrize("shape", [(375, 500), (64, 48), (256, 256), (900, 700), (224, 500)])
def test_window_crop_equals_the_full_resize_and_crop(shape):
    """Random and centre crops at 224 and 64 pixels, shrinking and enlarging, JPEG (cropped
    decode) and PNG (whole decode): the same pixels as resizing the whole image, within float
    rounding; uint8 crops round them."""
    rng = np.random.default_rng(shape[0])
    image = rng.integers(0, 256, shape + (3,)).astype(np.uint8)
    for contents in (tf.io.encode_jpeg(image, quality=95), tf.io.encode_png(image)):
        decoded = decode_rgb(contents)  # the training input's decoder
        for k, (size, random) in enumerate([(224, True), (224, False), (64, True), (64, False)]):
            seed = tf.constant([k, 11], tf.int64)
            want = full_resize_then_crop(decoded, seed, size, random).numpy()
            for got in (resize_crop(decoded, seed, size, random),
                        decode_resize_crop(contents, seed, size, random)):
                assert np.abs(got.numpy() - want).max() < 2e-4, (shape, size, random)
            as_uint8 = decode_resize_crop(contents, seed, size, random, tf.uint8).numpy()
            assert as_uint8.dtype == np.uint8
            assert np.abs(as_uint8 - want * 255).max() <= 0.51


def test_pairs_warped_in_the_step_equal_the_host_pairs(photos):
    """`pretext_dataset(warp_on_device=True)` + `WarpPairs` (what `--warp=device` trains on)
    against the host pairs: the same crops (uint8-rounded), homographies and targets; a shard
    of a two-worker batch is the same rows."""
    kwargs = dict(image_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    (x, tx), params = next(iter(pretext_dataset(photos, 4, 7, **kwargs)))
    (images, t), device_params = next(iter(pretext_dataset(photos, 4, 7, warp_on_device=True,
                                                           **kwargs)))
    assert images.dtype == tf.uint8 and t.shape == (4, 3, 3)
    np.testing.assert_array_equal(params, device_params)
    got_x, got_tx = WarpPairs(mean=IMAGENET_MEAN, std=IMAGENET_STD)([images, t])
    std = np.asarray(IMAGENET_STD, np.float32) * 255  # differences in 0-255 units
    assert np.abs((got_x - x) * std).max() <= 0.51
    assert np.abs((got_tx - tx) * std).max() <= 0.51
    (rows, t_rows), _ = next(iter(pretext_dataset(photos, 4, 7, warp_on_device=True,
                                                  shard=(1, 2), **kwargs)))
    np.testing.assert_array_equal(rows, images[2:])
    np.testing.assert_array_equal(t_rows, t[2:])


SERVICE = """
import time
import tensorflow as tf
dispatcher = tf.data.experimental.service.DispatchServer()
address = dispatcher.target.split("://")[1]
worker = tf.data.experimental.service.WorkerServer(
    tf.data.experimental.service.WorkerConfig(dispatcher_address=address))
print(dispatcher.target, flush=True)
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def data_service():
    """A tf.data service, a dispatcher and one worker on local ports, in a child process that is
    killed at the end: stopping the servers in this process waited 40-60 s for the tasks of the
    program's job (the client gone) before returning."""
    proc = subprocess.Popen([sys.executable, "-c", SERVICE], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=_env(None))
    try:
        target = proc.stdout.readline().strip()
        assert target.startswith("grpc://"), \
            f"the data service did not start: {target!r}, exit {proc.poll()}"
        yield target
    finally:
        proc.kill()
        proc.wait()


def test_data_service_serves_the_same_pairs(photos, data_service):
    local = pretext_dataset(photos, 4, 3, image_size=224, start_step=5)
    served = from_data_service(pretext_dataset(photos, 4, 3, image_size=224, start_step=5),
                               data_service)
    for (a, b), ((c, d), e) in zip(local.take(3), served.take(3), strict=True):
        for want, got in zip(tf.nest.flatten((a, b)), tf.nest.flatten(((c, d), e)), strict=True):
            np.testing.assert_array_equal(want, got)


@pytest.mark.slow
def test_cli_pairs_on_the_device_and_from_a_data_service(tmp_path, data_service, cifar10_dir):
    """The program with `--warp=device` trains the same steps as with the host warp (the
    same loss to float rounding), and with `--data_service` the very same weights (256 CIFAR-10
    training images: the service need not be sent the whole training set)."""
    common = ("--flagfile=configs/quickstart.cfg", "--train_seconds=0", "--train_steps=3",
              "--quick_knn_train=0", "--export=false", "--batch_size=16", "--verbose=0",
              f"--data_dir={cifar10_dir}", "--train_examples=256")
    done = {}
    for name, extra in (("host", ("--warp=host",)), ("device", ("--warp=device",)),
                        ("service", ("--warp=host", f"--data_service={data_service}"))):
        proc = run_module("aetv2_tf.train", *common, *extra, f"--model_dir={tmp_path / name}")
        done[name] = dict(re.findall(r"(\w+)=([\w.]+)", proc.stdout.split("Done (pretext):")[1]))
    assert done["service"]["trainable_digest"] == done["host"]["trainable_digest"]
    assert float(done["device"]["loss"]) == pytest.approx(float(done["host"]["loss"]), rel=1e-3)


@pytest.mark.slow
def test_a_data_service_that_does_not_answer_is_refused(tmp_path):
    import socket

    with socket.socket() as s:  # a free port, closed again: nothing listens there
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    for address, message in ((f"grpc://localhost:{port}", "no dispatcher answers"),
                             ("localhost", "expected grpc://<host>:<port>")):
        proc = run_module("aetv2_tf.train", "--flagfile=configs/quickstart.cfg",
                          f"--model_dir={tmp_path / 'run'}", f"--data_service={address}",
                          check=False)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
        assert not (tmp_path / "run").exists()


def test_pairs_warped_in_the_step_keep_float32_homographies_under_mixed_precision(photos):
    """Under mixed_bfloat16 (the CPU default on bf16 machines) the layer must not autocast T to
    bfloat16: that moved the warp by up to 0.31 (in [0, 1]) from the host's."""
    import keras

    from aetv2_tf.data.homographies import warp

    (images, t), _ = next(iter(pretext_dataset(photos, 4, 2, warp_on_device=True,
                                               image_size=224)))
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        _, tx = WarpPairs(mean=(0.0,) * 3, std=(1.0,) * 3)([images, t])
    finally:
        keras.mixed_precision.set_global_policy(previous)
    host = warp(tf.cast(images, tf.float32) / 255.0, t, fill_value=128 / 255).numpy()
    assert np.abs(np.asarray(tx, np.float32) - host).max() < 1e-5
