"""The memory a pretext training step needs, estimated from the batch and the image size before
anything is written, and refused when the machine cannot hold it.

A batch far over the machine's memory did not fail cleanly: `--batch_size=50000` on CIFAR-10
(NIN) ended in a segmentation fault (exit 139) at 6.1 GB, its first convolution's buffer
(100,000 images x 32 x 32 x 192 float32 values, 79 GB) not allocated, without a word. The
estimate (`step_bytes`):

    images through the encoder a step (AET: 2 x --batch_size, the image and its warped copy;
    RotNet: --batch_size, the rotated copies)
    x the encoder's activation values per image at its input size (`ACTIVATIONS`: every layer's
      output, counted from the built NIN (32 x 32) and AlexNet (224 x 224); a test recounts them)
    x 4 bytes (float32; mixed precision keeps half of them in 16 bits: a margin)
    + 1 GiB (the libraries, the data, the model, its optimizer)

Measured on the CPU (peak resident memory of the program, TensorFlow, two steps at two batch
sizes each): a NIN pair took 12.8 MB more per pair (the estimate: 18.0 MB), an AlexNet pair
19.0 MB (the estimate: 17.1 MB). It is compared with the machine's memory (physical memory, or
a cgroup's limit when lower): `--batch_size=512` on CIFAR-10 (NIN, 10.3 GB) and AlexNet's 768
(`configs/imagenet_alexnet_aetv2.cfg`, 14.2 GB) pass on a 16 GB machine. On a GPU or TPU the
step's memory is the device's, which is not known before the framework starts: there the check
is left out and the framework's own out-of-memory error stands.
"""

from __future__ import annotations

import os

from aetv2_tf.errors import UsageError

#: Activation values per image of each backbone at its input size (every layer's output, as
#: `build_backbone` builds it: `tests/test_no_crash_and_no_false_success.py` recounts them).
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
    """UsageError naming the estimate, how it is computed, the machine's memory and the largest
    batch that fits, when a step on the CPU (not `accelerator`) needs more than `memory`
    (default `machine_memory`); nothing when it fits or the memory is unknown."""
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
