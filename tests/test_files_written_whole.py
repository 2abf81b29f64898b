"""One writer of whole files, one digest (docs/reliability.md, "Trust: links and files of
others"): `safe_paths.write_atomically` writes text, bytes and what a saver writes, meets a full
disk (ENOSPC, EFBIG) with the old file intact, no temporary left and the errno kept, and never
follows a link; `files.digests` is the one SHA-256 of files, bytes and arrays, its values those
that are stored (checksums, manifests, presets) and printed (``trainable_digest``)."""

from __future__ import annotations

import ast
import errno
import hashlib
import os
import pathlib
import resource
import signal

import numpy as np
import pytest

from aetv2_tf.errors import UsageError
from aetv2_tf.files import digests
from aetv2_tf.files.safe_paths import write_atomically

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "aetv2_tf"


# ------------------------------------------------------------------------------------ digests
def test_one_sha256_for_files_bytes_and_arrays(tmp_path):
    """Against hashlib directly: a file of three blocks and a bit (read in `BLOCK`s), bytes,
    and arrays (their C-order bytes, in order: a transposed view digests as its copy)."""
    data = os.urandom(3 * digests.BLOCK + 17)
    (tmp_path / "f").write_bytes(data)
    assert digests.file_digest(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    assert digests.sha256([data[:5], data[5:]]) == hashlib.sha256(data).hexdigest()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([True, False])
    want = hashlib.sha256(np.ascontiguousarray(a.T).tobytes() + b.tobytes()).hexdigest()[:16]
    assert digests.arrays_digest([a.T, b]) == want
    assert digests.arrays_digest([a, b]) != want


def test_weights_digest_is_the_arrays_digest_of_the_values():
    import keras

    layer = keras.layers.Dense(3)
    layer.build((None, 2))
    values = [keras.ops.convert_to_numpy(v) for v in layer.weights]
    assert digests.weights_digest(layer.weights) == digests.arrays_digest(values)


def test_hashlib_is_imported_by_the_digests_module_only():
    users = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                   if any(isinstance(node, (ast.Import, ast.ImportFrom)) and "hashlib" in
                          [a.name for a in node.names] + [getattr(node, "module", None)]
                          for node in ast.walk(ast.parse(path.read_text()))))
    assert users == ["files/digests.py"]


# ------------------------------------------------------------------------------------- writer
@pytest.mark.parametrize("kind", ["text", "bytes", "saver"])
def test_write_atomically_writes_text_bytes_and_savers(tmp_path, kind):
    path = tmp_path / "out.weights.h5"
    path.write_text("old")
    seen = []

    def saver(tmp):
        seen.append(os.path.basename(tmp))
        pathlib.Path(tmp).write_bytes(b"saved")

    content = {"text": "é new\n", "bytes": b"\x00\xff", "saver": saver}[kind]
    assert write_atomically(str(path), content) == str(path)
    want = {"text": "é new\n".encode(), "bytes": b"\x00\xff", "saver": b"saved"}[kind]
    assert path.read_bytes() == want
    assert os.listdir(tmp_path) == ["out.weights.h5"]
    if kind == "saver":  # the temporary's name ends as the file's (Keras checks suffixes)
        assert seen == [f".tmp{os.getpid()}-out.weights.h5"]


def _fsync_fails_for(name: str, code: int):
    real = os.fsync

    def fsync(fd):
        if name in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        return real(fd)

    return fsync


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG], ids=["ENOSPC", "EFBIG"])
@pytest.mark.parametrize("kind", ["text", "saver"])
def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, code, kind):
    """The disk fills while the new file is flushed: the error comes out with its errno (the
    program's exit code reads it), the old file is as it was, the temporary is gone."""
    path = tmp_path / "results.json"
    path.write_text("old\n")
    monkeypatch.setattr(os, "fsync", _fsync_fails_for(".tmp", code))
    content = "new\n" if kind == "text" else (lambda tmp: pathlib.Path(tmp).write_text("new"))
    with pytest.raises(OSError) as caught:
        write_atomically(str(path), content)
    assert caught.value.errno == code
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["results.json"]


def test_a_file_over_the_size_limit_fails_with_efbig_cleanly(tmp_path):
    """A real EFBIG (RLIMIT_FSIZE, SIGXFSZ ignored) in the middle of the write."""
    path = tmp_path / "big.bin"
    path.write_bytes(b"old")
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, limits[1]))
    try:
        with pytest.raises(OSError) as caught:
            write_atomically(str(path), bytes(2 << 20))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert caught.value.errno == errno.EFBIG
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["big.bin"]


@pytest.mark.parametrize("where", ["file", "temporary"])
def test_a_link_at_the_file_or_its_temporary_is_refused_and_left(tmp_path, where):
    user = tmp_path / "user.txt"
    user.write_text("mine\n")
    path = tmp_path / "flags.json"
    link = path if where == "file" else tmp_path / f".tmp{os.getpid()}-flags.json"
    link.symlink_to(user)
    with pytest.raises(UsageError, match="is a symbolic link.*nothing was written"):
        write_atomically(str(path), "{}")
    assert user.read_text() == "mine\n" and link.is_symlink()
    assert sorted(os.listdir(tmp_path)) == sorted(["user.txt", link.name])


def test_the_writers_of_results_checkpoints_and_the_precision_cache_are_the_one_writer(
        tmp_path, monkeypatch):
    """`write_results`, `save_atomically` (with its checksum) and the precision cache meet a
    full disk through `write_atomically`: the errno out (the cache: silently, as an unwritable
    cache), nothing left behind."""
    from aetv2_tf.files.saving import save_atomically
    from aetv2_tf.probes.results import write_results
    from aetv2_tf.program import precision
    from tests.folders import make_result

    monkeypatch.setattr(os, "fsync", _fsync_fails_for(".tmp", errno.ENOSPC))
    with pytest.raises(OSError) as caught:
        write_results(tmp_path / "run", make_result("knn", 20.0))
    assert caught.value.errno == errno.ENOSPC and os.listdir(tmp_path / "run") == []
    with pytest.raises(OSError) as caught:
        save_atomically(lambda tmp: pathlib.Path(tmp).write_bytes(b"w"),
                        str(tmp_path / "ckpt" / "ckpt-2.weights.h5"))
    assert caught.value.errno == errno.ENOSPC and os.listdir(tmp_path / "ckpt") == []
    precision._store(str(tmp_path / "cache" / "precision.json"), "machine", {"policy": "x"})
    assert os.listdir(tmp_path / "cache") == []
