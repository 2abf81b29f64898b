"""Shared fixtures: the real CIFAR-10 in ../shared (never downloaded); the longest test files
first, so that the workers of `pytest -n` (pyproject's addopts) end together."""

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


# The files whose tests run longest (minutes of CLI child processes; `--durations` of the CI run,
# BUILD.md "Tests"): collected first, so that no worker starts one of them when the others are
# nearly done. The order of the tests inside a file is kept.
LONGEST_FIRST = ("test_library.py", "test_reliability_interrupt.py", "test_jax_cli.py",
                 "test_reliability_input.py", "test_benchmarks.py", "test_backend_parity.py",
                 "test_multiworker.py", "test_train_cli.py", "test_imagenet_cli.py",
                 "test_probe_stage.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every file's own order is kept
