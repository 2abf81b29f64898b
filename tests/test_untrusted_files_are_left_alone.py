"""Issue "Trust nothing you did not write": no command deletes what it did not create, a foreign
SavedModel is not run unasked, and bad input is refused before anything is written.

Mostly in-process (the library functions, and `aetv2_tf.train.main` with parsed flags, which is
the command line without the interpreter start); one subprocess runs `python -m aetv2_tf.export`
for its exit code. Every "nothing touched" is checked byte for byte (`tree`: the SHA-256 of every
file under a folder).
"""

from __future__ import annotations

import json
import os
import pathlib

import keras
import pytest

from aetv2_tf.files.provenance import MANIFEST, ExportTargetError, verify_export
from aetv2_tf.program import rundir
from aetv2_tf.program.rundir import UsageError
from tests.cli import REPO, run_module
from tests.folders import ESSENTIAL, run_flags, tree


def user_folder(root: pathlib.Path) -> pathlib.Path:
    """A home-like folder of user files."""
    (root / "photos").mkdir(parents=True)
    (root / "notes.txt").write_text("my notes\n")
    (root / "photos" / "cat.jpg").write_bytes(os.urandom(1000))
    return root


def fake_run(root: pathlib.Path, **flags) -> pathlib.Path:
    """A pretraining model_dir as a run leaves it (flags.json, a checkpoint and its checksum)."""
    (root / "checkpoints").mkdir(parents=True)
    record = {"stage": "pretext", "backbone": "nin", "dataset": "cifar10", "loss": "geodesic",
              "batch_size": 16, "batch_norm": "fused", **flags}
    (root / "flags.json").write_text(json.dumps(record))
    (root / "checkpoints" / "ckpt-4.weights.h5").write_bytes(os.urandom(3000))
    (root / "checkpoints" / "ckpt-4.weights.h5.sha256").write_text("0" * 64)
    return root


@pytest.fixture(scope="module")
def encoder() -> keras.Model:
    from aetv2_tf.models import build_backbone

    keras.utils.set_random_seed(0)
    return build_backbone("nin", (32, 32, 3), batch_norm="keras")


@pytest.fixture(scope="module")
def exported(encoder, tmp_path_factory) -> pathlib.Path:
    """A project export (with its aetv2_export.json)."""
    from aetv2_tf.export import export_encoder

    return pathlib.Path(export_encoder(encoder, str(tmp_path_factory.mktemp("x") / "encoder")))


# ------------------------------------------------------------------ 1. export --output
@pytest.mark.parametrize("where", ["user_folder", "cwd", "parent_of_cwd", "model_dir",
                                   "export_with_a_user_file"])
def test_export_never_replaces_what_it_did_not_write(where, encoder, exported, tmp_path,
                                                     monkeypatch):
    """`export_encoder` at a folder of user files, at '.', at '..', at a model_dir, at an export
    the user added a file to: ExportTargetError (a ValueError), every file byte-identical."""
    from aetv2_tf.export import export_encoder

    root = user_folder(tmp_path / "home")
    output = str(root)
    if where in ("cwd", "parent_of_cwd"):
        (root / "work").mkdir()
        monkeypatch.chdir(root / "work" if where == "parent_of_cwd" else root)
        output = ".." if where == "parent_of_cwd" else "."
    elif where == "model_dir":
        fake_run(root / "run")
        output = str(root / "run")
    elif where == "export_with_a_user_file":
        import shutil

        shutil.copytree(exported, root / "encoder")
        (root / "encoder" / "README.txt").write_text("mine")
        output = str(root / "encoder")
    before = tree(root)
    with pytest.raises(ExportTargetError, match="nothing was changed|folder above it"):
        export_encoder(encoder, output)
    assert tree(root) == before
    assert sorted(os.listdir(tmp_path)) == ["home"]  # no temporary left beside it


def test_export_replaces_its_own_previous_export(encoder, tmp_path):
    """A previous export (its manifest matches) is replaced: written beside, swapped, the old
    one removed; nothing else is left in the parent folder."""
    from aetv2_tf.export import export_encoder

    out = tmp_path / "encoder"
    export_encoder(encoder, str(out))
    (out / "variables").mkdir(exist_ok=True)
    assert verify_export(str(out)) is None
    first = tree(out)
    export_encoder(encoder, str(out))
    assert verify_export(str(out)) is None and MANIFEST in first
    assert sorted(os.listdir(tmp_path)) == ["encoder"]


