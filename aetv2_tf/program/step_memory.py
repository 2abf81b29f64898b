"""The memory of a pretext training step on the CPU, estimated before anything is written and
refused when the machine cannot hold it (a batch far over it ended in a segmentation fault).

`step_bytes`: images through the encoder a step (AET: 2 x --batch_size, RotNet: --batch_size)
x the encoder's activation values per image (`ACTIVATIONS`) x 4 bytes + 1 GiB, against the
physical memory or a cgroup's limit. On a GPU or TPU the device's memory is not known before
the framework starts: not judged there. Measurements: docs/reliability.md.
"""

from __future__ import annotations

import os

from aetv2_tf.errors import UsageError

#: Activation values per image of each backbone at its input size (every layer's output; a
#: test recounts them).
ACTIVATIONS = {"nin": 2_252_928, "alexnet": 2_132_272}
BYTES_PER_VALUE = 4
BASE_BYTES = 2**30


def machine_memory() -> int | None:
    """Bytes of memory this process may use: the physical memory, or the cgroup's limit (v2
    ``memory.max``, v1 ``memory.limit_in_bytes``) when lower; None when unknown."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
    return total


def step_bytes(backbone: str, batch_size: int, rotation: bool) -> int:
    """The estimate of a training step's memory (module docstring)."""
    images = batch_size if rotation else 2 * batch_size
    return images * ACTIVATIONS[backbone] * BYTES_PER_VALUE + BASE_BYTES


def check_step_memory(backbone: str, batch_size: int, rotation: bool, accelerator: bool,
                      memory: int | None = None) -> None:
    """UsageError (the estimate, the machine's memory, the largest batch that fits) when a step
    on the CPU (not `accelerator`) needs more than `memory` (default `machine_memory`)."""
    memory = machine_memory() if memory is None else memory
    needed = step_bytes(backbone, batch_size, rotation)
    if accelerator or memory is None or needed <= memory:
        return
    per_image = ACTIVATIONS[backbone] * BYTES_PER_VALUE
    images = "--batch_size rotated images" if rotation else "2 x --batch_size images (each " \
        "image and its warped copy)"
    largest = max((memory - BASE_BYTES) // (per_image * (1 if rotation else 2)), 0)
    raise UsageError(
        f"--batch_size={batch_size}: a training step needs about {needed / 1e9:,.1f} GB "
        f"({images} x {ACTIVATIONS[backbone]:,} activation values of the {backbone} encoder "
        f"per image x {BYTES_PER_VALUE} bytes, plus 1 GiB), more than this machine's "
        f"{memory / 1e9:,.1f} GB of memory; nothing was written. Lower --batch_size (about "
        f"{largest:,} fits here).")
