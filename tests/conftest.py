"""Shared fixtures: the real CIFAR-10 in ../shared (never downloaded)."""

import os
import pathlib
import tempfile

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# `--mixed_precision=auto` caches its CPU measurement: one probe per test session, not ~/.cache.
os.environ.setdefault("AETV2_CACHE_DIR", tempfile.mkdtemp(prefix="aetv2-test-cache-"))

import aetv2_tf  # noqa: E402,F401  (before any TensorFlow import: it asks for oneDNN on every CPU)

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_CIFAR10 = REPO.parent / "shared" / "data" / "cifar10" / "cifar-10-batches-py"


@pytest.fixture(scope="session")
def cifar10_dir() -> pathlib.Path:
    """The official python-layout CIFAR-10 directory ($AETV2_CIFAR10_DIR or ../shared)."""
    path = pathlib.Path(os.environ.get("AETV2_CIFAR10_DIR", DEFAULT_CIFAR10))
    if not (path / "data_batch_1").is_file():
        raise FileNotFoundError(
            f"CIFAR-10 not found at {path}; set AETV2_CIFAR10_DIR to the cifar-10-batches-py dir"
        )
    return path
