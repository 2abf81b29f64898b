"""The campaign's tools at tiny size on the CPU, as a device machine runs them (Keras on JAX):
what a device call carries, counted as the tool counts it and refused above 62 MiB; the JPEG
pack and its checks; a leg that resumes each run from the checkpoint it is given, streams each
run's output into its console and returns the new checkpoint within the device tool's file
limits; and the landing in results/ with its ledger rows, a leg cut by the tool included; a
leg's deadline (``--stop_after_seconds``) ends a run with a checkpoint."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from aetv2_tf.data.sources import load_cifar10
from benchmarks import device_wheels
from experiments.campaign import land, leg, luggage, pack, prepare
from experiments.scale import make_devdata
from tests.cli import REPO, run_module

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


def git(folder: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          cwd=folder, check=True, capture_output=True, text=True).stdout


def test_the_luggage_is_what_the_tool_sends(tmp_path):
    """Tracked and untracked-not-ignored files from the root git names, a carried folder
    (a link in it as a link), nothing ignored and not carried; above 62 MiB: refused."""
    root = tmp_path / "checkout"
    (root / "sub").mkdir(parents=True)
    git(root, "init", "-q")
    (root / ".gitignore").write_text("/ignored/\n/.whl/\n")
    (root / "sub" / "tracked.py").write_bytes(b"t" * 100)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "x")
    (root / "untracked.txt").write_bytes(b"u" * 200)
    (root / "ignored").mkdir()
    (root / "ignored" / "big.bin").write_bytes(b"i" * 300)
    (root / ".whl" / "deep").mkdir(parents=True)
    (root / ".whl" / "a.whl").write_bytes(b"w" * 400)
    (root / ".whl" / "deep" / "b.whl").write_bytes(b"w" * 50)
    os.symlink(tmp_path, root / ".whl" / "link")  # travels as a link, not what it points to
    link = len(os.fsencode(str(tmp_path)))
    assert luggage.repository_root(root / "sub") == root
    gitignore = (root / ".gitignore").stat().st_size
    assert luggage.travelling_bytes(root, []) == gitignore + 100 + 200
    assert luggage.travelling_bytes(root, [".whl"]) == gitignore + 100 + 200 + 450 + link
    assert luggage.luggage_problem(62 * 2**20, "x") is None
    with open(root / ".whl" / "sparse.bin", "wb") as f:  # 62 MiB of nothing on disk
        f.truncate(62 * 2**20)
    total = luggage.travelling_bytes(root, [".whl"])
    assert total > 62 * 2**20
    assert "more than 62 MiB of the tool's 64 MiB" in luggage.luggage_problem(total, ".whl")


def test_prepare_counts_the_whole_checkout_and_refuses_what_would_not_fit(tiny_pack, tmp_path,
                                                                          monkeypatch, capsys):
    root = tmp_path / "checkout"
    root.mkdir()
    git(root, "init", "-q")
    (root / ".gitignore").write_text("/.whl/\n/.devdata/\n")
    (root / "README.md").write_bytes(b"r" * 1000)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "x")
    shutil.copytree(tiny_pack, root / pack.PACK_FOLDER)
    monkeypatch.setattr(luggage, "repository_root", lambda inside=None: root)
    assert prepare.main([]) == 2  # the wheels: not in this checkout's git history
    assert "cannot be read" in capsys.readouterr().err
    assert device_wheels.restore(root, history=REPO) == []  # this repository's history has them
    assert prepare.main([]) == 0
    printed = capsys.readouterr().out
    expected = luggage.travelling_bytes(root, [".whl", pack.PACK_FOLDER])
    assert f"the call sends {expected / 2**20:.1f} MiB" in printed
    assert printed.splitlines()[-1] == prepare.device_call()
    assert prepare.device_call() in (REPO / "docs" / "campaign.md").read_text()  # as documented
    with open(root / pack.PACK_FOLDER / "huge.bin", "wb") as f:
        f.truncate(62 * 2**20)
    assert prepare.main([]) == 2
    assert "more than 62 MiB of the tool's 64 MiB" in capsys.readouterr().err


def test_the_device_wheels_come_from_git_checked_and_nothing_else_is_installed(tmp_path):
    """Restored from this repository's history by SHA-256; a damaged wheel or another file in
    .whl/ (the device installs .whl/*.whl) is reported and left as it is."""
    assert device_wheels.restore(tmp_path, history=REPO) == []
    folder = tmp_path / device_wheels.FOLDER
    assert sorted(p.name for p in folder.iterdir()) == sorted(device_wheels.WHEELS)
    for name, (_, digest) in device_wheels.WHEELS.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    keras_wheel = folder / "keras-3.15.1-py3-none-any.whl"
    keras_wheel.write_bytes(b"damaged")
    (folder / "optree-0.17.0-cp312-cp312-manylinux_2_17_x86_64.whl").write_bytes(b"old")
    problems = device_wheels.restore(tmp_path, history=REPO)
    assert len(problems) == 2 and "keras-3.15.1-py3-none-any.whl is not the wheel" in problems[0]
    assert "holds optree-0.17.0" in problems[1] and "move them out" in problems[1]
    assert keras_wheel.read_bytes() == b"damaged"  # never replaced
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / device_wheels.FOLDER).symlink_to(elsewhere)
    assert "is a symbolic link or not a folder" in device_wheels.restore(linked, history=REPO)[0]
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    assert prepare.CARRY[0] == device_wheels.FOLDER


def test_make_devdata_finds_the_repository_and_counts_all_of_it(cifar10_dir, tmp_path, capsys):
    """Run from experiments/scale, it counts the whole checkout (not its own folder)."""
    assert luggage.repository_root(REPO / "experiments" / "scale") == REPO
    make_devdata.main([f"--source={cifar10_dir}", f"--out={tmp_path / 'c10'}",
                       "--per_batch=2"])
    printed = capsys.readouterr().out
    tracked = sum((REPO / name).lstat().st_size for name in git(
        REPO, "ls-files", "-z").split("\0") if name and (REPO / name).exists())
    total = luggage.travelling_bytes(REPO, [".whl", str(tmp_path / "c10")])
    assert total > tracked and f"{total / 2**20:.1f} MiB of the 64 MiB" in printed, printed


def test_cifar10_is_found_beside_the_checkout_or_beside_its_main_checkout(tmp_path,
                                                                        monkeypatch):
    monkeypatch.delenv("AETV2_CIFAR10_DIR", raising=False)
    main, data = tmp_path / "main", tmp_path / luggage.CIFAR10_IN_SHARED
    data.mkdir(parents=True)
    (data / "data_batch_1").write_bytes(b"x")
    main.mkdir()
    git(main, "init", "-q")
    git(main, "commit", "-q", "--allow-empty", "-m", "x")
    git(main, "worktree", "add", "-q", str(tmp_path / "wt" / "helper"))
    assert luggage.cifar10_source(main) == data
    assert luggage.cifar10_source(tmp_path / "wt" / "helper") == data
    monkeypatch.setenv("AETV2_CIFAR10_DIR", str(tmp_path / "elsewhere"))
    assert luggage.cifar10_source(main) == tmp_path / "elsewhere"


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
    assert rows[1][11] == f"`{first['runs']['aetv2']['checkpoint']['sha256'][:16]}`"
    # The whole run's steps as the program counts them: 1,500 epochs of 320 // 32 steps.
    assert first["images"] == 320
    assert [r[4:6] for r in rows] == [["1 of 15,000", "32 (0.0 %)"]] * 2
    wall = first["runs"]["aetv2"]["wall_s"]
    assert rows[1][9] == f"{wall / 60:.1f} / {wall / 60:.1f}"
    rate = first["runs"]["aetv2"]["pairs_per_sec"]
    assert rows[1][10] == f"{14_999 * 32 / rate / 60:,.0f}"

    console = (tmp_path / "out1" / "console.txt").read_text()
    assert "[aetv1] Stopped (pretext) at step 1 of 15000" in console  # each run's own output
    assert "[aetv2] Stopped (pretext) at step 1 of 15000" in console

    run_leg(tmp_path / "out2", results, work, tiny_pack, "--runs=aetv2")
    second = json.loads((tmp_path / "out2" / "leg.json").read_text())
    assert list(second["runs"]) == ["aetv2"]
    entry = second["runs"]["aetv2"]
    assert entry["resumed_from"] == first["runs"]["aetv2"]["checkpoint"]
    assert (entry["start_step"], entry["steps"]) == (1, 2)
    # The same leg cut by the tool before the run ended: leg.json as the leg writes it when it
    # ships the checkpoint (no exit status, no summary) lands with its step and pairs.
    cut = tmp_path / "cut"
    cut.mkdir()
    cut_leg = leg.Leg(argparse.Namespace(out=cut, seconds=900, mode="sequential",
                                         train_flag=[]))
    cut_leg.record.update(images=second["images"])  # what the leg records after unpacking
    cut_leg.record["runs"]["aetv2"] = {"resumed_from": entry["resumed_from"], "exit": None}
    leg.record_shipment(cut_leg, "aetv2", work / "aetv2", wall=16.0)
    cut_entry = json.loads((cut / "leg.json").read_text())["runs"]["aetv2"]
    assert (cut_entry["exit"], cut_entry["steps"], cut_entry["pairs"]) == (None, 2, 64)
    assert cut_entry["pairs_per_sec"] == 2.0 and "summary" not in cut_entry
    assert land.land(cut, results) == 2
    assert ledger_rows(results)[-1][3:11] == [
        "aetv2", "2 of 15,000", "64 (0.0 %)", "16", "2", "-",
        f"0.3 / {(wall + 16) / 60:.1f}", f"{14_998 * 32 / 2 / 60:,.0f}"]
    assert sorted(p.name for p in (results / "aetv2" / "checkpoints").iterdir()) == [
        "ckpt-2.weights.h5", "ckpt-2.weights.h5.sha256"]
    assert sorted(p.name for p in (results / "aetv1" / "checkpoints").iterdir()) == [
        "ckpt-1.weights.h5", "ckpt-1.weights.h5.sha256"]
    assert (results / "legs" / "leg-2.txt").is_file()
    assert [r[0] + r[3] + r[4] for r in ledger_rows(results)] == [
        "1aetv11 of 15,000", "1aetv21 of 15,000", "2aetv22 of 15,000"]

    with pytest.raises(land.LandingError, match="not past the one"):
        land.land(tmp_path / "out2", results)  # the same step again: refused
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


@pytest.mark.parametrize("key, value, says", [
    ("device", "GPU 0 | H200", "device is 'GPU 0 | H200', not one line of text without '|'"),
    ("images", -5, "images is -5, not a count"),
    ("runs", {"aetv3": {}}, "it names the run 'aetv3', not one of ['aetv1', 'aetv2']"),
    ("runs", {"aetv2": {"wall_s": float("nan")}}, "aetv2: wall_s is nan, not a number from 0"),
    ("runs", {"aetv2": {"parts": ["aetv2.tar.0"], "checkpoint": {"step": "2"}}},
     "aetv2: its shipped checkpoint is"),
    ("runs", {"aetv2": {"parts": ["aetv2.tar.0"], "checkpoint": {
        "step": 2, "file": "checkpoints/ckpt-2.weights.h5", "sha256": "a" * 64 + "\n"}}},
     "aetv2: its shipped checkpoint is"),
    ("runs", {"aetv2": {"steps": 10**400}}, "aetv2: steps is 1000"),
    ("runs", {"aetv2": {"wall_s": 10**400}}, "not a number from 0 to 1e+15"),
    ("runs", {"aetv2": {"pairs_per_sec": -3.0}}, "pairs_per_sec is -3.0, not a number from 0"),
    ("runs", {"aetv2": {"parts": 5}}, "aetv2: its parts are 5, not a list of file names"),
])
def test_a_leg_record_that_is_not_a_legs_is_refused_and_nothing_lands(key, value, says,
                                                                     tmp_path, capsys):
    returned, results = tmp_path / "returned", tmp_path / "results"
    returned.mkdir()
    record = {"started": "2026-11-29 06:00:00 UTC", "device": "cpu", "images": 320, "runs": {}}
    (returned / "leg.json").write_text(json.dumps({**record, key: value}))
    assert land.main([str(returned), f"--results={results}"]) == 2
    assert says in capsys.readouterr().err
    assert not results.exists()


def test_the_committed_ledger_has_the_rows_land_writes():
    """results/campaign/LEDGER.md begins as `land` begins a ledger, so its rows line up."""
    text = (leg.RESULTS / land.LEDGER).read_text()
    assert text.startswith(land.LEDGER_INTRO + land.LEDGER_HEADER)
    columns = land.LEDGER_HEADER.splitlines()[0].count("|")
    assert all(line.count("|") == columns for line in text.splitlines() if line.startswith("|"))


def returned_leg(out: pathlib.Path, work: pathlib.Path, runs: dict[str, tuple[int, dict]],
                 images: int = 320) -> pathlib.Path:
    """A leg's returned folder as `leg` writes it, for runs {name: (checkpoint step, flags)}:
    each run's flags and a checkpoint file with its digest, shipped by `leg.ship`."""
    out.mkdir(parents=True)
    record = {"started": "2026-11-29 06:00:00 UTC", "device": "GPU 0: test", "images": images,
              "runs": {}}
    for run, (step, flags) in runs.items():
        model_dir = work / run
        shutil.rmtree(model_dir, ignore_errors=True)
        (model_dir / "checkpoints").mkdir(parents=True)
        (model_dir / "flags.json").write_text(json.dumps(flags))
        checkpoint = model_dir / "checkpoints" / f"ckpt-{step}.weights.h5"
        checkpoint.write_bytes(f"{run} weights at {step}".encode())
        digest = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
        checkpoint.with_name(checkpoint.name + ".sha256").write_text(f"{digest}  x\n")
        record["runs"][run] = dict(leg.ship(run, model_dir, out), wall_s=240.0,
                                   pairs_per_sec=1600.0, exit=0)
    (out / "leg.json").write_text(json.dumps(record))
    return out


def test_land_checks_every_run_before_it_installs_any(tmp_path):
    """A run whose returned files fail a check stops the landing before any run is installed;
    the rows count the whole run's steps from its flags and the images the leg names."""
    results, work = tmp_path / "results", tmp_path / "work"
    epochs = {"batch_size": 32, "epochs": 1500, "train_steps": 0}
    assert land.land(returned_leg(tmp_path / "leg1", work, {"aetv1": (5, epochs)}),
                     results) == 1
    before = sorted(p.relative_to(results) for p in results.rglob("*"))
    ledger = (results / land.LEDGER).read_text()
    for bad in ({"batch_size": 0, "epochs": 1500}, {"batch_size": 32}):
        returned = returned_leg(tmp_path / f"bad{len(bad)}", work,
                                {"aetv1": (10, epochs), "aetv2": (8, bad)})
        with pytest.raises(land.LandingError, match="aetv2: .*nothing was landed"):
            land.land(returned, results)
        assert sorted(p.relative_to(results) for p in results.rglob("*")) == before
        assert (results / land.LEDGER).read_text() == ledger
    steps = {"batch_size": 16, "epochs": 1500, "train_steps": 100}
    seconds = dict(epochs, train_seconds=60.0)
    assert land.land(returned_leg(tmp_path / "leg2", work, {"aetv1": (10, seconds),
                                                           "aetv2": (8, steps)}), results) == 2
    rows = ledger_rows(results)
    assert [r[3:11] for r in rows] == [
        ["aetv1", "5 of 15,000", "160 (0.0 %)", "240", "1,600", "-", "4.0 / 4.0",
         f"{14_995 * 32 / 1600 / 60:,.0f}"],
        ["aetv1", "10", "320", "240", "1,600", "-", "4.0 / 8.0", "-"],  # --train_seconds
        ["aetv2", "8 of 100", "128 (8.0 %)", "240", "1,600", "-", "4.0 / 4.0",
         f"{92 * 16 / 1600 / 60:,.0f}"]]
    assert sorted(p.name for p in (results / "aetv1" / "checkpoints").iterdir()) == [
        "ckpt-10.weights.h5", "ckpt-10.weights.h5.sha256"]
