"""A CIFAR-10 training subset small enough to travel to a lent GPU (experiments/scale/gpu_scale.sh).

    python -m experiments.scale.make_devdata          # .devdata/cifar-10-batches-py, 5 x 3,800
    python -m experiments.scale.make_devdata --per_batch=2400 --test=2000  # gpu_budget_runs.sh's

Writes data_batch_1..5 holding the FIRST `--per_batch` images of each official training batch
(and, with `--test=N`, a test_batch of the first N test images), in the official python layout:
protocol-4 pickles of dicts with the original bytes keys (b"batch_label", b"labels" list of int,
b"data" (N, 3072) uint8 array, b"filenames"), which `aetv2_tf.data.sources.load_cifar10` reads
with its restricted unpickler (the array pickles as numpy's `_reconstruct`, admitted there).
The pretext stage loads only the training batches, so no test batch is needed there (quick KNN off).

The source is `luggage.cifar10_source` ($AETV2_CIFAR10_DIR, else ../shared beside the
checkout). The device tool copies the working tree (tracked and untracked-not-ignored files)
plus its `carry` paths, 64 MiB in all: the end line prints that total as the tool counts it
(`luggage.travelling_bytes`, with .whl/ and the subset carried) so the subset can be sized, and
says when it is too large; 3,800 per batch (19,000 images, 56 MiB) left room for the keras,
namex and optree wheels (about 2.8 MiB) beside a repository of about 1 MiB.
"""

from __future__ import annotations

import argparse
import pathlib
import pickle
import sys

import numpy as np

from experiments.campaign import luggage


def subset(src: pathlib.Path, dst: pathlib.Path, name: str, n: int) -> int:
    """Writes the first `n` images of batch `name` from `src` to `dst`; returns the file size."""
    from aetv2_tf.data.sources import _unpickle  # the project's safe reader of the originals

    batch = _unpickle(src / name)
    out = {b"batch_label": batch.get(b"batch_label", name.encode()) + b" (subset)",
           b"labels": [int(v) for v in batch[b"labels"][:n]],
           b"data": np.ascontiguousarray(np.asarray(batch[b"data"], np.uint8)[:n]),
           b"filenames": list(batch.get(b"filenames", []))[:n]}
    with open(dst / name, "wb") as f:
        pickle.dump(out, f, protocol=4)  # protocol 5 would pickle the array out of band
    return (dst / name).stat().st_size


def main(argv: list[str] | None = None) -> None:
    repo = luggage.repository_root()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=pathlib.Path, default=None,
                   help="the official cifar-10-batches-py folder (default: $AETV2_CIFAR10_DIR "
                        "or ../shared's)")
    p.add_argument("--out", type=pathlib.Path, default=repo / ".devdata" / "cifar-10-batches-py")
    p.add_argument("--per_batch", type=int, default=3800, help="images per training batch")
    p.add_argument("--test", type=int, default=0, help="test images (0: no test_batch)")
    args = p.parse_args(argv)
    if not 0 < args.per_batch <= 10000 or not 0 <= args.test <= 10000:
        sys.exit("--per_batch must be in 1..10000 and --test in 0..10000")
    args.source = args.source or luggage.cifar10_source(repo)
    if not (args.source / "data_batch_1").is_file():
        sys.exit(f"no CIFAR-10 at {args.source}: pass --source or set AETV2_CIFAR10_DIR to the "
                 "cifar-10-batches-py folder")
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.glob("*_batch*"):
        stale.unlink()
    total = sum(subset(args.source, args.out, f"data_batch_{i}", args.per_batch)
                for i in range(1, 6))
    if args.test:
        total += subset(args.source, args.out, "test_batch", args.test)
    meta = args.source / "batches.meta"
    if meta.is_file():
        (args.out / "batches.meta").write_bytes(meta.read_bytes())

    from aetv2_tf.data.sources import load_cifar10  # check: the project reads it back

    images, labels = load_cifar10(args.out, "train")
    assert images.shape == (5 * args.per_batch, 32, 32, 3) and len(labels) == len(images)
    carry = [".whl", str(args.out.resolve())]
    travel = luggage.travelling_bytes(repo, carry)
    problem = luggage.luggage_problem(travel, "the checkout, .whl/ and the subset")
    print(f"{args.out}: {len(images)} training images"
          f"{f' + {args.test} test' if args.test else ''}, {total / 2**20:.1f} MiB; "
          f"with the checkout and .whl/: {travel / 2**20:.1f} MiB of the "
          f"{luggage.TOOL_LIMIT / 2**20:.0f} MiB that travel"
          f"{f' -- TOO LARGE: lower --per_batch ({problem})' if problem else ''}")


if __name__ == "__main__":
    main()
