"""The training program's pretext step timed through ``model.fit``, in variants: the
`benchmarks.device_step` part ``keras``, and the pair rate of any flagfile's model.

    python3 -m benchmarks.keras_step --numerics        # the device: the default AETv2, 3 variants
    python -m benchmarks.keras_step --flagfile=configs/imagenet_alexnet_aetv2.cfg \
        --variants=program --batch=256 --steps=100 --repeats=3         # AlexNet on 224 crops
    python -m benchmarks.keras_step --flagfile=configs/imagenet_alexnet_aetv2.cfg \
        --probe=linear --feature=conv5 --batch=192                     # a probe's step

The model is the one ``python -m aetv2_tf.train --flagfile=F`` builds (`build`), fed uint8
images from host memory, the pairs sampled and warped inside the jitted step (224-pixel crops
come from the reader cropped and flipped: no augmentation there). `VARIANTS`: ``program`` (one
encoder call on a GPU, two elsewhere), ``two_pass`` (two calls), ``one_pass`` (one call on the
joint batch, BatchNorm statistics per half: the same mathematics), ``one_pass_newton`` (that
with the SVD-free projection). For each, in order: with ``--numerics`` (Keras on JAX) its loss
and gradients on one batch at the initial weights against the first variant's; its first
execution (compilation); pairs/s, the median of ``--repeats`` fits of ``--steps`` steps (0: as
many as take ``--seconds`` in all). Last, the first variant's float32 step: the yardstick of
bfloat16's own noise. ``--probe=linear|nonlinear --feature=convN``: a probe's step on the frozen
encoder instead (1000 classes, SGD, float32 images: images/s). Each number is printed (a
variant's last line: ``RESULT pairs_per_s=...``) and appended to ``--records`` as measured;
a variant that would not end by ``--deadline`` is skipped (`device_step.Clock`).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import statistics
import sys
import time

import numpy as np

from benchmarks.device_step import Clock, Records, part_parser

REPO = pathlib.Path(__file__).resolve().parents[1]
FLAGFILE = "configs/cifar10_aetv2.cfg"
#: Per-branch BatchNorm in one encoder call (None: as the program decides) and the projection
#: of P (None: the flagfile's).
VARIANTS = {"program": (None, None), "two_pass": (False, "svd"), "one_pass": (True, "svd"),
            "one_pass_newton": (True, "newton")}
#: The numerics' jitted loss and gradients (no optimizer update) in step-sized compilations.
NUMERICS_COMPILES = 0.7


def run_config(batch: int, spe: int, flagfile: str = FLAGFILE):
    """The `RunConfig` of ``flagfile`` at ``batch`` and ``spe``, read as ``python -m
    aetv2_tf.train`` reads its flags."""
    from aetv2_tf.program.config import from_flags
    from aetv2_tf.program.flags import FLAGS

    argv = ["keras_step", f"--flagfile={REPO / flagfile}", f"--batch_size={batch}",
            f"--steps_per_execution={spe}", "--model_dir=/tmp/keras_step_run",
            "--train_steps=100000", "--mixed_precision=mixed_bfloat16"]
    FLAGS(argv)
    return from_flags(FLAGS, argv)


def build(config, one_pass: bool | None, projection: str | None,
          policy: str = "mixed_bfloat16"):
    """``(encoder, model)``: `pretext_stage.build_model` of ``config`` (the same initial weights
    every call: the recipe's model, loss, optimizer and metrics) with per-branch BatchNorm
    computed ``one_pass`` and P projected by ``projection``, under the dtype ``policy``."""
    import keras

    from aetv2_tf.data.constants import normalization_constants
    from aetv2_tf.program import pretext_stage

    keras.mixed_precision.set_global_policy(policy)
    if projection is not None:
        config = dataclasses.replace(config, recipe=config.recipe.replace(projection=projection))
    mean, std = normalization_constants(config.data.dataset)
    encoder, model, _, _ = pretext_stage.build_model(
        config, config.train.train_steps, inputs="images", mean=mean, std=std,
        augment=config.data.augment and config.data.dataset == "cifar10", one_pass=one_pass)
    return encoder, model


def loss_and_gradients(model, images) -> tuple:
    """The training loss and every trainable gradient at the model's weights, one batch,
    through the jitted stateless step (nothing of the model changes; Keras on JAX)."""
    import jax

    values = [[v.value for v in vs] for vs in (model.trainable_variables,
                                               model.non_trainable_variables,
                                               model.metrics_variables,
                                               model.optimizer.variables)]
    fn = jax.jit(jax.value_and_grad(functools.partial(model.compute_loss_and_updates,
                                                      training=True), has_aux=True))
    (_, (loss, *_)), grads = fn(values[0], values[1], values[2], images, None, None,
                                optimizer_variables=values[3])
    return float(loss), [np.asarray(g, np.float32) for g in grads]


def distance(grads: list, reference: list) -> float:
    """The largest gradient difference over the largest reference gradient entry."""
    scale = max(float(np.max(np.abs(g))) for g in reference)
    return max(float(np.max(np.abs(a - b))) for a, b in zip(grads, reference, strict=True)) \
        / scale


def time_fit(name: str, model, images, labels, args, clock: Clock, records: Records,
             **fields) -> None:
    """The first execution, then the rate (module docstring), each recorded as measured."""
    def fit(steps: int) -> float:  # ``images``: one execution's batches; an epoch each
        begin = time.perf_counter()
        history = model.fit(images, labels, batch_size=args.batch, epochs=steps // args.spe,
                            steps_per_epoch=args.spe, shuffle=False, verbose=0)
        float(history.history["loss"][-1])  # the last step has finished
        return time.perf_counter() - begin

    first, warm = fit(args.spe), fit(args.spe)
    clock.compiled(max(first - warm, 0.0))
    records.add(name, "compiled", f"{name}: first execution {first:.1f} s (compilation), then "
                f"{warm:.3f} s", first_execution_s=first, warm_execution_s=warm)
    steps = args.steps or args.spe * max(1, round(args.seconds / args.repeats / max(warm, 1e-3)))
    rates = []
    for i in range(args.repeats):
        rates.append(steps * args.batch / fit(steps))
        records.add(name, "repeat", f"{name}: repeat {i}: {rates[-1]:,.0f} pairs/s",
                    pairs_per_s=rates[-1])
    rate = statistics.median(rates)
    records.add(name, "rate", f"{name}: {rate:,.0f} pairs/s (median of {args.repeats} x {steps} "
                f"steps)\nRESULT pairs_per_s={rate:.1f} batch={args.batch} "
                f"size={images.shape[1]} precision={args.precision} variant={name} "
                f"{' '.join(f'{k}={v}' for k, v in fields.items())}", pairs_per_s=rate,
                rates=rates, steps_per_repeat=steps, **fields)


def variants_part(args, config, clock: Clock, records: Records) -> None:
    """The variants of ``--variants`` in order, then the float32 yardstick (module docstring)."""
    import keras

    size = config.image_size
    images = np.random.default_rng(0).integers(0, 256, (args.batch * args.spe, size, size, 3),
                                               np.uint8)
    measured: dict[str, tuple] = {}  # name: (loss, gradients) in ``--precision``
    for name in args.variants.split(","):
        if not clock.allows(records, name, 1 + args.numerics * NUMERICS_COMPILES,
                            args.seconds + 10):
            continue
        _, model = build(config, *VARIANTS[name], args.precision)
        if args.numerics:  # at the initial weights, before any step
            measured[name] = loss, grads = loss_and_gradients(model, images[:args.batch])
            first, (first_loss, first_grads) = next(iter(measured.items()))
            records.add(name, "numerics", f"{name}: loss {loss:.5f}; vs {first}: loss "
                        f"{abs(loss - first_loss):.2e}, gradients "
                        f"{distance(grads, first_grads):.2e} of the largest", loss=loss,
                        first=first, loss_vs_first=abs(loss - first_loss),
                        grad_vs_first=distance(grads, first_grads))
        time_fit(name, model, images, None, args, clock, records,
                 batch_groups=model.batch_groups, backend=keras.backend.backend(),
                 projection=VARIANTS[name][1] or config.recipe.loss.projection)
        del model
        keras.backend.clear_session()
    if not measured or not clock.allows(records, "float32", NUMERICS_COMPILES, 5):
        return
    first = next(iter(measured))
    exact_loss, exact = loss_and_gradients(build(config, *VARIANTS[first], "float32")[1],
                                           images[:args.batch])
    for name, (loss, grads) in measured.items():
        records.add(name, "float32", f"{name} vs the float32 {first} step (loss "
                    f"{exact_loss:.5f}): loss {abs(loss - exact_loss):.2e}, gradients "
                    f"{distance(grads, exact):.2e} of the largest",
                    loss_vs_float32=abs(loss - exact_loss), grad_vs_float32=distance(grads, exact))


def probe_part(args, config, records: Records) -> None:
    """A probe's step on the frozen encoder (module docstring), timed like a variant."""
    import keras

    from aetv2_tf.models.backbones import build_backbone
    from aetv2_tf.probes.classifier import build_probe

    keras.mixed_precision.set_global_policy(args.precision)
    keras.utils.set_random_seed(0)
    size = config.image_size
    model = build_probe(build_backbone(config.model.backbone.name, batch_norm="keras"),
                        args.feature,
                        args.probe, 1000, (size, size, 3), batch_norm="keras", pool="max",
                        extra_convs=int(args.probe == "nonlinear" and args.feature == "conv4"))
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=args.spe)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((args.batch * args.spe, size, size, 3), np.float32)
    time_fit(f"probe_{args.probe}_{args.feature}", model, images,
             rng.integers(0, 1000, len(images)), args, Clock(float("inf")), records,
             probe=args.probe, feature=args.feature)


