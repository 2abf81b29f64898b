"""The report's inputs, not trusted: each ``results.json`` is read and checked before use.

`read_checked` refuses (`ReportError`, naming the file, the problem and the fix) a path that is
not a regular file (a FIFO named ``results.json`` would block the reader forever, a device would
never end), a file over `MAX_RESULTS_BYTES`, bytes that are not UTF-8, text that is not JSON or is
nested too deeply, a key missing, and a value of the wrong type or range: percentages in
[0, 100], counts in [0, 2**63), wall time in [0, `MAX_SECONDS`], names as strings. A NaN or
infinite number is not refused but returned as a warning: a probe that diverged is an outcome
(`aetv2_tf.report` shows it as ``nan (diverged?)``), and the other runs are still reported.
"""

from __future__ import annotations

import json
import math
from typing import Any

from aetv2_tf.errors import UsageError
from aetv2_tf.files.safe_paths import read_regular_file
from aetv2_tf.probes.results import RESULTS_FILENAME, validate_results

#: A results.json is about 1 KB; a larger file is not one (and is not read into memory).
MAX_RESULTS_BYTES = 2**20
PERCENT_KEYS = ("val_top1", "test_top1", "test_error")
COUNT_KEYS = ("train_examples", "val_examples", "test_examples", "selected_epoch")
MAX_COUNT = 2**63 - 1
MAX_SECONDS = 1e9  # 31 years of wall time


class ReportError(ValueError):
    """Nothing to report, or an argument that is not a results file or directory."""


def _read_bytes(path: str) -> bytes:
    """The bytes of the regular file `path`, refused before reading when it is anything else
    (a FIFO or a device would block or never end) or over `MAX_RESULTS_BYTES`
    (`safe_paths.read_regular_file`)."""
    fix = f"pass the {RESULTS_FILENAME} a probe wrote, or remove this one"
    try:
        return read_regular_file(path, fix, MAX_RESULTS_BYTES,
                                 what=", not a results file (about 1 KB)")
    except UsageError as err:
        raise ReportError(str(err)) from None
    except OSError as err:
        raise ReportError(f"{path}: cannot be read ({err.strerror}); {fix}") from err


def _check_values(result: dict[str, Any], path: str) -> list[str]:
    """Refuses a value of the wrong type or range (`ReportError`); returns a warning per NaN or
    infinite value (shown as ``nan (diverged?)``)."""
    def refuse(key: str, expected: str) -> ReportError:
        value = repr(result[key])
        value = value if len(value) <= 40 else f"{value[:20]}...({len(value)} characters)"
        return ReportError(f"{path}: {key!r} is {value}, expected {expected}; fix or remove "
                           "the file (a probe writes it: rerun that probe)")

    warnings = []
    for key in ("probe", "dataset", "feature", "pretrained", "method"):
        value = result.get(key)
        if not (isinstance(value, str) or value is None and key not in ("probe", "dataset")):
            raise refuse(key, "a string")
    for key, low, high in ([(k, 0.0, 100.0) for k in PERCENT_KEYS]
                           + [("wall_time_s", 0.0, MAX_SECONDS)]):
        value = result[key]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise refuse(key, "a number or null")
        if not math.isfinite(value):
            warnings.append(f"{path}: {key!r} is {value}: shown as '{value} (diverged?)'; "
                            "rerun that probe (lower its learning rate) for a number")
        elif not low - 1e-6 <= value <= high + 1e-6:
            raise refuse(key, f"a number from {low:g} to {high:g}")
    for key in COUNT_KEYS:
        value = result[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= MAX_COUNT):
            raise refuse(key, f"a whole number from 0 to {MAX_COUNT} (or null)")
    return warnings


def read_checked(path: str) -> tuple[dict[str, Any], list[str]]:
    """One results file, refused (`ReportError` naming `path` and the problem) unless it is a
    regular UTF-8 JSON file with every key of the right type and range; with its warnings."""
    data = _read_bytes(path)
    try:
        result = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ReportError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); pass "
                          f"the {RESULTS_FILENAME} a probe wrote") from None
    except RecursionError:
        raise ReportError(f"{path}: JSON nested too deeply to be a results file; pass the "
                          f"{RESULTS_FILENAME} a probe wrote") from None
    except ValueError as err:  # JSONDecodeError, or an integer of over 4300 digits
        raise ReportError(f"{path}: not valid JSON ({err}); pass the {RESULTS_FILENAME} a "
                          "probe wrote") from None
    validate_results(result, source=path)
    return result, _check_values(result, path)
