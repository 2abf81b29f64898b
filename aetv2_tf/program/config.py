"""The run's configuration: the flags parsed ONCE into a frozen, typed value.

    config = from_flags(FLAGS, sys.argv)        # every check that needs no machine; exit 2 else
    check_machine(config, replicas, backend, accelerator)   # the rest, once the adapter knows

`from_flags` reads only the flag values and the command line (no file of a run, FLAGS left
unchanged). Each flags module names its `GROUP`, whose fields are its flags' names.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import types
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging

from aetv2_tf.errors import UsageError
from aetv2_tf.files.safe_paths import read_json
from aetv2_tf.method.recipes import LossSpec, OptimizerSpec, Recipe
from aetv2_tf.models.backbones import BACKBONES, Backbone
from aetv2_tf.program import flag_support, flagfiles, step_sizes
from aetv2_tf.program import flags as program_flags


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The encoder and the pretext model; ``decoder_scale`` None: the loss's default."""

    backbone: Backbone
    batch_norm: str
    decoder_scale: bool | None
    decoder_init_rotation: float
    siamese_batch_norm: str


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The images; ``data_dir`` None: the dataset's default place; ``*_examples`` 0: all."""

    dataset: str
    data_dir: str | None
    download: bool
    train_examples: int
    val_examples: int
    test_examples: int
    shift: str
    augment: bool
    warp: str
    data_service: str | None
    dataset_name: str


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How long and how a stage trains (``batch_size``: global)."""

    batch_size: int
    epochs: int
    train_steps: int
    train_seconds: float
    stop_after_steps: int
    stop_after_seconds: float
    steps_per_execution: int
    seed: int
    on_nonfinite: str
    max_loss_growth: float


@dataclasses.dataclass(frozen=True)
class MachineConfig:
    """Where it runs: the tf.distribute strategy, determinism, precision."""

    strategy: str
    tpu: str | None
    collective_timeout_seconds: int
    cpu_devices: int
    deterministic: bool
    mixed_precision: str


@dataclasses.dataclass(frozen=True)
class OutputsConfig:
    """What the run writes (``model_dir``: ``~`` expanded)."""

    model_dir: str
    overwrite: bool
    allow_flag_changes: bool
    checkpoint_every_steps: int
    keep_checkpoints: int
    summary_every_steps: int
    image_summary_every_steps: int
    verbose: int
    export: bool
    quick_knn_train: int
    quick_knn_test: int


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """The probe stages: ``feature`` defaults to the backbone's probe feature, ``pretrained``
    is a run directory (a preset's name resolved), ``method`` None: from the pretrained run."""

    probe: str
    feature: str
    pretrained: str | None
    trust_saved_model: bool
    probe_pool: str
    method: str | None
    knn_k: int
    knn_metric: str
    knn_pool: str
    knn_ties: str


#: The groups of `RunConfig` filled by name from the `GROUP` of their flags' modules.
GROUP_TYPES: Mapping[str, type] = types.MappingProxyType({
    "model": ModelConfig, "data": DataConfig, "train": TrainConfig, "machine": MachineConfig,
    "outputs": OutputsConfig, "probe": ProbeConfig})


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A run of ``python -m aetv2_tf.train``. ``values``: every flag's value as recorded
    (lists as tuples); ``given``: the flags named on the command line or in a flagfile."""

    stage: str
    pretext: str
    recipe: Recipe
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    machine: MachineConfig
    outputs: OutputsConfig
    probe: ProbeConfig
    values: Mapping[str, Any]
    given: frozenset[str]

    @property
    def image_size(self) -> int:
        """The side of the backbone's square input images."""
        return self.model.backbone.input_size

    def flag_record(self) -> dict[str, Any]:
        """A new dict of every flag's value as flags.json and results.json record it."""
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in self.values.items()}

    def recorded(self, precision: Mapping[str, Any], backend: str | None = None) -> dict:
        """``<model_dir>/flags.json``: the flag values, version, precision (and backend)."""
        from aetv2_tf import __version__

        record = dict(self.flag_record(), version=__version__, precision=dict(precision))
        if backend is not None:
            record["backend"] = backend
        return record

    def flagfile_text(self) -> str:
        """The run's flags as a reusable flagfile (``--flagfile=<model_dir>/flags.cfg``)."""
        values, lines = self.flag_record(), []
        for flag in program_flags.program_flags():
            if values[flag.name] is None:
                continue
            flag = copy.deepcopy(flag)
            flag.value = values[flag.name]
            if line := flag.serialize():
                lines.append(f"{line}\n")
        return "".join(lines)


def _filled(cls: type, values: Mapping[str, Any]) -> Any:
    """``cls`` (a dataclass) with each field set to the value of that name in ``values``."""
    return cls(**{field.name: values[field.name] for field in dataclasses.fields(cls)})


#: The flags whose recipe field has another name (the flag says what it is among all flags).
SPEC_FIELDS = types.MappingProxyType({"loss": "kind", "loss_frame": "frame",
                                      "loss_frame_scale": "frame_scale", "optimizer": "name"})


