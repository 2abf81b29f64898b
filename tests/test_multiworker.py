"""`--strategy=multi_worker_mirrored`: two worker processes on localhost, as on two machines.

Each worker gets the same command line and its own `TF_CONFIG` (same cluster, its own index);
worker 0 is the chief. Both share the model_dir, as workers share a filesystem (or a bucket).
After 4 synchronous steps of a real CIFAR-10 slice:

- both workers exit 0 and print the same `trainable_digest` (SHA-256 of the trainable weights,
  bitwise: the gradients are all-reduced across the workers), and the chief's final checkpoint,
  restored here, has that digest;
- only the chief wrote: checkpoints, TensorBoard events (one file, named with the chief's pid),
  flags and exports; the other worker's temporary checkpoints are gone.
"""

from __future__ import annotations

import json
import re
import socket
import time

from aetv2_tf.callbacks import weights_digest
from aetv2_tf.models import build_aet_model, build_backbone
from tests.cli import finish, start_module, train_args

TIMEOUT_S = 240


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def checkpoint_digest(model_dir) -> str:
    """`weights_digest` of the trainable weights in the newest checkpoint of `model_dir`."""
    from aetv2_tf.keras_checkpoints import list_checkpoints, load_model_part

    model = build_aet_model(build_backbone("nin", (32, 32, 3), batch_norm="fused"))
    load_model_part(model, list_checkpoints(str(model_dir / "checkpoints"))[-1][1])
    return weights_digest(model.trainable_weights)


def two_workers(args: list[str], log) -> tuple[list, list[str], list[int]]:
    """Runs `aetv2_tf.train args` as worker 0 (chief) and 1 of a localhost cluster; returns
    both processes' outputs, the `trainable_digest` each printed (asserted equal), their pids."""
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    procs = [start_module("aetv2_tf.train", *args, log=f"{log}{index}",
                          env={"TF_CONFIG": json.dumps(
                              {"cluster": cluster, "task": {"type": "worker", "index": index}})})
             for index in range(2)]
    deadline = time.monotonic() + TIMEOUT_S
    try:
        outs = [finish(proc, timeout=max(deadline - time.monotonic(), 1)) for proc in procs]
    finally:
        for proc in procs:  # a worker left waiting for a dead peer
            if proc.poll() is None:
                proc.kill()
    for index, out in enumerate(outs):
        assert out.returncode == 0, f"worker {index}:\n{out.stderr[-4000:]}"
        assert "CollectiveAllReduceStrategy x2" in out.stdout  # = MWMS
    done = [re.search(r"Done \(pretext\): steps=\d+,.*trainable_digest=(\w+)", out.stdout)
            for out in outs]
    assert all(done), [out.stdout[-1000:] for out in outs]
    digests = [d.group(1) for d in done]
    assert digests[0] == digests[1]
    return outs, digests, [proc.pid for proc in procs]


def test_two_workers_train_identically_and_only_the_chief_writes(tmp_path, cifar10_dir):
    model_dir = tmp_path / "run"
    args = train_args(model_dir, cifar10_dir, "--strategy=multi_worker_mirrored",
                      "--train_steps=4", "--checkpoint_every_steps=2", "--summary_every_steps=2",
                      "--image_summary_every_steps=2", "--verbosity=0")
    outs, digests, pids = two_workers(args, tmp_path / "worker")
    assert all("steps=4," in out.stdout for out in outs)
    assert checkpoint_digest(model_dir) == digests[0]

    assert sorted(p.name for p in model_dir.iterdir()) == [
        ".lock", "aet_model.keras", "aet_model.keras.sha256", "checkpoints", "encoder.weights.h5",
        "encoder.weights.h5.sha256", "export", "flags.cfg", "flags.json", "train"]
    assert f"pid {pids[0]} " in (model_dir / ".lock").read_text()  # the chief's, alone
    assert sorted(p.name for p in (model_dir / "checkpoints").glob("*.weights.h5")) == [
        "ckpt-2.weights.h5", "ckpt-4.weights.h5"]
    events = list((model_dir / "train").iterdir())
    assert len(events) == 1 and f".{pids[0]}." in events[0].name
    assert "export=" in outs[0].stdout and "export=" not in outs[1].stdout
    assert "Saved checkpoint" in outs[0].stderr and "Saved checkpoint" not in outs[1].stderr


def test_two_workers_on_a_folder_read_their_own_files_and_resume_exactly(tmp_path, cifar10_dir):
    """A folder of JPEGs (with bad files) on two workers: each decodes its own half of every
    batch (`TensorFlowPretext.batches`; the halves' union is the one-worker batch:
    tests/test_image_files.py); 4 steps in one go and 2 + 2 with a restart end with the same
    weights, bit for bit."""
    from benchmarks.make_folder import write_cifar10_folder

    folder = write_cifar10_folder(tmp_path / "folder", cifar10_dir, train_per_class=4,
                                  val_per_class=0, size=40, corrupt=True)

    def args(model_dir, *more):
        return ["--flagfile=configs/quickstart.cfg", "--dataset=folder", f"--data_dir={folder}",
                f"--model_dir={model_dir}", "--strategy=multi_worker_mirrored", "--batch_size=8",
                "--train_steps=4", "--train_seconds=0", "--quick_knn_train=0", "--export=false",
                "--mixed_precision=none", "--checkpoint_every_steps=2", "--verbose=0", *more]

    outs, whole, _ = two_workers(args(tmp_path / "whole"), tmp_path / "whole")
    assert all("Skipped 3 undecodable image(s)" in out.stderr for out in outs)
    outs, _, _ = two_workers(args(tmp_path / "resumed", "--stop_after_steps=2"),
                                 tmp_path / "first")
    assert all("steps=2," in out.stdout for out in outs)
    outs, resumed, _ = two_workers(args(tmp_path / "resumed"), tmp_path / "second")
    assert all("Resumed" in out.stdout + out.stderr for out in outs)
    assert resumed == whole
