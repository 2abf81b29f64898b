"""A CIFAR-10 training subset small enough to travel to a lent GPU (experiments/scale/gpu_scale.sh).

    python -m experiments.scale.make_devdata          # .devdata/cifar-10-batches-py, 5 x 3,800
    python -m experiments.scale.make_devdata --per_batch=2400 --test=2000  # gpu_budget_runs.sh's

Writes data_batch_1..5 holding the FIRST `--per_batch` images of each official training batch
(and, with `--test=N`, a test_batch of the first N test images), in the official python layout:
protocol-4 pickles of dicts with the original bytes keys (b"batch_label", b"labels" list of int,
b"data" (N, 3072) uint8 array, b"filenames"), which `aetv2_tf.data.sources.load_cifar10` reads
with its restricted unpickler (the array pickles as numpy's `_reconstruct`, admitted there).
The pretext stage loads only the training batches, so no test batch is needed there (quick KNN off).

The device tool copies the working tree (tracked and untracked-not-ignored files) plus its
`carry` paths, 64 MiB in all: the end line prints that total (with .whl/ if present) so the
subset can be sized; 3,800 per batch (19,000 images, 56 MiB) leaves room for the keras,
namex and optree wheels (about 2.8 MiB) and the repository (about 1 MiB).
"""

from __future__ import annotations

import argparse
import pathlib
import pickle
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
SOURCE = REPO.parent / "shared" / "data" / "cifar10" / "cifar-10-batches-py"
LIMIT = 64 * 2**20


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


def travelling_bytes(extra: list[pathlib.Path]) -> int:
    """Bytes of the tracked + untracked-not-ignored files, plus the `extra` folders."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    files = [REPO / p for p in listed if p]
    files += [p for d in extra if d.is_dir() for p in d.rglob("*")]
    return sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=pathlib.Path, default=SOURCE)
    p.add_argument("--out", type=pathlib.Path, default=REPO / ".devdata" / "cifar-10-batches-py")
    p.add_argument("--per_batch", type=int, default=3800, help="images per training batch")
    p.add_argument("--test", type=int, default=0, help="test images (0: no test_batch)")
    args = p.parse_args()
    if not 0 < args.per_batch <= 10000 or not 0 <= args.test <= 10000:
        sys.exit("--per_batch must be in 1..10000 and --test in 0..10000")
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
    travel = travelling_bytes([REPO / ".whl", args.out])
    print(f"{args.out}: {len(images)} training images"
          f"{f' + {args.test} test' if args.test else ''}, {total / 2**20:.1f} MiB; "
          f"with the working tree and .whl/: {travel / 2**20:.1f} MiB of the 64 MiB that travel"
          f"{'' if travel < LIMIT else ' -- TOO LARGE: lower --per_batch'}")


if __name__ == "__main__":
    main()
