"""Command-line flags of `python -m aetv2_tf.train` (absl), one module per purpose (`MODULES`),
each naming the `GROUP` of `config.RunConfig` its flags fill (`flag_support.defined`: what else
the program knows of each). A value out of its flag's domain stops the parse (exit 1).
"""

from __future__ import annotations

from types import ModuleType

from absl import flags

from aetv2_tf.program import flag_support
from aetv2_tf.program.flagfiles import parse_command_line as parse_command_line  # app.run's
from aetv2_tf.program.flags import (
    data,
    loss,
    machine,
    model,
    optimizer,
    outputs,
    probes,
    stage,
    training,
)

#: The modules that define the flags, in the order of a run's story (`program_flags`).
MODULES: tuple[ModuleType, ...] = (stage, loss, model, data, optimizer, training, machine,
                                   outputs, probes)
#: Their names, under which ``--helpfull`` lists their flags.
GROUPS = tuple(m.__name__ for m in MODULES)

FLAGS = flags.FLAGS

# Integer flags: digits up to flag_support.MAX_INT; path flags: `~` expanded, also in a flagfile.
flag_support.strict_flags(FLAGS, GROUPS)


def program_flags(flag_values: flags.FlagValues = FLAGS) -> list[flags.Flag]:
    """The flags of ``python -m aetv2_tf.train`` (every group of this module), in order."""
    return [flag for group in GROUPS for flag in flag_values.get_flags_for_module(group)]


def _in_order(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f.name for f in program_flags() if f.name in names)


#: Flags that change a pretraining run's trajectory: resuming with another value is refused
#: unless --allow_flag_changes (then recorded in <model_dir>/flags_history.jsonl).
TRAJECTORY = _in_order(flag_support.trajectory_flags())
#: Flags a run keeps: a --model_dir holding a run with other values is refused (`rundir`).
ESSENTIAL = _in_order(flag_support.essential_flags())


def flags_of_group(group: str, flag_values: flags.FlagValues = FLAGS) -> list[flags.Flag]:
    """The flags whose module names ``group`` (its `GROUP`: "run", "recipe", "model", ...)."""
    return [flag for module in MODULES if module.GROUP == group
            for flag in flag_values.get_flags_for_module(module.__name__)]
