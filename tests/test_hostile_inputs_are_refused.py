"""Hostile and oversized inputs (issue "Trust nothing you did not write"), in-process.

Image headers that declare bombs, codings TensorFlow or Pillow cannot decode, or images the two
decoders would decode differently are left out when a folder is listed (`aetv2_tf.data.headers`);
CIFAR-10 pickles cannot ask for more memory than they hold (`aetv2_tf.data.cifar10_pickles`,
measured with tracemalloc, which sees numpy's buffers); a folder listing refuses unreadable,
linked-outside, empty and single class folders; the shuffle buffer of variable-size images holds
crops, not decoded images. No test allocates more than a few MB.
"""

import logging
import os
import pathlib
import pickle
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.data.headers import MAX_IMAGE_PIXELS
from aetv2_tf.data.image_folders import check_image_file
from aetv2_tf.data.pipelines import classification_dataset
from aetv2_tf.data.sources import DataError, list_image_folder, load_cifar10
from tests.folders import decodes, decodes_alike, jpeg_bytes

#: What Pillow says of a file whose headers it cannot read (`headers.header_problem`).
UNREADABLE = "whose headers Pillow cannot read"


# ------------------------------------------------------------------------------------ headers
def _with_frame(jpeg: bytes, sof: int | None = None, precision: int | None = None,
                size: tuple[int, int] | None = None) -> bytes:
    """``jpeg`` with its SOF0 frame header changed: marker, precision, (height, width)."""
    i = jpeg.index(b"\xff\xc0")
    frame = bytearray(jpeg)
    if sof is not None:
        frame[i + 1] = sof
    if precision is not None:
        frame[i + 4] = precision
    if size is not None:
        frame[i + 5:i + 9] = struct.pack(">HH", *size)
    return bytes(frame)


def _png_declaring(width: int, height: int) -> bytes:
    """A small real PNG whose IHDR declares ``width`` x ``height``, with a valid CRC."""
    png = tf.io.encode_png(np.zeros((8, 8, 3), np.uint8)).numpy()
    body = b"IHDR" + struct.pack(">II", width, height) + png[24:29]
    return png[:8] + struct.pack(">I", 13) + body + struct.pack(">I", zlib.crc32(body)) + \
        png[33:]


@pytest.mark.parametrize("name, make, reason", [
    ("jpeg_30000", lambda j: _with_frame(j, size=(30000, 30000)), "JPEG declares 30000 x 30000"),
    ("jpeg_65500", lambda j: _with_frame(j, size=(65500, 65500)), "JPEG declares 65500 x 65500"),
    ("jpeg_12bit_sof1", lambda j: _with_frame(j, sof=0xC1, precision=12),
     f"JPEG {UNREADABLE} (cannot handle 12-bit layers)"),
    ("jpeg_12bit_sof0", lambda j: _with_frame(j, precision=12),
     f"JPEG {UNREADABLE} (cannot handle 12-bit layers)"),
    ("jpeg_lossless_sof3", lambda j: _with_frame(j, sof=0xC3), "lossless JPEG (SOF3)"),
    ("jpeg_hierarchical_sof5", lambda j: _with_frame(j, sof=0xC5), "hierarchical JPEG"),
    ("jpeg_dnl_height", lambda j: _with_frame(j, size=(0, 24)),
     f"JPEG {UNREADABLE} (not identified by this driver)"),
    ("png_30000", lambda j: _png_declaring(30000, 30000), "PNG declares 30000 x 30000"),
    ("png_bad_crc", lambda j: _png_declaring(8, 8)[:29] + b"\0\0\0\0" + _png_declaring(8, 8)[33:],
     f"PNG {UNREADABLE} (broken PNG file (bad header checksum in b'IHDR'))"),
])
def test_undecodable_or_oversized_headers_are_named_not_decoded(tmp_path, name, make, reason):
    """Each header refused by `check_image_file` really fails TensorFlow's decoder (training
    would die at its first batch with an InvalidArgumentError)."""
    path = tmp_path / f"{name}.jpg"
    path.write_bytes(make(jpeg_bytes()))
    found = check_image_file(str(path))
    assert found is not None and found.startswith(reason), found
    assert not decodes(path)


