"""The library's usage error: a bad argument, path or combination that the caller can fix.

`UsageError` is raised by the library (`probes.encoders`, `probes.data`) and by the program layer
(`program.rundir`, `program.flag_support`, the stages), which re-exports it, so one
``except UsageError`` catches both; ``python -m aetv2_tf.train`` maps it to exit 2. It is a
ValueError, as are the library's other input errors (`data.sources.DataError`,
`trust.ExportTargetError`, `probes.results.ResultsError`).
"""

from __future__ import annotations


class UsageError(ValueError):
    """A bad flag, path or combination: the message names the problem and the fix."""