def main(argv: list[str] | None = None) -> int:
    p = part_parser(__doc__)
    p.add_argument("--flagfile", default=FLAGFILE, help="the run whose model is timed")
    p.add_argument("--variants", default="two_pass,one_pass,one_pass_newton",
                   help=f"comma-separated, of {list(VARIANTS)}")
    p.add_argument("--steps", type=int, default=0, help="timed steps per repeat (0: --seconds)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--precision", default="mixed_bfloat16",
                   choices=("mixed_bfloat16", "float32"))
    p.add_argument("--numerics", action="store_true", help="loss and gradients (JAX)")
    p.add_argument("--probe", default=None, choices=("linear", "nonlinear"))
    p.add_argument("--feature", default="conv5", help="--probe: the frozen feature")
    args = p.parse_args(argv)
    args.spe = min(args.spe, args.steps or args.spe)
    if args.steps % args.spe:
        p.error(f"--steps={args.steps} must be a multiple of --spe={args.spe}")
    if unknown := set(args.variants.split(",")) - set(VARIANTS):
        p.error(f"unknown variants {sorted(unknown)}; the variants: {list(VARIANTS)}")
    args.repeats = 1 if args.tiny else args.repeats
    import keras

    records = Records(args.records, "keras")
    config = run_config(args.batch, args.spe, args.flagfile)
    records.add("setup", "setup", f"keras_step: {args.flagfile}, {keras.backend.backend()}, "
                f"{args.precision}, batch {args.batch}, steps_per_execution {args.spe}",
                backend=keras.backend.backend(), batch=args.batch, spe=args.spe,
                policy=args.precision, flagfile=args.flagfile)
    if args.probe:
        probe_part(args, config, records)
    else:
        variants_part(args, config, Clock(args.deadline), records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
