"""The run's configuration: the flags parsed ONCE into a frozen, typed value.

    config = from_flags(FLAGS, sys.argv)        # every check that needs no machine; exit 2 else
    check_machine(config, replicas, backend, accelerator)   # the rest, once the adapter knows

`from_flags` reads the flags of `program.flags` and nothing reads them again: the stages and
their adapters take the `RunConfig`. It decides, in this order, everything the command line
leaves open: the run length (`--train_steps` or `--train_seconds`, whichever comes last), the
values a run of an earlier version trained with (`flags.adopt_earlier_defaults`,
`flags.adopt_earlier_recipe`), a preset's run directory for `--pretrained`, the recipe
(`recipes.Recipe`: the flag names mapped onto its `LossSpec` and `OptimizerSpec`, here and only
here), the backbone's facts (`models.backbones`). The global FLAGS are never changed.

The groups: `recipe` (loss and optimizer), `model`, `data`, `train` (length, stops, seed),
`machine`, `outputs` (model_dir, checkpoints, logs, exports) and `probe`; ``values`` holds every
flag as the run records it (flags.json, flags.cfg, results.json).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging

from aetv2_tf.errors import UsageError
from aetv2_tf.method.recipes import LossSpec, OptimizerSpec, Recipe
from aetv2_tf.models.backbones import BACKBONES, Backbone
from aetv2_tf.program import flag_support
from aetv2_tf.program import flags as program_flags


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The encoder and the pretext model: ``backbone`` (its facts, `models.backbones`),
    ``batch_norm`` (as asked: "fused" or "keras"; `Backbone.batch_norm_kind` says what is
    built), the decoder's ``decoder_scale`` (None: the loss's default), ``decoder_init_rotation``
    and ``siamese_batch_norm``."""

    backbone: Backbone
    batch_norm: str
    decoder_scale: bool | None
    decoder_init_rotation: float
    siamese_batch_norm: str


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The images: ``dataset``, ``data_dir`` (``~`` expanded; None: the dataset's default
    place), ``download``, ``train_examples`` / ``val_examples`` / ``test_examples`` (0: all),
    the sampler's ``shift``, ``augment``, where the TensorFlow program warps (``warp``), a
    tf.data ``data_service``, and the ``dataset_name`` results are labelled with."""

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
    """How long and how a stage trains: ``batch_size`` (global), ``epochs`` / ``train_steps``
    (the one that sizes the run; ``train_seconds`` already turned into neither: see
    `from_flags`), ``train_seconds``, where this invocation stops early (``stop_after_steps``,
    ``stop_after_seconds``), ``steps_per_execution``, ``seed``, ``on_nonfinite`` and
    ``max_loss_growth``."""

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
    """Where it runs: the tf.distribute ``strategy`` (``tpu``, ``collective_timeout_seconds``,
    ``cpu_devices``), ``deterministic`` ops and ``mixed_precision``."""

    strategy: str
    tpu: str | None
    collective_timeout_seconds: int
    cpu_devices: int
    deterministic: bool
    mixed_precision: str


@dataclasses.dataclass(frozen=True)
class OutputsConfig:
    """What the run writes: ``model_dir`` (``~`` expanded), ``overwrite``,
    ``allow_flag_changes``, checkpoints (``checkpoint_every_steps``, ``keep_checkpoints``), logs
    (``summary_every_steps``, ``image_summary_every_steps``, ``verbose``), ``export`` and the
    quick KNN at the end (``quick_knn_train``, ``quick_knn_test``)."""

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
    """The probe stages: ``probe``, the frozen ``feature`` (the backbone's probe feature when
    not given), ``pretrained`` (a preset already resolved to its directory), whether an
    untrusted SavedModel may run (``trust_saved_model``), ``probe_pool``, the ``method`` label
    (None: from the pretrained run), the KNN's ``knn_k``, ``knn_metric``, ``knn_pool``,
    ``knn_ties``, and the heads' ``lr_drop_epochs``."""

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
    lr_drop_epochs: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A run of ``python -m aetv2_tf.train`` (module docstring). ``given``: the flags named on
    the command line (or in a flagfile), which the backends' table reads."""

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

    def recorded(self, precision: Mapping[str, Any], backend: str | None = None) -> dict:
        """What ``<model_dir>/flags.json`` records of the run: its flag values, the package's
        version, the precision chosen (and the Keras backend, where it is not TensorFlow's
        program)."""
        from aetv2_tf import __version__

        record = dict(self.values, version=__version__, precision=dict(precision))
        if backend is not None:
            record["backend"] = backend
        return record

    def flagfile_text(self) -> str:
        """The run's flags as a reusable flagfile (``--flagfile=<model_dir>/flags.cfg``)."""
        lines = []
        for flag in program_flags.program_flags():
            value = self.values[flag.name]
            if value is None:
                continue
            flag = copy.deepcopy(flag)
            flag.value = value
            if line := flag.serialize():
                lines.append(f"{line}\n")
        return "".join(lines)


