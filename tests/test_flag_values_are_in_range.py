"""Every flag value the program takes trains as asked, or is refused before anything is written.

Issue "Nothing silently wrong", the flags: an optimizer that cannot move a weight
(`--adam_beta2=1`, a learning rate that is 0 in float32) ended "Done" with the weights it
started with, `--adam_beta1=1.5` was taken, `--momentum=-1` ended in Keras's traceback after
flags.json was written, and `--pretext=rotation --loss=mse` ignored a flag without a word. Now
each flag's domain is checked while parsing (exit 1, absl's validators: `flag_support.defined`),
the rates a schedule reaches in float32 by `program.step_sizes` (exit 2), every refusal of the
configuration leaves the model_dir as it was, and random values of every numeric flag are
accepted (and then the configuration builds and its optimizer moves a weight) or refused with a
message, never a traceback. In-process (docs/reliability.md, "Trust: flag values").
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import warnings

import keras
import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from aetv2_tf.errors import SettingWarning, UsageError
from aetv2_tf.method import optimizers
from aetv2_tf.program import config as run_config
from aetv2_tf.program import flag_support, step_sizes
from aetv2_tf.program.flags import FLAGS, program_flags
from tests.cli import train_args

TINY = flag_support.FLOAT32_TINY


@pytest.fixture
def read(configured):
    """``read(*args)``: the flags parsed (with a --model_dir under a folder that does not
    exist) and read into a `RunConfig` as `aetv2_tf.train` does (conftest's `configured`);
    absl's and the program's refusals raise."""
    return lambda *args: configured("--model_dir=/nonexistent/run", "--train_steps=4", *args)


# ----------------------------------------------------------------- the command lines
@pytest.mark.parametrize("arg, message", [
    ("--adam_beta2=1.0", r"--adam_beta2 must be >= 0 and below 1.*no weight would ever change"),
    ("--adam_beta2=0.99999999", r"--adam_beta2 must be >= 0 and below 1, also in float32"),
    ("--adam_beta1=1.5", r"--adam_beta1 must be >= 0 and below 1.*negative above"),
    ("--adam_beta1=-0.1", r"--adam_beta1 must be >= 0"),
    ("--momentum=-1", r"--momentum must be >= 0 and below 1"),
    ("--momentum=1", r"--momentum must be >= 0 and below 1.*grows without end"),
    ("--learning_rate=1e-300", r"--learning_rate must be from 1.18e-38 to 3.4e\+38: .*float32"),
    ("--learning_rate=1e-40", r"--learning_rate must be from 1.18e-38"),
    ("--learning_rate=1e39", r"--learning_rate must be from 1.18e-38 to 3.4e\+38"),
    ("--lr_drop_factor=2", r"--lr_drop_factor must be > 0 and at most 1"),
    ("--weight_decay=1e39", r"--weight_decay must be 0 or of a size from 1.18e-38"),
    ("--loss_frame_scale=1e-300", r"--loss_frame_scale must be from 1e-06 to 1e\+06"),
    ("--loss_frame_scale=9e-7", r"--loss_frame_scale must be from 1e-06 to 1e\+06"),
    ("--residual_scale=1e-42", r"--residual_scale must be 0 or of a size"),
    ("--decoder_init_rotation=1e300", r"--decoder_init_rotation is in degrees: .*-360 to 360"),
    ("--stop_after_seconds=1e21", r"--stop_after_seconds must be at most 31536000"),
    ("--verbose=7", r"--verbose must be 0 \(silent\), 1 \(a progress bar\) or 2"),
    ("--data_dir=", r"--data_dir is empty"),
    ("--model_dir=runs/a\0b", r"a path cannot hold a NUL byte"),
    ("--method=AETv2\n--learning_rate=1", r"--method must be one line of text: a line break"),
    ("--dataset_name=cifar\r10", r"--dataset_name must be one line of text"),
    ("--data_service=grpc://a:1\0", r"--data_service must be one line of text"),
], ids=lambda x: x if x.startswith("--") else "")
def test_a_value_outside_its_flags_domain_is_refused_while_parsing(read, arg, message):
    """Refused by absl's validators (exit 1 on the command line), naming the flag, the range
    and why; the values just inside each range are taken."""
    with pytest.raises(flags.IllegalFlagValueError, match=message):
        read(arg)


@pytest.mark.parametrize("args", [
    ("--adam_beta2=0.99999994", "--adam_beta1=0"), ("--momentum=0", "--optimizer=sgd"),
    ("--learning_rate=1.2e-38", "--adam_beta2=0"), ("--lr_drop_factor=1",),
    ("--decoder_init_rotation=-360",), ("--verbose=2",), ("--learning_rate=3.4e38",),
    ("--loss_frame_scale=1e-6",), ("--loss_frame_scale=1e6",)])
def test_the_values_at_the_edges_of_the_domains_are_taken(read, args):
    read(*args)


def test_beta2_of_one_is_refused_before_anything_is_written(program, tmp_path, cifar10_dir):
    """The issue's `--adam_beta2=1.0` (and `--learning_rate=1e-300`): it trained 4 steps and
    ended "Done" with the trainable digest it started with."""
    for arg in ("--adam_beta2=1.0", "--learning_rate=1e-300"):
        with pytest.raises(flags.IllegalFlagValueError, match=arg.split("=")[0] + " must be"):
            program(*train_args(tmp_path / "run", cifar10_dir, "--train_steps=4", arg))
    assert not (tmp_path / "run").exists()


def test_sgd_with_momentum_minus_one_is_refused_before_anything_is_written(program, tmp_path,
                                                                           cifar10_dir):
    """The issue's `--optimizer=sgd --momentum=-1`: Keras's traceback, after flags.json and
    flags.cfg were written."""
    with pytest.raises(flags.IllegalFlagValueError, match="--momentum must be >= 0 and below 1"):
        program(*train_args(tmp_path / "run", cifar10_dir, "--train_steps=4", "--optimizer=sgd",
                            "--momentum=-1"))
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------- the rates of a schedule, in float32
def first_step(optimizer_spec, steps: int = 20) -> np.ndarray:
    """The change of a zero float32 weight after one step of the spec's real optimizer
    (Keras's, wrapped as the program wraps it) for a unit gradient."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SettingWarning)  # a warm-up longer than the run
        _, optimizer = optimizer_spec.build(steps)
    weight = keras.Variable(np.zeros((2,), np.float32))
    optimizer.build([weight])
    optimizer.apply([keras.ops.ones((2,))], [weight])
    return keras.ops.convert_to_numpy(weight)


@pytest.mark.parametrize("values, refused", [
    (dict(learning_rate=1e-37), r"Adam's first factor of the rate --learning_rate=1e-37 "
                                r"\(x sqrt\(1 - --adam_beta2=0.999\)\) is 3.16e-39"),
    (dict(learning_rate=4e-37), None),
    (dict(learning_rate=2e-38, adam_beta2=0.5), None),
    (dict(learning_rate=1.3e-38, adam_beta2=0.5), r"Adam's first factor .* is 9.19e-39"),
    (dict(learning_rate=1e-30, warmup_steps=10**9),
     r"the warm-up's first rate \(--learning_rate / --warmup_steps=1000000000\) is 1e-39"),
    (dict(learning_rate=1.2e-38, name="sgd"), None),
], ids=["adam_factor_below", "adam_just_above", "beta2_half", "beta2_half_below", "warmup",
        "sgd_tiny"])
def test_a_first_step_is_refused_exactly_when_the_real_optimizer_would_not_move(read, values,
                                                                                refused):
    """The oracle: Keras's own optimizer (TensorFlow flushes denormals to 0 on the CPU) applied
    once to a zero weight: `step_sizes` refuses exactly the first steps that leave it at 0."""
    spec = run_config.OptimizerSpec(**values, weight_decay=0.0)
    args = [f"--{'optimizer' if k == 'name' else k}={v}" for k, v in values.items()]
    if refused:
        with pytest.raises(UsageError, match=refused):
            read(*args)
    else:
        assert read(*args).recipe.optimizer == dataclasses.replace(spec, weight_decay=5e-4)
    moved = first_step(spec)
    assert (np.all(moved == 0) if refused else np.all(moved < 0)), moved


@pytest.mark.parametrize("args, message", [
    (("--lr_schedule=step", "--learning_rate=1e-36", "--lr_drop_factor=0.001"),
     r"the rate after the 3 drops of --lr_schedule=step \(--lr_drop_factor=0.001\) is 1.4e-45"),
    (("--lr_schedule=step", "--epochs=30", "--train_steps=0", "--lr_drop_epochs=5,10",
      "--learning_rate=1e-30", "--lr_drop_factor=1e-5"), r"after the 2 drops .* is 1e-40 in"),
    (("--lr_schedule=aetv1", "--learning_rate=1e-36"),
     r"the rate at the end of --lr_schedule=aetv1 \(x0.0001\) is 1e-40"),
])
def test_a_rate_that_a_schedule_reaches_is_refused_when_it_is_zero_in_float32(read, args,
                                                                              message):
    """The drops of `--lr_schedule=step` and the tail of `aetv1` (the real schedule, evaluated
    at the run's last step, agrees: below float32's smallest normal number)."""
    with pytest.raises(UsageError, match=message + r".*raise --learning_rate"):
        read(*args)


def test_the_rates_judged_are_those_of_the_real_schedule(read):
    """`scheduled_rates` against `optimizers.Schedule` itself over a run of 100 steps (float32,
    as the optimizer reads it): the warm-up's first step and the rate after the last drop are
    the real ones; aetv1's judged end (x1e-4, its limit) is at most its real last rate."""
    cases = [(("--lr_schedule=step", "--learning_rate=3e-3", "--lr_drop_factor=0.1",
               "--warmup_steps=7"), 1.0),
             (("--lr_schedule=step", "--learning_rate=0.1", "--epochs=10", "--train_steps=0",
               "--lr_drop_epochs=2,4,20"), 1.0),
             (("--lr_schedule=aetv1", "--learning_rate=0.1"), 1.5)]
    for args, above in cases:
        config = read(*args, "--optimizer=sgd")
        spec = config.recipe.optimizer
        schedule = optimizers.Schedule(spec.lr_schedule, spec.learning_rate, 100,
                                       spec.warmup_steps, drop_factor=spec.lr_drop_factor,
                                       drop_epochs=spec.lr_drop_epochs, epochs=spec.epochs)
        real = keras.ops.convert_to_numpy(schedule(np.arange(100)))
        judged = [rate for _, rate in step_sizes.scheduled_rates(config.values)]
        assert min(judged) <= real.min() <= above * min(judged), (args, real.min(), judged)
        if spec.warmup_steps:
            assert float(real[0]) in judged, (real[0], judged)


def test_a_step_below_float32s_resolution_at_one_is_said(read, caplog):
    """`--learning_rate=1e-9` trains, but Adam's steps of 1e-9 change no weight above 0.0168:
    a warning names it (the real optimizer agrees: a weight of 1 stays 1)."""
    read("--learning_rate=1e-9")
    assert re.search(r"--learning_rate=1e-09: an Adam step of about 1e-09 changes no float32 "
                     r"weight larger than 0.0168", caplog.text), caplog.text
    _, optimizer = run_config.OptimizerSpec(learning_rate=1e-9, weight_decay=0).build(4)
    weight = keras.Variable(np.ones((2,), np.float32))
    optimizer.build([weight])
    optimizer.apply([keras.ops.ones((2,))], [weight])
    assert np.all(keras.ops.convert_to_numpy(weight) == 1)
    caplog.clear()
    read("--learning_rate=1e-7")
    assert "an Adam step" not in caplog.text


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_the_rate_and_the_weights_are_float32_under_every_mixed_policy(policy):
    """Why the rates are judged in float32 whatever --mixed_precision computes in: a rate of
    1e-8, 0 in float16 (its smallest number is 6e-8), trains a float16 layer's weights by
    1e-8 a step: the variables and the optimizer stay float32."""
    assert np.float16(1e-8) == 0
    keras.mixed_precision.set_global_policy(policy)
    try:
        layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
        model = keras.Sequential([keras.Input((4,)), layer])
        optimizer = keras.optimizers.Adam(1e-8)
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(optimizer)
                      if policy == "mixed_float16" else optimizer, loss="mse")
        model.fit(np.ones((8, 4), np.float32), np.full((8, 1), 0.1, np.float32), epochs=3,
                  batch_size=8, verbose=0)
        assert layer.compute_dtype == policy.split("_")[1]
        assert layer.kernel.dtype == optimizer.learning_rate.dtype == "float32"
        applied = int(keras.ops.convert_to_numpy(optimizer.iterations))
        assert applied >= 1
        np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.kernel),
                                   np.full((4, 1), 1e-8 * applied), rtol=0.01)
    finally:
        keras.mixed_precision.set_global_policy("float32")