def recipe_of(values: Mapping[str, Any]) -> Recipe:
    """The recipe of flag values: each "recipe" flag onto its field (`SPEC_FIELDS`) of
    `LossSpec` or `OptimizerSpec`; UsageError for a combination the specs refuse."""
    loss_fields = {field.name for field in dataclasses.fields(LossSpec)}
    loss, optimizer = {}, {}
    for flag in program_flags.flags_of_group("recipe"):
        field = SPEC_FIELDS.get(flag.name, flag.name)
        (loss if field in loss_fields else optimizer)[field] = values[flag.name]
    drops = _drop_epochs(values)  # the run's epochs only where drops count them
    optimizer.update(lr_drop_epochs=drops, epochs=values["epochs"] if drops else 0)
    try:
        return Recipe(LossSpec(**loss), OptimizerSpec(**optimizer))
    except ValueError as e:  # the absl validators leave only combinations to the specs
        raise UsageError(str(e)) from e


def _drop_epochs(values: Mapping[str, Any]) -> tuple[int, ...]:
    """`--lr_drop_epochs` as whole epochs; () when empty (the schedule's 30/60/80%)."""
    raw = values["lr_drop_epochs"] or ()
    if not raw:
        return ()
    text = ",".join(raw)
    try:
        epochs = tuple(int(e) for e in raw)
    except ValueError as e:
        raise UsageError(f"--lr_drop_epochs={text}: whole epochs, e.g. 5,15,25.") from e
    if values["lr_schedule"] != "step" or not values["epochs"]:
        raise UsageError("--lr_drop_epochs needs --lr_schedule=step and --epochs (the drops are "
                         f"epochs of it); got --lr_schedule={values['lr_schedule']} "
                         f"--epochs={values['epochs']}.")
    if list(epochs) != sorted(set(epochs)) or epochs[0] < 1:
        raise UsageError(f"--lr_drop_epochs={text}: increasing epochs from 1 on, e.g. 5,15,25.")
    if epochs[-1] >= values["epochs"]:  # a shortened run (--epochs=2 for a check) keeps it
        logging.info("--lr_drop_epochs: the drops at epochs >= --epochs=%d do not happen.",
                     values["epochs"])
    return epochs


