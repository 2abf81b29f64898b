"""The report's inputs, not trusted: each ``results.json`` is read and checked before use
(`probes.results.read_results`); a NaN or infinite number is a warning, not a refusal (a
diverged probe is an outcome, shown as ``nan (diverged?)``).
"""

from __future__ import annotations

from typing import Any

from aetv2_tf.probes.results import nonfinite_values, read_results


class ReportError(ValueError):
    """Nothing to report, or an argument that is not a results file or directory."""


def read_checked(path: str) -> tuple[dict[str, Any], list[str]]:
    """One results file (`ResultsError` naming `path` and the problem), with a warning per NaN
    or infinite value."""
    result = read_results(path)
    return result, [f"{path}: {key!r} is {result[key]}: shown as '{result[key]} (diverged?)'; "
                    "rerun that probe (lower its learning rate) for a number"
                    for key in nonfinite_values(result)]