# ------------------------------------------------------------ the flags that RotNet ignores
def test_the_flags_rotnet_ignores_are_named_in_a_warning(read, caplog):
    """`--pretext=rotation --loss=mse` ran without a word (an INFO line); now a warning names
    every flag given that only the AET pretext reads; none for RotNet's own config."""
    read("--pretext=rotation", "--loss=mse", "--projection_weight=3", "--shift=continuous",
         "--batch_size=8")
    assert re.search(r"--loss=mse, --projection_weight=3.0, --shift=continuous: ignored by "
                     r"--pretext=rotation \(RotNet: .*drop them", caplog.text), caplog.text
    caplog.clear()
    read("--flagfile=configs/cifar10_rotnet.cfg", "--batch_size=8")
    read("--loss=mse")  # the AET pretext reads it
    assert "ignored by" not in caplog.text, caplog.text


def test_the_flags_marked_aet_only_are_those_rotnet_never_reads():
    """The marks: every flag of the loss's module, the decoder's, the Siamese BatchNorm, the
    homography sampler's shifts and the warp."""
    loss_flags = {f.name for f in FLAGS.get_flags_for_module("aetv2_tf.program.flags.loss")}
    assert set(flag_support.aet_only_flags()) == loss_flags | {
        "decoder_scale", "decoder_init_rotation", "siamese_batch_norm", "shift", "warp"}


