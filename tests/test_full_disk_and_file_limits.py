"""Every write meets a full disk (ENOSPC) or the process's file-size limit (EFBIG, ``ulimit -f``)
with an OSError that keeps its errno, the previous file intact and nothing half-written left, and
the training program ends with exit 5 (docs/reliability.md), never a crash.

The limits are real, not injected: ``RLIMIT_FSIZE`` set in a child process (CPython ignores
SIGXFSZ, so a write past it fails with EFBIG), and a small tmpfs for ENOSPC, mounted in a private
mount namespace of the child (``unshare --user --map-root-user --mount``: no privilege needed
where user namespaces are allowed; where they are not, that case is skipped, the EFBIG case
covers the same writes). In-process: the program's exit code under a file-size limit.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys

import pytest

from tests.cli import REPO, _env, train_args

#: A child that writes a checkpoint, meets the limit (`sys.argv[2]`: "disk" fills its tmpfs
#: after ckpt-2, else the file-size limit in bytes) at each writer of the project, and prints what
#: each raised and what is left.
WRITERS = r"""
import errno, gc, hashlib, json, os, resource, sys
import keras
import aetv2_tf
from aetv2_tf.files.safe_paths import write_atomically
from aetv2_tf.files.saving import damage, save_encoder_weights
from aetv2_tf.probes.results import write_results
from aetv2_tf.program.keras_checkpoints import KerasCheckpoints
from tests.folders import make_result

root, limit = sys.argv[1], sys.argv[2]
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512), keras.layers.Dense(512)])
encoder = aetv2_tf.build_backbone("nin")
store = KerasCheckpoints(os.path.join(root, "checkpoints"), keep=2)
store.save(model, 2)
save_encoder_weights(encoder, "nin", root)
write_results(root, make_result("knn", 20.0))
write_atomically(os.path.join(root, "flags.cfg"), "--batch_size=16\n")

def tree():
    return {os.path.relpath(os.path.join(d, n), root): hashlib.sha256(
        open(os.path.join(d, n), "rb").read()).hexdigest() for d, _, names in os.walk(root)
        for n in names}

before = tree()
if limit == "disk":  # the disk fills up: a few kB left
    stats = os.statvfs(root)
    with open(os.path.join(root, "..", "filler"), "wb") as f:
        os.posix_fallocate(f.fileno(), 0, stats.f_bavail * stats.f_frsize - 20000)
else:
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.RLIM_INFINITY))
writers = {
    "checkpoint": lambda: store.save(model, 4),
    "encoder.weights.h5": lambda: save_encoder_weights(encoder, "nin", root),
    "save_encoder": lambda: aetv2_tf.save_encoder(encoder, os.path.join(root, "saved")),
    "results.json": lambda: write_results(root, {**make_result("knn", 30.0),
                                                 "flags": {"pad": "x" * 100000}}),
    "flags.cfg": lambda: write_atomically(os.path.join(root, "flags.cfg"), "x" * 100000),
}
raised = {}
for name, write in writers.items():
    try:
        write()
        raised[name] = None
    except OSError as e:
        raised[name] = errno.errorcode.get(e.errno, str(e.errno))
gc.collect()  # what a failed write left open would be closed here (an HDF5 crash, before)
after = tree()
print(json.dumps({"raised": raised, "unchanged": after == before,
                  "new": sorted(set(after) - set(before)),
                  "ckpt2_intact": damage(os.path.join(root, "checkpoints", "ckpt-2.weights.h5"))
                  is None}), flush=True)
"""


def private_tmpfs_command(size: str, mountpoint, command: list[str]) -> list[str]:
    """`command` run with a tmpfs of `size` at `mountpoint`, in a private mount namespace (gone
    with the process); skips when no such namespace can be made here."""
    probe = ["unshare", "--user", "--map-root-user", "--mount", "true"]
    if shutil.which("unshare") is None or subprocess.run(probe, capture_output=True).returncode:
        pytest.skip("no private mount namespace here (unshare --user --mount refused): the "
                    "EFBIG case covers the same writes")
    script = f'mount -t tmpfs -o size={size} tmpfs "$1" && mkdir "$1/run" && shift && exec "$@"'
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh",
            str(mountpoint), *command]


@pytest.mark.parametrize("limit", ["efbig", "enospc"])
def test_every_write_meets_a_full_disk_or_a_size_limit_with_an_oserror(tmp_path, limit):
    """A checkpoint, `encoder.weights.h5`, `save_encoder`, results.json and a text file, each
    written when the disk has a few kB left or past a 3,000-byte file-size limit: each raises
    OSError with ENOSPC or EFBIG, every file before byte-identical, nothing new left (no
    temporary, no half file); the process then exits normally, without HDF5's "Exception
    ignored ... Can't decrement id ref count" and the segmentation fault (exit 139) of a
    weights file left open by the failed write."""
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    if limit == "efbig":
        (mountpoint / "run").mkdir()
        command = [sys.executable, "-c", WRITERS, str(mountpoint / "run"), "3000"]
    else:
        command = private_tmpfs_command("24m", mountpoint, [
            sys.executable, "-c", WRITERS, str(mountpoint / "run"), "disk"])
    proc = subprocess.run(command, cwd=REPO, env=_env({}), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    want = "EFBIG" if limit == "efbig" else "ENOSPC"
    assert outcome["raised"] == dict.fromkeys(["checkpoint", "encoder.weights.h5",
                                               "save_encoder", "results.json", "flags.cfg"],
                                              want), outcome
    assert outcome["unchanged"] and outcome["new"] == [] and outcome["ckpt2_intact"], outcome


@pytest.mark.slow
def test_a_checkpoint_past_the_file_size_limit_ends_the_program_with_exit_5(
        tmp_path, cifar10_dir, program, capsys):
    """`ulimit -f` below a checkpoint's size (EFBIG, as a full disk): exit 5, the message naming
    the newest complete checkpoint, intact; the same command without the limit resumes from
    it."""
    model_dir = tmp_path / "run"
    args = train_args(model_dir, cifar10_dir, "--train_steps=4", "--checkpoint_every_steps=2")
    assert program(*args, "--stop_after_steps=2") == 0
    capsys.readouterr()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, hard))  # 1 MiB: a NIN checkpoint is 17
    try:
        code = program(*args)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capsys.readouterr().err
    newest = model_dir / "checkpoints" / "ckpt-2.weights.h5"
    assert code == 5, err[-3000:]
    assert "reached the file-size limit (ulimit -f)" in err
    assert f"the newest complete checkpoint, {newest}, is intact" in err
    assert sorted(p.name for p in newest.parent.iterdir()) == [
        "ckpt-2.weights.h5", "ckpt-2.weights.h5.sha256"]
    assert program(*args) == 0
    assert f"Resumed from checkpoint {newest} at step 2." in capsys.readouterr().out