def recipe_of(values: Mapping[str, Any], lr_drops: Sequence[float] = ()) -> Recipe:
    """The recipe of flag values (the flag names onto `LossSpec` and `OptimizerSpec`; the one
    translation of the flags into a recipe)."""
    loss = LossSpec(
        kind=values["loss"], projection_weight=values["projection_weight"],
        angle_power=values["angle_power"], residual_scale=values["residual_scale"],
        chordal_weight=values["chordal_weight"], mse_weight=values["mse_weight"],
        mse_decay_steps=values["mse_decay_steps"], frame=values["loss_frame"],
        frame_scale=values["loss_frame_scale"], residual_frame=values["residual_frame"],
        mse_normalize=values["mse_normalize"], mse_target=values["mse_target"])
    optimizer = OptimizerSpec(
        name=values["optimizer"], learning_rate=values["learning_rate"],
        lr_schedule=values["lr_schedule"], warmup_steps=values["warmup_steps"],
        lr_drops=tuple(lr_drops), lr_drop_factor=values["lr_drop_factor"],
        momentum=values["momentum"], adam_beta1=values["adam_beta1"],
        adam_beta2=values["adam_beta2"], weight_decay=values["weight_decay"],
        weight_decay_mode=values["weight_decay_mode"])
    return Recipe(loss, optimizer)


def _last_given(argv: Sequence[str], names: Sequence[str], flag_values) -> str | None:
    """Of ``names``, the flag given last on the command line, flagfiles expanded in place."""
    expanded = flag_values.read_flags_from_files(list(argv[1:]), force_gnu=False)
    last = {}
    for i, arg in enumerate(expanded):
        for name in names:
            if arg == f"--{name}" or arg.startswith(f"--{name}="):
                last[name] = i
    return max(last, key=last.get) if len(last) == len(names) else None


def _run_length(values: dict, argv: Sequence[str], flag_values) -> None:
    """--train_steps and --train_seconds both > 0: the one given LAST wins, the other is 0
    (``--flagfile=configs/quickstart.cfg --train_steps=20`` trains 20 steps)."""
    if not (values["train_steps"] > 0 and values["train_seconds"] > 0):
        return
    winner = _last_given(argv, ("train_steps", "train_seconds"), flag_values)
    if winner is not None:
        loser = "train_seconds" if winner == "train_steps" else "train_steps"
        values[loser] = 0
        logging.info("--%s=%s was given after --%s: it sizes the run.", winner, values[winner],
                     loser)


