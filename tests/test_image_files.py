"""Folders of image files (ImageNet/Places): the check that leaves bad files out, the two decoders
(TensorFlow's and Pillow's) giving the same pixels for every format and depth, the training
stream over the whole list (shuffled every epoch, exact on resume), the normalisation rule."""

import io
import itertools
import logging

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from aetv2_tf.data.constants import IMAGENET_MEAN, IMAGENET_STD
from aetv2_tf.data.image_folders import check_image_file
from aetv2_tf.data.pipelines import classification_dataset, pretext_dataset
from aetv2_tf.data.sources import DataError, list_image_folder, load_source
from benchmarks.make_folder import CORRUPT_FILES, write_cifar10_folder
from tests.folders import decoded, decodes, jpeg_bytes


def test_check_image_file_names_what_cannot_be_decoded(tmp_path):
    """Each refused file really fails TensorFlow's decoder, and each accepted one decodes."""
    good = jpeg_bytes((48, 64, 3))
    png = tf.io.encode_png(np.zeros((8, 8, 3), np.uint8)).numpy()
    middle = len(good) // 2
    files = {
        "good.jpg": (good, None),
        "truncated.jpg": (good[: len(good) - 10], "truncated JPEG"),
        "header_only.jpg": (good[:200], "truncated JPEG"),
        "text.jpg": (b"<html>not found</html>", "not an image"),
        "empty.jpg": (b"", "empty file"),
        "png_inside.jpg": (png, None),
        "truncated.png": (png[: len(png) // 2], "truncated PNG"),
        "trailing_bytes.jpg": (good + b"\0" * 300, None),
        # Flipped bits in the entropy data: libjpeg warns ("Corrupt JPEG data") and decodes.
        "corrupt_middle.jpg": (good[:middle] + bytes([good[middle] ^ 0xFF]) + good[middle + 1:],
                               None),
    }
    for name, (data, reason) in files.items():
        (tmp_path / name).write_bytes(data)
        found = check_image_file(str(tmp_path / name))
        if reason is None:
            assert found is None and decodes(tmp_path / name), (name, found)
        else:
            assert found is not None and found.startswith(reason), (name, found)
            assert not decodes(tmp_path / name), name
    with pytest.raises(OSError):  # the disk's trouble, not the file's: not skipped quietly
        check_image_file(str(tmp_path / "missing.jpg"))


def _saved(image, fmt: str, **options) -> bytes:
    """The bytes of a Pillow ``image`` saved in ``fmt`` with ``options``."""
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _png16(channels: int):
    """A 16-bit PNG of ``channels`` (1 grey, 2 grey and alpha, 3, 4) seeded planes."""
    return lambda rgb, alpha: tf.io.encode_png(
        np.random.default_rng(channels).integers(0, 65536, rgb.shape[:2] + (channels,),
                                                 dtype=np.uint16)).numpy()


def _twice(c: np.ndarray) -> Image.Image:
    """The image at twice its size (24 x 32: whole 4:2:0 JPEG blocks)."""
    return Image.fromarray(np.kron(c, np.ones((2, 2, 1), np.uint8)))


#: Every format and depth the folder check lets through, as Pillow or TensorFlow writes it,
#: from a seeded image ``c`` (12 x 16 RGB) and an alpha plane ``a``.
FORMATS = {
    "png_rgb8": lambda c, a: _saved(Image.fromarray(c), "PNG"),
    "png_rgba8": lambda c, a: _saved(Image.fromarray(np.dstack([c, a])), "PNG"),
    "png_grey8": lambda c, a: _saved(Image.fromarray(c[..., 0]), "PNG"),
    "png_grey_alpha8": lambda c, a: _saved(Image.fromarray(np.dstack([c[..., 0], a]), "LA"),
                                           "PNG"),
    "png_palette": lambda c, a: _saved(Image.fromarray(c).convert("P"), "PNG"),
    "png_palette_transparent": lambda c, a: _saved(Image.fromarray(c).convert("P"), "PNG",
                                                   transparency=3),
    "png_bilevel": lambda c, a: _saved(Image.fromarray(c).convert("1"), "PNG"),
    "png_grey16": _png16(1), "png_grey_alpha16": _png16(2), "png_rgb16": _png16(3),
    "png_rgba16": _png16(4),
    "jpeg_420": lambda c, a: _saved(_twice(c), "JPEG", quality=90),
    "jpeg_444": lambda c, a: _saved(_twice(c), "JPEG", subsampling=0),
    "jpeg_progressive": lambda c, a: _saved(_twice(c), "JPEG", progressive=True),
    "jpeg_grey": lambda c, a: _saved(_twice(c).convert("L"), "JPEG"),
    "jpeg_cmyk": lambda c, a: _saved(_twice(c).convert("CMYK"), "JPEG"),
    "jpeg_tensorflow": lambda c, a: tf.io.encode_jpeg(np.asarray(_twice(c)), quality=95).numpy(),
    "bmp_grey8": lambda c, a: _saved(Image.fromarray(c[..., 0]), "BMP"),
    "bmp_rgb24": lambda c, a: _saved(Image.fromarray(c), "BMP"),
    "bmp_rgba32": lambda c, a: _saved(Image.fromarray(np.dstack([c, a])), "BMP"),
    "gif": lambda c, a: _saved(Image.fromarray(c), "GIF"),
    "gif_transparent": lambda c, a: _saved(Image.fromarray(c).convert("P"), "GIF",
                                           transparency=3),
    "gif_animated": lambda c, a: _saved(Image.fromarray(c), "GIF", save_all=True, append_images=[
        Image.fromarray(np.roll(c, k, axis=0)) for k in (3, 6)]),
}


@pytest.mark.parametrize("name", FORMATS)
def test_both_decoders_give_the_same_pixels_for_every_format_and_depth(tmp_path, name):
    """What the folder check lets through decodes to the same uint8 RGB pixels with
    TensorFlow's decoder (the tf.data pipelines) and Pillow's (the reader of Keras on JAX):
    JPEGs with libjpeg's accurate DCT on both, 16-bit PNGs by their high byte on both (a 16-bit
    grey PNG is no longer a nearly white image under Pillow), alpha dropped, palettes applied."""
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    alpha = rng.integers(0, 256, (12, 16), dtype=np.uint8)
    path = tmp_path / f"{name}.img"
    path.write_bytes(FORMATS[name](rgb, alpha))
    assert check_image_file(str(path)) is None
    by_tensorflow, by_pillow = decoded(path)
    assert by_tensorflow is not None and by_pillow is not None
    np.testing.assert_array_equal(by_tensorflow, by_pillow)
    assert by_tensorflow.shape == ((24, 32, 3) if name.startswith("jpeg") else (12, 16, 3))
    if name.endswith("16"):  # against the written values: the high byte of each channel
        written = tf.io.decode_png(path.read_bytes(), dtype=tf.uint16).numpy() >> 8
        colour = written[..., :3] if written.shape[-1] >= 3 else \
            np.repeat(written[..., :1], 3, axis=-1)
        np.testing.assert_array_equal(by_pillow, colour.astype(np.uint8))
        assert 100 < by_pillow.mean() < 155  # uniform noise: mid-grey, not white


def test_a_folder_leaves_its_bad_files_out_and_names_them(tmp_path, caplog):
    root = write_cifar10_folder(tmp_path / "f", train_per_class=2, val_per_class=1, size=40,
                                corrupt=True)
    with caplog.at_level(logging.WARNING):
        files = list_image_folder(root, "train")
    bad = {name for name, reason in CORRUPT_FILES.items() if reason}
    assert sorted(p.rsplit("/", 1)[1] for p, _ in files.skipped) == sorted(bad)
    assert len(files.paths) == 10 * 2 + len(CORRUPT_FILES) - len(bad)
    assert not set(files.paths) & {p for p, _ in files.skipped}
    message = " ".join(r.getMessage() for r in caplog.records)
    assert f"Skipped {len(bad)} undecodable image(s)" in message
    assert all(name in message for name in bad)
    assert isinstance(load_source("folder", root, "train"), type(files))


def _id_folder(root, classes=2, per_class=12, size=(40, 48)):
    """PNG files (lossless) whose red channel is the file's id and whose green and blue are
    gradients, so that ids and crops can be read back from a batch."""
    yy, xx = np.mgrid[: size[0], : size[1]]
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            image = np.stack([np.full(size, c * per_class + i), 3 * yy, 3 * xx], -1)
            png = tf.io.encode_png(image.astype(np.uint8)).numpy()
            (root / f"class{c}" / f"{i:02d}.png").write_bytes(png)
    return list_image_folder(root)


def _ids(batch_images):
    """File ids of a float [0, 1] (unnormalised) batch: the red channel at the centre."""
    return np.rint(batch_images[:, 16, 16, 0] * 255).astype(int)


def _stream(files, augment=True):
    return classification_dataset(files, None, 5, seed=3, training=True, augment=augment,
                                  image_size=32, repeat=True, drop_remainder=True,
                                  mean=(0, 0, 0), std=(1, 1, 1))


def test_folder_stream_permutes_the_whole_list_every_epoch(tmp_path):
    files = _id_folder(tmp_path)  # 24 files, sorted by class; 4 batches of 5 per epoch
    batches = [x for x, _ in itertools.islice(_stream(files, augment=False), 8)]
    epoch0, epoch1 = np.concatenate([_ids(x) for x in batches[:4]]), \
        np.concatenate([_ids(x) for x in batches[4:]])
    assert len(set(epoch0)) == 20 and len(set(epoch1)) == 20  # each file at most once an epoch
    assert epoch0.tolist() != sorted(epoch0.tolist()) and epoch0.tolist() != epoch1.tolist()
    assert {i // 12 for i in epoch0[:10]} == {0, 1}  # both classes early, not class by class


def test_folder_pretext_stream_resumes_exactly(tmp_path):
    """Batch s of a stream started at step s equals batch s of the uninterrupted stream:
    order, crops and homographies (seeded by the global element and batch indices)."""
    files = _id_folder(tmp_path)

    def pairs(start, n):
        ds = pretext_dataset(files, 5, seed=3, image_size=32, start_step=start,
                             mean=IMAGENET_MEAN, std=IMAGENET_STD)
        return [(x.numpy(), tx.numpy(), p.numpy()) for (x, tx), p in itertools.islice(ds, n)]

    full, resumed = pairs(0, 7), pairs(5, 2)
    for a, b in zip(full[5:], resumed, strict=True):
        for u, v in zip(a, b, strict=True):
            np.testing.assert_array_equal(u, v)
    assert not np.array_equal(full[5][0], full[6][0])
    # ImageNet's normalisation: the images come back in [0, 1] with its mean and std.
    raw = full[0][0] * np.float32(IMAGENET_STD) + np.float32(IMAGENET_MEAN)
    assert raw.min() > -1e-5 and raw.max() < 1 + 1e-5


@pytest.mark.parametrize("dataset", ["folder", "cifar10"])
def test_pretext_pairs_are_normalised_with_the_datasets_constants(dataset, tmp_path, configured):
    """One rule (`normalization_constants`) for pretraining, probes and export: the TensorFlow
    backend's pairs of white and black images are (1 - mean) / std and -mean / std."""
    from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD, normalization_constants
    from aetv2_tf.program.pretext_data import PretextData
    from aetv2_tf.program.tensorflow_backend import TensorFlowBackend

    size = 224 if dataset == "folder" else 32
    if dataset == "folder":
        for c, value in enumerate((255, 0)):
            (tmp_path / f"class{c}").mkdir()
            for i in range(4):
                png = tf.io.encode_png(np.full((40, 48, 3), value, np.uint8)).numpy()
                (tmp_path / f"class{c}" / f"{i}.png").write_bytes(png)
        images = list_image_folder(tmp_path)
        mean, std = IMAGENET_MEAN, IMAGENET_STD
    else:
        images = np.repeat(np.array([255, 0], np.uint8), 4)[:, None, None, None] * \
            np.ones((1, size, size, 3), np.uint8)
        mean, std = CIFAR10_MEAN, CIFAR10_STD
    assert normalization_constants(dataset) == (mean, std)
    config = configured(f"--model_dir={tmp_path / 'run'}", f"--dataset={dataset}",
                        f"--backbone={'alexnet' if dataset == 'folder' else 'nin'}",
                        "--train_steps=1")
    backend = TensorFlowBackend(config)
    data = PretextData.of(config, images)
    (x, _), _ = next(iter(backend.dataset_from(data, 0, batch_size=4, augment=False)))
    assert x.shape == (4, size, size, 3)
    values = np.unique(np.round(x.numpy(), 4).reshape(-1, 3), axis=0)
    white = (1 - np.float32(mean)) / np.float32(std)
    black = -np.float32(mean) / np.float32(std)
    for row in values:  # (CIFAR-10's constants on the folder would give 2.51, not 2.25)
        assert np.allclose(row, white, atol=1e-3) or np.allclose(row, black, atol=1e-3), row


def test_two_workers_read_disjoint_shards_whose_union_is_the_batch(tmp_path):
    """`shard=(w, 2)`: each worker decodes its half of every global batch, with its own files,
    crops and homographies; the two halves are the one-worker batch, bit for bit, and over an
    epoch the two workers together read every file once."""
    files = _id_folder(tmp_path)  # 24 files: 4 global batches of 6 an epoch

    def stream(shard):
        ds = pretext_dataset(files, 6, seed=3, image_size=32, shard=shard, mean=(0, 0, 0),
                             std=(1, 1, 1))
        return [(x.numpy(), tx.numpy(), p.numpy()) for (x, tx), p in itertools.islice(ds, 4)]

    whole, first, second = stream((0, 1)), stream((0, 2)), stream((1, 2))
    seen = []
    for one, a, b in zip(whole, first, second, strict=True):
        for u, v, w in zip(one, a, b, strict=True):
            assert v.shape[0] == w.shape[0] == 3
            np.testing.assert_array_equal(u, np.concatenate([v, w]))
        assert not set(_ids(a[0])) & set(_ids(b[0]))  # different files
        assert not np.allclose(a[2], b[2])  # different homographies
        seen += [*_ids(a[0]), *_ids(b[0])]
    assert sorted(seen) == list(range(24))
    with pytest.raises(ValueError, match="only the training stream of a file list"):
        pretext_dataset(np.zeros((8, 32, 32, 3), np.uint8), 4, seed=0, shard=(0, 2))


def test_file_batches_are_a_pure_function_of_seed_and_step(tmp_path):
    """The Pillow reader of the JAX adapter: step s of a stream started at s equals step s of
    the stream from 0; an epoch reads each file at most once; the centre crop (augment off) is
    `load_crop` without a generator; the crops follow the 224-pixel protocol (size S)."""
    from aetv2_tf.data.stream import FileBatches, load_crop

    files = _id_folder(tmp_path)  # 24 files of 40 x 48
    full = FileBatches(files, 5, 3, 0, 8, size=32)
    later = FileBatches(files, 5, 3, 6, 8, size=32)
    np.testing.assert_array_equal(full[6], later[0])
    np.testing.assert_array_equal(full[7], later[1])
    epoch = np.concatenate([full[i][:, 16, 16, 0] for i in range(4)])
    assert len(set(epoch.tolist())) == 20 and full[0].shape == (5, 32, 32, 3)
    assert full[0].dtype == np.uint8
    centre = FileBatches(files, 5, 3, 0, 1, size=32, augment=False)[0]
    rows = centre[:, 16, 16, 0]
    for image, file_id in zip(centre, rows, strict=True):
        path = tmp_path / f"class{file_id // 12}" / f"{file_id % 12:02d}.png"
        np.testing.assert_array_equal(image, load_crop(str(path), 32, None))
    crops = [FileBatches(files, 5, seed, 0, 1, size=32)[0] for seed in (1, 2)]
    assert not np.array_equal(crops[0], crops[1])


def test_reader_threads_share_the_epoch_order_safely():
    """Keras calls `__getitem__` from several threads: steps on both sides of an epoch
    boundary, read concurrently over a large list, are the steps read one by one."""
    from concurrent.futures import ThreadPoolExecutor

    from aetv2_tf.data.stream import ImageBatches

    images = np.arange(400_000, dtype=np.int64)  # "images" are their own indices
    steps = [s for boundary in (0, 1000, 2000) for s in range(boundary - 4, boundary + 4)
             if s >= 0] * 4
    expected = {s: ImageBatches(images, 400, 7, 0, 3000).batch(s) for s in set(steps)}
    for _ in range(3):
        shared = ImageBatches(images, 400, 7, 0, 3000)
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(shared.batch, steps))
        for step, batch in zip(steps, got, strict=True):
            np.testing.assert_array_equal(batch, expected[step])


#: The README's commands for one's own images ("Your own images"), as a test runs them:
#: pretraining (no labels needed), then, with labels, the KNN probe of the encoder.
OWN_IMAGES = ("--flagfile=configs/quickstart.cfg", "--dataset=folder", "--data_dir={root}",
              "--model_dir={run}", "--quick_knn_train=0")
OWN_IMAGES_PROBE = ("--flagfile=configs/cifar10_probe_knn.cfg", "--dataset=folder",
                    "--data_dir={root}", "--pretrained={run}", "--model_dir={run}_knn")


@pytest.mark.slow
def test_the_readme_commands_pretrain_on_own_images_and_probe_them_with_labels(
        tmp_path, cifar10_dir, program, capsys):
    """A few hundred images of assorted sizes: without labels in ONE folder
    (ROOT/train/<any name>/), pretrained with the README's command as it stands (the test
    shortens only its length and leaves out the export); with labels (ROOT/train/<class>/,
    ROOT/val/<class>/), the encoder scored by the README's probe command. A split folder
    without any sub-folder is refused with the layout to use."""
    from PIL import Image

    from aetv2_tf.data.sources import load_cifar10

    images, labels = load_cifar10(cifar10_dir, "test")
    unlabelled, labelled = tmp_path / "my_images", tmp_path / "my_labelled_images"
    for i, (image, label) in enumerate(zip(images[:400], labels[:400], strict=True)):
        size = (32 + 8 * (i % 5), 32 + 4 * (i % 3))  # 32-64 px wide, 32-40 px high
        image = Image.fromarray(image).resize(size)
        folders = [labelled / ("train" if i < 300 else "val") / f"class_{label % 2}"]
        if i < 300:
            folders.append(unlabelled / "train" / "photos")
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            image.save(folder / f"{i:03d}.jpg")
    run = tmp_path / "runs" / "my_images"
    short = ("--train_seconds=0", "--train_steps=2", "--batch_size=16", "--export=false")
    assert program(*[a.format(root=unlabelled, run=run) for a in OWN_IMAGES], *short) == 0
    out = capsys.readouterr().out
    assert "| folder, 300 training images |" in out and "Done (pretext): steps=2," in out, out
    assert (run / "encoder.weights.h5").is_file()
    assert program(*[a.format(root=labelled, run=run) for a in OWN_IMAGES_PROBE]) == 0
    out = capsys.readouterr().out
    assert "Done (probe): probe=knn, feature=block2, " in out, out
    assert (tmp_path / "runs" / "my_images_knn" / "results.json").is_file()
    (unlabelled / "train" / "photos").rename(unlabelled / "flat")
    with pytest.raises(DataError, match=r"0 class sub-directories.*at least 1 class "
                                        r"\(images without labels: one sub-directory"):
        list_image_folder(unlabelled, "train", min_classes=1)


def test_the_readme_shows_the_own_images_commands_this_file_runs():
    """The README's "Your own images" block holds exactly the two commands run above (with
    ROOT and runs/my_images for the test's folders)."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Your own images"):]
    section = section[:section.index("\n## ")]
    block = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands = [".venv/bin/python -m aetv2_tf.train " + " ".join(
        a.format(root="ROOT", run="runs/my_images") for a in args)
        for args in (OWN_IMAGES, OWN_IMAGES_PROBE)]
    assert len(block) == 1 and block[0].splitlines() == commands, (block, commands)
