"""The library's usage error: a bad argument, path or combination that the caller can fix.

`UsageError` is raised by the library (`probes.frozen_encoder`, `probes.splits`) and by the program
layer (`program.rundir`, `program.flag_support`, the stages), which re-exports it, so one
``except UsageError`` catches both; ``python -m aetv2_tf.train`` maps it to exit 2. It is a
ValueError, as are the library's other input errors (`data.sources.DataError`,
`provenance.ExportTargetError`, `probes.results.ResultsError`).
"""

from __future__ import annotations


class UsageError(ValueError):
    """A bad flag, path or combination: the message names the problem and the fix."""


class SettingWarning(UserWarning):
    """A warning about a setting of a recipe or a model that trains, but not as meant (a
    warm-up longer than half the run, ...): the message says what to change in the library's
    terms; ``settings`` names those settings (an `OptimizerSpec` field such as
    ``warmup_steps``, the ``steps`` of a run, a model's ``decoder_scale``), which the command
    line maps onto its flags (`program.pretext_stage.SETTING_FLAGS`)."""

    def __init__(self, message: str, settings: tuple[str, ...] = ()):
        super().__init__(message)
        self.settings = tuple(settings)