def _continue_earlier_run(values: dict, given: frozenset[str], argv: Sequence[str]) -> None:
    """A `--model_dir` holding a run of an earlier version resumes as it trained
    (`flags.adopt_earlier_defaults`, `flags.adopt_earlier_recipe`), unless `--overwrite`. A
    missing or unreadable flags.json changes nothing (`rundir`'s own checks report it)."""
    path = os.path.join(values["model_dir"] or "", "flags.json")
    if values["overwrite"] or values["stage"] != "pretext" or not os.path.isfile(path):
        return
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return
    if not isinstance(saved, dict):
        return
    made = program_flags.adopt_earlier_defaults(saved, values, given) + \
        program_flags.adopt_earlier_recipe(saved, values, argv)
    if made:
        logging.info("%s records a run of an earlier version: it continues with %s.", path,
                     " ".join(made))
        print(f"Resuming a run of an earlier version: {' '.join(made)} (as it trained).",
              flush=True)


def _lr_drops(values: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """`--lr_drop_epochs` as whole epochs and as fractions of the run (epoch e of --epochs:
    e / epochs; drops past the end never happen); () when empty (the schedule's 30/60/80%)."""
    raw = values["lr_drop_epochs"] or []
    if not raw:
        return (), ()
    text = ",".join(raw)
    try:
        epochs = [int(e) for e in raw]
    except ValueError as e:
        raise UsageError(f"--lr_drop_epochs={text}: whole epochs, e.g. 5,15,25.") from e
    if values["lr_schedule"] != "step" or not values["epochs"]:
        raise UsageError("--lr_drop_epochs needs --lr_schedule=step and --epochs (the drops are "
                         f"epochs of it); got --lr_schedule={values['lr_schedule']} "
                         f"--epochs={values['epochs']}.")
    if epochs != sorted(set(epochs)) or epochs[0] < 1:
        raise UsageError(f"--lr_drop_epochs={text}: increasing epochs from 1 on, e.g. 5,15,25.")
    if epochs[-1] >= values["epochs"]:  # a shortened run (--epochs=2 for a check) keeps it
        logging.info("--lr_drop_epochs: the drops at epochs >= --epochs=%d do not happen.",
                     values["epochs"])
    return tuple(epochs), tuple(e / values["epochs"] for e in epochs)


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
    if v["pretext"] == "rotation" and v["loss"] == "mse" and v["stage"] == "pretext":
        logging.info("--loss is ignored by --pretext=rotation (cross-entropy over 4 rotations).")


def _expand(path: str | None) -> str | None:
    return os.path.expanduser(path) if path else path


def from_flags(flag_values: Any, argv: Sequence[str]) -> RunConfig:
    """The `RunConfig` of parsed flags (module docstring); UsageError naming the flag and the
    fix for what no machine is needed to refuse. ``argv``: the command line (flagfiles
    unexpanded), for which of two flags came last and which were typed."""
    values = {f.name: f.value for f in program_flags.program_flags(flag_values)}
    given = frozenset(f.name for f in program_flags.program_flags(flag_values) if f.present)
    _run_length(values, argv, flag_values)
    _continue_earlier_run(values, given, argv)
    backbone = BACKBONES[values["backbone"]]
    if values["stage"] == "probe":
        values["pretrained"] = preset_resolved(values["pretrained"])
    _check_values(values)
    drop_epochs, drop_fractions = _lr_drops(values)
    try:
        recipe = recipe_of(values, drop_fractions)
    except ValueError as e:  # the absl validators leave only combinations to the specs
        raise UsageError(str(e)) from e
    values["model_dir"], values["data_dir"] = _expand(values["model_dir"]), \
        _expand(values["data_dir"])
    feature = values["feature"] or backbone.probe_feature
    config = RunConfig(
        stage=values["stage"], pretext=values["pretext"], recipe=recipe,
        model=ModelConfig(backbone, values["batch_norm"], values["decoder_scale"],
                          values["decoder_init_rotation"], values["siamese_batch_norm"]),
        data=DataConfig(values["dataset"], values["data_dir"], values["download"],
                        values["train_examples"], values["val_examples"],
                        values["test_examples"], values["shift"], values["augment"],
                        values["warp"], values["data_service"],
                        values["dataset_name"] or values["dataset"]),
        train=TrainConfig(values["batch_size"], values["epochs"], values["train_steps"],
                          values["train_seconds"], values["stop_after_steps"],
                          values["stop_after_seconds"], values["steps_per_execution"],
                          values["seed"], values["on_nonfinite"], values["max_loss_growth"]),
        machine=MachineConfig(values["strategy"], values["tpu"],
                              values["collective_timeout_seconds"], values["cpu_devices"],
                              values["deterministic"], values["mixed_precision"]),
        outputs=OutputsConfig(values["model_dir"], values["overwrite"],
                              values["allow_flag_changes"], values["checkpoint_every_steps"],
                              values["keep_checkpoints"], values["summary_every_steps"],
                              values["image_summary_every_steps"], values["verbose"],
                              values["export"], values["quick_knn_train"],
                              values["quick_knn_test"]),
        probe=ProbeConfig(values["probe"], feature, values["pretrained"],
                          values["trust_saved_model"], values["probe_pool"], values["method"],
                          values["knn_k"], values["knn_metric"], values["knn_pool"],
                          values["knn_ties"], drop_epochs),
        values=dict(values), given=given)
    if config.stage == "pretext" and config.train.train_seconds and not config.outputs.overwrite:
        recorded_budget(config)  # a resumed budgeted run keeps the budget that sized it
    return config


def preset_resolved(pretrained: str | None) -> str | None:
    """``--pretrained``: a preset name (`aetv2_tf.presets()`, e.g. aetv1_cifar10) -> its run
    directory in results/scale; "none" and paths as given. A preset whose directory (or
    weights) is not in this checkout, or a name that is no preset and no path (a mistyped
    preset), is a usage error (exit 2) that says where presets live or lists them."""
    from aetv2_tf.files import presets

    if not pretrained or pretrained.strip().lower() == "none":
        return pretrained
    try:
        return presets.resolve(pretrained)
    except (FileNotFoundError, presets.UnknownPreset) as e:
        raise UsageError(f"--pretrained={pretrained}: {e}") from e


#: Where a run sized by ``--train_seconds`` records the step count it was given.
BUDGET_FILE = "budget.json"


def recorded_budget(config: RunConfig) -> dict | None:
    """The ``--train_seconds`` record of ``--model_dir`` (None: none); refuses another
    budget."""
    path = os.path.join(config.outputs.model_dir, BUDGET_FILE)
    if config.stage != "pretext" or not os.path.isfile(path):
        return None
    with open(path) as f:
        recorded = json.load(f)
    seconds = config.train.train_seconds
    if recorded.get("train_seconds") != seconds:
        raise UsageError(f"--train_seconds={seconds:g} differs from the "
                         f"{recorded.get('train_seconds')} that sized the run in {path} "
                         f"(--train_steps={recorded.get('train_steps')}); resume with "
                         f"--train_seconds={recorded.get('train_seconds')}, or start afresh in a "
                         f"new --model_dir.")
    return recorded


def check_machine(config: RunConfig, num_replicas: int, backend: str, accelerator: bool) -> None:
    """The checks that need the machine: the batch against the replicas, mixed_float16 against
    an accelerator, and the backend's flag table (`flag_support`); before anything is
    written."""
    if config.train.batch_size % num_replicas:
        raise UsageError(f"--batch_size={config.train.batch_size} is not divisible by the "
                         f"{num_replicas} replicas of --strategy={config.machine.strategy}; use "
                         f"a multiple of {num_replicas}.")
    if config.machine.mixed_precision == "mixed_float16" and not accelerator:
        raise UsageError("--mixed_precision=mixed_float16 needs a GPU; on a CPU use "
                         "mixed_bfloat16 (fast with AMX) or none.")
    flag_support.check(backend, config.values, config.given)
