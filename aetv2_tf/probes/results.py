"""The ``results.json`` file every evaluation run writes, and its reader.

One file per (pretrained encoder, probe, feature, dataset) run. All accuracies and errors are in
PERCENT. Keys (all required; a value may be ``null`` where it does not apply, e.g.
``selected_epoch`` of a KNN):

==================  ==========================================================================
probe               ``knn`` | ``fc1`` | ``fc2`` | ``fc3`` | ``conv`` | ``linear`` | ``nonlinear``
feature             the encoder output probed, e.g. ``block2`` (NIN) or ``conv4`` (AlexNet)
pretrained          path of the pretrained encoder, or ``null`` for a random init
dataset             e.g. ``cifar10``, ``imagenet``, ``places205``
train_examples      examples the probe was fitted on (training set minus the validation split)
val_examples        held-out part of the TRAINING set used for model selection
test_examples       test-set examples, evaluated once
selected_epoch      1-based epoch whose weights were kept (best validation accuracy)
val_top1            validation top-1 accuracy of the selected epoch (%)
test_top1           test top-1 accuracy (%)
test_error          ``100 - test_top1`` (%)
wall_time_s         seconds spent on the run
flags               dict of the run's settings (command-line flags)
created             ISO-8601 timestamp (UTC), filled in by `write_results` if absent
version             ``aetv2_tf.__version__``, filled in by `write_results` if absent
==================  ==========================================================================

Optional: ``method``, the pretext label shown in reports (``AETv1``, ``AETv2``, ``random``,
``supervised``, ...); without it the report derives one from ``pretrained`` and ``flags``.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

from aetv2_tf.files.safe_paths import write_atomically

RESULTS_FILENAME = "results.json"

REQUIRED_KEYS = (
    "probe",
    "feature",
    "pretrained",
    "dataset",
    "train_examples",
    "val_examples",
    "test_examples",
    "selected_epoch",
    "val_top1",
    "test_top1",
    "test_error",
    "wall_time_s",
    "flags",
    "created",
    "version",
)


class ResultsError(ValueError):
    """A results file is missing, unreadable, or lacks required keys."""


def _package_version() -> str:
    try:
        from aetv2_tf import __version__
    except ImportError:  # pragma: no cover
        return "unknown"
    return __version__


def validate_results(results: dict[str, Any], source: str = "results") -> dict[str, Any]:
    """Check that every key of `REQUIRED_KEYS` is present and ``flags`` is a dict.

    Raises:
      ResultsError: naming the first missing key (and listing all missing ones) and ``source``.
    """
    if not isinstance(results, dict):
        raise ResultsError(f"{source}: expected a JSON object, got {type(results).__name__}")
    missing = [key for key in REQUIRED_KEYS if key not in results]
    if missing:
        raise ResultsError(
            f"{source}: missing required key {missing[0]!r}"
            + (f" (all missing: {', '.join(missing)})" if len(missing) > 1 else "")
        )
    if not isinstance(results["flags"], dict):
        raise ResultsError(f"{source}: key 'flags' must be a dict")
    return results


def write_results(directory: str | os.PathLike, results: dict[str, Any]) -> str:
    """Atomically write ``directory/results.json``; returns its path.

    ``created`` (UTC ISO timestamp) and ``version`` are filled in when absent; every other key of
    `REQUIRED_KEYS` must be present. Written by `safe_paths.write_atomically`: readers never
    see a partial file, a symbolic link at ``results.json`` is refused, not replaced.
    """
    record = dict(results)
    record.setdefault(
        "created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    )
    record.setdefault("version", _package_version())
    validate_results(record, source=f"write_results({os.fspath(directory)})")
    text = json.dumps(record, indent=2, sort_keys=True, default=_json_default) + "\n"

    os.makedirs(directory, exist_ok=True)
    return write_atomically(os.path.join(os.fspath(directory), RESULTS_FILENAME), text)


def read_results(path: str | os.PathLike) -> dict[str, Any]:
    """Load and validate one ``results.json`` (raises `ResultsError` with the path on problems)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            results = json.load(handle)
    except FileNotFoundError as err:
        raise ResultsError(f"{path}: no such file") from err
    except json.JSONDecodeError as err:
        raise ResultsError(f"{path}: not valid JSON ({err})") from err
    return validate_results(results, source=path)


def _json_default(value: Any) -> Any:
    """numpy scalars/arrays and paths -> plain JSON values."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
