"""Checkpoints that a crash or a bad disk damaged, in-process: a damaged newest checkpoint is set
aside (renamed `*.bad`, said so) and the one before restored, the readers of an encoder skip a
file whose checksum does not match, and the temporaries of a live writer are never removed.
End to end (a full disk, then a damaged checkpoint, and the run resumes exactly):
test_reliability_interrupt.py.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from tests.folders import damage_file


def test_temporaries_of_a_live_process_are_never_removed(tmp_path):
    """`save_atomically` removes the temporaries that dead processes left, not a live one's."""
    import subprocess

    from aetv2_tf.program.keras_checkpoints import save_atomically

    live = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        for pid in (live.pid, dead.pid):
            (tmp_path / f".tmp{pid}-ckpt-4.weights.h5").write_bytes(b"partial")
        save_atomically(lambda path: pathlib.Path(path).write_bytes(b"whole"),
                        str(tmp_path / "ckpt-6.weights.h5"))
    finally:
        live.kill()
        live.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".tmp{live.pid}-ckpt-4.weights.h5", "ckpt-6.weights.h5", "ckpt-6.weights.h5.sha256"]


@pytest.mark.parametrize("how", ["truncated", "overwritten", "truncated_no_checksum",
                                 "overwritten_no_checksum"])
def test_restore_sets_a_damaged_checkpoint_aside_and_loads_the_one_before(tmp_path, how,
                                                                          capsys):
    """`restore_checkpoint` (what `--model_dir` resumes from, on every backend): the newest
    checkpoint cut in half, or 4 KiB of it overwritten, with or without its checksum (a
    missing digest is a damaged checkpoint: before, an overwritten one whose `.sha256` was
    deleted loaded and the run resumed from it), is renamed `*.bad` with its checksum, said
    so, and the one before is loaded (its weights, its step); with every checkpoint damaged it
    raises (the program's exit 2) and keeps them all. End to end, one case:
    test_reliability_interrupt.py's full-disk test."""
    import keras

    from aetv2_tf.program.keras_checkpoints import KerasCheckpoints, restore_checkpoint

    def model(seed: int) -> keras.Model:
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(512), keras.layers.Dense(3)])

    store, directory = KerasCheckpoints(str(tmp_path), keep=2), tmp_path
    two, four = model(2), model(4)
    store.save(two, 2)
    store.save(four, 4)
    newest = directory / "ckpt-4.weights.h5"
    damage_file(newest, how)
    restored = model(0)
    assert restore_checkpoint(restored, str(directory)) == 2
    out = capsys.readouterr().out
    assert f"Set aside {newest} as {newest}.bad: " in out
    assert ("has no ckpt-4.weights.h5.sha256" in out) == how.endswith("no_checksum"), out
    for got, want in zip(restored.get_weights(), two.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert (directory / "ckpt-4.weights.h5.bad").is_file() and not newest.exists()
    assert (directory / "ckpt-4.weights.h5.bad.sha256").is_file() != how.endswith("no_checksum")
    damage_file(directory / "ckpt-2.weights.h5", how)
    with pytest.raises(FileNotFoundError, match="no intact checkpoint is left"):
        restore_checkpoint(model(0), str(directory))
    assert sorted(p.name for p in directory.glob("*.bad")) == [
        "ckpt-2.weights.h5.bad", "ckpt-4.weights.h5.bad"]


def test_readers_skip_a_file_whose_checksum_does_not_match(tmp_path):
    """The probes' and the export's reader (`encoder_source`) passes over a damaged
    `encoder.weights.h5` to the newest intact checkpoint, and over a checkpoint whose digest
    is missing, renaming nothing."""
    from aetv2_tf.program.keras_checkpoints import encoder_source, save_atomically

    def write(path, data):
        save_atomically(lambda tmp: pathlib.Path(tmp).write_bytes(data), str(path))

    (tmp_path / "checkpoints").mkdir()
    write(tmp_path / "encoder.weights.h5", b"encoder")
    write(tmp_path / "checkpoints" / "ckpt-2.weights.h5", b"two")
    write(tmp_path / "checkpoints" / "ckpt-4.weights.h5", b"four")
    assert encoder_source(str(tmp_path)) == str(tmp_path / "encoder.weights.h5")
    (tmp_path / "encoder.weights.h5").write_bytes(b"encodeR")
    (tmp_path / "checkpoints" / "ckpt-4.weights.h5").write_bytes(b"fouR")
    assert encoder_source(str(tmp_path)) == str(tmp_path / "checkpoints" / "ckpt-2.weights.h5")
    assert (tmp_path / "encoder.weights.h5").is_file()
    (tmp_path / "checkpoints" / "ckpt-2.weights.h5.sha256").unlink()
    assert encoder_source(str(tmp_path)) is None


def test_a_renamed_checkpoint_is_set_aside_not_resumed_at_the_step_of_its_name(tmp_path, capsys):
    """A checkpoint renamed with its checksum (ckpt-4 -> ckpt-5: the digest still matches) is not
    resumed "at step 5": each checkpoint holds its step (the file's `STEP` attribute) and one
    whose name says another is set aside like a damaged one, the one before restored. A
    checkpoint without the stored step is judged by the name its checksum was written for."""
    import os

    import keras

    from aetv2_tf.program.keras_checkpoints import (
        KerasCheckpoints,
        held_step,
        restore_checkpoint,
        save_atomically,
    )

    def model(seed: int) -> keras.Model:
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(3)])

    store, two = KerasCheckpoints(str(tmp_path), keep=2), model(2)
    store.save(two, 2)
    store.save(model(4), 4)
    four, renamed = tmp_path / "ckpt-4.weights.h5", tmp_path / "ckpt-5.weights.h5"
    assert held_step(str(four)) == 4
    os.replace(four, renamed)
    os.replace(f"{four}.sha256", f"{renamed}.sha256")
    restored = model(0)
    assert restore_checkpoint(restored, str(tmp_path)) == 2
    out = capsys.readouterr().out
    assert f"Set aside {renamed} as {renamed}.bad: its name says step 5, but it holds the " \
           "checkpoint of step 4 (renamed?)" in out, out
    for got, want in zip(restored.get_weights(), two.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    earlier = tmp_path / "earlier"
    for step in (1, 2):  # written as earlier versions did: no stored step
        save_atomically(model(step).save_weights, str(earlier / f"ckpt-{step}.weights.h5"))
    os.replace(earlier / "ckpt-2.weights.h5", earlier / "ckpt-3.weights.h5")
    os.replace(earlier / "ckpt-2.weights.h5.sha256", earlier / "ckpt-3.weights.h5.sha256")
    assert held_step(str(earlier / "ckpt-1.weights.h5")) == 1
    assert restore_checkpoint(model(0), str(earlier)) == 1
    assert "its name says step 3, but it holds the checkpoint of step 2" in capsys.readouterr().out
