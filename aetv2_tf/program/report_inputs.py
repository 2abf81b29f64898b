"""The report's inputs, not trusted: each ``results.json`` is read and checked before use.

`read_checked` refuses (`ReportError`, naming the file, the problem and the fix) a path that is
not a regular file (a FIFO named ``results.json`` would block the reader forever, a device would
never end), a file over `MAX_RESULTS_BYTES`, bytes that are not UTF-8, text that is not JSON or is
nested too deeply; then (`probes.results.validate_results`, `ResultsError`) a key missing, a
value of the wrong type or range (percentages in [0, 100], counts in [0, 2**63), wall time in
[0, 1e9 s], names as strings) and numbers that contradict each other (``test_top1 +
test_error`` not 100, a top-1 that is no whole number of its images). A NaN or infinite number
is not refused but returned as a warning: a probe that diverged is an outcome (`aetv2_tf.report`
shows it as ``nan (diverged?)``), and the other runs are still reported.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from aetv2_tf.probes.results import RESULTS_FILENAME, nonfinite_values, validate_results

#: A results.json is about 1 KB; a larger file is not one (and is not read into memory).
MAX_RESULTS_BYTES = 2**20


class ReportError(ValueError):
    """Nothing to report, or an argument that is not a results file or directory."""


def _read_bytes(path: str) -> bytes:
    """The bytes of the regular file `path`, refused before reading when it is anything else
    (a FIFO or a device would block or never end) or over `MAX_RESULTS_BYTES`."""
    fix = f"pass the {RESULTS_FILENAME} a probe wrote, or remove this one"
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ReportError(f"{path}: not a regular file; {fix}")
        # O_NONBLOCK: a FIFO swapped in after the stat opens at once, and fstat refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise ReportError(f"{path}: cannot be read ({err.strerror}); {fix}") from err
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReportError(f"{path}: not a regular file; {fix}")
        data = handle.read(MAX_RESULTS_BYTES + 1)
    if len(data) > MAX_RESULTS_BYTES:
        raise ReportError(f"{path}: larger than {MAX_RESULTS_BYTES} bytes, not a results file "
                          f"(about 1 KB); {fix}")
    return data


def _warnings(result: dict[str, Any], path: str) -> list[str]:
    """A warning per NaN or infinite value (shown as ``nan (diverged?)``)."""
    return [f"{path}: {key!r} is {result[key]}: shown as '{result[key]} (diverged?)'; rerun "
            "that probe (lower its learning rate) for a number"
            for key in nonfinite_values(result)]


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
    validate_results(result, source=path)  # keys, types, ranges, and the numbers agree
    return result, _warnings(result, path)
