"""The campaign's tools at tiny size on the CPU, as a device machine runs them (Keras on JAX):
the JPEG pack and its checks, a leg that resumes each run from the checkpoint it is given and
returns the new one within the device tool's file limits, and the landing in results/ with its
ledger rows; a leg's deadline (``--stop_after_seconds``) ends a run with a checkpoint."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from aetv2_tf.data.sources import load_cifar10
from experiments.campaign import land, leg, pack
from tests.cli import run_module

#: A tiny leg: batches of 32 from 5 x 64 images, one step per process (the deadline has passed
#: when the first step ends).
TINY = ("--train_flag=--batch_size=32", "--train_flag=--steps_per_execution=1",
        "--train_flag=--stop_after_seconds=0.001", "--poll=0.5")


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory, cifar10_dir) -> pathlib.Path:
    out = tmp_path_factory.mktemp("pack") / "pack"
    manifest = pack.pack(cifar10_dir, out, quality=90, per_batch=64)
    assert manifest["images"] == 320 and manifest["max_abs_error"] < 64
    return out


def test_the_pack_decodes_to_the_images_it_was_checked_with(tiny_pack, cifar10_dir, tmp_path):
    out = tmp_path / "cifar-10-batches-py"
    assert pack.unpack(tiny_pack, out) == []
    images, labels = load_cifar10(out, "train")
    originals, original_labels = load_cifar10(cifar10_dir, "train")
    first = np.concatenate([np.arange(64) + 10_000 * b for b in range(5)])
    np.testing.assert_array_equal(labels, original_labels[first])
    error = np.abs(images.astype(int) - originals[first].astype(int))
    manifest = pack.read_manifest(tiny_pack)
    assert error.max() == manifest["max_abs_error"] and 0 < error.mean() < 4
    assert pack.from_mosaic(pack.to_mosaic(originals[:5]), 5).tobytes() == \
        originals[:5].tobytes()


def test_a_damaged_or_other_pack_is_refused(tiny_pack, tmp_path):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in tiny_pack.iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    jpeg = damaged / "data_batch_3.jpg"
    jpeg.write_bytes(jpeg.read_bytes()[:-10])
    with pytest.raises(pack.PackError, match="data_batch_3.jpg: its SHA-256 differs"):
        pack.unpack(damaged, tmp_path / "out")
    manifest = json.loads((damaged / pack.MANIFEST).read_text())
    manifest["batches"][2]["jpeg_sha256"] = pack.sha256(jpeg.read_bytes())
    (damaged / pack.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(pack.PackError, match="not a decodable JPEG"):
        pack.unpack(damaged, tmp_path / "out")
    jpeg.write_bytes((tiny_pack / jpeg.name).read_bytes())
    manifest["batches"][2]["jpeg_sha256"] = pack.sha256(jpeg.read_bytes())
    manifest["batches"][0]["pixels_sha256"] = "0" * 64  # as if decoded otherwise elsewhere
    (damaged / pack.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(pack.PackError, match="other pixels than the packer's"):
        pack.unpack(damaged, tmp_path / "out")
    assert len(pack.unpack(damaged, tmp_path / "out", allow_other_decoder=True)) == 1
    assert pack.main(["unpack", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2


def ledger_rows(results: pathlib.Path) -> list[list[str]]:
    """The ledger's table rows as cells."""
    lines = (results / land.LEDGER).read_text().splitlines()
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines
            if ln.startswith("| ") and ln[2].isdigit()]


def run_leg(out, results, work, pack_dir, *args):
    return run_module("experiments.campaign.leg", f"--out={out}", f"--results={results}",
                      f"--work={work}", f"--pack={pack_dir}", "--seconds=900", *TINY, *args,
                      env={"KERAS_BACKEND": "jax"}, timeout=900)


@pytest.mark.slow
def test_legs_resume_each_run_from_its_checkpoint_and_land_in_the_ledger(tiny_pack, tmp_path):
    results, work = tmp_path / "results", tmp_path / "work"
    run_leg(tmp_path / "out1", results, work, tiny_pack)
    first = json.loads((tmp_path / "out1" / "leg.json").read_text())
    assert set(first["runs"]) == {"aetv1", "aetv2"}
    for name, entry in first["runs"].items():
        assert entry["exit"] == 0 and entry["resumed_from"] is None, entry
        assert (entry["start_step"], entry["steps"], entry["pairs"]) == (0, 1, 32)
        assert entry["summary"]["stopped_at_deadline"] == "True"
        assert entry["checkpoint"]["file"] == "checkpoints/ckpt-1.weights.h5"
        assert all((tmp_path / "out1" / p).stat().st_size <= leg.PART_BYTES
                   for p in entry["parts"]), name
    assert land.land(tmp_path / "out1", results) == 1
    rows = ledger_rows(results)
    assert [r[:4] for r in rows] == [["1", rows[0][1], "cpu", "aetv1"], ["1", rows[0][1], "cpu",
                                                                          "aetv2"]]
    assert rows[1][9] == f"`{first['runs']['aetv2']['checkpoint']['sha256'][:16]}`"

    run_leg(tmp_path / "out2", results, work, tiny_pack, "--runs=aetv2")
    second = json.loads((tmp_path / "out2" / "leg.json").read_text())
    assert list(second["runs"]) == ["aetv2"]
    entry = second["runs"]["aetv2"]
    assert entry["resumed_from"] == first["runs"]["aetv2"]["checkpoint"]
    assert (entry["start_step"], entry["steps"]) == (1, 2)
    assert land.land(tmp_path / "out2", results) == 2
    assert sorted(p.name for p in (results / "aetv2" / "checkpoints").iterdir()) == [
        "ckpt-2.weights.h5", "ckpt-2.weights.h5.sha256"]
    assert sorted(p.name for p in (results / "aetv1" / "checkpoints").iterdir()) == [
        "ckpt-1.weights.h5", "ckpt-1.weights.h5.sha256"]
    assert (results / "legs" / "leg-2.txt").is_file()
    assert [r[0] + r[3] + r[4] for r in ledger_rows(results)] == ["1aetv11", "1aetv21", "2aetv22"]

    with pytest.raises(land.LandingError, match="not past the one"):
        land.land(tmp_path / "out1", results)  # an older leg again: refused, nothing changed
    part = tmp_path / "out2" / entry["parts"][-1]
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(land.LandingError, match="a part is missing or damaged"):
        land.land(tmp_path / "out2", results)
    assert sorted(p.name for p in (results / "aetv2" / "checkpoints").iterdir())[0] == \
        "ckpt-2.weights.h5"

    (results / "aetv2" / "checkpoints" / "ckpt-2.weights.h5.sha256").unlink()
    proc = run_module("experiments.campaign.leg", f"--out={tmp_path / 'out3'}",
                      f"--results={results}", f"--work={work}", f"--pack={tiny_pack}",
                      "--runs=aetv2", *TINY, env={"KERAS_BACKEND": "jax"}, check=False)
    assert proc.returncode == 2 and "has no ckpt-2.weights.h5.sha256" in proc.stdout
