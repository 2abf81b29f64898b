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


def test_two_workers_train_identically_and_only_the_chief_writes(tmp_path, cifar10_dir):
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    model_dir = tmp_path / "run"
    args = train_args(model_dir, cifar10_dir, "--strategy=multi_worker_mirrored",
                      "--train_steps=4", "--checkpoint_every_steps=2", "--summary_every_steps=2",
                      "--image_summary_every_steps=2", "--verbosity=0")
    procs = [start_module("aetv2_tf.train", *args, log=tmp_path / f"worker{index}",
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
    done = [re.search(r"Done \(pretext\): steps=4,.*trainable_digest=(\w+)", out.stdout)
            for out in outs]
    assert all(done), [out.stdout[-1000:] for out in outs]
    digests = [d.group(1) for d in done]
    assert digests[0] == digests[1]
    assert checkpoint_digest(model_dir) == digests[0]

    assert sorted(p.name for p in model_dir.iterdir()) == [
        "aet_model.keras", "checkpoints", "encoder.weights.h5", "export", "flags.cfg",
        "flags.json", "train"]
    assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == [
        "ckpt-2.weights.h5", "ckpt-4.weights.h5"]
    events = list((model_dir / "train").iterdir())
    assert len(events) == 1 and f".{procs[0].pid}." in events[0].name
    assert "export=" in outs[0].stdout and "export=" not in outs[1].stdout
    assert "Saved checkpoint" in outs[0].stderr and "Saved checkpoint" not in outs[1].stderr