# ------------------------------------------- every refusal of the config: nothing written
@dataclasses.dataclass(frozen=True)
class Refusal:
    """A command line the configuration refuses (after `train_args`), a literal part of the
    refusal's message (in the source of the `raise`), and what the model_dir holds before."""

    args: tuple[str, ...]
    said: str
    holds: dict[str, str] = dataclasses.field(default_factory=dict)


VERSIONED = '{"version": "0.2.0"}'  # a flags.json of this version (0.1's is refused first)
REFUSALS = {
    "no_length": Refusal(("--train_steps=0",), "pass --epochs, --train_steps or --train_seconds"),
    "alexnet_cifar": Refusal(("--backbone=alexnet",), "expects 224x224 images"),
    "nin_imagenet": Refusal(("--dataset=imagenet2012",), "is the CIFAR-10 network"),
    "probe_without_pretrained": Refusal(("--stage=probe",), "--stage=probe needs --pretrained"),
    "clock_on_tpu": Refusal(("--strategy=tpu", "--train_seconds=60", "--train_steps=0"),
                            "reads this machine's clock alone"),
    "rotation_batch": Refusal(("--pretext=rotation", "--batch_size=6"),
                              "shows each image in its 4 rotations"),
    "official_with_geodesic": Refusal(("--mse_target=official",),
                                      "is the AETv1 MSE's target"),
    "official_scaled": Refusal(("--mse_target=official", "--loss=mse", "--decoder_scale"),
                               "regresses the AETv1 code's own normalised"),
    "drops_not_epochs": Refusal(("--lr_schedule=step", "--epochs=9", "--lr_drop_epochs=a"),
                                ": whole epochs, e.g. 5,15,25."),
    "drops_without_step": Refusal(("--lr_drop_epochs=5",),
                                  "needs --lr_schedule=step and --epochs"),
    "drops_decreasing": Refusal(("--lr_schedule=step", "--epochs=9", "--lr_drop_epochs=5,2"),
                                ": increasing epochs from 1 on"),
    "rate_zero": Refusal(("--learning_rate=1e-37",), "below its smallest normal number"),
    "float16_on_cpu": Refusal(("--mixed_precision=mixed_float16",), "needs a GPU"),
    "budget_not_json": Refusal(("--train_seconds=60", "--train_steps=0"),
                               "is not a readable budget record",
                               {"flags.json": VERSIONED, "budget.json": "[[["}),
    "budget_a_list": Refusal(("--train_seconds=60", "--train_steps=0"),
                             "(a JSON list, not an object)",
                             {"flags.json": VERSIONED, "budget.json": "[]"}),
    "budget_other": Refusal(("--train_seconds=60", "--train_steps=0"),
                            "that sized the run in",
                            {"flags.json": VERSIONED,
                             "budget.json": '{"train_seconds": 30.0, "train_steps": 9}'}),
    "version_0_1": Refusal((), "holds a run of aetv2_tf 0.1",
                           {"flags.json": '{"stage": "pretext"}'}),
}
#: The `raise UsageError` of the configuration that no case above reaches in this process, and
#: why (a literal part of each, as in `Refusal.said`).
NOT_IN_THIS_PROCESS = {
    "is not divisible by the": "two replicas need two logical CPU devices, configured only "
                               "before TensorFlow starts: input[batch_not_divisible_by_replicas]",
    "": "recipe_of's `UsageError(str(e))` of the specs' own refusals, each refused before by a "
        "flag's validator or `_check_values` (the specs check the library's callers)",
}


