"""The report's inputs, not trusted: each ``results.json`` is read and checked before use.

`read_checked` refuses (`probes.results.read_results`: `ResultsError`, naming the file, the
problem and the fix) a path that is not a regular file (a FIFO named ``results.json`` would
block the reader forever, a device would never end), a file over 1 MiB, bytes that are not
UTF-8, text that is not JSON or is nested too deeply; then a key missing, a
value of the wrong type or range (percentages in [0, 100], counts in [0, 2**63), wall time in
[0, 1e9 s], names as strings) and numbers that contradict each other (``test_top1 +
test_error`` not 100, a top-1 that is no whole number of its images). A NaN or infinite number
is not refused but returned as a warning: a probe that diverged is an outcome (`aetv2_tf.report`
shows it as ``nan (diverged?)``), and the other runs are still reported.
"""

from __future__ import annotations

from typing import Any

from aetv2_tf.probes.results import nonfinite_values, read_results


class ReportError(ValueError):
    """Nothing to report, or an argument that is not a results file or directory."""


def _warnings(result: dict[str, Any], path: str) -> list[str]:
    """A warning per NaN or infinite value (shown as ``nan (diverged?)``)."""
    return [f"{path}: {key!r} is {result[key]}: shown as '{result[key]} (diverged?)'; rerun "
            "that probe (lower its learning rate) for a number"
            for key in nonfinite_values(result)]


def read_checked(path: str) -> tuple[dict[str, Any], list[str]]:
    """One results file (`read_results`: `ResultsError` naming `path` and the problem), with
    its warnings."""
    result = read_results(path)
    return result, _warnings(result, path)
