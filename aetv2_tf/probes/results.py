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
import math
import numbers
import os
from typing import Any

from aetv2_tf.errors import UsageError
from aetv2_tf.files.safe_paths import read_json, write_atomically

RESULTS_FILENAME = "results.json"
RESULTS_FIX = f"pass the {RESULTS_FILENAME} a probe wrote, or remove this one"

REQUIRED_KEYS = ("probe", "feature", "pretrained", "dataset", "train_examples", "val_examples",
                 "test_examples", "selected_epoch", "val_top1", "test_top1", "test_error",
                 "wall_time_s", "flags", "created", "version")

PERCENT_KEYS = ("val_top1", "test_top1", "test_error")
COUNT_KEYS = ("train_examples", "val_examples", "test_examples", "selected_epoch")
MAX_COUNT = 2**63 - 1
MAX_SECONDS = 1e9  # 31 years of wall time
#: How far a top-1 of N images may lie from a whole number of correct images, in images: the
#: classifiers' accuracy is a float32 mean (off by N x 6e-8), a percentage's last digits.
COUNT_TOLERANCE = 0.05


class ResultsError(ValueError):
    """A results file is missing, unreadable, lacks required keys, or holds a value of the wrong
    type or range, or numbers that contradict each other."""


def validate_results(results: dict[str, Any], source: str = "results") -> dict[str, Any]:
    """``results``, checked: every key of `REQUIRED_KEYS`, ``flags`` a dict, values of their
    type and range (`_check_values`), numbers that agree (`_check_consistency`); else a
    `ResultsError` naming ``source`` and the first problem."""
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
    _check_values(results, source)
    _check_consistency(results, source)
    return results


def _refused(results: dict[str, Any], source: str, key: str, expected: str) -> ResultsError:
    value = repr(results[key])
    value = value if len(value) <= 40 else f"{value[:20]}...({len(value)} characters)"
    return ResultsError(f"{source}: {key!r} is {value}, expected {expected}; fix or remove the "
                        "file (a probe writes it: rerun that probe)")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_values(results: dict[str, Any], source: str) -> None:
    """Types and ranges: names strings, percentages in [0, 100] (NaN and infinity pass: a probe
    that diverged, shown as such), wall time in [0, `MAX_SECONDS`], counts whole numbers in
    [0, `MAX_COUNT`] (or null)."""
    for key in ("probe", "dataset", "feature", "pretrained", "method"):
        value = results.get(key)
        if not (isinstance(value, str) or value is None and key not in ("probe", "dataset")):
            raise _refused(results, source, key, "a string")
    for key, low, high in ([(k, 0.0, 100.0) for k in PERCENT_KEYS]
                           + [("wall_time_s", 0.0, MAX_SECONDS)]):
        value = results[key]
        if value is None:
            continue
        if not _is_number(value):
            raise _refused(results, source, key, "a number or null")
        if math.isfinite(value) and not low - 1e-6 <= value <= high + 1e-6:
            raise _refused(results, source, key, f"a number from {low:g} to {high:g}")
    for key in COUNT_KEYS:
        value = results[key]
        if value is not None and (isinstance(value, bool) or not isinstance(
                value, numbers.Integral) or not 0 <= value <= MAX_COUNT):
            raise _refused(results, source, key, f"a whole number from 0 to {MAX_COUNT} (or null)")


def _check_consistency(results: dict[str, Any], source: str) -> None:
    """The numbers against each other: ``test_top1 + test_error = 100``; a top-1 is a share
    of its images (``test_examples``, ``val_examples``: at least 1, and top-1 x images / 100
    a whole number of correct images, within `COUNT_TOLERANCE`); ``selected_epoch`` from 1.
    Non-finite values (a diverged probe) are not compared."""
    fix = "fix or remove the file (a probe writes it: rerun that probe)"
    top1, error = results["test_top1"], results["test_error"]
    if top1 is not None and error is not None and math.isfinite(top1) and \
            math.isfinite(error) and abs(top1 + error - 100.0) > 1e-6:
        raise ResultsError(f"{source}: 'test_top1' {top1!r} and 'test_error' {error!r} add up to "
                           f"{top1 + error:.6g}, not 100; {fix}")
    for key, count in (("test_top1", "test_examples"), ("val_top1", "val_examples")):
        value, n = results[key], results[count]
        if value is None or not math.isfinite(value) or n is None:
            continue
        if n < 1:
            raise ResultsError(f"{source}: {key!r} is {value!r} of {count!r} = {n} images; a "
                               f"top-1 needs at least one image; {fix}")
        correct = value * n / 100.0
        if abs(correct - round(correct)) > COUNT_TOLERANCE:
            raise ResultsError(f"{source}: {key!r} {value!r}% of {n} images ({count!r}) is "
                               f"{correct:.4g} images, not a whole number of correct ones; {fix}")
    if results["selected_epoch"] is not None and results["selected_epoch"] < 1:
        raise _refused(results, source, "selected_epoch", "an epoch from 1 (or null)")


def nonfinite_values(results: dict[str, Any]) -> list[str]:
    """The percentages and wall time that are NaN or infinite (a diverged probe, shown)."""
    return [key for key in (*PERCENT_KEYS, "wall_time_s")
            if _is_number(results[key]) and not math.isfinite(results[key])]


def write_results(directory: str | os.PathLike, results: dict[str, Any]) -> str:
    """Writes ``directory/results.json`` (`safe_paths.write_atomically`: never partial, never
    through a link), ``created`` (UTC) and ``version`` filled in when absent; returns its path."""
    record = dict(results)
    record.setdefault(
        "created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    from aetv2_tf import __version__

    record.setdefault("version", __version__)
    validate_results(record, source=f"write_results({os.fspath(directory)})")
    text = json.dumps(record, indent=2, sort_keys=True, default=_json_default) + "\n"

    os.makedirs(directory, exist_ok=True)
    return write_atomically(os.path.join(os.fspath(directory), RESULTS_FILENAME), text)


def read_results(path: str | os.PathLike) -> dict[str, Any]:
    """One ``results.json``, validated (`ResultsError` with the path: not a regular file, not
    UTF-8 JSON, nested too deeply, `validate_results`)."""
    path = os.fspath(path)
    try:
        results = read_json(path, RESULTS_FIX)
    except OSError as err:  # missing, no permission
        raise ResultsError(f"{path}: {err.strerror.lower()}; {RESULTS_FIX}") from None
    except UnicodeDecodeError as err:
        raise ResultsError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); "
                           f"{RESULTS_FIX}") from None
    except UsageError as err:  # not a regular file, too large, nested too deeply
        raise ResultsError(str(err)) from None
    except ValueError as err:  # not JSON; an integer of over 4300 digits
        raise ResultsError(f"{path}: not valid JSON ({err}); {RESULTS_FIX}") from None
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