def _raised_texts() -> list[str]:
    """The literal text of every ``raise UsageError(...)`` of the configuration's modules."""
    texts = []
    for module in (run_config, step_sizes):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                    getattr(node.exc.func, "id", "") == "UsageError":
                texts.append("".join(n.value for n in ast.walk(node.exc.args[0])
                                     if isinstance(n, ast.Constant) and isinstance(n.value, str)))
    return texts


def test_every_refusal_of_the_configuration_has_a_case():
    texts = _raised_texts()
    assert len(texts) >= 17
    said = [r.said for r in REFUSALS.values()] + list(NOT_IN_THIS_PROCESS)
    for text in texts:
        assert any(part in text for part in said if part) or (text == "" and "" in said), text


@pytest.mark.parametrize("name", list(REFUSALS))
def test_every_refusal_of_the_configuration_leaves_the_model_dir_as_it_was(name, program,
                                                                          tmp_path, cifar10_dir,
                                                                          capsys):
    """Exit 2 with the message, before anything is written: no model_dir where there was none,
    and a model_dir that held files holds exactly those (the same bytes)."""
    case, model_dir = REFUSALS[name], tmp_path / "run"
    for file, text in case.holds.items():
        model_dir.mkdir(exist_ok=True)
        (model_dir / file).write_text(text)
    before = {p.name: p.read_bytes() for p in model_dir.rglob("*")} if case.holds else None
    code = program(*train_args(model_dir, cifar10_dir, "--train_steps=4", *case.args))
    err = capsys.readouterr().err
    assert code == 2 and case.said in err and "Traceback" not in err, err[-2000:]
    if before is None:
        assert not model_dir.exists()
    else:
        assert {p.name: p.read_bytes() for p in model_dir.rglob("*")} == before