def test_export_command_refuses_its_own_model_dir(tmp_path):
    """`python -m aetv2_tf.export --model_dir=RUN --output=RUN`: exit 2 before any work, the
    run's checkpoints byte-identical."""
    run = fake_run(tmp_path / "run")
    before = tree(run)
    proc = run_module("aetv2_tf.export", f"--model_dir={run}", f"--output={run}", check=False,
                      timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "is a run's --model_dir" in proc.stderr and "Traceback" not in proc.stderr
    assert tree(run) == before
    # A malformed record (a dict where the backbone goes, no dataset): exit 2, no traceback
    # (before: KeyError, exit 1); a missing --model_dir: exit 2 (before: 1).
    (run / "flags.json").write_text(json.dumps({"stage": "pretext", "backbone": {"a": 1}}))
    proc = run_module("aetv2_tf.export", f"--model_dir={run}", f"--output={tmp_path / 'out'}",
                      check=False, timeout=300)
    assert proc.returncode == 2 and "--backbone is {" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_a_manifestless_export_with_a_user_file_deep_inside_is_not_replaced(tmp_path):
    """An export of an earlier version (no manifest) at a run's export/encoder is replaced only
    when it holds nothing but SavedModel files: a user's file under variables/ (whose name a
    shell-style `variables/variables.data-*` would have matched) keeps it, refused."""
    from aetv2_tf.files.provenance import check_export_target

    run = fake_run(tmp_path / "run")
    old = run / "export" / "encoder"
    (old / "variables" / "variables.data-x").mkdir(parents=True)
    (old / "saved_model.pb").write_bytes(b"pb")
    (old / "variables" / "variables.index").write_bytes(b"index")
    check_export_target(str(old))  # only SavedModel files: the run's own export may replace it
    (old / "variables" / "variables.data-x" / "notes.txt").write_text("mine")
    before = tree(old)
    with pytest.raises(ExportTargetError, match="not an export of this project"):
        check_export_target(str(old))
    assert tree(old) == before


# ------------------------------------------------------------------ 2. --overwrite
def test_overwrite_refuses_a_folder_dataset_root(tmp_path):
    """A folder dataset's root that holds a flags.json: --overwrite with other flags is refused,
    naming an image, and the dataset's train/ and test/ are byte-identical."""
    root = fake_run(tmp_path / "dataset")
    for split, cls in (("train", "cat"), ("test", "dog")):
        (root / split / cls).mkdir(parents=True)
        (root / split / cls / "0001.png").write_bytes(os.urandom(500))
    before = tree(root)
    with pytest.raises(UsageError, match=r"did not write.*0001\.png.*Nothing was changed"):
        rundir.prepare(str(root), run_flags(batch_size=32), "--batch_size=32\n", ESSENTIAL,
                       overwrite=True)
    assert tree(root) == before


def test_overwrite_moves_the_old_run_aside_and_deletes_nothing(tmp_path):
    """--overwrite moves the previous run into <model_dir>/overwritten-<time>/, every file kept
    byte for byte; a file of the user beside the run stays where it is."""
    run = fake_run(tmp_path / "run")
    (run / "train").mkdir()
    (run / "train" / "events.out.tfevents.1.host").write_bytes(b"events")
    (run / "my_notes.txt").write_text("mine")
    before = tree(run)
    rundir.prepare(str(run), run_flags(batch_size=32), "--batch_size=32\n", ESSENTIAL,
                   overwrite=True)
    aside = [p for p in run.iterdir() if p.name.startswith("overwritten-")]
    assert len(aside) == 1
    moved = tree(aside[0])
    assert {k: v for k, v in before.items() if k != "my_notes.txt"} == moved
    assert (run / "my_notes.txt").read_text() == "mine"
    assert json.loads((run / "flags.json").read_text())["batch_size"] == 32
    assert not (run / "checkpoints").exists()


def test_a_start_that_trained_nothing_does_not_block_the_corrected_command(tmp_path):
    """A start that failed after its flags were written (e.g. out of memory at the first step:
    flags and an events file, no checkpoint) is not a run to protect: the corrected command
    (another --batch_size) starts there, the old record set aside; a run with a checkpoint is
    still refused."""
    run = tmp_path / "run"
    (run / "train").mkdir(parents=True)
    (run / "flags.json").write_text(json.dumps(run_flags()))
    (run / "train" / "events.out.tfevents.1.host").write_bytes(b"events")
    rundir.prepare(str(run), run_flags(batch_size=8), "--batch_size=8\n", ESSENTIAL,
                   overwrite=False)
    assert json.loads((run / "flags.json").read_text())["batch_size"] == 8
    aside = next(p for p in run.iterdir() if p.name.startswith("overwritten-"))
    assert json.loads((aside / "flags.json").read_text())["batch_size"] == 16

    trained = fake_run(tmp_path / "trained")
    with pytest.raises(UsageError, match="different essential flags"):
        rundir.prepare(str(trained), run_flags(batch_size=8), "", ESSENTIAL, overwrite=False)


@pytest.mark.parametrize("content", ["not json {", "[1, 2]", '{"stage": {"a": 1}}'])
def test_a_malformed_flags_json_is_refused_naming_the_file(content, tmp_path):
    """flags.json that is not JSON, a list, a dict where a string is expected: UsageError (exit
    2) naming the file and the fix, nothing written."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "flags.json").write_text(content)
    before = tree(run)
    with pytest.raises(UsageError, match=r"flags\.json.*(move it away|restore)"):
        rundir.prepare(str(run), run_flags(), "--stage=pretext\n", ESSENTIAL, overwrite=False)
    assert tree(run) == before


# ------------------------------------------------------------------ the program, in-process
# (`program`: conftest.py)
def test_a_probe_whose_pretrained_is_its_model_dir_is_refused_even_with_overwrite(
        tmp_path, cifar10_dir, program, capsys):
    """Following the old advice (--overwrite) deleted the pretraining run's checkpoints; now the
    probe is refused (exit 2) with "choose another --model_dir", the run byte-identical."""
    run = fake_run(tmp_path / "run")
    before = tree(run)
    code = program("--stage=probe", "--probe=knn", f"--pretrained={run}", f"--model_dir={run}",
                   f"--data_dir={cifar10_dir}", "--overwrite")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "choose another --model_dir" in err and "pass --overwrite" not in err
    assert tree(run) == before


def test_batch_larger_than_the_data_is_refused_before_writing(tmp_path, cifar10_dir, program,
                                                              capsys):
    """--train_examples=4 --batch_size=8: exit 2 with the fix (was a ValueError traceback), no
    model_dir created."""
    model_dir = tmp_path / "run"
    code = program(f"--flagfile={REPO / 'configs' / 'quickstart.cfg'}", "--train_seconds=0",
                   "--train_steps=2", "--quick_knn_train=0", f"--model_dir={model_dir}",
                   f"--data_dir={cifar10_dir}", "--train_examples=4", "--batch_size=8")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--batch_size=8" in err and "lower --batch_size" in err and "Traceback" not in err
    assert not model_dir.exists()


# ------------------------------------------------------------------ 3. foreign SavedModels
def hostile_saved_model(path: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    """A SavedModel whose resource initialiser (run by tf.saved_model.load) and serving
    signature (run when called) write `marker`; it has the signature a probe expects."""
    import tensorflow as tf

    class Writer(tf.saved_model.experimental.TrackableResource):
        def _create_resource(self):
            return tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="")

        def _initialize(self):
            tf.io.write_file(str(marker), "ran on load")
            return tf.raw_ops.AssignVariableOp(resource=self.resource_handle, value=1.0)

    class Hostile(tf.Module):
        def __init__(self):
            super().__init__()
            self.writer = Writer()

        @tf.function(input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.uint8,
                                                    name="images")])
        def serve(self, images):
            tf.io.write_file(str(marker), "ran on call")
            mean = tf.reduce_mean(tf.cast(images, tf.float32), axis=[1, 2, 3])
            return {"block2": tf.ones([1, 8, 8, 192]) * mean[:, None, None, None]}

    module = Hostile()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    assert not marker.exists()
    return path


def _load(pretrained, trust: bool):
    from aetv2_tf.data.constants import normalization_constants
    from aetv2_tf.probes.frozen_encoder import load_frozen_encoder

    mean, std = normalization_constants("cifar10")
    return load_frozen_encoder(str(pretrained), "nin", "block2", batch_norm="keras", mean=mean,
                               std=std, trust_saved_model=trust)


def test_a_foreign_saved_model_is_not_run_unless_trusted(tmp_path):
    """Refused (UsageError naming the risk and --trust_saved_model), the marker never written;
    with trust_saved_model=True it loads (and its graph runs: the marker appears)."""
    import numpy as np

    marker = tmp_path / "marker"
    path = hostile_saved_model(tmp_path / "foreign", marker)
    with pytest.raises(UsageError, match=r"loading it runs its graph.*--trust_saved_model"):
        _load(path, trust=False)
    assert not marker.exists()
    encoder = _load(path, trust=True)
    assert marker.exists()  # what trusting means: its code ran
    out = encoder.model(np.zeros((2, 32, 32, 3), np.float32))
    assert tuple(out["block2"].shape) == (2, 8, 8, 192)


def test_a_project_export_loads_and_a_tampered_one_is_refused(exported, tmp_path):
    """The project's own export loads without the flag; the same export with another
    saved_model.pb (or an added file) is refused before tf.saved_model.load."""
    import shutil

    assert _load(exported, trust=False).kind == "saved_model"
    tampered = tmp_path / "tampered"
    shutil.copytree(exported, tampered)
    hostile_saved_model(tmp_path / "hostile", tmp_path / "marker")
    shutil.copy(tmp_path / "hostile" / "saved_model.pb", tampered / "saved_model.pb")
    with pytest.raises(UsageError, match=r"saved_model\.pb is not the file that was exported"):
        _load(tampered, trust=False)
    assert not (tmp_path / "marker").exists()


def test_a_project_export_is_read_as_data_never_run(encoder, exported, tmp_path):
    """A project export loads as weights read into an encoder built here: the same features as
    the encoder that was exported (and as its graph, run only when trusted). A hostile graph
    behind a manifest rewritten to match (what a hostile author can do) is not run either: its
    marker never appears, and the encoder computes what our code computes."""
    import json
    import shutil

    import numpy as np

    from aetv2_tf.data.constants import normalization_constants
    from aetv2_tf.files.provenance import write_manifest
    from aetv2_tf.probes.frozen_encoder import saved_model_features

    mean, std = normalization_constants("cifar10")
    pixels = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3)).astype(np.float32)
    x = (pixels / 255.0 - np.float32(mean)) / np.float32(std)
    want = np.asarray(encoder(x, training=False)["block2"])
    loaded = _load(exported, trust=False)
    assert loaded.checkpoint.endswith("variables")
    np.testing.assert_allclose(np.asarray(loaded.model(x)["block2"]), want, atol=1e-5)
    graph = saved_model_features(str(exported), "block2", 32, mean, std, trust_saved_model=True)
    np.testing.assert_allclose(np.asarray(graph(x)["block2"]), want, atol=1e-4)

    marker = tmp_path / "marker"
    forged = tmp_path / "forged"
    shutil.copytree(exported, forged)
    hostile_saved_model(tmp_path / "hostile", marker)
    shutil.copy(tmp_path / "hostile" / "saved_model.pb", forged / "saved_model.pb")
    record = json.loads((exported / MANIFEST).read_text())["encoder"]
    write_manifest(str(forged), record)  # the digests now match the hostile graph
    assert verify_export(str(forged)) is None
    np.testing.assert_allclose(np.asarray(_load(forged, trust=False).model(x)["block2"]), want,
                               atol=1e-5)
    assert not marker.exists()
    record["shapes"][0] = [7]  # variables that do not fit the backbone: refused
    write_manifest(str(forged), record)
    with pytest.raises(UsageError, match="do not fit a nin encoder"):
        _load(forged, trust=False)
    write_manifest(str(forged))  # no encoder record: only with --trust_saved_model
    with pytest.raises(UsageError, match="records no encoder"):
        _load(forged, trust=False)
    assert not marker.exists()


def test_a_bad_pretrained_writes_nothing_and_the_corrected_command_runs(
        tmp_path, cifar10_dir, program, capsys):
    """A foreign SavedModel as --pretrained: exit 2, the risk and the flag named, no model_dir,
    no marker. A SavedModel that fails only when loaded (no serving signature, trusted): exit 2,
    still no model_dir. The corrected command (another --pretrained) then runs in that
    model_dir (before: refused as a different run, its flags.json already written)."""
    import tensorflow as tf

    model_dir, marker = tmp_path / "probe", tmp_path / "marker"
    common = ("--stage=probe", "--probe=knn", f"--model_dir={model_dir}",
              f"--data_dir={cifar10_dir}", "--train_examples=200", "--test_examples=100")
    foreign = hostile_saved_model(tmp_path / "foreign", marker)
    assert program(*common, f"--pretrained={foreign}") == 2
    err = capsys.readouterr().err
    assert "--trust_saved_model" in err and "runs its graph" in err
    assert not marker.exists() and not model_dir.exists()

    bare = tmp_path / "bare"
    tf.saved_model.save(tf.Module(), str(bare))
    assert program(*common, f"--pretrained={bare}", "--trust_saved_model") == 2
    assert "without the serving_default" in capsys.readouterr().err
    assert not model_dir.exists()

    code = program(*common, "--pretrained=none")
    assert code == 0, capsys.readouterr().err[-3000:]
    assert (model_dir / "results.json").is_file()