def test_decodable_headers_pass(tmp_path):
    """A real JPEG, its extended 8-bit form (SOF1), a progressive one behind 63 KB of EXIF and ICC
    segments, a CMYK one, a PNG, a GIF and grey 8-bit, 24 and 32-bit BMPs pass and decode alike
    on both decoders; a 1-bit BMP (which TensorFlow refuses), an 8-bit BMP with a colour palette
    (TensorFlow's decoder reads the indices as grey levels) and a GIF bomb are named."""
    from PIL import Image

    image = np.random.default_rng(1).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    files = {"real.jpg": jpeg_bytes(), "sof1.jpg": _with_frame(jpeg_bytes(), sof=0xC1),
             "real.png": _png_declaring(8, 8)}
    for mode in ("L", "P", "RGB", "RGBA", "1"):
        path = tmp_path / f"{mode}.bmp"
        Image.fromarray(image).convert(mode).save(path, "BMP")
        files[path.name] = path.read_bytes()
    exif = Image.Exif()
    exif[0x010E] = "x" * 60000  # ImageDescription: a 60 KB APP1 segment before the frame
    Image.fromarray(image).save(tmp_path / "p.jpg", "JPEG", progressive=True, exif=exif,
                                icc_profile=bytes(3000))
    files["progressive_exif_icc.jpg"] = (tmp_path / "p.jpg").read_bytes()
    Image.fromarray(image).convert("CMYK").save(tmp_path / "cmyk.jpg", "JPEG")
    files["cmyk.jpg"] = (tmp_path / "cmyk.jpg").read_bytes()
    Image.fromarray(image).save(tmp_path / "real.gif", "GIF")
    gif = (tmp_path / "real.gif").read_bytes()
    files["real.gif"] = gif
    files["bomb.gif"] = gif[:6] + struct.pack("<HH", 65535, 65535) + gif[10:]
    refused = {"1.bmp": "1-bit BMP", "bomb.gif": "GIF declares 65535 x 65535",
               "P.bmp": "8-bit BMP with a colour palette"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        found = check_image_file(str(tmp_path / name))
        if name in refused:
            assert found is not None and found.startswith(refused[name]), (name, found)
            if name == "P.bmp":
                assert decodes(tmp_path / name) and not decodes_alike(tmp_path / name)
        else:
            assert found is None and decodes_alike(tmp_path / name), (name, found)
    assert MAX_IMAGE_PIXELS == 89_478_485 == Image.MAX_IMAGE_PIXELS  # Pillow's default


def _gif(screen=(1, 1), frames=((0, 0, 1, 1),), trailer=True) -> bytes:
    """A hand-built GIF89a: a 2-colour global table, then per frame (left, top, width, height) a
    graphic control extension and an image descriptor whose LZW data is one pixel (a frame
    declaring more decodes too short, after giflib has allocated it); then the trailer."""
    out = b"GIF89a" + struct.pack("<HHBBB", *screen, 0x80, 0, 0) + bytes(3) + b"\xff" * 3
    for left, top, width, height in frames:
        out += b"\x21\xf9\x04\x00\x00\x00\x00\x00" + b"\x2c" + \
            struct.pack("<HHHHB", left, top, width, height, 0) + b"\x02\x02\x44\x01\x00"
    return out + (b"\x3b" if trailer else b"")


def _bmp(width=5, height=3, bits=24, compression=0, info=40, pixels=None, cut=0,
         colours=False) -> bytes:
    """A hand-built BMP: file header, info header of ``info`` bytes (12: OS/2 core header),
    colour table for 8 bits (the grey ramp, or with ``colours`` entry i = (i, 255 - i, 0)),
    ``pixels`` (default: the padded rows the header declares)."""
    rows = (bits * width + 31) // 32 * 4 * abs(height)
    pixels = bytes(i % 251 for i in range(rows)) if pixels is None else pixels
    if info == 12:
        header = struct.pack("<IHHHH", 12, width, height, 1, bits)
    else:
        header = struct.pack("<IiiHHIIiiII", info, width, height, 1, bits, compression,
                             len(pixels), 2835, 2835, 0, 0) + bytes(info - 40)
        if compression == 3 and info == 40:
            header += struct.pack("<III", 0xFF0000, 0xFF00, 0xFF)
    entry = (lambda i: bytes((0, 255 - i, i))) if colours else (lambda i: bytes((i, i, i)))
    table = b"".join(entry(i) + (b"" if info == 12 else b"\0") for i in range(256)) \
        if bits <= 8 else b""
    offset = 14 + len(header) + len(table)
    data = b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + header + table + \
        pixels
    return data[:len(data) - cut]


#: (name, file, reason, what the decoders make of it: "fails": TensorFlow's fails; "differs":
#: the two do not decode it alike; "": not decoded here (a bomb), or TensorFlow decodes the
#: frames before a cut or a damaged block, logging an error)
_GIF_BMP_CASES = [
    # TensorFlow sizes its output by the largest frame, giflib allocates every frame before
    # decoding it, Pillow sizes the image by the screen and the first frame
    ("gif_frame_bomb", _gif((8, 8), [(0, 0, 12000, 12000)]),
     "GIF declares 12000 x 12000 = 144,000,000 pixels", ""),
    ("gif_frame_offset_bomb", _gif((8, 8), [(0, 0, 8, 8), (20000, 20000, 1, 1)]),
     "GIF frame 2 (1 x 1 at 20000, 20000) lies outside its 8 x 8 screen", ""),
    ("gif_first_frame_inside", _gif((4, 4), [(2, 2, 1, 1)]),
     "GIF frame 1 (1 x 1 at 2, 2) does not cover its 4 x 4 screen", "differs"),
    ("gif_1001_frames", _gif(frames=[(0, 0, 1, 1)] * 1001), "GIF with over 1,000 frames", ""),
    ("gif_frame_area", _gif((9000, 9000), [(0, 0, 9000, 9000)] * 4),
     "GIF whose 4 frames declare 324,000,000 pixels in all, over the limit of 268,435,455", ""),
    ("gif_cut_in_a_frame", _gif()[:-3], "truncated GIF (it ends at byte 40, before its trailer",
     "fails"),
    ("gif_no_trailer", _gif(trailer=False), "truncated GIF", ""),
    ("gif_no_frame", _gif(frames=()), f"GIF {UNREADABLE} (no more images in GIF file)",
     "fails"),
    ("gif_unknown_block", _gif()[:-1] + b"\x99\x3b", "GIF with an unknown block 0x99 at byte 42",
     ""),
    ("bmp_os2_core_header", _bmp(info=12), "BMP with an OS/2 or other 12-byte header", "fails"),
    ("bmp_truncated", _bmp(cut=1), "truncated BMP (101 bytes; its header declares 102", "fails"),
    # RLE and JPEG rows long enough for TensorFlow's size check "decode" as noise there
    ("bmp_rle8", _bmp(bits=8, compression=1), "BMP with RLE8 compression (at 8 bits", "differs"),
    ("bmp_rle4_code_at_8_bits", _bmp(bits=8, compression=2), "BMP with RLE4 compression",
     "differs"),
    ("bmp_jpeg_rows", _bmp(compression=4),
     f"BMP {UNREADABLE} (Unsupported BMP compression (4))", "differs"),
    ("bmp_bitfields_24", _bmp(compression=3), "BMP with bit fields compression (at 24", ""),
    ("bmp_colour_palette", _bmp(bits=8, colours=True), "8-bit BMP with a colour palette",
     "differs"),
]


@pytest.mark.parametrize("name, data, reason, decoders", _GIF_BMP_CASES,
                         ids=[case[0] for case in _GIF_BMP_CASES])
def test_gif_blocks_and_bmp_codings_are_checked(tmp_path, name, data, reason, decoders):
    """A GIF is walked block by block to its trailer: a frame over the pixel limit or outside
    the screen, a first frame that does not cover it, over 1,000 frames or over 268 M frame
    pixels in all, a GIF cut short and an unknown block are named. A BMP with an OS/2 header,
    compressed rows, a colour palette at 8 bits or fewer bytes than its rows is named:
    TensorFlow fails on the first and last, decodes noise from RLE or JPEG rows and grey levels
    from a palette's indices."""
    path = tmp_path / f"{name}.img"
    path.write_bytes(data)
    found = check_image_file(str(path))
    assert found is not None and found.startswith(reason), found
    if decoders == "fails":
        assert not decodes(path)
    elif decoders == "differs":
        assert not decodes_alike(path)


def test_gif_and_bmp_forms_tensorflow_decodes_pass(tmp_path):
    """Hand-built GIFs of one and three frames, a Pillow animation, and 8-bit (grey ramp), 24
    and 32-bit BMPs with 40/108/124-byte headers, top-down rows and a 32-bit BI_BITFIELDS coding
    pass the check and decode alike on both decoders."""
    from PIL import Image

    frames = [Image.fromarray(np.full((16, 24, 3), 40 * k, np.uint8)) for k in range(3)]
    frames[0].save(tmp_path / "anim.gif", "GIF", save_all=True, append_images=frames[1:])
    files = {"anim.gif": (tmp_path / "anim.gif").read_bytes(), "one.gif": _gif(),
             "three.gif": _gif(frames=[(0, 0, 1, 1)] * 3),
             "bitfields32.bmp": _bmp(bits=32, compression=3)}
    for bits in (8, 24, 32):
        for info in (40, 108, 124):
            files[f"{bits}_{info}.bmp"] = _bmp(bits=bits, info=info)
        files[f"{bits}_top_down.bmp"] = _bmp(bits=bits, height=-3)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        found = check_image_file(str(tmp_path / name))
        assert found is None and decodes_alike(tmp_path / name), (name, found)


def _with_bytes_before_dqt(jpeg: bytes, inserted: bytes) -> bytes:
    i = jpeg.index(b"\xff\xdb")
    return jpeg[:i] + inserted + jpeg[i:]


@pytest.mark.parametrize("inserted", [b"\xff\xff\xff", b"\xff\x00", b"\xff\x00\xff\xff\x00",
                                      b"\xff\xd0"],
                         ids=["fill_bytes", "ff00", "ff00_fill_ff00", "rst0"])
def test_jpeg_fill_bytes_and_standalone_markers_between_segments_pass(tmp_path, inserted):
    """T.81 B.1.1.2: any number of FF fill bytes may precede a marker; FF 00 is not a marker
    (libjpeg skips it as "extraneous bytes" and decodes); RSTn has no length: all decode alike
    on both decoders. A TEM marker (FF 01), which Pillow does not know, is refused: TensorFlow
    decodes the file, Pillow does not."""
    path = tmp_path / "f.jpg"
    path.write_bytes(_with_bytes_before_dqt(jpeg_bytes(), inserted))
    assert check_image_file(str(path)) is None
    assert decodes_alike(path)
    path.write_bytes(_with_bytes_before_dqt(jpeg_bytes(), inserted + b"\xff\x01"))
    assert check_image_file(str(path)) == (
        f"JPEG {UNREADABLE} (no marker found): damaged, truncated or a coding the decoders do "
        "not share; re-save it as a baseline JPEG or a PNG")
    assert decodes(path) and not decodes_alike(path)


def test_a_jpeg_segment_running_past_the_end_is_truncated(tmp_path):
    jpeg = jpeg_bytes()
    path = tmp_path / "f.jpg"
    path.write_bytes(jpeg[:2] + b"\xff\xe1\x40\x00" + jpeg[2:200] + b"\xff\xd9")  # 16 KB APP1
    found = check_image_file(str(path))
    assert found is not None and found.startswith(f"JPEG {UNREADABLE} (Truncated File Read)"), found
    assert not decodes(path)


def test_a_folder_leaves_bombs_out_and_keeps_the_rest(tmp_path):
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        (tmp_path / c / "ok.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "a" / "bomb.png").write_bytes(_png_declaring(30000, 30000))
    (tmp_path / "b" / "deep.jpg").write_bytes(_with_frame(jpeg_bytes(), precision=12))
    files = list_image_folder(tmp_path)
    assert sorted(os.path.basename(p) for p, _ in files.skipped) == ["bomb.png", "deep.jpg"]
    assert [os.path.basename(p) for p in files.paths] == ["ok.jpg", "ok.jpg"]


# ------------------------------------------------------------------------------------ pickles
def _peak_while(fn) -> tuple[int, Exception]:
    """Peak bytes traced (numpy's buffers included) while ``fn()`` raises; and the error."""
    tracemalloc.start()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - returned to the test
        error = e
    else:
        error = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, error


def _reconstruct_pickle(shape: tuple[int, ...], via_ndarray: bool = False) -> bytes:
    """A protocol-2 pickle of ``{b'data': X, b'labels': []}`` where X is
    ``numpy.core.multiarray._reconstruct(numpy.ndarray, shape, b'B')`` (or ``numpy.ndarray(
    shape)``) with no state: a few hundred bytes that ask numpy for ``prod(shape)`` bytes."""
    t = b"(" + b"".join(b"J" + struct.pack("<i", n) for n in shape) + b"t"
    array = b"cnumpy\nndarray\n" + t + b"\x85R" if via_ndarray else \
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + t + b"C\x01B\x87R"
    return b"\x80\x02}(C\x04data" + array + b"C\x06labels]u."


@pytest.mark.parametrize("via_ndarray", [False, True], ids=["reconstruct", "ndarray"])
def test_a_tiny_pickle_cannot_make_numpy_allocate(tmp_path, via_ndarray):
    """The old reader called numpy's real reconstructors: 64 MB here (15 GB for a bigger shape,
    an uncaught MemoryError or an OOM kill); now they are stand-ins that allocate nothing."""
    shape = (1024, 8192) if via_ndarray else (8192, 8192)  # float64 / uint8: 64 MB either way
    payload = _reconstruct_pickle(shape, via_ndarray)
    assert len(payload) < 217
    (tmp_path / "test_batch").write_bytes(payload)
    peak, error = _peak_while(lambda: load_cifar10(tmp_path, "test"))
    assert peak < 4 * 2**20, peak
    assert isinstance(error, DataError) and "test_batch" in str(error), error


@pytest.mark.parametrize("length", [2**40, 2**33], ids=["1TB", "8GB"])
def test_a_14_byte_pickle_asking_for_a_huge_bytes_object_is_a_data_error(tmp_path, length):
    """BINBYTES8 (protocol 4): CPython's C unpickler allocates the declared length before it
    reads it. 1 TB: malloc refuses, a MemoryError; 8 GB: untouched address space, then "pickle
    data was truncated" (or a MemoryError under strict overcommit). Either is a DataError naming
    the file, never a traceback."""
    payload = b"\x80\x04\x8e" + struct.pack("<Q", length) + b"ab."
    assert len(payload) == 14
    (tmp_path / "test_batch").write_bytes(payload)
    with pytest.raises(DataError, match=r"test_batch: (truncated or corrupt CIFAR-10 batch "
                                        r"\(MemoryError|not unpickled \(pickle data was trunc)"):
        load_cifar10(tmp_path, "test")


def test_memo_references_cannot_multiply_a_pickle(tmp_path):
    """12,000 references to one bytes object cost 12,000 pointers; the old reader handed the list
    to np.asarray, which copies each (12 GB for 1 MB objects; 32 MB for the 32 KB ones here)."""
    blob = bytes(32 * 1024)
    n = 1000
    (tmp_path / "test_batch").write_bytes(
        pickle.dumps({b"data": [blob] * n, b"labels": [0] * n}, protocol=4))
    peak, error = _peak_while(lambda: load_cifar10(tmp_path, "test"))
    assert peak < 4 * 2**20, peak
    assert isinstance(error, DataError), error
    assert "data is a list, expected a numpy (N, 3072) uint8 array" in str(error)
    # labels: a list of lists (np.asarray would make an (n, m) array) is refused unconverted
    data = np.zeros((n, 3072), np.uint8)
    (tmp_path / "test_batch").write_bytes(
        pickle.dumps({b"data": data, b"labels": [[0] * 4096] * n}, protocol=4))
    peak, error = _peak_while(lambda: load_cifar10(tmp_path, "test"))
    assert peak < 8 * 2**20, peak
    assert isinstance(error, DataError) and "expected (1000,) integers" in str(error), error


def test_array_states_must_hold_their_bytes(tmp_path):
    """An array state whose data is shorter than its shape, a state for an admitted global, an
    object or bytes dtype are refused; a real array pickle (numpy 2, protocols 3, 4) loads."""
    good = {b"data": np.arange(2 * 3072).astype(np.uint8).reshape(2, 3072), b"labels": [3, 4]}
    for protocol in (3, 4):
        (tmp_path / "test_batch").write_bytes(pickle.dumps(good, protocol=protocol))
        images, labels = load_cifar10(tmp_path, "test")
        assert images.shape == (2, 32, 32, 3) and labels.tolist() == [3, 4]
        np.testing.assert_array_equal(images[1].transpose(2, 0, 1).reshape(-1), good[b"data"][1])
    short = pickle.dumps(good, protocol=3)  # the state's shape (2, 3072) -> (4, 3072)
    assert short.count(b"K\x02M\x00\x0c\x86") == 1
    short = short.replace(b"K\x02M\x00\x0c\x86", b"K\x04M\x00\x0c\x86")
    (tmp_path / "test_batch").write_bytes(short)
    with pytest.raises(DataError, match=r"shape \(4, 3072\) uint8 \(12,288 bytes\) with 6,144"):
        load_cifar10(tmp_path, "test")
    for name in (b"numpy.core.multiarray\n_reconstruct\n", b"numpy\nndarray\n"):
        # a BUILD on an admitted global would set its attributes for every later read
        (tmp_path / "test_batch").write_bytes(b"\x80\x02c" + name + b"N}X\x01\x00\x00\x00aK\x01s"
                                              b"\x86b.")
        with pytest.raises(DataError, match="refused state for"):
            load_cifar10(tmp_path, "test")
    for bad, message in ((np.array([None] * 3, object), "refused dtype object"),
                         (np.zeros(2, "S3"), "refused dtype")):
        batch = {b"data": bad, b"labels": []}
        (tmp_path / "test_batch").write_bytes(pickle.dumps(batch, protocol=4))
        with pytest.raises(DataError, match=message):
            load_cifar10(tmp_path, "test")


def test_empty_and_wrong_labels_say_the_count_expected(tmp_path):
    """The old message read "labels have shape (0,), expected (0,) integers"."""
    for data, labels, message in (
            (np.zeros((0, 3072), np.uint8), [], r"data holds no image.*holds 10,000"),
            (np.zeros((3, 3072), np.uint8), [], r"labels have shape \(0,\).*expected \(3,\)"),
            (np.zeros((3, 3072), np.uint8), np.zeros(3), r"dtype float64, expected \(3,\) int")):
        batch = {b"data": data, b"labels": labels}
        (tmp_path / "test_batch").write_bytes(pickle.dumps(batch, protocol=4))
        with pytest.raises(DataError, match=message):
            load_cifar10(tmp_path, "test")


# ------------------------------------------------------------------------------------ folders
def _folder(root, classes=("a", "b"), per_class=1):
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            (root / c / f"{i}.jpg").write_bytes(jpeg_bytes())
    return root


def test_an_unreadable_class_folder_is_named(tmp_path, monkeypatch):
    """Tests run as root, which ignores chmod: os.scandir is made to raise PermissionError for
    one class folder instead (the old listing, Path.iterdir, let it through as a traceback)."""
    root = _folder(tmp_path / "f")
    scandir = os.scandir

    def denied(path="."):
        if os.fspath(path).endswith(os.sep + "b"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    listdir = os.listdir

    def denied_listdir(path="."):  # the old listing (Path.iterdir) read it with os.listdir
        if os.fspath(path).endswith(os.sep + "b"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return listdir(path)

    monkeypatch.setattr(os, "scandir", denied)
    monkeypatch.setattr(os, "listdir", denied_listdir)
    with pytest.raises(DataError, match=r"image folder .*/f/b cannot be read \(Permission "
                                        r"denied\); give this user read"):
        list_image_folder(root)


SUPPORTED = "supported: .jpg .jpeg .png .bmp .gif"


@pytest.mark.parametrize("where, name, make, reason", [
    ("a", "photo.webp", lambda p: p.write_bytes(b"RIFF\0\0\0\0WEBPVP8 "),
     f"unsupported format .webp; {SUPPORTED}"),
    ("a", "scan.tiff", lambda p: p.write_bytes(b"II*\0"), f"unsupported format .tiff; {SUPPORTED}"),
    ("a", "zero.jpg", lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
    ("a", "pipe.png", os.mkfifo, "not a regular file"),
    ("a", "more", lambda p: p.mkdir(), "a folder"),
    ("", "README.txt", lambda p: p.write_text("classes"), "not a class folder"),
])
def test_what_an_image_folder_does_not_read_is_named(tmp_path, caplog, where, name, make,
                                                     reason):
    """Every entry of an image folder that is not read as an image (another format, a device,
    a pipe, a link to one, a sub-folder of a class, a file beside the class folders) is left
    out and named in the log with why (before: left out without a word); the same list on
    every backend (`pretext_data.read` lists the folder for both)."""
    root = _folder(tmp_path / "f")
    make(root / where / name)
    with caplog.at_level(logging.WARNING):
        files = list_image_folder(root)
    path = str(root / where / name)
    assert len(files.paths) == 2 and path not in files.paths
    assert [r for p, r in files.skipped if p == path][0].startswith(reason), files.skipped
    assert f"Left out 1 file(s) of {root} that are not read as images: {path} ({reason}" in \
        caplog.text, caplog.text


def test_a_class_folder_linked_to_a_folder_holding_the_root_is_refused(tmp_path):
    root = _folder(tmp_path / "f")
    for name, target in (("etc", pathlib.Path("/")), ("loop", root), ("up", tmp_path)):
        (root / name).symlink_to(target)
        with pytest.raises(DataError, match=f"class folder {name} is a symbolic link to "
                           f"{target}, which contains the image folder itself"):
            list_image_folder(root)
        (root / name).unlink()
    (root / "alias").symlink_to(root / "a")  # inside the root: a class like any other
    other_disk = _folder(tmp_path / "elsewhere", classes=("c",))
    (root / "c").symlink_to(other_disk / "c")  # a class kept elsewhere: a class too
    assert list_image_folder(root).class_names == ["a", "alias", "b", "c"]


def test_empty_and_single_class_folders_are_refused(tmp_path):
    root = _folder(tmp_path / "f", classes=("a",))
    with pytest.raises(DataError, match=r"has 1 class sub-directory \(a\).*at least 2 classes"):
        list_image_folder(root)
    (root / "b").mkdir()
    (root / "b" / "notes.txt").write_text("no image")
    with pytest.raises(DataError, match="class folder b holds no image"):
        list_image_folder(root)
    # its only image is left out
    (root / "b" / "bomb.png").write_bytes(_png_declaring(30000, 30000))
    with pytest.raises(DataError, match=r"no image of class folder\(s\) b can be decoded"):
        list_image_folder(root)


# ------------------------------------------------------------------------------ shuffle buffer
def test_the_shuffle_buffer_holds_crops_not_decoded_images():
    """Variable-size images are cropped BEFORE the shuffle buffer: its elements are (S, S, 3)
    whatever the images' size (1,024 decoded 12-megapixel photos took 37 GB), and an image gets
    another crop in each epoch of a stream without repeat."""
    yy, xx = np.mgrid[:600, :500]
    big = [np.stack([yy % 256, xx % 256, np.full_like(yy, 40 * i)], -1).astype(np.uint8)[
        :, :400 + 10 * i] for i in range(6)]
    ds = tf.data.Dataset.from_generator(
        lambda: ((im, np.int64(i)) for i, im in enumerate(big)),
        output_signature=(tf.TensorSpec([None, None, 3], tf.uint8), tf.TensorSpec([], tf.int64)))
    stream = classification_dataset(ds, None, 3, seed=0, training=True, image_size=32,
                                     mean=(0, 0, 0), std=(1, 1, 1))
    shuffles, todo = [], [stream]
    while todo:  # every dataset of the chain, back to the source
        node = todo.pop()
        if type(node).__name__.endswith("ShuffleDataset"):
            shuffles.append(node)
        todo += node._inputs()
    assert shuffles and all(list(s.element_spec[0].shape) == [32, 32, 3] for s in shuffles)
    epochs = [{int(y): x.numpy() for xs, ys in stream for x, y in zip(xs, ys, strict=True)}
              for _ in range(2)]
    assert sorted(epochs[0]) == list(range(6)) == sorted(epochs[1])
    assert any(not np.array_equal(epochs[0][k], epochs[1][k]) for k in range(6))