# --------------------------------------------------- random values of every numeric flag
NUMERIC = sorted(f.name for f in program_flags()
                 if isinstance(f.parser, (flags.IntegerParser, flags.FloatParser)))
VALUES = st.one_of(
    st.integers(0, 1000).map(str), st.floats(0, 2).map(repr), st.floats(1e-40, 1e-30).map(repr),
    st.integers(-2**40, 2**40).map(str), st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(-1e-30, 1e-30).map(repr), st.floats(0.9, 1.1).map(repr),
    st.sampled_from(["0", "1", "-1", "1e-300", "1e300", "-0.0", "0x10", "1_0", "", " 3", "nan",
                     "1e-45", "0.99999999", "1.0000001", "2147483648", "1e21", "4e-38"]),
    st.text(max_size=8))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(st.sampled_from(NUMERIC), VALUES), min_size=1, max_size=3),
       st.sampled_from(["adam", "sgd"]))
def test_every_numeric_flag_takes_random_values_without_a_traceback(tmp_path_factory, pairs,
                                                                    optimizer):
    """Each random command line: refused by absl (its message names the flag) or by the
    configuration (`UsageError`, naming a flag), nothing written; or accepted, and then the
    configuration builds, its recipe's loss and optimizer build, and the optimizer's first
    step moves a zero weight (the issue's "Done" with nothing changed cannot happen)."""
    model_dir = tmp_path_factory.mktemp("numeric") / "run"
    argv = ["train", f"--model_dir={model_dir}", "--train_steps=4", f"--optimizer={optimizer}",
            *(f"--{name}={value}" for name, value in pairs)]
    saved = flagsaver.save_flag_values(FLAGS)
    try:
        FLAGS.unparse_flags()
        try:
            FLAGS(argv)
        except flags.Error as e:
            assert re.search(r"--\w+", str(e)), str(e)
            event("refused by absl")
            return
        try:
            config = run_config.from_flags(FLAGS, argv)
            run_config.check_machine(config, 1, "tensorflow", accelerator=False)
        except UsageError as e:
            assert "--" in str(e), str(e)
            event("refused by the configuration")
            return
        finally:
            assert not model_dir.exists()
        if config.stage == "pretext" and config.pretext == "aet":
            config.recipe.loss.build(config.image_size, step=keras.Variable(0))
        assert np.all(first_step(config.recipe.optimizer) < 0), (argv, config.recipe.optimizer)
        event("accepted, and the first step moves a weight")
    finally:
        FLAGS.unparse_flags()
        flagsaver.restore_flag_values(saved, FLAGS)


def test_the_budget_record_is_read_with_limits(configured, tmp_path):
    """budget.json as a FIFO (which blocked the reader) or a folder: refused, named."""
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "budget.json")
    config = configured(f"--model_dir={run}", "--train_seconds=60")
    with pytest.raises(UsageError, match=r"budget.json is not a readable budget record .*"
                                         r"not a regular file \(a FIFO"):
        run_config.recorded_budget(config)
    (run / "budget.json").unlink()
    (run / "budget.json").mkdir()
    with pytest.raises(UsageError, match=r"not a regular file \(a folder"):
        run_config.recorded_budget(config)
    assert (run / "budget.json").is_dir()