def _last_given(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """Of ``names``, the flag given last on the command line, flagfiles expanded in place."""
    last = {name: i for i, arg in enumerate(flagfiles.expand(argv[1:])) for name in names
            if arg == f"--{name}" or arg.startswith(f"--{name}=")}
    return max(last, key=last.get) if len(last) == len(names) else None


def _run_length(values: Mapping[str, Any], argv: Sequence[str]) -> dict[str, int]:
    """Of --train_steps and --train_seconds both > 0, the one given last wins: the other's
    ``{name: 0}``, else ``{}``."""
    if not (values["train_steps"] > 0 and values["train_seconds"] > 0):
        return {}
    winner = _last_given(argv, ("train_steps", "train_seconds"))
    if winner is None:
        return {}
    loser = "train_seconds" if winner == "train_steps" else "train_steps"
    logging.info("--%s=%s was given after --%s: it sizes the run.", winner, values[winner], loser)
    return {loser: 0}


def _check_values(v: Mapping[str, Any]) -> None:
    """The checks of flag combinations that need no machine (`check_machine` has the rest)."""
    if v["stage"] == "pretext" and not (v["epochs"] or v["train_steps"] or v["train_seconds"]):
        raise UsageError("pass --epochs, --train_steps or --train_seconds (all are 0).")
    if v["dataset"] == "cifar10" and v["backbone"] == "alexnet":
        raise UsageError("--backbone=alexnet expects 224x224 images, --dataset=cifar10 has 32x32; "
                         "use --backbone=nin for CIFAR-10.")
    if v["dataset"] not in ("cifar10", "folder") and v["backbone"] == "nin":
        raise UsageError(f"--backbone=nin is the CIFAR-10 network (also for folders of small "
                         f"images, cropped to 32 px); use --backbone=alexnet for "
                         f"--dataset={v['dataset']}.")
    if v["stage"] == "probe" and not v["pretrained"]:
        raise UsageError("--stage=probe needs --pretrained=<model_dir|SavedModel dir|none>.")
    for name, alternative in (("train_seconds", "--train_steps (every worker the same)"),
                              ("stop_after_seconds", "--stop_after_steps (every worker stops "
                                                     "at the same step)")):
        if v[name] and v["strategy"] in ("multi_worker_mirrored", "tpu"):
            raise UsageError(f"--{name} reads this machine's clock alone; with --strategy="
                             f"{v['strategy']} pass {alternative}.")
    if v["pretext"] == "rotation" and v["stage"] == "pretext" and v["batch_size"] % 4:
        raise UsageError(f"--pretext=rotation shows each image in its 4 rotations: "
                         f"--batch_size={v['batch_size']} must be a multiple of 4.")
    if v["mse_target"] == "official" and v["pretext"] == "aet" and v["loss"] != "mse":
        raise UsageError("--mse_target=official is the AETv1 MSE's target: use it with "
                         "--loss=mse (configs/cifar10_aetv1_official.cfg).")
    if v["mse_target"] == "official" and v["decoder_scale"]:
        raise UsageError("--mse_target=official regresses the AETv1 code's own normalised "
                         "targets: drop --decoder_scale.")


def _recorded_values(flag_values: Any, argv: Sequence[str]) -> dict[str, Any]:
    """Every flag's value as recorded: lists as tuples, the run length decided, a preset's
    name as its run directory."""
    from aetv2_tf.files import presets

    values = {flag.name: tuple(flag.value) if isinstance(flag.value, list) else flag.value
              for flag in program_flags.program_flags(flag_values)}
    values.update(_run_length(values, argv))
    if values["stage"] == "probe":
        values["pretrained"] = presets.directory_of(values["pretrained"])
    return values


def from_flags(flag_values: Any, argv: Sequence[str]) -> RunConfig:
    """The `RunConfig` of parsed flags; UsageError naming the flag and the fix. ``argv``: the
    command line (flagfiles unexpanded), for which of two flags came last."""
    values = _recorded_values(flag_values, argv)
    given = frozenset(f.name for f in program_flags.program_flags(flag_values) if f.present)
    _check_values(values)
    recipe = recipe_of(values)
    step_sizes.check(values)
    if ignored := flag_support.ignored_by_rotnet(values, given):
        logging.warning("%s", ignored)
    backbone = BACKBONES[values["backbone"]]
    fields = dict(values, backbone=backbone, feature=values["feature"] or backbone.probe_feature,
                  dataset_name=values["dataset_name"] or values["dataset"])
    groups = {name: _filled(cls, fields) for name, cls in GROUP_TYPES.items()}
    return _filled(RunConfig, {**fields, **groups, "recipe": recipe,
                               "values": types.MappingProxyType(values), "given": given})


#: Where a run sized by ``--train_seconds`` records the step count it was given.
BUDGET_FILE = "budget.json"


def recorded_budget(config: RunConfig) -> dict | None:
    """The ``--train_seconds`` record of ``--model_dir`` (None: none); refuses another."""
    path = os.path.join(config.outputs.model_dir, BUDGET_FILE)
    if config.stage != "pretext" or not os.path.lexists(path):
        return None
    fix = "move it away (its run then starts afresh), or choose another --model_dir"
    try:
        if not isinstance(recorded := read_json(path, fix), dict):
            raise ValueError(f"a JSON {type(recorded).__name__}, not an object")
    except (OSError, ValueError) as e:
        raise UsageError(f"{path} is not a readable budget record ({e}); {fix}.") from e
    seconds = config.train.train_seconds
    if recorded.get("train_seconds") != seconds:
        raise UsageError(f"--train_seconds={seconds:g} differs from the "
                         f"{recorded.get('train_seconds')} that sized the run in {path} "
                         f"(--train_steps={recorded.get('train_steps')}); resume with "
                         f"--train_seconds={recorded.get('train_seconds')}, or start afresh in a "
                         f"new --model_dir.")
    return recorded


#: The last commit of version 0.1.0, which resumes the runs of 0.1 (no "version" recorded).
RESUMES_VERSION_0_1 = "75f7d0f"


def check_run_version(model_dir: str) -> None:
    """Refuses a ``model_dir`` whose flags.json records no "version" (0.1); a missing or
    unreadable record is left to `rundir`."""
    path = os.path.join(model_dir, "flags.json")
    try:
        saved = read_json(path)
    except (OSError, ValueError):  # a FIFO, a huge file too: `rundir` names it
        return
    if isinstance(saved, dict) and "version" not in saved:
        raise UsageError(
            f"--model_dir={model_dir} holds a run of aetv2_tf 0.1 ({path} records no "
            "version), whose defaults differ from this version's (--siamese_batch_norm, the "
            "AETv2 loss): it would not continue as it trained. Resume it with version 0.1.0 "
            f"(`git checkout {RESUMES_VERSION_0_1}`, then the same command), pass --overwrite to "
            "start afresh there (its files are set aside, nothing is deleted), or choose a new "
            "--model_dir.")


def check_machine(config: RunConfig, num_replicas: int, backend: str, accelerator: bool) -> None:
    """The checks that need the machine (replicas, accelerator, backend) and, unless
    ``--overwrite``, a pretraining ``--model_dir`` of version 0.1 or of another
    ``--train_seconds``; before anything is written."""
    if config.train.batch_size % num_replicas:
        raise UsageError(f"--batch_size={config.train.batch_size} is not divisible by the "
                         f"{num_replicas} replicas of --strategy={config.machine.strategy}; use "
                         f"a multiple of {num_replicas}.")
    if config.machine.mixed_precision == "mixed_float16" and not accelerator:
        raise UsageError("--mixed_precision=mixed_float16 needs a GPU; on a CPU use "
                         "mixed_bfloat16 (fast with AMX) or none.")
    flag_support.check(backend, config.values, config.given)
    if config.stage == "pretext" and not config.outputs.overwrite:
        check_run_version(config.outputs.model_dir)
        if config.train.train_seconds:
            recorded_budget(config)
